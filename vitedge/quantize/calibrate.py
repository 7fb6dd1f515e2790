"""Calibration: activation statistics from real images, cached, and SmoothQuant.

``calibrate`` runs the FP32 graph in ONNX Runtime (fixed thread count, fixed batch
size, data in the source's fixed order) and records, for every activation a Q/DQ pair
may go on, the clipping threshold of the chosen method. Statistics are collected for
*every* quantizable layer, attention matmuls included, so ``build_qdq`` can return any
of them to float, or quantize them, without calibrating again.

One streaming pass over the data (``_Collector``) measures everything: max |x| of every
activation; for the histogram methods a histogram of |x| per activation whose range grows
with the data (``vitedge.quantize.histogram``); per-channel histograms at the SmoothQuant
sites, from which the histogram of the smoothed activation x / s is derived once the
scales s are known; and, for bias correction, per-channel histograms and sums at the
inputs of the Linear layers. Memory is fixed by the graph, not by the number of images.
Softmax outputs always take max |x| as their threshold, whatever the method. Only the
options that need the final thresholds applied to the data run more passes: GPTQ and
method ``auto`` (one refinement pass, vitedge.quantize.refine) and the per-layer
SmoothQuant alpha search (one pass, vitedge.quantize.smooth_search).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from vitedge.datasources._common import CalibrationSource, SourceSummary
from vitedge.errors import CalibrationError, QuantizationError, UsageError
from vitedge.fsutil import sha256_bytes
from vitedge.onnxutil import (
    FLOAT_NCHW,
    INPUT_FORMAT_KEY,
    SPEC_KEY,
    UINT8_NHWC_RGB,
    SessionSettings,
    get_metadata,
    graph_inputs,
    is_large,
    lean_settings,
    onnx_sha256,
    ort_session,
)
from vitedge.quantize import smoothquant, stats
from vitedge.quantize.cache import CalibrationCache, cache_key
from vitedge.quantize.config import QUANTIZER_VERSION, SELECT_SAMPLES, SELECT_SAMPLES_LARGE, QuantConfig
from vitedge.quantize.graph import (
    GraphIndex,
    QuantLayer,
    SmoothSite,
    find_layers,
    find_smooth_sites,
    prepare,
    softmax_outputs,
)
from vitedge.quantize.histogram import ChannelHistogram
from vitedge.quantize.qdq import QuantizedGraph, build_qdq
from vitedge.quantize.record import Calibration, CandidateScore, Selection, Variant
from vitedge.quantize.refine import Refinement, correct_biases, refinable, refine
from vitedge.quantize.select import SELECT_MIN_RATIO, SELECT_MIN_T, choose
from vitedge.quantize.smooth_search import choose_alphas
from vitedge.spec import ModelSpec

# Fixed so the statistics do not depend on the machine. (ONNX Runtime's CPU results were
# bit-identical for 1-4 threads and batch 1 vs 8 in our measurements; fixing both anyway
# costs little.)
CALIBRATION_THREADS = 2
CALIBRATION_BATCH = 8
# Past 2 GB (vit_h_14) each run returns every activation of its batch as a graph output (~0.6 GB per
# image): batches of one, and ONNX Runtime without pre-packed weights or arena (onnxutil.lean_settings).
LARGE_GRAPH_BATCH = 1


def _detached(message: Any) -> Any:
    """A copy of a protobuf sub-message that does not hold on to the message it came from."""
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


def _large_graph_run(model: Any) -> tuple[int | None, SessionSettings]:
    """(batch size or None for the default, session settings) for running ``model`` in calibration."""
    if is_large(model):
        return LARGE_GRAPH_BATCH, lean_settings()
    return None, SessionSettings()


def calibrate(
    fp32_onnx_path: str | Path,
    source: CalibrationSource,
    config: QuantConfig | None = None,
    *,
    cache_dir: str | Path | None = None,
    progress: bool = False,
) -> Calibration:
    """Collect (or load from the cache) the activation statistics of an FP32 ONNX graph."""
    import onnx

    config = config or QuantConfig()
    if not isinstance(config, QuantConfig):
        raise UsageError(f"config must be a QuantConfig, got {type(config).__name__}")
    start = time.perf_counter()
    path = Path(fp32_onnx_path)
    if not path.is_file():
        raise UsageError(f"{path} does not exist: pass the FP32 ONNX graph (vitedge export writes one)")
    raw = path.read_bytes()
    try:
        model = onnx.load_model_from_string(raw)
        external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
        if external:
            model = onnx.load(str(path))
    except Exception as err:
        raise QuantizationError(f"{path} is not a readable ONNX graph: {str(err).splitlines()[0][:160] if str(err) else type(err).__name__}") from err
    fp32_sha = sha256_bytes(raw)
    if external:  # the weights in the external data file are part of what the cache keys on

        fp32_sha = onnx_sha256(path)
    meta = get_metadata(model)
    preprocess = None
    if SPEC_KEY in meta:
        try:
            preprocess = json.loads(meta[SPEC_KEY]).get("preprocess")
        except (ValueError, AttributeError):
            preprocess = None
    summary = source.summary
    parts = {
        "quantizer_version": QUANTIZER_VERSION,
        "fp32_sha256": fp32_sha,
        "data_hash": summary.data_hash,
        "preprocess": preprocess,
        "method": config.method,
        "method_params": config.method_params(),
        "smoothquant": config.smoothquant_params(),
    }
    key = cache_key(parts)

    prepared = prepare(model)
    del model  # prepare copied it: one 2.5 GB graph less (vit_h_14)
    gi = GraphIndex(prepared)
    layers = find_layers(gi)
    if not layers:
        raise QuantizationError(f"{path} has no MatMul/Gemm/Conv layer with constant weights: nothing to quantize")
    sites: list[SmoothSite] = []
    if config.smoothquant_alpha is not None:
        sites = [s for s in find_smooth_sites(gi, layers) if config.smoothquant_shared or not s.shared]
    tensors = _activation_tensors(layers)
    timings = {"prepare": time.perf_counter() - start}

    cache = CalibrationCache(cache_dir)
    entry = cache.load(key)
    restored = _restore(entry, sites, tensors) if entry is not None else None
    passes = 0
    cache_note = None
    candidates: dict[str, dict[str, float]] = {}
    moments: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
    variant_moments: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    if restored is not None:
        thresholds, amax, scales, candidates = restored
        smoothed, renamed = smoothquant.apply(prepared, sites, scales)
        reused = True
    else:
        t0 = time.perf_counter()
        runner = _Runner(prepared, meta, source, progress)
        probs = softmax_outputs(gi, tensors)
        image_inputs = {l.inputs[0] for l in layers if l.kind == "patch_embed"} | {runner.input.name}
        site_inputs = sorted({t for s in sites for t in s.inputs})
        moment_inputs = {l.inputs[0] for l in refinable(layers)} if _biases_from_the_pass(config) else set()
        collector = _Collector(tensors, site_inputs, probs, config.num_bins if config.needs_histograms else 0, moment_inputs)
        # the one pass: max |x|, histograms with a growing range, per-channel histograms at
        # SmoothQuant sites and at the bias correction's layer inputs
        runner.collect(collector)
        amax0, chan = collector.absmax(), collector.channel_absmax()
        scales = {}
        alphas: dict[str, float] = {}
        if config.smoothquant_search and sites:

            alphas = choose_alphas(runner, gi, sites, chan, config.weight_range)
        site_scale: dict[str, np.ndarray] = {}
        for site in sites:
            x = np.max([chan[t] for t in site.inputs], axis=0)
            alpha = alphas.get(site.norm, float(config.smoothquant_alpha))
            scales[site.norm] = smoothquant.smoothing_scales(x, smoothquant.weight_input_absmax(gi, site), alpha)
            site_scale.update({t: scales[site.norm] for t in site.inputs})
        smoothed, renamed = smoothquant.apply(prepared, sites, scales)
        amax = {renamed.get(t, t): v for t, v in amax0.items()}
        for t, s in site_scale.items():
            amax[renamed.get(t, t)] = float(np.max(chan[t] / s)) if chan[t].size else 0.0
        passes = runner.runs
        runner = None  # it holds the unsmoothed graph: only the smoothed copy is used from here (2.5 GB on vit_h_14)
        hists = None
        if config.needs_histograms:
            hists = {renamed.get(t, t): collector.histogram(t, amax[renamed.get(t, t)], config.num_bins, site_scale.get(t))
                     for t in tensors if t not in probs}
        # Softmax outputs (attention probabilities, in [0, 1]) are never clipped: their few
        # large values are what attention attends to (measured: clipping them cost
        # agreement on the digits ViT with every histogram method).
        # The image itself (the patch embedding's input) is not clipped either: preprocessing
        # already bounds it, and its extremes are real pixels (entropy put the threshold of
        # ImageNet-normalised digits at 2.13 of 2.64, clipping the bright strokes; full INT8
        # SigLIP-MAP agreement 98.99% -> 99.75% with the exact range, benchmarks/results/families.md).
        exact = {renamed.get(t, t) for t in probs} | image_inputs
        if config.method in ("auto", "select"):  # the candidates chosen from, per tensor (auto) or per model (select)
            candidates = {t: stats.candidate_thresholds(amax[t], hists[t]) for t in sorted(amax) if t not in exact}
        # auto and select start from entropy's thresholds (already among the candidates)
        thresholds = {
            t: candidates[t]["entropy"] if t in candidates else
            stats.threshold("minmax" if t in exact else config.method, amax[t], hists.get(t) if hists else None, percentile=config.percentile)
            for t in sorted(amax)
        }

        def moments_for(th: dict[str, float]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
            return {renamed.get(t, t): collector.moments(t, th[renamed.get(t, t)], site_scale.get(t)) for t in collector.moment_tensors}

        moments = moments_for(thresholds)
        if config.method == "select":
            variant_moments = {c: moments_for(th) for c, th in _variant_thresholds(thresholds, candidates).items()}
        timings["statistics"] = time.perf_counter() - t0
        reused = False
        try:
            _store(cache, key, parts, summary, thresholds, amax, scales, candidates)
        except OSError as err:
            cache_note = f"could not write the calibration cache in {cache.root}: {err.strerror or err}"
    gi = prepared = None  # (the GraphIndex holds the unsmoothed graph too)
    smoothed_layers = tuple(sorted({name for s in sites if s.norm in scales for name in s.layers}))
    layers_after = tuple(find_layers(GraphIndex(smoothed)))
    missing = [t for t in _activation_tensors(layers_after) if t not in thresholds]
    if missing:  # a bug, not a user error
        raise QuantizationError(f"no statistics for activation '{missing[0]}' ({len(missing)} missing)")
    refinement = None
    variants: dict[str, Variant] = {}
    if config.method == "select":
        if not candidates:
            raise QuantizationError("method 'select' found no candidate thresholds in the statistics (stale cache entry?)")
        for c, th in _variant_thresholds(thresholds, candidates).items():
            ref = None
            if config.refine_params() is not None:
                ref, refine_passes = _refinement(cache, dict(parts, candidate=c), config, smoothed, meta, source, progress, smoothed,
                                                 layers_after, th, {}, variant_moments.get(c))
                passes += refine_passes
                if refine_passes:
                    reused = False
            variants[c] = Variant(c, th, ref)
    elif config.refine_params() is not None:
        if config.method == "auto" and not candidates:
            raise QuantizationError("method 'auto' found no candidate thresholds in the statistics (stale cache entry?)")
        refinement, refine_passes = _refinement(cache, parts, config, smoothed, meta, source, progress, smoothed, layers_after,
                                                thresholds, candidates, moments)
        thresholds = dict(thresholds, **refinement.thresholds)
        passes += refine_passes
        if refine_passes:
            reused = False
            timings["refinement"] = refinement.seconds
    result = Calibration(
        fp32_path=path, fp32_sha256=fp32_sha, config=config, model=smoothed, layers=layers_after,
        thresholds=thresholds, absmax=amax, smoothing=scales, smoothed_layers=smoothed_layers, summary=summary,
        key=key, reused=reused, forward_passes=passes, timings=timings,
        cache_path=cache.path_for(key) if cache_note is None else None, cache_note=cache_note, refinement=refinement,
        variants=variants,
    )
    if variants:
        selection, select_passes = _selection(cache, parts, config, result, meta, source)
        result = result.with_variant(selection.chosen)
        result = replace(result, selection=selection, forward_passes=passes + select_passes)
        if select_passes:
            timings["selection"] = selection.seconds
    timings["total"] = time.perf_counter() - start
    return result


def _variant_thresholds(thresholds: dict[str, float], candidates: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Method select: every candidate's thresholds (tensors without candidates, the Softmax outputs and
    the image, keep their own: max |x|), in ``stats.CANDIDATES`` order."""
    return {c: {t: candidates[t][c] if t in candidates else v for t, v in thresholds.items()} for c in stats.CANDIDATES}


def _selection(cache: CalibrationCache, parts: dict[str, Any], config: QuantConfig, calibration: Calibration,
               meta: dict[str, str], source: CalibrationSource) -> tuple[Selection, int]:
    """Method select's choice: from the cache, or by scoring every candidate at the model's output on
    the first calibration images. Returns (selection, forward passes run)."""
    large = is_large(calibration.model)
    samples = SELECT_SAMPLES_LARGE if large else SELECT_SAMPLES
    skey_parts = dict(parts, refine=config.refine_params(), select={"samples": samples, "attention": config.quantize_attention,
                                                                    "weight_range": config.weight_range, "rule": [SELECT_MIN_T, SELECT_MIN_RATIO]})
    skey = cache_key(skey_parts)
    store = CalibrationCache(cache.root, kind="selection")
    entry = store.load(skey)
    if entry is not None:
        try:
            doc = entry["meta"]["selection"]
            scores = tuple(CandidateScore(str(c["name"]), float(c["error"]), None if c["agreement"] is None else float(c["agreement"]),
                                          float(c["paired_t"])) for c in doc["candidates"])
            chosen = str(doc["chosen"])
            if chosen in calibration.variants and all(s.name in calibration.variants for s in scores):
                return Selection(chosen=chosen, metric=str(doc["metric"]), samples=int(doc["samples"]), scores=scores, reused=True,
                                 first=str(doc["first"]), min_t=float(doc["min_t"]), min_ratio=float(doc["min_ratio"])), 0
        except (KeyError, TypeError, ValueError):
            pass
    runner = _Runner(calibration.model, meta, source, False)
    feeds, have = [], 0
    for batch in runner._feeds("select"):
        feeds.append(batch[: samples - have])
        have += len(feeds[-1])
        if have >= samples:
            break
    declared = None
    if SPEC_KEY in meta:
        try:
            declared = ModelSpec.from_json(meta[SPEC_KEY]).output_kind
        except Exception:
            declared = None
    settings = lean_settings() if large else SessionSettings()
    selection = choose(calibration, runner.input.name, feeds, declared_kind=declared, settings=settings)
    try:
        store.save(skey, {"parts": skey_parts, "selection": selection.to_dict()}, {})
    except OSError:
        pass
    return selection, len(feeds) * (1 + len(calibration.variants))


def _refinement(cache: CalibrationCache, parts: dict[str, Any], config: QuantConfig, prepared: Any, meta: dict[str, str],
                source: CalibrationSource, progress: bool, smoothed: Any, layers: tuple[QuantLayer, ...],
                thresholds: dict[str, float], candidates: dict[str, dict[str, float]],
                moments: dict[str, tuple[np.ndarray, np.ndarray]] | None):
    """GPTQ weights / corrected biases: from the cache, from the calibration pass's channel
    moments (bias correction alone), or from one more pass over the data.
    Returns (refinement, forward passes run)."""

    rkey = cache_key(dict(parts, refine=config.refine_params()))
    cache = CalibrationCache(cache.root, kind="refinement")
    entry = cache.load(rkey)
    if entry is not None:
        try:
            return Refinement.from_arrays(entry["meta"]["refinement"], entry["arrays"]), 0
        except (KeyError, TypeError, ValueError, IndexError):
            pass
    if moments is not None and _biases_from_the_pass(config):
        result = correct_biases(smoothed, layers, moments, config.weight_range)
    else:
        runner = _Runner(prepared, meta, source, progress)
        result = refine(runner, smoothed, layers, thresholds, gptq=config.weight_rounding == "gptq",
                        bias_correction=config.bias_correction, weight_range=config.weight_range, candidates=candidates)
    index, arrays = result.to_arrays()
    try:
        cache.save(rkey, {"parts": dict(parts, refine=config.refine_params()), "refinement": index}, arrays)
    except OSError:
        pass
    return result, result.forward_passes


def _biases_from_the_pass(config: QuantConfig) -> bool:
    """Bias correction alone (no GPTQ, no per-tensor threshold choice) needs only channel
    means of x and Q(x): the calibration pass's per-channel histograms give both."""
    return config.bias_correction and config.weight_rounding == "nearest" and config.method != "auto"


def _activation_tensors(layers: list[QuantLayer] | tuple[QuantLayer, ...]) -> list[str]:
    return list(dict.fromkeys(t for l in layers for t in l.inputs))


# --------------------------------------------------------------------------- cache entries


def _store(cache: CalibrationCache, key: str, parts: dict[str, Any], summary: SourceSummary,
           thresholds: dict[str, float], amax: dict[str, float], scales: dict[str, np.ndarray],
           candidates: dict[str, dict[str, float]]) -> None:
    names = sorted(thresholds)
    norms = sorted(scales)
    arrays = {
        "thresholds": np.array([thresholds[n] for n in names], dtype=np.float64),
        "amax": np.array([amax[n] for n in names], dtype=np.float64),
    }
    for c in stats.CANDIDATES if candidates else ():
        arrays[f"candidate_{c}"] = np.array([candidates[n][c] if n in candidates else np.nan for n in names], dtype=np.float64)
    for k, norm in enumerate(norms):
        arrays[f"smooth_{k}"] = np.asarray(scales[norm], dtype=np.float64)
    meta = {"parts": parts, "tensors": names, "norms": norms, "summary": summary.to_dict()}
    cache.save(key, meta, arrays)


def _restore(entry: dict[str, Any], sites: list[SmoothSite], tensors: list[str]):
    try:
        meta, arrays = entry["meta"], entry["arrays"]
        names = list(meta["tensors"])
        th, am = arrays["thresholds"], arrays["amax"]
        if len(th) != len(names) or len(am) != len(names):
            return None
        thresholds = {n: float(v) for n, v in zip(names, th)}
        amax = {n: float(v) for n, v in zip(names, am)}
        scales = {norm: np.asarray(arrays[f"smooth_{k}"], dtype=np.float64) for k, norm in enumerate(meta["norms"])}
        site_norms = {s.norm: s for s in sites}
        if set(scales) != set(site_norms) or any(scales[n].shape != (site_norms[n].channels,) for n in scales):
            return None
        if not all(np.all(np.isfinite(v)) and np.all(v > 0) for v in scales.values()):
            return None
        if not all(np.isfinite(v) and v > 0 for v in thresholds.values()):
            return None
    except (KeyError, TypeError, ValueError):
        return None
    unsmoothed = set(tensors) - {t for s in sites for t in s.inputs}
    if not unsmoothed <= set(thresholds):
        return None
    candidates: dict[str, dict[str, float]] = {}
    if all(f"candidate_{c}" in arrays for c in stats.CANDIDATES):
        for k, n in enumerate(names):
            row = {c: float(arrays[f"candidate_{c}"][k]) for c in stats.CANDIDATES}
            if all(np.isfinite(v) for v in row.values()):
                candidates[n] = row
    return thresholds, amax, scales, candidates


# --------------------------------------------------------------------------- the statistics of the pass

# One-channel histograms of |x| are kept this many times finer than num_bins (the range
# grows by doubling, so the final [0, max] still spans at least 4x num_bins of their bins).
FINE_BINS_FACTOR = 8
# Bins per channel and sign of the per-channel histograms (SmoothQuant sites, the bias
# correction's layer inputs); fewer (down to MIN_CHANNEL_BINS) when all of them would
# pass CHANNEL_HISTOGRAM_BUDGET_BYTES (int32 counts).
CHANNEL_BINS = 256
MIN_CHANNEL_BINS = 64
CHANNEL_HISTOGRAM_BUDGET_BYTES = 256 * 2**20


class _Collector:
    """Everything calibration measures, accumulated batch by batch in one pass.

    Per activation tensor: max |x| (softmax outputs: only that); a one-channel histogram of
    |x| when the method needs histograms; per-channel signed histograms (and channel sums)
    at SmoothQuant sites (the histogram of x / s is derived once s is known) and at the
    inputs of the layers whose biases get corrected."""

    def __init__(self, tensors: list[str], site_inputs: list[str], probs: set[str], num_bins: int, moment_inputs: set[str]):
        self.tensors = list(tensors)
        self.site_inputs = set(site_inputs)
        self.probs = set(probs)
        self.num_bins = num_bins
        self.moment_tensors = sorted(set(moment_inputs) & set(self.tensors))
        self.per_channel = sorted(self.site_inputs | set(self.moment_tensors))
        self.peak: dict[str, float] = {t: 0.0 for t in self.tensors}
        self.whole: dict[str, ChannelHistogram] = {}
        self.channel: dict[str, ChannelHistogram] = {}
        self.channel_bins = CHANNEL_BINS

    @property
    def outputs(self) -> list[str]:
        return sorted(set(self.tensors) | self.site_inputs)

    def add(self, values: dict[str, np.ndarray]) -> None:
        if not self.channel and self.per_channel:
            self._size_channel_histograms(values)
        for t, v in values.items():
            v = np.asarray(v)
            peak = None
            if t in self.channel:
                peak = self.channel[t].add(v)
            if t in self.whole or (self.num_bins and t not in self.probs and t not in self.site_inputs):
                h = self.whole.get(t)
                if h is None:
                    h = self.whole[t] = ChannelHistogram(1, FINE_BINS_FACTOR * self.num_bins)
                peak = h.add(v)
            if peak is None:
                peak = stats.absmax(v)
            if not np.isfinite(peak):
                raise CalibrationError(f"activation '{t}' is not finite (inf/NaN) on the calibration data: check the model and its preprocessing")
            if t in self.peak:
                self.peak[t] = max(self.peak[t], peak)

    def _size_channel_histograms(self, values: dict[str, np.ndarray]) -> None:
        widths = {t: int(np.asarray(values[t]).shape[-1]) for t in self.per_channel}
        bins = CHANNEL_BINS
        while bins > MIN_CHANNEL_BINS and sum(widths.values()) * 2 * bins * 4 > CHANNEL_HISTOGRAM_BUDGET_BYTES:
            bins //= 2
        self.channel_bins = bins
        self.channel = {t: ChannelHistogram(w, bins, signed=t in self.moment_tensors) for t, w in widths.items()}

    def absmax(self) -> dict[str, float]:
        return dict(self.peak)

    def channel_absmax(self) -> dict[str, np.ndarray]:
        return {t: self.channel[t].absmax.copy() for t in self.site_inputs if t in self.channel}

    def histogram(self, t: str, top: float, num_bins: int, scale: np.ndarray | None) -> np.ndarray:
        """The histogram of |x| (of |x / s| at a SmoothQuant site) over [0, top]."""
        if t in self.site_inputs:
            return self.channel[t].histogram(top, num_bins, scale)
        return self.whole[t].histogram(top, num_bins)

    def moments(self, t: str, threshold: float, scale: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Per channel: the mean of x and of Q(x) (x / s and Q(x / s) at a SmoothQuant site)."""
        h = self.channel[t]
        s = np.ones(h.channels) if scale is None else np.asarray(scale, dtype=np.float64)
        return h.mean() / s, h.mean_fake_quant(threshold, s)


# --------------------------------------------------------------------------- running the graph


class _Runner:
    """Runs a graph with extra outputs over the calibration source, batch by batch."""

    def __init__(self, model: Any, meta: dict[str, str], source: CalibrationSource, progress: bool):
        self.model = model
        self.source = source
        self.progress = progress
        self.runs = 0
        self.uint8 = meta.get(INPUT_FORMAT_KEY, FLOAT_NCHW) == UINT8_NHWC_RGB
        self.preprocess = None
        if self.uint8:

            try:
                self.preprocess = ModelSpec.from_json(meta[SPEC_KEY]).preprocess
            except Exception as err:
                raise QuantizationError("the graph takes uint8 frames but carries no vitedge.spec metadata to undo the normalisation: calibrate the float graph") from err
        inputs = graph_inputs(model)
        if len(inputs) != 1:
            raise QuantizationError(f"vitedge calibrates graphs with one image input; this one has {len(inputs)}")
        self.input = _detached(inputs[0])  # not a view into `model`: one would keep the whole graph alive (upb arenas)
        dims = self.input.type.tensor_type.shape.dim
        self.fixed_batch = dims[0].dim_value if len(dims) and dims[0].HasField("dim_value") else 0
        large_batch, self.session_settings = _large_graph_run(model)
        self.batch = self.fixed_batch or large_batch or CALIBRATION_BATCH

    def _session(self, outputs: list[str]):
        import onnx
        from onnx import TensorProto, helper


        # the graph's outputs are swapped in place and restored: a copy of a 2.5 GB graph (vit_h_14)
        # would cost as much memory again
        m = self.model
        original = [onnx.ValueInfoProto.FromString(v.SerializeToString()) for v in m.graph.output]
        known = {v.name: v for v in m.graph.value_info}
        wanted = []
        for name in outputs:
            vi = known.get(name)
            if vi is None or not vi.type.tensor_type.elem_type:
                vi = helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
            wanted.append(onnx.ValueInfoProto.FromString(vi.SerializeToString()))
        del m.graph.output[:]
        m.graph.output.extend(wanted)
        try:
            return ort_session(m, self.session_settings, threads=CALIBRATION_THREADS)  # past 2 GB: through external data
        except Exception as err:
            raise QuantizationError(f"ONNX Runtime cannot run the FP32 graph for calibration: {str(err).splitlines()[0][:200]}") from err
        finally:
            del m.graph.output[:]
            m.graph.output.extend(original)

    def _feeds(self, description: str):
        total = -(-len(self.source) // self.batch)
        bar = None
        if self.progress:

            bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("batches"),
                           TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True), transient=False)
            bar.start()
            task = bar.add_task(description, total=total)
        try:
            for batch in self.source.batches(self.batch):
                x = batch.images
                if self.fixed_batch and x.shape[0] != self.fixed_batch:
                    raise QuantizationError(
                        f"the FP32 graph has a fixed batch of {self.fixed_batch} and {len(self.source)} calibration items do not fill "
                        "its batches: re-export with a dynamic batch (vitedge export does) or pick --calib-size as a multiple of it")
                self._check_shape(x)
                yield self._to_input(x)
                if bar is not None:
                    bar.advance(task)
        finally:
            if bar is not None:
                bar.stop()

    def _check_shape(self, x: np.ndarray) -> None:
        dims = self.input.type.tensor_type.shape.dim
        want = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        if self.uint8:  # NHWC
            want = [want[0], want[3], want[1], want[2]] if len(want) == 4 else want
        got = list(x.shape)
        if len(want) != len(got) or any(w is not None and w != g for w, g in zip(want[1:], got[1:])):
            shape = "x".join(str(v) for v in got[1:])
            model = "x".join("?" if v is None else str(v) for v in want[1:])
            raise CalibrationError(f"calibration items are {shape} after preprocessing but the model takes {model}: "
                                   "open the source with the model's preprocessing")

    def _to_input(self, x: np.ndarray) -> np.ndarray:
        if not self.uint8:
            return x
        pre = self.preprocess
        mean = np.asarray(pre.mean, dtype=np.float64).reshape(1, -1, 1, 1)
        std = np.asarray(pre.std, dtype=np.float64).reshape(1, -1, 1, 1)
        frames = np.clip(np.rint((x * std + mean) * 255.0), 0, 255).astype(np.uint8)
        return np.ascontiguousarray(frames.transpose(0, 2, 3, 1))

    def _run(self, outputs: list[str], description: str):
        name = self.input.name
        from_input = [t for t in outputs if t == name]
        run_outputs = [t for t in outputs if t != name]
        sess = self._session(run_outputs) if run_outputs else None
        for feed in self._feeds(description):
            values = dict(zip(run_outputs, sess.run(run_outputs, {name: feed}))) if sess is not None else {}
            for t in from_input:
                values[t] = feed
            self.runs += 1 if sess is not None else 0
            yield values
            del values  # not alive while the next batch's outputs are computed

    def collect(self, collector: _Collector) -> None:
        for values in self._run(collector.outputs, "calibrating"):
            collector.add(values)
            del values


def quantize(
    fp32_onnx_path: str | Path,
    source: Any,
    config: QuantConfig | None = None,
    out_path: str | Path | None = None,
    *,
    keep_float: Iterable[str] | str = (),
    cache_dir: str | Path | None = None,
    progress: bool = False,
) -> QuantizedGraph:
    """calibrate + build_qdq (+ save when ``out_path`` is given)."""
    cal = calibrate(fp32_onnx_path, source, config, cache_dir=cache_dir, progress=progress)
    result = build_qdq(cal, keep_float=keep_float)
    if out_path is not None:
        result.save(out_path)
    return result
