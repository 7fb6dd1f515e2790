"""What each TensorRT version offers, with the NVIDIA document each entry comes from.

This table is the source for the plans written where no TensorRT is installed
(``assumed_capabilities``) and for the trtexec lines (``trtexec_flag_available``). Where
TensorRT *is* installed, ``capabilities_from_module`` feature-detects instead, and these
entries are only the documentation of what it should find.

A version range is ``[since, until)`` on (major, minor); ``until`` None means "still there".
Entries marked ``verified=False`` rest on secondary sources (the project's field notes) and
say so in docs/tensorrt.md.
"""

from __future__ import annotations

from dataclasses import dataclass

Version = tuple[int, int]

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


@dataclass(frozen=True)
class Feature:
    """One API member or behaviour, the versions that have it, and where that is written."""

    name: str
    since: Version
    until: Version | None
    source: str
    note: str = ""
    verified: bool = True  # False: from secondary sources only

    def available(self, version: Version) -> bool:
        return version >= self.since and (self.until is None or version < self.until)


_FEATURES = [
    Feature("EXPLICIT_BATCH", (8, 0), (11, 0), SRC_BUILDER_10,
            "needed for ONNX networks on 8.x; deprecated and ignored in 10.x; removed in 11"),
    Feature("STRONGLY_TYPED", (10, 0), None, SRC_BUILDER_10,
            "NetworkDefinitionCreationFlag.STRONGLY_TYPED; in 11 accepted and ignored (always on)"),
    Feature("BuilderFlag.INT8", (8, 0), (11, 0), SRC_MIGRATE_11_PY, "removed in 11: INT8 comes from Q/DQ nodes only"),
    Feature("BuilderFlag.FP16", (8, 0), (11, 0), SRC_MIGRATE_11_PY, "removed in 11: types are in the graph"),
    Feature("OBEY_PRECISION_CONSTRAINTS", (8, 2), (11, 0), SRC_MIGRATE_11_PY, "removed in 11 with layer precision"),
    Feature("builder_optimization_level", (8, 6), None, SRC_SAMPLE_OPTIONS, "IBuilderConfig.builder_optimization_level"),
    Feature("AMPERE_PLUS", (8, 6), None, SRC_ENGINE_COMPAT, "HardwareCompatibilityLevel.AMPERE_PLUS"),
    Feature("SAME_COMPUTE_CAPABILITY", (10, 9), None, SRC_RN_10_9,
            "HardwareCompatibilityLevel.SAME_COMPUTE_CAPABILITY, new in 10.9.0; JetPack 6's 10.3 lacks it"),
    Feature("VERSION_COMPATIBLE", (8, 6), None, SRC_VERSION_COMPAT,
            "plan built with >= 8.6 loads on the same or a later runtime; it embeds the lean runtime"),
    Feature("engine_host_code_allowed", (8, 6), None, SRC_RUNTIME_86,
            "Runtime.engine_host_code_allowed must be True to load a version-compatible plan with its lean runtime"),
    Feature("EXCLUDE_LEAN_RUNTIME", (8, 6), None, SRC_VERSION_COMPAT, "not used by vitedge: its plans carry the lean runtime"),
    Feature("DLA", (8, 0), (11, 0), SRC_DLA, "DeviceType.DLA on Jetson AGX Orin / Orin NX / Xavier"),
    Feature("DLA (11.4+)", (11, 4), None, SRC_FIELD_NOTES, "no DLA in TensorRT 11.0-11.3; back on AGX Orin in 11.4",
            verified=False),
]
FEATURES: dict[str, Feature] = {f.name: f for f in _FEATURES}

# The version vitedge plans for when none is installed: trt_major -> (version, why that one).
ASSUMED_VERSION: dict[int, tuple[Version, str]] = {
    8: ((8, 6), "the oldest TensorRT vitedge supports (JetPack 5's 8.5 is too old)"),
    10: ((10, 3), "JetPack 6.x ships TensorRT 10.3 (10.x desktop wheels are newer: install TensorRT to plan for them)"),
    11: ((11, 4), "JetPack 7 ships 11.x; 11.4 is the first 11.x with DLA again"),
}

# DLA per module (docs/tensorrt.md): Jetson AGX Orin 2 cores, Orin NX 1-2, Orin Nano / Thor / desktop GPUs none. The
# device's Builder.num_DLA_cores is what the on-device build checks (build.apply_plan).


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


def dla_available(version: Version) -> bool:
    return has("DLA", version) or has("DLA (11.4+)", version)


def trtexec_flag_available(arg: str, version: Version) -> bool:
    """Whether trtexec of ``version`` accepts ``arg`` ('--name' or '--name=value')."""
    name, _, value = arg.partition("=")
    flag = TRTEXEC_FLAGS.get(name)
    if flag is None or not flag.available(version):
        return False
    if name == "--hardwareCompatibilityLevel":
        return any(v == value and version >= since for v, since in TRTEXEC_HW_VALUES.values())
    return True
