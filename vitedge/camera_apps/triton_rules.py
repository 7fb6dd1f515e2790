"""What Triton Inference Server and its backends accept in a model repository, read from their sources.

``config.pbtxt`` is parsed with Triton's own ``model_config.proto`` (the ``tritonclient`` package's
``model_config_pb2``, protobuf text format): a key or enum value the proto does not have fails the
parse, as it fails Triton's. The load rules of each backend, with where they were read (the
backends' GitHub repositories, read 2026-11-28; none of them ran here):

| rule | source |
|---|---|
| TensorRT: the plan is ``1/model.plan`` unless the config names another | tensorrt_backend ``src/model_state.cc``:513-517 |
| TensorRT: ``max_batch_size`` at most the engine's largest profile batch ("configuration specified max-batch N but TensorRT engine only supports max-batch M") | ``src/model_state.cc``:686-698 |
| TensorRT: with batching, each tensor's dims are the engine's without its first (batch) dimension | ``src/tensorrt_utils.cc``:193-240 (``CompareDimsSupported``) |
| TensorRT: a request batch outside the profile's min-max is refused at execution | ``src/tensorrt_utils.cc``:314-338 (``ValidateDimension``) |
| TensorRT: at most one secondary device per instance, of kind ``KIND_NVDLA`` (the DLA core) | ``src/tensorrt_model_instance.cc``:48-75 |
| TensorRT: GPU instances (``KIND_GPU``) | ``src/model_state.cc``:129-140, 876 (``InstanceHasKindGPU``) |
| ONNX Runtime: the model is ``1/model.onnx`` unless the config names another | onnxruntime_backend ``src/onnxruntime.cc``:402-405 |
| OpenVINO: the model is ``1/model.xml`` (its weights ``model.bin`` beside it) | openvino_backend ``src/openvino.cc``:214-217 |
| OpenVINO: CPU instances only ("supports only Kind CPU and AUTO") | ``src/openvino.cc``:963-969 |
| a ``label_filename`` must exist beside ``config.pbtxt``: Triton's label provider fails the load otherwise | Triton core (``label_provider.cc``), as issue #44 reports it; not read here |
| ``preferred_batch_size`` entries at most ``max_batch_size`` | Triton core's config validation, as documented for ``dynamic_batching``; not read here |
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import text_format  # onnx's own dependency: always here

TRT = "tensorrt_backend"
DEFAULT_FILES = {"tensorrt_plan": ("model.plan",), "onnxruntime_onnx": ("model.onnx",), "openvino": ("model.xml", "model.bin")}


@dataclass(frozen=True)
class ServedModel:
    """What the model in ``1/`` really is, to check ``config.pbtxt`` against."""

    input_dims: tuple[int, ...]  # without the batch dimension
    output_dims: tuple[int, ...]
    max_batch: int  # the largest batch the artifact takes (a TensorRT engine's profile maximum)
    min_batch: int = 1
    dla_core: int | None = None  # a TensorRT engine built for that DLA core


def parse_model_config(text: str) -> Any:
    """``config.pbtxt`` as Triton reads it (raises google.protobuf.text_format.ParseError where Triton would fail)."""
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(text, model_config_pb2.ModelConfig())


def check_triton_model(folder: Path, model: ServedModel, *, plan_present: bool = True) -> list[str]:
    """Each way the repository folder ``folder`` (config.pbtxt, labels, 1/) breaks the load rules of Triton's
    backend for it (the table above). ``plan_present``: whether ``1/`` should hold the model file yet."""
    from tritonclient.grpc import model_config_pb2 as mc

    cfg = parse_model_config((folder / "config.pbtxt").read_text())
    key = cfg.platform or cfg.backend
    out = [] if cfg.name == folder.name else [f"name '{cfg.name}' is not the folder's '{folder.name}' (Triton loads by folder)"]
    if key not in DEFAULT_FILES:
        return out + [f"platform/backend '{key}' is none vitedge serves"]
    if plan_present:
        out += [f"1/{f} missing ({DEFAULT_FILES[key][0]} is the backend's default file)" for f in DEFAULT_FILES[key]
                if not (folder / "1" / f).is_file()]
    if cfg.max_batch_size > model.max_batch:
        out.append(f"max_batch_size {cfg.max_batch_size} but the model takes at most {model.max_batch} "
                   f"({TRT} src/model_state.cc:686-698 for a plan)")
    out += [f"preferred_batch_size {b} above max_batch_size {cfg.max_batch_size}" for b in cfg.dynamic_batching.preferred_batch_size
            if b > cfg.max_batch_size]
    if model.min_batch > 1:  # a static engine: every other request batch fails at execution
        out += [f"preferred_batch_size {b}: the engine takes batch {model.min_batch} only ({TRT} src/tensorrt_utils.cc:314-338)"
                for b in cfg.dynamic_batching.preferred_batch_size if b != model.min_batch]
    for tensors, dims, what in ((cfg.input, model.input_dims, "input"), (cfg.output, model.output_dims, "output")):
        out += [f"{what} '{t.name}' dims {list(t.dims)}, the model's are {list(dims)} ({TRT} src/tensorrt_utils.cc:193-240)"
                for t in tensors if tuple(t.dims) != tuple(dims)]
    out += [f"output '{t.name}' names {t.label_filename}, which is not in the folder (Triton's label provider fails the load)"
            for t in cfg.output if t.label_filename and not (folder / t.label_filename).is_file()]
    return out + _instance_problems(cfg, key, model, mc)


# The instance kind each Triton backend (its platform or backend key in config.pbtxt) runs, and where its source says so.
_INSTANCE_KIND = {
    "tensorrt_plan": ("KIND_GPU", f"the TensorRT backend runs GPU instances ({TRT} src/model_state.cc:876)"),
    "openvino": ("KIND_CPU", "the OpenVINO backend runs CPU instances only (openvino_backend src/openvino.cc:963-969)"),
}


def _instance_problems(cfg: Any, key: str, model: ServedModel, mc: Any) -> list[str]:
    out = []
    for group in cfg.instance_group:
        kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
        want_kind, why = _INSTANCE_KIND.get(key, (kind, ""))
        if kind != want_kind:
            out.append(f"instance kind {kind}: {why}")
        devices = [(mc.ModelInstanceGroup.SecondaryDevice.SecondaryDeviceKind.Name(d.kind), d.device_id) for d in group.secondary_devices]
        if devices and key != "tensorrt_plan":
            out.append("secondary_devices: only the TensorRT backend reads them")
        if len(devices) > 1:
            out.append(f"{len(devices)} secondary devices: the TensorRT backend takes one ({TRT} src/tensorrt_model_instance.cc:48-75)")
        want = [("KIND_NVDLA", model.dla_core)] if model.dla_core is not None else []
        if key == "tensorrt_plan" and devices != want:
            out.append(f"secondary_devices {devices}, the engine runs on {want or 'the GPU alone'} "
                       f"({TRT} src/tensorrt_model_instance.cc:48-75)")
    return out
