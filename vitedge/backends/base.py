"""The backend and runner interfaces, and the registry that maps names to backends."""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitedge.errors import UsageError
from vitedge.onnxutil import FLOAT_NCHW, UINT8_NHWC_RGB


@dataclass(frozen=True)
class EnvironmentStatus:
    """Whether a backend can build / run on this machine, and what to install if not."""

    can_build: bool
    can_run: bool
    detail: str  # versions found, or what is missing
    install_hint: str | None = None


@dataclass
class BuildContext:
    """What every backend gets to build its artifact."""

    qdq_path: Path  # the one INT8 Q/DQ ONNX graph
    fp32_path: Path  # the FP32 ONNX graph it was calibrated from
    out_dir: Path  # the bundle folder being written (a temporary folder until the build succeeds)
    options: Any  # the backend's own typed options, parsed from the profile
    batch_sizes: tuple[int, ...]
    log: Any = None  # callable(str) for progress lines


@dataclass
class BuiltArtifact:
    """The files a backend wrote into the bundle, relative to it."""

    model: str  # the artifact a runner opens (model.int8.onnx, model.xml, model.engine)
    reference: str  # the FP32 model this backend runs for parity (same runtime)
    extra_files: list[str] = field(default_factory=list)
    built: bool = True  # False when the artifact must be finished on the device (TensorRT without a GPU)
    info: dict[str, Any] = field(default_factory=dict)  # backend facts for the manifest


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
        return self._infer_impl(np.ascontiguousarray(batch))

    @abstractmethod
    def _infer_impl(self, batch: np.ndarray) -> np.ndarray: ...


class Backend(ABC):
    """Builds an artifact from the Q/DQ graph and opens runners on it."""

    name: str
    options_type: type  # a dataclass of the profile's [backend_options]

    @abstractmethod
    def check_environment(self) -> EnvironmentStatus: ...

    @abstractmethod
    def build(self, ctx: BuildContext) -> BuiltArtifact: ...

    @abstractmethod
    def open_runner(self, model_path: Path, options: Any, *, threads: int | None = None) -> Runner: ...

    def versions(self) -> dict[str, str]:
        return {}

    def report_lines(self, backend_info: dict[str, Any]) -> list[str]:
        """Markdown lines about the built artifact for report.md (none by default)."""
        return []

    def check_options(self, options: Any) -> None:
        """Before any work: refuse [backend_options] this machine cannot honour (a one-line VitedgeError)."""


# name -> "module:Class"; modules are imported on first use.
_REGISTRY: dict[str, str] = {
    "onnxruntime": "vitedge.backends.onnxruntime:OnnxRuntimeBackend",
    "openvino": "vitedge.backends.openvino:OpenVinoBackend",
    "tensorrt": "vitedge.backends.tensorrt.backend:TensorRtBackend",
}
_INSTANCES: dict[str, Backend] = {}


def register_backend(name: str, target: str) -> None:
    _REGISTRY[name] = target
    _INSTANCES.pop(name, None)


def list_backends() -> list[str]:
    return sorted(_REGISTRY)


def get_backend(name: str) -> Backend:
    if name not in _REGISTRY:
        raise UsageError(f"unknown backend '{name}'; known: {', '.join(list_backends())}")
    if name not in _INSTANCES:
        module_name, class_name = _REGISTRY[name].split(":")
        _INSTANCES[name] = getattr(importlib.import_module(module_name), class_name)()
    return _INSTANCES[name]
