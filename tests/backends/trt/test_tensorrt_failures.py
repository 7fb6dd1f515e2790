"""Every way TensorRT reports failure, per version, driven through vitedge to one line.

TensorRT does not raise: OnnxParser.parse_from_file returns False with IParserError objects
behind num_errors/get_error(i), Builder.build_serialized_network returns None,
IExecutionContext.set_input_shape returns False, Runtime.deserialize_cuda_engine and
create_execution_context return None, and the reason goes to the ILogger. The recording
stand-in (tests/helpers/tensorrt_standin.py) does the same, so these tests run vitedge's handling of
each: apply_plan (the build) and TensorRtRunner (the run). No TensorRT is used or claimed."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers.tensorrt_standin import make_fake_cudart, make_fake_trt
from onnx import TensorProto, helper

from vitedge.backends.tensorrt.apply import apply_plan
from vitedge.backends.tensorrt.plan import (
    TensorRtOptions,
    assumed_capabilities,
    capabilities_from_module,
    plan_build,
)
from vitedge.backends.tensorrt.runner import TensorRtRunner
from vitedge.core.errors import BundleError

VERSIONS = ["8.6.1", "10.3.0", "11.4.0"]


def _plan(trt, graph, **options):
    return plan_build(TensorRtOptions(opt_batch=4, **options), (1, 4, 8), capabilities_from_module(trt), graph=graph)


def _one_line_error(fn, match: str) -> str:
    with pytest.raises(BundleError) as err:
        fn()
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    assert match in msg, msg
    return msg


def _graph_for(tiny, plan):
    path, _ = tiny
    return path.parent / plan.graph


@pytest.mark.parametrize("version", VERSIONS)
def test_a_file_that_is_not_onnx_is_a_parse_error(tiny, tmp_path, version):
    _, graph = tiny
    trt = make_fake_trt(version)
    bad = tmp_path / "model.int8.onnx"
    bad.write_bytes(b"\x00not a protobuf" * 7)
    msg = _one_line_error(lambda: apply_plan(trt, _plan(trt, graph), bad), f"TensorRT {version}'s ONNX parser rejected model.int8.onnx")
    assert "MODEL_DESERIALIZE_FAILED" in msg and "builder.build_serialized_network" not in [c[0] for c in trt.calls]


@pytest.mark.parametrize("version", VERSIONS)
def test_an_op_without_importer_is_named_with_the_parsers_own_words(tiny, tmp_path, version):
    """A graph with a com.microsoft op (as the onnx target's fused attention would be)."""
    _, graph = tiny
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 8, 8])
    node = helper.make_node("MultiHeadAttention", ["input", "input", "input"], ["y"], name="/attn/mha", domain="com.microsoft", num_heads=1)
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / "model.int8.onnx"
    onnx.save(model, str(path))
    trt = make_fake_trt(version)
    msg = _one_line_error(lambda: apply_plan(trt, _plan(trt, graph), path), "No importer registered for op: MultiHeadAttention")
    # 10.x and later name the node and operator in IParserError's text; 8.6 gives only its index
    assert ("with name: /attn/mha and operator: MultiHeadAttention" in msg) == (version != "8.6.1")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("failure, match", [
    ("build", "could not build model.engine from model.int8"),
    ("deserialize", "built model.engine but cannot deserialise it"),
])
def test_builder_failures_carry_tensorrts_reason(tiny, version, failure, match):
    _, graph = tiny
    trt = make_fake_trt(version, fail={failure})
    plan = _plan(trt, graph)
    msg = _one_line_error(lambda: apply_plan(trt, plan, _graph_for(tiny, plan)), match)
    assert f"TensorRT {version}" in msg and "Error Code" in msg  # the logger's error, not "see above"


@pytest.mark.parametrize("version, cores, match", [
    ("10.3.0", 0, "0 DLA core(s)"),  # Orin Nano: the builder reports num_DLA_cores = 0
    ("11.2.0", 2, "0 DLA core(s)"),  # no DLA in TensorRT 11.0-11.3, even on an AGX Orin
])
def test_dla_unavailable_is_one_line(tiny, version, cores, match):
    _, graph = tiny
    trt = make_fake_trt(version, dla_cores=cores)
    # planned where DLA exists (JetPack 6 / TensorRT 11.4), built where it does not
    plan = plan_build(TensorRtOptions(opt_batch=4, dla_core=0), (1, 4, 8), assumed_capabilities(11 if version.startswith("11") else 10),
                      graph=graph)
    plan_file = plan.graph
    msg = _one_line_error(lambda: apply_plan(trt, plan, tiny[0].parent / plan_file), match)
    assert "dla_core = -1" in msg


def test_dla_without_gpu_fallback_fails_on_the_layer_the_dla_cannot_run(tiny):
    _, graph = tiny
    trt = make_fake_trt("10.3.0", dla_cores=2)
    plan = _plan(trt, graph, dla_core=0, gpu_fallback=False)
    _one_line_error(lambda: apply_plan(trt, plan, _graph_for(tiny, plan)), "cannot run on DLA and GPU fallback is off")


# -- the runner ---------------------------------------------------------------------------------

@pytest.fixture
def engine_file(tiny, tmp_path):
    _, graph = tiny
    trt = make_fake_trt("10.3.0")
    plan = _plan(trt, graph)
    built = apply_plan(trt, plan, _graph_for(tiny, plan))
    path = tmp_path / "model.engine"
    path.write_bytes(built.engine)
    return path


def _runner(path, **fake):
    cudart = make_fake_cudart()
    return TensorRtRunner(path, trt=make_fake_trt(fake.pop("version", "10.3.0"), cudart=cudart, **fake), cudart=cudart,
                          check_device=False)


def test_the_runner_works_before_any_failure_is_injected(engine_file):
    x = np.random.default_rng(0).standard_normal((3, 3, 8, 8)).astype(np.float32)
    with _runner(engine_file) as r:
        assert r.infer(x).shape == (3, 3, 8, 8)


@pytest.mark.parametrize("fake, match", [
    ({"fail": {"shape"}}, "TensorRT rejected input shape (2, 3, 8, 8)"),
    ({"fail": {"context"}}, "could not create an execution context"),
    ({"fail": {"execute"}}, "failed to run model.engine on a batch of 2"),
    ({"fail": {"deserialize"}}, "could not deserialise model.engine"),
    ({"version": "10.4.0"}, "could not deserialise model.engine: 1: [stdArchiveReader.cpp] Error Code 1: Serialization (Version tag"),
])
def test_runner_failures_are_one_line(engine_file, fake, match):
    x = np.zeros((2, 3, 8, 8), np.float32)

    def run():
        with _runner(engine_file, **fake) as r:
            r.infer(x)

    _one_line_error(run, match)


def test_a_file_that_is_not_an_engine(engine_file):
    engine_file.write_bytes(b"garbage")
    _one_line_error(lambda: _runner(engine_file).open(), "Magic tag does not match")


def test_cuda_out_of_memory_is_one_line(engine_file):
    """cuda-python returns (error, value) tuples; a failed cudaMalloc names the call and the error."""
    cudart = make_fake_cudart()
    cudart.cudaMalloc = lambda n: (cudart.cudaError_t.cudaErrorMemoryAllocation, None)
    runner = TensorRtRunner(engine_file, trt=make_fake_trt("10.3.0", cudart=cudart), cudart=cudart, check_device=False)

    def run():
        with runner as r:
            r.infer(np.zeros((1, 3, 8, 8), np.float32))

    _one_line_error(run, "CUDA call cudaMalloc failed: cudaErrorMemoryAllocation")
