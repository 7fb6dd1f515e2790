"""plan_build: the settings each TensorRT profile asks for on 8.6, 10.x and 11.x, and the
equivalent trtexec lines. Pure functions: no TensorRT needed."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest
from helpers.tensorrt_standin import make_fake_trt

from vitedge.backends.tensorrt.plan import (
    BuildPlan,
    GraphFacts,
    TensorRtOptions,
    assumed_capabilities,
    capabilities_from_module,
    plan_build,
    reference_plan,
    trtexec_command,
)
from vitedge.core.errors import ProfileError, UsageError
from vitedge.targets.profiles import load_profile, parse_profile

LN = ("/blocks/blocks.0/norm1/LayerNormalization", "/blocks/blocks.0/norm2/LayerNormalization", "/norm/LayerNormalization")
GRAPH = GraphFacts(input_name="input", input_shape=(3, 224, 224), layernorm_layers=LN)
CAPS = {v: capabilities_from_module(make_fake_trt(v))
        for v in ("8.6.1", "10.3.0", "10.7.0", "10.8.0", "10.9.0", "10.11.0", "10.12.0", "11.0.0", "11.4.0", "11.4.1")}


def _plan(target: str, version: str, **changes) -> BuildPlan:
    profile = load_profile(target)
    options = dataclasses.replace(profile.backend_options, **changes)
    return plan_build(options, profile.batch_sizes, CAPS[version], graph=GRAPH)


def test_each_profile_plans_its_batch_range_and_workspace():
    expected = {"desktop-gpu": ((1, 8, 32), 4096), "jetson-orin": ((1, 4, 8), 2048), "jetson-orin-nano": ((1, 1, 4), 512)}
    for target, ((lo, opt, hi), mib) in expected.items():
        plan = _plan(target, "10.3.0")
        assert plan.profile_min == (lo, 3, 224, 224) and plan.profile_opt == (opt, 3, 224, 224) and plan.profile_max == (hi, 3, 224, 224)
        assert plan.workspace_bytes == mib << 20 and plan.optimization_level == 3
        assert plan.timing_cache == "timing.cache" and plan.dla_core is None and plan.hardware_compatibility == "none"
        assert plan.input_name == "input" and plan.engine == "model.engine"


def test_trt10_is_weakly_typed_with_layernorm_pinned_to_fp32():
    plan = _plan("jetson-orin", "10.3.0")
    assert not plan.strongly_typed and plan.graph == "model.int8.onnx"
    assert plan.builder_flags == ("INT8", "FP16", "OBEY_PRECISION_CONSTRAINTS")
    assert plan.network_flags == ()  # EXPLICIT_BATCH is deprecated (implied) in 10.x
    assert plan.fp32_layers == LN and plan.fp32_layer_types == ("NORMALIZATION",) and plan.precision_constraints == "obey"


def test_trt86_needs_explicit_batch():
    plan = _plan("desktop-gpu", "8.6.1")
    assert plan.network_flags == ("EXPLICIT_BATCH",)
    assert plan.builder_flags == ("INT8", "FP16", "OBEY_PRECISION_CONSTRAINTS")


def test_trt11_is_strongly_typed_from_the_cast_graph():
    plan = _plan("jetson-orin", "11.0.0")
    assert plan.strongly_typed and plan.network_flags == ()  # STRONGLY_TYPED: deprecated in 11.0, always on, ignored
    assert plan.builder_flags == ()  # no INT8 / FP16 / precision-constraint flags exist in 11
    assert plan.graph == "model.int8.typed.onnx" and plan.typed_graph == {"float_precision": "fp16", "layernorm_fp32": True}
    assert plan.fp32_layers == () and plan.precision_constraints is None


def test_fp32_float_regions():
    weak = _plan("desktop-gpu", "10.3.0", float_precision="fp32")
    assert weak.builder_flags == ("INT8",) and weak.precision_constraints is None
    strong = _plan("desktop-gpu", "11.0.0", float_precision="fp32")
    assert strong.graph == "model.int8.onnx" and strong.typed_graph is None


def test_layernorm_fp16_when_asked():
    plan = _plan("desktop-gpu", "10.3.0", layernorm_fp32=False)
    assert plan.builder_flags == ("INT8", "FP16") and plan.fp32_layers == ()
    assert _plan("desktop-gpu", "11.0.0", layernorm_fp32=False).typed_graph["layernorm_fp32"] is False


def test_dla_with_gpu_fallback_on_agx_orin():
    plan = _plan("jetson-orin", "10.3.0", dla_core=1)
    assert plan.dla_core == 1 and plan.gpu_fallback and "GPU_FALLBACK" in plan.builder_flags
    no_fallback = _plan("jetson-orin", "10.3.0", dla_core=0, gpu_fallback=False)
    assert "GPU_FALLBACK" not in no_fallback.builder_flags and any("fails" in n for n in no_fallback.notes)
    assert any("run on the GPU" in n for n in plan.notes)  # the GPU fallback is stated in the plan
    # DLA per release (NVIDIA's 11.3 Jetson migration page and 11.4.1 release notes): 10.7 was the last
    # release with DLA; 11.4.0 has it only on Windows on ARM; 11.4.1 brings it back on AGX Orin.
    assert _plan("jetson-orin", "10.7.0", dla_core=0).dla_core == 0
    for version in ("10.8.0", "10.12.0", "11.0.0"):
        with pytest.raises(UsageError, match="10.7 was the last release with DLA"):
            _plan("jetson-orin", version, dla_core=0)
    with pytest.raises(UsageError, match="11.4.0 has DLA only on Windows on ARM"):
        _plan("jetson-orin", "11.4.0", dla_core=0)
    back = _plan("jetson-orin", "11.4.1", dla_core=0)
    assert back.dla_core == 0 and back.builder_flags == ("GPU_FALLBACK",) and back.strongly_typed
    with pytest.raises(UsageError, match="hardware-compatible"):
        _plan("jetson-orin", "10.3.0", dla_core=0, hardware_compatibility="ampere_plus")


def test_compatibility_modes_follow_what_the_tensorrt_offers():
    plan = _plan("desktop-gpu", "10.3.0", hardware_compatibility="ampere_plus", version_compatible=True)
    assert plan.hardware_compatibility == "ampere_plus" and "VERSION_COMPATIBLE" in plan.builder_flags
    assert _plan("desktop-gpu", "10.9.0", hardware_compatibility="same_compute_capability").hardware_compatibility == "same_compute_capability"
    for old in ("8.6.1", "10.3.0"):  # SAME_COMPUTE_CAPABILITY is new in 10.9.0 (release notes)
        with pytest.raises(UsageError, match=f"not offered by TensorRT {old}.*new in TensorRT 10.9"):
            _plan("desktop-gpu", old, hardware_compatibility="same_compute_capability")


def test_bad_settings_are_refused():
    with pytest.raises(UsageError, match="opt_batch 64 lies outside"):
        _plan("desktop-gpu", "10.3.0", opt_batch=64)
    with pytest.raises(UsageError, match="too old"):
        plan_build(TensorRtOptions(), (1,), dataclasses.replace(CAPS["8.6.1"], version="8.5.2", minor=5))
    for bad in ({"float_precision": "bf16"}, {"builder_optimization_level": 6}, {"hardware_compatibility": "turing"},
                {"dla_core": -2}, {"workspace_mb": 0}, {"trt_major": 9}):
        with pytest.raises(UsageError):
            TensorRtOptions(**bad)


def test_profile_keys_are_the_options_fields(tmp_path):
    data = {"backend": "tensorrt", "precision": "int8", "backend_options": {"workspace_mb": 1024, "dla_cores": 0}}
    with pytest.raises(ProfileError, match="unknown key 'backend_options.dla_cores'"):
        parse_profile(data, tmp_path / "t.toml")
    data["backend_options"] = {"layernorm_fp32": "yes"}
    with pytest.raises(ProfileError, match="layernorm_fp32"):
        parse_profile(data, tmp_path / "t.toml")


def test_plan_round_trips_through_json():
    plan = _plan("jetson-orin", "10.3.0", dla_core=0)
    again = BuildPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan


def test_reference_plan_is_plain_fp32_on_the_gpu():
    ref = reference_plan(_plan("jetson-orin", "10.3.0", dla_core=0, version_compatible=True))
    assert ref.graph == "reference.fp32.onnx" and ref.engine == "reference.fp32.engine"
    assert ref.builder_flags == ("VERSION_COMPATIBLE",) and ref.cleared_flags == ("TF32",)
    # the reference keeps the INT8 plan's profile: static at the opt batch, as the DLA plan is
    assert ref.dla_core is None and ref.precision_constraints is None
    assert ref.profile_min == ref.profile_opt == ref.profile_max == (4, 3, 224, 224)


def test_assumed_capabilities_follow_nvidias_documents():
    """What vitedge plans for where no TensorRT is installed, against NVIDIA's documents (the
    sources are listed in vitedge/backends/tensorrt_versions.py and docs/tensorrt.md), written
    out here by hand rather than compared with the stand-in."""
    jp6 = assumed_capabilities(10)  # JetPack 6.x ships TensorRT 10.3
    assert jp6.version == "10.3.0" and jp6.weakly_typed and jp6.strongly_typed_flag and not jp6.explicit_batch_flag
    assert jp6.hardware_levels == ("ampere_plus",)  # SAME_COMPUTE_CAPABILITY: 10.9.0 release notes
    assert jp6.version_compatible and jp6.dla and jp6.optimization_level
    trt86 = assumed_capabilities(8)
    assert trt86.version == "8.6.1" and trt86.explicit_batch_flag and not trt86.strongly_typed_flag
    assert trt86.hardware_levels == ("ampere_plus",) and trt86.version_compatible  # both new in 8.6
    trt11 = assumed_capabilities(11)  # 10.x -> 11.x migration guide: no INT8/FP16/constraint flags
    assert not (trt11.int8_flag or trt11.fp16_flag or trt11.precision_constraints or trt11.explicit_batch_flag)
    assert not trt11.strongly_typed_flag and trt11.hardware_levels == ("ampere_plus", "same_compute_capability")
    assert trt11.dla and trt11.version == "11.4.1"  # DLA is back in 11.4.1 on AGX Orin (11.4.1 release notes)
    with pytest.raises(UsageError, match="use 8, 10 or 11"):
        assumed_capabilities(9)


def test_the_plan_for_jetpack6_refuses_same_compute_capability():
    options = dataclasses.replace(load_profile("jetson-orin").backend_options, hardware_compatibility="same_compute_capability")
    with pytest.raises(UsageError, match="TensorRT 10.3.0 .*new in TensorRT 10.9"):
        plan_build(options, (1, 4), assumed_capabilities(10), graph=GRAPH)


def test_every_trtexec_flag_written_exists_in_that_version():
    from vitedge.backends.tensorrt.versions import trtexec_flag_available

    assert not trtexec_flag_available("--stronglyTyped", (8, 6)) and trtexec_flag_available("--stronglyTyped", (10, 3))
    assert not trtexec_flag_available("--int8", (11, 0)) and not trtexec_flag_available("--precisionConstraints=obey", (11, 4))
    assert not trtexec_flag_available("--hardwareCompatibilityLevel=sameComputeCapability", (10, 3))
    assert trtexec_flag_available("--hardwareCompatibilityLevel=sameComputeCapability", (10, 9))
    assert not trtexec_flag_available("--noSuchFlag", (10, 3))
    # a plan whose trtexec line would carry a flag its TensorRT lacks is refused, not written
    bad = dataclasses.replace(_plan("jetson-orin", "11.0.0"), builder_flags=("INT8",))
    with pytest.raises(UsageError, match="trtexec of TensorRT 11.0.0 does not accept --int8"):
        trtexec_command(bad)


# -- trtexec ----------------------------------------------------------------------------------

def test_trtexec_trt10_desktop():
    cmd = trtexec_command(_plan("desktop-gpu", "10.3.0"))
    ln = ",".join(f"{name}:fp32" for name in LN)
    assert cmd == ("trtexec --onnx=model.int8.onnx --int8 --fp16 --minShapes=input:1x3x224x224 --optShapes=input:8x3x224x224 "
                   "--maxShapes=input:32x3x224x224 --memPoolSize=workspace:4096M --builderOptimizationLevel=3 "
                   f"--timingCacheFile=timing.cache --precisionConstraints=obey --layerPrecisions={ln} --layerOutputTypes={ln} "
                   "--profilingVerbosity=detailed --saveEngine=model.engine --skipInference")


def test_trtexec_line_matches_the_python_build_or_says_how_it_differs():
    """Weak path: apply_plan sets layer.precision and set_output_type to FP32 (both flags are in the line), and
    also pins NORMALIZATION layers by type, which trtexec cannot: said in a comment. Strong path (10.12+, 11):
    the types are in the typed graph, which both read; nothing is pinned, so only the timing-cache note stays."""
    from vitedge.backends.tensorrt.plan import trtexec_differences

    weak = _plan("jetson-orin", "10.11.0")
    cmd = shlex.split(trtexec_command(weak))
    assert "--layerOutputTypes=" + ",".join(f"{n}:fp32" for n in LN) in cmd
    assert any("by layer type" in d for d in trtexec_differences(weak))
    for version in ("10.12.0", "11.4.1"):
        strong = _plan("jetson-orin", version)
        cmd = shlex.split(trtexec_command(strong))
        assert cmd[:3] == ["trtexec", "--onnx=model.int8.typed.onnx", "--stronglyTyped"]
        assert not {"--int8", "--fp16"} & set(cmd) and not any(a.startswith("--layer") or a.startswith("--precision") for a in cmd)
        assert [d for d in trtexec_differences(strong) if "timing cache" not in d] == []


def test_trtexec_txt_states_the_differences(tmp_path):
    from vitedge.backends.tensorrt.plan import write_plan_files

    weak = _plan("jetson-orin", "10.3.0")
    write_plan_files(tmp_path, [weak, reference_plan(weak)], CAPS["10.3.0"], GRAPH)
    text = (tmp_path / "trtexec.txt").read_text()
    int8_part = text.split("# fp32-reference")[0]
    assert "# differs from `vitedge engine`: the Python build pins every NORMALIZATION layer" in int8_part
    assert "--layerOutputTypes=" in int8_part
    dla = _plan("jetson-orin", "10.3.0", dla_core=0)
    write_plan_files(tmp_path, [dla, reference_plan(dla)], CAPS["10.3.0"], GRAPH)
    text = (tmp_path / "trtexec.txt").read_text()
    assert "# note: DLA needs static shapes: one batch size (4, the opt batch)" in text
    assert "# note: DLA with GPU fallback: layers the DLA cannot run" in text
    assert "--minShapes=input:4x3x224x224 --optShapes=input:4x3x224x224 --maxShapes=input:4x3x224x224" in text


def test_trtexec_trt10_jetson_dla():
    cmd = shlex.split(trtexec_command(_plan("jetson-orin", "10.3.0", dla_core=0)))
    assert "--useDLACore=0" in cmd and "--allowGPUFallback" in cmd
    assert "--memPoolSize=workspace:2048M" in cmd and "--optShapes=input:4x3x224x224" in cmd


def test_trtexec_trt86_memory_pool_in_mib():
    cmd = shlex.split(trtexec_command(_plan("jetson-orin-nano", "8.6.1")))
    assert "--memPoolSize=workspace:512" in cmd and "--int8" in cmd and "--fp16" in cmd


def test_trtexec_trt11_strongly_typed():
    cmd = shlex.split(trtexec_command(_plan("jetson-orin", "11.0.0")))
    assert cmd[:3] == ["trtexec", "--onnx=model.int8.typed.onnx", "--stronglyTyped"]
    assert not {"--int8", "--fp16", "--best"} & set(cmd) and not any(a.startswith("--precisionConstraints") for a in cmd)
    assert "--memPoolSize=workspace:2048M" in cmd and "--saveEngine=model.engine" in cmd


def test_trtexec_compatibility_and_reference():
    plan = _plan("desktop-gpu", "10.3.0", hardware_compatibility="ampere_plus", version_compatible=True)
    cmd = shlex.split(trtexec_command(plan))
    assert "--hardwareCompatibilityLevel=ampere+" in cmd and "--versionCompatible" in cmd
    ref = shlex.split(trtexec_command(reference_plan(plan)))
    assert "--onnx=reference.fp32.onnx" in ref and "--noTF32" in ref and "--int8" not in ref and "--saveEngine=reference.fp32.engine" in ref


def test_graph_facts_from_a_real_graph(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["batch", 3, 32, 48])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 32, 48])
    g = helper.make_graph([helper.make_node("Identity", ["pixels"], ["y"], name="id")], "g", [x], [y])
    facts = GraphFacts.from_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert facts.input_name == "pixels" and facts.input_shape == (3, 32, 48) and facts.opset == 17
    bad = helper.make_graph([helper.make_node("Identity", ["pixels"], ["y"])], "g",
                            [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["b", 3, "h", "w"])], [y])
    with pytest.raises(UsageError, match="fixed per-sample dims"):
        GraphFacts.from_model(helper.make_model(bad))
