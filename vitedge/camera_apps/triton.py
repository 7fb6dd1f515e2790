"""A Triton Inference Server model repository for a bundle: <name>/config.pbtxt and
<name>/1/<artifact>, for the bundle's backend (TensorRT plan, ONNX Runtime, OpenVINO, or any whose
facts name a Triton platform or backend)."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from vitedge.camera_apps.labels import triton_labels
from vitedge.camera_apps.serving import TENSORRT_PLAN, ServedBy, dla_core_of, dla_static_batch, tensorrt_engine
from vitedge.core.errors import BundleError
from vitedge.bundle.manifest import Manifest
from vitedge.onnxkit.structure import graph_inputs


@dataclass(frozen=True)
class TritonBackend:
    config_lines: tuple[str, ...]  # platform / backend lines of config.pbtxt
    files: tuple[tuple[str, str], ...]  # (bundle artifact key or file, name in <name>/1/)
    instance_kind: str


# Triton's platform or backend name -> its default model files in <name>/1/ (bundle artifact key or file, name there).
# Which one a bundle uses is its backend's fact (BackendFacts.triton_platform / triton_backend).
MODEL_FILES: dict[str, tuple[tuple[str, str], ...]] = {
    TENSORRT_PLAN: (("model", "model.plan"),),
    "onnxruntime_onnx": (("model", "model.onnx"),),
    "openvino": (("model", "model.xml"), ("model.bin", "model.bin")),
}
MAX_QUEUE_DELAY_US = 100
LABELS_FILE = "labels.txt"  # a classifier's class names, one per line (its indices when the model has none)


def triton_backend(served: ServedBy, backend: str) -> TritonBackend:
    """How Triton serves the artifact of a ``backend`` bundle, from that backend's facts."""
    key = served.triton_platform or served.triton_backend
    if key is None:
        raise BundleError(f"no Triton backend for a {backend} bundle (its backend names no Triton platform)")
    if key not in MODEL_FILES:
        raise BundleError(f"no Triton model file known for a {backend} bundle (Triton '{key}'; known: {', '.join(MODEL_FILES)})")
    line = f'platform: "{served.triton_platform}"' if served.triton_platform else f'backend: "{served.triton_backend}"'
    return TritonBackend((line,), MODEL_FILES[key], "KIND_GPU" if served.runs_on == "gpu" else "KIND_CPU")


def model_name(manifest: Manifest) -> str:
    stem = Path(str(manifest.model.source or "model")).stem
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{stem}_{manifest.target.name}")


def _tensor_facts(onnx_path: Path) -> tuple[tuple[str, str, list[int]], tuple[str, str, list[int]]]:
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    types = {onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.UINT8: "TYPE_UINT8", onnx.TensorProto.FLOAT16: "TYPE_FP16"}

    def facts(v):
        t = v.type.tensor_type
        return v.name, types[t.elem_type], [int(d.dim_value) for d in t.shape.dim[1:]]

    return facts(graph_inputs(graph)[0]), facts(graph.output[0])


def _tensorrt_notes(manifest: Manifest, served: ServedBy) -> list[str]:
    """What the server needs for a TensorRT bundle's plan (comments in config.pbtxt)."""
    if not tensorrt_engine(served):
        return []
    info = manifest.backend_info or {}
    options = (manifest.target.profile or {}).get("backend_options") or {}
    version = (info.get("device") or {}).get("tensorrt")
    lines = [f"# 1/model.plan: the engine `vitedge engine` built with TensorRT {version}; serve it with the Triton release"
             " that ships that TensorRT." if version and manifest.artifacts.built else
             "# 1/model.plan is added by `vitedge engine BUNDLE` on the device (a hard link to the bundle's engine, or a copy);"
             " serve it with the Triton release that ships the TensorRT it recorded."]
    if info.get("version_compatible", options.get("version_compatible")):
        lines.append("# A version-compatible engine: start the server with --backend-config=tensorrt,version-compatible=true"
                     " (Triton's TensorRT backend refuses such a plan otherwise; it runs the engine's embedded lean runtime).")
    return lines


def _secondary_devices(dla: int | None) -> str:
    """The NVDLA core of the instance (model_config.proto ``ModelInstanceGroup.secondary_devices``; the TensorRT
    backend takes one, of kind KIND_NVDLA, and deserializes the engine on that core)."""
    return "" if dla is None else f", secondary_devices [ {{ kind: KIND_NVDLA, device_id: {dla} }} ]"


def _dla_notes(dla: int | None, batch: int) -> list[str]:
    if dla is None:
        return []
    return [f"# The engine runs on DLA core {dla} (secondary_devices below) and is static at batch {batch}: max_batch_size",
            f"# is {batch}, and the TensorRT backend refuses at execution a request batch other than {batch} (its profile's",
            f"# min = max = {batch}); Triton pads no batch, so send batches of {batch}."]


def config_text(manifest: Manifest, bundle: Path, name: str, served: ServedBy) -> str:
    """config.pbtxt for the bundle; ``served``: its backend's facts (vitedge.backends.backend_facts)."""
    spec = triton_backend(served, str(manifest.target.backend))
    profile = manifest.target.profile or {}
    sizes = sorted(int(b) for b in profile.get("batch_sizes") or [1])
    dla = dla_core_of(manifest) if tensorrt_engine(served) else None
    if dla is not None:  # a DLA engine is static at one batch: the TensorRT backend refuses a larger max_batch_size
        sizes = [dla_static_batch(manifest)]
    (in_name, in_type, in_dims), (out_name, out_type, out_dims) = _tensor_facts(bundle / manifest.artifacts.qdq)
    fmt = "FORMAT_NHWC" if manifest.input.preprocess_baked else "FORMAT_NCHW"
    labels = manifest.output.kind != "embedding"
    lines = [f"# Triton model configuration written by vitedge for {manifest.target.name} "
             f"({manifest.model.source}); not run on a server by vitedge (docs/camera-apps.md).",
             *_tensorrt_notes(manifest, served),
             *_dla_notes(dla, sizes[-1]),
             f'name: "{name}"', *spec.config_lines, f"max_batch_size: {sizes[-1]}",
             "input [", "  {", f'    name: "{in_name}"', f"    data_type: {in_type}", f"    format: {fmt}",
             f"    dims: [ {', '.join(map(str, in_dims))} ]", "  }", "]",
             "output [", "  {", f'    name: "{out_name}"', f"    data_type: {out_type}", f"    dims: [ {', '.join(map(str, out_dims))} ]"]
    if labels:
        lines.append(f'    label_filename: "{LABELS_FILE}"')
    lines += ["  }", "]", "dynamic_batching {"]
    if len(sizes) > 1 or dla is not None:  # a DLA engine: the batcher aims at its one batch
        lines.append(f"  preferred_batch_size: [ {', '.join(map(str, sizes))} ]")
    lines += [f"  max_queue_delay_microseconds: {MAX_QUEUE_DELAY_US}", "}",
              f"instance_group [ {{ count: 1, kind: {spec.instance_kind}{_secondary_devices(dla)} }} ]"]
    return "\n".join(lines) + "\n"


def write_triton(bundle: Path, manifest: Manifest, out: Path, served: ServedBy) -> list[str]:
    """Write the repository <out>/<name>/ (config.pbtxt, labels.txt, 1/<artifact>); files relative to ``out``.
    ``served``: the bundle backend's facts."""
    if not manifest.artifacts.is_built:
        raise BundleError(f"{bundle} holds no {manifest.artifacts.model} yet: build the engine on the device "
                          "(vitedge engine BUNDLE), then export the Triton repository there")
    name = model_name(manifest)
    text = config_text(manifest, bundle, name, served)
    folder = out / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    written = []
    for key, dst in triton_backend(served, str(manifest.target.backend)).files:
        src = bundle / (manifest.artifacts.model or key) if key == "model" else bundle / (Path(manifest.artifacts.model).with_suffix(".bin").name)
        if not src.is_file():
            raise BundleError(f"{src} is missing; rebuild the bundle")
        shutil.copyfile(src, folder / "1" / dst)
        written.append(f"{name}/1/{dst}")
    (folder / "config.pbtxt").write_text(text)
    written.append(f"{name}/config.pbtxt")
    if write_labels(bundle, manifest, folder):
        written.append(f"{name}/labels.txt")
    return written


def write_labels(bundle: Path, manifest: Manifest, folder: Path) -> bool:
    """labels.txt beside a classifier's config.pbtxt, which names it (``label_filename``): Triton's
    label provider fails the model's load when the file is missing. A model without class names
    (a timm state_dict) gets its class indices, one per line. False for an embedding model."""
    if manifest.output.kind == "embedding":
        return False
    classes = manifest.output.class_names or []
    if not classes:
        classes = [str(i) for i in range(_tensor_facts(bundle / manifest.artifacts.qdq)[1][2][-1])]
    (folder / LABELS_FILE).write_text(triton_labels(classes))
    return True
