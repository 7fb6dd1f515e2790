"""Method select, the default calibration (issue 30 items 4 and 5): every candidate's thresholds from
the one pass, scored at the model's output, the choice and its evidence recorded and cached, a
collapsing candidate never chosen, and the accuracy budget trying the other candidates before it
returns any layer to float. On the trained digits ViT (a fixture), with a collapse forced in-test by
shrinking one candidate's thresholds 50x (what entropy did on two corpus ViTs: docs/quantization.md)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from helpers.quantize_models import VAL_DIR, bundled_model, source_for

CALIB_ITEMS = 32


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from vitedge.quantize import QuantConfig, calibrate

    path, spec = bundled_model("digits")
    src = source_for(spec, limit=CALIB_ITEMS)
    cache = tmp_path_factory.mktemp("select-cache")
    return {"path": path, "spec": spec, "src": src, "cache": cache, "cal": calibrate(path, src, QuantConfig(), cache_dir=cache)}


def _collapsed(cal, name: str = "entropy"):
    """``cal`` whose candidate ``name`` clips every activation to a 50th of its threshold."""
    from vitedge.quantize.record import Variant

    v = cal.variants[name]
    exact = {t for t in v.thresholds if t not in cal.variants["mse"].thresholds or v.thresholds[t] == cal.absmax.get(t)}
    broken = Variant(name, {t: th if t in exact else th / 50.0 for t, th in v.thresholds.items()}, v.refinement)
    return dataclasses.replace(cal, variants={**cal.variants, name: broken})


def test_select_scores_every_candidate_and_records_its_choice(digits):
    from vitedge.quantize import METADATA_KEY, QuantConfig, build_qdq, calibrate
    from vitedge.quantize.select import SELECT_MIN_RATIO, SELECT_MIN_T

    cal = digits["cal"]
    assert cal.config.method == "select" and set(cal.variants) == {"entropy", "p99.99", "p99.999", "minmax", "mse"}
    sel = cal.selection
    assert sel.metric == "softmax_kl" and sel.samples == CALIB_ITEMS and {s.name for s in sel.scores} == set(cal.variants)
    assert [s.error for s in sel.scores] == sorted(s.error for s in sel.scores)  # best first
    best, entropy = sel.scores[0], sel.score("entropy")
    switch = best.paired_t >= SELECT_MIN_T and best.error * SELECT_MIN_RATIO <= entropy.error
    assert sel.chosen == (best.name if switch else "entropy")
    assert cal.variant == sel.chosen and cal.thresholds == cal.variants[sel.chosen].thresholds
    meta = json.loads({p.key: p.value for p in build_qdq(cal).model.metadata_props}[METADATA_KEY])
    assert meta["selection"]["chosen"] == sel.chosen and len(meta["selection"]["candidates"]) == 5
    assert f"thresholds by {sel.chosen}" in cal.one_line()
    again = calibrate(digits["path"], digits["src"], QuantConfig(), cache_dir=digits["cache"])
    assert again.reused and again.forward_passes == 0 and again.selection.reused  # nothing runs on a warm rebuild
    assert again.selection.to_dict() == sel.to_dict() and again.thresholds == cal.thresholds


def test_a_collapsing_candidate_is_never_chosen(digits):
    """Entropy is the candidate kept when the others are not measurably closer; collapsed, it is far
    from FP32 on every image and the paired test moves the choice."""
    from vitedge.onnxutil import graph_inputs
    from vitedge.quantize.select import SELECT_MIN_T, choose

    broken = _collapsed(digits["cal"])
    feeds = [b.images for b in digits["src"].batches(8)]
    sel = choose(broken, graph_inputs(broken.model)[0].name, feeds)
    worst = sel.scores[-1]
    assert worst.name == "entropy" and worst.agreement < 0.9  # the forced collapse is real
    assert sel.chosen != "entropy" and sel.score(sel.chosen).paired_t >= SELECT_MIN_T
    assert sel.score(sel.chosen).error * 10 <= worst.error


def test_budget_tries_calibrations_before_float_layers(digits):
    """A full INT8 graph from a collapsed candidate misses the budget; another candidate's full INT8
    graph meets it, so the budget ships that one with no layer in float."""
    from vitedge.budget import BudgetSearch, BudgetSettings, meet_budget
    from vitedge.validation.reference_cache import ReferenceCacheSettings
    from vitedge.datasources.sources import open_source
    from vitedge.profiles import Thresholds

    cal = _collapsed(digits["cal"]).with_variant("entropy")
    spec = digits["spec"]
    val = open_source(VAL_DIR, spec.preprocess, limit=120, seed=0, class_names=spec.class_names)
    r = meet_budget(BudgetSearch(calibration=cal, source=val, thresholds=Thresholds(max_top1_drop=0.5, min_agreement=0.99),
                                 fp32=digits["path"], settings=BudgetSettings(measure_cost=False),
                                 cache=ReferenceCacheSettings(root=digits["cache"])))
    steps = [e.step for e in r.evaluations]
    assert steps[0] == "full-int8" and not r.evaluations[0].passed and r.evaluations[0].variant == "entropy"
    assert r.status == "int8" and r.returned == () and r.calibration != "entropy" and r.calibration_chosen == "entropy"
    assert steps[-1] == "calibration" and r.evaluations[-1].passed and "calibration" not in steps[:1]
    assert r.graph.calibration.variant == r.calibration and not r.graph.kept_float or all(
        n in r.graph.kept_float for n in r.graph.kept_float)
    rec = r.to_dict()
    assert rec["calibration"] == {"chosen_by_calibration": "entropy", "shipped": r.calibration}
    assert rec["evaluations"][-1]["calibration"] == r.calibration
