"""Small ONNX helpers shared by export, quantization and the backends."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from vitedge.errors import UsageError
from vitedge.fsutil import atomic_write_path, sha256_file

_TWO_GB = 2**31 - 1
_EXTERNAL_DEFAULT = _TWO_GB - (64 << 20)
EXTERNAL_DATA_ENV = "VITEDGE_EXTERNAL_DATA_BYTES"
DATA_SUFFIX = ".data"
SPEC_KEY = "vitedge.spec"
INPUT_FORMAT_KEY = "vitedge.input_format"
FLOAT_NCHW = "float32-nchw"
UINT8_NHWC_RGB = "uint8-nhwc-rgb"


def external_data_threshold() -> int:
    """Serialized size (bytes) above which a graph is saved with external data and handed to
    ONNX Runtime as a file: protobuf's 2 GiB limit less a margin. ``VITEDGE_EXTERNAL_DATA_BYTES``
    lowers it, so that tests can take the >2 GiB path on a small model; nothing else uses it."""
    raw = os.environ.get(EXTERNAL_DATA_ENV, "").strip()
    if not raw:
        return _EXTERNAL_DEFAULT
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"{EXTERNAL_DATA_ENV} must be a byte count (an integer), got {raw!r}; unset it for the 2 GiB default") from None
    if value < 0:
        raise UsageError(f"{EXTERNAL_DATA_ENV} must be >= 0 bytes, got {value}")
    return min(value, _EXTERNAL_DEFAULT)


def is_large(model: Any) -> bool:
    """True when ``model`` (a ModelProto) must travel as a file with external data."""
    return model.ByteSize() > external_data_threshold()


def save_onnx(model: Any, path: Path, *, external: bool | None = None) -> None:
    """Save atomically. A graph over protobuf's 2 GB limit (see external_data_threshold), or any
    graph with ``external=True``, keeps its weights in ``<name>.data`` beside it; ``model`` keeps
    its weights in memory either way."""
    import onnx

    path = Path(path)
    if not (is_large(model) if external is None else external):
        with atomic_write_path(path) as tmp:
            onnx.save_model(model, str(tmp))
        return
    data = path.with_name(path.name + DATA_SUFFIX)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{path.name}.", suffix=".partial", dir=path.parent) as tmp_dir:
        tmp = Path(tmp_dir) / path.name
        onnx.save_model(model, str(tmp), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=data.name, size_threshold=1024)
        # saving moved the weights out of `model`; read them back so callers keep a whole graph
        from onnx.external_data_helper import load_external_data_for_model

        load_external_data_for_model(model, tmp_dir)
        os.replace(tmp.with_name(data.name), data)  # the weights first: the graph never names a missing file
        os.replace(tmp, path)


def external_data_files(path: Path) -> list[Path]:
    """The external data files an ONNX file on disk refers to (none for a self-contained graph)."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors, uses_external_data

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    names: list[str] = []
    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            location = ExternalDataInfo(tensor).location
            if location not in names:
                names.append(location)
    return [path.parent / n for n in names]


def copy_onnx(src: Path, dst: Path) -> list[Path]:
    """Copy an ONNX graph with its external data (renamed to ``<dst name>.data``); returns the
    files written. A self-contained graph is a plain file copy."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    src, dst = Path(src), Path(dst)
    files = external_data_files(src)
    if not files:
        with atomic_write_path(dst) as tmp:
            shutil.copyfile(src, tmp)
        return [dst]
    if len(files) > 1:  # vitedge writes one data file; a user's graph may have several: merge them
        model = onnx.load(str(src))
        save_onnx(model, dst, external=True)
        return [dst, dst.with_name(dst.name + DATA_SUFFIX)]
    data = dst.with_name(dst.name + DATA_SUFFIX)
    model = onnx.load(str(src), load_external_data=False)
    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = data.name
    with atomic_write_path(data) as tmp:
        shutil.copyfile(files[0], tmp)
    with atomic_write_path(dst) as tmp:
        onnx.save_model(model, str(tmp))
    return [dst, data]


def onnx_sha256(path: Path) -> str:
    """sha256 of an ONNX graph as shipped: the file, then each external data file it names, in order.
    For a self-contained graph this is the file's own sha256."""
    path = Path(path)
    files = external_data_files(path)
    if not files:
        return sha256_file(path)
    h = hashlib.sha256()
    for f in [path, *files]:
        with open(f, "rb") as fh:
            while block := fh.read(1 << 20):
                h.update(block)
    return h.hexdigest()


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


def ort_session(path_or_bytes: Any, *, threads: int | None = None, optimize: bool = True, options: Any = None):
    """An ONNX Runtime CPU session with quiet logging, from a path, serialized bytes or a ModelProto
    (one past the 2 GiB protobuf limit goes through a temporary file with external data)."""
    import onnxruntime as ort

    so = options or ort.SessionOptions()
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with session_source(path_or_bytes) as src:
        return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


@contextlib.contextmanager
def session_source(model: Any):
    """What ONNX Runtime's InferenceSession takes for ``model`` (path, bytes or ModelProto): a path
    string, or bytes. A large ModelProto is written with external data to a temporary folder that
    lives until the session is open (ONNX Runtime has read the weights by then)."""
    if isinstance(model, (str, Path)):
        yield str(model)
    elif isinstance(model, (bytes, bytearray)):
        yield bytes(model)
    elif is_large(model):
        with tempfile.TemporaryDirectory(prefix="vitedge-large-") as tmp:
            path = Path(tmp) / "model.onnx"
            save_onnx(model, path, external=True)
            yield str(path)
    else:
        yield model.SerializeToString()
