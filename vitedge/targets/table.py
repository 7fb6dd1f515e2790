"""What `vitedge targets` shows: one row per profile and per family, fitted to 80 columns, with
each install hint written once below the table (rows point at it), or the same as JSON."""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass, field
from typing import Any

from vitedge.backends import backend_facts, get_backend, list_backends
from vitedge.core.cpu import CpuInfo, read_cpu
from vitedge.core.errors import VitedgeError
from vitedge.targets.families import list_families
from vitedge.targets.profiles import family_profile, list_profiles, load_profile
from vitedge.quantize.config import CPU_REQUIREMENT

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


@dataclass(frozen=True)
class MeasuredSpeed:
    """One target's speed as this run measured it: INT8/FP32 ``speedup`` at batch 1 (FP32 latency over INT8
    latency on its own runtime) and its INT8 batch-1 latency in ms (None when not timed)."""

    target: str
    backend: str
    speedup: float | None
    int8_ms: float | None = None


def measured_faster(this: MeasuredSpeed, others: list[MeasuredSpeed]) -> MeasuredSpeed | None:
    """The target of this run, on another CPU runtime, whose INT8 measured faster than ``this``'s: a higher speedup
    over its FP32 and, where both INT8 latencies were timed (same CPU, same run), a lower one; the fastest of them.
    None when no target of this run measured so: a hint then claims nothing."""
    if this.speedup is None:
        return None
    better = [o for o in others if o.target != this.target and o.backend != this.backend and _on_cpu(o.backend)
              and o.speedup is not None and o.speedup > this.speedup
              and (o.int8_ms is None or this.int8_ms is None or o.int8_ms < this.int8_ms)]
    return max(better, key=lambda o: o.speedup or 0.0, default=None)


def targets_to_try(slow_backend: str, gates: dict[str, dict[str, Any]], cpu: CpuInfo | None = None,
                   exclude: tuple[str, ...] = ()) -> list[str]:
    """Profiles on another CPU runtime a user could try instead of ``slow_backend`` on this CPU (nothing measured
    them): their gate asks an INT8 speedup >= 1x on this kind of CPU (none that admits less without VNNI on a CPU
    without it) and their INT8 weights are correct here (no VNNI-only weight range on a CPU without VNNI/AMX).
    ``gates``: profile name -> its thresholds as a dict, with "backend" and "cpu_requirement" added."""
    cpu = cpu or read_cpu()
    no_vnni = cpu.is_x86 and cpu.int8_dot_product is False
    names = []
    for name, gate in sorted(gates.items()):
        if name in exclude or not _on_cpu(gate.get("backend")) or gate.get("backend") == slow_backend:
            continue
        if (gate.get("min_speedup") or 0) < 1 or (no_vnni and (gate.get("min_speedup_without_vnni") is not None
                                                              or gate.get("cpu_requirement") == "vnni")):
            continue
        names.append(name)
    return names


def cpu_profile_gates() -> dict[str, dict[str, Any]]:
    """Every valid profile's thresholds, backend and CPU requirement, for targets_to_try."""
    gates = {}
    for path in list_profiles():
        try:
            prof = load_profile(str(path))
        except VitedgeError:
            continue
        weight_range = prof.quantization.get("weight_range", "pairwise")
        gates[prof.name] = dict(prof.thresholds.to_dict(), backend=prof.backend,
                                cpu_requirement=CPU_REQUIREMENT.get(str(weight_range), "any-x86"))
    return gates


def int8_not_faster_sentence(target: str, backend: str, speedup: float | None, cpu: CpuInfo | None = None,
                             faster: MeasuredSpeed | None = None, to_try: list[str] | tuple[str, ...] = ()) -> str | None:
    """The plain sentence for a CPU target whose INT8 ran slower than its FP32 here (measured ``speedup`` = FP32 /
    INT8 latency at batch 1 below 1). It names a target as faster only when this run measured it so (``faster``,
    from measured_faster); otherwise it says to use FP32 and names what could be tried (``to_try``), claiming
    nothing of it. None when INT8 was not slower."""
    if not _on_cpu(backend) or speedup is None or speedup >= 1:
        return None
    text = f"{target}: {NOT_FASTER} ({_cpu_label(cpu or read_cpu())}): INT8 ran at {speedup:.2f}x FP32 speed at batch 1"
    if faster is not None and faster.speedup is not None and faster.speedup >= 1:
        return text + f"; the {faster.target} target is faster here (its INT8 at {faster.speedup:.2f}x its FP32 in this run)"
    if faster is not None and faster.speedup is not None:
        text += (f"; the {faster.target} target's INT8 ran faster in this run ({faster.speedup:.2f}x its FP32) "
                 "but no faster than FP32 either")
    text += "; use the FP32 model on this CPU"
    return text + (f", or try the {' or '.join(to_try[:2])} target (not measured in this run)" if to_try else "")


def _slow_without_vnni_note(prof, cpu: CpuInfo, gates: dict[str, dict[str, Any]]) -> str | None:
    """For `vitedge targets` on an x86 CPU without VNNI/AMX: a profile that itself accepts an INT8
    speedup below 1x there (min_speedup_without_vnni) says so, and names the faster target."""
    floor = prof.thresholds.min_speedup_without_vnni
    if floor is None or floor >= 1 or not _on_cpu(prof.backend) or not (cpu.is_x86 and cpu.int8_dot_product is False):
        return None
    to_try = targets_to_try(prof.backend, gates, cpu)
    return (f"{prof.name}: {NOT_FASTER} ({_cpu_label(cpu)}); its gate accepts {floor:g}x here"
            + (f"; try the {' or '.join(to_try[:2])} target" if to_try else "") + " (docs/cpu-targets.md)")


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
