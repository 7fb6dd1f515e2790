"""The input normalisation, read or questioned (docs/gate.md, "A normalisation that is a guess").

When no file, preset or flag gave the mean/std (the spec's ``sources.preprocess`` is ``default``),
vitedge normalises with a guess: ImageNet's statistics, or their average for grey. A wrong guess hurts
FP32 itself, and INT8 follows FP32, so no INT8-vs-FP32 gate sees it. The same holds for the +-0.25 mean
probe (``noise.preprocessing_probe``), which compares FP32 with FP32 under the same wrong std.

So a guessed normalisation is said to be one, in one line that names ``--mean/--std``. With labelled
validation data, FP32's top-1 is also scored under the usual normalisations: 0/1, 0.5/0.5, ImageNet,
and the calibration images' own per-channel statistics (the one-channel equivalents on a grey model).
The scores are paired image by image with the guess's. A normalisation that gains at least
``PROBE_MIN_GAIN_POINTS`` of top-1 with an exact one-sided p below ``PROBE_MAX_P`` (the binomial on the
discordant images, McNemar's exact test: the probe's rule and thresholds) stops the build. It exits 2
and names the flags that give it. What a file, a preset or a flag stated is never questioned here.

Every candidate is applied to the model-ready batches already read: ``(x * std + mean - mean') / std'``.
The images are decoded once, and FP32 runs once per candidate on at most ``MAX_IMAGES`` of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.datasources.base import CalibrationSource
from vitedge.core.errors import UsageError
from vitedge.onnxkit.session import ort_session
from vitedge.onnxkit.structure import graph_inputs
from vitedge.bundle.spec import IMAGENET_MEAN, IMAGENET_STD, SOURCE_DEFAULT, ModelSpec, Preprocess, default_stats
from vitedge.validation.noise import PROBE_MAX_P, PROBE_MIN_GAIN_POINTS, binom_sf
from vitedge.validation.sanity import fp32_at_chance

if TYPE_CHECKING:
    import onnxruntime

MAX_IMAGES = 512  # labelled images scored per candidate (exact test on their discordant pairs)
STATS_IMAGES = 256  # calibration images the "own statistics" candidate is measured on
BATCH = 32


@dataclass(frozen=True)
class Normalisation:
    name: str
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def flags(self) -> str:
        def fmt(values: tuple[float, ...]) -> str:
            return " ".join(f"{v:.3g}" for v in (values[:1] if len(set(values)) == 1 else values))

        return f"--mean {fmt(self.mean)} --std {fmt(self.std)}"


def is_guess(spec: ModelSpec) -> bool:
    """Did the mean/std come from no file, preset or flag?"""
    return _guessed(spec.sources.get("preprocess"))


def _guessed(source: CalibrationSource) -> bool:
    """A ``sources.preprocess`` of the default with neither --mean nor --std among its flags ("default + flags
    (crop_pct)" is still a guessed mean/std; "default + flags (mean)" is the user's word, never questioned)."""
    text = str(source or "")
    flags = text.split("flags (", 1)[1] if "flags (" in text else ""
    return text.startswith(SOURCE_DEFAULT) and "mean" not in flags and "std" not in flags


def guess_notice(spec: ModelSpec) -> str | None:
    """The one line that says the normalisation is a guess; None when a file, a preset or a flag gave it."""
    pre = spec.preprocess
    return notice_text(spec.sources.get("preprocess"), pre.mean, pre.std, pre.channels)


def notice_text(source: CalibrationSource, mean: Sequence[float], std: Sequence[float], channels: int | None) -> str | None:
    """``guess_notice`` from a spec's parts (a manifest's ``model.spec``: its ``sources.preprocess`` and preprocessing)."""
    if not _guessed(source):
        return None
    return (f"the input normalisation is a guess (mean {_values(mean)}, std {_values(std)}: the default for {channels} "
            "channel(s)): no model file field, preset or flag gave it; pass --mean/--std as the model was trained")


def _values(values: tuple[float, ...]) -> str:
    return ",".join(f"{v:.3g}" for v in values)


def candidates(channels: int, own: tuple[tuple[float, ...], tuple[float, ...]] | None) -> list[Normalisation]:
    """The usual normalisations for a ``channels``-input model, and the calibration images' own statistics."""
    grey = channels < 3
    imagenet = default_stats(channels) if grey else (
        IMAGENET_MEAN + (float(np.mean(IMAGENET_MEAN)),) * (channels - 3), IMAGENET_STD + (float(np.mean(IMAGENET_STD)),) * (channels - 3))
    found = [Normalisation("no normalisation (0/1)", (0.0,) * channels, (1.0,) * channels),
             Normalisation("0.5/0.5", (0.5,) * channels, (0.5,) * channels),
             Normalisation("ImageNet's" + (" (its grey average)" if grey else ""), tuple(imagenet[0]), tuple(imagenet[1]))]
    if own is not None:
        found.append(Normalisation("the calibration images' own", own[0], own[1]))
    return found


def pixel_statistics(source: CalibrationSource, pre: Preprocess, limit: int = STATS_IMAGES) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """Per channel, the mean and std of the pixels in [0, 1] of the first ``limit`` items of ``source`` (read
    back from its model-ready batches)."""
    mean, std = _stats_arrays(pre)
    total = np.zeros(pre.channels)
    squares = np.zeros(pre.channels)
    count = 0
    for batch in source.batches(BATCH):
        raw = batch.images.astype(np.float64) * std + mean
        total += raw.sum(axis=(0, 2, 3))
        squares += (raw * raw).sum(axis=(0, 2, 3))
        count += raw.shape[0] * raw.shape[2] * raw.shape[3]
        if count >= limit * raw.shape[2] * raw.shape[3]:
            break
    if not count:
        return None
    m = total / count
    s = np.sqrt(np.maximum(squares / count - m * m, 0.0))
    if np.any(s <= 1e-6):
        return None
    return tuple(round(float(v), 3) for v in m), tuple(round(float(v), 3) for v in s)


def _stats_arrays(pre: Preprocess) -> tuple[np.ndarray, np.ndarray]:
    return (np.asarray(pre.mean, dtype=np.float64).reshape(1, -1, 1, 1), np.asarray(pre.std, dtype=np.float64).reshape(1, -1, 1, 1))


def _labelled_batches(source: CalibrationSource, limit: int) -> tuple[list[np.ndarray], np.ndarray] | None:
    if not getattr(source.summary, "labeled", False):
        return None
    images, labels, n = [], [], 0
    for batch in source.batches(BATCH):
        if batch.labels is None:
            return None
        take = min(len(batch.labels), limit - n)
        images.append(batch.images[:take])
        labels.append(batch.labels[:take])
        n += take
        if n >= limit:
            break
    return (images, np.concatenate(labels)) if n else None


def _top1_right(session: onnxruntime.InferenceSession, input_name: str, batches: list[np.ndarray], pre: Preprocess, target: Normalisation | None,
                labels: np.ndarray) -> np.ndarray:
    mean, std = _stats_arrays(pre)
    preds = []
    for x in batches:
        if target is not None:
            new_mean = np.asarray(target.mean, dtype=np.float64).reshape(1, -1, 1, 1)
            new_std = np.asarray(target.std, dtype=np.float64).reshape(1, -1, 1, 1)
            x = ((x.astype(np.float64) * std + mean - new_mean) / new_std).astype(np.float32)
        out = session.run(None, {input_name: x})[0]
        preds.append(np.asarray(out).argmax(axis=1))
    return np.concatenate(preds) == labels


def question_normalisation(fp32: Path, spec: ModelSpec, calib: CalibrationSource, val: CalibrationSource, info=print) -> dict[str, Any] | None:
    """When the normalisation is a guess and ``val`` is labelled: FP32's top-1 under every candidate, paired with
    the guess's; raises UsageError (exit 2) naming the flags of one clearly better. Returns what it scored (None
    when it had nothing to score: not a guess, an encoder, no labels, uint8-frame input)."""
    if not is_guess(spec) or spec.output_kind != "logits" or not spec.num_classes:
        return None
    got = _labelled_batches(val, MAX_IMAGES)
    if got is None:
        return None
    batches, labels = got
    import onnx

    session = ort_session(str(fp32), threads=2)
    input_name = graph_inputs(onnx.load(str(fp32), load_external_data=False))[0].name
    pre = spec.preprocess
    right = _top1_right(session, input_name, batches, pre, None, labels)
    scores = []
    current = (tuple(pre.mean), tuple(pre.std))
    for cand in candidates(pre.channels, pixel_statistics(calib, pre)):
        if np.allclose(cand.mean, current[0], atol=5e-3) and np.allclose(cand.std, current[1], atol=5e-3):
            continue
        other = _top1_right(session, input_name, batches, pre, cand, labels)
        gained, lost = int(np.sum(other & ~right)), int(np.sum(right & ~other))
        scores.append({"normalisation": cand, "top1": float(np.mean(other)), "gain_points": 100.0 * (gained - lost) / len(labels),
                       "p_value": binom_sf(gained, gained + lost, 0.5) if gained + lost else 1.0})
    result = {"fp32_top1": float(np.mean(right)), "items": int(len(labels)), "scores": scores}
    _decide(result, spec, info)
    return result


def _decide(result: dict[str, Any], spec: ModelSpec, info) -> None:
    """Stop (UsageError) when a candidate is clearly better than the guess; else say what was scored."""
    classes, items = int(spec.num_classes or 0), result["items"]
    at_chance = fp32_at_chance(result["fp32_top1"], classes, items)
    # as in the mean probe: where the guess puts FP32 at chance, only a candidate that takes it out of chance counts
    counted = [s for s in result["scores"] if not at_chance or not fp32_at_chance(s["top1"], classes, items)]
    best = max(counted, key=lambda s: s["gain_points"], default=None)
    pre = spec.preprocess
    if best is not None and best["gain_points"] >= PROBE_MIN_GAIN_POINTS and best["p_value"] < PROBE_MAX_P:
        cand = best["normalisation"]
        raise UsageError(
            f"the input normalisation is a guess (mean {_values(pre.mean)}, std {_values(pre.std)}) and FP32 scores "
            f"{100 * result['fp32_top1']:.1f}% top-1 with it on {items} labelled images but {100 * best['top1']:.1f}% with "
            f"{cand.name} statistics (exact paired p {best['p_value']:.1g}): pass {cand.flags()} if the model was trained so, "
            f"or the --mean/--std it was trained with (--mean {_values(pre.mean)} --std {_values(pre.std)} keeps the guess)")
    tried = ", ".join(f"{s['normalisation'].name} {100 * s['top1']:.1f}%" for s in result["scores"])
    info(f"FP32 top-1 under the guessed normalisation {100 * result['fp32_top1']:.1f}% on {items} labelled images; "
         f"no usual normalisation is clearly better ({tried})")
