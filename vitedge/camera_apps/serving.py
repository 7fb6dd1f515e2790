"""How a camera app serves a bundle's artifact, as its backend says (`ServedBy`).

Camera apps sit below the backends in the layers, so they never look a backend up: the caller
in a higher layer hands in the bundle backend's facts (`vitedge.backends.BackendFacts`, which
has these fields), and the functions here read only what Triton and DeepStream need from them.
"""

from __future__ import annotations

from typing import Protocol

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
