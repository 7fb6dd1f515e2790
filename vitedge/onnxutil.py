"""Small ONNX helpers shared by export, quantization and the backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitedge.fsutil import atomic_write_path

_TWO_GB = 2**31 - 1
SPEC_KEY = "vitedge.spec"
INPUT_FORMAT_KEY = "vitedge.input_format"
FLOAT_NCHW = "float32-nchw"
UINT8_NHWC_RGB = "uint8-nhwc-rgb"


def save_onnx(model: Any, path: Path) -> None:
    """Save atomically; models over protobuf's 2 GB limit keep their weights in `<name>.data`."""
    import onnx

    path = Path(path)
    large = model.ByteSize() > _TWO_GB - (64 << 20)
    with atomic_write_path(path) as tmp:
        if large:
            onnx.save_model(model, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=path.name + ".data", size_threshold=1024)
            # the external file was written next to tmp under its final name
        else:
            onnx.save_model(model, str(tmp))


def set_metadata(model: Any, values: dict[str, str]) -> None:
    existing = {p.key: p for p in model.metadata_props}
    for key, value in values.items():
        if key in existing:
            existing[key].value = value
        else:
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value


def get_metadata(model: Any) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def ort_session(path_or_bytes: Any, *, threads: int | None = None, optimize: bool = True):
    """An ONNX Runtime CPU session with quiet logging."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    src = str(path_or_bytes) if isinstance(path_or_bytes, Path) else path_or_bytes
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
