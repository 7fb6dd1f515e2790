"""How a camera app serves a bundle's artifact, as its backend says (`ServedBy`).

Camera apps sit below the backends in the layers, so they never look a backend up: the caller
in a higher layer hands in the bundle backend's facts (`vitedge.backends.BackendFacts`, which
has these fields), and the functions here read only what Triton and DeepStream need from them.
"""

from __future__ import annotations

from typing import Protocol

from vitedge.bundle.manifest import Manifest

# Triton's platform for TensorRT engines: the artifact is an engine nvinfer and Triton load as such.
TENSORRT_PLAN = "tensorrt_plan"


class ServedBy(Protocol):
    """The facts of a bundle's backend that camera apps read (vitedge.backends.BackendFacts)."""

    @property
    def runs_on(self) -> str: ...  # "cpu" or "gpu": Triton's instance kind

    @property
    def triton_platform(self) -> str | None: ...  # config.pbtxt `platform:`

    @property
    def triton_backend(self) -> str | None: ...  # or config.pbtxt `backend:`


def tensorrt_engine(served: ServedBy) -> bool:
    """Is the bundle's artifact a TensorRT engine (so nvinfer can load it, and NVIDIA bundles carry camera/)?"""
    return served.triton_platform == TENSORRT_PLAN


def dla_core_of(manifest: Manifest) -> int | None:
    """The DLA core the bundle's engine runs on (its profile's ``dla_core`` >= 0), else None."""
    options = (manifest.target.profile or {}).get("backend_options") or {}
    core = options.get("dla_core")
    return int(core) if core is not None and int(core) >= 0 else None


def dla_static_batch(manifest: Manifest) -> int:
    """The one batch a DLA engine takes: the DLA needs static shapes, so the plan builds for the
    profile's opt batch, else its largest (vitedge.backends.tensorrt.plan, ``_dla``)."""
    profile = manifest.target.profile or {}
    options = profile.get("backend_options") or {}
    return int(options.get("opt_batch") or max(int(b) for b in profile.get("batch_sizes") or [1]))
