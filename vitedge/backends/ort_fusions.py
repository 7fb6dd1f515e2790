"""ONNX Runtime-only rewrites of the float work around the INT8 GEMMs (issue 28 item 1).

The shared Q/DQ graph feeds OpenVINO and TensorRT too, so these run only in the onnx
target's artifact step, after ``fuse_attention``, and only with ``fuse_attention = true``
(they write ``com.microsoft`` operators, like MultiHeadAttention).

* **q/k/v bias -> MultiHeadAttention's bias input.** ``Add(bias, qkv) -> Split -> MHA``
  becomes ``Split -> MHA(q, k, v, bias)``: the kernel adds the bias while it lays out q, k
  and v per head, one pass over the tensor fewer.

Measured and not adopted: residual Add (+ projection bias) + LayerNormalization ->
``com.microsoft.SkipLayerNormalization`` (keeping the sum as its 4th output for the next
residual, which is why ONNX Runtime's own SkipLayerNormFusion fuses only the last block:
its ``CheckFirstAdd`` wants the sum to have one reader). Exact, no accuracy change on the
corpus, but ONNX Runtime 1.32's CPU SkipLayerNormalization kernel took ~2.5x the time of the
Adds and LayerNorms it replaced on ViT-S/16 (docs/cpu-targets.md, results/ort_int8_avx2_profile.md).

Same arithmetic, reordered float additions only. Every rewrite is checked by running both
graphs on a random input (ONNX Runtime, no optimisation) with their activation Q/DQ pairs
bypassed and comparing every graph output; on any mismatch the graph is left as it was,
with the reason recorded. The INT8 graph's outputs move by what a float32 rounding flip of
a quantized activation moves them (none for this rewrite, which is exact on the twin).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vitedge.onnxutil import SessionSettings, cleanup, node_index, ort_session, require_opset_import

MS_DOMAIN = "com.microsoft"
# Outputs of the float twins (see _float_twin) must agree to this fraction of their largest
# magnitude (reordered float32 sums differ by ~1e-6 of it; a wrong rewrite by order 1).
REL_TOL = 1e-4


@dataclass(frozen=True)
class FloatFusion:
    """What ``fuse_float_ops`` did."""

    qkv_biases: int = 0  # q/k/v bias Adds folded into MultiHeadAttention
    skipped: tuple[str, ...] = field(default=())

    def one_line(self) -> str:
        line = f"float fusion: {self.qkv_biases} q/k/v biases into MultiHeadAttention"
        return line + (f" (left as is: {self.skipped[0]})" if self.skipped else "")

    def to_dict(self) -> dict[str, Any]:
        return {"qkv_biases": self.qkv_biases, "skipped": list(self.skipped)}


class _Shapes:
    """Static ranks and last dimensions from ONNX shape inference, plus constant 1-D tensors."""

    def __init__(self, model: Any):
        from onnx import numpy_helper, shape_inference

        self.rank: dict[str, int] = {}
        self.last: dict[str, int | None] = {}
        try:
            inferred = shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 - without shapes nothing is fused
            inferred = model
        g = inferred.graph
        for vi in [*g.value_info, *g.input, *g.output]:
            tt = vi.type.tensor_type
            if tt.HasField("shape"):
                dims = tt.shape.dim
                self.rank[vi.name] = len(dims)
                self.last[vi.name] = dims[-1].dim_value if len(dims) and dims[-1].HasField("dim_value") else None
        self.consts: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        for n in model.graph.node:  # the exporter shares equal initializers (e.g. all-zero biases) through Identity
            if n.op_type == "Identity" and n.input[0] in self.consts:
                self.consts[n.output[0]] = self.consts[n.input[0]]

    def vector(self, tensor: str) -> np.ndarray | None:
        v = self.consts.get(tensor)
        return v if v is not None and v.ndim == 1 and v.dtype == np.float32 else None


def _bias_add(index: Any, shapes: _Shapes, tensor: str, width: int | None) -> tuple[Any, str, str] | None:
    """(the Add, its data input, its bias) when ``tensor`` is ``x + b`` with b a 1-D constant of ``width``, read once."""
    add = index.producer.get(tensor)
    if add is None or add.op_type != "Add" or len(index.readers(tensor)) != 1:
        return None
    for data, bias in ((add.input[0], add.input[1]), (add.input[1], add.input[0])):
        v = shapes.vector(bias)
        if v is not None and width is not None and v.shape[0] == width and shapes.rank.get(data) == 3:
            return add, data, bias
    return None


def _qkv_biases(model: Any, outputs: set[str]) -> list[tuple[Any, Any, Any, str, str]]:
    """(bias Add, Split, MHA, data tensor, bias) for every MultiHeadAttention fed by Split(x + b) with no bias yet."""
    g = model.graph
    index, shapes = node_index(g.node), _Shapes(model)
    found = []
    for mha in [n for n in g.node if n.op_type == "MultiHeadAttention" and n.domain == MS_DOMAIN]:
        if len(mha.input) > 3 and mha.input[3] or len(mha.input) < 3:
            continue
        split = index.producer.get(mha.input[0])
        if split is None or split.op_type != "Split" or list(split.output) != list(mha.input[:3]):
            continue
        if any(len(index.readers(o)) != 1 or o in outputs for o in split.output):
            continue
        width = shapes.last.get(split.input[0])
        hit = _bias_add(index, shapes, split.input[0], width)
        if hit is None or hit[0].output[0] in outputs:
            continue
        found.append((hit[0], split, mha, hit[1], hit[2]))
    return found


def _float_twin(model: Any) -> Any:
    """A copy with every activation QuantizeLinear -> DequantizeLinear pair bypassed.

    Probing the INT8 graph itself would compare quantization round-offs: a reordered float
    sum moves a value across a rounding boundary and the flip is amplified downstream. The
    float twin shows whether the rewrite computes the same function, to float32 precision.
    """
    import onnx

    twin = onnx.ModelProto()
    twin.CopyFrom(model)
    g = twin.graph
    producer = node_index(g.node).producer
    alias = {dq.output[0]: producer[dq.input[0]].input[0] for dq in g.node
             if dq.op_type == "DequantizeLinear" and dq.input[0] in producer and producer[dq.input[0]].op_type == "QuantizeLinear"}
    for n in g.node:
        for i, t in enumerate(n.input):
            if t in alias:
                n.input[i] = alias[t]
    for o in g.output:
        if o.name in alias:
            return model  # a graph output is a dequantized tensor: probe the graph as it is
    cleanup(twin)
    return twin


def _probe(model: Any) -> list[np.ndarray]:
    from onnx import helper

    model = _float_twin(model)
    sess = ort_session(model.SerializeToString(), SessionSettings(optimization="disabled"))
    rng = np.random.default_rng(0)
    feed = {}
    for inp in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 2 for d in inp.shape]
        dtype = helper.tensor_dtype_to_np_dtype(next(i for i in model.graph.input if i.name == inp.name).type.tensor_type.elem_type)
        feed[inp.name] = (rng.integers(0, 256, size=shape).astype(dtype) if np.issubdtype(dtype, np.integer)
                          else rng.standard_normal(shape).astype(dtype))
    return [np.asarray(v) for v in sess.run(None, feed)]


def _agrees(before: list[np.ndarray], after: list[np.ndarray]) -> bool:
    for a, b in zip(before, after):
        if a.shape != b.shape:
            return False
        if np.issubdtype(a.dtype, np.floating):
            scale = max(float(np.max(np.abs(a))) if a.size else 0.0, 1e-6)
            if a.size and float(np.max(np.abs(a.astype(np.float64) - b))) > REL_TOL * scale:
                return False
        elif not np.array_equal(a, b):
            return False
    return len(before) == len(after)


def _apply(model: Any, drop: list[Any], add: list[Any]) -> None:
    from vitedge.onnxutil import topological_sort

    gone = {id(n) for n in drop}
    ordered = topological_sort(add + [n for n in model.graph.node if id(n) not in gone])
    del model.graph.node[:]
    model.graph.node.extend(ordered)


def fuse_float_ops(model: Any) -> FloatFusion:
    """Rewrite ``model`` in place (see the module docstring); returns what changed."""
    import onnx

    work = onnx.ModelProto()
    work.CopyFrom(model)
    qkv = _qkv_biases(work, {o.name for o in work.graph.output})
    if not qkv:  # nothing to rewrite: no probe runs
        return FloatFusion()
    for _, split, mha, data, bias in qkv:
        split.input[0] = data
        while len(mha.input) < 4:
            mha.input.append("")
        mha.input[3] = bias
    _apply(work, [q[0] for q in qkv], [])
    require_opset_import(work, MS_DOMAIN, 1)
    cleanup(work)
    try:
        reference = _probe(model)
    except Exception as err:  # noqa: BLE001 - a graph ONNX Runtime cannot run is left as it was
        return FloatFusion(skipped=(f"probe run failed: {str(err).splitlines()[0][:120] if str(err) else type(err).__name__}",))
    try:
        agree = _agrees(reference, _probe(work))
    except Exception as err:  # noqa: BLE001 - a rewrite ONNX Runtime refuses is not kept
        return FloatFusion(skipped=(f"rewritten graph failed to run: {str(err).splitlines()[0][:120]}",))
    if not agree:
        return FloatFusion(skipped=("rewritten graph's outputs differ from the original's on a probe input",))
    model.CopyFrom(work)
    return FloatFusion(len(qkv))
