"""Validate one built artifact against its FP32 reference on the same runtime, and the gate.

``validate_artifact`` measures (accuracy, latency, memory); ``evaluate_gate`` turns the
measurements and the thresholds into one row per threshold. ``vitedge.validation.bundle``
wraps both for a bundle folder: `vitedge build` and `vitedge validate` both go through it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitedge.backends.base import Runner
from vitedge.core.errors import DataError
from vitedge.onnxkit.metadata import UINT8_NHWC_RGB
from vitedge.targets.profiles import Thresholds
from vitedge.validation.accuracy import (
    Outputs,
    collect_outputs,
    compare_embeddings,
    compare_logits,
    eval_batch,
)
from vitedge.validation.embedding_gate import agreement_skip_row, embedding_rows
from vitedge.validation.gate import FAIL, PASS, SKIP, GateRow  # noqa: F401 - re-exported: callers read the verdicts from run
from vitedge.validation.inputs import feed_for
from vitedge.validation import passes, per_sample
from vitedge.validation.noise import (
    DECISIVE_BOUND_CONFIDENCE,
    EXPECTED_DROP_SLACK,
    MIN_DECISIVE,
    allowed_flips,
    LOSS,
    TOO_FEW,
    decisive_images_to_tell,
    decisive_judged,
    decisive_outcome,
    decisive_loss_line,
    drop_within_noise,
    flip_rate_upper,
    images_to_detect_loss,
    images_to_tell,
    preprocessing_probe,
    probe_shifts,
    probe_text,
)
from vitedge.validation.core_wait import busy_note
from vitedge.validation.speed_check import SpeedCheck, second_look
from vitedge.validation.speed_check import verdict as speed_verdict
from vitedge.validation.latency import (
    LatencySettings,
    LatencyStats,
    current_rss,
    measure_interleaved,
    peak_rss,
)
from vitedge.validation.reference_cache import (
    ReferenceCacheSettings,
    SharedFp32,
    fp32_source_sha256,
    graph_sha256,
    key_parts,
    reference_outputs,
    verify_sample,
)
from vitedge.validation.sanity import fp32_warnings

THRESHOLD_NAMES = ("max_top1_drop", "min_agreement", "min_decisive_agreement", "max_expected_drop",
                   "min_embedding_cosine", "min_embedding_cosine_low",
                   "min_nn_agreement", "min_speedup", "max_p99_ms")  # min_decisive_agreement only for classifiers, the embedding
# rows only for encoders (vitedge.validation.embedding_gate)


@dataclass
class ValidationResult:
    """What one validation measured, and its gate. ``validation.bundle`` turns it into the typed
    document (``validation.document.ValidationReport``), which has the one JSON serializer."""

    accuracy: dict[str, Any]
    latency: dict[str, dict[str, LatencyStats]]  # "fp32"/"int8" -> batch (str) -> stats
    speedup: float | None  # FP32 p50 / INT8 p50 at batch 1
    gate: list[GateRow] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    latency_settings: LatencySettings | None = None  # None: latency not measured
    speed_check: SpeedCheck | None = None  # the speed gate's second look, when the wall-time speedup missed the floor

    @property
    def passed(self) -> bool:
        return all(row.passed for row in self.gate)

    def __bool__(self) -> bool:
        return self.passed

    def failures(self) -> list[GateRow]:
        return [r for r in self.gate if not r.passed]

    def speedups(self) -> dict[str, float]:
        out = {}
        for b, s in self.latency.get("int8", {}).items():
            f = self.latency.get("fp32", {}).get(b)
            if f is not None and s.p50_ms > 0:
                out[b] = f.p50_ms / s.p50_ms
        return out

    def p99_ms(self) -> float | None:
        s = self.latency.get("int8", {}).get("1")
        return None if s is None else s.p99_ms


def evaluate_gate(accuracy: dict[str, Any], speedup: float | None, p99_ms: float | None, t: Thresholds,
                  speed_check: SpeedCheck | None = None) -> list[GateRow]:
    """One row per threshold, in THRESHOLD_NAMES order; max_p99_ms only when a limit is set (it has no
    default). A threshold that cannot be checked here (no labels, latency not measured) is skipped, and so is
    one shown as information only (overall agreement where the decisive row judges; a drop within noise):
    no row shows pass beside a value that misses its limit (docs/gate.md)."""
    drop = _drop_row(accuracy, t)
    if accuracy.get("output_kind") == "embedding":
        middle = [agreement_skip_row(t), *embedding_rows(accuracy, t)]
    else:
        middle = [_agreement_row(accuracy, t), _decisive_row(accuracy, t), _expected_drop_row(accuracy, t)]
    return [drop, *middle, *_speed_rows(speedup, p99_ms, t, speed_check)]


def _drop_row(accuracy: dict[str, Any], t: Thresholds) -> GateRow:
    """max_top1_drop: passes within the limit, fails when the paired test proves a loss beyond it, and is not
    decided in between (within noise: how many labelled images it would take to tell; docs/gate.md)."""
    drop = accuracy.get("top1_drop_points")
    if drop is None:
        why = "an embedding model has no top-1" if accuracy.get("output_kind") == "embedding" else "the data has no labels"
        return GateRow("max_top1_drop", None, t.max_top1_drop, True, f"not checked: {why}", SKIP, "points")
    over = drop - t.max_top1_drop
    ci = accuracy.get("top1_drop_ci_points")
    text = (f"top-1 {100 * accuracy['int8_top1']:.2f}% vs FP32 {100 * accuracy['fp32_top1']:.2f}%: "
            f"drop {drop:.3f} points (limit {t.max_top1_drop:g})")
    if over <= 1e-9:
        return GateRow("max_top1_drop", drop, t.max_top1_drop, True, text + (f", {_ci_text(accuracy)}" if ci else "")
                       + _too_few_labels_text(accuracy, t), PASS, "points", over)
    if ci and t.drop_confidence > 0 and drop_within_noise(accuracy, t.max_top1_drop):
        need = images_to_tell(accuracy, t.max_top1_drop)
        tell = (f"; telling a {drop:.2f}-point drop from the {t.max_top1_drop:g}-point limit would take about {need:,} labelled "
                "images at this rate of disagreement" if need else "")
        return GateRow("max_top1_drop", drop, t.max_top1_drop, True,
                       f"not decided: {text}, over it but within noise ({_ci_text(accuracy)} reaches the limit){tell}; "
                       "the decisive-agreement row judges the flips", SKIP, "points", over)
    detail = text + f", over by {over:.3f} points" + (f"; {_ci_text(accuracy)} lies above the limit: a real loss" if ci else "")
    return GateRow("max_top1_drop", drop, t.max_top1_drop, False, detail, FAIL, "points", over)


def _too_few_labels_text(accuracy: dict[str, Any], t: Thresholds) -> str:
    """Where the labelled images are too few for the paired test to show a ~1-point loss: how many would (issue 43)."""
    found = images_to_detect_loss(accuracy, t.max_top1_drop) if t.drop_confidence > 0 else None
    if found is None or found[1] <= int(accuracy.get("samples") or 0):
        return ""
    loss, need = found
    return (f"; too few labelled images to show a {loss:g}-point loss: {accuracy['samples']:,} cannot, about {need:,} would at this "
            "rate of disagreement")


def _agreement_row(accuracy: dict[str, Any], t: Thresholds) -> GateRow:
    """min_agreement of a classifier, literally: pass when met. Under its limit it fails, unless the decisive row
    judges the flips (near_tie_margin > 0, enough decisive images, no suspect preprocessing probe): then it is
    shown as information, not as a pass (docs/gate.md). A suspect preprocessing probe fails it even when met:
    agreement with an FP32 fed wrong inputs says nothing of the build."""
    agree = accuracy.get("top1_agreement")
    what = "top-1 agreement with FP32"
    if agree is None:
        return GateRow("min_agreement", None, t.min_agreement, True, f"not checked: {what} needs at least 2 samples",
                       SKIP, "fraction")
    short = t.min_agreement - agree
    detail = f"{what} {100 * agree:.2f}% (limit {100 * t.min_agreement:.2f}%)"
    probe = accuracy.get("fp32_preprocessing_probe") or {}
    if short <= 1e-12 and t.near_tie_margin > 0 and probe.get("suspect"):  # INT8 follows an FP32 fed the wrong inputs
        return GateRow("min_agreement", agree, t.min_agreement, False, f"{detail}, met, but agreement with an FP32 fed wrong "
                       f"inputs says nothing of the build: {probe_text(probe)}", FAIL, "fraction", short)
    if short <= 1e-12:
        return GateRow("min_agreement", agree, t.min_agreement, True, detail, PASS, "fraction", short)
    at_chance = bool(accuracy.get("fp32_at_chance")) and accuracy.get("top1_drop_points") is not None
    if t.near_tie_margin > 0 and probe.get("suspect"):  # flips on inputs FP32 was not trained for
        detail += f", short by {100 * short:.3f} points; not excused as near-ties: {probe_text(probe)}"
    elif decisive_judged(accuracy, t.near_tie_margin):
        detail = (f"information, not judged: {detail}; {accuracy['near_tie_flips']} of its flips are near-ties (FP32's top-2 "
                  f"probability gap < {accuracy['near_tie_margin']:g}), the {accuracy['decisive_samples']} decisive images are judged "
                  f"by min_decisive_agreement" + _labels_text(accuracy, t) + (AT_CHANCE_TEXT if at_chance else ""))
        return GateRow("min_agreement", agree, t.min_agreement, True, detail, SKIP, "fraction", short)
    else:
        detail += f", short by {100 * short:.3f} points" + (AT_CHANCE_TEXT if at_chance and t.near_tie_margin > 0 else "")
        detail += _plain_text(accuracy, t)
    return GateRow("min_agreement", agree, t.min_agreement, False, detail, FAIL, "fraction", short)


def _decisive_row(accuracy: dict[str, Any], t: Thresholds) -> GateRow:
    """min_decisive_agreement: agreement on the images where FP32 is decisive meets its limit, always judged,
    labels or not (a flip there is a change of behaviour); not judged with fewer than MIN_DECISIVE of them.
    Three outcomes (``decisive_outcome``): a loss (fail), too few images to tell (fail, its own line), pass."""
    name, limit = "min_decisive_agreement", t.min_decisive_agreement
    if t.near_tie_margin <= 0:
        return GateRow(name, None, limit, True, "not checked: near_tie_margin 0 (the plain gate: min_agreement counts every flip)",
                       SKIP, "fraction")
    value, n = accuracy.get("decisive_agreement"), int(accuracy.get("decisive_samples") or 0)
    if value is None or n < MIN_DECISIVE:
        return GateRow(name, value, limit, True, f"not checked: FP32 is decisive on only {n} images (fewer than {MIN_DECISIVE}): "
                       "too few to judge; min_agreement judges every flip instead", SKIP, "fraction")
    short, flips = limit - value, int(accuracy["decisive_flips"])
    estimate = accuracy.get("decisive_flip_estimate")
    outcome, why = decisive_outcome(flips, n, estimate, limit, spread=accuracy.get("decisive_flip_estimate_spread"))
    line = decisive_loss_line(limit)
    detail = (f"top-1 agreement with FP32 {100 * value:.2f}% on the {n} images where FP32 is decisive (top-2 probability gap >= "
              f"{accuracy['near_tie_margin']:g}; limit {100 * limit:.2f}%: at most {allowed_flips(limit, n)} flips): {flips} flips there"
              + ("" if estimate is None else f", estimated flip rate {100 * estimate:.2f}% from every decisive image's margin loss"))
    if outcome == LOSS:
        detail += f", {why}: FP32 was sure and INT8 answers otherwise"
    elif outcome == TOO_FEW:
        detail = (f"{TOO_FEW_TEXT} the {100 * limit:.2f}% limit from the {100 * (1 - line):g}% loss line: {detail}; {why}"
                  + _decisive_need_text(accuracy, flips, n, limit))
    detail += f"; {accuracy['near_tie_flips']} near-tie flips, expected drop {accuracy['expected_drop_points']:.2f} points"
    ok = outcome == PASS
    return GateRow(name, value, limit, ok, detail, PASS if ok else FAIL, "fraction", short)


TOO_FEW_TEXT = "too few images to tell"  # the decisive row's own outcome (a failure of the gate): docs/gate.md


def _decisive_need_text(accuracy: dict[str, Any], flips: int, n: int, limit: float) -> str:
    """How many images (and decisive images) it would take to tell, at the flip rate and decisive share seen."""
    need = decisive_images_to_tell(flips, n, limit)
    if need is None:
        return ""
    images = int(math.ceil(need * int(accuracy.get("samples") or n) / n))
    return f"; about {images:,} images ({need:,} decisive) would" + (" at this flip rate" if flips else "")


def _expected_drop_row(accuracy: dict[str, Any], t: Thresholds) -> GateRow:
    """max_expected_drop: the 95 % upper bound of the expected top-1 drop under FP32's own probabilities (label-free:
    each flip costs FP32's probability of its class minus that of the class INT8 chose) within max_top1_drop +
    EXPECTED_DROP_SLACK points. Judged wherever the decisive row judges, labels or not: near-tie flips that all go
    the losing way add up here, where no single one is decisive (docs/gate.md)."""
    name, limit = "max_expected_drop", t.max_top1_drop + EXPECTED_DROP_SLACK
    bound = accuracy.get("expected_drop_points_upper")
    if t.near_tie_margin <= 0 or bound is None or not decisive_judged(accuracy, t.near_tie_margin):
        why = ("near_tie_margin 0 (the plain gate: min_agreement counts every flip)" if t.near_tie_margin <= 0 else
               f"FP32 is decisive on only {int(accuracy.get('decisive_samples') or 0)} images (fewer than {MIN_DECISIVE}): "
               "min_agreement judges every flip instead")
        return GateRow(name, bound, limit, True, f"not checked: {why}", SKIP, "points")
    over = bound - limit
    ok = over <= 1e-9
    temperature = accuracy.get("expected_drop_points_temperature")
    labelled = accuracy.get("expected_drop_points_temperature_from") == "labels"
    leaning = accuracy.get("expected_drop_points_temperature_from") == "stand-in, flips lean"
    whose = ("FP32's probabilities" if temperature is None else
             f"FP32's probabilities calibrated on the labels (temperature {temperature:.2f})" if labelled else
             f"FP32's probabilities softened by the stand-in temperature {temperature:g} (no labels calibrate them; "
             f"INT8's flips lean one way between classes, symmetry p {accuracy.get('flip_symmetry_p') or 0:.3f}, so the "
             "stand-in is the one for flips that are no unbiased noise)" if leaning else
             f"FP32's probabilities softened by the stand-in temperature {temperature:g} (no labels calibrate them)")
    detail = (f"expected top-1 drop under {whose} {accuracy['expected_drop_points']:.2f} points, 95% upper bound "
              f"{bound:.2f} (limit {limit:g}: max_top1_drop {t.max_top1_drop:g} + {EXPECTED_DROP_SLACK:g}; {accuracy['samples']} images)"
              + ("" if ok else f", over by {over:.2f} points: INT8's flips go the losing way")
              + ("" if labelled or ok else "; labelled validation data would calibrate FP32's probabilities"))
    return GateRow(name, bound, limit, ok, detail, PASS if ok else FAIL, "points", over)


AT_CHANCE_TEXT = "; FP32 itself is at chance on the labels, so they say little about INT8's loss"


def _labels_text(accuracy: dict[str, Any], t: Thresholds) -> str:
    """What the labels say of the flips, for the information row."""
    if not accuracy.get("top1_drop_ci_points") or t.drop_confidence <= 0:
        return ""
    if drop_within_noise(accuracy, t.max_top1_drop):
        return f"; the labels show no loss beyond {t.max_top1_drop:g} points ({_ci_text(accuracy)})"
    return "; the labels show a real loss (max_top1_drop)"


def _plain_text(accuracy: dict[str, Any], t: Thresholds) -> str:
    """Why overall agreement is judged plainly: the near-tie rule is off, or too few images are decisive."""
    if t.near_tie_margin <= 0 or "decisive_samples" not in accuracy or accuracy.get("fp32_preprocessing_probe", {}).get("suspect"):
        return ""
    decisive, samples = int(accuracy["decisive_samples"]), int(accuracy.get("samples") or 0)
    more = (f"; validation data of about {math.ceil(MIN_DECISIVE * samples / decisive / 50) * 50:,} images would hold "
            f"{MIN_DECISIVE} at this rate (--val)" if decisive and samples else
            "; more validation images (--val) may hold some")
    return (f"; FP32 is decisive on only {decisive} of {samples} images (fewer than {MIN_DECISIVE}): "
            "too few to tell near-tie flips from loss" + more)


def _speed_rows(speedup: float | None, p99_ms: float | None, t: Thresholds, check: SpeedCheck | None = None) -> list[GateRow]:
    """min_speedup (the floor of this CPU; a wall-time miss judged by the second look, vitedge.validation.speed_check),
    and max_p99_ms when a limit is set."""
    floor, where = t.speedup_floor()
    if speedup is not None:
        short = floor - speedup
        status, tail = speed_verdict(speedup, floor, check)
        rows = [GateRow("min_speedup", speedup, floor, status != FAIL, f"speedup over FP32 {speedup:.2f}x at batch 1 "
                        f"(limit {floor:g}x{where})" + tail, status, "x", short)]
    else:
        rows = [GateRow("min_speedup", None, floor, True, "not checked: latency not measured", SKIP, "x")]
    if t.max_p99_ms is not None and p99_ms is not None:
        over = p99_ms - t.max_p99_ms
        ok = over <= 0
        rows.append(GateRow("max_p99_ms", p99_ms, t.max_p99_ms, ok, f"p99 latency {p99_ms:.3f} ms at batch 1 (limit {t.max_p99_ms:g} ms)"
                            + ("" if ok else f", over by {over:.3f} ms"), PASS if ok else FAIL, "ms", over))
    elif t.max_p99_ms is not None:
        rows.append(GateRow("max_p99_ms", None, t.max_p99_ms, True, "not checked: latency not measured", SKIP, "ms"))
    return rows


def _ci_text(accuracy: dict[str, Any]) -> str:
    lo, hi = accuracy["top1_drop_ci_points"]
    d = accuracy.get("top1_discordant", {})
    return (f"{100 * accuracy.get('top1_drop_confidence', 0.95):g}% interval [{lo:.2f}, {hi:.2f}] points "
            f"(exact paired test: {d.get('fp32_only', 0)} lost, {d.get('int8_only', 0)} gained)")


def check_labels(labels: np.ndarray | None, classes: int, data_path: str) -> None:
    if labels is None or not len(labels):
        return
    if labels.min() < 0 or labels.max() >= classes:
        bad = int(labels.max() if labels.max() >= classes else labels.min())
        raise DataError(f"{data_path}: label {bad} is outside the model's {classes} classes (0..{classes - 1}); "
                        "pass data labelled with this model's class indices")


def validate_artifact(backend, options, model_path: Path, reference_path: Path, source, spec, thresholds: Thresholds,
                      batch_sizes: tuple[int, ...] = (1,), *, measure_speed: bool = True, threads: int | None = None,
                      latency: LatencySettings | None = None, output_kind: str | None = None,
                      log=None, reference_cache: ReferenceCacheSettings | None = None) -> ValidationResult:
    """Run the artifact and its FP32 reference on the same backend and the same inputs, in batches of
    ``eval_batch(batch_sizes)``. Either side's outputs come from ``reference_cache`` when it holds
    them for exactly that graph, data, runtime, settings and CPU (``vitedge.validation.reference_cache``;
    the INT8 side only with ``int8_outputs`` on); a model is opened only when it has to run.

    Built from the pieces `vitedge.distributed` runs on separate workers (``collect_pair``,
    ``measure_speed_pair``) and on the driver (``accuracy_of``, ``assemble_result``), so a
    sharded run computes its metrics with exactly these functions."""
    pre = spec.preprocess
    kind = output_kind or spec.output_kind
    settings = latency or LatencySettings()
    info = log or (lambda _msg: None)
    memory: dict[str, Any] = {}
    batch = eval_batch(batch_sizes)
    int8_cache = reference_cache.for_int8() if reference_cache is not None else None
    with contextlib.ExitStack() as stack:
        runners: dict[str, Any] = {}
        rss_before: dict[str, int | None] = {}

        def runner(label: str, path: Path):
            """The runner of ``path``, opened once. *_load_rss_bytes: RSS growth from before it opened to after
            it ran the data (``outputs_of``), or to after it opened when its outputs came from the cache."""
            if label not in runners:
                before = rss_before[label] = current_rss()
                runners[label] = stack.enter_context(backend.open_runner(path, options, threads=threads))
                after = current_rss()
                if before is not None and after is not None:
                    memory[f"{label}_load_rss_bytes"] = max(0, after - before)
            return runners[label]

        def outputs_of(label: str, path: Path):
            outputs = collect_outputs(runner(label, path), source, pre, batch_size=batch)
            passes.record(passes.InferencePass("validation", label, backend.name, graph_sha256(path), source.summary.data_hash,
                                               len(outputs.values), batch))
            before, after = rss_before.get(label), current_rss()
            if before is not None and after is not None:
                memory[f"{label}_load_rss_bytes"] = max(0, after - before)
            return outputs

        ref, lookup = reference_outputs(None, source, pre, batch=batch, settings=reference_cache,
                                        key_of=lambda: key_parts(reference_path, source, pre, backend, options, threads, batch),
                                        compute=lambda: outputs_of("fp32", reference_path),
                                        share=shared_fp32(backend, reference_path, pre, lambda: runner("fp32", reference_path)))
        got, int8_lookup = reference_outputs(None, source, pre, batch=batch, settings=int8_cache, label="INT8 artifact",
                                             key_of=lambda: key_parts(model_path, source, pre, backend, options, threads, batch),
                                             compute=lambda: outputs_of("int8", model_path),
                                             # cached INT8 outputs are believed only after a random sample runs again
                                             verify=lambda cached: verify_sample(
                                                 lambda images: runner("int8", model_path).infer(feed_for(runner("int8", model_path), images, pre)),
                                                 source, batch, cached))
        for found in (lookup, int8_lookup):
            if found.note:
                info("WARNING " + found.note)
            info(found.one_line(len(source)))
        accuracy = accuracy_of(ref, got, kind, thresholds, source.summary.path, info)
        probe_lookups = probe_if_needed(
            accuracy, thresholds, ref, lambda: runner("fp32", reference_path), backend, reference_path, source, pre, batch,
            reference_cache, info, key_of=lambda: key_parts(reference_path, source, pre, backend, options, threads, batch))
        stats: dict[str, dict[str, LatencyStats]] = {"fp32": {}, "int8": {}}
        speedup, speed_check = None, None
        if measure_speed:
            first = next(iter(source.batches(max(batch_sizes))))
            stats, speedup = measure_speed_pair(runner("fp32", reference_path), runner("int8", model_path), first.images,
                                                batch_sizes, pre, settings, info)
            speed_check = speed_second_look(backend, options, reference_path, model_path, first.images[:1], pre, speedup,
                                            stats, thresholds, info)
    memory["peak_rss_bytes"] = peak_rss()
    data = dict(source_data(source), reference=lookup.to_dict(), int8_outputs=int8_lookup.to_dict())
    if probe_lookups:
        data["probe_outputs"] = probe_lookups
    return assemble_result(accuracy, stats, speedup, memory, settings if measure_speed else None, data, thresholds,
                           speed_check=speed_check)


def speed_second_look(backend, options, reference_path: Path, model_path: Path, image: np.ndarray, pre,
                      speedup: float | None, stats: dict[str, dict[str, LatencyStats]], thresholds: Thresholds,
                      info) -> SpeedCheck | None:
    """The second look on a CPU target when the batch-1 wall-time speedup missed the gate's floor, or met it in a
    busy timing window (core_wait past the line: vitedge.validation.speed_check); None when neither."""
    missed = speedup is not None and speedup < thresholds.speedup_floor()[0]
    wait = stats["int8"]["1"].core_wait if "1" in stats["int8"] else None
    if speedup is None or not (missed or busy_note(wait)) or getattr(backend.facts, "runs_on", None) != "cpu":
        return None
    check = cpu_time_look(backend, options, reference_path, model_path, image, pre)
    if not missed:
        check = dataclasses.replace(check, busy_wait=wait)
    why = "is under the gate's floor" if missed else "was timed on a busy machine"
    info(f"batch 1 speedup {speedup:.2f}x in wall time {why}: timed again at one thread by "
         f"CPU time: {check.speedup:.2f}x (control moved by {check.noise:.0%})")
    return check


def cpu_time_look(backend, options, reference_path: Path, model_path: Path, image: np.ndarray, pre) -> SpeedCheck:
    """The speed gate's second look (vitedge.validation.speed_check): FP32, a second FP32 and INT8 opened for one
    thread, timed side by side by CPU time at batch 1."""
    with contextlib.ExitStack() as stack:
        ref, ctl, q = (stack.enter_context(backend.open_runner(p, options, threads=1)) for p in (reference_path, reference_path, model_path))
        f_ref, f_ctl, f_q = (feed_for(r, image, pre) for r in (ref, ctl, q))
        return second_look(lambda: ref.infer(f_ref), lambda: ctl.infer(f_ctl), lambda: q.infer(f_q))


def probe_if_needed(accuracy: dict[str, Any], thresholds: Thresholds, ref: Outputs, open_fp32: Callable[[], Runner], backend,
                    reference_path: Path, source, pre, batch: int, settings: ReferenceCacheSettings | None, info, *,
                    key_of: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run the FP32 preprocessing probe where the gate needs it (``_probe_needed``), adding its verdict to
    ``accuracy`` (``fp32_preprocessing_probe``); returns where each shift's outputs came from ({} when not run).
    One function for the single-process validation and the sharded one's driver, so both judge the same rows."""
    if not _probe_needed(accuracy, thresholds, lambda _label, _path: open_fp32(), reference_path):
        return {}
    accuracy["fp32_preprocessing_probe"], lookups = run_probe(ref, open_fp32, backend, reference_path, source, pre, batch,
                                                              settings, info, key_of=key_of)
    return lookups


def run_probe(ref: Outputs, open_fp32: Callable[[], Runner], backend, reference_path: Path, source, pre, batch: int,
              settings: ReferenceCacheSettings | None, info, *, key_of: Callable[[], dict[str, Any]]
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The FP32 preprocessing probe (``noise.preprocessing_probe``) and where each shift's outputs came from: each
    shifted FP32 pass is a reference-cache lookup of its own (``key_of()`` plus the shift) and a shared one, so
    a build of both CPU targets runs it once and a warm rebuild not at all (``reference_cache``)."""
    shifted, lookups = {}, {}
    for m, d in probe_shifts(pre.std).items():
        def open_shifted(d=d) -> ShiftedRunner:
            return ShiftedRunner(open_fp32(), d)

        def compute(m=m, open_shifted=open_shifted) -> Outputs:
            outputs = collect_outputs(open_shifted(), source, pre, batch_size=batch)
            passes.record(passes.InferencePass("probe", f"fp32{m:+g}", backend.name, graph_sha256(reference_path),
                                               source.summary.data_hash, len(outputs.values), batch))
            return outputs

        out, found = reference_outputs(
            None, source, pre, batch=batch, settings=settings, label=f"FP32 probe (mean moved by {m:+g})",
            key_of=lambda m=m: dict(key_of(), kind="fp32-probe", probe_mean_shift=m), compute=compute,
            share=shared_fp32(backend, reference_path, pre, open_shifted, variant={"probe_mean_shift": float(m)}))
        shifted[m], lookups[f"{m:+g}"] = out.values, found.to_dict()
        info(found.one_line(len(source)))
    probe = preprocessing_probe(ref.values, shifted, ref.labels)
    info(f"FP32 preprocessing probe (mean moved by +-{probe['shifts'][-1]['mean_shift']:g}): "
         + (probe_text(probe) if probe["suspect"] else "no shift makes FP32 more accurate"))
    return probe, lookups


@dataclass
class ShiftedRunner:
    """A float-input FP32 runner whose every batch has ``delta`` added (``noise.probe_shifts``): the probe's
    mean shift, for the passes of ``run_probe`` and the spot check of shared probe outputs alike."""

    run: Runner
    delta: np.ndarray

    @property
    def input_format(self) -> str | None:
        return getattr(self.run, "input_format", None)  # float only: _probe_needed skips uint8-frame graphs

    def infer(self, images: np.ndarray) -> np.ndarray:
        return self.run.infer(images + self.delta)

    def infer_all(self, batches):
        return self.run.infer_all(b + self.delta for b in batches)


def shared_fp32(backend, reference_path: Path, pre, open_fp32: Callable[[], Runner],
                variant: dict[str, float] | None = None) -> SharedFp32 | None:
    """How this runtime's FP32 side may take the outputs another runtime computed for the same FP32 ONNX graph
    (``reference_cache.SharedFp32``); None when its reference cannot be tied to that graph's bytes. ``variant``:
    what else the outputs depend on (the probe's mean shift, which ``open_fp32``'s runner then adds)."""
    source_sha256 = fp32_source_sha256(reference_path)
    if source_sha256 is None:
        return None
    try:
        versions = backend.versions()
    except Exception:  # noqa: BLE001 - a runtime that cannot say: recorded as unknown
        versions = {}

    def run_batch(images: np.ndarray) -> np.ndarray:
        fp32 = open_fp32()
        return fp32.infer(feed_for(fp32, images, pre))

    return SharedFp32(source_sha256, backend.name, versions, run_batch, variant)


def _probe_needed(accuracy: dict[str, Any], t: Thresholds, runner, reference_path: Path) -> bool:
    """The FP32 preprocessing probe runs on every labelled classifier whose accuracy rows all pass, on a float-input
    reference (docs/gate.md): a wrong --mean damages FP32 and INT8 alike, so agreement can meet its limit on a build
    that loses 12-46 points of top-1 (issue 43's corpus). A suspect probe fails the agreement row, so where an accuracy
    row already fails its two FP32 passes would decide nothing and are not run. Without labels there is no probe: the
    label-free check measured (FP32's confidence with the mean moved) raised a false alarm on a corpus model's right
    mean."""
    if accuracy.get("output_kind") != "logits" or not accuracy.get("labeled") or t.near_tie_margin <= 0:
        return False
    rows = [_drop_row(accuracy, t), _agreement_row(accuracy, t), _decisive_row(accuracy, t), _expected_drop_row(accuracy, t)]
    if not all(r.passed for r in rows):
        return False
    return getattr(runner("fp32", reference_path), "input_format", None) != UINT8_NHWC_RGB


def accuracy_of(ref, got, kind: str, thresholds: Thresholds, data_path: str, info) -> dict[str, Any]:
    """Accuracy of INT8 outputs ``got`` against FP32 outputs ``ref`` (both ``Outputs``, same inputs in the same order)."""
    if ref.values.shape != got.values.shape:
        raise DataError(f"the artifact outputs shape {got.values.shape[1:]} but its FP32 reference {ref.values.shape[1:]}: "
                        "the bundle's two models do not belong together; rebuild it")
    if kind == "embedding":
        accuracy = compare_embeddings(ref.values, got.values, thresholds.embedding_cosine_percentile)
    else:
        check_labels(ref.labels, int(ref.values.shape[1]), data_path)
        accuracy = compare_logits(ref.values, got.values, ref.labels, near_tie_margin=thresholds.near_tie_margin,
                                  drop_confidence=thresholds.drop_confidence)
        kept = per_sample.record(ref.values, got.values, ref.labels)
        if kept is not None:  # for `vitedge compare`'s paired test
            accuracy["per_sample"] = kept
        warnings = fp32_warnings(accuracy, int(ref.values.shape[1]), len(ref.values))
        if warnings:
            accuracy["warnings"] = warnings
            for w in warnings:
                info("WARNING " + w)
    accuracy["output_kind"] = kind
    accuracy["labeled"] = ref.labels is not None and kind != "embedding"
    return accuracy


def measure_speed_pair(ref_runner, int8_runner, first_images: np.ndarray, batch_sizes: tuple[int, ...], pre,
                       settings: LatencySettings, info) -> tuple[dict[str, dict[str, LatencyStats]], float]:
    """Interleaved FP32/INT8 latency at batch 1 and every profile batch size; the stats and the batch-1 speedup."""
    stats: dict[str, dict[str, LatencyStats]] = {"fp32": {}, "int8": {}}
    for b in sorted(set((1,) + tuple(batch_sizes))):
        x = np.repeat(first_images, int(np.ceil(b / len(first_images))), axis=0)[:b]
        f_ref, f_int8 = feed_for(ref_runner, x, pre), feed_for(int8_runner, x, pre)
        pair = measure_interleaved({"fp32": lambda: ref_runner.infer(f_ref), "int8": lambda: int8_runner.infer(f_int8)},
                                   b, settings)
        stats["fp32"][str(b)], stats["int8"][str(b)] = pair["fp32"], pair["int8"]
        busy = busy_note(pair["int8"].core_wait)
        info(f"batch {b}: FP32 p50 {pair['fp32'].p50_ms:.3f} ms, INT8 p50 {pair['int8'].p50_ms:.3f} ms "
             f"({pair['int8'].iterations} iterations{'' if pair['int8'].stable and pair['fp32'].stable else ', median not stable'}"
             f"{'; ' + busy if busy else ''})")
    return stats, stats["fp32"]["1"].p50_ms / stats["int8"]["1"].p50_ms


def source_data(source) -> dict[str, Any]:
    """The ``data`` section of a result: what the inputs were."""
    s = source.summary
    return {"path": s.path, "kind": s.kind, "items": len(source), "labeled": s.labeled, "data_hash": s.data_hash,
            "classes_present": s.classes_present}


def assemble_result(accuracy: dict[str, Any], stats: dict[str, dict[str, LatencyStats]], speedup: float | None,
                    memory: dict[str, Any], settings: LatencySettings | None, data: dict[str, Any],
                    thresholds: Thresholds, speed_check: SpeedCheck | None = None) -> ValidationResult:
    """The ValidationResult of measured accuracy, latency and memory, with its gate (``speed_check``: the second
    look at a batch-1 speedup short of the floor, vitedge.validation.speed_check)."""
    result = ValidationResult(accuracy=accuracy, latency=stats, speedup=speedup, memory=memory, latency_settings=settings, data=data)
    result.speed_check = speed_check
    result.gate = evaluate_gate(accuracy, speedup, result.p99_ms(), thresholds, speed_check)
    return result
