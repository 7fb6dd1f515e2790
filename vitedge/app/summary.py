"""The one-screen summary at the end of `vitedge build`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from vitedge.target_table import (
    cpu_profile_gates,
    faster_cpu_target,
    int8_not_faster_sentence,
)
from vitedge.ui import literal

if TYPE_CHECKING:
    from vitedge.app.build import TargetResult


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def summary_rows(results: Sequence[TargetResult]) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        s = r.summary
        size = f"{s['artifact_bytes'] / 1e6:.2f} MB" if s.get("artifact_bytes") else "-"
        if r.passed is None:
            gate = "not validated here" if not r.built else "not run here"
        else:
            gate = "PASS" if r.passed else "FAIL"
        top1 = f"{_pct(s.get('top1_fp32'))} -> {_pct(s.get('top1_int8'))}" if s.get("top1_fp32") is not None else "-"
        lat = f"{s['fp32_ms']:.2f} -> {s['int8_ms']:.2f}" if s.get("fp32_ms") and s.get("int8_ms") else "-"
        speed = f"{s['speedup']:.2f}x" if s.get("speedup") else "-"
        agree = _pct(s.get("agreement")) if s.get("embedding_cosine_mean") is None else f"cos {s['embedding_cosine_mean']:.4f}"
        rows.append((r.profile.name, size, top1, agree, lat, speed, gate))
    return rows


def not_faster_lines(results: Sequence[TargetResult]) -> list[str]:
    """One plain line per CPU target whose INT8 measured slower than its FP32 here, naming a target of
    this build that measured faster (else the profile meant for such CPUs)."""
    measured = {r.profile.name: (r.profile.backend, r.summary.get("speedup")) for r in results}
    faster_here = [name for name, (backend, speedup) in measured.items() if speedup and speedup >= 1]
    lines = []
    for name, (backend, speedup) in measured.items():
        others = [n for n in faster_here if measured[n][0] != backend]
        faster = others[0] if others else faster_cpu_target(backend, cpu_profile_gates())
        line = int8_not_faster_sentence(name, backend, speedup, faster=faster)
        if line:
            lines.append(line)
    return lines


def print_build_summary(results: Sequence[TargetResult], timings: dict[str, float]) -> None:

    table = Table(title="vitedge build", show_header=True, header_style="bold", padding=(0, 1))
    for col in ("target", "size", "top-1 FP32 -> INT8", "agree/cos", "ms FP32 -> INT8", "speedup", "gate"):
        table.add_column(col, no_wrap=True)
    colour = {"PASS": "green", "FAIL": "red"}
    for row in summary_rows(results):
        gate = row[-1]
        table.add_row(*(literal(cell) for cell in row[:-1]), f"[{colour.get(gate, 'yellow')}]{literal(gate)}[/]")
    console = Console(width=max(Console().width, 110))
    console.print(table)
    for r in results:
        console.print("  " + literal(f"{r.profile.name}: {r.bundle}/ ({r.summary.get('artifact', '-')}"
                                     f"{'' if r.built else ', engine to be built on the device'})"), highlight=False, soft_wrap=True)
    for line in not_faster_lines(results):
        console.print(f"  {literal(line)}", highlight=False, soft_wrap=True)
    if timings:
        console.print("  stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()), highlight=False, soft_wrap=True)
