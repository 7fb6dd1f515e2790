"""Backends: how each runtime builds its artifact from the Q/DQ graph and runs it.

`get_backend(name)` looks a backend up in a registry; no if/elif over backend names.
Backend modules import their runtime (openvino, tensorrt) only when used.
"""

from vitedge.backends.base import (
    Backend,
    BuildContext,
    BuiltArtifact,
    EnvironmentStatus,
    Runner,
    get_backend,
    list_backends,
)

__all__ = ["Backend", "BuildContext", "BuiltArtifact", "EnvironmentStatus", "Runner", "get_backend", "list_backends"]
