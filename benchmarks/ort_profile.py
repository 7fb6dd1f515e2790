"""Where ONNX Runtime spends an onnx bundle's time: FP32 reference vs INT8 artifact, per operator type (issue 19 item 5).

    python benchmarks/ort_profile.py --bundle OUT/onnx [--batch 1] [--runs 8]

Both graphs run on the CPU execution provider with the bundle's session settings (all optimisations, ``--threads``),
warmed up, then ``--runs`` profiled runs each (ONNX Runtime's own profiler, ``SessionOptions.enable_profiling``);
the per-node kernel times are summed by operator type of the *optimised* graph (what ORT really runs:
``MatMulIntegerToFloat``, ``MultiHeadAttention``, ``BiasGelu``...). Also printed: the wall median of five unprofiled
runs of each graph, their ratio, and how much of the FP32 time each INT8 share amounts to, which bounds what any
change outside the INT8 GEMMs can win. Prints Markdown.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vitedge.cpu import read_cpu  # noqa: E402


def profile(path: Path, x: np.ndarray, threads: int, runs: int) -> tuple[float, dict[str, tuple[float, int]]]:
    """(wall median ms, op type -> (kernel ms per run, nodes))."""
    import onnxruntime as ort

    def options(profiling: bool, prefix: str = "") -> ort.SessionOptions:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        if profiling:
            so.enable_profiling = True
            so.profile_file_prefix = prefix
        return so

    sess = ort.InferenceSession(str(path), options(False), providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    for _ in range(3):
        sess.run(None, feed)
    wall = []
    for _ in range(5):
        t0 = time.perf_counter()
        sess.run(None, feed)
        wall.append((time.perf_counter() - t0) * 1000)
    del sess
    with tempfile.TemporaryDirectory() as tmp:
        sess = ort.InferenceSession(str(path), options(True, str(Path(tmp) / "p")), providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            sess.run(None, feed)
        events = json.loads(Path(sess.end_profiling()).read_text())
    # the first run allocates: count the node events after it ends
    model_runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    after = model_runs[0][1] if model_runs else -1
    total: collections.Counter = collections.Counter()
    nodes: dict[str, set[str]] = collections.defaultdict(set)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] > after:
            op = e["args"].get("op_name", "?")
            total[op] += e["dur"]
            nodes[op].add(e["name"])
    per_run = runs if model_runs else runs + 1
    return float(np.median(wall)), {op: (d / per_run / 1000, len(nodes[op])) for op, d in total.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, required=True, help="an onnx bundle (reference.fp32.onnx, model.int8.onnx)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    import onnxruntime as ort

    first = ort.InferenceSession(str(args.bundle / "reference.fp32.onnx"), providers=["CPUExecutionProvider"]).get_inputs()[0]
    shape = [args.batch] + [d if isinstance(d, int) else 1 for d in first.shape[1:]]
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, shape).astype(np.uint8) if "uint8" in first.type  # preprocessing baked into the graph
         else rng.standard_normal(shape).astype(np.float32))
    fp32_ms, fp32 = profile(args.bundle / "reference.fp32.onnx", x, args.threads, args.runs)
    int8_ms, int8 = profile(args.bundle / "model.int8.onnx", x, args.threads, args.runs)
    cpu = read_cpu()
    print(f"CPU: {cpu.model} ({cpu.isa}); ONNX Runtime {ort.__version__}; {args.threads} threads; batch {args.batch}; "
          f"bundle {args.bundle}\n")
    print(f"Wall median of 5 unprofiled runs: FP32 {fp32_ms:.1f} ms, INT8 {int8_ms:.1f} ms, INT8/FP32 {int8_ms / fp32_ms:.3f}\n")
    fp32_sum, int8_sum = sum(v[0] for v in fp32.values()), sum(v[0] for v in int8.values())
    for label, table, tot in (("FP32 reference", fp32, fp32_sum), ("INT8 artifact", int8, int8_sum)):
        print(f"{label}: kernel time {tot:.1f} ms per run\n")
        print("| operator (optimised graph) | nodes | ms per run | share | share of FP32 kernel time |")
        print("|---|---:|---:|---:|---:|")
        for op, (ms, n) in sorted(table.items(), key=lambda kv: -kv[1][0])[:14]:
            print(f"| {op} | {n} | {ms:.2f} | {100 * ms / tot:.1f}% | {ms / fp32_sum:.3f} |")
        print()


if __name__ == "__main__":
    main()
