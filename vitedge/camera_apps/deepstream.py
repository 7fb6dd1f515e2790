"""A DeepStream nvinfer config for a bundle.

nvinfer feeds the network y = net-scale-factor * (x - offsets[c]) on the frame x (0-255,
converted to model-color-format and scaled to infer-dims). vitedge's preprocessing is
(x / 255 - mean[c]) / std[c]. One std for every channel maps exactly:
net-scale-factor = 1 / (255 std), offsets = 255 mean. Per-channel std cannot be written with
nvinfer's single scale factor, so then the normalisation is baked into a copy of the graph
(input: float NCHW RGB in 0-255) and nvinfer passes the pixels through unchanged.
"""

from __future__ import annotations

import configparser
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitedge.errors import BundleError
from vitedge.onnxutil import graph_inputs, save_onnx

CONFIG_FILE = "config_infer.txt"
LABELS_FILE = "labels.txt"
BAKED_GRAPH = "model.deepstream.onnx"
_STD_TOL = 1e-6
# Pillow filter -> nvinfer scaling-filter (NvBufSurfTransform_Inter: 0 nearest, 1 bilinear, 2 GPU cubic / VIC 5-tap)
_SCALING_FILTER = {"nearest": 0, "bilinear": 1, "bicubic": 2, "lanczos": 2}


@dataclass(frozen=True)
class NvinferArithmetic:
    """What nvinfer computes per pixel, and what the graph it feeds adds to that."""

    net_scale_factor: float
    offsets: tuple[float, float, float]
    baked: bool  # the graph normalises its 0-255 input itself
    graph_scale: tuple[float, float, float] = (1.0, 1.0, 1.0)  # baked: per-channel multiply, then add graph_shift
    graph_shift: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def apply(self, rgb_uint8_hwc: np.ndarray) -> np.ndarray:
        """float32 3xHxW network input for an RGB frame at infer-dims, as nvinfer and the graph compute it."""
        x = rgb_uint8_hwc.astype(np.float32).transpose(2, 0, 1)
        y = np.float32(self.net_scale_factor) * (x - np.asarray(self.offsets, np.float32).reshape(3, 1, 1))
        if self.baked:
            y = y * np.asarray(self.graph_scale, np.float32).reshape(3, 1, 1) + np.asarray(self.graph_shift, np.float32).reshape(3, 1, 1)
        return y


def arithmetic_for(mean, std) -> NvinferArithmetic:
    mean64, std64 = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    if np.ptp(std64) <= _STD_TOL * float(std64.max()):
        return NvinferArithmetic(float(1.0 / (255.0 * std64[0])), tuple(float(v) for v in 255.0 * mean64), baked=False)
    return NvinferArithmetic(1.0, (0.0, 0.0, 0.0), baked=True,
                             graph_scale=tuple(float(v) for v in 1.0 / (255.0 * std64)),
                             graph_shift=tuple(float(v) for v in -mean64 / std64))


def bake_for_nvinfer(src: Path, dst: Path, arith: NvinferArithmetic) -> None:
    """Copy of ``src`` whose float NCHW input takes 0-255 pixels and normalises them per channel."""
    import onnx
    from onnx import helper, numpy_helper


    model = onnx.load(str(src))
    graph = model.graph
    image = graph_inputs(graph)[0]
    raw = image.name
    inner = "vitedge_nvinfer/normalised"
    for node in graph.node:
        node.input[:] = [inner if n == raw else n for n in node.input]
    scale = np.asarray(arith.graph_scale, np.float32).reshape(1, 3, 1, 1)
    shift = np.asarray(arith.graph_shift, np.float32).reshape(1, 3, 1, 1)
    graph.initializer.extend([numpy_helper.from_array(scale, "vitedge_nvinfer/scale"),
                              numpy_helper.from_array(shift, "vitedge_nvinfer/shift")])
    pre = [helper.make_node("Mul", [raw, "vitedge_nvinfer/scale"], ["vitedge_nvinfer/scaled"], name="vitedge_nvinfer/Mul"),
           helper.make_node("Add", ["vitedge_nvinfer/scaled", "vitedge_nvinfer/shift"], [inner], name="vitedge_nvinfer/Add")]
    nodes = pre + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    save_onnx(model, dst)


def _fmt(v: float) -> str:
    return f"{v:.9g}"


def write_deepstream(bundle: Path, manifest: Any, out: Path, *, rel: str) -> list[str]:
    """Write config_infer.txt, labels.txt (classifiers) and, where needed, the baked graph into
    ``out``; ``rel`` is the path from ``out`` back to the bundle. Returns the files written."""
    inp, outp = manifest.input, manifest.output
    pre = inp.get("preprocess") or {}
    if inp.get("preprocess_baked"):
        raise BundleError("this bundle's graph takes uint8 NHWC frames (--bake-preprocess); nvinfer feeds float NCHW: "
                          "rebuild without --bake-preprocess for DeepStream")
    h, w = (inp.get("shape") or [None, 3, 0, 0])[2:4]
    profile = manifest.target.get("profile") or {}
    options = profile.get("backend_options") or {}
    batch = int(options.get("opt_batch") or max(profile.get("batch_sizes") or [1])) if "members" not in options else 1
    arith = arithmetic_for(pre["mean"], pre["std"])
    arts = manifest.artifacts
    embedding = outp.get("kind") == "embedding"
    files: list[str] = []
    lines = [
        f"# DeepStream nvinfer config written by vitedge for {manifest.target.get('name')} ({manifest.model.get('source')}).",
        "# Not run on a device by vitedge: check it with deepstream-app or gst-launch-1.0 (docs/camera-apps.md).",
        f"# Preprocessing the model was trained and validated with: RGB, mean {pre['mean']}, std {pre['std']},",
        f"# {pre.get('interpolation')} resize, centre crop {pre.get('crop_pct')}. nvinfer scales the whole frame (or object) to",
        "# infer-dims without a centre crop: with crop_pct < 1, crop upstream (nvvideoconvert src-crop) to match.",
    ]
    if arith.baked:
        bake_for_nvinfer(bundle / arts["qdq"], out / BAKED_GRAPH, arith)
        files.append(BAKED_GRAPH)
        onnx_file, engine = BAKED_GRAPH, None
        lines += [
            "# Per-channel std cannot be expressed by nvinfer's single net-scale-factor, so the normalisation",
            f"# ((x/255 - mean)/std per channel) is baked into {BAKED_GRAPH}: it takes 0-255 RGB pixels, and",
            "# net-scale-factor = 1 with zero offsets passes them through. nvinfer builds its engine from that graph on",
            f"# first run (the bundle's {arts.get('model')} expects normalised input, so it is not used here).",
        ]
    else:
        onnx_file, engine = f"{rel}/{arts['qdq']}", f"{rel}/{arts['model']}" if manifest.target.get("backend") == "tensorrt" else None
        lines += [f"# net-scale-factor = 1/(255*std), offsets = 255*mean: exactly (x/255 - mean)/std, as vitedge computes it."]
    lines += ["", "[property]", "gpu-id=0", f"onnx-file={onnx_file}"]
    if engine:
        lines += [f"# built by `vitedge engine BUNDLE` on the device; nvinfer builds one from onnx-file when it is absent",
                  f"model-engine-file={engine}"]
    lines += [
        f"infer-dims=3;{h};{w}",
        "model-color-format=0",
        f"net-scale-factor={_fmt(arith.net_scale_factor)}",
        "offsets=" + ";".join(_fmt(v) for v in arith.offsets),
        "# INT8 from the graph's Q/DQ nodes (explicit quantization): no calibration file",
        "network-mode=1",
        f"batch-size={batch}",
        "process-mode=1",
        "maintain-aspect-ratio=0",
        f"scaling-filter={_SCALING_FILTER.get(pre.get('interpolation', 'bilinear'), 1)}",
    ]
    if embedding:
        lines += ["# an embedding model: the raw output tensor is attached as NvDsInferTensorMeta for your app",
                  "network-type=100", "output-tensor-meta=1"]
    else:
        labels = outp.get("class_names") or [str(i) for i in range(_num_outputs(bundle / arts["qdq"]))]
        (out / LABELS_FILE).write_text(";".join(labels) + "\n")
        files.append(LABELS_FILE)
        lines += ["# a classifier; its output is logits (vitedge applies softmax for probabilities)",
                  "network-type=1", f"output-blob-names={outp.get('name', 'logits')}", f"labelfile-path={LABELS_FILE}",
                  "classifier-async-mode=0"]
    (out / CONFIG_FILE).write_text("\n".join(lines) + "\n")
    return [CONFIG_FILE] + files


def _num_outputs(onnx_path: Path) -> int:
    import onnx

    dims = onnx.load(str(onnx_path), load_external_data=False).graph.output[0].type.tensor_type.shape.dim
    return int(dims[-1].dim_value)


def read_config(path: Path) -> dict[str, str]:
    """The [property] keys of an nvinfer config (what a test or a user's script checks)."""

    cp = configparser.ConfigParser(interpolation=None, comment_prefixes=("#",))
    cp.read_string(path.read_text())
    return dict(cp["property"])
