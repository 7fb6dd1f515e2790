"""What a bundle ships after its target kept INT8 layers float (issue 47 item 2): the manifest's layer counts and the
accuracy budget's verdict speak of the shipped graph, not of the shared all-INT8 Q/DQ graph."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from conftest import CALIB_DIR
from helpers.encoder_checkpoint import encoder_vit_checkpoint

from vitedge.app.shipped import count_shipped, ships_fp32, shipped_budget_verdict
from vitedge.bundle.sections import QuantizationSection
from vitedge.quantize.graph import QuantLayer


def _graph():
    layers = tuple(QuantLayer(n, k, "MatMul", ("x",)) for n, k in (("a", "linear"), ("b", "linear"), ("c", "head"), ("d", "linear")))
    return SimpleNamespace(layers=layers, quantized=("a", "b", "c"), kept_float=("d",))


def _section():
    return QuantizationSection(config={}, layers_total=4, layers_int8=3, kept_float=["d"],
                               layer_kinds={"linear": {"int8": 2, "total": 3}, "head": {"int8": 1, "total": 1}},
                               summary_line="3 of 4 layers INT8 (head 1/1, linear 2/3)", weight_range="full", cpu_requirement="any-x86")


def test_layers_kept_float_by_the_target_leave_the_int8_count():
    section = _section()
    info = {"int8_payoff": {"cpu": "avx2", "kept_float": [{"name": "b", "op_type": "MatMul", "why": "slower"}]}}
    assert count_shipped(section, _graph(), info) == 1
    assert section.layers_int8 == 2 and section.kept_float == ["d", "b"]
    assert section.layer_kinds == {"linear": {"int8": 1, "total": 3}, "head": {"int8": 1, "total": 1}}
    assert section.summary_line.startswith("2 of 4 layers INT8 as shipped (1 INT8 layer(s) returned to float") and "avx2" in section.summary_line


def test_the_whole_model_kept_float_ships_no_int8_layer():
    section = _section()
    info = {"int8_payoff": {"cpu": "avx2", "kept_float": [{"name": "a"}],  # a record may name only some of them
                            "timed": {"whole_model_float": True}}}
    assert ships_fp32(info) and count_shipped(section, _graph(), info) == 3
    assert section.layers_int8 == 0 and section.layer_kinds["head"] == {"int8": 0, "total": 1} and "the whole model" in section.summary_line


def test_nothing_kept_float_leaves_the_section_as_it_was():
    section = _section()
    assert count_shipped(section, _graph(), {"int8_payoff": {"kept_float": []}}) == 0 and section == _section()
    assert count_shipped(section, _graph(), {}) == 0 and section == _section()


def _row(name, status, detail=""):
    return SimpleNamespace(name=name, status=status, detail=detail)


def test_the_budget_verdict_is_the_shipped_graphs():
    kept = {"int8_payoff": {"cpu": "avx2", "kept_float": [{"name": "b"}]}}
    whole = {"int8_payoff": {"cpu": "avx2", "whole_model_float": True, "kept_float": [{"name": "a"}]}}
    # the budget met: nothing to re-judge, whatever the target kept
    assert shipped_budget_verdict(None, kept, [_row("max_top1_drop", "fail")]) == (None, None)
    # not met on the shared graph, no keep-float: the budget's line stands
    assert shipped_budget_verdict("budget not met", {}, [_row("max_top1_drop", "pass")]) == ("budget not met", None)
    # the FP32 graph ships: nothing of INT8 to fail
    failure, verdict = shipped_budget_verdict("budget not met", whole, None)
    assert failure is None and verdict["passed"] is True and "FP32 graph" in verdict["detail"]
    # layers kept float: the validation gate judged the shipped graph; its speed rows are not accuracy
    failure, verdict = shipped_budget_verdict("budget not met", kept, [_row("max_top1_drop", "pass"), _row("min_speedup", "fail")])
    assert failure is None and verdict["passed"] is True and "shipped graph" in verdict["detail"]
    failure, verdict = shipped_budget_verdict("budget not met", kept, [_row("max_top1_drop", "fail", "drop 0.6 points")])
    assert "drop 0.6 points" in failure and verdict["passed"] is False
    # not validated here: the budget's verdict on the closest graph stands
    assert shipped_budget_verdict("budget not met", kept, None) == ("budget not met", None)


@pytest.mark.skipif(not CALIB_DIR.is_dir(), reason="calibration/digits is not in this checkout")
def test_a_bundle_kept_float_whole_counts_no_int8_layer(tmp_path, monkeypatch):
    """The onnx target's timing says INT8 is slower (made so here): the bundle ships the FP32 graph, and its manifest
    and report/validation.json count 0 INT8 layers, not the shared Q/DQ graph's."""
    import vitedge.backends.onnxruntime.payoff as payoff
    from vitedge.app.build import BuildRequest, run_build
    from vitedge.budget import BudgetSettings
    from vitedge.bundle.manifest import read_manifest
    from vitedge.core.ui import StageLog
    from vitedge.validation.reference_cache import ReferenceCacheSettings

    from vitedge.backends.int8_timing import TimedRatio

    monkeypatch.setattr(payoff, "interleaved_times", lambda *a, **k: TimedRatio(1.5, 1.0, 1e-3))
    enc_path, intake = encoder_vit_checkpoint(tmp_path, depth=1)
    [result] = run_build(BuildRequest(model=enc_path, targets=("onnx",), calib=CALIB_DIR, calib_size=16,
                                      out=tmp_path / "out", intake=intake, cache=ReferenceCacheSettings(root=tmp_path / "cache"),
                                      measure_speed=False, budget=BudgetSettings(enabled=False)), StageLog(quiet=True))
    manifest = read_manifest(result.bundle)
    q = manifest.quantization
    assert q["int8_payoff"]["timed"]["whole_model_float"] and manifest.backend_info["int8_layers"]["int8"] == 0
    assert q["layers_int8"] == 0 and all(v["int8"] == 0 for v in q["layer_kinds"].values())
    assert "as shipped (the whole model returned to float" in q["summary_line"]
    validation = json.loads((result.bundle / "report" / "validation.json").read_text())
    assert validation["quantization"]["layers_int8"] == 0
