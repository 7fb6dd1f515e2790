"""The embedding-model gate flags `build` and `validate` share (see vitedge.validation.embedding_gate)."""

from __future__ import annotations

import click

from vitedge.cli.options import bounded_float

EMBEDDING_THRESHOLDS = ("min_embedding_cosine", "min_embedding_cosine_low", "min_nn_agreement")


def embedding_gate_flags(func):
    """Adds the flags; the command receives them as keyword arguments named as in EMBEDDING_THRESHOLDS."""
    for deco in reversed([
        click.option("--min-embedding-cosine", type=bounded_float(-1.0, 1.0), default=None,
                     help="Gate for embedding models: least mean cosine of INT8 vs FP32 embeddings (overrides the profile)."),
        click.option("--min-embedding-cosine-low", type=bounded_float(-1.0, 1.0), default=None,
                     help="Gate for embedding models: least low-percentile (profile's embedding_cosine_percentile, default p5) cosine."),
        click.option("--min-nn-agreement", type=bounded_float(0.0, 1.0), default=None,
                     help="Gate embedding models on nearest-neighbour agreement with FP32 too (a fraction; off unless given)."),
    ]):
        func = deco(func)
    return func


def embedding_overrides(kwargs: dict) -> dict[str, float | None]:
    return {k: kwargs.get(k) for k in EMBEDDING_THRESHOLDS}


NOISE_THRESHOLDS = ("near_tie_margin", "drop_confidence", "min_decisive_agreement")


def noise_gate_flags(func):
    """The near-tie gate's flags (vitedge.validation.noise, docs/gate.md), named as in NOISE_THRESHOLDS."""
    for deco in reversed([
        click.option("--near-tie-margin", type=click.FloatRange(0.0, 1.0), default=None,
                     help="Gate: FP32 top-1 minus runner-up probability below which an image is a near-tie whose flip "
                          "is noise (default 0.5; 0: every flip counts, the plain agreement gate)."),
        click.option("--drop-confidence", type=click.FloatRange(0.0, 0.9999), default=None,
                     help="Gate: confidence of the top-1 drop's exact paired interval; the drop fails only when the "
                          "interval lies above --max-top1-drop (default 0.95; 0: the point estimate decides)."),
        click.option("--min-decisive-agreement", type=bounded_float(0.0, 1.0), default=None,
                     help="Gate: least top-1 agreement with FP32 on the images where FP32 is decisive, a fraction in "
                          "[0, 1], judged with or without labels (default 0.995; docs/gate.md)."),
    ]):
        func = deco(func)
    return func


def noise_overrides(kwargs: dict) -> dict[str, float | None]:
    return {k: kwargs.get(k) for k in NOISE_THRESHOLDS}
