"""Checks of the FP32 reference itself. The gate compares INT8 with FP32, so a broken FP32 (all-zero
inputs from a bad --std, a wrong head count, mislabelled class folders) would pass it: say so loudly."""

from __future__ import annotations

import math
from typing import Any


def chance_level(classes: int, items: int) -> float:
    """Top-1 a model guessing at random stays under (with ~3 sigma of sampling noise), at least twice chance; with
    2-4 classes, where twice chance is out of reach or near it, at least a quarter of the way from chance to every
    image right (2 classes: 0.625, not 1.0, which called every binary classifier at chance)."""
    p = 1.0 / max(classes, 1)
    return max(min(2.0 * p, p + (1.0 - p) / 4.0), p + 3.0 * math.sqrt(p * (1.0 - p) / max(items, 1)))


def fp32_at_chance(top1: float | None, classes: int, items: int) -> bool:
    """Whether FP32's labelled top-1 is no better than guessing (``chance_level``): then the labels cannot show
    what INT8 loses, since FP32 rarely or never gets the images right (docs/gate.md)."""
    if top1 is None or classes < 2 or items < 1:
        return False
    return top1 <= chance_level(classes, items)


def fp32_warnings(accuracy: dict[str, Any], classes: int, items: int) -> list[str]:
    """Warnings about the FP32 reference on labelled data (empty when it looks like a trained model)."""
    top1 = accuracy.get("fp32_top1")
    if not fp32_at_chance(top1, classes, items):
        return []
    return [f"FP32 itself is at chance: top-1 {100 * top1:.1f}% on {items} labelled inputs of {classes} classes "
            f"(chance {100 / classes:.1f}%), so the labels cannot show what INT8 loses (the gate judges agreement on "
            "FP32's margins alone); check the preprocessing (--mean/--std), --num-heads/--arch, and that the class "
            "folders map to the model's classes"]
