"""Shape ops in the onnx target's graphs, before and after the shape-op rewrites (issue 47 item 2).

    python benchmarks/onnx_shape_ops.py --work WORK [--models a,b] [--rounds 12] [--out benchmarks/results]
                                        [--name onnx_shape_ops_<isa>] [--render]

WORK holds the bundles ``benchmarks/onnx_int8_ceiling.py --work WORK`` builds (``bundle-<id>-state_dict``: the onnx
target's full INT8 graph, its payoff steps off, and its FP32 reference). Their graphs are the "before"; the "after"
is each of them with ``vitedge/backends/onnxruntime/shape_constants.fold_shape_arithmetic`` and then
``transpose_pairs.cancel_transpose_pairs`` applied, as the onnx target applies them to both graphs when it builds. A bundle built by a version that already folds them gives after =
before (nothing left to fold): the figures then show what is left. Per model:

* the outputs of each graph before and after, at batch 1, 5 and 8 on seeded random inputs (max abs difference);
* ONNX Runtime's profiler on the four graphs side by side (``layer_payoff.node_times_side_by_side``: one thread, all
  optimisations, their runs alternating, each node's 20th percentile) at batch 1 and 8: the kernel time of the
  shape ops (``SHAPE_OPS``, and any node of the graph's shape arithmetic) and of the whole graph, per graph; per node
  in the JSON (the FP32 and INT8 graphs before);
* the whole graphs timed side by side by the build's method (``int8_timing.interleaved_percentiles``: one thread,
  CPU time, p10): INT8/FP32 before and after, each graph after over before, and a second copy of the FP32 graph
  before over itself (the control: how far two identical graphs read apart in this run).

The load average is recorded at each model's start and end. Writes NAME.md and NAME.json.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import corpus  # noqa: E402  (benchmarks/corpus.py: the manifest, the cache, the log)

from vitedge.backends.onnxruntime import layer_payoff  # noqa: E402
from vitedge.backends.onnxruntime.shape_constants import fold_shape_arithmetic, shape_arithmetic  # noqa: E402
from vitedge.backends.onnxruntime.transpose_pairs import cancel_transpose_pairs  # noqa: E402
from vitedge.core.cpu import cpu_kind, read_cpu  # noqa: E402

SHAPE_OPS = frozenset({"Reshape", "Transpose", "Concat", "Slice", "Gather", "Squeeze", "Unsqueeze", "Flatten", "Expand",
                       "Shape", "Split", "Identity", "Cast", "ConstantOfShape", "Range", "Where", "Equal", "Tile"})
GRAPHS = ("fp32_before", "int8_before", "fp32_after", "int8_after")
BATCHES = (1, 8)
RUNS, SECONDS = 200, 5.0


def shape_nodes(path: Path) -> dict[str, str]:
    """Node name -> op type of the shape ops of the graph ONNX Runtime runs for ``path``: the ``SHAPE_OPS`` and the
    nodes of the source graph's shape arithmetic (an integer Mul or Div there is one)."""
    import onnx

    source = onnx.load(str(path))
    arithmetic = {n.name for n in source.graph.node if set(n.output) & shape_arithmetic(source)}
    graph = layer_payoff.optimized_graph(path)
    return {n.name: n.op_type for n in graph.graph.node if n.op_type in SHAPE_OPS or n.name in arithmetic}


def max_difference(a: Path, b: Path) -> float:
    from vitedge.onnxkit.session import SessionSettings, ort_session

    sa, sb = (ort_session(p, SessionSettings(threads=1)) for p in (a, b))
    inp = sa.get_inputs()[0]
    dims = [d if isinstance(d, int) else 1 for d in inp.shape[1:]]
    worst = 0.0
    for batch in (1, 5, 8):
        x = np.random.default_rng(batch).standard_normal([batch, *dims]).astype(np.float32)
        if "uint8" in inp.type:
            x = np.random.default_rng(batch).integers(0, 256, [batch, *dims]).astype(np.uint8)
        for ya, yb in zip(sa.run(None, {inp.name: x}), sb.run(None, {inp.name: x})):
            worst = max(worst, float(np.max(np.abs(np.asarray(ya, dtype=np.float64) - np.asarray(yb, dtype=np.float64)))))
    return worst


def measure(bundle: Path, tmp: Path, rounds: int) -> dict[str, Any]:
    import onnx

    from vitedge.backends.int8_timing import interleaved_percentiles
    from vitedge.backends.onnxruntime.payoff import one_thread_run

    m = json.loads((bundle / "manifest.json").read_text())
    arts = m.get("artifacts", {})
    paths = {"int8_before": bundle / arts.get("model", "model.int8.onnx"),
             "fp32_before": bundle / arts.get("reference", "reference.fp32.onnx")}
    rec: dict[str, Any] = {"folding": {}, "nodes": {}, "max_abs_difference": {}}
    for kind in ("fp32", "int8"):
        graph = onnx.load(str(paths[f"{kind}_before"]))
        rec["folding"][kind] = fold_shape_arithmetic(graph).to_dict()
        rec["folding"][kind]["transpose_pairs"] = cancel_transpose_pairs(graph)
        paths[f"{kind}_after"] = tmp / f"{kind}_after.onnx"
        onnx.save(graph, str(paths[f"{kind}_after"]))
        rec["max_abs_difference"][kind] = max_difference(paths[f"{kind}_before"], paths[f"{kind}_after"])
    shapes = {g: shape_nodes(paths[g]) for g in GRAPHS}
    rec["nodes"] = {g: len(layer_payoff.optimized_graph(paths[g]).graph.node) for g in GRAPHS}
    rec["shape_nodes"] = {g: len(shapes[g]) for g in GRAPHS}
    for batch in BATCHES:
        times = dict(zip(GRAPHS, layer_payoff.node_times_side_by_side(tuple(paths[g] for g in GRAPHS), batch, runs=RUNS,
                                                                       seconds=SECONDS)))
        rec[f"b{batch}_profile"] = {
            g: {"total_us": round(sum(times[g].values()), 1), "shape_us": round(sum(times[g].get(n, 0.0) for n in shapes[g]), 1)}
            for g in GRAPHS}
        rec[f"b{batch}_shape_nodes_before"] = {
            kind: [[n, op, round(times[f"{kind}_before"].get(n, 0.0), 1)] for n, op in shapes[f"{kind}_before"].items()]
            for kind in ("fp32", "int8")}
        runs = {k: one_thread_run(paths[g], batch) for k, g in (("fp32_before", "fp32_before"), ("control", "fp32_before"),
                                                                 ("int8_before", "int8_before"), ("fp32_after", "fp32_after"),
                                                                 ("int8_after", "int8_after"))}
        t = interleaved_percentiles(runs, rounds=rounds, per_round=3, seed=400 + batch, max_seconds=90)
        rec[f"b{batch}_timed"] = {"int8_over_fp32_before": round(t["int8_before"] / t["fp32_before"], 4),
                                  "int8_over_fp32_after": round(t["int8_after"] / t["fp32_after"], 4),
                                  "control": round(t["control"] / t["fp32_before"], 4),
                                  "fp32_after_over_before": round(t["fp32_after"] / t["fp32_before"], 4),
                                  "int8_after_over_before": round(t["int8_after"] / t["int8_before"], 4),
                                  "fp32_before_ms": round(1e3 * t["fp32_before"], 3)}
    return rec


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# Shape ops in the onnx target's graphs, before and after the shape-op rewrites ({res['cpu']})", "",
             f"Measured {res['date']} by `python benchmarks/onnx_shape_ops.py {' '.join(res['argv'])}` on {res['cpu_line']}. "
             "Load average (1 min) at each model's start / end: "
             + ", ".join(f"{r['model']} {r['load']}/{r.get('load_end', '-')}" for r in res["models"]) + ".", "",
             "Graphs: the onnx target's full INT8 graph (payoff steps off) and its FP32 reference as built without the "
             "rewrites (before), and the same with `shape_constants.fold_shape_arithmetic` and `transpose_pairs.cancel_transpose_pairs` (after). `shape us`: ONNX "
             "Runtime's profiler, one thread, the four graphs' runs alternating, per node the 20th percentile of its kernel "
             "times, summed over the shape ops (Reshape, Transpose, Concat, Slice, Gather, Split, Shape, Expand, ... and "
             "the shape arithmetic's integer ops). `timed`: whole graphs side by side by the build's timing method (one "
             "thread, CPU time, p10); `control` is a second copy of the FP32 graph before over itself; `after/before` is "
             "each graph's time after the rewrite over before. `diff`: the largest absolute output difference before "
             "against after (batch 1, 5, 8).", "",
             "| model | batch | shape nodes FP32 / INT8, before -> after | shape us FP32 before -> after | shape us INT8 before -> after "
             "| FP32 graph us (profile) | INT8/FP32 before -> after (timed) | control | FP32 after/before | INT8 after/before | diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["models"]:
        if "error" in r:
            lines.append(f"| {r['model']} | - | - | - | - | - | - | - | - | - | {r['error'][:120]} |")
            continue
        n = r["shape_nodes"]
        diff = max(r["max_abs_difference"].values())
        for b in BATCHES:
            p, t = r[f"b{b}_profile"], r[f"b{b}_timed"]
            lines.append(
                f"| {r['model']} | {b} | {n['fp32_before']} / {n['int8_before']} -> {n['fp32_after']} / {n['int8_after']} | "
                f"{p['fp32_before']['shape_us']:.0f} -> {p['fp32_after']['shape_us']:.0f} | "
                f"{p['int8_before']['shape_us']:.0f} -> {p['int8_after']['shape_us']:.0f} | {p['fp32_before']['total_us']:.0f} | "
                f"{t['int8_over_fp32_before']:.3f} -> {t['int8_over_fp32_after']:.3f} | {t['control']:.3f} | "
                f"{t['fp32_after_over_before']:.3f} | {t['int8_after_over_before']:.3f} | {diff:.1g} |")
    lines += ["", *res.get("findings", [])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=None, help="the folder of benchmarks/onnx_int8_ceiling.py's bundles")
    ap.add_argument("--models", default="", help="comma-separated corpus ids (default: every bundle in WORK)")
    ap.add_argument("--rounds", type=int, default=12, help="rounds of the whole-graph timing")
    ap.add_argument("--out", type=Path, default=corpus.RESULTS)
    ap.add_argument("--name", default=None, help="results file stem (default: onnx_shape_ops_<isa>)")
    ap.add_argument("--render", action="store_true", help="write NAME.md again from NAME.json; measure nothing")
    args = ap.parse_args(argv)
    name = args.name or f"onnx_shape_ops_{cpu_kind(read_cpu())}"
    out_json = args.out / f"{name}.json"
    if args.render:
        (args.out / f"{name}.md").write_text(markdown(json.loads(out_json.read_text())))
        return 0
    if args.work is None or not args.work.is_dir():
        print("--work FOLDER is needed: the folder benchmarks/onnx_int8_ceiling.py --work built its bundles in", file=sys.stderr)
        return 2
    ids = [i for i in args.models.split(",") if i] or sorted(
        p.name[len("bundle-"):-len("-state_dict")] for p in args.work.glob("bundle-*-state_dict"))
    missing = [i for i in ids if not (args.work / f"bundle-{i}-state_dict" / "manifest.json").is_file()]
    if missing:
        print(f"no bundle in --work for {', '.join(missing)}: build them with benchmarks/onnx_int8_ceiling.py --work", file=sys.stderr)
        return 2
    isa = read_cpu().isa
    cpu = corpus.cpu_isa()
    res: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                           "argv": corpus.recorded_argv(argv), "cpu": isa,
                           "cpu_line": f"{cpu.get('model', 'CPU')} ({os.cpu_count()} cores, ISA label {isa})", "models": []}
    if out_json.is_file():  # a run in parts: keep the models an earlier part measured
        old = json.loads(out_json.read_text())
        res["models"] = [r for r in old.get("models", []) if r["model"] not in ids]
        res["findings"] = old.get("findings", [])
    for mid in ids:
        corpus.log(f"== {mid}")
        rec: dict[str, Any] = {"model": mid, "load": round(os.getloadavg()[0], 2)}
        try:
            with tempfile.TemporaryDirectory() as tmp:
                rec.update(measure(args.work / f"bundle-{mid}-state_dict", Path(tmp), args.rounds))
            for b in BATCHES:
                t = rec[f"b{b}_timed"]
                corpus.log(f"   b{b}: INT8/FP32 {t['int8_over_fp32_before']:.3f} -> {t['int8_over_fp32_after']:.3f} "
                           f"(control {t['control']:.3f}); FP32 after/before {t['fp32_after_over_before']:.3f}, "
                           f"INT8 {t['int8_after_over_before']:.3f}")
        except Exception as err:  # noqa: BLE001 - one model's failure is a row, the others still run
            rec["error"] = corpus._one_line(err)
        rec["load_end"] = round(os.getloadavg()[0], 2)
        res["models"] = [r for r in res["models"] if r["model"] != mid] + [rec]
        args.out.mkdir(parents=True, exist_ok=True)
        out_json.write_text(json.dumps(res, indent=1) + "\n")
        (args.out / f"{name}.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
