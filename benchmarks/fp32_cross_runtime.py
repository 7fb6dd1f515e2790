"""How far apart ONNX Runtime's and OpenVINO's FP32 outputs of the same FP32 ONNX graph are (issue 28 item 4).

The validation cache shares one runtime's FP32 outputs with another whose FP32 graph comes from the same
ONNX bytes, after a spot check within ``reference_cache.CROSS_RUNTIME_TOLERANCE`` of the output scale.
This measures max |diff| / max |output| between the two runtimes, so that tolerance has a margin over it:
on the digits ViT, the post-norm ViT (both on the digits validation images) and a random-weight timm
ViT-S/16 at 224x224 (the same images, resized). Each FP32 graph is exported by vitedge and converted by
the intel-cpu backend exactly as a build does; both run at batch 8, the CPU targets' validation batch.

    python benchmarks/fp32_cross_runtime.py [--items 64]

Prints one line per model; nothing is downloaded (timm's model is built with random weights).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
VAL = REPO / "calibration" / "digits" / "val"
EXAMPLES = REPO / "examples"


def models(tmp: Path):
    import timm
    import torch

    from vitedge.models.intake import IntakeOptions, load_model

    yield "digits ViT", load_model(EXAMPLES / "digits_vit.pt")
    yield "post-norm ViT", load_model(EXAMPLES / "postnorm_vit.pt",
                                      IntakeOptions(model_class=f"{EXAMPLES / 'postnorm_vit.py'}:PostNormViT"))
    torch.manual_seed(0)
    vit_s = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=1000).eval()
    torch.save(vit_s.state_dict(), tmp / "vit_s16.pt")
    yield "timm ViT-S/16 (random weights)", load_model(tmp / "vit_s16.pt", IntakeOptions(arch="vit_small_patch16_224"))


def measure(name: str, loaded, tmp: Path, items: int, batch: int) -> str:
    from vitedge.backends.base import get_backend
    from vitedge.datasources.sources import open_source
    from vitedge.models.export import export_onnx
    from vitedge.validation.inputs import feed_for

    folder = tmp / name.split()[0].replace("-", "")
    folder.mkdir()
    fp32 = folder / "reference.fp32.onnx"
    export_onnx(loaded, fp32)
    ort, ov = get_backend("onnxruntime"), get_backend("openvino")
    ir = ov.shipped_graph(fp32, "reference", ov.options_type(), folder)
    pre = loaded.spec.preprocess
    source = open_source(VAL, pre, limit=items)
    diffs, scale, flips = [], 0.0, 0
    with ort.open_runner(fp32, ort.options_type()) as a, ov.open_runner(ir, ov.options_type()) as b:
        for part in source.batches(batch):
            x, y = (np.asarray(r.infer(feed_for(r, part.images, pre)), dtype=np.float32) for r in (a, b))
            diffs.append(float(np.max(np.abs(x - y))))
            scale = max(scale, float(np.max(np.abs(x))))
            flips += int(np.sum(x.reshape(len(x), -1).argmax(1) != y.reshape(len(y), -1).argmax(1)))
    err = max(diffs)
    return (f"{name}: {len(source)} items, max |ORT - OpenVINO| {err:.3g}, output scale {scale:.3g}, "
            f"relative {err / scale:.2g}, top-1 differs on {flips}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name, loaded in models(Path(tmp)):
            print(measure(name, loaded, Path(tmp), args.items, 8), flush=True)


if __name__ == "__main__":
    main()
