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
    from vitedge.quantize.select import SELECT_FIRST_LOOK, SELECT_MIN_RATIO, SELECT_MIN_T

    cal = digits["cal"]
    assert cal.config.method == "select" and set(cal.variants) == {"entropy", "p99.99", "p99.999", "minmax", "mse"}
    sel = cal.selection
    assert sel.metric == "softmax_kl" and sel.available == CALIB_ITEMS and {s.name for s in sel.scores} == set(cal.variants)
    # on the trained digits ViT no candidate is 3x closer than entropy on the first look: the choice is made there
    assert sel.samples == SELECT_FIRST_LOOK and all(s.samples == SELECT_FIRST_LOOK for s in sel.scores)
    assert sel.runs == SELECT_FIRST_LOOK // 8 * len({tuple(sorted(v.thresholds.items())) for v in cal.variants.values()})  # batches of 8
    assert f"so none scored on all {CALIB_ITEMS}" in sel.one_line()
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
    from vitedge.onnxkit.structure import graph_inputs
    from vitedge.quantize.select import SELECT_MIN_T, choose

    broken = _collapsed(digits["cal"])
    feeds = [b.images for b in digits["src"].batches(8)]
    sel = choose(broken, graph_inputs(broken.model)[0].name, feeds)
    worst = sel.scores[-1]
    assert worst.name == "entropy" and worst.agreement < 0.9  # the forced collapse is real
    assert sel.chosen != "entropy" and sel.score(sel.chosen).paired_t >= SELECT_MIN_T
    assert sel.score(sel.chosen).error * 10 <= worst.error
    # entropy and every contender are scored on all the images, the choice is made there
    assert sel.samples == CALIB_ITEMS and sel.score("entropy").samples == sel.score(sel.chosen).samples == CALIB_ITEMS


def test_a_candidate_far_from_fp32_on_the_first_look_stops_there(digits):
    """Two candidates collapsed: entropy (the first) and p99.99. p99.99 is not 3x closer than entropy on
    the first look's images, so it is not run on the rest; the others are, and one of them is chosen."""
    from vitedge.onnxkit.structure import graph_inputs
    from vitedge.quantize.select import SELECT_CONTEND_RATIO, SELECT_FIRST_LOOK, choose

    broken = _collapsed(_collapsed(digits["cal"]), "p99.99")
    feeds = [b.images for b in digits["src"].batches(8)]
    sel = choose(broken, graph_inputs(broken.model)[0].name, feeds)
    entropy, p99_99 = sel.score("entropy"), sel.score("p99.99")
    assert p99_99.samples == SELECT_FIRST_LOOK and entropy.samples == CALIB_ITEMS == sel.samples
    assert p99_99.error * SELECT_CONTEND_RATIO > entropy.error * 0.5  # far from FP32 like entropy (its scores differ in images)
    assert sel.chosen not in ("entropy", "p99.99") and sel.score(sel.chosen).samples == CALIB_ITEMS
    assert sel.scores[-1].name == "p99.99"  # ranked after every candidate scored on all the images
    assert f"p99.99 not 3x closer on the first {SELECT_FIRST_LOOK} images, stopped there" in sel.one_line()
    # the FP32 reference on the 4 batches, 5 graphs on the first look's batches, entropy + 3 contenders on the others
    look = SELECT_FIRST_LOOK // 8
    assert sel.runs == 4 + 5 * look + 4 * (4 - look)


def test_budget_tries_calibrations_before_float_layers(digits):
    """A full INT8 graph from a collapsed candidate misses the budget; another candidate's full INT8
    graph meets it, so the budget ships that one with no layer in float."""
    from vitedge.budget import BudgetSearch, BudgetSettings, meet_budget
    from vitedge.validation.reference_cache import ReferenceCacheSettings
    from vitedge.datasources.sources import open_source
    from vitedge.targets.profiles import Thresholds

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
