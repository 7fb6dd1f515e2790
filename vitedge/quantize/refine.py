"""Data-driven refinement of the INT8 Linear layers: GPTQ rounding and bias correction.

Both are layer-local, so one refinement holds whatever subset of layers ``build_qdq`` later
quantizes (a budget search returns layers to float without recalibrating):

* **GPTQ** (``QuantConfig.weight_rounding="gptq"``): the weights of every MatMul/Gemm layer
  rounded by ``vitedge.quantize.gptq`` with the Hessian ``X^T X`` of its FP32 calibration
  inputs, instead of to nearest.
* **Bias correction** (``QuantConfig.bias_correction``): the INT8 layer computes
  ``Q(x) W_q`` where the float one computes ``x W``; the mean of the difference over the
  calibration data, ``E[Q(x)] W_q - E[x] W`` per output channel, is subtracted from the
  layer's bias (a Gemm's C, or the constant of the Add right after a MatMul). ``Q`` is the
  activation's own Q/DQ (its calibrated threshold), ``W_q`` the weights as built (after
  GPTQ when that is on). Layers without a bias are left as they are.

Bias correction alone needs only the channel means of ``x`` and ``Q(x)`` per distinct
layer input: ``correct_biases`` takes them from the calibration pass's per-channel
histograms (vitedge.quantize.histogram), no pass of its own. With GPTQ or method ``auto``,
``refine`` makes one extra pass over the calibration data (more when the Hessians of a
large model would not fit ``HESSIAN_BUDGET_BYTES`` at once) collecting those means, the
output errors of each candidate threshold and, for GPTQ, ``X^T X``. Convolutions (the patch embedding of
timm/torchvision ViTs) are not refined.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.quantize.gptq import gptq_quantize
from vitedge.quantize.graph import GraphIndex, QuantLayer, attr
from vitedge.quantize.stats import safe_scale
from vitedge.quantize.weight_range import quantize_weight

if TYPE_CHECKING:
    from onnx import ModelProto
    from vitedge.quantize.collect import CalibrationPass

HESSIAN_BUDGET_BYTES = 512 * 2**20  # float64 Hessians accumulated in one pass


@dataclass(frozen=True)
class BiasFix:
    """A corrected bias: ``node.input[index]`` becomes ``values``."""

    node: str
    index: int
    values: np.ndarray


@dataclass(frozen=True)
class Refinement:
    """What the refinement pass decided, keyed by layer (node) name."""

    weights: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # layer -> (int8 q in the weight's layout, scale)
    biases: dict[str, BiasFix] = field(default_factory=dict)
    thresholds: dict[str, float] = field(default_factory=dict)  # activation -> chosen threshold (method "auto")
    chosen: dict[str, str] = field(default_factory=dict)  # activation -> the candidate chosen (method "auto")
    forward_passes: int = 0
    seconds: float = 0.0

    def to_arrays(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(JSON-able index, arrays) for the calibration cache."""
        arrays: dict[str, np.ndarray] = {}
        index: dict[str, Any] = {"weights": [], "biases": [], "thresholds": sorted(self.thresholds),
                                 "chosen": [self.chosen.get(t, "") for t in sorted(self.thresholds)]}
        arrays["thresholds"] = np.array([self.thresholds[t] for t in sorted(self.thresholds)], dtype=np.float64)
        for k, (name, (q, s)) in enumerate(sorted(self.weights.items())):
            index["weights"].append(name)
            arrays[f"w_{k}"], arrays[f"s_{k}"] = q, s
        for k, (name, fix) in enumerate(sorted(self.biases.items())):
            index["biases"].append([name, fix.node, fix.index])
            arrays[f"b_{k}"] = fix.values
        return index, arrays

    @staticmethod
    def from_arrays(index: dict[str, Any], arrays: dict[str, np.ndarray]) -> Refinement:
        weights = {name: (np.asarray(arrays[f"w_{k}"], dtype=np.int8), np.asarray(arrays[f"s_{k}"], dtype=np.float32))
                   for k, name in enumerate(index["weights"])}
        biases = {name: BiasFix(str(node), int(i), np.asarray(arrays[f"b_{k}"], dtype=np.float32))
                  for k, (name, node, i) in enumerate(index["biases"])}
        names = list(index["thresholds"])
        thresholds = {t: float(v) for t, v in zip(names, arrays["thresholds"])}
        chosen = {t: str(c) for t, c in zip(names, index["chosen"]) if c}
        return Refinement(weights=weights, biases=biases, thresholds=thresholds, chosen=chosen)


def refinable(layers: tuple[QuantLayer, ...] | list[QuantLayer]) -> list[QuantLayer]:
    """Layers with a 2-D constant weight (MatMul / Gemm)."""
    return [l for l in layers if l.weight is not None and l.op_type in ("MatMul", "Gemm")]


def _weight_kn(gi: GraphIndex, layer: QuantLayer) -> np.ndarray:
    """The layer's weight as [K inputs, N outputs]."""
    w = np.asarray(gi.value(layer.weight), dtype=np.float32)
    return w.T if layer.weight_axis == 0 else w


def find_bias(gi: GraphIndex, layer: QuantLayer) -> tuple[str, int] | None:
    """(node name, input index) of the layer's bias, or None when it has none."""
    node = gi.nodes_by_name[layer.name]
    if node.op_type == "Gemm":
        if len(node.input) > 2 and node.input[2] and gi.is_const(node.input[2]) and float(attr(node, "beta", 1.0)) == 1.0:
            return node.name, 2
        return None
    consumers = gi.consumers.get(node.output[0], [])
    if len(consumers) != 1 or node.output[0] in gi.graph_outputs:
        return None
    add, idx = consumers[0]
    if add.op_type != "Add" or len(add.input) != 2:
        return None
    other = 1 - idx
    if not gi.is_const(add.input[other]) or add.input[other] not in gi.inits:
        return None
    if np.asarray(gi.value(add.input[other])).size != layer.channels:
        return None
    if len(gi.consumers.get(add.input[other], [])) != 1:  # shared constant: leave it
        return None
    return add.name, other


def fake_quant(x: np.ndarray, threshold: float) -> np.ndarray:
    """What a QuantizeLinear -> DequantizeLinear pair with scale ``threshold / 127`` outputs."""
    s = safe_scale(threshold)
    return np.clip(np.rint(x / s), -128, 127) * s


def refine(runner: CalibrationPass, model: ModelProto, layers: tuple[QuantLayer, ...], thresholds: dict[str, float], *, gptq: bool,
           bias_correction: bool, weight_range: str, candidates: dict[str, dict[str, float]] | None = None) -> Refinement:
    """Run the refinement pass(es) over ``runner``'s calibration data on ``model`` (the
    smoothed FP32 graph) and decide weights and biases."""
    start = time.perf_counter()
    gi = GraphIndex(model)
    chosen = refinable(layers)
    runs_before = runner.runs
    tensors = sorted({l.inputs[0] for l in chosen})
    width = {t: next(_weight_kn(gi, l).shape[0] for l in chosen if l.inputs[0] == t) for t in tensors}
    groups = _groups(tensors, width, gptq)
    # per tensor, the threshold options: the calibrated one, or the candidates of method "auto"
    options = {t: dict(candidates[t]) if candidates and t in candidates else {"calibrated": thresholds[t]} for t in tensors}
    w_cat = {t: np.concatenate([_weight_kn(gi, l) for l in chosen if l.inputs[0] == t], axis=1) for t in tensors if len(options[t]) > 1}
    errors: dict[str, dict[str, float]] = {t: {c: 0.0 for c in options[t]} for t in w_cat}
    sums: dict[str, np.ndarray] = {}
    qsums: dict[str, dict[str, np.ndarray]] = {t: {} for t in tensors}
    rows: dict[str, int] = {}
    hess: dict[str, np.ndarray] = {}
    runner.model = model
    for group in groups:
        for values in runner._run(group, "refining: layer inputs"):
            for t in group:
                x = np.asarray(values[t], dtype=np.float32).reshape(-1, width[t])
                rows[t] = rows.get(t, 0) + x.shape[0]
                for c, th in options[t].items():
                    if not bias_correction and t not in w_cat:
                        break
                    fq = fake_quant(x, th)
                    if bias_correction:
                        qsums[t][c] = qsums[t].get(c, 0.0) + fq.sum(axis=0, dtype=np.float64)
                    if t in w_cat:  # output error of the consuming layers with this threshold
                        errors[t][c] += float(np.sum(np.square((fq - x) @ w_cat[t]), dtype=np.float64))
                if bias_correction:
                    sums[t] = sums.get(t, 0.0) + x.sum(axis=0, dtype=np.float64)
                if gptq:
                    hess[t] = hess.get(t, 0.0) + (x.T @ x).astype(np.float64)
    picked = {t: min(errors[t], key=lambda c: (errors[t][c], c)) if t in errors else next(iter(options[t])) for t in tensors}
    weights: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    biases: dict[str, BiasFix] = {}
    for layer in chosen:
        t = layer.inputs[0]
        w = _weight_kn(gi, layer)
        if gptq and rows.get(t):
            q_kn, scale = gptq_quantize_layer(w, hess[t] / rows[t], weight_range)
            weights[layer.name] = (q_kn.T.copy() if layer.weight_axis == 0 else q_kn, scale)
        if bias_correction and rows.get(t):
            fix = _bias_fix(gi, layer, w, weights.get(layer.name), sums[t] / rows[t], qsums[t][picked[t]] / rows[t], weight_range)
            if fix is not None:
                biases[layer.name] = fix
    auto = {t: float(options[t][picked[t]]) for t in tensors if candidates and t in candidates}
    return Refinement(weights=weights, biases=biases, thresholds=auto, chosen={t: picked[t] for t in auto}, forward_passes=runner.runs - runs_before, seconds=time.perf_counter() - start)


def correct_biases(model: ModelProto, layers: tuple[QuantLayer, ...], moments: dict[str, tuple[np.ndarray, np.ndarray]],
                   weight_range: str) -> Refinement:
    """Bias correction from channel means measured elsewhere (the calibration pass):
    ``moments[t] = (E[x], E[Q(x)])`` per input channel of activation ``t``, in ``model``'s
    terms (the smoothed graph). No pass over the data."""
    start = time.perf_counter()
    gi = GraphIndex(model)
    biases: dict[str, BiasFix] = {}
    for layer in refinable(layers):
        t = layer.inputs[0]
        if t not in moments:
            continue
        w = _weight_kn(gi, layer)
        mean_x, mean_qx = moments[t]
        fix = _bias_fix(gi, layer, w, None, np.asarray(mean_x, dtype=np.float64), np.asarray(mean_qx, dtype=np.float64), weight_range)
        if fix is not None:
            biases[layer.name] = fix
    return Refinement(biases=biases, seconds=time.perf_counter() - start)


def _bias_fix(gi: GraphIndex, layer: QuantLayer, w: np.ndarray, rounded: tuple[np.ndarray, np.ndarray] | None,
              mean_x: np.ndarray, mean_qx: np.ndarray, weight_range: str) -> BiasFix | None:
    """The layer's corrected bias: ``E[Q(x)] W_q - E[x] W`` subtracted; None when it has no bias."""
    where = find_bias(gi, layer)
    if where is None:
        return None
    if rounded is not None:
        q_kn = rounded[0].T if layer.weight_axis == 0 else rounded[0]
        scale = rounded[1]
    else:
        q_kn, scale = quantize_weight(w, 1, "MatMul", weight_range)
    wq = q_kn.astype(np.float64) * scale.astype(np.float64)[None, :]
    shift = mean_qx @ wq - mean_x @ w.astype(np.float64)
    node = gi.nodes_by_name[where[0]]
    bias = np.asarray(gi.value(node.input[where[1]]), dtype=np.float64)
    return BiasFix(where[0], where[1], (bias - shift.reshape(bias.shape)).astype(np.float32))


def gptq_quantize_layer(w_kn: np.ndarray, hessian: np.ndarray, weight_range: str) -> tuple[np.ndarray, np.ndarray]:

    return gptq_quantize(w_kn, hessian, weight_range)


def _groups(tensors: list[str], width: dict[str, int], gptq: bool) -> list[list[str]]:
    """Tensors per pass so that the Hessians of one pass fit the budget."""
    if not gptq:
        return [tensors] if tensors else []
    out: list[list[str]] = []
    used = 0
    for t in tensors:
        need = 8 * width[t] ** 2
        if out and used + need <= HESSIAN_BUDGET_BYTES:
            out[-1].append(t)
            used += need
        else:
            out.append([t])
            used = need
    return out
