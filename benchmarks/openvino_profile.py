"""Where OpenVINO spends an intel-cpu bundle's time: FP32 reference IR vs INT8 IR, per layer type (issue 28 item 1).

    python benchmarks/openvino_profile.py --bundle OUT/intel-cpu [--batch 1] [--runs 20] [--rounds 3]

The OpenVINO twin of ``benchmarks/ort_profile.py``. Both IRs are compiled for the CPU with ``PERF_COUNT: YES``
(the INT8 IR's float regions in the precision the bundle's manifest records, f32 when it records none; FP32 in
f32), ``PERFORMANCE_HINT: LATENCY`` and ``--threads``; warmed up, then ``--runs`` inferences each, in
``--rounds`` interleaved rounds (FP32, INT8, FP32, ...). ``infer_request.get_profiling_info()``'s per-node
``real_time`` is summed by (node type, whether its kernel runs INT8). An *INT8 GEMM* is a FullyConnected (also
FullyConnectedQuantizedLegacy), MatMul or Convolution node whose ``exec_type`` names an 8-bit kernel (``..._I8``/``..._U8``); everything else is "outside
the INT8 GEMMs". Shares are of the same round's FP32 counter sum; min / median over rounds. Prints Markdown.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vitedge.core.cpu import read_cpu  # noqa: E402

GEMM_TYPES = ("FullyConnected", "MatMul", "Convolution", "GroupConvolution")


def is_int8_gemm(node_type: str, exec_type: str) -> bool:
    kernel = exec_type.lower()
    # FullyConnectedQuantizedLegacy (jit_gemm_i8) is how OpenVINO 2026 runs an INT8 FC on AVX2
    return node_type.startswith(GEMM_TYPES) and ("i8" in kernel or "u8" in kernel)


def compile_ir(core, path: Path, batch: int, threads: int, precision: str):
    model = core.read_model(str(path))
    dims = [d.get_length() if d.is_static else 1 for d in model.inputs[0].get_partial_shape()]
    dims[0] = batch
    model.reshape({model.inputs[0]: dims})
    config = {"PERF_COUNT": "YES", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": precision,
              "INFERENCE_NUM_THREADS": threads}
    return core.compile_model(model, "CPU", config).create_infer_request(), dims


def measure(req, x: np.ndarray, runs: int) -> tuple[float, dict[str, tuple[float, int]]]:
    """(wall median ms, 'node type [INT8]' -> (counter ms per run, nodes))."""
    for _ in range(3):
        req.infer({0: x})
    wall, sums, nodes = [], collections.Counter(), collections.defaultdict(set)
    for _ in range(runs):
        t0 = time.perf_counter()
        req.infer({0: x})
        wall.append((time.perf_counter() - t0) * 1000)
        for info in req.profiling_info:  # real_time 0: nodes fused into a neighbour or not executed
            ms = info.real_time.total_seconds() * 1e3
            if ms <= 0:
                continue
            key = info.node_type + (" [INT8]" if is_int8_gemm(info.node_type, info.exec_type) else "")
            sums[key] += ms / runs
            nodes[key].add(info.node_name)
    return float(np.median(wall)), {k: (v, len(nodes[k])) for k, v in sums.items()}


def split(table: dict[str, tuple[float, int]], fp32_total: float) -> tuple[float, float]:
    gemm = sum(ms for k, (ms, _) in table.items() if k.endswith("[INT8]"))
    return gemm / fp32_total, (sum(ms for ms, _ in table.values()) - gemm) / fp32_total


def stat(values: list[float]) -> str:
    return f"{min(values):.3f} / {float(np.median(values)):.3f}"


def print_tables(tables: dict[str, dict[str, tuple[float, int]]]) -> None:
    fp32_sum = sum(v[0] for v in tables["FP32 reference"].values())
    for label, table in tables.items():
        tot = sum(v[0] for v in table.values())
        print(f"{label}: counter sum {tot:.1f} ms per run\n")
        print("| node type (runtime model) | nodes | ms per run | share | share of FP32 counter sum |")
        print("|---|---:|---:|---:|---:|")
        for key, (ms, n) in sorted(table.items(), key=lambda kv: -kv[1][0])[:14]:
            print(f"| {key} | {n} | {ms:.2f} | {100 * ms / tot:.1f}% | {ms / fp32_sum:.3f} |")
        print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, required=True, help="an intel-cpu bundle (reference.fp32.xml, model.xml)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    import openvino as ov

    manifest = json.loads((args.bundle / "manifest.json").read_text())
    recorded = manifest.get("backend_info", {}).get("float_precision") or "f32"
    precision = str(recorded.get("used", "f32") if isinstance(recorded, dict) else recorded)
    core = ov.Core()
    graphs = {"FP32 reference": compile_ir(core, args.bundle / "reference.fp32.xml", args.batch, args.threads, "f32"),
              "INT8 IR": compile_ir(core, args.bundle / "model.xml", args.batch, args.threads, precision)}
    x = np.random.default_rng(0).standard_normal(graphs["FP32 reference"][1]).astype(np.float32)
    rounds = [{label: measure(req, x, args.runs) for label, (req, _) in graphs.items()} for _ in range(args.rounds)]
    cpu = read_cpu()
    print(f"CPU: {cpu.model} ({cpu.isa}); OpenVINO {ov.get_version()}; {args.threads} threads; batch {args.batch}; "
          f"INT8 float regions {precision}; bundle {args.bundle}; {args.rounds} interleaved rounds of {args.runs} runs; "
          f"load average {os.getloadavg()[0]:.1f}\n")
    print("| graph | wall ms (median) | INT8/FP32 wall | INT8 GEMMs / FP32 | outside the INT8 GEMMs / FP32 |")
    print("|---|---:|---:|---:|---:|")
    for label in graphs:
        ratio = [r[label][0] / r["FP32 reference"][0] for r in rounds]
        shares = [split(r[label][1], sum(v[0] for v in r["FP32 reference"][1].values())) for r in rounds]
        print(f"| {label} | {float(np.median([r[label][0] for r in rounds])):.1f} | {stat(ratio)} | "
              f"{stat([s[0] for s in shares])} | {stat([s[1] for s in shares])} |")
    print("\nPer node type, last round:\n")
    print_tables({label: rounds[-1][label][1] for label in graphs})


if __name__ == "__main__":
    main()
