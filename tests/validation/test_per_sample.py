"""accuracy.per_sample: per-image bits that add up to the report's figures, and refuse to decode when damaged."""

from __future__ import annotations

import numpy as np
import pytest

from vitedge.validation import per_sample
from vitedge.validation.accuracy import compare_logits


@pytest.mark.parametrize("items", [1, 7, 8, 9, 397])
def test_bits_round_trip_and_add_up_to_the_figures(items):
    rng = np.random.default_rng(items)
    ref = rng.normal(size=(items, 10)).astype(np.float32)
    got = ref + rng.normal(scale=0.5, size=ref.shape).astype(np.float32)
    labels = rng.integers(0, 10, size=items)
    rec = per_sample.record(ref, got, labels)
    figures = compare_logits(ref, got, labels)
    assert per_sample.bits(rec, "int8_agrees").mean() == pytest.approx(figures["top1_agreement"], abs=1e-12)
    assert per_sample.bits(rec, "int8_correct").mean() == pytest.approx(figures["int8_top1"], abs=1e-12)
    assert "int8_correct" not in per_sample.record(ref, got, None)


@pytest.mark.parametrize("damage", [
    lambda r: r.update(int8_agrees=r["int8_agrees"][:-4]),  # too short for its item count
    lambda r: r.update(int8_agrees="not base64 at all!"),
    lambda r: r.update(items=-1),
    lambda r: r.update(items=10**9),
    lambda r: r.update(encoding="zlib"),
    lambda r: r.update(int8_agrees=17),
])
def test_damaged_bits_read_as_absent(damage):
    rec = per_sample.record(np.eye(20, 5), np.eye(20, 5), None)
    assert per_sample.bits(rec, "int8_agrees") is not None
    damage(rec)
    assert per_sample.bits(rec, "int8_agrees") is None
