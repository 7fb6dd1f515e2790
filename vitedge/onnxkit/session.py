"""ONNX Runtime sessions: ``ort_session`` opens every session vitedge uses, as ``SessionSettings``
says; a graph past 2 GiB goes through a temporary file with external data (``session_source``).

onnxruntime is imported inside the functions (through core/telemetry): with another backend the
runtime-only distribution has no ``onnxruntime``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitedge.core import telemetry
from vitedge.core.errors import UsageError
from vitedge.files.swap import work_prefix
from vitedge.onnxkit.files import is_large, save_external

if TYPE_CHECKING:
    from onnx import ModelProto


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


OPTIMIZATION_LEVELS = ("disabled", "basic", "extended", "all")

# "0": no session spins, whatever its settings say: idle intra-op threads sleep. For a machine whose cores several
# processes share (a test run's workers): there spinning threads take the cores from the ones working, and an ONNX
# Runtime run of a small ViT cost about twice the CPU time with it (2-core AVX2, load average 12). Outputs are the same.
SPINNING_ENV = "VITEDGE_ORT_SPINNING"


def spinning_allowed() -> bool:
    """False when ``VITEDGE_ORT_SPINNING`` is "0", True when it is unset or "1"; any other value is a usage error."""
    value = os.environ.get(SPINNING_ENV, "1").strip()
    if value not in ("0", "1"):
        raise UsageError(f"{SPINNING_ENV} must be 0 (idle ONNX Runtime threads sleep) or 1 (they may spin), got {value!r}")
    return value == "1"


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
    if not settings.spinning or not spinning_allowed():
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
