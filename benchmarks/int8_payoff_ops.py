"""Issue 47 item 2: where the onnx target's INT8 time goes, op by op and layer by layer, against its FP32 reference.

    python benchmarks/int8_payoff_ops.py --bundles LABEL=DIR [LABEL=DIR ...] [--batch 8] [--runs 40] [--name int8_payoff_ops]

Each DIR is a `vitedge build --target onnx` bundle folder (or an output folder holding DIR/onnx), e.g. the
bundle-<model>-state_dict folders `benchmarks/corpus.py --work WORK` leaves. For every bundle, ONNX Runtime's own
profiler (one inference thread, ``SessionOptions.enable_profiling``) runs the bundle's FP32 reference (its manifest's
``artifacts.reference``: attention fused like the INT8 graph where it fuses) and ``model.int8.onnx``, ``--runs`` times
each at ``--batch``, after 5 untimed runs; a node's figure is the 20th percentile of its kernel times (wall time per
node: a loaded machine stretches some, so a low percentile). Then:

* **by kind**: the INT8 GEMM layers (MatMulIntegerToFloat and the other integer kernels), the QuantizeLinear nodes
  that feed them, float math (attention, LayerNorm, GELU, Softmax, Add, ...), layout (Transpose, Reshape, Split, ...);
  FP32's GEMMs (MatMul, Gemm, FusedMatMul, Conv) against INT8's;
* **per layer**: each INT8 layer (its kernel plus its share of the QuantizeLinear nodes feeding it) against the FP32
  node of the same name (the rewrites keep the FP32 node's name and add a suffix), and which layers lose;
* **the bound**: INT8/FP32 if INT8's GEMM layers and their quantization took no time at all, with everything else as
  measured: how low this CPU's INT8 could go by making layers INT8 or float.

Prints Markdown and writes benchmarks/results/<name>_<isa>.md and .json, with the CPU and the load.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "benchmarks"))
from timing import bundle_graph, labelled_bundles, machine_line, results_isa, write_results  # noqa: E402


RESULTS = REPO / "benchmarks" / "results"
INT8_GEMMS = frozenset({"MatMulIntegerToFloat", "QLinearMatMul", "MatMulInteger", "QLinearConv", "ConvInteger", "QGemm",
                        "DynamicQuantizeMatMul"})
FP32_GEMMS = frozenset({"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "Conv", "FusedConv", "NhwcFusedConv"})
QUANT = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
LAYOUT = frozenset({"Transpose", "Reshape", "Split", "Concat", "Gather", "Slice", "Squeeze", "Unsqueeze", "Shape",
                    "Expand", "Identity", "Flatten", "Cast", "ReorderInput", "ReorderOutput"})
# suffixes the onnx target's rewrites add to the FP32 node's name (gemm_bias, patch_embed, quantize/merge)
SUFFIXES = ("/with_bias", "/gemm_with_bias_t", "/as_gemm", "/patch_embed_gemm")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def onnx_reference(bundle: Path) -> str:
    try:
        return json.loads((bundle / "manifest.json").read_text())["artifacts"]["reference"]
    except (OSError, KeyError, ValueError):
        return "reference.fp32.onnx"


def node_times(path: Path, batch: int, runs: int) -> dict[str, tuple[str, float]]:
    """node name -> (op type, 20th percentile of its kernel time in microseconds), one inference thread."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="vitedge-ops-") as tmp:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "profile")
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        inp = session.get_inputs()[0]
        dims = [batch] + [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape[1:]]
        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, dims).astype(np.uint8) if "uint8" in inp.type else rng.standard_normal(dims).astype(np.float32)
        for _ in range(5):
            session.run(None, {inp.name: x})
        profile = session.end_profiling()  # the warm-up runs go with the first file
        os.remove(profile)
        session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        for _ in range(runs + 1):
            session.run(None, {inp.name: x})
        events = json.loads(Path(session.end_profiling()).read_text())
    samples: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            samples[(e["name"][: -len("_kernel_time")], e["args"]["op_name"])].append(float(e["dur"]))
    return {name: (op, float(np.percentile(v[1:] or v, 20))) for (name, op), v in samples.items()}


def _kind(op: str) -> str:
    if op in INT8_GEMMS or op in FP32_GEMMS:
        return "GEMM layers"
    if op in QUANT:
        return "quantize"
    return "layout" if op in LAYOUT else "float math"


def _base(name: str) -> str:
    for s in SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def analyse(bundle: Path, batch: int, runs: int) -> dict[str, Any]:
    import onnx

    onnx_dir = bundle / "onnx" if (bundle / "onnx").is_dir() else bundle
    ref_name = onnx_reference(onnx_dir)
    fp32 = node_times(onnx_dir / ref_name, batch, runs)
    artifact = bundle_graph(onnx_dir, "model", "model.int8.onnx")  # the FP32 graph itself where the bundle ships it
    int8 = node_times(artifact, batch, runs)
    # the QuantizeLinear nodes of the graph ONNX Runtime runs are the artifact's: each one's time shared by its readers
    model = onnx.load(str(artifact), load_external_data=False)
    readers: dict[str, list[str]] = collections.defaultdict(list)
    for n in model.graph.node:
        for i in n.input:
            readers[i].append(n.name)
    quant_share: dict[str, float] = collections.defaultdict(float)
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and n.name in int8:
            rs = readers[n.output[0]]
            for r in rs:
                quant_share[r] += int8[n.name][1] / len(rs)
    by_kind = {side: collections.Counter() for side in ("fp32", "int8")}
    by_op = {side: collections.Counter() for side in ("fp32", "int8")}
    for side, times in (("fp32", fp32), ("int8", int8)):
        for op, us in times.values():
            by_kind[side][_kind(op)] += us
            by_op[side][op] += us
    layers = []
    for name, (op, us) in int8.items():
        if op not in INT8_GEMMS:
            continue
        base = _base(name)
        match = fp32.get(base) or next((v for k, v in fp32.items() if _base(k) == base), None)
        q = quant_share.get(name, 0.0)
        layers.append({"layer": base, "int8_op": op, "int8_us": round(us, 1), "quantize_us": round(q, 1),
                       "fp32_op": match[0] if match else None, "fp32_us": round(match[1], 1) if match else None,
                       "loses": bool(match and us + q >= match[1])})
    total_f, total_i = sum(by_kind["fp32"].values()), sum(by_kind["int8"].values())
    paid = by_kind["int8"]["GEMM layers"] + by_kind["int8"]["quantize"]
    return {"bundle": bundle.name, "reference": ref_name, "batch": batch, "runs": runs,
            "fp32_us": round(total_f, 1), "int8_us": round(total_i, 1), "ratio": total_i / total_f if total_f else None,
            "bound": (total_i - paid) / total_f if total_f else None,
            "by_kind": {s: {k: round(v, 1) for k, v in c.items()} for s, c in by_kind.items()},
            "by_op": {s: {k: round(v, 1) for k, v in c.most_common()} for s, c in by_op.items()},
            "layers": sorted(layers, key=lambda r: r["layer"])}


def _label(layer: str) -> str:
    """A layer's module path without the op parts: ``/blocks.0/net/net.0/MatMul`` -> ``blocks.0/net/net.0``."""
    parts = [p for p in layer.split("/") if p and p not in ("MatMul", "Gemm", "Conv", "merged")]
    return "/".join(parts[-3:]) or layer


def markdown(res: dict[str, Any]) -> str:
    kinds = ("GEMM layers", "quantize", "float math", "layout")
    lines = [f"# Where the onnx target's INT8 time goes ({res['isa']}: {res['machine']})", "",
             f"Measured {res['date']} by `python benchmarks/int8_payoff_ops.py {' '.join(res['argv'])}` on {res['machine']}; "
             f"1-minute load average {res['load'][0]} at the start, {res['load'][1]} at the end (other jobs).", "",
             "ONNX Runtime's profiler, one inference thread, each node's 20th-percentile kernel time over the runs "
             "(wall time per node), summed; FP32 is the bundle's reference (attention fused like the INT8 graph). "
             "`bound`: INT8/FP32 if the INT8 GEMM layers and their QuantizeLinear nodes took no time. Per-node sums are "
             "not the end-to-end time (no session overhead) and a loaded machine moves them: read them within a row.", "",
             "| bundle | batch | FP32 us | INT8 us | INT8/FP32 | bound | " + " | ".join(f"{k} FP32 / INT8 us" for k in kinds)
             + " | INT8 layers losing to FP32 |",
             "|---|---:|---:|---:|---:|---:|" + "---|" * len(kinds) + "---|"]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"| {r['bundle']} | | | | | | " + " | " * len(kinds) + f"{r['error']} |")
            continue
        cells = [f"{r['by_kind']['fp32'].get(k, 0):.0f} / {r['by_kind']['int8'].get(k, 0):.0f}" for k in kinds]
        matched = [l for l in r["layers"] if l["fp32_us"] is not None]
        losing = [l for l in matched if l["loses"]]
        lines.append(f"| {r['bundle']} | {r['batch']} | {r['fp32_us']:.0f} | {r['int8_us']:.0f} | {r['ratio']:.2f} | "
                     f"{r['bound']:.2f} | " + " | ".join(cells) + f" | {len(losing)} of {len(matched)} |")
    lines += ["", "## Op types that cost the INT8 graph more than the FP32 graph (us, FP32 / INT8)", ""]
    for r in res["rows"]:
        if "error" in r:
            continue
        f, i = r["by_op"]["fp32"], r["by_op"]["int8"]
        worse = sorted((op for op in set(f) | set(i) if op not in INT8_GEMMS and op not in FP32_GEMMS),
                       key=lambda op: -(i.get(op, 0) - f.get(op, 0)))[:6]
        lines.append(f"- {r['bundle']} b{r['batch']}: " + ", ".join(f"{op} {f.get(op, 0):.0f} / {i.get(op, 0):.0f}" for op in worse))
    lines += ["", "## INT8 layers against the FP32 node of the same name (us: INT8 kernel + its quantization share / FP32)", ""]
    for r in res["rows"]:
        if "error" in r:
            continue
        cells = [f"{_label(l['layer'])} "
                 f"{l['int8_us']:.0f}+{l['quantize_us']:.0f}/{l['fp32_us']:.0f}{' **loses**' if l['loses'] else ''}"
                 for l in r["layers"] if l["fp32_us"] is not None]
        lines.append(f"- {r['bundle']} b{r['batch']}: " + "; ".join(cells))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import datetime as _dt

    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundles", nargs="+", required=True, metavar="LABEL=DIR")
    ap.add_argument("--batch", type=int, nargs="+", default=[8])
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--name", default="int8_payoff_ops")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    pairs = labelled_bundles(args.bundles)
    if pairs is None:
        print("each --bundles item is LABEL=DIR with DIR an existing bundle folder", file=sys.stderr)
        return 2
    isa = results_isa()
    res: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "isa": isa,
                           "machine": machine_line(), "argv": ["--bundles", "LABEL=DIR ...", "--batch", *map(str, args.batch),
                                                               "--runs", str(args.runs)],
                           "load": [round(os.getloadavg()[0], 2)], "rows": []}
    for label, folder in pairs:
        for batch in args.batch:
            log(f"{label} b{batch}")
            try:
                row = analyse(Path(folder), batch, args.runs)
                row["bundle"] = label
            except Exception as err:  # noqa: BLE001 - one bundle's failure is its row
                row = {"bundle": label, "batch": batch, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"}
            res["rows"].append(row)
    res["load"].append(round(os.getloadavg()[0], 2))
    text = markdown(res)
    write_results(args.out, args.name, isa, res, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
