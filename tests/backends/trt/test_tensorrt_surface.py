"""The TensorRT API surface recorded from NVIDIA's real bindings wheels (vitedge/backends/tensorrt/surface/,
written by tools/trt_surface.py) against the stand-in, the version table and what vitedge calls.

No TensorRT runs here: these tests compare names. The surfaces were recorded by loading each
version's tensorrt.so (from tensorrt-bindings / tensorrt-cu12-bindings on PyPI) with stub libnvinfer.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

import pytest
from helpers.tensorrt_standin import make_fake_cudart, make_fake_trt

from vitedge.backends.tensorrt import versions as tv
from vitedge.backends.tensorrt.apply import apply_plan
from vitedge.backends.tensorrt.plan import (
    TensorRtOptions,
    assumed_capabilities,
    capabilities_from_module,
    plan_build,
    reference_plan,
)

ROOT = Path(__file__).resolve().parents[3]
VERSIONS = tv.supported_surfaces()


def _release(minor: str) -> str:
    """A release of each recorded minor for the stand-in; 11.4 is planned as 11.4.1 (DLA, JetPack 7.2.2+)."""
    return "11.4.1" if minor == "11.4" else f"{minor}.0"


def _v(minor: str) -> tuple[int, int]:
    major, mnr = minor.split(".")
    return int(major), int(mnr)


def _tool():
    spec = importlib.util.spec_from_file_location("trt_surface_tool", ROOT / "tools" / "trt_surface.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_supported_version_has_a_surface_recorded_from_its_wheel():
    tool = _tool()
    assert VERSIONS == tuple(tool.SUPPORTED)
    assert VERSIONS[0] == "8.6" and "10.16" in VERSIONS and VERSIONS[-1] == "11.4"
    for minor, (dist, version) in tool.SUPPORTED.items():
        surface = tv.load_surface(minor)
        assert surface["schema"] == tool.SCHEMA and surface["tensorrt"] == minor
        assert surface["distribution"] == f"{dist}=={version}" and surface["wheel"].startswith(dist.replace("-", "_") + f"-{version}-")
        for name in ("Builder", "IBuilderConfig", "BuilderFlag", "OnnxParser", "Runtime", "ICudaEngine", "EngineInspector"):
            assert name in surface["classes"], (minor, name)


@pytest.mark.parametrize("minor", VERSIONS)
def test_standin_exposes_exactly_the_recorded_surface(minor):
    surface = tv.load_surface(minor)
    trt = make_fake_trt(_release(minor))
    recorded = {n for n in set(surface["classes"]) | set(surface["functions"]) | set(surface["values"]) if not n.startswith("_")}
    assert {n for n in vars(trt) if not n.startswith("_")} - {"nptype", "calls"} == recorded
    for name, entry in surface["classes"].items():
        cls = getattr(trt, name)
        if entry["kind"] == "enum":
            assert set(cls.__members__) == set(entry["values"]), name
        else:
            public = {m for m in dir(cls) if not m.startswith("_")}
            assert public == {m for m in entry["members"] if not m.startswith("_")}, name
    # what the stand-in's instances carry is in the surface too (internals are _private)
    builder = trt.Builder(trt.Logger())
    instances = {"Builder": builder, "IBuilderConfig": builder.create_builder_config(),
                 "IOptimizationProfile": builder.create_optimization_profile(), "Runtime": trt.Runtime(trt.Logger()),
                 "Logger": trt.Logger()}
    for name, obj in instances.items():
        own = {k for k in vars(obj) if not k.startswith("_")}
        assert own <= set(surface["classes"][name]["members"]), (name, own)


def test_the_names_the_issue_names_are_where_the_bindings_put_them():
    for minor in VERSIONS:
        v = _v(minor)
        assert tv.api_has("BuilderFlag.DIRECT_IO", v)  # still in every 11.x
        assert tv.api_has("IBuilderConfig.max_workspace_size", v) == (v < (10, 0))  # gone in 10
        for flag in ("INT8", "FP16", "OBEY_PRECISION_CONSTRAINTS"):
            assert tv.api_has(f"BuilderFlag.{flag}", v) == (v < (11, 0))
            note = tv.api_deprecation(f"BuilderFlag.{flag}", v)
            if v < (10, 12):
                assert note is None, (minor, flag, note)
            elif v < (11, 0):
                assert "Deprecated in TensorRT 10.12" in note and "strong typing" in note
        strongly = tv.api_deprecation("NetworkDefinitionCreationFlag.STRONGLY_TYPED", v)
        assert (strongly is not None and "always enabled" in strongly) == (v >= (11, 0))
    assert tv.STRONG_TYPING_FROM == (10, 12)


def test_the_version_table_agrees_with_the_bindings():
    checked = 0
    for feature in tv.FEATURES.values():
        if feature.api is None:
            continue
        for minor in VERSIONS:
            assert feature.available(_v(minor)) == tv.api_has(feature.api, _v(minor)), (feature.name, minor)
            checked += 1
    assert checked >= 10 * len(VERSIONS)


def test_dla_availability_per_release_from_nvidias_notes():
    assert tv.dla_available((8, 6, 1)) and tv.dla_available((10, 3, 0)) and tv.dla_available((10, 7, 0))
    assert not any(tv.dla_available(r) for r in ((10, 8, 0), (10, 12, 0), (10, 16, 1), (11, 0, 0), (11, 3, 0), (11, 4, 0)))
    assert tv.dla_available((11, 4, 1)) and tv.dla_available((11, 5, 0))
    assert "Windows on ARM" in tv.dla_unavailable_reason((11, 4, 0))
    # the enum member stays in every version's bindings: availability cannot be feature-detected from it
    assert all(tv.api_has("DeviceType.DLA", _v(m)) for m in VERSIONS)
    assert tv.ASSUMED_VERSION[10][0] == "10.3.0" and tv.ASSUMED_VERSION[11][0] == "11.4.1"


def test_offline_plans_are_feature_detected_on_the_recorded_surface():
    for major, (release, _why) in tv.ASSUMED_VERSION.items():
        assumed = assumed_capabilities(major)
        detected = capabilities_from_module(make_fake_trt(release))
        assert dataclasses.replace(assumed, assumed=False) == detected, major


def _options_for(minor: str) -> list[TensorRtOptions]:
    caps = capabilities_from_module(make_fake_trt(_release(minor)))
    out = [TensorRtOptions(opt_batch=4), TensorRtOptions(opt_batch=4, float_precision="fp32"),
           TensorRtOptions(opt_batch=4, layernorm_fp32=False),
           TensorRtOptions(opt_batch=4, version_compatible=True, hardware_compatibility="ampere_plus")]
    if "same_compute_capability" in caps.hardware_levels:
        out.append(TensorRtOptions(opt_batch=4, hardware_compatibility="same_compute_capability"))
    if caps.dla:
        out += [TensorRtOptions(opt_batch=4, dla_core=0), TensorRtOptions(opt_batch=1, dla_core=1, gpu_fallback=False,
                                                                            float_precision="fp16", layernorm_fp32=False)]
    return out


@pytest.mark.parametrize("minor", VERSIONS)
def test_vitedge_asks_each_version_only_for_names_it_has_and_none_it_deprecated(tiny, minor):
    """Every plan vitedge makes for this version, built through apply_plan on a stand-in that has exactly
    that version's recorded API: a name the bindings lack raises AttributeError, one the stand-in does not
    emulate raises NotImplementedError, and a flag the bindings mark deprecated fails the test."""
    path, graph = tiny
    v = _v(minor)
    for options in _options_for(minor):
        trt = make_fake_trt(_release(minor), dla_cores=2)
        caps = capabilities_from_module(trt)
        plan = plan_build(options, (1, 4, 8), caps, graph=graph)
        for p in (plan, reference_plan(plan)):
            used = [f"NetworkDefinitionCreationFlag.{n}" for n in p.network_flags]
            used += [f"BuilderFlag.{n}" for n in p.builder_flags + p.cleared_flags]
            used += [f"ProfilingVerbosity.{p.profiling_verbosity}"]
            if p.hardware_compatibility != "none":
                used.append("HardwareCompatibilityLevel." + p.hardware_compatibility.upper())
            for name in used:
                assert tv.api_has(name, v), (minor, name)
                assert tv.api_deprecation(name, v) is None, (minor, name, tv.api_deprecation(name, v))
            if p.dla_core is not None:
                assert p.profile_min == p.profile_max, "DLA plans must be static"
            if not (p.dla_core is not None and not p.gpu_fallback):  # without fallback the stand-in's DLA refuses LayerNorm
                apply_plan(trt, p, path.parent / p.graph)


# vitedge/backends/tensorrt modules that call TensorRT: trt.* anywhere in them; TensorRT objects, by the
# variable names below, in apply.py and runner.py (engine_inspect.py reads JSON dicts, device.py's
# ``runtime`` is cuda-python's).
_CALLERS = ("apply.py", "runner.py", "engine_inspect.py", "device.py", "backend.py", "bundle.py")
_OBJECT_CALLERS = ("apply.py", "runner.py")
_VARS = {"builder": "Builder", "config": "IBuilderConfig", "network": "INetworkDefinition", "parser": "OnnxParser",
         "profile": "IOptimizationProfile", "runtime": "Runtime", "engine": "ICudaEngine", "e": "ICudaEngine",
         "context": "IExecutionContext", "ctx": "IExecutionContext", "inspector": "EngineInspector", "layer": "ILayer",
         "cache": "ITimingCache", "out_cache": "ITimingCache"}
# Names used only on the weakly typed path (8.6-10.11): never reached where the version lacks them.
_WEAK_ONLY = {"ILayer.precision", "ILayer.set_output_type", "ILayer.num_outputs"}


def _calls() -> set[str]:
    """'Class.member' for every attribute vitedge's TensorRT code reads on trt.* or on a TensorRT object."""
    found: set[str] = set()
    for name in _CALLERS:
        tree = ast.parse((ROOT / "vitedge/backends/tensorrt" / name).read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute):
                continue
            base = node.value
            if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "trt":
                found.add(f"{base.attr}.{node.attr}")  # trt.Class.member
            elif isinstance(base, ast.Name) and base.id == "trt":
                found.add(node.attr)  # trt.Class
            elif name not in _OBJECT_CALLERS:
                continue
            elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "self" \
                    and base.attr in _VARS:
                found.add(f"{_VARS[base.attr]}.{node.attr}")  # self.engine.member
            elif isinstance(base, ast.Name) and base.id in _VARS:
                found.add(f"{_VARS[base.id]}.{node.attr}")
    return found


def test_every_name_vitedge_reads_exists_in_every_supported_version():
    calls = _calls()
    assert {"Builder", "BuilderFlag", "IBuilderConfig.set_memory_pool_limit", "ICudaEngine.create_engine_inspector",
            "IExecutionContext.execute_async_v3", "EngineInspector.execution_context"} <= calls  # the scan sees the calls
    python_side = {"nptype", "__version__"}  # tensorrt/__init__.py, not tensorrt.so
    missing = []
    for minor in VERSIONS:
        v = _v(minor)
        for name in sorted(calls - python_side):
            if name in _WEAK_ONLY and v >= tv.STRONG_TYPING_FROM:
                continue
            if name.split(".")[0] in ("Severity",):
                continue
            if not tv.api_has(name, v):
                missing.append(f"{minor}: {name}")
    assert not missing, "vitedge reads names these TensorRT versions lack: " + ", ".join(missing)


def test_the_max_workspace_size_fallback_is_gone_and_10x_refuses_it():
    assert "IBuilderConfig.max_workspace_size" not in _calls()
    config = make_fake_trt("10.3.0").Builder(None).create_builder_config()
    with pytest.raises(AttributeError, match="max_workspace_size"):
        config.max_workspace_size = 1 << 20
    make_fake_trt("8.6.1").Builder(None).create_builder_config().max_workspace_size = 1 << 20  # 8.6 still has it


def test_the_runner_binds_by_name_on_every_version(tiny, tmp_path):
    """The runner's calls (num_io_tensors, set_input_shape, set_tensor_address, execute_async_v3) on the
    oldest and newest surfaces, through an engine the stand-in builds."""
    import numpy as np

    from vitedge.backends.tensorrt.runner import TensorRtRunner

    path, graph = tiny
    for release in ("8.6.1", "10.16.0", "11.4.1"):
        cudart = make_fake_cudart()
        trt = make_fake_trt(release, cudart=cudart)
        plan = plan_build(TensorRtOptions(opt_batch=4), (1, 4, 8), capabilities_from_module(trt), graph=graph)
        built = apply_plan(trt, plan, path.parent / plan.graph)
        engine = tmp_path / f"{release}.engine"
        engine.write_bytes(built.engine)
        runner = TensorRtRunner(engine, TensorRtOptions(), trt=trt, cudart=cudart, check_device=False)
        out = runner.infer(np.zeros((3, 3, 8, 8), np.float32))
        assert out.shape == (3, 3, 8, 8)


def test_the_recording_tool_refuses_an_unknown_version_in_one_line(capsys):
    tool = _tool()
    assert tool.main(["--versions", "9.9", "--out", "/nonexistent"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no wheel known for TensorRT 9.9; known: 8.6, 10.0,") and err.count("\n") == 1


def test_the_recorded_files_are_what_the_tool_writes():
    """One class per line, sorted: a new release's file diffs against the previous one as its API changes."""
    tool = _tool()
    for minor in ("8.6", "10.12", "11.4"):
        path = tv.SURFACE_DIR / f"{minor}.json"
        record = tv.load_surface(minor)
        assert path.read_text() == tool._dumps(record)  # noqa: SLF001
        assert list(record["classes"]) == sorted(record["classes"])
