"""apply_plan against the recording stand-in: exactly which TensorRT calls each version's
plan makes (flags, pool limits, optimization profile, DLA and GPU fallback, precision
constraints, strongly typed networks, timing cache). No TensorRT is used or claimed."""

from __future__ import annotations

import dataclasses
import json

import pytest
from helpers.tensorrt_graphs import LN_NAMES
from helpers.tensorrt_standin import make_fake_trt

from vitedge.backends.tensorrt.apply import apply_plan
from vitedge.backends.tensorrt.plan import (
    TensorRtOptions,
    capabilities_from_module,
    plan_build,
    reference_plan,
)
from vitedge.core.errors import BundleError, UsageError


def _run(tiny, version, options=TensorRtOptions(opt_batch=4), batch_sizes=(1, 4, 8), *, dla_cores=0, cache=None, plan_fn=None):
    path, graph = tiny
    trt = make_fake_trt(version, dla_cores=dla_cores)
    plan = plan_build(options, batch_sizes, capabilities_from_module(trt), graph=graph)
    if plan_fn:
        plan = plan_fn(plan)
    result = apply_plan(trt, plan, path.parent / plan.graph, timing_cache=cache)
    return trt, plan, result


def _named(calls, name):
    return [c for c in calls if c[0] == name]


def test_trt10_weakly_typed_build(tiny):
    trt, plan, result = _run(tiny, "10.3.0", TensorRtOptions(workspace_mb=2048, opt_batch=4, builder_optimization_level=4))
    calls = trt.calls
    assert _named(calls, "builder.create_network") == [("builder.create_network", 0)]
    assert ("parser.parse_from_file", "model.int8.onnx") in calls
    assert _named(calls, "config.set_memory_pool_limit") == [("config.set_memory_pool_limit", "WORKSPACE", 2048 << 20)]
    assert ("config.builder_optimization_level", 4) in calls
    assert [c[1] for c in _named(calls, "config.set_flag")] == ["INT8", "FP16", "OBEY_PRECISION_CONSTRAINTS"]
    assert _named(calls, "profile.set_shape") == [("profile.set_shape", "input", (1, 3, 8, 8), (4, 3, 8, 8), (8, 3, 8, 8))]
    assert _named(calls, "layer.precision") == [("layer.precision", n, "FLOAT") for n in LN_NAMES]
    assert _named(calls, "layer.set_output_type") == [("layer.set_output_type", n, 0, "FLOAT") for n in LN_NAMES]
    assert ("config.profiling_verbosity", "DETAILED") in calls
    assert not [c for c in calls if c[0] in ("config.default_device_type", "config.DLA_core", "config.int8_calibrator",
                                             "config.hardware_compatibility_level")]
    assert calls.index(("builder.build_serialized_network",)) > calls.index(("config.set_flag", "INT8"))
    assert result.fp32_layers == list(LN_NAMES) and result.dla_fallback is None and not result.warnings
    assert result.layers["count"] == 7 and result.layers["dla_layers"] == []
    assert result.timing_cache.startswith(b"timing-cache:10.3.0")


def test_trt86_creates_an_explicit_batch_network(tiny):
    trt, plan, _ = _run(tiny, "8.6.1")
    explicit = 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    assert _named(trt.calls, "builder.create_network") == [("builder.create_network", explicit)]
    assert [c[1] for c in _named(trt.calls, "config.set_flag")] == ["INT8", "FP16", "OBEY_PRECISION_CONSTRAINTS"]


@pytest.mark.parametrize("version", ["10.12.0", "10.16.1", "11.0.0", "11.4.0"])
def test_strongly_typed_build_from_10_12(tiny, version):
    """10.12 deprecated the weak-typing flags ("Superseded by strong typing") and 11 removed them: the
    cast graph and no precision flag. 10.x needs STRONGLY_TYPED; 11.x deprecated it (always on, ignored)."""
    trt, plan, result = _run(tiny, version)
    strongly = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if version.startswith("10.") else 0
    assert _named(trt.calls, "builder.create_network") == [("builder.create_network", strongly)]
    assert ("parser.parse_from_file", "model.int8.typed.onnx") in trt.calls
    assert _named(trt.calls, "config.set_flag") == []
    assert _named(trt.calls, "layer.precision") == [] and result.fp32_layers == []
    assert _named(trt.calls, "config.set_memory_pool_limit") == [("config.set_memory_pool_limit", "WORKSPACE", 2048 << 20)]


def test_a_trt10_plan_fails_clearly_on_trt11(tiny):
    path, graph = tiny
    plan10 = plan_build(TensorRtOptions(opt_batch=4), (1, 4, 8), capabilities_from_module(make_fake_trt("10.3.0")), graph=graph)
    with pytest.raises(BundleError, match="TensorRT 11.0.0 has no BuilderFlag.INT8"):
        apply_plan(make_fake_trt("11.0.0"), plan10, path)


def test_a_mixed_plan_fails_in_one_line_as_trt10_reports_it(tiny):
    """Why the plan never mixes them: 10.x logs an error for layer precision on a STRONGLY_TYPED
    network and build_serialized_network returns None; apply_plan turns that into one line."""
    path, graph = tiny
    trt = make_fake_trt("10.3.0")
    plan = plan_build(TensorRtOptions(opt_batch=4), (1, 4, 8), capabilities_from_module(trt), graph=graph)
    mixed = dataclasses.replace(plan, network_flags=("STRONGLY_TYPED",))
    with pytest.raises(BundleError) as err:
        apply_plan(trt, mixed, path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("TensorRT 10.3.0 could not build model.engine from model.int8.onnx: ")
    assert "strongly typed" in msg


def test_dla_core_with_gpu_fallback_reports_the_fallback_layers(tiny):
    trt, plan, result = _run(tiny, "10.3.0", TensorRtOptions(opt_batch=4, dla_core=1), dla_cores=2)
    calls = trt.calls
    assert ("config.default_device_type", "DLA") in calls and ("config.DLA_core", 1) in calls
    assert "GPU_FALLBACK" in [c[1] for c in _named(calls, "config.set_flag")]
    assert result.dla_fallback == [LN_NAMES[0], LN_NAMES[1], "/softmax"]  # the stand-in's DLA runs Q/DQ and MatMul only
    assert result.layers["dla_layers"] == ["q", "dq", "wdq", "/blocks.0/mlp/fc1/MatMul"]
    assert result.info()["dla_gpu_fallback_layers"] == result.dla_fallback


def test_dla_on_a_device_without_dla(tiny):
    with pytest.raises(BundleError, match="0 DLA core"):
        _run(tiny, "10.3.0", TensorRtOptions(opt_batch=4, dla_core=0), dla_cores=0)  # Orin Nano
    # DLA is back in 11.4.1 on AGX Orin (release notes); 11.4.0 had it only on Windows on ARM
    trt, _, result = _run(tiny, "11.4.1", TensorRtOptions(opt_batch=4, dla_core=0), dla_cores=2)
    assert ("config.DLA_core", 0) in trt.calls and result.dla_fallback
    assert make_fake_trt("11.4.0", dla_cores=2).Builder(None).num_DLA_cores == 0


def test_compatibility_modes(tiny):
    trt, plan, _ = _run(tiny, "10.9.0", TensorRtOptions(opt_batch=4, hardware_compatibility="same_compute_capability",
                                                        version_compatible=True))
    assert ("config.hardware_compatibility_level", "SAME_COMPUTE_CAPABILITY") in trt.calls
    assert "VERSION_COMPATIBLE" in [c[1] for c in _named(trt.calls, "config.set_flag")]
    with pytest.raises(UsageError, match="new in TensorRT 10.9"):  # JetPack 6's 10.3 has no SAME_COMPUTE_CAPABILITY
        _run(tiny, "10.3.0", TensorRtOptions(opt_batch=4, hardware_compatibility="same_compute_capability"))


def test_timing_cache_is_reused_and_a_stale_one_replaced(tiny):
    trt, _, result = _run(tiny, "10.3.0", cache=b"previous-cache-bytes")
    assert _named(trt.calls, "config.create_timing_cache") == [("config.create_timing_cache", b"previous-cache-bytes")]
    assert _named(trt.calls, "config.set_timing_cache") == [("config.set_timing_cache", False)]  # never ignore a mismatch
    assert result.timing_cache_reused
    trt, _, result = _run(tiny, "10.3.0", cache=b"stale")
    assert [c[1] for c in _named(trt.calls, "config.create_timing_cache")] == [b"stale", b""]
    assert not result.timing_cache_reused and "does not match" in result.warnings[0]
    trt, _, result = _run(tiny, "10.3.0", TensorRtOptions(opt_batch=4, timing_cache=False))
    assert not _named(trt.calls, "config.create_timing_cache") and result.timing_cache is None


def test_reference_engine_is_fp32_without_tf32(tiny):
    trt, plan, result = _run(tiny, "10.3.0", plan_fn=reference_plan)
    assert ("parser.parse_from_file", "reference.fp32.onnx") in trt.calls
    assert _named(trt.calls, "config.set_flag") == [] and ("config.clear_flag", "TF32") in trt.calls
    assert _named(trt.calls, "layer.precision") == []
    note = json.loads(result.engine)
    assert note["min"] == [1, 3, 8, 8] and note["max"] == [8, 3, 8, 8]


def test_no_calibrator_on_any_version(tiny):
    for version in ("8.6.1", "10.3.0", "11.0.0"):
        trt, _, _ = _run(tiny, version)
        assert not [c for c in trt.calls if "calibrat" in str(c[0]).lower()]


def test_dla_plans_are_static_and_a_dynamic_dla_profile_fails_as_tensorrt_does(tiny):
    """The DLA takes static shapes only: the plan pins min = opt = max at the opt batch and states the GPU
    fallback; a DLA build with a dynamic profile fails (None and a logged error), which apply_plan reports."""
    trt, plan, result = _run(tiny, "10.3.0", TensorRtOptions(opt_batch=4, dla_core=0), dla_cores=2)
    assert plan.profile_min == plan.profile_opt == plan.profile_max == (4, 3, 8, 8)
    assert _named(trt.calls, "profile.set_shape") == [("profile.set_shape", "input", (4, 3, 8, 8), (4, 3, 8, 8), (4, 3, 8, 8))]
    assert any("static shapes" in n for n in plan.notes) and any("run on the GPU" in n for n in plan.notes)
    assert result.dla_fallback and result.layers["dla_layers"]
    dynamic = dataclasses.replace(plan, profile_min=(1, 3, 8, 8), profile_max=(8, 3, 8, 8))
    with pytest.raises(BundleError, match="DLA does not support dynamic shapes"):
        apply_plan(make_fake_trt("10.3.0", dla_cores=2), dynamic, tiny[0])
    gpu = dataclasses.replace(dynamic, dla_core=None, gpu_fallback=False, builder_flags=("INT8", "FP16"))
    apply_plan(make_fake_trt("10.3.0", dla_cores=2), gpu, tiny[0])  # the same profile builds on the GPU
