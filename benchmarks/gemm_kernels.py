"""Issue 28 items 1-2: how fast ONNX Runtime's integer GEMM kernels are against its FP32 GEMM, at ViT shapes.

The INT8 graph's batch-1 time is bounded below by its GEMMs: on an AVX2 CPU without VNNI the 48
``MatMulIntegerToFloat`` of ViT-B/16 took 0.514 of the FP32 graph's kernel time
(results/ort_int8_avx2_profile.md). This script asks whether another ONNX Runtime kernel does the same
GEMM faster, one GEMM at a time, at the shapes of a ViT linear layer (197 rows per image):

* ``fp32``: ``MatMul`` on float32 (the FP32 graph's kernel, MLAS SGEMM);
* ``qdq``: ``QuantizeLinear`` / ``DequantizeLinear`` around ``MatMul``, per-tensor uint8 activation and
  per-channel int8 weights, which ONNX Runtime fuses into ``MatMulIntegerToFloat`` (the kernel the shipped
  onnx artifact's linear layers run on; full-range weights here, where vitedge's default ``pairwise`` range
  narrows some on CPUs without VNNI: the values differ, not the kernel);
* ``nbits<B>_b<K>_acc<A>``: ``com.microsoft.MatMulNBits``, B-bit block-quantized weights (blocks of K along
  the reduction), float activations (``accuracy_level`` 0) or activations quantized to int8 per block inside
  the kernel (``accuracy_level`` 4), ONNX Runtime's weight-only path for language models.

Each graph is one node on a (1, M, K) input; rounds interleaved (benchmarks/timing.py), 2 intra-op threads, spinning off.
The relative error column is max |y - y_fp32| / max |y_fp32| on Gaussian data: a sanity check that the
graph computes the same product, not an accuracy figure. Run from the repository root::

    python benchmarks/gemm_kernels.py [--rows 197] [--rounds 7]

Prints Markdown with the CPU's ISA; the figures are recorded in results/gemm_kernels_<isa>.md by hand.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

SHAPES = ((768, 768), (768, 2304), (768, 3072), (3072, 768))  # (K, N): ViT-B proj, qkv, fc1, fc2


def _model(nodes, inits, rows: int, k: int):
    from onnx import TensorProto, helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


def fp32_gemm(w: np.ndarray, rows: int):
    from onnx import helper, numpy_helper

    return _model([helper.make_node("MatMul", ["x", "W"], ["y"])], [numpy_helper.from_array(w, "W")], rows, w.shape[0])


def qdq_gemm(w: np.ndarray, x_scale: float, rows: int):
    from onnx import helper, numpy_helper

    ws = (np.abs(w).max(0) / 127).astype(np.float32)
    wq = np.clip(np.round(w / ws), -127, 127).astype(np.int8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
             helper.make_node("DequantizeLinear", ["Wq", "ws", "zw"], ["Wd"], axis=1),
             helper.make_node("MatMul", ["xd", "Wd"], ["y"])]
    inits = [numpy_helper.from_array(np.array(x_scale, np.float32), "sx"), numpy_helper.from_array(np.array(128, np.uint8), "zx"),
             numpy_helper.from_array(wq, "Wq"), numpy_helper.from_array(ws, "ws"),
             numpy_helper.from_array(np.zeros(w.shape[1], np.int8), "zw")]
    return _model(nodes, inits, rows, w.shape[0])


def nbits_gemm(w: np.ndarray, bits: int, block: int, accuracy_level: int, rows: int):
    """MatMulNBits: B is [N, K / block, block * bits / 8] uint8 (zero point 2^(bits-1)), scales [N * K / block]."""
    from onnx import helper, numpy_helper

    k, n = w.shape
    wt = w.T.reshape(n, k // block, block)
    top = 2 ** (bits - 1) - 1
    scales = (np.abs(wt).max(2) / top).astype(np.float32)
    scales[scales == 0] = 1.0
    q = (np.clip(np.round(wt / scales[..., None]), -top - 1, top) + top + 1).astype(np.uint8)
    packed = q if bits == 8 else (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    node = helper.make_node("MatMulNBits", ["x", "B", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block, accuracy_level=accuracy_level)
    return _model([node], [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales.reshape(-1), "s")], rows, k)


def measure(k: int, n: int, rows: int, rounds: int) -> list[tuple[str, float, float]]:
    """(graph, median ms, relative error) per graph, fp32 first."""
    from timing import interleaved_rounds

    from vitedge.onnxkit.session import SessionSettings, ort_session

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    x = rng.standard_normal((1, rows, k)).astype(np.float32)
    graphs = {"fp32": fp32_gemm(w, rows), "qdq (MatMulIntegerToFloat)": qdq_gemm(w, float(np.abs(x).max() / 127), rows)}
    for bits in (8, 4):
        for block in (32, 128):
            for level in (0, 4):
                graphs[f"nbits{bits}_b{block}_acc{level}"] = nbits_gemm(w, bits, block, level, rows)
    # 2 intra-op threads that sleep when idle: the rounds run every graph in turn, and one graph's spinning
    # workers would slow the next one (vitedge.onnxkit.graph.SessionSettings.spinning)
    settings = SessionSettings(threads=2, spinning=False)
    sessions = {}
    for name, model in graphs.items():
        try:
            sessions[name] = ort_session(model, settings)
        except Exception as err:  # a kernel this ONNX Runtime lacks: reported, not fatal
            print(f"<!-- {name}: {str(err).splitlines()[0][:160]} -->")
    times, _ = interleaved_rounds({name: (lambda s=s: s.run(None, {"x": x})) for name, s in sessions.items()}, rounds, timed=10)
    ref = sessions["fp32"].run(None, {"x": x})[0]
    out = []
    for name, s in sessions.items():
        y = s.run(None, {"x": x})[0]
        out.append((name, float(np.median(times[name])), float(np.abs(y - ref).max() / np.abs(ref).max())))
    return out


def main() -> None:
    import onnxruntime as ort

    from timing import machine_line

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=197, help="rows of the activation (197: one 224x224 image, /16 patches)")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    print(f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python benchmarks/gemm_kernels.py --rows {args.rows} "
          f"--rounds {args.rounds}` on {machine_line()}, ONNX Runtime "
          f"{ort.__version__}, 2 intra-op threads, spinning off; load average {os.getloadavg()[0]:.2f} at the start.\n")
    for k, n in SHAPES:
        rows = measure(k, n, args.rows, args.rounds)
        fp32 = rows[0][1]
        print(f"### {args.rows} x {k} x {n} (rows x K x N)\n\n| graph | median ms | / fp32 | relative error |\n|---|---:|---:|---:|")
        for name, ms, err in rows:
            print(f"| {name} | {ms:.3f} | {ms / fp32:.3f} | {err:.4f} |")
        print()
    print(f"load average {os.getloadavg()[0]:.2f} at the end.")


if __name__ == "__main__":
    main()
