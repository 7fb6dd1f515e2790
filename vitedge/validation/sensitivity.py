"""Per-layer sensitivity: how much output error each quantized layer causes on its own.

For every layer the Q/DQ graph runs in INT8, build the graph in which *that layer alone*
is quantized (its activation Q/DQ and its INT8 weight kept; every other layer back in
float) and measure its outputs against the FP32 reference on a small subset of inputs.
Ranking the layers by that error tells which ones to keep in float first (issue 8's
accuracy-budget search calls ``layer_sensitivity`` for that).

How the float graph is recovered from the two graphs a bundle holds (its FP32 graph
``artifacts.fp32_onnx``, ``reference.fp32.onnx``, and ``model.int8.onnx``), without calibration data.
The FP32 graph is the exported one, or in an onnx bundle that graph with the INT8 graph's float
rewrites (q/k/v merged into one GEMM, attention cores fused): the rewrites keep the node names of
the layers the quantizer found, so either gives the same layers and the same figures:

* layers and their kinds come from the quantizer's own discovery
  (``vitedge.quantize.graph.prepare`` + ``find_layers``) run on the FP32 graph; node names
  are shared by both graphs (the quantizer edits a prepared copy of the FP32 graph);
* a layer is INT8 when the Q/DQ graph feeds it through DequantizeLinear; an activation
  Q->DQ pair is undone by reading the QuantizeLinear's float input;
* an INT8 weight is replaced by the FP32 weight of the same node. SmoothQuant may have
  rescaled the weight's input channels (``diag(s) W``, with the matching ``1/s`` folded
  into the LayerNorm before it, which the Q/DQ graph keeps in float), so ``s`` is
  recovered per input channel by least squares between the dequantized INT8 weight and
  the FP32 weight (and taken as exactly 1 when every channel is within 2% of 1).

The all-float graph so rebuilt (the "float twin") is run too: its distance to FP32 is the
noise floor of the method and is reported as ``baseline``. Everything runs on ONNX
Runtime's CPU provider whatever the bundle's target backend is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.backends.onnxruntime.backend import unfold_int8_rewrites
from vitedge.datasources.base import CalibrationSource
from vitedge.core.errors import BundleError, QuantizationError
from vitedge.onnxkit.metadata import FLOAT_NCHW, INPUT_FORMAT_KEY, SPEC_KEY, UINT8_NHWC_RGB, get_metadata
from vitedge.onnxkit.session import SessionSettings, ort_session
from vitedge.onnxkit.structure import NameScope, cleanup, graph_inputs
from vitedge.quantize.graph import GraphIndex, QuantLayer, attr, find_layers, prepare
from vitedge.quantize.qdq import METADATA_KEY
from vitedge.files.safefile import parse_json
from vitedge.bundle.spec import ModelSpec
from vitedge.validation.defaults import DEFAULT_SENSITIVITY_SAMPLES
from vitedge.validation.inputs import to_uint8_frames

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto
    from vitedge.bundle.spec import Preprocess

RUNTIME = "onnxruntime (CPUExecutionProvider)"
_UNSMOOTHED_TOL = 0.02  # |s - 1| below this on every channel: the weight was not smoothed


@dataclass(frozen=True)
class LayerSensitivity:
    """The output error with one layer quantized and every other layer in float."""

    name: str  # ONNX node name
    kind: str  # linear | patch_embed | head | conv | attention_matmul (see vitedge.quantize.graph)
    op_type: str
    metrics: dict[str, float]
    rank: int = 0  # 1 = most sensitive

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "name": self.name, "kind": self.kind, "op_type": self.op_type, **self.metrics}


@dataclass
class SensitivityResult:
    """Layers ranked by ``metric`` (largest error first)."""

    layers: list[LayerSensitivity]
    metric: str  # the key of LayerSensitivity.metrics the ranking uses
    output_kind: str  # logits | embedding
    samples: int
    baseline: dict[str, float]  # float twin vs FP32: the method's noise floor
    full: dict[str, float]  # the whole Q/DQ graph vs FP32, for scale
    kept_float: list[str] = field(default_factory=list)  # layers the Q/DQ graph already keeps in float
    seconds: float = 0.0
    runtime: str = RUNTIME
    notes: list[str] = field(default_factory=list)

    def ranked(self) -> list[tuple[str, str, dict[str, float]]]:
        """(layer name, kind, metrics), most sensitive first: the form a budget search wants."""
        return [(l.name, l.kind, dict(l.metrics)) for l in self.layers]

    def to_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "method": "one layer quantized at a time, every other layer in float; outputs vs FP32",
            "samples": self.samples,
            "output_kind": self.output_kind,
            "metric": self.metric,
            "baseline": self.baseline,
            "full": self.full,
            "kept_float": list(self.kept_float),
            "seconds": self.seconds,
            "notes": list(self.notes),
            "layers": [l.to_dict() for l in self.layers],
        }


# --------------------------------------------------------------------------- metrics


def _softmax(x: np.ndarray) -> np.ndarray:
    z = x - x.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def output_error(ref: np.ndarray, got: np.ndarray, output_kind: str = "logits") -> dict[str, float]:
    """Error of ``got`` against ``ref`` (N x C): the metrics the ranking may use."""
    ref = ref.reshape(ref.shape[0], -1).astype(np.float64)
    got = got.reshape(got.shape[0], -1).astype(np.float64)
    cos = np.sum(ref * got, axis=1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1) + 1e-12)
    out = {"mse": float(np.mean((ref - got) ** 2)), "cosine": float(cos.mean()), "one_minus_cosine": float(1.0 - cos.mean())}
    if output_kind != "embedding":
        p, q = _softmax(ref), _softmax(got)
        out["top1_flip_rate"] = float(np.mean(ref.argmax(1) != got.argmax(1)))
        out["kl"] = float(np.mean(np.sum(p * (np.log(p + 1e-12) - np.log(q + 1e-12)), axis=1)))
    return out


def rank_metric(output_kind: str) -> str:
    """KL of the softmax for classifiers (continuous, so it ranks even when no top-1 flips on a
    small subset); 1 - cosine for embeddings."""
    return "one_minus_cosine" if output_kind == "embedding" else "kl"


# --------------------------------------------------------------------------- graphs


def _load(model: ModelProto) -> Any:
    import onnx

    if isinstance(model, (str, Path)):
        path = Path(model)
        if not path.is_file():
            raise BundleError(f"{path} does not exist")
        try:
            return onnx.load(str(path))
        except Exception as err:
            raise BundleError(f"{path} is not a readable ONNX graph ({type(err).__name__})") from err
    return model


@dataclass
class _Prepared:
    qdq: Any  # Q/DQ ModelProto with the float twin's weights added as initializers
    quantized: list[Any]  # QuantLayer, in graph order
    kept_float: list[str]
    twin_weight: dict[str, str]  # layer name -> float weight initializer for the twin
    notes: list[str]


def _prepare(fp32: str | Path | ModelProto, qdq: str | Path | ModelProto, recover_smoothing: bool = True) -> _Prepared:
    import onnx
    from onnx import numpy_helper


    fp32_model = prepare(_load(fp32))
    ref = GraphIndex(fp32_model)
    layers = {l.name: l for l in find_layers(ref)}
    m = onnx.ModelProto()
    m.CopyFrom(_load(qdq))
    unfold_int8_rewrites(m)  # the onnx target ships its INT8 GEMMs and patch embedding as MatMulIntegerToFloat
    gi = GraphIndex(m)
    names = NameScope(m)
    notes: list[str] = []
    quantized, kept = [], []
    for name, layer in layers.items():
        node = gi.nodes_by_name.get(name)
        if node is None:
            notes.append(f"layer {name} of the FP32 graph is not in the Q/DQ graph")
            continue
        fed = [gi.producer.get(i) for i in node.input[:2] if i]
        (quantized if any(p is not None and p.op_type == "DequantizeLinear" for p in fed) else kept).append(layer)
    quantized += _fused_away(gi, set(layers))
    if not quantized:
        raise QuantizationError("the Q/DQ graph has no INT8 layer that matches a layer of the FP32 graph (by node name): "
                                "were they made from the same FP32 export?")
    twin_weight: dict[str, str] = {}
    smoothed = 0
    for layer in quantized:
        if layer.weight is None:
            continue
        node = gi.nodes_by_name[layer.name]
        dq = gi.producer.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        w_dq = _dequantize(gi, dq)
        w_ref = np.asarray(ref.value(layer.weight), dtype=np.float64)
        if w_ref.shape != w_dq.shape:
            notes.append(f"{layer.name}: FP32 and INT8 weights differ in shape; its float twin uses the dequantized weight")
            w = w_dq
        else:
            s = _input_channel_scale(w_ref, w_dq, layer) if recover_smoothing else None
            if s is not None:
                smoothed += 1
            w = w_ref if s is None else w_ref * s
        init = names(f"{layer.name}/sensitivity/float_weight")
        m.graph.initializer.append(numpy_helper.from_array(w.astype(np.float32), init))
        twin_weight[layer.name] = init
    if smoothed:
        notes.append(f"SmoothQuant input-channel scales recovered for {smoothed} weight(s)")
    return _Prepared(m, quantized, [l.name for l in kept], twin_weight, notes)


def _fused_away(gi: GraphIndex, found: set[str]) -> list[QuantLayer]:
    """INT8 attention matmuls of the Q/DQ graph that the FP32 graph holds inside a fused attention core: the onnx
    bundle's FP32 graph fuses every float core, and with quantized attention matmuls the INT8 graph's stay unfused.
    A MatMul both of whose inputs are activations through QuantizeLinear -> DequantizeLinear; no weight to restore."""
    def activation_qdq(name: str) -> bool:
        dq = gi.producer.get(name)
        q = gi.producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        return q is not None and q.op_type == "QuantizeLinear"

    return [QuantLayer(node.name, "attention_matmul", node.op_type, tuple(node.input[:2]))
            for node in gi.model.graph.node
            if node.op_type == "MatMul" and node.name and node.name not in found and len(node.input) == 2
            and all(activation_qdq(i) for i in node.input)]


def _dequantize(gi: GraphIndex, dq: NodeProto) -> np.ndarray:

    q = np.asarray(gi.value(dq.input[0]), dtype=np.float64)
    scale = np.asarray(gi.value(dq.input[1]), dtype=np.float64)
    zero = np.asarray(gi.value(dq.input[2]), dtype=np.float64) if len(dq.input) > 2 and dq.input[2] else np.zeros_like(scale)
    if scale.ndim == 1 and scale.size > 1:
        shape = [1] * q.ndim
        shape[int(attr(dq, "axis", 1)) % q.ndim] = -1
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return (q - zero) * scale


def _input_channel_scale(w_ref: np.ndarray, w_dq: np.ndarray, layer: QuantLayer) -> np.ndarray | None:
    """Per-input-channel s with w_dq ~= s * w_ref (least squares), shaped to broadcast; None if ~1."""
    if w_ref.ndim == 2:
        in_axis = 1 - int(layer.weight_axis if layer.weight_axis is not None else 1)
    elif w_ref.ndim >= 3:
        in_axis = 1  # Conv [out, in, kh, kw]
    else:
        return None
    other = tuple(i for i in range(w_ref.ndim) if i != in_axis)
    num = np.sum(w_dq * w_ref, axis=other)
    den = np.sum(w_ref * w_ref, axis=other)
    s = np.where(den > 0, num / np.where(den > 0, den, 1.0), 1.0)
    if np.all(np.abs(s - 1.0) < _UNSMOOTHED_TOL):
        return None
    shape = [1] * w_ref.ndim
    shape[in_axis] = -1
    return s.reshape(shape)


def _variant(prep: _Prepared, keep: set[str]) -> Any:
    """The Q/DQ graph with every INT8 layer but ``keep`` returned to float, serialized."""
    import onnx


    m = onnx.ModelProto()
    m.CopyFrom(prep.qdq)
    gi = GraphIndex(m)
    for layer in prep.quantized:
        if layer.name in keep:
            continue
        node = gi.nodes_by_name[layer.name]
        for idx in range(min(2, len(node.input))):
            dq = gi.producer.get(node.input[idx])
            if dq is None or dq.op_type != "DequantizeLinear":
                continue
            q = gi.producer.get(dq.input[0])
            if q is not None and q.op_type == "QuantizeLinear":
                node.input[idx] = q.input[0]
            elif idx == 1 and layer.name in prep.twin_weight:
                node.input[idx] = prep.twin_weight[layer.name]
    cleanup(m)
    return m  # a ModelProto: ort_session takes one past 2 GB through external data


# --------------------------------------------------------------------------- running


def _input_feed(model: ModelProto, inputs: np.ndarray, preprocess: Preprocess) -> tuple[str, np.ndarray]:

    meta = get_metadata(model)
    name = graph_inputs(model)[0].name
    if meta.get(INPUT_FORMAT_KEY, FLOAT_NCHW) != UINT8_NHWC_RGB:
        return name, np.ascontiguousarray(inputs, dtype=np.float32)

    if preprocess is None:

        preprocess = ModelSpec.from_json(meta[SPEC_KEY]).preprocess
    return name, to_uint8_frames(inputs, preprocess)


def _run(model: ModelProto, name: str, feed: np.ndarray, batch: int, threads: int | None) -> np.ndarray:

    sess = ort_session(model, SessionSettings(threads=threads, optimization="disabled"))  # reference Q/DQ semantics, quick to open
    outs = [np.asarray(sess.run(None, {name: feed[i : i + batch]})[0], dtype=np.float32) for i in range(0, len(feed), batch)]
    return np.concatenate(outs)


def layer_sensitivity(
    fp32: str | Path | ModelProto,
    qdq: str | Path | ModelProto,
    inputs: np.ndarray,
    *,
    output_kind: str = "logits",
    layers: Iterable[str] | None = None,
    preprocess: Preprocess = None,
    batch_size: int = 16,
    threads: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    recover_smoothing: bool = True,
) -> SensitivityResult:
    """Rank the INT8 layers of ``qdq`` by the output error each causes alone.

    fp32, qdq     the FP32 graph and the Q/DQ graph made from it (paths or ModelProtos; the
                  FP32 graph may also be the quantizer's smoothed copy, ``Calibration.model``)
    inputs        model-ready float32 NCHW batch (e.g. 64 validation images); converted to
                  uint8 frames when the graphs take them (baked preprocessing)
    output_kind   "logits" (ranked by softmax KL) or "embedding" (ranked by 1 - cosine)
    layers        restrict to these node names (default: every INT8 layer)
    recover_smoothing  False when ``fp32`` is exactly the graph the Q/DQ pairs went into
                  (``Calibration.model``): its weights are the float twin's as they are, with no
                  SmoothQuant scale to recover. (The least-squares recovery mistakes an input
                  channel whose INT8 weights rounded to zero -- tiny weights behind an activation
                  outlier -- for a smoothed one and would zero it in the twin.)

    Returns a SensitivityResult; ``.ranked()`` gives (name, kind, metrics), worst first.
    """
    start = time.perf_counter()
    inputs = np.asarray(inputs)
    if inputs.ndim != 4 or len(inputs) == 0:
        raise QuantizationError(f"sensitivity needs a non-empty NCHW batch of inputs, got shape {inputs.shape}")
    fp32_model, qdq_model = _load(fp32), _load(qdq)
    prep = _prepare(fp32_model, qdq_model, recover_smoothing)
    chosen = prep.quantized
    if layers is not None:
        wanted = set(layers)
        unknown = wanted - {l.name for l in chosen}
        if unknown:
            raise QuantizationError(f"not an INT8 layer of the Q/DQ graph: {sorted(unknown)[0]}")
        chosen = [l for l in chosen if l.name in wanted]
    name, feed = _input_feed(qdq_model, inputs, preprocess)
    ref_name, ref_feed = _input_feed(fp32_model, inputs, preprocess)
    ref = _run(fp32_model, ref_name, ref_feed, batch_size, threads)
    twin = _run(_variant(prep, set()), name, feed, batch_size, threads)
    full = _run(qdq_model, name, feed, batch_size, threads)
    rows: list[LayerSensitivity] = []
    for k, layer in enumerate(chosen):
        if progress is not None:
            progress(k, len(chosen), layer.name)
        got = _run(_variant(prep, {layer.name}), name, feed, batch_size, threads)
        rows.append(LayerSensitivity(layer.name, layer.kind, layer.op_type, output_error(ref, got, output_kind)))
    metric = rank_metric(output_kind)
    rows.sort(key=lambda r: -r.metrics[metric])
    rows = [LayerSensitivity(r.name, r.kind, r.op_type, r.metrics, rank=i + 1) for i, r in enumerate(rows)]
    baseline = output_error(ref, twin, output_kind)
    notes = list(prep.notes)
    if rows and baseline[metric] > 0.5 * max(rows[0].metrics[metric], 1e-12):
        notes.append("the float twin is not close to FP32 (baseline error comparable to the layers'): treat the ranking with care")
    return SensitivityResult(
        layers=rows, metric=metric, output_kind=output_kind, samples=int(len(inputs)), baseline=baseline,
        full=output_error(ref, full, output_kind), kept_float=prep.kept_float,
        seconds=time.perf_counter() - start, notes=notes,
    )


def quantization_metadata(qdq: str | Path | ModelProto) -> dict[str, Any]:
    """The ``vitedge.quantization`` metadata the quantizer writes into the Q/DQ graph ({} if none)."""

    raw = get_metadata(_load(qdq)).get(METADATA_KEY)
    try:
        return parse_json(raw, "the graph's quantization metadata") if raw else {}
    except ValueError:
        return {}


def first_inputs(source: CalibrationSource, count: int = DEFAULT_SENSITIVITY_SAMPLES) -> np.ndarray:
    """The first ``count`` model-ready inputs of a calibration source (its fixed order)."""
    parts: list[np.ndarray] = []
    total = 0
    for batch in source.batches(min(count, 64)):
        parts.append(batch.images)
        total += len(batch.images)
        if total >= count:
            break
    return np.concatenate(parts)[:count]

