"""The ONNX toolkit: the one implementation of each ONNX helper export, quantization, the
backends and the runtime share.

* files: ``save_onnx`` / ``copy_onnx`` / ``external_data_files`` / ``onnx_sha256`` (graphs past
  protobuf's 2 GiB limit travel with external data), ``get_metadata`` / ``set_metadata``;
* graph structure: ``opset_version`` / ``opset_imports`` / ``require_opset_import``,
  ``graph_inputs`` (inputs that are not initializers), ``node_index`` (producer and
  consumers of each tensor), ``topological_sort``;
* ONNX Runtime: ``ort_session`` opens every session vitedge uses, as ``SessionSettings`` says.

onnx and onnxruntime are imported inside the functions: the runtime-only distribution ships
this module and has neither ``onnx`` nor, with another backend, ``onnxruntime``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitedge.core import telemetry
from vitedge.core.errors import ModelLoadError, UsageError
from vitedge.files.atomic import atomic_write_path, sha256_file
from vitedge.files.safefile import check_regular
from vitedge.files.swap import partial_prefix, work_prefix

if TYPE_CHECKING:
    from google.protobuf.message import Message
    from onnx import GraphProto, ModelProto, NodeProto, TensorProto

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


def set_metadata(model: ModelProto, values: dict[str, str]) -> None:
    existing = {p.key: p for p in model.metadata_props}
    for key, value in values.items():
        if key in existing:
            existing[key].value = value
        else:
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value


def get_metadata(model: ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


@contextlib.contextmanager
def session_source(model: ModelProto):
    """What ONNX Runtime's InferenceSession takes for ``model`` (path, bytes or ModelProto): a path
    string, or bytes. A large ModelProto is written with external data to a temporary folder that
    lives until the session is open (ONNX Runtime has read the weights by then)."""
    if isinstance(model, (str, Path)):
        yield str(model)
    elif isinstance(model, (bytes, bytearray)):
        yield bytes(model)
    elif is_large(model):
        with tempfile.TemporaryDirectory(prefix=work_prefix("large")) as tmp:
            path = Path(tmp) / "model.onnx"
            save_external(model, path)  # streamed: the ModelProto is not copied
            yield str(path)
    else:
        yield model.SerializeToString()


# --------------------------------------------------------------------------- ONNX Runtime sessions

OPTIMIZATION_LEVELS = ("disabled", "basic", "extended", "all")


@dataclass(frozen=True)
class SessionSettings:
    """How ONNX Runtime opens a graph. The defaults are ONNX Runtime's own, with quiet logging."""

    threads: int | None = None  # intra-op threads; None or 0: ONNX Runtime's default (one per core)
    optimization: str = "all"  # graph optimization level at load: disabled | basic | extended | all
    optimized_model_path: str | Path | None = None  # where ONNX Runtime writes the graph it optimized for this CPU
    spinning: bool = True  # idle intra-op threads busy-wait (ONNX Runtime's default); off for sessions timed interleaved
    prepacking: bool = True  # off: no pre-packed second copy of the weights (a graph past 2 GB in a full process)
    arena: bool = True  # off: no CPU memory arena; what a run allocates goes back when it ends (large graphs)
    profile_prefix: str | None = None  # turn ONNX Runtime's profiler on; its JSON file starts with this
    providers: tuple[str, ...] = ("CPUExecutionProvider",)

    def __post_init__(self) -> None:
        if self.optimization not in OPTIMIZATION_LEVELS:
            raise UsageError(f"graph optimization must be one of {', '.join(OPTIMIZATION_LEVELS)}, got '{self.optimization}'")


def _session_options(settings: SessionSettings) -> Any:
    ort = telemetry.onnxruntime()

    so = ort.SessionOptions()
    so.log_severity_level = 3
    if settings.threads:
        so.intra_op_num_threads = settings.threads
    so.graph_optimization_level = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[settings.optimization]
    if settings.optimized_model_path is not None:
        so.optimized_model_filepath = str(settings.optimized_model_path)
    if not settings.spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not settings.prepacking:
        so.add_session_config_entry("session.disable_prepacking", "1")
    if not settings.arena:
        so.enable_cpu_mem_arena = False
    if settings.profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = settings.profile_prefix
    return so


def lean_settings(settings: SessionSettings | None = None) -> SessionSettings:
    """``settings`` (default: ONNX Runtime's) for a graph past 2 GB, whose weights alone are 2.5 GB
    (vit_h_14): no pre-packed second copy of the weights, no memory arena holding on to the largest
    run's buffers. Measured on vit_h_14: see benchmarks/results/large_graph.md."""
    return dataclasses.replace(settings or SessionSettings(), prepacking=False, arena=False)


def ort_session(model: ModelProto, settings: SessionSettings | None = None, *, threads: int | None = None) -> Any:
    """An ONNX Runtime session for ``model``: a path, serialized bytes or a ModelProto (one past the
    2 GiB protobuf limit goes through a temporary file with external data). ``threads``, when
    given, overrides ``settings.threads``."""
    ort = telemetry.onnxruntime()

    settings = settings or SessionSettings()
    if threads is not None:
        settings = dataclasses.replace(settings, threads=threads)
    so = _session_options(settings)
    with session_source(model) as src:
        return ort.InferenceSession(src, so, providers=list(settings.providers))


# --------------------------------------------------------------------------- graph structure

STANDARD_DOMAINS = ("", "ai.onnx")  # two spellings of the standard ONNX operator domain


def opset_version(model: ModelProto, domain: str = "") -> int:
    """The opset version a ModelProto imports for ``domain`` ("" or "ai.onnx": the standard
    domain); 0 when it imports none."""
    domains = STANDARD_DOMAINS if domain in STANDARD_DOMAINS else (domain,)
    return max((o.version for o in model.opset_import if o.domain in domains), default=0)


def opset_imports(model: ModelProto) -> list[Any]:
    """Every opset a ModelProto imports (OperatorSetIdProto entries), e.g. for a model built
    from part of its graph."""
    return list(model.opset_import)


def require_opset_import(model: ModelProto, domain: str, version: int) -> None:
    """Import ``domain`` at ``version`` unless the ModelProto already imports that domain (in place)."""
    if not any(o.domain == domain for o in model.opset_import):
        from onnx import helper

        model.opset_import.append(helper.make_opsetid(domain, version))


def _graph(model_or_graph: ModelProto | GraphProto) -> Any:
    graph = getattr(model_or_graph, "graph", None)  # a ModelProto has one; a GraphProto is one
    return model_or_graph if graph is None else graph


def graph_inputs(model_or_graph: ModelProto | GraphProto) -> list[Any]:
    """The inputs a caller feeds (ValueInfoProto, in graph order): the graph's inputs less its
    initializers, which graphs written for opset < 9 list among the inputs too."""
    g = _graph(model_or_graph)
    inits = {t.name for t in g.initializer}
    return [i for i in g.input if i.name not in inits]


@dataclass(frozen=True)
class NodeIndex:
    """Who writes and who reads each tensor of a list of nodes (empty names, i.e. omitted optional
    inputs and outputs, are left out)."""

    producer: dict[str, Any]  # tensor -> the node writing it
    consumers: dict[str, list[tuple[Any, int]]]  # tensor -> (node, input index) per read, in node order

    def readers(self, tensor: str) -> list[Any]:
        """The nodes reading ``tensor``, once per read (a node reading it twice is listed twice)."""
        return [node for node, _ in self.consumers.get(tensor, ())]


def node_index(nodes: Iterable[Any]) -> NodeIndex:
    """The producer and consumers of every tensor of ``nodes`` (e.g. ``model.graph.node``)."""
    producer: dict[str, Any] = {}
    consumers: dict[str, list[tuple[Any, int]]] = {}
    for node in nodes:
        for out in node.output:
            if out:
                producer[out] = node
        for i, name in enumerate(node.input):
            if name:
                consumers.setdefault(name, []).append((node, i))
    return NodeIndex(producer, consumers)


def topological_sort(nodes: Iterable[Any]) -> list[Any]:
    """``nodes`` ordered so that each comes after the nodes writing its inputs, moving as little
    as possible: a node whose inputs are ready when its turn comes keeps its place; one listed
    before a producer of its inputs waits, and comes right after the node writing the last of
    them (nodes waiting on one node: by that node's output order, then in list order), followed
    at once by whatever was waiting on it in turn. So an already sorted list comes back as it
    was, and a rewrite can list its new nodes first: each lands right after the tensor it reads
    is written. A tensor no node in the list writes (graph input, initializer) is available from
    the start. A cycle is a ModelLoadError."""
    nodes = list(nodes)
    written = set(node_index(nodes).producer)
    done: set[str] = set()
    missing: dict[int, int] = {}  # id(node) -> how many of its inputs are still to be written
    waiting: dict[str, list[Any]] = {}  # tensor -> nodes waiting for it, in list order
    order: list[Any] = []

    def place(first: NodeProto) -> None:
        stack = [iter([first])]
        while stack:
            node = next(stack[-1], None)
            if node is None:
                stack.pop()
                continue
            order.append(node)
            ready = []
            for out in node.output:
                done.add(out)
                for other in waiting.pop(out, ()):
                    missing[id(other)] -= 1
                    if not missing[id(other)]:
                        ready.append(other)
            stack.append(iter(ready))

    for node in nodes:
        needs = {t for t in node.input if t and t in written and t not in done}
        if not needs:
            place(node)
            continue
        missing[id(node)] = len(needs)
        for t in sorted(needs):
            waiting.setdefault(t, []).append(node)
    if len(order) != len(nodes):
        placed = {id(n) for n in order}
        stuck = next(n for n in nodes if id(n) not in placed)
        raise ModelLoadError(f"the ONNX graph has a cycle: node '{stuck.name or stuck.op_type}' reads a tensor written "
                             f"only downstream of itself ({len(nodes) - len(order)} node(s) cannot be ordered)")
    return order


def splice_nodes(model: ModelProto, nodes: list[Any], added: list[Any], drop: set[int]) -> None:
    """Make ``model``'s nodes ``nodes`` (held by the caller, so each id() is its own) without those whose id() is
    in ``drop``, plus ``added``, in dependency order (``topological_sort``: each new node lands where its inputs
    are written). In place."""
    ordered = topological_sort(added + [n for n in nodes if id(n) not in drop])
    del model.graph.node[:]
    model.graph.node.extend(ordered)


def cleanup(model: ModelProto) -> None:
    """Drop nodes whose outputs nobody reads and initializers no node reads (in place)."""
    g = model.graph
    outputs = {o.name for o in g.output}
    while True:
        used = {i for n in g.node for i in n.input if i} | outputs
        keep = [n for n in g.node if any(o in used for o in n.output if o)]
        if len(keep) == len(g.node):
            break
        del g.node[:]
        g.node.extend(keep)
    used = {i for n in g.node for i in n.input if i} | outputs
    # deleted one by one: clearing and re-adding the kept ones would copy every weight (upb
    # protobuf keeps the old copies in the message's arena too: +2.5 GB per call for vit_h_14)
    for k in reversed([k for k, t in enumerate(g.initializer) if t.name not in used]):
        del g.initializer[k]
    produced = {o for n in g.node for o in n.output} | {t.name for t in g.initializer} | {i.name for i in g.input}
    vis = [v for v in g.value_info if v.name in produced]
    if len(vis) != len(g.value_info):
        del g.value_info[:]
        g.value_info.extend(vis)


class NameScope:
    """Unique tensor / node names for what a rewrite adds to a graph."""

    def __init__(self, model: ModelProto):
        g = model.graph
        self.used = {t.name for t in g.initializer} | {i.name for i in g.input} | {o.name for o in g.output}
        for n in g.node:
            self.used.add(n.name)
            self.used.update(n.input)
            self.used.update(n.output)

    def __call__(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name = f"{base}_{k}"
            k += 1
        self.used.add(name)
        return name
