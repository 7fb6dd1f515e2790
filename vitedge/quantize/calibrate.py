"""Calibration: activation statistics from real images, cached, and SmoothQuant.

``calibrate`` runs the FP32 graph in ONNX Runtime (fixed thread count, fixed batch
size, data in the source's fixed order) and records, for every activation a Q/DQ pair
may go on, the clipping threshold of the chosen method. Statistics are collected for
*every* quantizable layer, attention matmuls included, so ``build_qdq`` can return any
of them to float, or quantize them, without calibrating again.

The steps, in order (each a function below):

1. ``_load_fp32``: read the graph, hash it (the weights too when they sit in files).
2. ``_key_parts``: what the statistics depend on, hashed into the cache key.
3. ``_plan``: the prepared graph, its quantizable layers, the SmoothQuant sites.
4. ``_restore`` (cache hit) or ``_measure`` (cache miss): one streaming pass over the data
   (``vitedge.quantize.collect``) gives max |x|, histograms and channel statistics; then
   SmoothQuant's scales, the thresholds of every candidate method from the same histograms,
   and the bias correction's channel means.
5. ``_refined`` / ``_candidates``: the refinement (bias correction, GPTQ) of the thresholds,
   or of every candidate's thresholds for method ``select``.
6. ``_selection`` (method ``select``): each candidate's full-INT8 graph scored at the model's
   output on the first calibration images, kept from the pass with the FP32 output on them.

Softmax outputs always take max |x| as their threshold, whatever the method. Only the
options that need the final thresholds applied to the data run more passes: GPTQ and
method ``auto`` (one refinement pass, vitedge.quantize.refine) and the per-layer
SmoothQuant alpha search (one pass, vitedge.quantize.smooth_search). With the default
settings the data is read, decoded and run through the FP32 graph once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.datasources.base import CalibrationSource, SourceSummary
from vitedge.core.errors import QuantizationError, UsageError
from vitedge.files.atomic import sha256_bytes
from vitedge.onnxkit.files import is_large, onnx_sha256
from vitedge.onnxkit.metadata import SPEC_KEY, get_metadata
from vitedge.onnxkit.session import lean_settings
from vitedge.quantize import smoothquant, stats
from vitedge.quantize.cache import CalibrationCache, cache_key
from vitedge.quantize.collect import (  # noqa: F401  (CALIBRATION_BATCH, LARGE_GRAPH_BATCH: documented here)
    CALIBRATION_BATCH,
    CALIBRATION_SESSION,
    LARGE_GRAPH_BATCH,
    CalibrationPass,
    Collector,
    Kept,
    pass_outputs,
    per_tensor,
)
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
from vitedge.quantize.qdq import QuantizedGraph, build_qdq
from vitedge.quantize.record import Calibration, Selection, Variant
from vitedge.files.safefile import parse_json
from vitedge.quantize.refine import Refinement, correct_biases, refinable, refine
from vitedge.quantize.select import SELECT_CONTEND_RATIO, SELECT_FIRST_LOOK, SELECT_MIN_RATIO, SELECT_MIN_T, choose
from vitedge.quantize.smooth_search import choose_alphas
from vitedge.bundle.spec import ModelSpec

if TYPE_CHECKING:
    from onnx import ModelProto

# The old private names (tests and benchmarks import them from here).
_Runner = CalibrationPass
_Collector = Collector

Moments = dict[str, tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class _Fp32Graph:
    """The FP32 graph as read: the model, its hash (weights in files included) and metadata."""

    path: Path
    model: Any  # onnx.ModelProto
    sha256: str
    meta: dict[str, str]
    preprocess: dict[str, Any] | None


@dataclass
class _Plan:
    """The prepared graph and where calibration measures it."""

    prepared: Any  # onnx.ModelProto, prepared (vitedge.quantize.graph.prepare)
    gi: GraphIndex
    layers: list[QuantLayer]
    sites: list[SmoothSite]
    tensors: list[str]  # every activation a Q/DQ pair may go on


@dataclass
class _Statistics:
    """What the statistics step produced: from the cache, or measured by the pass."""

    thresholds: dict[str, float]
    amax: dict[str, float]
    scales: dict[str, np.ndarray]  # LayerNorm node name -> SmoothQuant's s
    candidates: dict[str, dict[str, float]]
    smoothed: Any  # onnx.ModelProto with SmoothQuant applied
    reused: bool
    passes: int = 0
    moments: Moments | None = None
    variant_moments: dict[str, Moments] = field(default_factory=dict)
    kept: Kept | None = None  # method select: the first images and the FP32 output on them
    cache_note: str | None = None


def calibrate(
    fp32_onnx_path: str | Path,
    source: CalibrationSource,
    config: QuantConfig | None = None,
    *,
    cache_dir: str | Path | None = None,
    progress: bool = False,
) -> Calibration:
    """Collect (or load from the cache) the activation statistics of an FP32 ONNX graph."""
    config = config or QuantConfig()
    if not isinstance(config, QuantConfig):
        raise UsageError(f"config must be a QuantConfig, got {type(config).__name__}")
    start = time.perf_counter()
    graph = _load_fp32(Path(fp32_onnx_path))
    parts = _key_parts(graph, source.summary, config)
    key = cache_key(parts)
    plan = _plan(graph, config)
    graph = replace(graph, model=None)  # prepare copied it: one 2.5 GB graph less (vit_h_14)
    timings = {"prepare": time.perf_counter() - start}
    cache = CalibrationCache(cache_dir)
    entry = cache.load(key)
    st = _restore(entry, plan) if entry is not None else None
    if st is None:
        t0 = time.perf_counter()
        st = _measure(plan, graph.meta, source, config, progress)
        timings["statistics"] = time.perf_counter() - t0
        st.cache_note = _store(cache, key, parts, source.summary, st)
    smoothed_layers = tuple(sorted({name for s in plan.sites if s.norm in st.scales for name in s.layers}))
    plan = None  # (the GraphIndex holds the unsmoothed graph)
    layers_after = _layers_with_statistics(st)
    result = Calibration(
        fp32_path=graph.path, fp32_sha256=graph.sha256, config=config, model=st.smoothed, layers=layers_after,
        thresholds=st.thresholds, absmax=st.amax, smoothing=st.scales, smoothed_layers=smoothed_layers,
        summary=source.summary, key=key, reused=st.reused, forward_passes=st.passes, timings=timings,
        cache_path=cache.path_for(key) if st.cache_note is None else None, cache_note=st.cache_note,
    )
    refine_on = (cache, parts, config, graph.meta, source, progress)
    if config.method == "select":
        result = _candidates(result, st, *refine_on)
        result = _selected(result, cache, parts, config, graph.meta, source, st.kept)
    elif config.refine_params() is not None:
        result = _refined(result, st, *refine_on)
    timings["total"] = time.perf_counter() - start
    return result


# --------------------------------------------------------------------------- 1-3: graph, key, plan


def _load_fp32(path: Path) -> _Fp32Graph:
    """The FP32 graph, its sha256 (of the weight files too when the weights sit outside it) and metadata."""
    import onnx

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
    # the weights in the external data file are part of what the cache keys on
    sha = onnx_sha256(path) if external else sha256_bytes(raw)
    del raw
    meta = get_metadata(model)
    preprocess = None
    if SPEC_KEY in meta:
        try:
            preprocess = parse_json(meta[SPEC_KEY], f"{path} metadata").get("preprocess")
        except (ValueError, AttributeError):
            preprocess = None
    return _Fp32Graph(path, model, sha, meta, preprocess)


def _key_parts(graph: _Fp32Graph, summary: SourceSummary, config: QuantConfig) -> dict[str, Any]:
    """Everything the statistics depend on (the cache key is their hash)."""
    return {
        "quantizer_version": QUANTIZER_VERSION,
        "fp32_sha256": graph.sha256,
        "data_hash": summary.data_hash,
        "preprocess": graph.preprocess,
        "method": config.method,
        "method_params": config.method_params(),
        "smoothquant": config.smoothquant_params(),
    }


def _plan(graph: _Fp32Graph, config: QuantConfig) -> _Plan:
    prepared = prepare(graph.model)
    gi = GraphIndex(prepared)
    layers = find_layers(gi)
    if not layers:
        raise QuantizationError(f"{graph.path} has no MatMul/Gemm/Conv layer with constant weights: nothing to quantize")
    sites: list[SmoothSite] = []
    if config.smoothquant_alpha is not None:
        sites = [s for s in find_smooth_sites(gi, layers) if config.smoothquant_shared or not s.shared]
    return _Plan(prepared, gi, layers, sites, _activation_tensors(layers))


# --------------------------------------------------------------------------- 4: the statistics (measured)


def _measure(plan: _Plan, meta: dict[str, str], source: CalibrationSource, config: QuantConfig, progress: bool) -> _Statistics:
    """The pass over the data, then everything derived from what it measured."""
    runner = CalibrationPass(plan.prepared, meta, source, progress)
    input_name = runner.input.name
    probs = softmax_outputs(plan.gi, plan.tensors)
    collector = _collector_for(plan, config, probs)
    kept = Kept(_select_samples(plan.prepared), plan.prepared.graph.output[0].name) if config.method == "select" else None
    runner.collect(collector, kept)  # the one pass
    scales, site_scale = _smoothing_scales(plan, collector, runner, config)
    passes = runner.runs
    runner = None  # it holds the unsmoothed graph: only the smoothed copy is used from here (2.5 GB on vit_h_14)
    smoothed, renamed = smoothquant.apply(plan.prepared, plan.sites, scales)
    amax = _smoothed_absmax(collector, site_scale, renamed)
    # Softmax outputs (attention probabilities, in [0, 1]) are never clipped: their few
    # large values are what attention attends to (measured: clipping them cost
    # agreement on the digits ViT with every histogram method).
    # The image itself (the patch embedding's input) is not clipped either: preprocessing
    # already bounds it, and its extremes are real pixels (entropy put the threshold of
    # ImageNet-normalised digits at 2.13 of 2.64, clipping the bright strokes; full INT8
    # SigLIP-MAP agreement 98.99% -> 99.75% with the exact range, benchmarks/results/families.md).
    image_inputs = {l.inputs[0] for l in plan.layers if l.kind == "patch_embed"} | {input_name}
    exact = {renamed.get(t, t) for t in probs} | image_inputs
    hists = _histograms(collector, plan.tensors, probs, amax, site_scale, renamed, config)
    candidates, thresholds = _thresholds(amax, hists, exact, config)
    st = _Statistics(thresholds, amax, scales, candidates, smoothed, reused=False, passes=passes, kept=kept)
    _channel_moments(st, collector, site_scale, renamed, config)
    return st


def _select_samples(model: ModelProto) -> int:
    """Method select: how many of the first calibration images its candidates are scored on."""
    return SELECT_SAMPLES_LARGE if is_large(model) else SELECT_SAMPLES


def _collector_for(plan: _Plan, config: QuantConfig, probs: set[str]) -> Collector:
    site_inputs = sorted({t for s in plan.sites for t in s.inputs})
    moment_inputs = {l.inputs[0] for l in refinable(plan.layers)} if _biases_from_the_pass(config) else set()
    return Collector(plan.tensors, site_inputs, probs, config.num_bins if config.needs_histograms else 0, moment_inputs)


def _smoothing_scales(plan: _Plan, collector: Collector, runner: CalibrationPass,
                      config: QuantConfig) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """SmoothQuant's s per site (LayerNorm name), and per smoothed tensor (the site's inputs)."""
    chan = collector.channel_absmax()
    alphas: dict[str, float] = {}
    if config.smoothquant_search and plan.sites:
        alphas = choose_alphas(runner, plan.gi, plan.sites, chan, config.weight_range)
    scales: dict[str, np.ndarray] = {}
    site_scale: dict[str, np.ndarray] = {}
    for site in plan.sites:
        x = np.max([chan[t] for t in site.inputs], axis=0)
        alpha = alphas.get(site.norm, float(config.smoothquant_alpha))
        scales[site.norm] = smoothquant.smoothing_scales(x, smoothquant.weight_input_absmax(plan.gi, site), alpha)
        site_scale.update({t: scales[site.norm] for t in site.inputs})
    return scales, site_scale


def _smoothed_absmax(collector: Collector, site_scale: dict[str, np.ndarray], renamed: dict[str, str]) -> dict[str, float]:
    """max |x| of every activation of the smoothed graph (by its names there)."""
    chan = collector.channel_absmax()
    amax = {renamed.get(t, t): v for t, v in collector.absmax().items()}
    for t, s in site_scale.items():
        amax[renamed.get(t, t)] = float(np.max(chan[t] / s)) if chan[t].size else 0.0
    return amax


def _histograms(collector: Collector, tensors: list[str], probs: set[str], amax: dict[str, float],
                site_scale: dict[str, np.ndarray], renamed: dict[str, str], config: QuantConfig) -> dict[str, np.ndarray] | None:
    """The histogram of |x| over [0, max |x|] of every activation but the Softmax outputs (histogram methods)."""
    if not config.needs_histograms:
        return None
    wanted = [t for t in tensors if t not in probs]
    found = per_tensor(lambda t: collector.histogram(t, amax[renamed.get(t, t)], config.num_bins, site_scale.get(t)), wanted)
    return {renamed.get(t, t): h for t, h in zip(wanted, found)}


def _thresholds(amax: dict[str, float], hists: dict[str, np.ndarray] | None, exact: set[str],
                config: QuantConfig) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """(every candidate method's threshold per tensor (methods auto and select), the thresholds):
    auto and select start from entropy's (already among the candidates)."""
    candidates: dict[str, dict[str, float]] = {}
    if config.method in ("auto", "select"):  # chosen from per tensor (auto) or per model (select)
        chosen = [t for t in sorted(amax) if t not in exact]
        candidates = dict(zip(chosen, per_tensor(lambda t: stats.candidate_thresholds(amax[t], hists[t]), chosen)))
    thresholds = {
        t: candidates[t]["entropy"] if t in candidates else
        stats.threshold("minmax" if t in exact else config.method, amax[t], hists.get(t) if hists else None, percentile=config.percentile)
        for t in sorted(amax)
    }
    return candidates, thresholds


def _channel_moments(st: _Statistics, collector: Collector, site_scale: dict[str, np.ndarray], renamed: dict[str, str],
                     config: QuantConfig) -> None:
    """The bias correction's channel means of x and Q(x), from the pass: for the thresholds, or for
    every candidate's (method select; its first candidate's thresholds are the thresholds)."""

    tensors = collector.moment_tensors
    variants = _variant_thresholds(st.thresholds, st.candidates) if config.method == "select" else {"": st.thresholds}
    jobs = [(c, t) for c in variants for t in tensors]
    found = per_tensor(lambda ct: collector.moments(ct[1], variants[ct[0]][renamed.get(ct[1], ct[1])], site_scale.get(ct[1])), jobs)
    by_variant: dict[str, Moments] = {c: {} for c in variants}
    for (c, t), m in zip(jobs, found):
        by_variant[c][renamed.get(t, t)] = m
    if config.method == "select":
        st.variant_moments = by_variant
        st.moments = st.variant_moments[stats.CANDIDATES[0]]
    else:
        st.moments = by_variant[""]


def _layers_with_statistics(st: _Statistics) -> tuple[QuantLayer, ...]:
    """The smoothed graph's layers, after checking every activation has a threshold."""
    layers_after = tuple(find_layers(GraphIndex(st.smoothed)))
    missing = [t for t in _activation_tensors(layers_after) if t not in st.thresholds]
    if missing:  # a bug, not a user error
        raise QuantizationError(f"no statistics for activation '{missing[0]}' ({len(missing)} missing)")
    return layers_after


# --------------------------------------------------------------------------- 5: refinement, candidates


def _refined(result: Calibration, st: _Statistics, cache: CalibrationCache, parts: dict[str, Any], config: QuantConfig,
             meta: dict[str, str], source: CalibrationSource, progress: bool) -> Calibration:
    """The calibration with its refinement (GPTQ weights, corrected biases, method auto's thresholds)."""
    if config.method == "auto" and not st.candidates:
        raise QuantizationError("method 'auto' found no candidate thresholds in the statistics (stale cache entry?)")
    refinement, refine_passes = _refinement(cache, parts, config, st.smoothed, meta, source, progress, st.smoothed,
                                            result.layers, st.thresholds, st.candidates, st.moments)
    out = replace(result, refinement=refinement, thresholds=dict(st.thresholds, **refinement.thresholds),
                  forward_passes=result.forward_passes + refine_passes)
    if refine_passes:
        out = replace(out, reused=False)
        out.timings["refinement"] = refinement.seconds
    return out


def _candidates(result: Calibration, st: _Statistics, cache: CalibrationCache, parts: dict[str, Any], config: QuantConfig,
                meta: dict[str, str], source: CalibrationSource, progress: bool) -> Calibration:
    """Method select: every candidate's thresholds, each with its own refinement."""
    if not st.candidates:
        raise QuantizationError("method 'select' found no candidate thresholds in the statistics (stale cache entry?)")
    variants: dict[str, Variant] = {}
    passes, reused = result.forward_passes, result.reused
    for c, th in _variant_thresholds(st.thresholds, st.candidates).items():
        ref = None
        if config.refine_params() is not None:
            ref, refine_passes = _refinement(cache, dict(parts, candidate=c), config, st.smoothed, meta, source, progress,
                                             st.smoothed, result.layers, th, {}, st.variant_moments.get(c))
            passes += refine_passes
            reused = reused and not refine_passes
        variants[c] = Variant(c, th, ref)
    return replace(result, variants=variants, forward_passes=passes, reused=reused)


# --------------------------------------------------------------------------- 6: method select's choice


def _selected(result: Calibration, cache: CalibrationCache, parts: dict[str, Any], config: QuantConfig,
              meta: dict[str, str], source: CalibrationSource, kept: Kept | None) -> Calibration:
    """The calibration with method select's chosen candidate's thresholds and the evidence."""
    selection, select_passes = _selection(cache, parts, config, result, meta, source, kept)
    out = result.with_variant(selection.chosen)
    out = replace(out, selection=selection, forward_passes=result.forward_passes + select_passes)
    if select_passes:
        out.timings["selection"] = selection.seconds
    return out


def _variant_thresholds(thresholds: dict[str, float], candidates: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Method select: every candidate's thresholds (tensors without candidates, the Softmax outputs and
    the image, keep their own: max |x|), in ``stats.CANDIDATES`` order."""
    return {c: {t: candidates[t][c] if t in candidates else v for t, v in thresholds.items()} for c in stats.CANDIDATES}


def _selection(cache: CalibrationCache, parts: dict[str, Any], config: QuantConfig, calibration: Calibration,
               meta: dict[str, str], source: CalibrationSource, kept: Kept | None) -> tuple[Selection, int]:
    """Method select's choice: from the cache, or by scoring every candidate at the model's output on
    the first calibration images (``kept`` by the pass, with the FP32 output on them). Returns
    (selection, forward passes run)."""
    large = is_large(calibration.model)
    samples = _select_samples(calibration.model)
    rule = [SELECT_MIN_T, SELECT_MIN_RATIO, SELECT_FIRST_LOOK, SELECT_CONTEND_RATIO, "log t"]
    select = {"samples": samples, "attention": config.quantize_attention, "weight_range": config.weight_range, "rule": rule}
    if config.float_small_gemms:  # another set of INT8 layers to score (only when on: older keys stay valid)
        select["small_gemms"] = True
    skey_parts = dict(parts, refine=config.refine_params(), select=select)
    skey = cache_key(skey_parts)
    store = CalibrationCache(cache.root, kind="selection")
    entry = store.load(skey)
    if entry is not None:
        try:
            found = Selection.from_dict(entry["meta"]["selection"], reused=True)
            if found.chosen in calibration.variants and all(s.name in calibration.variants for s in found.scores):
                return found, 0
        except (KeyError, TypeError, ValueError):
            pass
    passes = 0
    if kept is None:  # the statistics came from the cache: the pass's session on the first images only
        plan = _plan(_load_fp32(calibration.fp32_path), config)
        kept = Kept(samples, plan.prepared.graph.output[0].name)
        runner = CalibrationPass(plan.prepared, meta, source, False)
        runner.keep(kept, pass_outputs(plan.tensors, {t for s in plan.sites for t in s.inputs}))
        passes, plan, runner = runner.runs, None, None
    declared = None
    if SPEC_KEY in meta:
        try:
            declared = ModelSpec.from_json(meta[SPEC_KEY]).output_kind
        except Exception:
            declared = None
    settings = lean_settings(CALIBRATION_SESSION) if large else CALIBRATION_SESSION
    selection = choose(calibration, kept.input, kept.feeds, declared_kind=declared, settings=settings,
                       reference=np.concatenate(kept.reference))
    try:
        store.save(skey, {"parts": skey_parts, "selection": selection.to_dict()}, {})
    except OSError:
        pass
    return selection, passes + selection.runs


def _refinement(cache: CalibrationCache, parts: dict[str, Any], config: QuantConfig, prepared: ModelProto, meta: dict[str, str],
                source: CalibrationSource, progress: bool, smoothed: ModelProto, layers: tuple[QuantLayer, ...],
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
        runner = CalibrationPass(prepared, meta, source, progress)
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


def _store(cache: CalibrationCache, key: str, parts: dict[str, Any], summary: SourceSummary, st: _Statistics) -> str | None:
    """Write the statistics to the cache; None, or why they could not be written."""
    try:
        _save_entry(cache, key, parts, summary, st.thresholds, st.amax, st.scales, st.candidates)
    except OSError as err:
        return f"could not write the calibration cache in {cache.root}: {err.strerror or err}"
    return None


def _save_entry(cache: CalibrationCache, key: str, parts: dict[str, Any], summary: SourceSummary,
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


def _restore(entry: dict[str, Any], plan: _Plan) -> _Statistics | None:
    """The statistics of a cache entry, SmoothQuant applied; None when the entry does not fit the graph."""
    got = _read_entry(entry, plan.sites, plan.tensors)
    if got is None:
        return None
    thresholds, amax, scales, candidates = got
    smoothed, _ = smoothquant.apply(plan.prepared, plan.sites, scales)
    return _Statistics(thresholds, amax, scales, candidates, smoothed, reused=True)


def _read_entry(entry: dict[str, Any], sites: list[SmoothSite], tensors: list[str]):
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


def quantize(
    fp32_onnx_path: str | Path,
    source: CalibrationSource,
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
