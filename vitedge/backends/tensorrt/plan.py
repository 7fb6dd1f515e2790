"""TensorRT build settings: profile options -> a typed, serialisable BuildPlan.

``plan_build`` is pure: it reads the profile's [backend_options], the batch sizes and
what the TensorRT at hand can do (``TrtCapabilities``, found by feature detection on
the ``tensorrt`` module, or assumed for a TensorRT major when none is installed) and
decides every builder setting. ``build.apply_plan`` then asks TensorRT for
exactly those settings, and ``trtexec_command`` writes the same plan as a trtexec line,
so the engine can be built on a device where only trtexec exists.

Version differences this encodes (TensorRT API docs and migration guides, see
docs/tensorrt.md):
* 8.6-10.11 ("weakly typed"): INT8 comes from the Q/DQ nodes (explicit quantization);
  BuilderFlag.INT8 lets TensorRT use those INT8 kernels and BuilderFlag.FP16 lets the
  float regions run in FP16; LayerNorm is pinned to FP32 with per-layer precision plus
  OBEY_PRECISION_CONSTRAINTS.
* 11.x: BuilderFlag.INT8/FP16 and the precision-constraint flags are gone; networks are
  strongly typed, so the float regions carry their own casts (typed.py writes that graph).
* 10.12-10.x: the weak-typing flags are deprecated ("Superseded by strong typing"), so the strongly
  typed path is taken there too, with STRONGLY_TYPED (11 deprecated that flag: always on).
* DLA exists on Jetson AGX Orin / Orin NX / Xavier only, in TensorRT 8.6-10.7 and 11.4.1+ (on AGX
  Orin with JetPack 7.2.2+), and takes static shapes: a DLA plan builds for one batch size.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from vitedge.backends.tensorrt import versions as tv
from vitedge.backends.tensorrt.versions import trtexec_flag_available
from vitedge.core.errors import UsageError
from vitedge.files.atomic import atomic_write_path
from vitedge.core.limits import MAX_BATCH, MAX_DLA_CORE, MAX_WORKSPACE_MB, check_number
from vitedge.onnxkit.structure import graph_inputs, opset_version

if TYPE_CHECKING:
    from onnx import ModelProto

FLOAT_PRECISIONS = ("fp16", "fp32")
HARDWARE_COMPAT = ("none", "ampere_plus", "same_compute_capability")
TRT_MAJORS = (0, 8, 10, 11)  # 0 = use the installed TensorRT; otherwise what the device runs
DEFAULT_ASSUMED_MAJOR = 10  # JetPack 6 and current desktop wheels
MAX_OPT_LEVEL = 5

ENGINE = "model.engine"
REFERENCE_ENGINE = "reference.fp32.engine"
QDQ_GRAPH = "model.int8.onnx"
TYPED_GRAPH = "model.int8.typed.onnx"
REFERENCE_GRAPH = "reference.fp32.onnx"
TIMING_CACHE = "timing.cache"
PLAN_FILE = "build_plan.json"
TRTEXEC_FILE = "trtexec.txt"

_HW_ENUM = {"ampere_plus": "AMPERE_PLUS", "same_compute_capability": "SAME_COMPUTE_CAPABILITY"}
_HW_TRTEXEC = {"ampere_plus": "ampere+", "same_compute_capability": "sameComputeCapability"}


@dataclass(frozen=True)
class TensorRtOptions:
    """[backend_options] of a tensorrt profile. These fields are the allowed keys."""

    workspace_mb: int = 2048  # builder memory-pool limit (MemoryPoolType.WORKSPACE)
    builder_optimization_level: int = 3  # 0-5; 3 is TensorRT's default
    opt_batch: int = 0  # batch the optimization profile is tuned for; 0 = the largest of batch_sizes
    float_precision: str = "fp16"  # precision of the layers outside Q/DQ: fp16 or fp32
    layernorm_fp32: bool = True  # keep LayerNorm in FP32 (FP16 LayerNorm overflows on ViTs)
    timing_cache: bool = True  # save the timing cache in the bundle and reuse it on rebuilds
    dla_core: int = -1  # >= 0: run on that DLA core (Jetson AGX Orin / Xavier), GPU fallback per gpu_fallback
    gpu_fallback: bool = True  # with a DLA core: layers the DLA cannot run go to the GPU
    hardware_compatibility: str = "none"  # none | ampere_plus | same_compute_capability
    version_compatible: bool = False  # engine loads on later TensorRT versions too (slower)
    trt_major: int = 0  # where TensorRT is absent: the major the device runs (8, 10, 11); 0 = assume 10

    def __post_init__(self) -> None:
        check_number("workspace_mb", self.workspace_mb, 1, MAX_WORKSPACE_MB, integer=True)
        if not 0 <= self.builder_optimization_level <= MAX_OPT_LEVEL:
            raise UsageError(f"builder_optimization_level must be 0-{MAX_OPT_LEVEL}, got {self.builder_optimization_level}")
        check_number("opt_batch (0 = the largest batch size)", self.opt_batch, 0, MAX_BATCH, integer=True)
        if self.float_precision not in FLOAT_PRECISIONS:
            raise UsageError(f"float_precision must be one of {', '.join(FLOAT_PRECISIONS)}, got '{self.float_precision}'")
        check_number("dla_core (-1 = no DLA)", self.dla_core, -1, MAX_DLA_CORE, integer=True)
        if self.hardware_compatibility not in HARDWARE_COMPAT:
            raise UsageError(f"hardware_compatibility must be one of {', '.join(HARDWARE_COMPAT)}, got '{self.hardware_compatibility}'")
        if self.trt_major not in TRT_MAJORS:
            raise UsageError(f"trt_major must be one of {', '.join(map(str, TRT_MAJORS))} (0 = assume {DEFAULT_ASSUMED_MAJOR}), got {self.trt_major}")


@dataclass(frozen=True)
class TrtCapabilities:
    """What one TensorRT can do, found by feature detection (or assumed for a major)."""

    version: str
    major: int
    minor: int
    assumed: bool = False  # True: no TensorRT here; these are the documented features of that major
    int8_flag: bool = True  # BuilderFlag.INT8 (gone in 11)
    fp16_flag: bool = True  # BuilderFlag.FP16 (gone in 11)
    tf32_flag: bool = True
    precision_constraints: bool = True  # OBEY/PREFER_PRECISION_CONSTRAINTS (gone in 11)
    strongly_typed_flag: bool = False  # NetworkDefinitionCreationFlag.STRONGLY_TYPED to pass (10.x; deprecated no-op in 11)
    explicit_batch_flag: bool = False  # needed on 8.x, deprecated in 10, gone in 11
    memory_pool: bool = True  # IBuilderConfig.set_memory_pool_limit
    optimization_level: bool = True  # IBuilderConfig.builder_optimization_level (8.6+)
    hardware_levels: tuple[str, ...] = ("ampere_plus",)  # HardwareCompatibilityLevel members
    version_compatible: bool = True  # BuilderFlag.VERSION_COMPATIBLE (8.6+)
    dla: bool = True  # DLA usable through this TensorRT (8.6-10.7 and 11.4.1+; versions.dla_available)
    strong_typing_preferred: bool = False  # 10.12+: the weak-typing flags are deprecated, superseded by strong typing
    gpu_fallback_flag: bool = True
    timing_cache: bool = True
    engine_inspector: bool = True

    @property
    def weakly_typed(self) -> bool:
        """The 8.6-10.11 path: BuilderFlag.INT8/FP16 exist and are not yet deprecated. From 10.12 on
        they are deprecated ("Superseded by strong typing", the bindings' docstrings) and in 11 gone,
        so vitedge builds strongly typed networks there."""
        return self.int8_flag and self.fp16_flag and not self.strong_typing_preferred

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _has(obj: Any, name: str) -> bool:
    try:
        return hasattr(obj, name)
    except Exception:
        return False


def parse_version(text: str) -> tuple[int, int]:
    parts = (str(text).split("+")[0].split(".") + ["0", "0"])[:2]
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        raise UsageError(f"cannot read a TensorRT version from '{text}'") from None


def capabilities_from_module(trt: ModuleType) -> TrtCapabilities:
    """Feature-detect a ``tensorrt`` module (or a stand-in with the same names)."""
    version = str(getattr(trt, "__version__", "0.0"))
    major, minor = parse_version(version)
    flags = getattr(trt, "BuilderFlag", None)
    net_flags = getattr(trt, "NetworkDefinitionCreationFlag", None)
    config_cls = getattr(trt, "IBuilderConfig", None)
    levels = getattr(trt, "HardwareCompatibilityLevel", None)
    device = getattr(trt, "DeviceType", None)
    hardware = tuple(k for k, enum_name in _HW_ENUM.items() if levels is not None and _has(levels, enum_name))
    return TrtCapabilities(
        version=version,
        major=major,
        minor=minor,
        assumed=False,
        int8_flag=_has(flags, "INT8"),
        fp16_flag=_has(flags, "FP16"),
        tf32_flag=_has(flags, "TF32"),
        precision_constraints=_has(flags, "OBEY_PRECISION_CONSTRAINTS"),
        # 11.0 deprecated the flag: "Strongly typed mode is always enabled ... ignored" (the bindings' docstring)
        strongly_typed_flag=_has(net_flags, "STRONGLY_TYPED") and major < 11,
        explicit_batch_flag=_has(net_flags, "EXPLICIT_BATCH") and major < 10,
        memory_pool=_has(config_cls, "set_memory_pool_limit") and _has(trt, "MemoryPoolType"),
        optimization_level=_has(config_cls, "builder_optimization_level"),
        hardware_levels=hardware,
        version_compatible=_has(flags, "VERSION_COMPATIBLE"),
        # DeviceType.DLA is in every version's bindings; DLA itself is not (10.8-11.4.0: release notes).
        dla=_has(device, "DLA") and tv.dla_available(tv.parse_release(version)),
        strong_typing_preferred=(major, minor) >= tv.STRONG_TYPING_FROM,
        gpu_fallback_flag=_has(flags, "GPU_FALLBACK"),
        timing_cache=_has(config_cls, "create_timing_cache"),
        engine_inspector=_has(getattr(trt, "ICudaEngine", None), "create_engine_inspector"),
    )


def assumed_capabilities(major: int) -> TrtCapabilities:
    """The features of the TensorRT vitedge assumes for a major (versions.ASSUMED_VERSION: 8 -> 8.6.1,
    10 -> 10.3.0 as in JetPack 6.1, 11 -> 11.4.1), for planning where none is installed. They are
    feature-detected on the API surface recorded from that version's real bindings."""

    major = int(major or DEFAULT_ASSUMED_MAJOR)
    if major not in tv.ASSUMED_VERSION:
        raise UsageError(f"no TensorRT {major} features are known to vitedge; use 8, 10 or 11")
    release, _why = tv.ASSUMED_VERSION[major]
    return dataclasses.replace(capabilities_from_module(tv.surface_module(release)), assumed=True)


@dataclass(frozen=True)
class GraphFacts:
    """What the plan needs to know about the Q/DQ graph."""

    input_name: str = "input"
    input_shape: tuple[int, int, int] = (3, 224, 224)  # per-sample shape (C, H, W), or (H, W, 3) for uint8 frames
    input_dtype: str = "float32"
    layernorm_layers: tuple[str, ...] = ()  # LayerNormalization node names (TensorRT names layers after them)
    opset: int = 17

    @classmethod
    def from_model(cls, model: ModelProto) -> "GraphFacts":
        from onnx import TensorProto

        inputs = graph_inputs(model)
        if not inputs:
            raise UsageError("the Q/DQ graph has no input")
        inp = inputs[0]
        dims = [d.dim_value if d.HasField("dim_value") else None for d in inp.type.tensor_type.shape.dim]
        if len(dims) != 4 or any(d is None for d in dims[1:]):
            raise UsageError(f"the graph input '{inp.name}' must be 4-D with fixed per-sample dims (got {dims}); "
                             "TensorRT's optimization profile varies only the batch")
        elem = inp.type.tensor_type.elem_type
        opset = opset_version(model)
        return cls(
            input_name=inp.name,
            input_shape=tuple(int(d) for d in dims[1:]),
            input_dtype="uint8" if elem == TensorProto.UINT8 else "float32",
            layernorm_layers=tuple(n.name for n in model.graph.node if n.op_type == "LayerNormalization" and n.name),
            opset=int(opset),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class BuildPlan:
    """Every setting one engine build asks TensorRT for. Serialises to build_plan.json."""

    role: str  # "int8" (the deployed engine) or "fp32-reference" (the parity baseline)
    trt_version: str
    trt_major: int
    capabilities_assumed: bool
    graph: str  # ONNX file in the bundle the engine is parsed from
    engine: str  # engine file written into the bundle
    strongly_typed: bool
    network_flags: tuple[str, ...]  # NetworkDefinitionCreationFlag names
    builder_flags: tuple[str, ...]  # BuilderFlag names to set
    cleared_flags: tuple[str, ...]  # BuilderFlag names to clear
    workspace_bytes: int
    optimization_level: int | None  # None: this TensorRT has no builder_optimization_level
    input_name: str
    profile_min: tuple[int, ...]
    profile_opt: tuple[int, ...]
    profile_max: tuple[int, ...]
    fp32_layers: tuple[str, ...]  # layers pinned to FP32 with precision constraints (8.6-10.x)
    fp32_layer_types: tuple[str, ...]  # LayerType names pinned to FP32 (NORMALIZATION), whatever their names
    precision_constraints: str | None  # "obey" | "prefer" | None
    typed_graph: dict[str, Any] | None  # strongly typed cast-graph pass settings (11.x), None when not used
    dla_core: int | None
    gpu_fallback: bool
    hardware_compatibility: str
    version_compatible: bool
    timing_cache: str | None
    profiling_verbosity: str = "DETAILED"  # so the engine inspector can say where each layer runs
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for key, value in d.items():
            if isinstance(value, tuple):
                d[key] = list(value)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BuildPlan":
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k in names}
        return cls(**values)

    def batch_range(self) -> tuple[int, int, int]:
        return self.profile_min[0], self.profile_opt[0], self.profile_max[0]


def plan_build(profile_options: TensorRtOptions, batch_sizes: tuple[int, ...] | list[int], trt_capabilities: TrtCapabilities,
               *, graph: GraphFacts | None = None) -> BuildPlan:
    """Decide every builder setting of the INT8 engine. Pure: no TensorRT, no files.

    The steps, in the order their errors are raised: the batch range, the TensorRT release, the
    precision (typed graph or builder flags), the DLA, the compatibility modes. Builder flags and
    notes are appended in that order too."""
    o, caps = profile_options, trt_capabilities
    graph = graph or GraphFacts()
    lo, opt, hi = _batch_range(o, batch_sizes)
    _check_release(caps)
    notes: list[str] = []
    precision = _precision(o, caps, graph, notes)
    builder = list(precision.builder_flags)
    dla = _dla(o, caps, (lo, opt, hi), builder, notes)
    if dla.static_batch is not None:
        lo = hi = dla.static_batch
    _compatibility(o, caps, builder, notes)
    timing = TIMING_CACHE if (o.timing_cache and caps.timing_cache) else None
    c_h_w = tuple(graph.input_shape)
    return BuildPlan(
        role="int8",
        trt_version=caps.version,
        trt_major=caps.major,
        capabilities_assumed=caps.assumed,
        graph=precision.graph_file,
        engine=ENGINE,
        strongly_typed=precision.strongly_typed,
        network_flags=_network_flags(caps, precision.strongly_typed),
        builder_flags=tuple(builder),
        cleared_flags=(),
        workspace_bytes=int(o.workspace_mb) << 20,
        optimization_level=o.builder_optimization_level if caps.optimization_level else None,
        input_name=graph.input_name,
        profile_min=(lo,) + c_h_w,
        profile_opt=(opt,) + c_h_w,
        profile_max=(hi,) + c_h_w,
        fp32_layers=precision.fp32_layers,
        fp32_layer_types=precision.fp32_layer_types,
        precision_constraints=precision.constraints,
        typed_graph=precision.typed_graph,
        dla_core=dla.core,
        gpu_fallback=dla.gpu_fallback,
        hardware_compatibility=o.hardware_compatibility,
        version_compatible=o.version_compatible,
        timing_cache=timing,
        notes=tuple(notes),
    )


def _batch_range(o: TensorRtOptions, batch_sizes: tuple[int, ...] | list[int]) -> tuple[int, int, int]:
    """(min, opt, max) batch of the optimization profile."""
    sizes = sorted({int(b) for b in batch_sizes})
    if not sizes or sizes[0] < 1:
        raise UsageError(f"batch_sizes must be positive integers, got {list(batch_sizes)}")
    lo, hi = sizes[0], sizes[-1]
    opt = o.opt_batch or hi
    if not lo <= opt <= hi:
        raise UsageError(f"opt_batch {o.opt_batch} lies outside the profile's batch sizes {lo}-{hi}")
    return lo, opt, hi


def _check_release(caps: TrtCapabilities) -> None:
    if caps.major < 8 or (caps.major == 8 and caps.minor < 6):
        raise UsageError(f"TensorRT {caps.version} is too old: vitedge needs 8.6 or newer (explicit quantization, "
                         "optimization levels, version compatibility); JetPack 5 ships 8.5, use JetPack 6")


@dataclass(frozen=True)
class _PrecisionPlan:
    """How the float regions get their precision: a strongly typed graph, or builder flags (weakly typed)."""

    strongly_typed: bool
    graph_file: str = QDQ_GRAPH
    typed_graph: dict[str, Any] | None = None
    builder_flags: tuple[str, ...] = ()
    fp32_layers: tuple[str, ...] = ()
    fp32_layer_types: tuple[str, ...] = ()
    constraints: str | None = None


def _precision(o: TensorRtOptions, caps: TrtCapabilities, graph: GraphFacts, notes: list[str]) -> _PrecisionPlan:
    """INT8 always comes from the graph's Q/DQ nodes; never a calibrator. This decides the float regions."""
    if not caps.weakly_typed:
        if o.float_precision != "fp16":
            notes.append("strongly typed network: float regions stay FP32 as in the Q/DQ graph")
            return _PrecisionPlan(strongly_typed=True)
        notes.append("strongly typed network: the float regions of the graph were cast to FP16 by vitedge"
                     + ("; LayerNorm stays FP32 between casts" if o.layernorm_fp32 else ""))
        return _PrecisionPlan(strongly_typed=True, graph_file=TYPED_GRAPH,
                              typed_graph={"float_precision": "fp16", "layernorm_fp32": o.layernorm_fp32})
    if o.float_precision != "fp16":
        return _PrecisionPlan(strongly_typed=False, builder_flags=("INT8",))
    if not o.layernorm_fp32:
        return _PrecisionPlan(strongly_typed=False, builder_flags=("INT8", "FP16"))
    if not caps.precision_constraints:
        raise UsageError(f"TensorRT {caps.version} has no precision constraints to keep LayerNorm in FP32")
    return _PrecisionPlan(strongly_typed=False, builder_flags=("INT8", "FP16", "OBEY_PRECISION_CONSTRAINTS"),
                          fp32_layers=graph.layernorm_layers, fp32_layer_types=("NORMALIZATION",), constraints="obey")


def _network_flags(caps: TrtCapabilities, strongly_typed: bool) -> tuple[str, ...]:
    flags: list[str] = []
    if caps.explicit_batch_flag:
        flags.append("EXPLICIT_BATCH")
    if strongly_typed and caps.strongly_typed_flag:
        flags.append("STRONGLY_TYPED")  # required on 10.x; not passed on 11, where it is deprecated and ignored
    return tuple(flags)


@dataclass(frozen=True)
class _DlaPlan:
    core: int | None = None
    gpu_fallback: bool = False
    static_batch: int | None = None  # the one batch size of a DLA plan (min = opt = max), when the profile has several


def _dla(o: TensorRtOptions, caps: TrtCapabilities, batches: tuple[int, int, int], builder: list[str], notes: list[str]) -> _DlaPlan:
    """The DLA (Jetson AGX Orin / Xavier), when the profile names a core."""
    if o.dla_core < 0:
        return _DlaPlan()
    if not caps.dla:
        raise UsageError(f"dla_core={o.dla_core} needs DLA support, which TensorRT {caps.version} lacks "
                         f"({tv.dla_unavailable_reason(tv.parse_release(caps.version))}); set dla_core = -1")
    if o.hardware_compatibility != "none":
        raise UsageError("DLA engines cannot be hardware-compatible; set hardware_compatibility = \"none\" or dla_core = -1")
    # The DLA takes static shapes only: the profile must have min = opt = max (TensorRT's DLA
    # restrictions), so a DLA plan builds for one batch size. The runner splits larger batches and
    # pads smaller ones to it.
    lo, opt, hi = batches
    static = None
    if lo != hi:
        static = opt
        notes.append(f"DLA needs static shapes: one batch size ({opt}, the opt batch), min = opt = max; "
                     "the runner splits or pads other batches to it")
    if o.gpu_fallback:
        if not caps.gpu_fallback_flag:
            raise UsageError(f"TensorRT {caps.version} has no BuilderFlag.GPU_FALLBACK")
        builder.append("GPU_FALLBACK")
        notes.append("DLA with GPU fallback: layers the DLA cannot run (on a ViT: LayerNorm, Softmax, GELU, most "
                     "of the network) run on the GPU")
    else:
        notes.append("DLA without GPU fallback: the build fails if any layer cannot run on the DLA "
                     "(LayerNorm, Softmax and GELU usually cannot)")
    if o.float_precision == "fp32":
        notes.append("DLA runs INT8 and FP16 only: FP32 layers fall back to the GPU")
    return _DlaPlan(core=o.dla_core, gpu_fallback=bool(o.gpu_fallback), static_batch=static)


def _compatibility(o: TensorRtOptions, caps: TrtCapabilities, builder: list[str], notes: list[str]) -> None:
    """Hardware- and version-compatible engines: offered by this release, and what they cost."""
    if o.hardware_compatibility != "none" and o.hardware_compatibility not in caps.hardware_levels:
        since = " (SAME_COMPUTE_CAPABILITY is new in TensorRT 10.9)" if o.hardware_compatibility == "same_compute_capability" else ""
        raise UsageError(f"hardware_compatibility = \"{o.hardware_compatibility}\" is not offered by TensorRT {caps.version} "
                         f"(it offers: {', '.join(('none',) + caps.hardware_levels)}){since}")
    if o.version_compatible:
        if not caps.version_compatible:
            raise UsageError(f"TensorRT {caps.version} cannot build version-compatible engines")
        builder.append("VERSION_COMPATIBLE")
        notes.append("version-compatible engine: loads on this and later TensorRT versions of the same major line, "
                     "usually somewhat slower")
    if o.hardware_compatibility != "none":
        notes.append(f"hardware-compatible engine ({o.hardware_compatibility}): may be slower than a device-specific one")


def reference_plan(plan: BuildPlan) -> BuildPlan:
    """The FP32 engine validation compares against: same runtime, same profile, no INT8, no FP16,
    no TF32 (where the flag exists), on the GPU."""
    cleared = () if "TF32" in plan.cleared_flags else ("TF32",)  # apply_plan skips it where the flag does not exist
    keep = tuple(f for f in plan.builder_flags if f == "VERSION_COMPATIBLE")
    return dataclasses.replace(
        plan, role="fp32-reference", graph=REFERENCE_GRAPH, engine=REFERENCE_ENGINE, builder_flags=keep,
        cleared_flags=plan.cleared_flags + cleared, fp32_layers=(), fp32_layer_types=(), precision_constraints=None,
        typed_graph=None, dla_core=None, gpu_fallback=False,
        notes=("FP32 reference engine for the parity check: the same TensorRT, GPU and optimization profile",),
    )


def _shape(dims: tuple[int, ...]) -> str:
    return "x".join(str(int(d)) for d in dims)


def trtexec_command(plan: BuildPlan, *, tf32_flag: bool = True) -> str:
    """The trtexec line that builds the same engine as ``apply_plan(plan)``."""
    name = plan.input_name
    args = ["trtexec", f"--onnx={plan.graph}"]
    if plan.strongly_typed:
        args.append("--stronglyTyped")
    args += [f"--{f.lower()}" for f in plan.builder_flags if f in ("INT8", "FP16")]
    if "TF32" in plan.cleared_flags and tf32_flag:
        args.append("--noTF32")
    args += [f"--minShapes={name}:{_shape(plan.profile_min)}", f"--optShapes={name}:{_shape(plan.profile_opt)}",
             f"--maxShapes={name}:{_shape(plan.profile_max)}"]
    mib = plan.workspace_bytes >> 20
    # trtexec reads a bare number as MiB; 10.x and later also take the M suffix.
    args.append(f"--memPoolSize=workspace:{mib}M" if plan.trt_major >= 10 else f"--memPoolSize=workspace:{mib}")
    if plan.optimization_level is not None:
        args.append(f"--builderOptimizationLevel={plan.optimization_level}")
    if plan.timing_cache:
        args.append(f"--timingCacheFile={plan.timing_cache}")
    if plan.dla_core is not None:
        args.append(f"--useDLACore={plan.dla_core}")
        if plan.gpu_fallback:
            args.append("--allowGPUFallback")
    if plan.precision_constraints:
        args.append(f"--precisionConstraints={plan.precision_constraints}")
        if plan.fp32_layers:
            # apply_plan sets both layer.precision and every output's type (set_output_type) to FP32
            args.append("--layerPrecisions=" + ",".join(f"{layer}:fp32" for layer in plan.fp32_layers))
            args.append("--layerOutputTypes=" + ",".join(f"{layer}:fp32" for layer in plan.fp32_layers))
    if plan.hardware_compatibility != "none":
        args.append(f"--hardwareCompatibilityLevel={_HW_TRTEXEC[plan.hardware_compatibility]}")
    if plan.version_compatible:
        args.append("--versionCompatible")
    args += [f"--profilingVerbosity={plan.profiling_verbosity.lower()}", f"--saveEngine={plan.engine}", "--skipInference"]
    _check_trtexec_flags(args[1:], plan)
    return " ".join(shlex.quote(a) for a in args)


def trtexec_differences(plan: BuildPlan) -> list[str]:
    """How the trtexec line of ``plan`` differs from ``apply_plan(plan)``, exactly; [] when it does not."""
    out: list[str] = []
    if plan.precision_constraints and plan.fp32_layer_types:
        types = ", ".join(plan.fp32_layer_types)
        out.append(f"the Python build pins every {types} layer to FP32 by layer type, also one the ONNX parser renamed "
                   "or created; trtexec can name layers only, so it pins the LayerNormalization nodes listed by name "
                   "(a LayerNorm exported below opset 17 is not one layer and is pinned by neither)")
    if plan.timing_cache:
        out.append("the Python build rejects a timing cache from another device or TensorRT (ignore_mismatch=False) and "
                   "starts a fresh one, and vitedge checks the cache's sha256 first; trtexec gets --timingCacheFile and "
                   "handles a mismatched cache its own way (not checked here)")
    return out


def _check_trtexec_flags(args: list[str], plan: BuildPlan) -> None:
    """Every flag written must exist in the trtexec of the planned TensorRT (versions)."""

    version = parse_version(plan.trt_version)
    missing = [a for a in args if not trtexec_flag_available(a, version)]
    if missing:
        raise UsageError(f"trtexec of TensorRT {plan.trt_version} does not accept {', '.join(missing)}; "
                         "plan for another TensorRT (trt_major in the profile) or change the profile")


def write_plan_files(out_dir: Path, plans: list[BuildPlan], caps: TrtCapabilities, graph: GraphFacts,
                     attention: dict[str, Any] | None = None) -> list[str]:
    """build_plan.json and trtexec.txt; returns the file names written. ``attention`` (blocks and
    the warnings of attention) goes into both, so a trtexec-only user reads it too."""

    payload = {
        "schema": "vitedge.tensorrt-plan/1",
        "tensorrt": caps.to_dict(),
        "graph": graph.to_dict(),
        "engines": [p.to_dict() for p in plans],
    }
    if attention is not None:
        payload["attention"] = attention
    with atomic_write_path(out_dir / PLAN_FILE) as tmp:
        tmp.write_text(json.dumps(payload, indent=2) + "\n")
    source = ("features detected on the machine that wrote it" if not caps.assumed
              else "no TensorRT where it was written: features assumed; set trt_major in the profile to plan for another")
    lines = [
        f"# trtexec lines equivalent to vitedge's build plan for TensorRT {caps.version} ({source}).",
        "# Run them in the bundle folder on the target device; `vitedge engine BUNDLE` does the same through",
        "# the Python API (same graph, flags, precisions, output types, profile and pool limit; any difference is",
        "# stated above its line) and also validates the engine and records the device in manifest.json.",
        "# Engines and timing caches are specific to the GPU, TensorRT version and platform they are built on.",
    ]
    lines += [f"# warning: {w}" for w in (attention or {}).get("warnings", [])]
    for p in plans:
        lines += ["", f"# {p.role}: {p.engine} from {p.graph}"]
        lines += [f"# note: {n}" for n in p.notes]
        lines += [f"# differs from `vitedge engine`: {d}" for d in trtexec_differences(p)]
        lines.append(trtexec_command(p, tf32_flag=caps.tf32_flag))
    with atomic_write_path(out_dir / TRTEXEC_FILE) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    return [PLAN_FILE, TRTEXEC_FILE]
