"""The one-screen summary at the end of `vitedge build`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from vitedge.core.cpu import CpuInfo
from vitedge.targets.table import (
    MeasuredSpeed,
    cpu_profile_gates,
    int8_not_faster_sentence,
    measured_faster,
    targets_to_try,
)
from vitedge.core.ui import literal

if TYPE_CHECKING:
    from vitedge.app.build import TargetResult


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def summary_rows(results: Sequence[TargetResult]) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        s = r.summary
        size = f"{s.artifact_bytes / 1e6:.2f} MB" if s.artifact_bytes else "-"
        if r.passed is None:
            gate = "not validated here" if not r.built else "not run here"
        else:
            gate = "PASS" if r.passed else "FAIL"
        top1 = f"{_pct(s.top1_fp32)} -> {_pct(s.top1_int8)}" if s.top1_fp32 is not None else "-"
        lat = f"{s.fp32_ms:.2f} -> {s.int8_ms:.2f}" if s.fp32_ms and s.int8_ms else "-"
        speed = f"{s.speedup:.2f}x" if s.speedup else "-"
        agree = _pct(s.agreement) if s.embedding_cosine_mean is None else f"cos {s.embedding_cosine_mean:.4f}"
        rows.append((r.profile.name, size, top1, agree, lat, speed, gate))
    return rows


def not_faster_lines(results: Sequence[TargetResult], cpu: CpuInfo | None = None,
                     gates: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """One plain line per CPU target whose INT8 measured slower than its FP32 here. It names another target
    as faster only when this build measured that one faster (target_table.measured_faster); otherwise
    it names profiles to try, outside this build, saying that nothing measured them."""
    measured = [MeasuredSpeed(r.profile.name, r.profile.backend, _number(r.summary.speedup),
                              _number(r.summary.int8_ms)) for r in results]
    lines = []
    for m in measured:
        if m.speedup is None or m.speedup >= 1:
            continue
        faster = measured_faster(m, measured)
        to_try = () if faster is not None and (faster.speedup or 0) >= 1 else targets_to_try(
            m.backend, cpu_profile_gates() if gates is None else gates, cpu, exclude=tuple(x.target for x in measured))
        line = int8_not_faster_sentence(m.target, m.backend, m.speedup, cpu, faster=faster, to_try=to_try)
        if line:
            lines.append(line)
    return lines


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


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
        console.print("  " + literal(f"{r.profile.name}: {r.bundle}/ ({r.summary.artifact or '-'}"
                                     f"{'' if r.built else ', engine to be built on the device'})"), highlight=False, soft_wrap=True)
    for line in not_faster_lines(results):
        console.print(f"  {literal(line)}", highlight=False, soft_wrap=True)
    if timings:
        console.print("  stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()), highlight=False, soft_wrap=True)
