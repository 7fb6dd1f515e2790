"""What each TensorRT version offers, with the source each entry comes from.

Two kinds of facts live here:

* **API names** (enum members, methods, properties) come from NVIDIA's real Python bindings:
  ``surface/<major>.<minor>.json`` holds what ``tensorrt.so`` of each supported version registers,
  recorded by ``tools/trt_surface.py`` from the PyPI wheels (``tensorrt-bindings==8.6.1``,
  ``tensorrt-cu12-bindings==10.0.1 ... 11.4.0.106``). ``surface_module(version)`` turns one into a
  namespace with those names, so the plan written where no TensorRT is installed is feature-detected
  on the real API of the planned version, exactly as on a device (``plan.capabilities_from_module``).
  The ``Feature`` entries with an ``api`` name are checked against the surfaces by
  tests/backends/trt/test_tensorrt_surface.py, so this table cannot drift from the bindings.
* **Platform facts** the bindings cannot show (DLA availability per release, which JetPack ships
  which TensorRT) come from NVIDIA's release notes and migration guides, cited per entry.

A version range is ``[since, until)`` on (major, minor); ``until`` None means "still there".
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

Version = tuple[int, int]
SURFACE_DIR = Path(__file__).resolve().parent / "surface"

DOCS = "https://docs.nvidia.com/deeplearning/tensorrt"
SRC_BUILDER_10 = f"{DOCS}/latest/_static/python-api/infer/Core/Builder.html"
SRC_MIGRATE_11_PY = f"{DOCS}/latest/api/migration/tensorrt-10x-to-11x-python-api-reference.html"
SRC_MIGRATE_11_TRTEXEC = f"{DOCS}/11.0.0/api/migration/tensorrt-10x-to-11x-trtexec.html"
SRC_MIGRATE_11_3 = f"{DOCS}/11.3.0/api/migration/tensorrt-10x-to-11x.html"
SRC_RN_10_9 = f"{DOCS}/latest/getting-started/release-notes-10/10.9.0.html"
SRC_VERSION_COMPAT = f"{DOCS}/latest/inference-library/version-compatibility.html"
SRC_ENGINE_COMPAT = f"{DOCS}/11.1.0/inference-library/engine-compatibility.html"
SRC_RUNTIME_86 = f"{DOCS}/archives/tensorrt-860-ea/api/python_api/infer/Core/Runtime.html"
SRC_TRTEXEC_8_10 = f"{DOCS}/10.16.1/api/tensorrt-8x-to-10x-trtexec.html"
SRC_SAMPLE_OPTIONS = "https://github.com/NVIDIA/TensorRT/blob/release/10.3/samples/common/sampleOptions.cpp"
SRC_DLA = f"{DOCS}/latest/inference-library/dla-build-and-run.html"
SRC_FIELD_NOTES = "shared/reference/field-notes.md (TensorRT section)"
SRC_SURFACE = "vitedge/backends/tensorrt/surface/*.json (tensorrt.so of the PyPI bindings wheels, tools/trt_surface.py)"
# "TensorRT 10.7 was the last release that supported DLA" (11.3.0 Jetson migration page).
SRC_JETSON_11_3 = f"{DOCS}/11.3.0/api/migration/tensorrt-10x-to-11x-jetson.html"
# "TensorRT 11.4.1 supports DLA on NVIDIA Jetson AGX Orin when using NVIDIA JetPack 7.2.2 or later ...
#  DLA was unavailable in TensorRT 11.0 through 11.3, and TensorRT 11.4.0 supported DLA only on Windows on ARM."
SRC_RN_11_4_1 = f"{DOCS}/latest/getting-started/release-notes-11/11.4.1.html"
SRC_JETSON_11_4_1 = f"{DOCS}/11.4.1/api/migration/tensorrt-10x-to-11x-jetson.html"
SRC_DLA_11_1 = f"{DOCS}/11.1.0/inference-library/work-with-dla.html"
# "JetPack 6.1 ... incorporates: CUDA 12.6, TensorRT 10.3, cuDNN 9.3" (Torch-TensorRT's JetPack page).
SRC_JETPACK_6_1 = "https://pytorch.org/TensorRT/getting_started/jetpack.html"
SRC_INSPECTOR_11 = f"{DOCS}/11.3.0/api/migration/tensorrt-10x-to-11x-IEngineInspector.html"
SRC_ENGINE_TOOLS = f"{DOCS}/10.16.1/inference-library/engine-tools.html"


@dataclass(frozen=True)
class Feature:
    """One API member or behaviour, the versions that have it, and where that is written."""

    name: str
    since: Version
    until: Version | None
    source: str
    note: str = ""
    verified: bool = True  # False: from secondary sources only
    api: str | None = None  # "Class.member" in the recorded bindings; the test checks since/until against them

    def available(self, version: Version) -> bool:
        return version >= self.since and (self.until is None or version < self.until)


_FEATURES = [
    Feature("EXPLICIT_BATCH", (8, 0), (11, 0), SRC_SURFACE,
            "needed for ONNX networks on 8.x; deprecated and ignored in 10.x; removed in 11",
            api="NetworkDefinitionCreationFlag.EXPLICIT_BATCH"),
    Feature("STRONGLY_TYPED", (10, 0), None, SRC_SURFACE,
            "NetworkDefinitionCreationFlag.STRONGLY_TYPED; deprecated in 11.0 (always on, the flag is ignored)",
            api="NetworkDefinitionCreationFlag.STRONGLY_TYPED"),
    Feature("BuilderFlag.INT8", (8, 0), (11, 0), SRC_SURFACE,
            "deprecated in 10.12 ('Superseded by strong typing'), removed in 11", api="BuilderFlag.INT8"),
    Feature("BuilderFlag.FP16", (8, 0), (11, 0), SRC_SURFACE,
            "deprecated in 10.12 ('Superseded by strong typing'), removed in 11", api="BuilderFlag.FP16"),
    Feature("OBEY_PRECISION_CONSTRAINTS", (8, 2), (11, 0), SRC_SURFACE,
            "deprecated in 10.12 ('Superseded by strong typing'), removed in 11",
            api="BuilderFlag.OBEY_PRECISION_CONSTRAINTS"),
    Feature("DIRECT_IO", (8, 0), None, SRC_SURFACE, "deprecated in 10.7 but still in 11.x; not used by vitedge",
            api="BuilderFlag.DIRECT_IO"),
    Feature("max_workspace_size", (8, 0), (10, 0), SRC_SURFACE,
            "IBuilderConfig.max_workspace_size: gone in 10.0; vitedge uses set_memory_pool_limit",
            api="IBuilderConfig.max_workspace_size"),
    Feature("builder_optimization_level", (8, 6), None, SRC_SURFACE, "IBuilderConfig.builder_optimization_level",
            api="IBuilderConfig.builder_optimization_level"),
    Feature("AMPERE_PLUS", (8, 6), None, SRC_SURFACE, "HardwareCompatibilityLevel.AMPERE_PLUS",
            api="HardwareCompatibilityLevel.AMPERE_PLUS"),
    Feature("SAME_COMPUTE_CAPABILITY", (10, 9), None, SRC_RN_10_9,
            "HardwareCompatibilityLevel.SAME_COMPUTE_CAPABILITY, new in 10.9.0; JetPack 6's 10.3 lacks it",
            api="HardwareCompatibilityLevel.SAME_COMPUTE_CAPABILITY"),
    Feature("VERSION_COMPATIBLE", (8, 6), None, SRC_VERSION_COMPAT,
            "plan built with >= 8.6 loads on the same or a later runtime; it embeds the lean runtime",
            api="BuilderFlag.VERSION_COMPATIBLE"),
    Feature("engine_host_code_allowed", (8, 6), None, SRC_RUNTIME_86,
            "Runtime.engine_host_code_allowed must be True to load a version-compatible plan with its lean runtime",
            api="Runtime.engine_host_code_allowed"),
    Feature("EXCLUDE_LEAN_RUNTIME", (8, 6), None, SRC_VERSION_COMPAT, "not used by vitedge: its plans carry the lean runtime",
            api="BuilderFlag.EXCLUDE_LEAN_RUNTIME"),
    Feature("EngineInspector.execution_context", (8, 6), None, SRC_ENGINE_TOOLS,  # 8.5's bindings called it `context`
            "bind a context so dynamic-shape engines report their tensor formats", api="EngineInspector.execution_context"),
    Feature("DeviceType.DLA", (8, 0), None, SRC_SURFACE,
            "the enum member exists in every supported version, also where DLA itself does not (dla_available)",
            api="DeviceType.DLA"),
]
FEATURES: dict[str, Feature] = {f.name: f for f in _FEATURES}

# Weak typing (BuilderFlag.INT8/FP16, precision constraints) is deprecated from this version on: the
# bindings' docstrings say "Deprecated in TensorRT 10.12. Superseded by strong typing." (surface/10.12.json).
# vitedge builds strongly typed networks from here on.
STRONG_TYPING_FROM: Version = (10, 12)

# The version vitedge plans for when none is installed: trt_major -> (version, why that one).
ASSUMED_VERSION: dict[int, tuple[str, str]] = {
    8: ("8.6.1", "the oldest TensorRT vitedge supports (JetPack 5's 8.5 is too old)"),
    10: ("10.3.0", "JetPack 6.1 ships TensorRT 10.3 (Torch-TensorRT's JetPack page; 6.2 not checked here); desktop 10.x "
                   "wheels are newer: install TensorRT to plan for them"),
    11: ("11.4.1", "the first TensorRT 11 for JetPack (7.2.2 or later), and the first 11.x with DLA on AGX Orin; its API is "
                   "recorded from 11.4.0, the newest 11.4 on PyPI"),
}


def parse_release(text: str) -> tuple[int, int, int]:
    """'10.3.0.26' -> (10, 3, 0); missing parts are 0."""
    parts = []
    for piece in (str(text).split("+")[0].split(".") + ["0", "0", "0"])[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return parts[0], parts[1], parts[2]


def dla_available(release: tuple[int, ...]) -> bool:
    """Whether TensorRT ``release`` (major, minor[, patch]) builds for the DLA at all, from NVIDIA's notes:
    8.x-10.7 yes; 10.8-11.3 no ("TensorRT 10.7 was the last release that supported DLA", SRC_JETSON_11_3);
    11.4.0 only on Windows on ARM; 11.4.1 and later on Jetson AGX Orin with JetPack 7.2.2+ (SRC_RN_11_4_1).
    The device still decides: ``Builder.num_DLA_cores`` is 0 on Orin Nano, Thor and desktop GPUs."""
    major, minor, patch = (tuple(release) + (0, 0, 0))[:3]
    if (major, minor) <= (10, 7):
        return True
    return (major, minor, patch) >= (11, 4, 1)


def dla_unavailable_reason(release: tuple[int, ...]) -> str:
    major, minor, patch = (tuple(release) + (0, 0, 0))[:3]
    if (major, minor) == (11, 4) and patch == 0:
        return "TensorRT 11.4.0 has DLA only on Windows on ARM; 11.4.1 brings it back on Jetson AGX Orin with JetPack 7.2.2+"
    return ("TensorRT 10.7 was the last release with DLA until 11.4.1 (AGX Orin, JetPack 7.2.2+); JetPack 6's TensorRT 10.3 "
            "has it")


# DLA per module (docs/tensorrt.md): Jetson AGX Orin 2 cores, Orin NX 1-2, Orin Nano / Thor / desktop GPUs none. The
# device's Builder.num_DLA_cores is what the on-device build checks (build.apply_plan).


@lru_cache(maxsize=1)
def supported_surfaces() -> tuple[str, ...]:
    """The recorded versions, oldest first ('8.6', '10.0', ..., '11.4')."""
    names = [p.stem for p in SURFACE_DIR.glob("*.json")]
    return tuple(sorted(names, key=lambda n: tuple(int(x) for x in n.split("."))))


@lru_cache(maxsize=None)
def load_surface(minor: str) -> dict[str, Any]:
    path = SURFACE_DIR / f"{minor}.json"
    if not path.is_file():
        raise KeyError(f"no recorded TensorRT API surface for {minor} (recorded: {', '.join(supported_surfaces())})")
    return json.loads(path.read_text())


def surface_for(version: Version) -> dict[str, Any] | None:
    """The recorded surface of ``version`` (major, minor), or None when that minor was not recorded."""
    key = f"{version[0]}.{version[1]}"
    return load_surface(key) if key in supported_surfaces() else None


def api_has(name: str, version: Version) -> bool:
    """Whether 'Class' or 'Class.member' exists in the recorded bindings of ``version``."""
    surface = surface_for(version)
    if surface is None:
        raise KeyError(f"TensorRT {version[0]}.{version[1]} has no recorded surface")
    cls, _, member = name.partition(".")
    entry = surface["classes"].get(cls)
    if entry is None:
        return not member and (cls in surface["functions"] or cls in surface["values"])
    return not member or member in entry["members"] or member in entry.get("values", [])


def api_deprecation(name: str, version: Version) -> str | None:
    """The deprecation note the bindings' docstring gives for 'Class.member', if any."""
    surface = surface_for(version) or {"classes": {}}
    cls, _, member = name.partition(".")
    return (surface["classes"].get(cls) or {}).get("deprecated", {}).get(member)


class _Member:
    """An enum value or attribute of the surface namespace; int() gives its position, as pybind11 enums do."""

    def __init__(self, name: str, value: int) -> None:
        self.name, self.value = name, value

    def __int__(self) -> int:
        return self.value

    def __repr__(self) -> str:
        return f"<{self.name}>"


def surface_module(release: str) -> types.ModuleType:
    """A namespace with exactly the classes and members the bindings of ``release`` ('11.4.1') register.
    Nothing in it runs: it is for feature detection (``hasattr``) where TensorRT is not installed."""
    major, minor, _patch = parse_release(release)
    surface = surface_for((major, minor))
    if surface is None:
        raise KeyError(f"TensorRT {release} has no recorded surface (recorded: {', '.join(supported_surfaces())})")
    mod = types.ModuleType("tensorrt_surface")
    mod.__version__ = release
    for cls, entry in surface["classes"].items():
        names = list(entry.get("values", [])) + list(entry["members"])
        ns = type(cls, (), {n: _Member(n, i) for i, n in enumerate(names) if not n.startswith("__")})
        setattr(mod, cls, ns)
    for name in list(surface["functions"]) + list(surface["values"]):
        setattr(mod, name, _Member(name, 0))
    return mod


@dataclass(frozen=True)
class TrtexecFlag:
    flag: str
    since: Version
    until: Version | None
    source: str

    def available(self, version: Version) -> bool:
        return version >= self.since and (self.until is None or version < self.until)


_TRTEXEC = [
    TrtexecFlag("--onnx", (8, 0), None, SRC_SAMPLE_OPTIONS),
    TrtexecFlag("--minShapes", (8, 0), None, SRC_SAMPLE_OPTIONS),
    TrtexecFlag("--optShapes", (8, 0), None, SRC_SAMPLE_OPTIONS),
    TrtexecFlag("--maxShapes", (8, 0), None, SRC_SAMPLE_OPTIONS),
    TrtexecFlag("--int8", (8, 0), (11, 0), SRC_MIGRATE_11_TRTEXEC),
    TrtexecFlag("--fp16", (8, 0), (11, 0), SRC_MIGRATE_11_TRTEXEC),
    TrtexecFlag("--stronglyTyped", (10, 0), None, SRC_MIGRATE_11_TRTEXEC),
    TrtexecFlag("--noTF32", (8, 0), None, SRC_SAMPLE_OPTIONS),
    TrtexecFlag("--memPoolSize", (8, 4), None, SRC_TRTEXEC_8_10),
    TrtexecFlag("--builderOptimizationLevel", (8, 6), None, SRC_SAMPLE_OPTIONS),
    TrtexecFlag("--timingCacheFile", (8, 0), None, SRC_SAMPLE_OPTIONS),
    TrtexecFlag("--useDLACore", (8, 0), None, SRC_DLA),
    TrtexecFlag("--allowGPUFallback", (8, 0), None, SRC_DLA),
    TrtexecFlag("--precisionConstraints", (8, 2), (11, 0), SRC_MIGRATE_11_TRTEXEC),
    TrtexecFlag("--layerPrecisions", (8, 2), (11, 0), SRC_MIGRATE_11_TRTEXEC),
    # listed beside --layerPrecisions in sampleOptions.cpp ("Effective only when precisionConstraints is set");
    # its removal in 11 with the precision constraints is assumed, not read in the migration guide
    TrtexecFlag("--layerOutputTypes", (8, 2), (11, 0), SRC_SAMPLE_OPTIONS),
    TrtexecFlag("--hardwareCompatibilityLevel", (8, 6), None, SRC_SAMPLE_OPTIONS),
    TrtexecFlag("--versionCompatible", (8, 6), None, SRC_SAMPLE_OPTIONS),
    TrtexecFlag("--profilingVerbosity", (8, 0), None, SRC_SAMPLE_OPTIONS),
    TrtexecFlag("--saveEngine", (8, 0), None, SRC_SAMPLE_OPTIONS),
    TrtexecFlag("--skipInference", (8, 6), None, SRC_SAMPLE_OPTIONS),
]
TRTEXEC_FLAGS: dict[str, TrtexecFlag] = {f.flag: f for f in _TRTEXEC}
# --hardwareCompatibilityLevel values: sameComputeCapability arrived with the API member (10.9).
TRTEXEC_HW_VALUES = {"ampere_plus": ("ampere+", (8, 6)), "same_compute_capability": ("sameComputeCapability", (10, 9))}


def has(feature: str, version: Version) -> bool:
    return FEATURES[feature].available(version)


def trtexec_flag_available(arg: str, version: Version) -> bool:
    """Whether trtexec of ``version`` accepts ``arg`` ('--name' or '--name=value')."""
    name, _, value = arg.partition("=")
    flag = TRTEXEC_FLAGS.get(name)
    if flag is None or not flag.available(version):
        return False
    if name == "--hardwareCompatibilityLevel":
        return any(v == value and version >= since for v, since in TRTEXEC_HW_VALUES.values())
    return True
