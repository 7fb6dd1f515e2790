"""The FP32-at-chance warning: loud for a reference no better than guessing, silent for a trained model."""

from __future__ import annotations

from vitedge.validation.sanity import chance_level, fp32_warnings


def test_a_reference_at_chance_is_warned_and_a_trained_one_is_not():
    assert fp32_warnings({"fp32_top1": 0.11}, classes=10, items=360)
    assert fp32_warnings({"fp32_top1": 0.72}, classes=10, items=360) == []
    assert fp32_warnings({"fp32_top1": 0.05}, classes=1000, items=500) == []  # 25x chance
    assert fp32_warnings({"fp32_top1": 0.002}, classes=1000, items=500)


def test_unlabelled_data_and_single_class_models_get_no_warning():
    assert fp32_warnings({"top1_agreement": 1.0}, classes=10, items=100) == []
    assert fp32_warnings({"fp32_top1": 0.0}, classes=1, items=100) == []


def test_few_items_widen_the_chance_band():
    assert chance_level(10, 10) > chance_level(10, 10_000) >= 0.2


def test_a_trained_binary_or_three_class_model_is_not_at_chance():
    """Twice chance is 100 % with two classes: the band stops a quarter of the way from chance to perfect."""
    assert fp32_warnings({"fp32_top1": 0.95}, classes=2, items=400) == []
    assert fp32_warnings({"fp32_top1": 0.52}, classes=2, items=400)
    assert fp32_warnings({"fp32_top1": 0.80}, classes=3, items=400) == []
    assert fp32_warnings({"fp32_top1": 0.34}, classes=3, items=400)
    assert chance_level(2, 400) == 0.625 and chance_level(10, 400) == 0.2  # 5 classes and more: twice chance, as before
