"""A graph past protobuf's 2 GiB limit, built end to end: torchvision's vit_h_14 (632 M parameters,
2.5 GB of FP32 weights), random weights, saved as a state_dict the way users save it.

Run by hand (one heavy run at a time on a shared machine; needs ~25 GB of disk in --work):

    flock /tmp/vitedge-bench.lock python benchmarks/large_graph.py [--calib-size 8] [--work DIR]

The build runs in a child process (`vitedge.build.pipeline.run_build`, the code behind `vitedge build`)
for the `onnx`, `intel-cpu` and `jetson-orin` targets (the TensorRT plan: no GPU here) with
a small calibration set, validation on the same images, no latency measurement and the accuracy
budget off (its sensitivity search would run every quantized layer of a 32-block model).
Prints and records wall time, the child's peak resident memory (ru_maxrss), each stage's time,
the bundle files and sizes (external data included), and each target's validation verdict.

Writes benchmarks/results/large_graph.{md,json}.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CALIB = REPO / "calibration" / "digits" / "calib"
TARGETS = ("onnx", "intel-cpu", "jetson-orin")

CHILD = r'''
import json, sys, time
from pathlib import Path
from vitedge.budget import BudgetSettings
from vitedge.build.pipeline import BuildRequest, run_build
from vitedge.ui import StageLog

model, calib, out, size, targets = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5].split(",")
log = StageLog(quiet=False)
start = time.perf_counter()
req = BuildRequest(model=Path(model), targets=tuple(targets), calib=Path(calib), out=Path(out), force=True,
                   calib_size=size, min_calib=size, measure_speed=False, cache_dir=Path(out) / ".cache",
                   budget=BudgetSettings(enabled=False, measure_cost=False))
results = run_build(req, log)
rows = [{"target": r.profile.name, "built": r.built, "passed": r.passed, "summary": r.summary} for r in results]
print("RESULT " + json.dumps({"seconds": time.perf_counter() - start, "stages": dict(log.timings), "targets": rows}, default=str))
'''


def make_model(work: Path) -> Path:
    import torch
    from torchvision.models import vit_h_14

    path = work / "vit_h_14.pt"
    if path.is_file():
        return path
    torch.manual_seed(0)
    m = vit_h_14(weights=None).eval()
    torch.nn.init.normal_(m.heads.head.weight, std=0.02)  # torchvision zero-initialises the head: all logits would be 0
    torch.save(m.state_dict(), path)
    print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB, {sum(p.numel() for p in m.parameters()):,} parameters)", flush=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calib-size", type=int, default=8)
    ap.add_argument("--work", type=Path, default=None, help="folder for the model and bundles (default: a temporary one)")
    args = ap.parse_args()
    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="vitedge-large-")
        args.work = Path(tmp.name)
    args.work.mkdir(parents=True, exist_ok=True)
    model = make_model(args.work)
    out = args.work / "bundles"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, str(model), str(CALIB), str(out), str(args.calib_size), ",".join(TARGETS)],
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB on Linux
    sys.stdout.write(proc.stdout[-6000:])
    if proc.returncode != 0 or "RESULT " not in proc.stdout:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"the build failed (exit {proc.returncode}) after {wall:.0f} s")
    result = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    files = {t: {p.name: p.stat().st_size for p in sorted((out / t).iterdir()) if p.is_file()} for t in TARGETS}
    doc = {
        "benchmark": "large_graph", "date": _dt.date.today().isoformat(), "machine": platform.platform(),
        "model": "torchvision vit_h_14, random weights (state_dict)", "calib_size": args.calib_size, "targets": list(TARGETS),
        "wall_seconds": wall, "build_seconds": result["seconds"], "peak_rss_gib": peak_gib, "stages": result["stages"],
        "results": result["targets"], "files": files,
        "log_tail": [l for l in proc.stdout.splitlines() if l.strip()][-60:],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "large_graph.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (RESULTS / "large_graph.md").write_text(markdown(doc))
    print(f"\nvit_h_14: {wall:.0f} s wall, peak RSS {peak_gib:.1f} GiB; results in benchmarks/results/large_graph.md")
    if tmp is not None:
        tmp.cleanup()


def markdown(doc: dict) -> str:
    lines = [
        "# Graphs past 2 GiB: torchvision vit_h_14",
        "",
        f"{doc['date']}, {doc['machine']}; `python benchmarks/large_graph.py --calib-size {doc['calib_size']}`.",
        f"Model: {doc['model']}. Targets: {', '.join(doc['targets'])}; calibration and validation on "
        f"{doc['calib_size']} digits images; no latency measurement; accuracy budget off.",
        "",
        "| what | value |",
        "|---|---|",
        f"| wall time (child process: load, export, calibrate, quantize, build, validate) | {doc['wall_seconds']:.0f} s |",
        f"| peak resident memory (child, ru_maxrss) | {doc['peak_rss_gib']:.1f} GiB |",
        "",
        "| target | built here | gate | summary |",
        "|---|---|---|---|",
    ]
    for r in doc["results"]:
        s = r["summary"]
        verdict = "n/a" if r["passed"] is None else ("pass" if r["passed"] else "fail: " + "; ".join(s.get("failures", [])))
        agree = s.get("agreement")
        lines.append(f"| {r['target']} | {r['built']} | {verdict} | "
                     f"{'agreement %.1f%%' % (100 * agree) if agree is not None else s.get('artifact')} |")
    lines += ["", "Bundle files (bytes):", ""]
    for t, files in doc["files"].items():
        lines.append(f"- {t}: " + ", ".join(f"`{n}` {b:,}" for n, b in files.items()))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
