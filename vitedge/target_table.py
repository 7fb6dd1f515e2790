"""What `vitedge targets` shows: one row per profile and per family, fitted to 80 columns, with
each install hint written once below the table (rows point at it), or the same as JSON."""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass, field
from typing import Any

from vitedge.backends import backend_facts, get_backend, list_backends
from vitedge.cpu import CpuInfo, read_cpu
from vitedge.errors import VitedgeError
from vitedge.target_families import list_families
from vitedge.profiles import family_profile, list_profiles, load_profile

WIDTH = 80
NOT_FASTER = "INT8 is not faster than FP32 on this CPU"
STATUS_TEXT = {"ready": "builds, runs", "bundle-only": "bundle only", "unavailable": "cannot build", "invalid": "invalid"}


@dataclass
class TargetRow:
    name: str
    kind: str  # "profile" or "family"
    backend: str
    batch_sizes: list[int]
    gate: dict[str, Any]
    status: str  # a key of STATUS_TEXT
    detail: str  # versions found, or what is missing
    note: int | None = None  # index into TargetListing.notes
    members: list[str] = field(default_factory=list)  # a family's profiles
    description: str = ""


@dataclass
class TargetListing:
    rows: list[TargetRow]
    notes: list[str]  # install hints and errors, each once

    def to_dict(self) -> dict[str, Any]:
        def row(r: TargetRow) -> dict[str, Any]:
            d = dataclasses.asdict(r)
            d["note"] = self.notes[r.note] if r.note is not None else None
            return d

        return {"schema": "vitedge.targets/1",
                "targets": [row(r) for r in self.rows if r.kind == "profile"],
                "families": [row(r) for r in self.rows if r.kind == "family"],
                "notes": list(self.notes)}


def _note(notes: list[str], text: str | None) -> int | None:
    if not text:
        return None
    if text not in notes:
        notes.append(text)
    return notes.index(text)


def _on_cpu(backend_name: str | None) -> bool:
    """Does this backend's INT8 run on this machine's CPU (whose ISA, VNNI or not, makes it fast or slow)?"""
    return backend_name in list_backends() and backend_facts(str(backend_name)).on_cpu


def _status(backend_name: str, notes: list[str]) -> tuple[str, str, int | None]:
    backend = get_backend(backend_name)
    env = backend.check_environment()
    if env.can_build and env.can_run:
        return "ready", env.detail, None
    if env.can_build or backend.facts.builds_without_runtime:
        hint = f"{backend_name}: {env.detail} here, so the bundle holds a build plan and the engine is built" + (
            f" {env.install_hint}" if env.install_hint else " on the device")
        return "bundle-only", env.detail, _note(notes, hint)
    hint = f"{backend_name}: {env.detail}" + (f"; install: {env.install_hint}" if env.install_hint else "")
    return "unavailable", env.detail, _note(notes, hint)


def _cpu_label(cpu: CpuInfo) -> str:
    no_vnni = cpu.is_x86 and cpu.int8_dot_product is False
    return f"{cpu.model or cpu.machine}, {cpu.isa}" + (", no VNNI/AMX" if no_vnni and "no vnni" not in cpu.isa else "")


def faster_cpu_target(slow_backend: str, gates: dict[str, dict[str, Any]]) -> str | None:
    """The profile to use instead on a CPU where ``slow_backend``'s INT8 is slower than FP32: one on
    another CPU runtime whose gate asks for an INT8 speedup >= 1x on every CPU (``gates``: profile
    name -> [thresholds] as a dict, with "backend" added)."""
    for name, gate in sorted(gates.items()):
        if _on_cpu(gate.get("backend")) and gate.get("backend") != slow_backend \
                and gate.get("min_speedup_without_vnni") is None and (gate.get("min_speedup") or 0) >= 1:
            return name
    return None


def cpu_profile_gates() -> dict[str, dict[str, Any]]:
    """Every valid profile's thresholds and backend, for faster_cpu_target."""
    gates = {}
    for path in list_profiles():
        try:
            prof = load_profile(str(path))
        except VitedgeError:
            continue
        gates[prof.name] = dict(prof.thresholds.to_dict(), backend=prof.backend)
    return gates


def int8_not_faster_sentence(target: str, backend: str, speedup: float | None, cpu: CpuInfo | None = None,
                             faster: str | None = None) -> str | None:
    """The plain sentence for a CPU target whose INT8 ran slower than its FP32 here (measured
    ``speedup`` = FP32 / INT8 latency at batch 1 below 1), naming the ``faster`` target; None otherwise."""
    if not _on_cpu(backend) or speedup is None or speedup >= 1:
        return None
    text = f"{target}: {NOT_FASTER} ({_cpu_label(cpu or read_cpu())}): INT8 ran at {speedup:.2f}x FP32 speed at batch 1"
    return text + (f"; the {faster} target is faster here" if faster else "; use the FP32 model on this CPU")


def _slow_without_vnni_note(prof, cpu: CpuInfo, gates: dict[str, dict[str, Any]]) -> str | None:
    """For `vitedge targets` on an x86 CPU without VNNI/AMX: a profile that itself accepts an INT8
    speedup below 1x there (min_speedup_without_vnni) says so, and names the faster target."""
    floor = prof.thresholds.min_speedup_without_vnni
    if floor is None or floor >= 1 or not _on_cpu(prof.backend) or not (cpu.is_x86 and cpu.int8_dot_product is False):
        return None
    faster = faster_cpu_target(prof.backend, gates)
    return (f"{prof.name}: {NOT_FASTER} ({_cpu_label(cpu)}); its gate accepts {floor:g}x here"
            + (f"; the {faster} target is faster here" if faster else "") + " (docs/cpu-targets.md)")


def collect(cpu: CpuInfo | None = None) -> TargetListing:

    cpu = cpu or read_cpu()
    gates = cpu_profile_gates()
    rows: list[TargetRow] = []
    notes: list[str] = []
    for kind, paths, load in (("profile", list_profiles(), lambda p: load_profile(str(p))),
                              ("family", list_families(), lambda p: family_profile(p.stem))):
        for path in paths:
            try:
                prof = load(path)
            except VitedgeError as err:
                rows.append(TargetRow(path.stem, kind, "?", [], {}, "invalid", str(err), _note(notes, f"{path.stem}: {err}")))
                continue
            status, detail, note = _status(prof.backend, notes)
            if note is None and kind == "profile":
                note = _note(notes, _slow_without_vnni_note(prof, cpu, gates))
            members = list(getattr(prof.backend_options, "members", {}) or {})
            rows.append(TargetRow(prof.name, kind, prof.backend, list(prof.batch_sizes), prof.thresholds.to_dict(), status,
                                  detail, note, members, prof.description))
    return TargetListing(rows, notes)


def _gate(gate: dict[str, Any]) -> str:
    if not gate:
        return ""
    text = f"{gate['max_top1_drop']:g}pt {100 * gate['min_agreement']:g}% {gate['min_speedup']:g}x"
    return text + (f" {gate['max_p99_ms']:g}ms" if gate.get("max_p99_ms") else "")


def _table(header: list[str], rows: list[list[str]], last_min: int = 12) -> list[str]:
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    room = WIDTH - sum(widths[:-1]) - 2 * (len(widths) - 1)
    widths[-1] = max(last_min, min(widths[-1], room))
    out = []
    for r in [header] + rows:
        cells = [c if len(c) <= w else c[: w - 1] + "~" for c, w in zip(r, widths)]
        out.append("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
    return out


def render_text(listing: TargetListing) -> str:
    def here(r: TargetRow) -> str:
        return STATUS_TEXT[r.status] + (f" [{r.note + 1}]" if r.note is not None else "")

    profiles = [r for r in listing.rows if r.kind == "profile"]
    families = [r for r in listing.rows if r.kind == "family"]
    lines = _table(["target", "backend", "batch", "gate: drop agree speed", "here"],
                   [[r.name, r.backend, ",".join(map(str, r.batch_sizes)), _gate(r.gate), here(r)] for r in profiles])
    if families:
        lines += [""] + textwrap.wrap("families: one bundle with a plan per profile; `vitedge engine BUNDLE` on the device "
                                      "picks the profile for the module it finds (--profile NAME to choose)", WIDTH)
        lines += _table(["family", "backend", "profiles"], [[r.name, r.backend, ", ".join(r.members) or here(r)] for r in families])
    if listing.notes:
        lines.append("")
        for i, note in enumerate(listing.notes):
            lines += textwrap.wrap(note, WIDTH, initial_indent=f"[{i + 1}] ", subsequent_indent="    ", break_on_hyphens=False,
                                   break_long_words=True)
    lines += [""] + textwrap.wrap("gate: most top-1 points lost, least top-1 agreement with FP32, least INT8 speedup over "
                                  "FP32 (per profile; `--json` for scripts)", WIDTH)
    return "\n".join(lines)
