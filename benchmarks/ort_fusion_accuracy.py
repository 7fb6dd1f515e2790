"""Accuracy effect of the ONNX Runtime-only float fusions (issue 28 item 2) on built onnx bundles.

    python benchmarks/ort_fusion_accuracy.py [--gemm-bias | --patch-embed] BUNDLE/onnx [BUNDLE/onnx ...]

``--gemm-bias`` measures the shipped GEMM-bias fold instead (vitedge/backends/onnxruntime/gemm_bias.py, issue 28 item 1),
on bundles built before it (their model.int8.onnx unfolded) or unfolded first (``unfold_gemm_bias``).
``--patch-embed`` does the same for the patch-embedding Conv run as an INT8 GEMM
(vitedge/backends/onnxruntime/patch_embed.py): the bundle's artifact with it unfolded (the float Conv) against it folded.

For each bundle: its validation data (the manifest's path, the bundle's preprocessing) runs through the FP32
reference, the bundle's INT8 artifact as built, and that artifact passed through
``benchmarks/ort_float_fusions.py`` (the experimental rewrites, not shipped), all on ONNX Runtime's CPU provider
with all optimisations. Prints top-1 (against the labels), top-1 agreement with FP32, and the largest logit change
the fusion makes, as Markdown.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ort_float_fusions import fuse_float_ops  # noqa: E402
from vitedge.core.cpu import read_cpu  # noqa: E402
from vitedge.datasources.sources import open_source  # noqa: E402
from vitedge.bundle.spec import Preprocess  # noqa: E402


def run(model: bytes | str, x: np.ndarray, batch: int = 32) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + batch]})[0] for i in range(0, len(x), batch)])


def measure(bundle: Path, shipped: str = "") -> dict:
    """``shipped``: "" (the experimental float fusions), "gemm-bias" or "patch-embed" (a shipped rewrite)."""
    import onnx

    from vitedge.backends.onnxruntime.gemm_bias import fuse_gemm_bias, unfold_gemm_bias
    from vitedge.backends.onnxruntime.patch_embed import fuse_patch_embedding, unfold_patch_embedding

    manifest = json.loads((bundle / "manifest.json").read_text())
    data = manifest["validation_data"]["path"]
    source = open_source(data, Preprocess.from_dict(manifest["input"]["preprocess"]))
    x = np.stack([a for b in source.batches(64) for a in b.images]).astype(np.float32)
    labels = np.asarray(source.labels) if source.labels is not None else None
    graph = onnx.load(str(bundle / "model.int8.onnx"))
    if shipped == "gemm-bias":
        unfold_gemm_bias(graph)  # a bundle built with the fold: back to the form before it
        plain = graph.SerializeToString()
        report = fuse_gemm_bias(graph)
    elif shipped == "patch-embed":
        unfold_patch_embedding(graph)
        plain = graph.SerializeToString()
        report = fuse_patch_embedding(graph)
    else:
        plain = str(bundle / "model.int8.onnx")
        report = fuse_float_ops(graph)
    fp32 = run(str(bundle / "reference.fp32.onnx"), x)
    before = run(plain, x)
    after = run(graph.SerializeToString(), x)
    row = {"bundle": str(bundle), "items": len(x), "fusion": report.one_line(),
           "max_logit_change": float(np.max(np.abs(after - before))),
           "logit_scale": float(np.max(np.abs(before)))}
    for name, out in (("fp32", fp32), ("before", before), ("after", after)):
        if labels is not None:
            row[f"{name}_top1"] = float(np.mean(out.argmax(-1) == labels))
        row[f"{name}_agreement"] = float(np.mean(out.argmax(-1) == fp32.argmax(-1)))
    return row


def main() -> None:
    flags = {"--gemm-bias": "gemm-bias", "--patch-embed": "patch-embed"}
    shipped = next((flags[a] for a in sys.argv[1:] if a in flags), "")
    rows = [measure(Path(p), shipped) for p in sys.argv[1:] if p not in flags]
    cpu = read_cpu()
    print(f"CPU: {cpu.model} ({cpu.isa})\n")
    print("| bundle | items | FP32 top-1 | INT8 top-1 before | after | agreement with FP32 before | after | "
          "largest logit change (largest logit) | fusion |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        top = (f"{r.get('fp32_top1', float('nan')):.3f} | {r.get('before_top1', float('nan')):.3f} | "
               f"{r.get('after_top1', float('nan')):.3f}")
        print(f"| {Path(r['bundle']).parent.name} | {r['items']} | {top} | {r['before_agreement']:.3f} | "
              f"{r['after_agreement']:.3f} | {r['max_logit_change']:.4f} ({r['logit_scale']:.2f}) | {r['fusion']} |")
    print("\n```json\n" + json.dumps(rows, indent=1) + "\n```")


if __name__ == "__main__":
    main()
