"""How fast can INT8 be on this CPU for the corpus's ViTs in ONNX Runtime (issue 47 item 2)?

    python benchmarks/onnx_int8_ceiling.py [--models a,b] [--calib-size 200] [--val-size 200] --work WORK
                                           [--out benchmarks/results] [--name onnx_int8_ceiling_<isa>]

Per corpus model (benchmarks/corpus/manifest.toml, the cache benchmarks/corpus/cache.py fills):

* ``vitedge build`` of its state_dict (benchmarks/corpus.py's build: the same flags, ``--no-latency``) for a
  target that is the onnx target with its INT8 payoff steps off (``int8_payoff = false``, written to a target folder
  in WORK): the artifact is the onnx target's full INT8 graph (attention cores fused, GEMM biases and the patch
  embedding folded into MatMulIntegerToFloat, the INT8 layers ONNX Runtime would run in float kept float), beside
  its FP32 reference (attention cores fused alike). ``--calib-size`` calibration images.
* ONNX Runtime's profiler on both graphs (``layer_payoff.node_times_side_by_side``: one inference thread, all
  optimisations, the two graphs' runs alternating, each node's 20th percentile of its kernel times over up to 200 runs
  or 6 s of each graph) at batch 8 and batch 1; the kernel time summed
  by kind of op: GEMM (MatMul, Gemm, MatMulIntegerToFloat, QLinearMatMul, ... and the convolutions, with the Add of a
  float GEMM's bias, which ONNX Runtime does not fuse into a MatMul of three dimensions: ``layer_payoff.bias_adds``), attention
  (MultiHeadAttention and other fused attention cores), Q/DQ (QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear),
  LayerNorm, Softmax, GELU, shape (Reshape, Transpose, Concat, Slice, Gather, ...), elementwise, other.
* The **ceiling**: the INT8 layers grouped as the per-layer payoff step groups them (``layer_payoff.layer_groups``: the
  layers that read one quantized activation), each group's INT8 time (its kernels and the QuantizeLinear only it reads)
  against the FP32 time of the same layers (``layer_payoff.group_times``); the ceiling is the FP32 graph's time with
  every group at the better of the two, everything else as in FP32, over the FP32 graph's time. It is what no
  placement of INT8 layers can beat with these kernels. Also: the INT8 graph's own ratio (sum of its kernel times over
  FP32's), and where it loses against the ceiling (groups that lose, Q/DQ outside the groups, the other ops).

Kernel-time sums leave out the executor's own time between kernels (the same in both graphs up to the node count).
The per-node figures are one profile per graph per batch size on a shared machine: the load average is recorded.
Writes NAME.md and NAME.json.
"""

from __future__ import annotations

import argparse
import collections
import datetime as _dt
import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import corpus  # noqa: E402  (benchmarks/corpus.py: the manifest, the splits and the build through the CLI)

from vitedge.backends.onnxruntime import layer_payoff  # noqa: E402
from vitedge.core.cpu import cpu_kind, read_cpu  # noqa: E402

TARGET = "onnx-all-int8"
TARGET_TOML = f"""name = "{TARGET}"
description = "The onnx target with its INT8 payoff steps off: the full INT8 graph (benchmarks/onnx_int8_ceiling.py)"
backend = "onnxruntime"
precision = "int8"
batch_sizes = [1, 8]

[thresholds]
max_top1_drop = 0.2
min_agreement = 0.995
min_speedup = 1.0

[backend_options]
graph_optimization = "all"
threads = 0
fuse_attention = true
int8_payoff = false
"""

KINDS: dict[str, tuple[str, ...]] = {
    "gemm": ("MatMul", "Gemm", "FusedMatMul", "FusedGemm", "MatMulIntegerToFloat", "QLinearMatMul", "MatMulInteger",
             "DynamicQuantizeMatMul", "QGemm", "Conv", "FusedConv", "NhwcFusedConv", "QLinearConv", "ConvInteger"),
    "attention": ("MultiHeadAttention", "Attention", "QAttention", "GroupQueryAttention"),
    "qdq": ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"),
    "layernorm": ("LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                  "SkipSimplifiedLayerNormalization", "ReduceMean", "Pow", "Sqrt"),
    "softmax": ("Softmax",),
    "gelu": ("Gelu", "BiasGelu", "FastGelu", "QuickGelu", "Erf", "Tanh", "Sigmoid", "Relu"),
    "shape": ("Reshape", "Transpose", "Concat", "Slice", "Gather", "Squeeze", "Unsqueeze", "Flatten", "Expand", "Shape",
              "Split", "Identity", "Cast", "ConstantOfShape", "Range", "Where", "Equal", "GatherElements", "Tile", "MaxPool",
              "GlobalAveragePool", "ReduceSum", "Pad"),
    "elementwise": ("Add", "Sum", "Mul", "Div", "Sub", "BiasAdd", "Neg", "Max", "Min", "Abs"),
}
KIND_OF = {op: kind for kind, ops in KINDS.items() for op in ops}
BATCHES = (8, 1)
RUNS, SECONDS = 200, 6.0  # profiled runs of each graph (alternating), at most this many seconds of each


def by_kind(times: dict[str, float], ops: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = collections.defaultdict(float)
    for name, us in times.items():
        out[KIND_OF.get(ops.get(name, "?"), "other")] += us
    return dict(out)


def by_op(times: dict[str, float], ops: dict[str, str]) -> dict[str, float]:
    out: dict[str, float] = collections.defaultdict(float)
    for name, us in times.items():
        out[ops.get(name, "?")] += us
    return dict(out)


def ceiling(int8_path: Path, fp32_path: Path, batch: int) -> dict[str, Any]:
    """The breakdown of both graphs at ``batch`` and the ceiling (module docstring)."""
    graph, f_graph = layer_payoff.optimized_graph(int8_path), layer_payoff.optimized_graph(fp32_path)
    i_ops = {n.name: n.op_type for n in graph.graph.node}
    f_ops = {n.name: n.op_type for n in f_graph.graph.node}
    i_adds, f_adds = layer_payoff.bias_adds(graph), layer_payoff.bias_adds(f_graph)
    i_raw, f_raw = layer_payoff.node_times_side_by_side((int8_path, fp32_path), batch, runs=RUNS, seconds=SECONDS)
    # a GEMM's bias Add counts as the GEMM's (the INT8 layers hold their bias; ONNX Runtime adds a float MatMul's apart)
    i_us, f_us = layer_payoff.with_bias_adds(i_raw, i_adds), layer_payoff.with_bias_adds(f_raw, f_adds)
    readers = layer_payoff.sole_readers(graph)
    groups = []
    in_groups: set[str] = set()
    for g in layer_payoff.layer_groups(graph):
        t = layer_payoff.group_times(g, i_us, f_us, readers)
        if t is None:
            continue
        q_counted = bool(g.quantize) and readers.get(g.quantize or "", set()) <= set(g.layers)
        in_groups |= set(g.layers) | ({g.quantize} if q_counted else set())
        groups.append({"layers": list(g.names), "int8_us": round(t[0], 2), "fp32_us": round(t[1], 2)})
    f_total, i_total = sum(f_us.values()), sum(i_us.values())
    gain = sum(max(0.0, g["fp32_us"] - g["int8_us"]) for g in groups)
    loss = sum(max(0.0, g["int8_us"] - g["fp32_us"]) for g in groups)
    fp32_grouped = sum(g["fp32_us"] for g in groups)
    i_kind, f_kind = by_kind(i_us, i_ops), by_kind(f_us, f_ops)
    outside = {k: v for k, v in by_kind({n: t for n, t in i_us.items() if n not in in_groups}, i_ops).items()}
    # the INT8 graph against the ceiling: its groups that lose, and what its non-group ops cost over FP32's non-GEMM ops
    return {
        "batch": batch, "fp32_us": round(f_total, 1), "int8_us": round(i_total, 1),
        "int8_over_fp32": round(i_total / f_total, 4), "ceiling": round((f_total - gain) / f_total, 4),
        "gemm_share_fp32": round(f_kind.get("gemm", 0.0) / f_total, 4),
        "grouped_share_fp32": round(fp32_grouped / f_total, 4),
        "groups": groups, "groups_winning": sum(g["int8_us"] < g["fp32_us"] for g in groups),
        "group_loss_us": round(loss, 1), "group_gain_us": round(gain, 1),
        "fp32_by_kind": {k: round(v, 1) for k, v in sorted(f_kind.items())},
        "int8_by_kind": {k: round(v, 1) for k, v in sorted(i_kind.items())},
        "int8_outside_groups_by_kind": {k: round(v, 1) for k, v in sorted(outside.items())},
        "fp32_bias_add_us": round(sum(f_raw.get(a, 0.0) for a in f_adds), 1),
        "int8_bias_add_us": round(sum(i_raw.get(a, 0.0) for a in i_adds), 1),
        "fp32_by_op": {k: round(v, 1) for k, v in sorted(by_op(f_raw, f_ops).items(), key=lambda kv: -kv[1])},
        "int8_by_op": {k: round(v, 1) for k, v in sorted(by_op(i_raw, i_ops).items(), key=lambda kv: -kv[1])},
        "nodes": {"fp32": len(f_ops), "int8": len(i_ops)}, "sum_is_elementwise": True,
    }


def build_bundle(model, split: Path, work: Path, timeout: float) -> tuple[Path, dict[str, Any]]:
    out = work / f"bundle-{model.id}-state_dict"
    if (out / "manifest.json").is_file():
        return out, {"reused": True}
    rows = corpus.build(model, "state_dict", split, work, [TARGET], [], timeout, latency=False)
    row = rows[0]
    return out, {"exit_code": row.exit_code, "seconds": row.seconds, "agreement": row.agreement, "drop_points": row.drop_points,
                 "int8_layers": row.int8_layers, "layers_total": row.layers_total, "note": row.note[:200]}


def graphs(bundle: Path) -> tuple[Path, Path]:
    m = json.loads((bundle / "manifest.json").read_text())
    arts = m.get("artifacts", {})
    return bundle / arts.get("model", "model.int8.onnx"), bundle / arts.get("reference", "reference.fp32.onnx")


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# INT8 against its ceiling on ONNX Runtime, per corpus model ({res['cpu']})", "",
             f"Measured {res['date']} by `python benchmarks/onnx_int8_ceiling.py {' '.join(res['argv'])}` on {res['cpu_line']}. "
             "Load average (1 min) at each model's start: " + ", ".join(f"{r['model']} {r['load']}" for r in res["models"]) + ".", "",
             "Graphs: the onnx target's full INT8 graph (its INT8 payoff steps off) and its FP32 reference, both as the build "
             "writes them. Times: ONNX Runtime's profiler, one thread, the two graphs' runs alternating (up to 200 each), per "
             "node the 20th percentile of its kernel times, summed "
             "(executor time between kernels not counted). `ceiling`: the FP32 graph's time with every INT8 layer group at the "
             "better of its INT8 time (kernels + the QuantizeLinear only it reads) and its FP32 time, everything else as in FP32, "
             "over the FP32 graph's time. `GEMM share`: the FP32 graph's GEMM and convolution kernels (not the attention core) "
             "over its total; `grouped`: the FP32 time of the layers INT8 can replace. A float GEMM's bias Add counts as the GEMM's "
             "(ONNX Runtime does not fuse it into a MatMul on tokens; the INT8 layers hold their bias).", "",
             "| model | batch | FP32 us | GEMM share | grouped | groups winning | INT8/FP32 | ceiling | INT8 over ceiling: losing groups / Q-DQ outside groups / other ops, % of FP32 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in res["models"]:
        for c in r.get("profile", []):
            lines.append(_row(r["model"], c))
        if "error" in r:
            lines.append(f"| {r['model']} | - | - | - | - | - | - | - | {r['error'][:120]} |")
    lines += ["", "## Where the time goes (kernel us by kind of op, FP32 -> INT8)", "",
              "| model | batch | " + " | ".join(KINDS) + " | other |", "|---|---|" + "---|" * (len(KINDS) + 1)]
    for r in res["models"]:
        for c in r.get("profile", []):
            f, i = _kinds(c, "fp32"), _kinds(c, "int8")
            cells = [f"{f.get(k, 0):.0f} -> {i.get(k, 0):.0f}" for k in (*KINDS, "other")]
            lines.append(f"| {r['model']} | {c['batch']} | " + " | ".join(cells) + " |")
    lines += ["", *res.get("findings", [])]
    return "\n".join(lines) + "\n"


def _kinds(c: dict[str, Any], graph: str) -> dict[str, float]:
    """A graph's kernel time by kind; a record written before Sum was an elementwise kind has it under other."""
    kinds = dict(c[f"{graph}_by_kind"])
    if c.get("sum_is_elementwise") or kinds.get("other", 0.0) <= 0:
        return kinds
    moved = min(c[f"{graph}_by_op"].get("Sum", 0.0), kinds.get("other", 0.0))
    kinds["other"] = kinds.get("other", 0.0) - moved
    kinds["elementwise"] = kinds.get("elementwise", 0.0) + moved
    return kinds


def _row(model: str, c: dict[str, Any]) -> str:
    f = c["fp32_us"]
    outside = c["int8_outside_groups_by_kind"]
    qdq = outside.get("qdq", 0.0)
    # the rest: the INT8 graph's non-group, non-Q/DQ time over the FP32 graph's time outside the grouped layers
    rest = sum(v for k, v in outside.items() if k != "qdq") - (f - c["grouped_share_fp32"] * f)
    return (f"| {model} | {c['batch']} | {f:.0f} | {c['gemm_share_fp32']:.2f} | {c['grouped_share_fp32']:.2f} | "
            f"{c['groups_winning']} of {len(c['groups'])} | {c['int8_over_fp32']:.2f} | {c['ceiling']:.2f} | "
            f"{100 * c['group_loss_us'] / f:.1f} / {100 * qdq / f:.1f} / {100 * rest / f:.1f} |")


def side_by_side(before: Path, after: Path, ids: list[str], rounds: int) -> list[dict[str, Any]]:
    """Per model, the default onnx bundles of two code versions (``benchmarks/corpus.py --work`` folders) timed in one
    process: each INT8 artifact over its own FP32 reference, and a second copy of the earlier reference over it (the
    control), by the build's timing method (``int8_timing.interleaved_percentiles``: one thread, CPU time, p10)."""
    from vitedge.backends.int8_timing import interleaved_percentiles
    from vitedge.backends.onnxruntime.payoff import one_thread_run

    out = []
    for mid in ids:
        b, a = before / f"bundle-{mid}-state_dict", after / f"bundle-{mid}-state_dict"
        if not (b / "manifest.json").is_file() or not (a / "manifest.json").is_file():
            out.append({"model": mid, "error": "a bundle is missing"})
            continue
        (bi, bf), (ai, af) = graphs(b), graphs(a)
        rec: dict[str, Any] = {"model": mid, "load": round(os.getloadavg()[0], 2)}
        for batch in (1, 8):
            runs = {k: one_thread_run(p, batch) for k, p in (("fp32_before", bf), ("control", bf), ("int8_before", bi),
                                                              ("fp32_after", af), ("int8_after", ai))}
            t = interleaved_percentiles(runs, rounds=rounds, per_round=3, seed=300 + batch, max_seconds=60)
            rec[f"b{batch}"] = {"before": round(t["int8_before"] / t["fp32_before"], 4),
                                "after": round(t["int8_after"] / t["fp32_after"], 4),
                                "control": round(t["control"] / t["fp32_before"], 4),
                                "fp32_after_over_before": round(t["fp32_after"] / t["fp32_before"], 4)}
        rec["load_end"] = round(os.getloadavg()[0], 2)
        corpus.log(f"   {mid}: " + ", ".join(f"b{x} {rec[f'b{x}']['before']:.2f} -> {rec[f'b{x}']['after']:.2f} "
                                              f"(control {rec[f'b{x}']['control']:.2f})" for x in (1, 8)))
        out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated corpus ids (default: all)")
    ap.add_argument("--calib-size", type=int, default=200)
    ap.add_argument("--val-size", type=int, default=200)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--work", type=Path, default=None, help="work folder (bundles are reused from it); needed unless --side-by-side")
    ap.add_argument("--out", type=Path, default=corpus.RESULTS)
    ap.add_argument("--name", default=None, help="results file stem (default: onnx_int8_ceiling_<isa>)")
    ap.add_argument("--side-by-side", type=Path, nargs=2, metavar=("BEFORE", "AFTER"), default=None,
                    help="time the default onnx bundles two benchmarks/corpus.py --work folders hold, side by side; "
                         "writes NAME_side_by_side.json")
    ap.add_argument("--rounds", type=int, default=12, help="rounds of the side-by-side timing")
    ap.add_argument("--render", action="store_true", help="write NAME.md again from NAME.json; measure nothing")
    args = ap.parse_args(argv)
    if args.render:
        name = args.name or f"onnx_int8_ceiling_{cpu_kind(read_cpu())}"
        res = json.loads((args.out / f"{name}.json").read_text())
        (args.out / f"{name}.md").write_text(markdown(res))
        return 0
    manifest = corpus.cache.load_manifest()
    ids = [i for i in args.models.split(",") if i] or [m.id for m in manifest.models]
    try:
        models = [manifest.model(i) for i in ids]
    except KeyError as err:
        print(err.args[0], file=sys.stderr)
        return 2
    found = corpus.cache.find_cache(manifest, ids)
    if found is not None:
        corpus.cache.use_cache(found)
    missing = corpus.cache.problems(manifest, ids)
    if missing:
        print("\n".join(missing) + "\nthe corpus cache is incomplete: benchmarks/corpus/fetch.md says how to fill it", file=sys.stderr)
        return 2
    if args.side_by_side:
        name = args.name or f"onnx_int8_ceiling_{cpu_kind(read_cpu())}_side_by_side"
        rows = side_by_side(*args.side_by_side, ids, args.rounds)
        res = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "argv": corpus.recorded_argv(argv),
               "cpu": read_cpu().isa, "models": rows}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
        print(json.dumps(res, indent=1))
        return 0
    if args.work is None:
        print("--work FOLDER is needed (the bundles are built there)", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    targets = args.work / "targets"
    targets.mkdir(exist_ok=True)
    (targets / f"{TARGET}.toml").write_text(TARGET_TOML)
    os.environ["VITEDGE_TARGETS_PATH"] = str(targets)
    isa = read_cpu().isa
    cpu = corpus.cpu_isa()
    res: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                           "argv": corpus.recorded_argv(argv), "cpu": isa,
                           "cpu_line": f"{cpu.get('model', 'CPU')} ({os.cpu_count()} cores, ISA label {isa})",
                           "calib_size": args.calib_size, "val_size": args.val_size, "models": []}
    name = args.name or f"onnx_int8_ceiling_{cpu_kind(read_cpu())}"
    old = args.out / f"{name}.json"
    if old.is_file():  # a run in parts: keep the models an earlier part measured
        res["models"] = [r for r in json.loads(old.read_text()).get("models", []) if r["model"] not in ids]
    for model in models:
        corpus.log(f"== {model.id}")
        rec: dict[str, Any] = {"model": model.id, "load": round(os.getloadavg()[0], 2)}
        try:
            split = corpus.cache.make_split(manifest.datasets[model.dataset], args.calib_size, args.val_size)
            bundle, rec["build"] = build_bundle(model, split, args.work, args.timeout)
            int8, fp32 = graphs(bundle)
            rec["profile"] = [ceiling(int8, fp32, b) for b in BATCHES]
            for c in rec["profile"]:
                corpus.log(f"   b{c['batch']}: INT8/FP32 {c['int8_over_fp32']:.2f} ceiling {c['ceiling']:.2f} "
                           f"GEMM share {c['gemm_share_fp32']:.2f} groups winning {c['groups_winning']}/{len(c['groups'])}")
        except Exception as err:  # noqa: BLE001 - one model's failure is a row, the others still run
            rec["error"] = corpus._one_line(err)
        rec["load_end"] = round(os.getloadavg()[0], 2)
        res["models"] = [r for r in res["models"] if r["model"] != model.id] + [rec]
        args.out.mkdir(parents=True, exist_ok=True)
        old.write_text(json.dumps(res, indent=1) + "\n")
        (args.out / f"{name}.md").write_text(markdown(res))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
