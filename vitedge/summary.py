"""The one-screen summary at the end of `vitedge build`."""

from __future__ import annotations


def _pct(v):
    return "-" if v is None else f"{100 * v:.2f}%"


def print_build_summary(results, timings: dict[str, float]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="vitedge build", show_header=True, header_style="bold")
    for col in ("target", "bundle", "artifact", "size", "top-1 FP32 -> INT8", "agreement", "latency FP32 -> INT8 (b=1)", "speedup", "gate"):
        table.add_column(col)
    for r in results:
        s = r.summary
        size = f"{s['artifact_bytes'] / 1e6:.2f} MB" if s.get("artifact_bytes") else "-"
        if r.passed is None:
            gate = "[yellow]not validated here[/yellow]" if not r.built else "[yellow]not run here[/yellow]"
        else:
            gate = "[green]PASS[/green]" if r.passed else "[red]FAIL[/red]"
        lat = f"{s['fp32_ms']:.2f} -> {s['int8_ms']:.2f} ms" if s.get("fp32_ms") and s.get("int8_ms") else "-"
        table.add_row(r.profile.name, str(r.bundle), s.get("artifact", "-") + ("" if r.built else " (plan)"), size,
                      f"{_pct(s.get('top1_fp32'))} -> {_pct(s.get('top1_int8'))}" if s.get("top1_fp32") is not None else "-",
                      _pct(s.get("agreement")), lat, f"{s['speedup']:.2f}x" if s.get("speedup") else "-", gate)
    console = Console()
    console.print(table)
    if timings:
        console.print("stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
