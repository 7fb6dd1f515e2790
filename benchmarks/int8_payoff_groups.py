"""INT8 against FP32 per GEMM group, on this CPU kind: the figures the onnx target's keep-float step reads for a
bundle built for this kind on another one (issue 47 item 2).

A GEMM group is what the onnx artifact runs for one INT8 layer: the QuantizeLinear of its input and the
MatMulIntegerToFloat with its bias (``fuse_gemm_bias`` of the Q/DQ form), against the FP32 graph's MatMul (as the
build's per-layer step counts them: ``layer_payoff.group_times``). For each shape on a grid (rows M = batch x tokens, input width K, output width N) both graphs are profiled by
ONNX Runtime's profiler (one inference thread, each node's 20th percentile of its kernel times:
``layer_payoff.node_times``, the figures the build's own per-layer step reads), twice, in alternation; the second
profile shows how far one profile's figures move.

    python benchmarks/int8_payoff_groups.py --out benchmarks/results
        -> int8_payoff_groups_<isa>.md / .json (this CPU kind's figures)
    python benchmarks/int8_payoff_groups.py --package benchmarks/results/int8_payoff_groups_avx2.json
        -> vitedge/backends/onnxruntime/payoff_figures/avx2.json (what vitedge ships: the figures, their ISA, the date
           and the results file they come from)

Only this CPU's kind is measured; a kind nobody measured has no file, and the build then says it could not judge.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
from timing import machine_line, results_isa, write_results  # noqa: E402

ROWS = (16, 64, 256, 1024)
WIDTHS = (32, 128, 512, 2048)
PACKAGE = REPO / "vitedge" / "backends" / "onnxruntime" / "payoff_figures"


def group_graphs(m: int, k: int, n: int, folder: Path) -> tuple[Path, Path]:
    """(FP32 graph, INT8 graph as the onnx artifact runs it) of one GEMM with bias on a [1, m, k] input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from vitedge.backends.onnxruntime.gemm_bias import fuse_gemm_bias

    rng = np.random.default_rng(m * 7 + k * 3 + n)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32) * 0.1
    scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
    wq = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    x_in = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])
    y_out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])
    # FP32: the MatMul alone, what the build's per-layer step counts for a layer (its bias Add is a node of another name,
    # which ONNX Runtime fuses with what follows it in a ViT); the INT8 group carries the bias in its kernel
    fp32 = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="/fc/MatMul")], "fp32", [x_in], [y_out],
                             [numpy_helper.from_array(w, "w")])
    inits = [numpy_helper.from_array(wq, "w_q"), numpy_helper.from_array(scale, "w_s"), numpy_helper.from_array(np.zeros(n, np.int8), "w_z"),
             numpy_helper.from_array(np.array(0.05, np.float32), "x_s"), numpy_helper.from_array(np.array(128, np.uint8), "x_z"),
             numpy_helper.from_array(b, "b")]
    qdq = helper.make_graph([helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["x_q"], name="/fc/x_quant"),
                             helper.make_node("DequantizeLinear", ["x_q", "x_s", "x_z"], ["x_dq"], name="/fc/x_dequant"),
                             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w_dq"], name="/fc/w_dequant", axis=1),
                             helper.make_node("MatMul", ["x_dq", "w_dq"], ["h"], name="/fc/MatMul"),
                             helper.make_node("Add", ["h", "b"], ["y"], name="/fc/Add")], "int8", [x_in], [y_out], inits)
    paths = folder / f"fp32_{m}_{k}_{n}.onnx", folder / f"int8_{m}_{k}_{n}.onnx"
    onnx.save(helper.make_model(fp32, opset_imports=[helper.make_opsetid("", 17)]), str(paths[0]))
    model = helper.make_model(qdq, opset_imports=[helper.make_opsetid("", 17)])
    fusion = fuse_gemm_bias(model)
    if fusion.folded != 1:
        raise SystemExit(f"the GEMM bias did not fold at {m}x{k}x{n}: {fusion.one_line()}")
    onnx.save(model, str(paths[1]))
    return paths


def split_int8(times: dict[str, float]) -> tuple[float, float]:
    """(kernel us, input quantization us) of the INT8 group's profile."""
    quant = sum(us for name, us in times.items() if "quant" in name.lower())
    return sum(times.values()) - quant, quant


def measure(runs: int) -> list[dict[str, float]]:
    from vitedge.backends.onnxruntime.layer_payoff import node_times

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in ROWS:
            for k in WIDTHS:
                for n in WIDTHS:
                    fp32, int8 = group_graphs(m, k, n, Path(tmp))
                    seen = []
                    for _ in range(2):  # two profiles each, in alternation: how far one profile's figures move
                        f = sum(node_times(fp32, 1, runs).values())
                        kernel, quant = split_int8(node_times(int8, 1, runs))
                        seen.append((f, kernel, quant))
                    (f1, k1, q1), (f2, k2, q2) = seen
                    row = {"m": m, "k": k, "n": n, "fp32_us": round((f1 + f2) / 2, 2), "int8_kernel_us": round((k1 + k2) / 2, 2),
                           "quantize_us": round((q1 + q2) / 2, 2),
                           "ratio": round((k1 + q1 + k2 + q2) / (f1 + f2), 4),
                           "ratio_runs": [round((k1 + q1) / f1, 4), round((k2 + q2) / f2, 4)], "load": round(os.getloadavg()[0], 2)}
                    rows.append(row)
                    print(f"   {m}x{k}x{n}: {row}", file=sys.stderr, flush=True)
    return rows


def markdown(res: dict) -> str:
    rows = res["rows"]
    moved = [abs(np.log(r["ratio_runs"][0] / r["ratio_runs"][1])) for r in rows]
    lines = [f"# INT8 against FP32 per GEMM group, onnx target ({res['isa']}: {res['machine']})", "",
             f"Measured {res['date']} by `python benchmarks/int8_payoff_groups.py {' '.join(res['argv'])}`; 1-minute load average "
             f"{res['load'][0]} at the start, {res['load'][1]} at the end (2 cores shared with other jobs: per-node times are "
             "stretched; read INT8 against FP32 within a row).", "",
             "One GEMM with bias on a [1, M, K] input (M = batch x tokens): the INT8 group is the QuantizeLinear of its input and "
             "the MatMulIntegerToFloat with the bias (what the onnx artifact runs), FP32 the MatMul (what the build's per-layer step "
             "counts for a layer: its bias Add is fused with what follows in a ViT); ONNX Runtime's "
             "profiler, one inference thread, each node's 20th-percentile kernel time, summed; two profiles each, in "
             "alternation (ratio: both together; `runs`: each alone).", "",
             f"How far one profile's ratio moved from the other's: median {np.median(moved):.1%}, 90th percentile "
             f"{np.percentile(moved, 90):.1%}, largest {max(moved):.1%}.", "",
             "| M | K | N | FP32 us | INT8 kernel us | quantize us | INT8/FP32 | runs |", "|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ratio = f"**{r['ratio']:.2f}**" if r["ratio"] > 1 else f"{r['ratio']:.2f}"
        lines.append(f"| {r['m']} | {r['k']} | {r['n']} | {r['fp32_us']} | {r['int8_kernel_us']} | {r['quantize_us']} | {ratio} | "
                     f"{' / '.join(f'{x:.2f}' for x in r['ratio_runs'])} |")
    return "\n".join(lines) + "\n"


def package(results: Path) -> Path:
    """The package data vitedge reads for this results file's CPU kind: its figures, ISA, date and source."""
    res = json.loads(results.read_text())
    moved = [abs(float(np.log(r["ratio_runs"][0] / r["ratio_runs"][1]))) for r in res["rows"]]
    data = {"isa": res["isa"], "date": res["date"], "machine": res["machine"], "source": f"benchmarks/results/{results.name}",
            "method": "ONNX Runtime profiler, one inference thread, per node p20 kernel time; two profiles per shape",
            "noise": round(float(np.percentile(moved, 90)), 4),  # the 90th percentile of how far one profile's ratio moved
            "groups": [{k: r[k] for k in ("m", "k", "n", "fp32_us", "int8_kernel_us", "quantize_us")} for r in res["rows"]]}
    PACKAGE.mkdir(exist_ok=True)
    out = PACKAGE / f"{res['isa']}.json"
    out.write_text(json.dumps(data, indent=1) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="results folder: int8_payoff_groups_<isa>.md/.json")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--package", type=Path, default=None, help="write the package data from this results json instead")
    args = ap.parse_args()
    if args.package is not None:
        print(package(args.package))
        return
    if args.out is None:
        ap.error("--out or --package")
    load0 = os.getloadavg()[0]
    rows = measure(args.runs)
    res = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "isa": results_isa(), "machine": machine_line(),
           "argv": ["--out", "OUT", "--runs", str(args.runs)], "load": [round(load0, 2), round(os.getloadavg()[0], 2)], "rows": rows}
    write_results(args.out, "int8_payoff_groups", res["isa"], res, markdown(res))


if __name__ == "__main__":
    main()
