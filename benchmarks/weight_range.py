"""INT8 weight range vs accuracy on the CPU at hand (issue 13).

For each committed trained model (digits ViT, post-norm ViT) and each weight-range rule
(full 8-bit, pairwise, 7-bit), one calibration (entropy + SmoothQuant, the default), one
Q/DQ graph per rule, then INT8-vs-FP32 on the validation images in:

* ONNX Runtime, full optimizations: this CPU's integer kernels (U8S8 MLAS);
* OpenVINO CPU plugin (f32 float regions): this CPU's oneDNN integer kernels;
* "exact": ONNX Runtime with graph optimizations off, so each DequantizeLinear feeds a float
  MatMul: the dequantized weights and activations multiplied without any int16 pair sum,
  which is what a VNNI/AMX CPU's int32 accumulation computes (up to float rounding).

So one run on an AVX2-only machine shows both the saturation (kernels vs exact) and what
each rule costs where nothing saturates. The CPU's ISA is recorded with the figures.

    python benchmarks/weight_range.py            # writes benchmarks/results/weight_range.{json,md}
"""

from __future__ import annotations

import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vitedge.backends.onnxruntime.backend import OnnxRuntimeOptions, OnnxRuntimeRunner  # noqa: E402
from vitedge.backends.openvino import OpenVinoOptions, OpenVinoRunner  # noqa: E402
from vitedge.datasources.sources import open_source  # noqa: E402
from vitedge.core.cpu import read_cpu  # noqa: E402
from vitedge.models.export import ExportOptions, export_onnx  # noqa: E402
from vitedge.models.intake import IntakeOptions, load_model  # noqa: E402
from vitedge.quantize.calibrate import calibrate  # noqa: E402
from vitedge.quantize.config import QuantConfig  # noqa: E402
from vitedge.quantize.qdq import build_qdq  # noqa: E402
from vitedge.quantize.weight_range import WEIGHT_RANGES  # noqa: E402

MODELS = {
    "digits ViT (examples/digits_vit.pt)": (ROOT / "examples/digits_vit.pt", IntakeOptions()),
    "post-norm ViT (examples/postnorm_vit.pt)": (ROOT / "examples/postnorm_vit.pt",
                                                IntakeOptions(model_class=str(ROOT / "examples/postnorm_vit.py") + ":PostNormViT")),
}
CALIB, VAL = ROOT / "calibration/digits/calib", ROOT / "calibration/digits/val"
RUNTIMES = ("onnxruntime", "openvino", "exact")


def _outputs(runtime: str, path: Path, x: np.ndarray) -> np.ndarray:
    if runtime == "openvino":
        runner = OpenVinoRunner(path, OpenVinoOptions(float_precision="f32"), threads=2)
    else:
        opts = OnnxRuntimeOptions(fuse_attention=False, graph_optimization="all" if runtime == "onnxruntime" else "disabled")
        runner = OnnxRuntimeRunner(path, opts, threads=2)
    with runner:
        return np.concatenate([runner.infer(x[i:i + 64]) for i in range(0, len(x), 64)])


def _compare(ref: np.ndarray, out: np.ndarray, labels: np.ndarray | None) -> dict[str, float]:
    cos = np.sum(ref * out, 1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(out, axis=1))
    row = {"agreement": float(np.mean(ref.argmax(1) == out.argmax(1))), "cosine_mean": float(cos.mean()), "cosine_min": float(cos.min())}
    if labels is not None:
        row["top1_drop_points"] = float(100 * (np.mean(ref.argmax(1) == labels) - np.mean(out.argmax(1) == labels)))
    return row


def run() -> dict:
    cpu = read_cpu()
    doc = {"cpu": cpu.to_dict(), "platform": platform.platform(), "python": platform.python_version(), "models": {}}
    for title, (model, intake) in MODELS.items():
        calib_dir, val_dir = CALIB, VAL
        work = Path(tempfile.mkdtemp(prefix="vitedge-bench-wr-"))
        loaded = load_model(model, intake)
        fp32 = work / "fp32.onnx"
        export_onnx(loaded, fp32, ExportOptions())
        pre = loaded.spec.preprocess
        calib = open_source(calib_dir, pre, class_names=loaded.spec.class_names)
        val = open_source(val_dir, pre, class_names=loaded.spec.class_names)
        batches = list(val.batches(64))
        x = np.concatenate([b.images for b in batches]).astype(np.float32)
        labels = np.concatenate([b.labels for b in batches]) if all(b.labels is not None for b in batches) else None
        refs = {rt: _outputs(rt, fp32, x) for rt in RUNTIMES}
        rows = {}
        for rule in WEIGHT_RANGES:
            t0 = time.perf_counter()
            cal = calibrate(fp32, calib, QuantConfig(weight_range=rule))
            q = work / f"{rule}.onnx"
            build_qdq(cal).save(q)
            rows[rule] = {rt: _compare(refs[rt], _outputs(rt, q, x), labels) for rt in RUNTIMES}
            print(f"{title} {rule:8s} " + "  ".join(f"{rt}: agree {100 * r['agreement']:.2f}% cos {r['cosine_mean']:.5f}"
                                                     for rt, r in rows[rule].items()) + f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
        doc["models"][title] = {"images": int(len(x)), "rules": rows}
    return doc


def markdown(doc: dict) -> str:
    cpu = doc["cpu"]
    lines = ["# INT8 weight range vs accuracy", "",
             f"CPU: {cpu['model']} ({cpu['isa']}; INT8 dot product: {cpu['int8_dot_product']}), {doc['platform']}. "
             "Produced by `python benchmarks/weight_range.py`; one run, every figure from the same run.", "",
             "`onnxruntime` and `openvino` run this CPU's integer kernels; `exact` runs the dequantized graph in float "
             "(ONNX Runtime, optimizations off): what a CPU with VNNI/AMX computes, where no int16 pair sum saturates. "
             "Agreement = top-1 of INT8 equal to top-1 of FP32 on the same runtime; cosine = mean per-image logit cosine.", ""]
    for title, m in doc["models"].items():
        lines += [f"## {title}, {m['images']} validation images", "",
                  "| weight range | " + " | ".join(f"{rt} agree / cos / drop" for rt in RUNTIMES) + " |",
                  "|---|" + "---|" * len(RUNTIMES)]
        for rule, by_rt in m["rules"].items():
            cells = []
            for rt in RUNTIMES:
                r = by_rt[rt]
                drop = f" / {r['top1_drop_points']:+.2f} pt" if "top1_drop_points" in r else ""
                cells.append(f"{100 * r['agreement']:.2f}% / {r['cosine_mean']:.5f}{drop}")
            lines.append(f"| {rule} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    result = run()
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    stem = "weight_range_" + ("vnni" if result["cpu"]["int8_dot_product"] else "no_vnni")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"{stem}.md").write_text(markdown(result) + "\n")
    print(f"wrote {out / stem}.md")
