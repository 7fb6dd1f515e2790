"""The targets that keep float what INT8 does not pay for, timed on the build machine (issue 47 item 2).

What INT8 pays on a given machine is a timing, so these tests do not assert which way a decision goes: they pin
what each decision leaves behind and how it is recorded. The rewrite itself (a layer back to float), the mapping
from OpenVINO's runtime layer names to the Q/DQ graph's, and the records are checked on real graphs and runtimes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import CALIB_DIR
from helpers.encoder_checkpoint import encoder_vit_checkpoint
from onnx import TensorProto, helper, numpy_helper

from vitedge.backends.float_layers import int8_layers, return_to_float
from vitedge.backends.int8_timing import timed_steps_line
from vitedge.backends.ov_payoff import OvPayoff, onnx_layer
from vitedge.core.errors import UsageError
from vitedge.onnxkit.session import SessionSettings, ort_session


def _qdq_matmul(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """x -> Q -> DQ -> MatMul(DQ(int8 w), per-channel) -> y; returns (the float weight it dequantizes to, the scale)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    scale = (np.abs(w).max(axis=0) / 127).astype(np.float32)
    q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    inits = [numpy_helper.from_array(q, "w_q"), numpy_helper.from_array(scale, "w_s"), numpy_helper.from_array(np.zeros(4, np.int8), "w_z"),
             numpy_helper.from_array(np.array(0.05, np.float32), "x_s"), numpy_helper.from_array(np.array(128, np.uint8), "x_z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["x_q"], name="x_quant"),
             helper.make_node("DequantizeLinear", ["x_q", "x_s", "x_z"], ["x_dq"], name="x_dequant"),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w_dq"], name="w_dequant", axis=1),
             helper.make_node("MatMul", ["x_dq", "w_dq"], ["y"], name="/block/fc/MatMul")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return (q.astype(np.float32) * scale).astype(np.float32), scale


def test_a_layer_back_to_float_reads_the_unquantized_input_and_the_dequantized_weight(tmp_path):
    weight, _ = _qdq_matmul(tmp_path / "g.onnx")
    model = onnx.load(str(tmp_path / "g.onnx"))
    assert list(int8_layers(model)) == ["/block/fc/MatMul"]
    kept = return_to_float(model, lambda node, dq: "slower here" if node.name == "/block/fc/MatMul" else None)
    assert kept == [{"name": "/block/fc/MatMul", "op_type": "MatMul", "why": "slower here"}]
    assert not int8_layers(model) and {n.op_type for n in model.graph.node} == {"MatMul"}  # the Q/DQ pairs are gone
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    got = ort_session(model.SerializeToString(), SessionSettings()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x @ weight, rtol=1e-5, atol=1e-5)  # the weight INT8 used, the input unrounded


def test_nothing_chosen_leaves_the_graph_as_it_was(tmp_path):
    _qdq_matmul(tmp_path / "g.onnx")
    model = onnx.load(str(tmp_path / "g.onnx"))
    before = model.SerializeToString()
    assert return_to_float(model, lambda node, dq: None) == [] and model.SerializeToString() == before


@pytest.mark.parametrize("names, expected", [
    (["/block/fc/MatMul/DequantizationMultiply", "/block/fc/Add"], "/block/fc/MatMul"),  # INT8 FC with its bias
    (["/block/fc/MatMul"], "/block/fc/MatMul"),
    (["/head/Gemm/WithoutBiases/DequantizationMultiply"], "/head/Gemm"),
    (["/block/attn/MatMul_1"], None),  # a float attention MatMul: no INT8 layer of the Q/DQ graph
])
def test_openvino_runtime_layers_map_to_the_qdq_graphs_layers(names, expected):
    assert onnx_layer(names, {"/block/fc/MatMul": 0, "/head/Gemm": 0}) == expected


def test_ir_names_map_to_qdq_layers_on_a_real_conversion(tmp_path):
    """Every INT8 FullyConnected of OpenVINO's runtime model of a real Q/DQ graph maps back to its ONNX layer."""
    pytest.importorskip("openvino")
    from vitedge.backends.openvino import _convert
    from vitedge.backends.ov_payoff import _profiled, layer_outputs

    _qdq_matmul(tmp_path / "g.onnx")
    xml = _convert(tmp_path / "g.onnx", "model", "float-nchw", tmp_path)
    import openvino as ov

    model = ov.Core().read_model(str(xml))
    model.reshape({model.inputs[0]: [2, 8]})
    compiled = ov.Core().compile_model(model, "CPU", {"PERF_COUNT": "YES", "INFERENCE_NUM_THREADS": 1})
    rows = _profiled((compiled, np.ones((2, 8), np.float32)), runs=2)
    graph = onnx.load(str(tmp_path / "g.onnx"))
    layers = int8_layers(graph)
    # the layer that feeds the graph's output is named after the output tensor ("y") in OpenVINO's runtime model
    assert [onnx_layer(names, layers, layer_outputs(graph, layers)) for names, _ms, is_int8 in rows if is_int8] == ["/block/fc/MatMul"]


def test_records_say_what_was_tried_and_kept():
    steps = ({"step": "INT8 (bf16 float regions)", "ratios": {1: 1.27, 8: 1.14}, "taken": True},
             {"step": "INT8 (f32 float regions)", "ratios": {1: 1.08, 8: 0.84}, "taken": True},
             {"step": "whole model float", "ratios": {1: 1.01, 8: 0.99}, "taken": True})
    whole = OvPayoff("amx", steps, ({"name": "fc", "op_type": "MatMul", "why": "w"},), True, "f32", noise=0.03)
    line = whole.one_line()
    assert "the whole model is kept float" in line and "INT8 (bf16 float regions) 1.27/1.14" in line and "on amx" in line
    record = whole.to_dict()
    assert record["whole_model_float"] and record["float_precision"] == "f32" and record["control_noise"] == 0.03
    assert record["steps"][1]["int8_over_fp32"] == {"1": 1.08, "8": 0.84} and record["kept_float"][0]["name"] == "fc"
    pays = OvPayoff("amx", ({"step": "INT8 (f32 float regions)", "ratios": {1: 0.7, 8: 0.5}, "taken": True},))
    assert pays.one_line() == "INT8 payoff: INT8 pays on OpenVINO on amx (INT8/FP32 time b1 0.70, b8 0.50)"
    assert timed_steps_line(list(steps[:2])) == "INT8 (bf16 float regions) 1.27/1.14, INT8 (f32 float regions) 1.08/0.84"


@pytest.mark.parametrize("backend", ["openvino", "onnxruntime"])
def test_int8_payoff_option_must_be_a_boolean(backend):
    if backend == "openvino":
        from vitedge.backends.openvino import OpenVinoOptions as Options
    else:
        from vitedge.backends.onnxruntime.backend import OnnxRuntimeOptions as Options
    with pytest.raises(UsageError, match="int8_payoff must be true or false"):
        Options(int8_payoff="yes")


@pytest.mark.skipif(not CALIB_DIR.is_dir(), reason="calibration/digits is not in this checkout")
def test_build_ships_what_its_payoff_record_says(tmp_path):
    """`vitedge build --target onnx --target intel-cpu` of a small ViT: each target's record has the INT8/FP32 ratio
    it measured at batch 1 and 8, and the shipped artifact is what the record says (whole model float: no INT8
    layer runs; layers kept float: none of them reads an int8 weight; otherwise INT8 layers run)."""
    pytest.importorskip("openvino")
    from vitedge.app.build import BuildRequest, run_build
    from vitedge.budget import BudgetSettings
    from vitedge.core.cpu import read_cpu
    from vitedge.bundle.manifest import read_manifest
    from vitedge.core.ui import StageLog
    from vitedge.validation.reference_cache import ReferenceCacheSettings

    enc_path, intake = encoder_vit_checkpoint(tmp_path, depth=2)
    results = run_build(BuildRequest(model=enc_path, targets=("onnx", "intel-cpu"), calib=CALIB_DIR, calib_size=16,
                                     out=tmp_path / "out", intake=intake, cache=ReferenceCacheSettings(root=tmp_path / "cache"),
                                     measure_speed=False, budget=BudgetSettings(enabled=False)), StageLog(quiet=True))
    for result in results:
        manifest = read_manifest(result.bundle)
        if manifest.target["backend"] == "openvino" and read_cpu().int8_dot_product is False:
            assert "int8_payoff" not in manifest.backend_info  # AVX2: the profile's allowance, not timed
            continue
        record = manifest.backend_info["int8_payoff"]
        assert manifest.quantization["int8_payoff"] == record
        timed = record["timed"] if manifest.target["backend"] == "onnxruntime" else record
        assert set(timed["steps"][0]["int8_over_fp32"]) == {"1", "8"} and timed["control_noise"] >= 0
        assert (timed["timed_on"] if timed is not record else record["cpu"]) == read_cpu().isa
        whole = timed["whole_model_float"]
        if manifest.target["backend"] == "onnxruntime":  # decided for this CPU's kind, by timing here
            from vitedge.backends.onnxruntime.figures import host_kind

            assert record["cpu_kind"] == record["built_on"] == host_kind() and record["decided_by"] == f"measured on this CPU ({host_kind()})"
        # whole model float: the FP32 reference is the artifact, held once (intel-cpu: its IR; no model.xml, no Q/DQ graph)
        assert (manifest.artifacts.model == manifest.artifacts.reference) == whole == (manifest.artifacts.single_graph is True)
        assert (result.bundle / "model.int8.onnx").is_file() != whole
        shipped = onnx.load(str(result.bundle / manifest.artifacts.model)) if manifest.target["backend"] == "onnxruntime" \
            else onnx.load(str(result.bundle / manifest.artifacts.qdq))
        still_int8 = set(int8_layers(shipped)) | {n.name for n in shipped.graph.node if n.op_type == "MatMulIntegerToFloat"}
        assert not (still_int8 & {k["name"] for k in record["kept_float"]})
        assert (manifest.backend_info["int8_layers"]["int8"] == 0) == whole
        if whole:
            assert not still_int8 and record["kept_float"]
        report = (result.bundle / "report.md").read_text()
        assert ("kept float where INT8 does not pay" in report) == bool(record["kept_float"])
        json.dumps(record)  # the record is plain JSON


def test_a_slow_graph_is_timed_briefly():
    """A graph slower than ``slow_call`` per run gets one timed run per round and 2 rounds (no minutes per batch
    size on a large model): counted in calls, not in time."""
    from vitedge.backends.int8_timing import PayoffTiming, interleaved_ratio

    calls = {"fp32": 0, "control": 0, "int8": 0}

    def graph(key):
        def run():
            calls[key] += 1
            sum(range(20000))  # some CPU time, far above slow_call=0
        return run

    interleaved_ratio(graph("fp32"), graph("control"), graph("int8"), PayoffTiming(slow_call=0.0, clear_margin=0.0))
    assert calls == {"fp32": 4, "control": 4, "int8": 4}  # 2 first runs + 2 rounds of 1, no untimed runs


def test_a_ratio_clear_of_the_noise_stops_at_the_least_rounds():
    """INT8 three times FP32's work: after ``min_rounds`` the ratio is far from 1 beside the control, so the timing
    stops there instead of running to its time limit or ``max_rounds`` (what every test build paid): counted in calls."""
    from vitedge.backends.int8_timing import PayoffTiming, interleaved_ratio, settled

    calls = {"fp32": 0, "control": 0, "int8": 0}

    def graph(key, work):
        def run():
            calls[key] += 1
            sum(range(work))
        return run

    timing = PayoffTiming(min_rounds=6, max_rounds=40, per_round=4, seconds=60.0, clear_margin=0.0, slow_call=10.0)
    ratio, _ = interleaved_ratio(graph("fp32", 3000), graph("control", 3000), graph("int8", 9000), timing)
    assert ratio > 1.5
    assert calls == {k: 2 + 6 * 5 for k in calls}  # 2 first runs, then 6 rounds of one untimed and 4 timed runs
    assert settled(1.5, 1.02, timing) and not settled(1.05, 1.0, timing) and not settled(0.7, 1.15, timing)


def _matmul_chain(path: Path, width: int, tokens: int, links: int) -> Path:
    """x [B, tokens, width] -> ``links`` MatMuls by one width x width weight -> y: float work that grows with ``links``."""
    w = numpy_helper.from_array((np.eye(width) + 0.01 * np.random.default_rng(0).standard_normal((width, width))).astype(np.float32), "w")
    names = ["x"] + [f"h{i}" for i in range(links - 1)] + ["y"]
    nodes = [helper.make_node("MatMul", [names[i], "w"], [names[i + 1]], name=f"mm{i}") for i in range(links)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, tokens, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, tokens, width])], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_the_whole_model_decision_reads_the_noise_and_the_graphs_time():
    """Only "slower" sends a model to float: INT8/FP32 above 1 by more than the control moved and than the margin,
    on a graph long enough to time."""
    from vitedge.backends.int8_timing import FASTER, SLOWER, TOO_SHORT, WITHIN_NOISE, PayoffTiming, TimedRatio, payoff_verdict

    timing = PayoffTiming(slower_margin=0.02, min_seconds=2e-4)
    assert payoff_verdict(TimedRatio(1.10, 1.00, 1e-3), timing) == SLOWER
    assert payoff_verdict(TimedRatio(1.10, 0.88, 1e-3), timing) == WITHIN_NOISE  # the control moved by 12 %
    assert payoff_verdict(TimedRatio(1.015, 1.0, 1e-3), timing) == WITHIN_NOISE  # under the margin
    assert payoff_verdict(TimedRatio(0.90, 1.0, 1e-3), timing) == FASTER
    assert payoff_verdict(TimedRatio(3.00, 1.0, 1e-4), timing) == TOO_SHORT  # 0.1 ms: the timing cannot tell


def test_int8_ships_only_when_faster_on_the_mean_and_slower_at_no_batch_size():
    """The whole-model rule on the verdicts it reads: INT8 slower beyond the noise at one batch size, or not faster on
    the mean of the batch sizes long enough to time, sends the whole model back to float; one batch size within the
    noise above 1 is kept when the others make the mean faster; batch sizes too short to time count for nothing."""
    from vitedge.backends.int8_timing import FASTER, SLOWER, TOO_SHORT, WITHIN_NOISE
    from vitedge.backends.onnxruntime.payoff import whole_model_float_reason

    assert whole_model_float_reason({1: 1.02, 8: 0.85}, {1: WITHIN_NOISE, 8: FASTER}) is None
    assert whole_model_float_reason({1: 0.90, 8: 0.95}, {1: FASTER, 8: FASTER}) is None
    # kavishka-shallow's build under load: 1.02 within a 6.6 % control at batch 1, no gain at 8: it may be slower
    reason = whole_model_float_reason({1: 1.02, 8: 0.99}, {1: WITHIN_NOISE, 8: FASTER})
    assert reason is not None and reason.startswith("not faster than FP32") and "1.00" in reason
    assert whole_model_float_reason({1: 1.30, 8: 0.60}, {1: SLOWER, 8: FASTER}) == "slower than FP32"
    assert whole_model_float_reason({1: 3.0, 8: 0.95}, {1: TOO_SHORT, 8: FASTER}) is None  # only batch 8 counts
    assert whole_model_float_reason({1: 3.0, 8: 1.4}, {1: TOO_SHORT, 8: TOO_SHORT}) is None  # nothing timed: kept


def test_a_graph_too_short_to_time_keeps_int8_and_says_why(tmp_path):
    """An "INT8" graph with 8 times FP32's work, both under the timing's shortest measurable call (set to 50 ms here
    so the test does not hang on this machine's speed): the build cannot tell them apart, so it keeps the artifact
    and the record says so. Before, any ratio above 1 shipped the whole model float."""
    from vitedge.backends.int8_timing import PayoffTiming
    from vitedge.backends.onnxruntime.payoff import keep_float_if_slower

    ref = _matmul_chain(tmp_path / "ref.onnx", 8, 4, 1)
    model = _matmul_chain(tmp_path / "model.onnx", 8, 4, 8)
    before = model.read_bytes()
    record = keep_float_if_slower(model, ref, (1, 8), "avx2", PayoffTiming(min_seconds=0.05))
    assert record["whole_model_float"] is False and model.read_bytes() == before
    assert record["verdicts"] == {"1": "too short to time", "8": "too short to time"}
    assert "cannot tell" in record["undecided"] and all(0 < ms < 50 for ms in record["fp32_ms"].values())
    assert set(record["steps"][0]["int8_over_fp32"]) == {"1", "8"}


def test_a_graph_clearly_slower_than_fp32_ships_fp32(tmp_path):
    """Three times FP32's work on a graph that takes milliseconds: slower beyond any control's noise, so the record
    says the whole model goes float (the backend then ships the FP32 graph in its place; the timing writes nothing)."""
    from vitedge.backends.onnxruntime.payoff import keep_float_if_slower

    ref = _matmul_chain(tmp_path / "ref.onnx", 256, 512, 1)
    model = _matmul_chain(tmp_path / "model.onnx", 256, 512, 3)
    before = model.read_bytes()
    record = keep_float_if_slower(model, ref, (1,), "avx2")
    assert record["verdicts"] == {"1": "slower"} and record["fp32_ms"]["1"] >= 0.02, record
    assert record["whole_model_float"] is True and model.read_bytes() == before and "undecided" not in record
