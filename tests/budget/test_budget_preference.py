"""The accuracy budget ships only what the gate passes, by the gate's own rows, and among the passing candidates it
evaluated at the same speed prefers the one closest to FP32: fewest flips where FP32 is decisive, then the smallest
expected drop (issue 43 item 4, docs/gate.md)."""

from __future__ import annotations

import numpy as np

from vitedge.budget.evaluate import Evaluator
from vitedge.budget.record import Evaluation
from vitedge.budget.search import _closeness, closest_passing
from vitedge.targets.profiles import Thresholds


def _acc(agreement: float, decisive_flips: int, expected: float, decisive: int = 400) -> dict:
    return {"output_kind": "logits", "top1_agreement": agreement, "decisive_samples": decisive, "decisive_flips": decisive_flips,
            "expected_drop_points": expected}


def test_closeness_ranks_decisive_flips_then_expected_drop_not_agreement():
    """A candidate with more agreement overall but a flip where FP32 was sure is further from FP32 than one whose
    flips are all near-ties; between equal decisive flips, the smaller expected drop is closer."""
    near_ties_only = _acc(0.95, 0, 0.40)
    one_sure_flip = _acc(0.99, 1, 0.05)  # the old ranking (overall agreement) put this one first
    fewer_expected = _acc(0.94, 0, 0.10)
    ranked = sorted([near_ties_only, one_sure_flip, fewer_expected], key=_closeness, reverse=True)
    assert ranked == [fewer_expected, near_ties_only, one_sure_flip]
    few = _acc(0.97, 3, 0.0, decisive=10)  # too few decisive images to count them: overall disagreement decides
    assert _closeness(few)[0] == -(1 - 0.97)


def _ev(i: int, returned: tuple[str, ...], passed: bool, acc: dict) -> Evaluation:
    return Evaluation(i, "prune", returned, passed, acc, [] if passed else ["miss"], 0.0)


def test_the_closest_passing_candidate_at_the_same_speed_ships():
    evaluations = [_ev(1, ("a", "b", "c"), True, _acc(0.990, 2, 0.30)),
                   _ev(2, ("a", "b"), True, _acc(0.980, 3, 0.40)),  # passes, but further from FP32 than 3
                   _ev(3, ("a", "c"), True, _acc(0.970, 0, 0.20)),
                   _ev(4, ("b", "c"), False, _acc(0.999, 0, 0.01)),  # a miss is never shipped
                   _ev(5, ("c",), False, _acc(0.900, 9, 2.0))]
    assert closest_passing(evaluations, ("a", "b")) == ("a", "c")
    assert closest_passing(evaluations, ("a", "b", "c")) == ("a", "b", "c")  # fewer float layers stay preferred
    assert closest_passing([], ("x",)) == ("x",)


def test_the_budget_verdict_refuses_decisive_flips_the_labels_would_have_excused():
    """Evaluator.verdict applies the gate's accuracy rows, min_decisive_agreement included: a candidate that flips 8 %
    of the images FP32 is sure of misses the budget even when its labels show no loss."""
    rng = np.random.default_rng(2)
    n, classes = 600, 10
    ref = rng.normal(0.0, 0.3, size=(n, classes)).astype(np.float32)
    a = rng.integers(0, classes, size=n)
    ref[np.arange(n), a] = 6.0
    got = ref.copy()
    flipped = np.flatnonzero(rng.random(n) < 0.08)
    got[flipped, a[flipped]] = -6.0
    labels = a.copy()  # FP32 right everywhere but on half the flipped images, where INT8 is: as many gained as lost
    labels[flipped[::2]] = got[flipped[::2]].argmax(1)
    from vitedge.validation.accuracy import compare_logits

    acc = compare_logits(ref, got, labels)
    acc["output_kind"] = "logits"
    ev = Evaluator.__new__(Evaluator)
    ev.thresholds = Thresholds(max_top1_drop=0.2, min_agreement=0.995)
    assert acc["top1_drop_points"] == 0.0 and not acc["fp32_at_chance"]
    ok, failures = ev.verdict(acc)
    assert not ok and any("FP32 was sure" in f for f in failures)


def test_the_budget_does_not_ship_what_the_gate_cannot_tell():
    """Issue 43 item 4: the budget's verdict has the gate's outcomes. One flip on about 290 decisive images (the flip rate's
    90 % upper bound over the 1 % loss line) is too few images to tell: not shipped, and the reason says so; the same
    candidate with no flip on about 960 decisive images passes."""
    from vitedge.validation.accuracy import compare_logits

    ev = Evaluator.__new__(Evaluator)
    ev.thresholds = Thresholds(max_top1_drop=0.2, min_agreement=0.995)
    for n, flips, shipped in ((300, 1, False), (1000, 0, True)):
        rng = np.random.default_rng(4)
        ref = rng.normal(0.0, 0.3, size=(n, 10)).astype(np.float32)
        a = rng.integers(0, 10, size=n)
        ref[np.arange(n), a] = 6.0
        got = ref.copy()
        got[:flips, a[:flips]] = -6.0
        acc = compare_logits(ref, got, None)
        acc["output_kind"] = "logits"
        ok, failures = ev.verdict(acc)
        assert ok is shipped and acc["decisive_flips"] == flips
        assert shipped or any(f.startswith("too few images to tell") for f in failures)

