"""The patch embedding alone: ONNX Runtime's float Conv over dequantized inputs vs the INT8 GEMM the onnx target
ships (vitedge/backends/onnxruntime/patch_embed.py, issue 28 item 1), paired and interleaved.

    python benchmarks/patch_embed_speed.py BUNDLE/onnx [--rounds 30] [--runs 10]

From the bundle's ``model.int8.onnx``: the graph with the rewrite unfolded (the Q/DQ Conv) and folded, each cut
down to the path from the image to the patch embedding's output (``onnx.utils.Extractor``), run at batch 1 on 1
and 2 threads. The saving is ~1 % of a ViT-B/16's INT8 time, under the run-to-run spread of whole-graph
measurements on a shared machine (``ort_profile.py --cpu-time``), so it is measured here, where it can be seen.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vitedge.core.cpu import read_cpu  # noqa: E402


def patch_paths(bundle: Path) -> tuple[dict[str, bytes], str]:
    """{"float Conv": graph, "INT8 GEMM": graph}, each from the image to the patch embedding's output; the
    input name."""
    import onnx
    from onnx.utils import Extractor

    from vitedge.backends.onnxruntime.patch_embed import AS_GEMM_SUFFIX, fuse_patch_embedding, unfold_patch_embedding

    conv = onnx.load(str(bundle / "model.int8.onnx"))
    unfold_patch_embedding(conv)
    gemm = onnx.ModelProto()
    gemm.CopyFrom(conv)
    report = fuse_patch_embedding(gemm)
    if not report.folded:
        raise SystemExit(f"{bundle}: no patch embedding to compare ({report.one_line()})")
    base = next(n.name for n in gemm.graph.node if n.name.endswith(AS_GEMM_SUFFIX))
    output = next(n.output[0] for n in conv.graph.node if n.op_type == "Conv" and n.name == base[: -len(AS_GEMM_SUFFIX)])
    name = conv.graph.input[0].name
    return {k: Extractor(m).extract_model([name], [output]).SerializeToString() for k, m in (("float Conv", conv), ("INT8 GEMM", gemm))}, name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", type=Path, help="an onnx bundle (its model.int8.onnx)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--runs", type=int, default=10, help="runs per graph and round (their mean is the round's time)")
    args = ap.parse_args()
    import onnxruntime as ort

    graphs, name = patch_paths(args.bundle)
    sess0 = ort.InferenceSession(graphs["float Conv"], providers=["CPUExecutionProvider"])
    dims = [d if isinstance(d, int) else 1 for d in sess0.get_inputs()[0].shape]
    x = np.random.default_rng(0).random(dims, dtype=np.float32)
    cpu = read_cpu()
    print(f"CPU: {cpu.model} ({cpu.isa}); ONNX Runtime {ort.__version__}; batch 1; {args.rounds} interleaved rounds of {args.runs} runs\n")
    print("| threads | float Conv path ms (median) | INT8 GEMM path ms (median) | paired ratio (median) | rounds the GEMM was faster |")
    print("|---:|---:|---:|---:|---:|")
    for threads in (1, 2):
        sessions = {}
        for k, g in graphs.items():
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            sessions[k] = ort.InferenceSession(g, so, providers=["CPUExecutionProvider"])
            sessions[k].run(None, {name: x})
        times = {k: [] for k in sessions}
        for _ in range(args.rounds):
            for k, s in sessions.items():
                t = time.perf_counter()
                for _ in range(args.runs):
                    s.run(None, {name: x})
                times[k].append((time.perf_counter() - t) / args.runs * 1000)
        a, b = np.array(times["float Conv"]), np.array(times["INT8 GEMM"])
        print(f"| {threads} | {np.median(a):.3f} | {np.median(b):.3f} | {np.median(b / a):.3f} | {int((b < a).sum())} of {args.rounds} |")


if __name__ == "__main__":
    main()
