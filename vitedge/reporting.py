"""The human-readable report written into every bundle (report.md)."""

from __future__ import annotations

from pathlib import Path


def write_build_report(bundle: Path, manifest) -> Path:
    from vitedge.fsutil import atomic_write_path

    m = manifest
    spec = m.model["spec"]
    lines = [
        f"# vitedge bundle: {m.target['name']} ({m.target['backend']}, {m.target['precision']})",
        "",
        f"- model: `{m.model['source']}` ({spec['family']} {spec['variant']}, {spec['image_size'][0]}x{spec['image_size'][1]})",
        f"- artifact: `{m.artifacts['model']}`" + ("" if m.artifacts.get("built", True) else " (not built here: finish it on the device)"),
        f"- FP32 reference: `{m.artifacts['reference']}`",
        f"- input: `{m.input['name']}` {m.input['format']} {m.input['shape']}",
        f"- calibration: {m.calibration.get('summary_line', '')}",
        f"- quantization: {m.quantization.get('summary_line', '')}",
        "",
    ]
    v = m.validation
    if v:
        lines += ["## Gate", "", "| check | result | detail |", "|---|---|---|"]
        for row in v["gate"]:
            lines.append(f"| {row['name']} | {'pass' if row['passed'] else '**FAIL**'} | {row['detail']} |")
        lines += ["", "## Latency (ms)", "", "| batch | FP32 p50 | INT8 p50 | INT8 p90 | INT8 p99 |", "|---|---|---|---|---|"]
        for b, stats in sorted(v["latency"].get("int8", {}).items(), key=lambda kv: int(kv[0])):
            f32 = v["latency"]["fp32"].get(b, {})
            lines.append(f"| {b} | {f32.get('p50_ms', float('nan')):.2f} | {stats['p50_ms']:.2f} | {stats['p90_ms']:.2f} | {stats['p99_ms']:.2f} |")
        lines.append("")
    else:
        lines += ["Not validated here: " + str(m.backend_info.get("next_step", "the runtime is not available on the build machine")), ""]
    path = bundle / "report.md"
    with atomic_write_path(path) as tmp:
        tmp.write_text("\n".join(lines))
    return path
