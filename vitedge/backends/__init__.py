"""Backends: how each runtime builds its artifact from the Q/DQ graph and runs it.

`get_backend(name)` looks a backend up in a registry; no if/elif over backend names.
Each backend class carries its `BackendFacts` (what it runs on, its runtime, install hints,
Triton names), read with `backend_facts(name)` without importing the runtime.
Backend modules import their runtime (onnxruntime, openvino, tensorrt) only when used.
A new backend: see vitedge/backends/base.py (`register_backend`).
"""

from vitedge.backends.base import (
    CPU,
    GPU,
    Backend,
    BackendFacts,
    BuildContext,
    BuiltArtifact,
    EnvironmentStatus,
    Runner,
    backend_class,
    backend_facts,
    get_backend,
    list_backends,
    register_backend,
    unregister_backend,
)

__all__ = ["CPU", "GPU", "Backend", "BackendFacts", "BuildContext", "BuiltArtifact", "EnvironmentStatus", "Runner",
           "backend_class", "backend_facts", "get_backend", "list_backends", "register_backend", "unregister_backend"]
