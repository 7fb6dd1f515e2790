"""The backend and runner interfaces, each backend's facts, and the registry that maps names to backends.

Adding a backend (a runtime) touches nothing above this layer:

1. Write a `Backend` subclass (a module or a package in `vitedge/backends/`, or your own module)
   with its `name`, its `options_type` (a frozen dataclass of the profile's ``[backend_options]``),
   `check_environment`, `build`, `open_runner` (a `Runner` subclass), and its `facts`: one
   `BackendFacts` saying what it runs on, its runtime modules, install hints, whether it builds
   without its runtime, how Triton serves its artifact. Import the runtime only inside those
   methods, so the facts are readable where the runtime is not installed.
2. Register it: a line in `_REGISTRY` below for a backend shipped with vitedge, or
   ``register_backend("name", MyBackend)`` (or ``"my.module:MyBackend"``) from your own code.
3. Add a target profile naming it (``backend = "name"``): a TOML file in `targets/`, or in a
   folder listed in the ``VITEDGE_TARGETS_PATH`` environment variable (`vitedge.core.paths.targets_dirs`).

`vitedge targets`, `vitedge build`, `vitedge validate`, `vitedge export-config`, the accuracy
budget and `vitedge.runtime.load` then find it through `get_backend` and `backend_facts`.
If the runtime-only distribution must ship it, list it in packaging/runtime/pyproject.toml with
its extra (`BackendFacts.runtime_extra`).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Generic, Iterable, Iterator, TypeVar

import numpy as np

from vitedge.core.cpu import timing_identity
from vitedge.core.errors import UsageError
from vitedge.onnxkit.metadata import FLOAT_NCHW, UINT8_NHWC_RGB


CPU = "cpu"
GPU = "gpu"


@dataclass(frozen=True)
class BackendFacts:
    """What a backend is, readable without importing its runtime (`Backend.facts`)."""

    runtime: str  # what it is, for messages: "ONNX Runtime"
    runs_on: str  # CPU or GPU: where its INT8 runs (CPU targets get the VNNI checks and notes)
    runtime_modules: tuple[str, ...]  # the Python modules its runner needs, checked before a bundle is opened
    install_hint: str  # how to install the runtime beside vitedge, to build
    runtime_install: str  # how to install it on a box with the runtime distribution only (vitedge-runtime)
    runtime_extra: str | None = None  # that distribution's extra installing it (packaging/runtime/pyproject.toml)
    # build() may run where check_environment() says it cannot build: the bundle then holds a plan
    # and the artifact is finished on the device (TensorRT without a GPU).
    builds_without_runtime: bool = False
    # Its runner opens an ONNX Q/DQ graph as it is, so the accuracy budget can run candidates on it.
    runs_qdq_graph: bool = True
    triton_platform: str | None = None  # Triton's `platform:` for its artifact (tensorrt_plan, onnxruntime_onnx)
    triton_backend: str | None = None  # or Triton's `backend:` (openvino)
    # its runtime hangs or crashes when two threads open models at once: vitedge.runtime.load opens one at a time
    open_serially: bool = False

    def __post_init__(self) -> None:
        if self.runs_on not in (CPU, GPU):
            raise ValueError(f"runs_on must be {CPU!r} or {GPU!r}, got {self.runs_on!r}")

    @property
    def on_cpu(self) -> bool:
        return self.runs_on == CPU

    def runtime_hint(self) -> str:
        """What to install on a runtime-only box to open this backend's bundles."""
        extra = f" (or: pip install 'vitedge-runtime[{self.runtime_extra}]')" if self.runtime_extra else ""
        return self.runtime_install + extra


@dataclass(frozen=True)
class EnvironmentStatus:
    """Whether a backend can build / run on this machine, and what to install if not."""

    can_build: bool
    can_run: bool
    detail: str  # versions found, or what is missing
    install_hint: str | None = None


O = TypeVar("O")  # a backend's typed options (a frozen dataclass of the profile's [backend_options])


@dataclass
class BuildContext(Generic[O]):
    """What every backend gets to build its artifact."""

    qdq_path: Path  # the one INT8 Q/DQ ONNX graph
    fp32_path: Path  # the FP32 ONNX graph it was calibrated from
    out_dir: Path  # the bundle folder being written (a temporary folder until the build succeeds)
    options: O  # the backend's own typed options, parsed from the profile
    batch_sizes: tuple[int, ...]
    log: Callable[[str], None] | None = None  # progress lines
    cpu_kind: str | None = None  # the CPU kind the bundle is for (vitedge.core.cpu.CPU_KINDS); None: this CPU's
    host_kind: str | None = None  # this CPU's kind as the runtime sees it (vitedge.core.cpu.cpu_kind); None: read it here


@dataclass
class BuiltArtifact:
    """The files a backend wrote into the bundle, relative to it."""

    model: str  # the artifact a runner opens (model.int8.onnx, model.xml, model.engine); == reference when it ships FP32 as is
    reference: str  # the FP32 model this backend runs for parity (same runtime)
    extra_files: list[str] = field(default_factory=list)
    built: bool = True  # False when the artifact must be finished on the device (TensorRT without a GPU)
    info: dict[str, Any] = field(default_factory=dict)  # backend facts for the manifest
    qdq: str | None = None  # the ONNX graph the bundle keeps as its Q/DQ graph; None: model.int8.onnx, the shared one


class Runner(ABC):
    """Runs one model on one runtime. Validation, benchmarks and the embedding runtime only see runners.

    Use as a context manager; `infer` checks its input, then calls `_infer_impl`.
    """

    input_name: str = "input"
    input_format: str = FLOAT_NCHW
    input_hw: tuple[int, int] | None = None
    input_channels: int = 3  # the graph's channel axis (1 for grayscale models)
    backend_name: str = "?"

    def __enter__(self) -> "Runner":
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:  # noqa: B027 - optional hook
        pass

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return self._infer_impl(self._checked(batch))

    def infer_all(self, batches: Iterable[np.ndarray]) -> Iterator[np.ndarray]:
        """The outputs of every batch, in order: one pass over a data set (validation's, the probe's).
        The same outputs as ``infer`` on each batch; a runtime that can keep several batches in flight
        (``OpenVinoRunner``) overrides it. Latency measurement keeps using ``infer``."""
        for batch in batches:
            yield self.infer(batch)

    def _checked(self, batch: np.ndarray) -> np.ndarray:
        expected_dtype = np.uint8 if self.input_format == UINT8_NHWC_RGB else np.float32
        if batch.dtype != expected_dtype:
            raise UsageError(f"{self.backend_name} runner expects {np.dtype(expected_dtype).name} input ({self.input_format}), got {batch.dtype}")
        if batch.ndim != 4:
            raise UsageError(f"{self.backend_name} runner expects a 4-D batch, got shape {batch.shape}")
        if self.input_hw is not None:
            hw = batch.shape[1:3] if self.input_format == UINT8_NHWC_RGB else batch.shape[2:4]
            channels = batch.shape[3] if self.input_format == UINT8_NHWC_RGB else batch.shape[1]
            if tuple(hw) != tuple(self.input_hw) or channels != self.input_channels:
                raise UsageError(f"{self.backend_name} runner expects {self.input_hw[0]}x{self.input_hw[1]}x{self.input_channels} inputs ({self.input_format}), got shape {batch.shape}")
        return np.ascontiguousarray(batch)

    @abstractmethod
    def _infer_impl(self, batch: np.ndarray) -> np.ndarray: ...


class Backend(ABC, Generic[O]):
    """Builds an artifact from the Q/DQ graph and opens runners on it; generic in its options type ``O``."""

    name: ClassVar[str]
    options_type: ClassVar[type]  # O: a dataclass of the profile's [backend_options]
    facts: ClassVar[BackendFacts]  # what it runs on, needs and installs; no runtime import to read it

    @abstractmethod
    def check_environment(self) -> EnvironmentStatus: ...

    @abstractmethod
    def build(self, ctx: BuildContext[O]) -> BuiltArtifact: ...

    @abstractmethod
    def open_runner(self, model_path: Path, options: O, *, threads: int | None = None) -> Runner: ...

    def shipped_graph(self, src: Path, role: str, options: O, out_dir: Path) -> Path:
        """The file this backend's ``build`` ships for the ONNX graph ``src`` (``role`` "model": the Q/DQ
        graph, "reference": the FP32 one), written under ``out_dir`` when it is not ``src`` itself. The
        accuracy budget runs these files, so validation can reuse its outputs of byte-identical ones.
        Default: ``src`` as it is."""
        return src

    def versions(self) -> dict[str, str]:
        return {}

    def timing_device(self) -> dict[str, Any]:
        """What this backend's latency is timed on, as validation reports record it (``latency.device``):
        `vitedge compare` compares two reports' milliseconds only when these agree. Default: this CPU."""
        return {"kind": "cpu", **timing_identity()}

    def report_lines(self, backend_info: dict[str, Any]) -> list[str]:
        """Markdown lines about the built artifact for report.md (none by default)."""
        return []

    def check_options(self, options: O) -> None:
        """Before any work: refuse [backend_options] this machine cannot honour (a one-line VitedgeError)."""


# name -> "module:Class" (imported on first use) or the Backend class itself.
_REGISTRY: dict[str, str | type[Backend]] = {
    "onnxruntime": "vitedge.backends.onnxruntime.backend:OnnxRuntimeBackend",
    "openvino": "vitedge.backends.openvino:OpenVinoBackend",
    "tensorrt": "vitedge.backends.tensorrt.backend:TensorRtBackend",
}
_INSTANCES: dict[str, Backend] = {}


def register_backend(name: str, backend: str | type[Backend]) -> None:
    """Make ``name`` a backend profiles can name: ``backend`` is the `Backend` subclass, or
    "module:Class" to import it on first use. Registering a name again replaces it."""
    if not isinstance(backend, str):
        if not (isinstance(backend, type) and issubclass(backend, Backend)):
            raise TypeError(f"register_backend({name!r}, ...) takes a Backend subclass or 'module:Class', got {backend!r}")
        if not isinstance(getattr(backend, "facts", None), BackendFacts):
            raise TypeError(f"{backend.__name__} has no `facts` (a BackendFacts); see vitedge.backends.base")
    _REGISTRY[name] = backend
    _INSTANCES.pop(name, None)


def unregister_backend(name: str) -> None:
    """Forget a backend ``register_backend`` added (no error if it is unknown)."""
    _REGISTRY.pop(name, None)
    _INSTANCES.pop(name, None)


def list_backends() -> list[str]:
    return sorted(_REGISTRY)


def backend_class(name: str) -> type[Backend]:
    """The Backend class registered as ``name``, imported if needed (its runtime is not)."""
    if name not in _REGISTRY:
        raise UsageError(f"unknown backend '{name}'; known: {', '.join(list_backends())}")
    target = _REGISTRY[name]
    if isinstance(target, str):
        module_name, class_name = target.split(":")
        target = getattr(importlib.import_module(module_name), class_name)
        if not isinstance(getattr(target, "facts", None), BackendFacts):
            raise TypeError(f"{module_name}:{class_name} has no `facts` (a BackendFacts); see vitedge.backends.base")
    return target


def backend_facts(name: str) -> BackendFacts:
    """The facts of backend ``name``, without importing its runtime."""
    return backend_class(name).facts


def get_backend(name: str) -> Backend:
    if name not in _INSTANCES:
        _INSTANCES[name] = backend_class(name)()
    return _INSTANCES[name]
