"""Where ONNX Runtime spends an onnx bundle's time: FP32 reference vs INT8 artifact, per operator type (issue 19 item 5).

    python benchmarks/ort_profile.py --bundle OUT/onnx [--batch 1] [--runs 8] [--rounds 3] [--also NAME=GRAPH.onnx ...]

Both graphs run on the CPU execution provider with the bundle's session settings (all optimisations, ``--threads``),
warmed up, then ``--runs`` profiled runs each (ONNX Runtime's own profiler, ``SessionOptions.enable_profiling``);
the per-node kernel times are summed by operator type of the *optimised* graph (what ORT really runs:
``MatMulIntegerToFloat``, ``MultiHeadAttention``, ``BiasGelu``...). Also printed: the wall median of five unprofiled
runs of each graph, their ratio, and how much of the FP32 time each INT8 share amounts to, which bounds what any
change outside the INT8 GEMMs can win. Prints Markdown.

Issue 28: the summary table splits each graph's kernel time into the INT8 GEMMs (``INT8_GEMMS``) and everything
else, as fractions of the same round's FP32 kernel time; ``--rounds`` interleaves all graphs that many times (min /
median reported: this is meant for shared, noisy machines), ``--also NAME=GRAPH`` adds graphs of the same model
(a rewritten artifact, an anchor), ``--cpu-time N`` measures process CPU time on one thread instead (with each
graph's per-round ratio to the INT8 artifact, paired, and in how many rounds it was lower), ``--anchors N`` quantizes the FP32 reference with ``quantize_static`` (defaults)
and NNCF ``TRANSFORMER`` (ONNX backend) on N of the bundle's validation images and profiles them beside it.
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

from vitedge.core.cpu import read_cpu  # noqa: E402


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


def anchor_graphs(bundle: Path, work: Path, images: int) -> list[tuple[str, Path]]:
    """ONNX Runtime ``quantize_static`` (defaults, QDQ) and NNCF ``quantize(model_type=TRANSFORMER)`` (its ONNX
    backend, so ONNX Runtime runs it) of the bundle's FP32 reference, calibrated on ``images`` items of the bundle's
    validation data with the bundle's preprocessing."""
    import contextlib
    import io

    import onnx
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    from vitedge.backends.openvino import block_vendor_telemetry
    from vitedge.datasources.sources import open_source
    from vitedge.bundle.spec import Preprocess

    manifest = json.loads((bundle / "manifest.json").read_text())
    src = open_source(manifest["validation_data"]["path"], Preprocess.from_dict(manifest["input"]["preprocess"]), limit=images, seed=0)
    items = [b.images[i:i + 1] for b in src.batches(8) for i in range(len(b.images))]
    fp32 = bundle / "reference.fp32.onnx"
    name = onnx.load(str(fp32), load_external_data=False).graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({name: x} for x in items)

        def get_next(self):
            return next(self.it, None)

    out = []
    static = work / "ort_quantize_static.onnx"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        quantize_static(str(fp32), str(static), Reader())
    out.append(("quantize_static defaults", static))
    block_vendor_telemetry()  # NNCF telemetry: a forked sender that hangs on a closed network
    import nncf

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        q = nncf.quantize(onnx.load(str(fp32)), nncf.Dataset([{name: x} for x in items]), model_type=nncf.ModelType.TRANSFORMER)
    onnx.save(q, str(work / "nncf_transformer.onnx"))
    out.append(("NNCF TRANSFORMER (ONNX)", work / "nncf_transformer.onnx"))
    return out


# Optimised-graph op types that are the INT8 GEMMs themselves; everything else is "outside the GEMMs".
INT8_GEMMS = ("MatMulIntegerToFloat", "QLinearMatMul", "MatMulInteger", "QGemm", "QLinearConv", "ConvInteger",
              "DynamicQuantizeMatMul", "QAttention")


def split(table: dict[str, tuple[float, int]], fp32_total: float) -> tuple[float, float]:
    """(INT8 GEMM kernel time, everything else) as fractions of the FP32 graph's kernel time."""
    gemm = sum(ms for op, (ms, _) in table.items() if op in INT8_GEMMS)
    rest = sum(ms for op, (ms, _) in table.items() if op not in INT8_GEMMS)
    return gemm / fp32_total, rest / fp32_total


def print_table(label: str, table: dict[str, tuple[float, int]], fp32_sum: float) -> None:
    tot = sum(v[0] for v in table.values())
    print(f"{label}: kernel time {tot:.1f} ms per run\n")
    print("| operator (optimised graph) | nodes | ms per run | share | share of FP32 kernel time |")
    print("|---|---:|---:|---:|---:|")
    for op, (ms, n) in sorted(table.items(), key=lambda kv: -kv[1][0])[:16]:
        print(f"| {op} | {n} | {ms:.2f} | {100 * ms / tot:.1f}% | {ms / fp32_sum:.3f} |")
    print()


def cpu_ms(path: Path, x: np.ndarray, runs: int) -> float:
    """Median process CPU time of one run on one intra-op thread with spinning off: on a machine shared with other
    jobs this counts the work, not the time spent waiting for a core (cache contention still inflates it)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    for _ in range(2):
        sess.run(None, feed)
    times = []
    for _ in range(runs):
        t0 = time.process_time()
        sess.run(None, feed)
        times.append((time.process_time() - t0) * 1000)
    return float(np.median(times))


def print_cpu_time(graphs: list[tuple[str, Path]], x: np.ndarray, rounds: int, runs: int) -> None:
    table = [{label: cpu_ms(path, x, runs) for label, path in graphs} for _ in range(rounds)]
    print(f"Process CPU time, 1 thread, spinning off: {rounds} interleaved rounds of {runs} runs per graph; "
          "ratio to the same round's FP32 reference, min / median over rounds.\n")
    print("Last column: the graph's CPU time over the INT8 artifact's in the same round (paired, so drift between rounds "
          "cancels), median, and in how many rounds it was the lower of the two.\n")
    print("| graph | CPU ms per run (median) | INT8/FP32 CPU time | / INT8 artifact (median; rounds lower) |")
    print("|---|---:|---:|---:|")
    for label, _ in graphs:
        ratio = [r[label] / r["FP32 reference"] for r in table]
        paired = [r[label] / r["INT8 artifact"] for r in table]
        lower = sum(p < 1.0 for p in paired)
        vs = f"{float(np.median(paired)):.3f}; {lower} of {len(paired)}" if label != "INT8 artifact" else "1"
        print(f"| {label} | {float(np.median([r[label] for r in table])):.1f} | {stat(ratio)} | {vs} |")
    print()


def stat(values: list[float]) -> str:
    return f"{min(values):.3f} / {float(np.median(values)):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, required=True, help="an onnx bundle (reference.fp32.onnx, model.int8.onnx)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds over all graphs (min / median reported)")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=PATH",
                    help="another graph of the same model to profile beside the bundle's, e.g. a rewritten INT8 graph "
                         "or quantize_static's")
    ap.add_argument("--anchors", type=int, default=0, metavar="N",
                    help="also quantize the FP32 reference with quantize_static and NNCF TRANSFORMER on N images")
    ap.add_argument("--anchor-dir", type=Path, default=Path(tempfile.gettempdir()) / "ort_profile_anchors",
                    help="where --anchors writes its graphs (reused by --also on later runs)")
    ap.add_argument("--cpu-time", type=int, default=0, metavar="N",
                    help="instead of profiling: process CPU time of N runs per graph and round on one thread")
    args = ap.parse_args()
    import onnxruntime as ort

    first = ort.InferenceSession(str(args.bundle / "reference.fp32.onnx"), providers=["CPUExecutionProvider"]).get_inputs()[0]
    shape = [args.batch] + [d if isinstance(d, int) else 1 for d in first.shape[1:]]
    rng = np.random.default_rng(0)
    x = (rng.integers(0, 256, shape).astype(np.uint8) if "uint8" in first.type  # preprocessing baked into the graph
         else rng.standard_normal(shape).astype(np.float32))
    graphs = [("FP32 reference", args.bundle / "reference.fp32.onnx"), ("INT8 artifact", args.bundle / "model.int8.onnx")]
    for item in args.also:
        name, _, path = item.partition("=")
        graphs.append((name, Path(path)))
    if args.anchors:
        args.anchor_dir.mkdir(parents=True, exist_ok=True)
        graphs += anchor_graphs(args.bundle, args.anchor_dir, args.anchors)
    if args.cpu_time:
        cpu = read_cpu()
        print(f"CPU: {cpu.model} ({cpu.isa}); ONNX Runtime {ort.__version__}; batch {args.batch}; bundle {args.bundle}; "
              f"load average {os.getloadavg()[0]:.1f}\n")
        print_cpu_time(graphs, x, args.rounds, args.cpu_time)
        return
    # interleaved: every round profiles every graph once, so load drift hits all of them alike
    rounds: list[dict[str, tuple[float, dict[str, tuple[float, int]]]]] = []
    for _ in range(args.rounds):
        rounds.append({label: profile(path, x, args.threads, args.runs) for label, path in graphs})
    cpu = read_cpu()
    print(f"CPU: {cpu.model} ({cpu.isa}); ONNX Runtime {ort.__version__}; {args.threads} threads; batch {args.batch}; "
          f"bundle {args.bundle}; {args.rounds} interleaved rounds of {args.runs} profiled runs; load average "
          f"{os.getloadavg()[0]:.1f}\n")
    print("Per round: the graph's wall median of 5 unprofiled runs over FP32's in the same round, and its kernel time in "
          "the INT8 GEMMs and outside them as fractions of the same round's FP32 kernel time. min / median over rounds.\n")
    print("| graph | wall ms (median) | INT8/FP32 wall | INT8 GEMMs / FP32 | outside the INT8 GEMMs / FP32 |")
    print("|---|---:|---:|---:|---:|")
    for label, _ in graphs:
        walls = [r[label][0] for r in rounds]
        ratio = [r[label][0] / r["FP32 reference"][0] for r in rounds]
        shares = [split(r[label][1], sum(v[0] for v in r["FP32 reference"][1].values())) for r in rounds]
        print(f"| {label} | {float(np.median(walls)):.1f} | {stat(ratio)} | {stat([s[0] for s in shares])} | "
              f"{stat([s[1] for s in shares])} |")
    print()
    last = rounds[-1]
    fp32_sum = sum(v[0] for v in last["FP32 reference"][1].values())
    print("Per operator, last round:\n")
    for label, _ in graphs:
        print_table(label, last[label][1], fp32_sum)


if __name__ == "__main__":
    main()
