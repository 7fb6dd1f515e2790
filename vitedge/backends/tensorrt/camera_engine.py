"""The engine for a camera app's own graph: DeepStream's nvinfer runs the bundle's Q/DQ graph with
the normalisation in front and a Softmax behind (vitedge.camera_apps.deepstream), so it needs an
engine of that graph, built with the same plan as the bundle's INT8 engine (`vitedge engine`
builds both). Without it nvinfer would build one itself, FP16 unless told INT8 (docs/camera-apps.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from vitedge.backends.tensorrt.apply import apply_plan, write_engine
from vitedge.backends.tensorrt.plan import (
    TIMING_CACHE,
    BuildPlan,
    GraphFacts,
    TensorRtOptions,
    capabilities_from_module,
    plan_build,
)
from vitedge.backends.tensorrt.typed import make_strongly_typed
from vitedge.onnxkit.files import save_onnx


def engine_precision(plan: BuildPlan) -> str:
    """One line: which precision the engine's layers run in."""
    if plan.strongly_typed:
        return "INT8 where the graph has Q/DQ, the other layers in the graph's own float types (strongly typed)"
    floats = "FP16" if "FP16" in plan.builder_flags else "FP32"
    pinned = " (LayerNorm pinned to FP32)" if plan.fp32_layers or plan.fp32_layer_types else ""
    return f"INT8 where the graph has Q/DQ, {floats} elsewhere{pinned}"


def build_graph_engine(trt: ModuleType, bundle_dir: Path, graph_rel: str, engine_rel: str, options: TensorRtOptions,
                       batch_sizes: tuple[int, ...], *, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Build ``engine_rel`` from ``graph_rel`` (both inside ``bundle_dir``) with the INT8 plan the
    bundle's own engine was built with; reuses the bundle's timing cache when it matches.
    Returns what the manifest records (backend_info.deepstream_engine)."""
    import onnx

    caps = capabilities_from_module(trt)
    source = bundle_dir / graph_rel
    model = onnx.load(str(source))
    plan = plan_build(options, batch_sizes, caps, graph=GraphFacts.from_model(model))
    onnx_path, typed_path = source, None
    if plan.typed_graph is not None:  # TensorRT 11: the strongly typed cast graph, as for the bundle's engine
        typed, _report = make_strongly_typed(model, **plan.typed_graph)
        typed_path = source.with_name(Path(engine_rel).stem + ".typed.onnx")  # never the bundle's own typed graph
        save_onnx(typed, typed_path)
        onnx_path = typed_path
    plan = dataclasses.replace(plan, graph=graph_rel, engine=engine_rel)
    cache_file = bundle_dir / TIMING_CACHE
    cache = cache_file.read_bytes() if plan.timing_cache and cache_file.is_file() else None
    try:
        result = apply_plan(trt, plan, onnx_path, timing_cache=cache, log=log)
    finally:
        if typed_path is not None:
            typed_path.unlink(missing_ok=True)
    write_engine(bundle_dir / engine_rel, result.engine)
    return {"engine": engine_rel, "graph": graph_rel, "tensorrt": str(getattr(trt, "__version__", caps.version)),
            "precision": engine_precision(plan), "builder_flags": list(plan.builder_flags),
            "strongly_typed": plan.strongly_typed,
            "profile": {"min": list(plan.profile_min), "opt": list(plan.profile_opt), "max": list(plan.profile_max)},
            "warnings": list(result.warnings)}
