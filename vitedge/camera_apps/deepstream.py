"""A DeepStream nvinfer config for a bundle, and the graph and engine it runs.

What nvinfer does, read from its sources (DeepStream's `gstnvinfer_property_parser.cpp`,
`nvdsinfer_context_impl.cpp`, `nvdsinfer_model_builder.cpp`,
`nvdsinfer_context_impl_output_parsing.cpp`; docs/camera-apps.md cites them):

* It scales the frame (or object) to infer-dims with NvBufSurfTransform (``scaling-filter``
  is a ``NvBufSurfTransform_Inter`` value), converts it to ``model-color-format`` (0 RGB,
  1 BGR, 2 GRAY) and feeds y = net-scale-factor * (x - offsets[c]) on 0-255 pixels.
  vitedge computes (x / 255 - mean[c]) / std[c]: one std for every channel maps exactly
  (net-scale-factor = 1 / (255 std), offsets = 255 mean). Per-channel std cannot be written
  with one scale factor, so the normalisation is then done by the graph (a Mul/Add per
  channel in front) and nvinfer passes the pixels through.
* Its default classifier parser treats each output layer as probabilities: it keeps the
  largest value above ``classifier-threshold`` (and above 0) and reports that raw value as the
  confidence. A vitedge classifier outputs logits, so the DeepStream graph ends in a Softmax
  (the probabilities vitedge's runtime reports) and the config sets classifier-threshold=0.
* It has no centre crop: ``maintain-aspect-ratio=1`` letterboxes the whole frame. vitedge's
  resize-and-centre-crop is the frame region ``source_crop`` returns, scaled to the model's
  size: crop it upstream (``nvvideoconvert src-crop``), and the config says the region for
  common frame sizes.
* With ``network-mode=1`` it sets TensorRT's INT8 flag only when ``int8-calib-file`` names a
  readable file; otherwise it logs "INT8 calibration file not specified. Trying FP16 mode." and
  builds FP16. TensorRT does not use a calibrator for a graph with Q/DQ nodes (explicit
  quantization), so an empty file is what makes nvinfer's own build INT8.
* It loads only ``model-engine-file``, and saves its own build under a name of its own
  (vitedge.camera_apps.nvinfer_rules). The config points at the engine `vitedge engine` built, or,
  before that, at the name nvinfer saves its own build under, so it builds once, not at every start.
"""

from __future__ import annotations

import configparser
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitedge.camera_apps.labels import nvinfer_labels, nvinfer_rewritten
from vitedge.camera_apps.nvinfer_rules import nvinfer_engine_name
from vitedge.camera_apps.serving import ServedBy, dla_core_of, tensorrt_engine
from vitedge.core.errors import BundleError
from vitedge.bundle.manifest import Manifest
from vitedge.onnxkit.files import save_onnx
from vitedge.onnxkit.structure import graph_inputs

CONFIG_FILE = "config_infer.txt"
LABELS_FILE = "labels.txt"
BAKED_GRAPH = "model.deepstream.onnx"  # the graph nvinfer runs when it differs from the bundle's
ENGINE_FILE = "model.deepstream.engine"  # its engine, in the bundle's root (built by `vitedge engine`)
CALIB_FILE = "explicit-int8.calib"  # empty: only makes nvinfer set the INT8 flag when it builds the engine
PROBS_OUTPUT = "probabilities"
_STD_TOL = 1e-6
# Pillow filter -> NvBufSurfTransform_Inter (nvbufsurftransform.h): 0 Nearest, 1 Bilinear, 2 Algo1 (GPU cubic,
# VIC 5-tap), 3 Algo2 (GPU super, VIC 10-tap), 4 Algo3 (GPU Lanczos, VIC smart), 5 Algo4, 6 Default.
# scaling-compute-hw=1 (GPU) is written with it, so the GPU meaning holds on a Jetson too (VIC is its default there).
SCALING_FILTER = {"nearest": 0, "bilinear": 1, "bicubic": 2, "lanczos": 4}
SCALING_COMPUTE_GPU = 1
# model-color-format per channel count (NvDsInferFormat: 0 RGB, 1 BGR, 2 GRAY)
COLOR_FORMAT = {3: 0, 1: 2}
# Frame sizes the config lists the source crop for (width, height)
COMMON_FRAMES = ((3840, 2160), (1920, 1080), (1280, 720), (640, 480))


@dataclass(frozen=True)
class NvinferArithmetic:
    """What nvinfer computes per pixel, and what the graph it feeds adds to that."""

    net_scale_factor: float
    offsets: tuple[float, ...]  # one per channel
    baked: bool  # the graph normalises its 0-255 input itself
    graph_scale: tuple[float, ...] = ()  # baked: per-channel multiply, then add graph_shift
    graph_shift: tuple[float, ...] = ()


def arithmetic_for(mean, std) -> NvinferArithmetic:
    mean64, std64 = np.asarray(mean, np.float64), np.asarray(std, np.float64)
    if np.ptp(std64) <= _STD_TOL * float(std64.max()):
        return NvinferArithmetic(float(1.0 / (255.0 * std64[0])), tuple(float(v) for v in 255.0 * mean64), baked=False)
    return NvinferArithmetic(1.0, tuple(0.0 for _ in mean64), baked=True,
                             graph_scale=tuple(float(v) for v in 1.0 / (255.0 * std64)),
                             graph_shift=tuple(float(v) for v in -mean64 / std64))


def source_crop(frame_w: int, frame_h: int, crop_size, crop_pct: float) -> tuple[int, int, int, int]:
    """(left, top, width, height) of the frame region vitedge's preprocessing turns into the model
    input (vitedge.bundle.preprocess.resize_and_crop: resize to cover crop/crop_pct keeping the aspect
    ratio, then centre-crop), rounded to whole pixels as nvvideoconvert's src-crop takes them."""
    crop_h, crop_w = (int(v) for v in crop_size)
    target_h, target_w = int(round(crop_h / crop_pct)), int(round(crop_w / crop_pct))
    scale = max(target_h / frame_h, target_w / frame_w)
    new_w, new_h = max(crop_w, int(round(frame_w * scale))), max(crop_h, int(round(frame_h * scale)))
    sx, sy = new_w / frame_w, new_h / frame_h
    left, top = (new_w - crop_w) // 2, (new_h - crop_h) // 2
    x0, y0 = int(round(left / sx)), int(round(top / sy))
    return x0, y0, min(frame_w - x0, int(round(crop_w / sx))), min(frame_h - y0, int(round(crop_h / sy)))


@dataclass(frozen=True)
class DeepStreamGraph:
    """What the graph nvinfer runs adds to the bundle's: normalisation in front, a Softmax behind."""

    arith: NvinferArithmetic
    softmax: bool

    @property
    def own_graph(self) -> bool:
        return self.arith.baked or self.softmax


def deepstream_graph(manifest: Manifest) -> DeepStreamGraph:
    """The DeepStream graph of a bundle, from its manifest (raises BundleError where nvinfer cannot feed it)."""
    inp, outp = manifest.input, manifest.output
    if inp.preprocess_baked:
        raise BundleError("this bundle's graph takes uint8 NHWC frames (--bake-preprocess); nvinfer feeds float NCHW: "
                          "rebuild without --bake-preprocess for DeepStream")
    pre = inp.preprocess or {}
    channels = len(pre.get("mean") or ())
    if channels not in COLOR_FORMAT:
        raise BundleError(f"this model takes {channels}-channel input; nvinfer feeds RGB/BGR (3) or GRAY (1) frames: "
                          "feed it through nvdspreprocess with your own tensor preparation instead")
    return DeepStreamGraph(arithmetic_for(pre["mean"], pre["std"]), softmax=outp.kind != "embedding")


def nvinfer_can_feed(manifest: Manifest) -> bool:
    try:
        deepstream_graph(manifest)
    except BundleError:
        return False
    return True


def write_deepstream_graph(src: Path, dst: Path, graph: DeepStreamGraph) -> None:
    """Copy of ``src`` that normalises 0-255 pixels per channel (when baked) and ends in a Softmax
    named ``probabilities`` (classifiers)."""
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    g = model.graph
    if graph.arith.baked:
        raw = graph_inputs(g)[0].name
        inner = "vitedge_nvinfer/normalised"
        for node in g.node:
            node.input[:] = [inner if n == raw else n for n in node.input]
        c = len(graph.arith.graph_scale)
        g.initializer.extend([numpy_helper.from_array(np.asarray(graph.arith.graph_scale, np.float32).reshape(1, c, 1, 1), "vitedge_nvinfer/scale"),
                              numpy_helper.from_array(np.asarray(graph.arith.graph_shift, np.float32).reshape(1, c, 1, 1), "vitedge_nvinfer/shift")])
        pre = [helper.make_node("Mul", [raw, "vitedge_nvinfer/scale"], ["vitedge_nvinfer/scaled"], name="vitedge_nvinfer/Mul"),
               helper.make_node("Add", ["vitedge_nvinfer/scaled", "vitedge_nvinfer/shift"], [inner], name="vitedge_nvinfer/Add")]
        nodes = pre + list(g.node)
        del g.node[:]
        g.node.extend(nodes)
    if graph.softmax:
        out = g.output[0]
        g.node.append(helper.make_node("Softmax", [out.name], [PROBS_OUTPUT], name="vitedge_nvinfer/Softmax", axis=-1))
        probs = onnx.ValueInfoProto()
        probs.CopyFrom(out)
        probs.name = PROBS_OUTPUT
        del g.output[:]
        g.output.append(probs)
    onnx.checker.check_model(model)
    save_onnx(model, dst)


def _fmt(v: float) -> str:
    return f"{v:.9g}"


@dataclass(frozen=True)
class NvinferEngine:
    """Where nvinfer's engine comes from: the graph it builds from, its batch and device."""

    onnx_file: str  # as the config writes it (relative to the config's folder)
    batch: int
    dla_core: int | None  # the DLA core the engine runs on, None for the GPU

    @property
    def own_build(self) -> str:
        """The name nvinfer saves its own build under (vitedge.camera_apps.nvinfer_rules)."""
        return nvinfer_engine_name(self.onnx_file, self.batch, dla_core=self.dla_core)


def _engine_lines(manifest: Manifest, graph: DeepStreamGraph, rel: str, tensorrt: bool, target: NvinferEngine) -> list[str]:
    """model-engine-file (with its precision and TensorRT version) where an engine exists, else the name
    nvinfer saves its own build under, and int8-calib-file, with what nvinfer does at each start.
    ``tensorrt``: the bundle's artifact is a TensorRT engine."""
    info = manifest.backend_info or {}
    engine, version, precision = _loadable_engine(manifest, graph, tensorrt)
    nvinfer_builds = [
        f"# network-mode=1 makes nvinfer set TensorRT's INT8 flag only when int8-calib-file exists ({CALIB_FILE}, empty:",
        "# a Q/DQ graph carries its own INT8 scales and TensorRT uses no calibrator for it); without the file it logs",
        "# \"INT8 calibration file not specified. Trying FP16 mode.\" and builds FP16. Its INT8 build runs the layers",
        "# outside Q/DQ in FP32 (nvinfer sets FP16 only in FP16 mode).",
        f"int8-calib-file={CALIB_FILE}"]
    own = target.own_build
    if engine:
        return [f"# {engine}: built by `vitedge engine` with TensorRT {version} on {(info.get('device') or {}).get('gpu_name', 'the device')}.",
                f"# Precision: {precision}.",
                *(["# The bundle's own engine is version-compatible, which nvinfer cannot load (it never allows engine host",
                   "# code): this one was built without it, so it loads with exactly this TensorRT."] if info.get("version_compatible") else []),
                f"# nvinfer loads only model-engine-file. This one loads only with TensorRT {version} (the same JetPack /",
                "# container) on this GPU model; with another, nvinfer logs \"deserialize backend context from engine from file",
                "# ... failed, try rebuild\", builds from onnx-file (minutes for a ViT on a Jetson) and saves its build as",
                f"# {own}, but keeps reading this line, so it rebuilds at every start.",
                f"# Then set model-engine-file={own} (its own build, loaded from the next start on),",
                "# or run `vitedge engine BUNDLE --force` on this device.",
                f"model-engine-file={rel}/{engine}", *nvinfer_builds]
    planned = info.get("planned_for_tensorrt") or next((m.get("planned_for_tensorrt") for m in
                                                        ((info.get("family") or {}).get("members") or {}).values()), None)
    where = (f"`vitedge engine BUNDLE` on the device builds it with the TensorRT found there (planned for {planned or '?'})"
             " and this config then points at it" if tensorrt
             else "a TensorRT bundle of this model (vitedge build --target jetson) ships one built by `vitedge engine`")
    if engine is None and version:  # a version-compatible engine: nvinfer cannot load it (nvinfer_rules)
        where = (f"the bundle's {manifest.artifacts.model} is version-compatible, which nvinfer cannot load (it never "
                 "allows engine host code); `vitedge engine` builds a DeepStream engine without it, absent here")
    return [f"# No engine vitedge built for nvinfer yet: {where}.",
            "# nvinfer loads only model-engine-file. At the first start this file does not exist: nvinfer logs",
            "# \"deserialize engine from file ... failed\", builds from onnx-file (minutes for a ViT on a Jetson) and saves",
            "# its build under exactly this name (<onnx-file>_b<batch-size>_<gpu<gpu-id>|dla<use-dla-core>>_int8.engine,",
            "# nvdsinfer_model_builder.cpp), beside onnx-file; every later start loads it. If nvinfer cannot write",
            "# there, it warns \"Serialize engine failed\" and builds again at every start.",
            f"model-engine-file={own}", *nvinfer_builds]


def _loadable_engine(manifest: Manifest, graph: DeepStreamGraph, tensorrt: bool) -> tuple[str | None, str | None, str | None]:
    """(engine, TensorRT version, precision) of the engine vitedge built that nvinfer can load, or
    (None, version, None) when the only one is version-compatible, (None, None, None) when there is none."""
    info = manifest.backend_info or {}
    ds = info.get("deepstream_engine") or {}
    if ds.get("engine"):
        return ds["engine"], ds.get("tensorrt"), ds.get("precision")
    if not graph.own_graph and tensorrt and manifest.artifacts.built:
        version = (info.get("device") or {}).get("tensorrt")
        if info.get("version_compatible"):
            return None, version, None
        return manifest.artifacts.model, version, _precision(info.get("plan") or {})
    return None, None, None


def _dla_lines(dla_core: int | None) -> list[str]:
    """enable-dla / use-dla-core: without them nvinfer builds (and runs) on the GPU, whatever the engine."""
    if dla_core is None:
        return []
    return [f"# The profile runs on DLA core {dla_core} (GPU fallback for the layers the DLA cannot run): nvinfer's own",
            "# build then targets that core too, and names its engine ..._dla<core>_int8.engine. The DLA takes one",
            "# static batch: batch-size is that batch.",
            "enable-dla=1", f"use-dla-core={dla_core}"]


def _precision(plan: dict[str, Any]) -> str:
    flags = set(plan.get("builder_flags") or ())
    floats = "FP16" if "FP16" in flags else "FP32"
    if plan.get("strongly_typed"):
        return "INT8 where the graph has Q/DQ, float layers as the typed graph says (strongly typed)"
    return f"INT8 where the graph has Q/DQ, {floats} elsewhere"


def _crop_lines(pre: dict[str, Any], h: int, w: int) -> list[str]:
    crop_pct = float(pre.get("crop_pct") or 1.0)
    size = pre.get("crop_size") or [h, w]
    lines = [f"# vitedge resizes keeping the aspect ratio to cover {h}x{w}/{crop_pct:g} and centre-crops {h}x{w}; nvinfer has no crop.",
             "# Equivalent: crop this frame region upstream (nvvideoconvert src-crop=left:top:width:height before",
             "# nvstreammux, whose width/height keep the crop's aspect ratio), then nvinfer scales it to infer-dims:"]
    lines += [f"#   {fw}x{fh} frames: src-crop=" + ":".join(str(v) for v in source_crop(fw, fh, size, crop_pct)) for fw, fh in COMMON_FRAMES]
    lines += ["# maintain-aspect-ratio=1 + symmetric-padding=1 letterbox (centred) what still differs, rather than stretch it."]
    return lines


def write_deepstream(bundle: Path, manifest: Manifest, out: Path, *, rel: str, served: ServedBy) -> list[str]:
    """Write config_infer.txt, labels.txt (classifiers), the DeepStream graph where it differs from
    the bundle's and the empty INT8 flag file into ``out``; ``rel`` is the path from ``out`` back to
    the bundle, ``served`` the bundle backend's facts. Returns the files written."""
    graph = deepstream_graph(manifest)
    inp, outp = manifest.input, manifest.output
    pre = inp.preprocess or {}
    channels = len(pre["mean"])
    h, w = (inp.shape or [None, channels, 0, 0])[2:4]
    profile = manifest.target.profile or {}
    options = profile.get("backend_options") or {}
    batch = int(options.get("opt_batch") or max(profile.get("batch_sizes") or [1])) if "members" not in options else 1
    dla_core = dla_core_of(manifest)
    arith, arts = graph.arith, manifest.artifacts
    interpolation = pre.get("interpolation", "bilinear")
    files: list[str] = []
    lines = [
        f"# DeepStream nvinfer config written by vitedge for {manifest.target.name} ({manifest.model.source}).",
        "# Not run on a device by vitedge: check it with deepstream-app or gst-launch-1.0 (docs/camera-apps.md).",
        f"# Preprocessing the model was trained and validated with: {'grey' if channels == 1 else 'RGB'}, mean {pre['mean']}, "
        f"std {pre['std']}, {interpolation} resize.",
        *_crop_lines(pre, h, w),
    ]
    if graph.own_graph:
        write_deepstream_graph(bundle / arts.qdq, out / BAKED_GRAPH, graph)
        files.append(BAKED_GRAPH)
        onnx_file = BAKED_GRAPH
        lines.append(f"# {BAKED_GRAPH} is the bundle's validated Q/DQ graph ({arts.qdq}) with, added:")
        if arith.baked:
            lines += ["#   a Mul/Add per channel in front: per-channel std cannot be expressed by nvinfer's single",
                      "#   net-scale-factor, so the graph computes (x/255 - mean)/std from 0-255 pixels, and",
                      "#   net-scale-factor = 1 with zero offsets passes them through (the normalisation is baked in);"]
        if graph.softmax:
            lines += [f"#   a Softmax behind the logits ('{PROBS_OUTPUT}'): the probabilities vitedge's runtime reports."]
        lines.append(f"# Its engine is {ENGINE_FILE} (the bundle's {arts.model} takes normalised input and gives logits).")
    else:
        onnx_file = f"{rel}/{arts.qdq}"
    if not arith.baked:
        lines.append("# net-scale-factor = 1/(255*std), offsets = 255*mean: exactly (x/255 - mean)/std, as vitedge computes it.")
    (out / CALIB_FILE).write_bytes(b"")
    files.append(CALIB_FILE)
    target = NvinferEngine(onnx_file, batch, dla_core)
    lines += ["", "[property]", "gpu-id=0", f"onnx-file={onnx_file}", *_engine_lines(manifest, graph, rel, tensorrt_engine(served), target),
              *_dla_lines(dla_core)]
    grey = channels == 1
    lines += [
        f"infer-dims={channels};{h};{w}",
        f"# {'GRAY: nvinfer converts the frame to 8-bit grey (NvBufSurfTransform; vitedge uses ITU-R 601 luma)' if grey else 'RGB: vitedge models take RGB'}",
        f"model-color-format={COLOR_FORMAT[channels]}",
        f"net-scale-factor={_fmt(arith.net_scale_factor)}",
        "offsets=" + ";".join(_fmt(v) for v in arith.offsets),
        "# INT8 from the graph's Q/DQ nodes (explicit quantization)",
        "network-mode=1",
        f"batch-size={batch}",
        "process-mode=1",
        "maintain-aspect-ratio=1",
        "symmetric-padding=1",
        f"# {interpolation} (NvBufSurfTransform_Inter {SCALING_FILTER.get(interpolation, 1)}) on the GPU; not Pillow's pixels",
        f"scaling-filter={SCALING_FILTER.get(interpolation, 1)}",
        f"scaling-compute-hw={SCALING_COMPUTE_GPU}",
    ]
    if not graph.softmax:
        lines += ["# an embedding model: the raw output tensor is attached as NvDsInferTensorMeta for your app",
                  "network-type=100", "output-tensor-meta=1"]
    else:
        labels = outp.class_names or [str(i) for i in range(_num_outputs(bundle / arts.qdq))]
        (out / LABELS_FILE).write_text(nvinfer_labels(labels))
        files.append(LABELS_FILE)
        rewritten = nvinfer_rewritten(labels)
        if rewritten:
            lines += [f"# {rewritten} class names held ';' or a line break, which nvinfer's label file cannot: "
                      "written with ',' and spaces instead (the manifest keeps them as they were)"]
        lines += ["# a classifier: nvinfer reports the class with the highest probability above classifier-threshold, and that",
                  "# probability as its confidence; 0 keeps the top-1 class always, as vitedge's runtime does",
                  "network-type=1", f"output-blob-names={PROBS_OUTPUT}", f"labelfile-path={LABELS_FILE}",
                  "classifier-threshold=0", "classifier-async-mode=0"]
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
