"""Build TensorRT engines from a BuildPlan through TensorRT's Python API.

``apply_plan`` is the only code that talks to the builder. It receives the ``tensorrt``
module as a parameter, so the tests drive it with a recording stand-in for 8.6, 10.x
and 11.x and assert exactly which flags, pool limits, profiles, DLA settings and
precision constraints it asked for. INT8 always comes from the graph's Q/DQ nodes
(explicit quantization); no IInt8Calibrator is ever created.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from vitedge.backends.tensorrt.engine_inspect import one_line, summarize_layers
from vitedge.backends.tensorrt.plan import BuildPlan
from vitedge.core.errors import BundleError
from vitedge.files.atomic import atomic_write_path

if TYPE_CHECKING:
    import tensorrt

__all__ = ["EngineBuild", "apply_plan", "make_logger", "summarize_layers", "write_engine"]


@dataclass
class EngineBuild:
    """What one build produced and what TensorRT said about it."""

    engine: bytes
    timing_cache: bytes | None
    timing_cache_reused: bool
    fp32_layers: list[str] = field(default_factory=list)  # layers pinned to FP32 by precision constraints
    dla_fallback: list[str] | None = None  # layers the builder said cannot run on the DLA (-> GPU)
    layers: dict[str, Any] | None = None  # summary of the engine inspector's layer list
    warnings: list[str] = field(default_factory=list)

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"engine_bytes": len(self.engine), "timing_cache_reused": self.timing_cache_reused,
                               "fp32_layers": len(self.fp32_layers)}
        if self.dla_fallback is not None:
            out["dla_gpu_fallback_layers"] = list(self.dla_fallback)
        if self.layers is not None:
            out["engine_layers"] = self.layers
        if self.warnings:
            out["warnings"] = list(self.warnings)
        return out


def _enum(trt: ModuleType, enum_name: str, member: str) -> Any:
    enum = getattr(trt, enum_name)
    try:
        return getattr(enum, member)
    except AttributeError:
        version = getattr(trt, "__version__", "?")
        raise BundleError(f"TensorRT {version} has no {enum_name}.{member}; the build plan was made for another "
                          "TensorRT (rebuild it with `vitedge engine BUNDLE`, which plans for the TensorRT it finds)") from None


def _first_line(text: object, limit: int = 200) -> str:
    lines = str(text).strip().splitlines()
    return lines[0][:limit] if lines else ""


def make_logger(trt: ModuleType) -> Any:
    """An ILogger that keeps TensorRT's errors and warnings, so a failure can be reported in
    one line with TensorRT's own reason (TensorRT reports failures through the logger and a
    None/False return, not by raising)."""
    base = getattr(trt, "ILogger", None)
    if base is None:  # not seen in 8.6-11.x; keep the stock logger rather than fail here
        return trt.Logger(trt.Logger.WARNING)

    class CapturingLogger(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            base.__init__(self)
            self.errors: list[str] = []
            self.warnings: list[str] = []

        def log(self, severity: tensorrt.ILogger.Severity, msg: str) -> None:
            level = int(severity)
            if level <= int(base.Severity.ERROR):
                self.errors.append(_first_line(msg, 300))
            elif level == int(base.Severity.WARNING):
                self.warnings.append(_first_line(msg, 300))

    return CapturingLogger()


def last_error(logger: tensorrt.ILogger) -> str:
    errors = getattr(logger, "errors", None) or []
    return errors[-1] if errors else ""


def _parse_errors(parser: tensorrt.OnnxParser) -> list[str]:
    out = []
    for i in range(int(getattr(parser, "num_errors", 0) or 0)):
        try:
            err = parser.get_error(i)
        except Exception:
            break
        text = _first_line(err)
        if not text and hasattr(err, "desc"):
            text = _first_line(err.desc())
        if text:
            out.append(text)
    return out


def apply_plan(trt: ModuleType, plan: BuildPlan, onnx_path: Path | str, *, timing_cache: bytes | None = None,
               log: Callable[[str], None] | None = None, logger: tensorrt.ILogger | None = None,
               attention: list[dict[str, Any]] | None = None) -> EngineBuild:
    """Build the engine ``plan`` describes from ``onnx_path`` with the TensorRT module ``trt``.

    Every failure TensorRT reports (parser False, builder None, engine that does not
    deserialise) becomes one BundleError line carrying TensorRT's own first error.
    The steps, in TensorRT's call order: parse the graph into a network, configure the builder
    (flags, optimization profile), pin FP32 layers, place layers on the DLA, set hardware
    compatibility, attach the timing cache, build, then inspect the engine."""
    say = log or (lambda _msg: None)
    warnings: list[str] = []
    logger = logger if logger is not None else make_logger(trt)
    builder = trt.Builder(logger)
    network, parser = _parsed_network(trt, builder, logger, plan, Path(onnx_path))  # the parser owns the weights: keep it
    config = _builder_config(trt, builder, plan)
    fp32_layers = _constrain_fp32_layers(trt, network, plan, warnings) if plan.precision_constraints else []
    dla_fallback = _place_on_dla(trt, builder, network, config, plan, say) if plan.dla_core is not None else None
    if plan.hardware_compatibility != "none":
        member = {"ampere_plus": "AMPERE_PLUS", "same_compute_capability": "SAME_COMPUTE_CAPABILITY"}[plan.hardware_compatibility]
        config.hardware_compatibility_level = _enum(trt, "HardwareCompatibilityLevel", member)
    cache, reused = _attach_timing_cache(config, plan, timing_cache, warnings)
    engine = _build_serialized(trt, builder, network, config, logger, plan, Path(onnx_path), say)
    del parser
    cache_bytes = None
    if cache is not None:
        out_cache = config.get_timing_cache() if hasattr(config, "get_timing_cache") else cache
        cache_bytes = bytes(out_cache.serialize())
    layers = _inspect(trt, logger, engine, plan, warnings, attention)
    if layers is not None:
        say(f"{plan.engine}: " + one_line(layers))
    return EngineBuild(engine=engine, timing_cache=cache_bytes, timing_cache_reused=reused, fp32_layers=fp32_layers,
                       dla_fallback=dla_fallback, layers=layers, warnings=warnings)


def _parsed_network(trt: ModuleType, builder: tensorrt.Builder, logger: tensorrt.ILogger, plan: BuildPlan, onnx_path: Path) -> tuple[Any, Any]:
    """(network, parser): the ONNX graph parsed into a network with the plan's creation flags."""
    flags = 0
    for name in plan.network_flags:
        flags |= 1 << int(_enum(trt, "NetworkDefinitionCreationFlag", name))
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    # parse_from_file resolves external weight files relative to the model (graphs > 2 GB).
    if not parser.parse_from_file(str(onnx_path)):
        errors = _parse_errors(parser) or ([last_error(logger)] if last_error(logger) else [])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        raise BundleError(f"TensorRT {getattr(trt, '__version__', '?')}'s ONNX parser rejected {onnx_path.name}: "
                          + ("; ".join(errors[:3]) or "no detail given") + more
                          + "; the graph uses something this TensorRT cannot import (rebuild the bundle with a supported opset/ops)")
    return network, parser


def _builder_config(trt: ModuleType, builder: tensorrt.Builder, plan: BuildPlan) -> Any:
    """The builder config: workspace, optimization level, builder flags set and cleared, profiling
    verbosity, and the one optimization profile (min/opt/max batch)."""
    config = builder.create_builder_config()
    # set_memory_pool_limit is in every supported version (8.6+); max_workspace_size is gone from 10.0 (surface/).
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(plan.workspace_bytes))
    if plan.optimization_level is not None:
        config.builder_optimization_level = int(plan.optimization_level)
    for name in plan.builder_flags:
        config.set_flag(_enum(trt, "BuilderFlag", name))
    for name in plan.cleared_flags:
        if hasattr(trt.BuilderFlag, name):
            config.clear_flag(getattr(trt.BuilderFlag, name))
    if plan.profiling_verbosity and hasattr(trt, "ProfilingVerbosity"):
        config.profiling_verbosity = _enum(trt, "ProfilingVerbosity", plan.profiling_verbosity)
    profile = builder.create_optimization_profile()
    profile.set_shape(plan.input_name, tuple(plan.profile_min), tuple(plan.profile_opt), tuple(plan.profile_max))
    config.add_optimization_profile(profile)
    return config


def _place_on_dla(trt: ModuleType, builder: tensorrt.Builder, network: tensorrt.INetworkDefinition, config: tensorrt.IBuilderConfig, plan: BuildPlan, say: Callable[[str], None]) -> list[str]:
    """Make the plan's DLA core the default device; returns the layers that cannot run on it."""
    cores = int(getattr(builder, "num_DLA_cores", 0) or 0)
    if plan.dla_core >= cores:
        raise BundleError(f"dla_core = {plan.dla_core} but this device has {cores} DLA core(s) "
                          "(DLA exists on Jetson AGX Orin and Xavier only); set dla_core = -1 in the profile")
    config.default_device_type = trt.DeviceType.DLA
    config.DLA_core = int(plan.dla_core)
    fallback = [network.get_layer(i).name for i in range(network.num_layers)
                if not config.can_run_on_DLA(network.get_layer(i))]
    say(f"DLA core {plan.dla_core}: {network.num_layers - len(fallback)} of {network.num_layers} layers can run on the DLA"
        + (", the rest fall back to the GPU" if plan.gpu_fallback else ""))
    return fallback


def _attach_timing_cache(config: tensorrt.IBuilderConfig, plan: BuildPlan, saved: bytes | None, warnings: list[str]) -> tuple[Any, bool]:
    """(the timing cache the build fills, or None; whether the saved one was reused)."""
    if not plan.timing_cache:
        return None, False
    cache = config.create_timing_cache(saved or b"")
    # ignore_mismatch=False: a cache from another device or TensorRT is rejected, not trusted.
    if config.set_timing_cache(cache, False) is False:
        warnings.append("the saved timing cache does not match this device/TensorRT; started a fresh one")
        cache = config.create_timing_cache(b"")
        config.set_timing_cache(cache, False)
        return cache, False
    return cache, bool(saved)


def _build_serialized(trt: ModuleType, builder: tensorrt.Builder, network: tensorrt.INetworkDefinition, config: tensorrt.IBuilderConfig, logger: tensorrt.ILogger, plan: BuildPlan, onnx_path: Path,
                      say: Callable[[str], None]) -> bytes:
    say(f"building {plan.engine} with TensorRT {getattr(trt, '__version__', '?')} ({plan.role}); this takes a while")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        why = last_error(logger) or "TensorRT gave no reason"
        raise BundleError(f"TensorRT {getattr(trt, '__version__', '?')} could not build {plan.engine} from {onnx_path.name}: {why}")
    return bytes(serialized)


def _constrain_fp32_layers(trt: ModuleType, network: tensorrt.INetworkDefinition, plan: BuildPlan, warnings: list[str]) -> list[str]:
    """Pin the normalization layers (and any named in the plan) to FP32 (8.6-10.x)."""
    wanted = set(plan.fp32_layers)
    types = {getattr(trt.LayerType, t) for t in plan.fp32_layer_types if hasattr(trt.LayerType, t)}
    done: list[str] = []
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if layer.name not in wanted and layer.type not in types:
            continue
        layer.precision = trt.float32
        for j in range(layer.num_outputs):
            layer.set_output_type(j, trt.float32)
        done.append(layer.name)
    missing = wanted - set(done)
    if missing:
        warnings.append(f"{len(missing)} LayerNorm node(s) not found by name in the TensorRT network (the parser renamed "
                        "or fused them); they are not pinned to FP32: " + ", ".join(sorted(missing)[:3]))
    return done


def _inspect(trt: ModuleType, logger: tensorrt.ILogger, engine_bytes: bytes, plan: BuildPlan, warnings: list[str],
             attention: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """Per-layer facts from the engine inspector. The engine just built must deserialise
    here (same TensorRT, same GPU): when it does not, the build failed."""
    runtime = trt.Runtime(logger)
    if plan.version_compatible and hasattr(runtime, "engine_host_code_allowed"):
        runtime.engine_host_code_allowed = True  # the plan embeds the lean runtime
    engine = runtime.deserialize_cuda_engine(engine_bytes)
    if engine is None:
        raise BundleError(f"TensorRT {getattr(trt, '__version__', '?')} built {plan.engine} but cannot deserialise it: "
                          + (last_error(logger) or "no reason given") + "; nothing was written")
    if not hasattr(engine, "create_engine_inspector"):
        warnings.append("this TensorRT has no engine inspector: per-layer precision and MHA fusion are not reported")
        return None
    try:
        inspector = engine.create_engine_inspector()
        bound = _bind_opt_context(engine, inspector, plan, warnings)
        text = inspector.get_engine_information(trt.LayerInformationFormat.JSON)
        return summarize_layers(json.loads(text), attention, context_bound=bound)
    except Exception as err:  # the engine is fine; only the report is missing
        warnings.append(f"engine inspector unavailable: {type(err).__name__}: {_first_line(err, 120)}")
        return None


def _bind_opt_context(engine: tensorrt.ICudaEngine, inspector: tensorrt.EngineInspector, plan: BuildPlan, warnings: list[str]) -> bool:
    """Give the inspector an execution context with the input at the profile's opt shape. Without one,
    an engine with a dynamic profile reports "N/A due to dynamic shapes" for every tensor's format and
    type (TensorRT's Engine Inspector docs: ``inspector.execution_context = context``). The opt shape is
    the one the builder tuned the kernels for."""
    context = engine.create_execution_context()
    if context is None:
        warnings.append("no execution context for the engine inspector (out of GPU memory?): "
                        "tensor precisions of a dynamic-shape engine are not reported")
        return False
    if context.set_input_shape(plan.input_name, tuple(plan.profile_opt)) is False:
        warnings.append(f"the engine refused its own opt shape {tuple(plan.profile_opt)} for the inspector")
        return False
    inspector.execution_context = context
    return True


def write_engine(path: Path, data: bytes) -> None:

    with atomic_write_path(path) as tmp:
        tmp.write_bytes(data)
