"""ONNX graphs as files: saved atomically, with external data past protobuf's 2 GiB limit
(``save_onnx``, ``save_external``, ``weightless_copy``), copied (``copy_onnx``) and hashed as shipped
(``onnx_sha256``); the folder rule for external data: a tensor's weights are read only from a
regular file inside the model's folder (``external_data_file``, ``check_external_data``,
``all_tensors``).

onnx is imported inside the functions: the runtime-only distribution ships this module and has no ``onnx``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitedge.core.errors import ModelLoadError, UsageError
from vitedge.files.atomic import atomic_write_path, sha256_file
from vitedge.files.safefile import check_regular
from vitedge.files.swap import partial_prefix

if TYPE_CHECKING:
    from google.protobuf.message import Message
    from onnx import GraphProto, ModelProto, NodeProto, TensorProto


_TWO_GB = 2**31 - 1
_EXTERNAL_DEFAULT = _TWO_GB - (64 << 20)
EXTERNAL_DATA_ENV = "VITEDGE_EXTERNAL_DATA_BYTES"
DATA_SUFFIX = ".data"


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


def is_large(model: ModelProto) -> bool:
    """True when ``model`` (a ModelProto) must travel as a file with external data."""
    return serialized_size(model) > external_data_threshold()


def serialized_size(model: ModelProto) -> int:
    """About how many bytes ``model`` serializes to (within a few bytes per tensor), without
    serializing it: upb protobuf's ByteSize() encodes the whole message to measure it, which for
    vit_h_14 briefly cost ~10 GB on top of the 2.5 GB graph. Weights count by their raw size."""
    total = 0
    for fd, value in model.ListFields():
        if fd.name != "graph":
            total += _field_size(value)
    g = model.graph
    for fd, value in g.ListFields():
        if fd.name == "initializer":
            total += sum(_tensor_size(t) for t in value)
        else:
            total += _field_size(value)
    return total


def _field_size(value: Any) -> int:
    if hasattr(value, "ByteSize"):
        return value.ByteSize()
    if isinstance(value, (str, bytes)):
        return len(value)
    try:  # a repeated field
        return sum(_field_size(v) for v in value)
    except TypeError:
        return 8


def _tensor_size(tensor: TensorProto) -> int:
    """Serialized size of a TensorProto; raw data by its length, without copying it out."""
    if not tensor.HasField("raw_data"):
        return tensor.ByteSize()
    from onnx import helper

    n = 1
    for d in tensor.dims:
        n *= d
    raw = n * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    return raw + 16 + len(tensor.name) + 10 * len(tensor.dims)


def save_onnx(model: ModelProto, path: Path, *, external: bool | None = None, base_dir: Path | None = None) -> None:
    """Save atomically. A graph over protobuf's 2 GB limit (see external_data_threshold), any graph
    with ``external=True``, and a graph whose weights are still in files (loaded with
    ``load_external_data=False``; ``base_dir`` is where they are) keep their weights in
    ``<name>.data`` beside it; ``model`` is left as it was either way."""
    import onnx

    path = Path(path)
    if external is None:
        external = has_external_tensors(model) or is_large(model)
    if not external:
        with atomic_write_path(path) as tmp:
            onnx.save_model(model, str(tmp))
        return
    save_external(model, path, base_dir=base_dir)


EXTERNAL_MIN_BYTES = 1024  # smaller tensors (scales, zero points, shapes) stay inline
EXTERNAL_ALIGN = 4096  # data offsets on page boundaries: ONNX Runtime can map the weights instead of copying them


def has_external_tensors(model: ModelProto) -> bool:
    """True when some initializer of ``model`` (a ModelProto) names an external data file."""
    from onnx.external_data_helper import uses_external_data

    return any(uses_external_data(t) for t in model.graph.initializer)


def save_external(model: ModelProto, path: Path, *, base_dir: Path | None = None) -> None:
    """Write ``model`` as ``path`` plus ``<name>.data`` (initializers of 1 KiB and more), atomically,
    streaming one tensor at a time: ``model`` is neither changed nor copied (onnx's own external-data
    save moves the weights out of the message and a read-back doubles protobuf's arena: 2 x 2.5 GB
    for vit_h_14). Tensors already in files (a graph loaded without its weights) are read from
    ``base_dir``, so this also merges a graph's many data files into one."""
    import onnx

    path = Path(path)
    data = path.with_name(path.name + DATA_SUFFIX)
    path.parent.mkdir(parents=True, exist_ok=True)
    shell = _shell(model)
    with tempfile.TemporaryDirectory(prefix=partial_prefix(path), suffix=".partial", dir=path.parent) as tmp_dir:
        tmp_graph, tmp_data = Path(tmp_dir) / path.name, Path(tmp_dir) / data.name
        with open(tmp_data, "wb") as fh:
            for tensor in model.graph.initializer:
                out = shell.graph.initializer.add()
                blob = _external_bytes(tensor, base_dir)
                if blob is None:
                    out.CopyFrom(tensor)
                    continue
                _copy_fields(tensor, out, skip=("raw_data", "external_data", "data_location"))
                offset = -(-fh.tell() // EXTERNAL_ALIGN) * EXTERNAL_ALIGN
                fh.seek(offset)
                fh.write(blob)
                out.data_location = onnx.TensorProto.EXTERNAL
                for key, value in (("location", data.name), ("offset", str(offset)), ("length", str(len(blob)))):
                    entry = out.external_data.add()
                    entry.key, entry.value = key, value
                del blob
        onnx.save_model(shell, str(tmp_graph))
        os.replace(tmp_data, data)  # the weights first: the graph never names a missing file
        os.replace(tmp_graph, path)


def _shell(model: ModelProto) -> Any:
    """A copy of ``model`` without its initializers."""
    import onnx

    shell = onnx.ModelProto()
    _copy_fields(model, shell, skip=("graph",))
    _copy_fields(model.graph, shell.graph, skip=("initializer",))
    return shell


def weightless_copy(model: ModelProto) -> Any:
    """A copy of ``model`` whose initializers of 1 KiB and more name a data file that does not
    exist: what shape inference and graph analysis need (names, types, dims, the small constants
    such as Reshape targets), a few MB for vit_h_14 instead of 2.5 GB."""
    import onnx

    shell = _shell(model)
    for tensor in model.graph.initializer:
        out = shell.graph.initializer.add()
        heavy = tensor.data_location == onnx.TensorProto.EXTERNAL or (
            tensor.HasField("raw_data") and _tensor_size(tensor) >= EXTERNAL_MIN_BYTES)
        if not heavy:
            out.CopyFrom(tensor)
            continue
        _copy_fields(tensor, out, skip=("raw_data", "external_data", "data_location"))
        out.data_location = onnx.TensorProto.EXTERNAL
        entry = out.external_data.add()
        entry.key, entry.value = "location", "vitedge-weights-not-loaded"
    return shell


MAX_EXTERNAL_BYTES = 1 << 40  # an offset or length past 1 TiB is not a real model's


def _external_info(tensor: TensorProto, where: str) -> tuple[str, int, int | None]:
    """``tensor``'s external location, offset and length (None: to the end), each checked: a number, not negative."""
    fields = {entry.key: entry.value for entry in tensor.external_data}
    numbers: dict[str, int | None] = {}
    for key in ("offset", "length"):
        raw = fields.get(key)
        value = None
        if raw not in (None, ""):
            try:
                value = int(raw)
            except ValueError:
                value = -1
            if not 0 <= value <= MAX_EXTERNAL_BYTES:
                raise ModelLoadError(f"{where}: tensor '{tensor.name}' gives its external data {key} as '{raw[:40]}', which is "
                                     f"not a byte count (0 to {MAX_EXTERNAL_BYTES}); the graph is damaged: re-export it")
        numbers[key] = value
    return fields.get("location", ""), numbers["offset"] or 0, numbers["length"]


def external_data_file(base_dir: Path, tensor: TensorProto, where: str | None = None) -> Path:
    """The file that holds ``tensor``'s external data, checked: inside ``base_dir`` (the model's folder; an absolute
    location, ``..`` or a link that leads out of it is refused, as ONNX's own loader refuses it: a graph from someone
    else must not copy a file of this machine, a key say, into the bundle's weights), a regular file, present, and long
    enough for the tensor's offset and length. A ModelLoadError naming ``where`` (default: the folder) otherwise.
    This is the folder rule: it holds for every tensor a graph holds (``all_tensors``), not only initializers."""
    where = where or str(base_dir)
    location, offset, length = _external_info(tensor, where)
    target = _inside(Path(base_dir), location)
    if target is None:
        raise ModelLoadError(f"{where}: tensor '{tensor.name}' names external data '{location}', which is not a file inside the "
                             "model's folder; vitedge reads weights only from files beside the model (as ONNX's loader does)")
    if not os.path.lexists(target) and not target.exists():
        raise ModelLoadError(f"{where}: tensor '{tensor.name}' keeps its weights in '{location}', which is missing from "
                             f"{os.path.abspath(base_dir)}: copy the data file beside the model")
    try:
        size = check_regular(target).st_size
    except OSError as err:
        raise ModelLoadError(f"{where}: tensor '{tensor.name}' keeps its weights in '{location}': {err}") from None
    end = offset + (length or 0)
    if end > size or offset > size:
        raise ModelLoadError(f"{where}: tensor '{tensor.name}' needs bytes {offset}..{end} of '{location}', which has "
                             f"{size}: the data file is truncated or belongs to another model")
    return target


def _inside(base_dir: Path, location: str) -> Path | None:
    """``base_dir / location`` with links resolved, or None when that leaves ``base_dir`` (absolute, ``..``, a link out)."""
    base = Path(os.path.realpath(base_dir))
    if not location or "\0" in location or Path(location).is_absolute() or ".." in Path(location).parts:
        return None
    target = Path(os.path.realpath(base / location))
    return target if base in target.parents else None


def _graph_tensors(graph: GraphProto, initializers: bool = True) -> Iterable[Any]:
    if initializers:
        yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: NodeProto) -> Iterable[Any]:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        sparse = ([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []) + list(attr.sparse_tensors)
        for tensor in sparse:
            yield from (tensor.values, tensor.indices)
        if attr.HasField("g"):
            yield from _graph_tensors(attr.g)
        for sub in attr.graphs:
            yield from _graph_tensors(sub)


def all_tensors(model: ModelProto, initializers: bool = True) -> Iterable[Any]:
    """Every TensorProto ``model`` holds: initializers (``initializers=False``: all but the main graph's), sparse
    initializers, node attributes (Constant's value, ``tensors``, sparse attributes), subgraphs (If, Loop, Scan) at any
    depth, and the model's local functions."""
    yield from _graph_tensors(model.graph, initializers)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node)


def _is_external(tensor: TensorProto) -> bool:
    return tensor.data_location == 1 or any(entry.key == "location" for entry in tensor.external_data)  # 1: EXTERNAL


def check_external_data(model: ModelProto, base_dir: Path, where: str) -> None:
    """Every external-data tensor of ``model``, wherever it sits (``all_tensors``), readable from ``base_dir``
    (see ``external_data_file``)."""
    for tensor in all_tensors(model):
        if _is_external(tensor):
            external_data_file(base_dir, tensor, where)


def inline_attribute_tensors(model: ModelProto, base_dir: Path, where: str) -> None:
    """Read every external tensor of ``model`` that is not a top-level initializer (a Constant's value, an attribute,
    a subgraph's or a sparse tensor) from ``base_dir`` by the folder rule and keep it inline: written anywhere else,
    a relative location would be read from wherever that graph is next opened (the working directory)."""
    for tensor in all_tensors(model, initializers=False):
        if not _is_external(tensor):
            continue
        blob = _read_external(tensor, Path(base_dir), where)
        tensor.ClearField("external_data")
        tensor.data_location = 0  # DEFAULT
        tensor.raw_data = blob


def _read_external(tensor: TensorProto, base_dir: Path, where: str | None = None) -> bytes:
    _, offset, length = _external_info(tensor, where or str(base_dir))
    file = external_data_file(base_dir, tensor, where)
    with open(file, "rb") as fh:
        fh.seek(offset)
        return fh.read(length) if length is not None else fh.read()


def _external_bytes(tensor: TensorProto, base_dir: Path | None) -> bytes | None:
    """The bytes of ``tensor`` that go to the data file; None: it stays inline."""
    if _is_external(tensor):
        if base_dir is None:
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            raise ModelLoadError(f"tensor '{tensor.name}' is in external file '{location}' and no folder was given to read it from")
        return _read_external(tensor, Path(base_dir))
    if not tensor.HasField("raw_data") or _tensor_size(tensor) < EXTERNAL_MIN_BYTES:
        return None
    return tensor.raw_data


def _copy_fields(src: Message, dst: Message, *, skip: tuple[str, ...]) -> None:
    """Copy every set field of protobuf message ``src`` but ``skip`` into ``dst``."""
    for fd, value in src.ListFields():
        if fd.name in skip:
            continue
        repeated = getattr(fd, "is_repeated", None)
        if repeated is None:
            repeated = fd.label == fd.LABEL_REPEATED
        if repeated:
            getattr(dst, fd.name).extend(value)
        elif fd.message_type is not None:
            getattr(dst, fd.name).CopyFrom(value)
        else:
            setattr(dst, fd.name, value)


def external_data_files(path: Path) -> list[Path]:
    """The external data files an ONNX file on disk refers to (none for a self-contained graph)."""
    import onnx

    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    names: list[str] = []
    for tensor in all_tensors(model):
        if _is_external(tensor):
            location = next((e.value for e in tensor.external_data if e.key == "location"), "")
            _external_info(tensor, str(path))
            if location not in names:
                names.append(location)
    for name in names:  # a graph from elsewhere (a bundle's) must not make vitedge read, say, /dev/zero or a key
        target = _inside(path.parent, name)
        if target is None or not target.is_file():
            raise ModelLoadError(f"{path}: its external data '{name}' is not a regular file inside {path.parent}")
    return [path.parent / n for n in names]


def copy_onnx(src: Path, dst: Path) -> list[Path]:
    """Copy an ONNX graph with its external data (renamed to ``<dst name>.data``); returns the
    files written. A self-contained graph is a plain file copy."""
    import onnx
    src, dst = Path(src), Path(dst)
    files = external_data_files(src)
    if not files:
        with atomic_write_path(dst) as tmp:
            shutil.copyfile(src, tmp)
        return [dst]
    if len(files) > 1:  # vitedge writes one data file; a user's graph may have several: merge them
        model = onnx.load(str(src), load_external_data=False)  # the weights are streamed, one tensor at a time
        save_external(model, dst, base_dir=src.parent)
        return [dst, dst.with_name(dst.name + DATA_SUFFIX)]
    data = dst.with_name(dst.name + DATA_SUFFIX)
    model = onnx.load(str(src), load_external_data=False)
    for tensor in all_tensors(model):
        if _is_external(tensor):
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
