"""Experimental ONNX Runtime-only rewrites of the float work around the INT8 GEMMs, measured for issue 28 and
NOT shipped (benchmarks/results/ort_int8_avx2_profile.md, ort_fusion_accuracy_avx2.md, docs/cpu-targets.md).

    python benchmarks/ort_float_fusions.py IN.onnx OUT.onnx [--no-skip-layernorm]
    python benchmarks/ort_float_fusions.py BUNDLE/model.int8.onnx OUT.onnx --unfold-gemm-bias

The second form undoes the shipped GEMM-bias fold (vitedge/backends/onnxruntime/gemm_bias.py), so that the artifact can be
profiled beside its unfused self. On an artifact with that fold the two rewrites below find no projection-bias
``Add`` left to fold (the biases are inside MatMulIntegerToFloat): run them on an unfolded graph.

writes the rewritten graph, to profile beside the original with
``benchmarks/ort_profile.py --bundle B --also NAME=OUT.onnx``. Kept here so the measurement can be repeated (on a
quiet or a VNNI machine) without shipping code that did not measure faster.

Were they shipped, they would belong in the onnx target's artifact step after ``fuse_attention`` (the shared Q/DQ
graph feeds OpenVINO and TensorRT too), under ``fuse_attention = true`` (they write ``com.microsoft`` operators).

* **Residual Add + LayerNormalization -> SkipLayerNormalization.** ONNX Runtime's own
  ``SkipLayerNormFusion`` fuses an Add only when the Add's output has exactly one reader
  (``CheckFirstAdd``: ``GetOutputEdgesCount() != 1``), and wants a projection bias as the
  Add's *second* input. In a pre-norm transformer the residual sum feeds the LayerNorm *and*
  the next residual Add, and the exporter writes ``Add(bias, x)``: only the last block's sum
  (read by the final norm alone) was fused, 1 of 25 on ViT-B/16. Here the sum stays
  available as SkipLayerNormalization's optional fourth output (``input_skip_bias_sum``),
  and a projection bias ``Add`` (a 1-D constant, either input order, one reader) folds
  into its ``bias`` input.
* **q/k/v bias -> MultiHeadAttention's bias input.** ``Add(bias, qkv) -> Split -> MHA``
  becomes ``Split -> MHA(q, k, v, bias)``: the kernel adds the bias while it lays out q, k
  and v per head, one pass over the tensor fewer.

Same arithmetic, reordered float additions only. Every rewrite is checked by running both
graphs on a random input (ONNX Runtime, no optimisation) with their activation Q/DQ pairs
bypassed and comparing every graph output; on any mismatch the graph is left as it was,
with the reason recorded. The INT8 graph's outputs move by what a float32 rounding flip of
a quantized activation moves them (measured on the corpus, docs/cpu-targets.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vitedge.onnxkit.session import SessionSettings, ort_session  # noqa: E402
from vitedge.onnxkit.structure import NameScope, cleanup, node_index, require_opset_import  # noqa: E402

MS_DOMAIN = "com.microsoft"
# Outputs of the float twins (see _float_twin) must agree to this fraction of their largest
# magnitude (reordered float32 sums differ by ~1e-6 of it; a wrong rewrite by order 1).
REL_TOL = 1e-4


@dataclass(frozen=True)
class FloatFusion:
    """What ``fuse_float_ops`` did."""

    skip_layernorm: int = 0  # LayerNormalizations that became SkipLayerNormalization
    layernorms: int = 0  # LayerNormalizations in the graph
    biases_folded: int = 0  # projection-bias Adds folded into SkipLayerNormalization
    qkv_biases: int = 0  # q/k/v bias Adds folded into MultiHeadAttention
    skipped: tuple[str, ...] = field(default=())

    def one_line(self) -> str:
        line = (f"float fusion: {self.skip_layernorm} of {self.layernorms} LayerNorms -> SkipLayerNormalization "
                f"({self.biases_folded} biases folded), {self.qkv_biases} q/k/v biases into MultiHeadAttention")
        return line + (f" (left as is: {self.skipped[0]})" if self.skipped else "")

    def to_dict(self) -> dict[str, Any]:
        return {"skip_layernorm": self.skip_layernorm, "layernorms": self.layernorms,
                "biases_folded": self.biases_folded, "qkv_biases": self.qkv_biases, "skipped": list(self.skipped)}


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


def _attr(node: Any, name: str, default: Any) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


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


def _skip_layernorms(model: Any, names: NameScope, outputs: set[str]) -> tuple[list[tuple[Any, list[Any]]], int]:
    """(LayerNorm -> (replacement node, nodes it replaces)), bias count."""
    from onnx import helper

    g = model.graph
    index, shapes = node_index(g.node), _Shapes(model)
    plans, folded, taken = [], 0, set()
    for ln in [n for n in g.node if n.op_type == "LayerNormalization" and n.domain in ("", "ai.onnx")]:
        width = shapes.last.get(ln.input[0])
        add = index.producer.get(ln.input[0])
        if (add is None or add.op_type != "Add" or id(add) in taken or len(ln.input) < 2 or _attr(ln, "axis", -1) not in (-1, 2)
                or width is None or shapes.vector(ln.input[1]) is None or add.output[0] in outputs):
            continue
        a, b = add.input
        if shapes.rank.get(a) != 3 or shapes.rank.get(b) != 3 or shapes.last.get(a) != width or shapes.last.get(b) != width:
            continue
        replaced, bias = [ln, add], ""
        for i, side in enumerate((b, a)):  # a projection bias on either side of the residual Add
            found = _bias_add(index, shapes, side, width)
            if found is not None and found[0].output[0] not in outputs:
                replaced.append(found[0])
                bias = found[2]
                a, b = (a, found[1]) if i == 0 else (found[1], b)
                folded += 1
                break
        beta = ln.input[2] if len(ln.input) > 2 else ""
        others = [u for u in index.readers(add.output[0]) if u is not ln]
        total = add.output[0] if others else ""
        node = helper.make_node("SkipLayerNormalization", [a, b, ln.input[1], beta, bias], [ln.output[0], "", "", total],
                                domain=MS_DOMAIN, epsilon=float(_attr(ln, "epsilon", 1e-5)), name=names(f"{ln.name}/SkipLayerNorm"))
        taken.add(id(add))
        plans.append((node, replaced))
    return plans, folded


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
    from vitedge.onnxkit.structure import topological_sort

    gone = {id(n) for n in drop}
    ordered = topological_sort(add + [n for n in model.graph.node if id(n) not in gone])
    del model.graph.node[:]
    model.graph.node.extend(ordered)


def fuse_float_ops(model: Any, skip_layernorm: bool = True) -> FloatFusion:
    """Rewrite ``model`` in place (see the module docstring); returns what changed."""
    import onnx

    try:
        reference = _probe(model)
    except Exception as err:  # noqa: BLE001 - a graph ONNX Runtime cannot run is left as it was
        return FloatFusion(skipped=(f"probe run failed: {str(err).splitlines()[0][:120] if str(err) else type(err).__name__}",))
    work = onnx.ModelProto()
    work.CopyFrom(model)
    outputs = {o.name for o in work.graph.output}
    names = NameScope(work)
    layernorms = sum(n.op_type == "LayerNormalization" for n in work.graph.node)
    plans, folded = _skip_layernorms(work, names, outputs) if skip_layernorm else ([], 0)
    _apply(work, [n for _, old in plans for n in old], [node for node, _ in plans])
    qkv = _qkv_biases(work, outputs)
    for bias_add, split, mha, data, bias in qkv:
        split.input[0] = data
        while len(mha.input) < 4:
            mha.input.append("")
        mha.input[3] = bias
    _apply(work, [q[0] for q in qkv], [])
    if not plans and not qkv:
        return FloatFusion(layernorms=layernorms)
    require_opset_import(work, MS_DOMAIN, 1)
    cleanup(work)
    try:
        agree = _agrees(reference, _probe(work))
    except Exception as err:  # noqa: BLE001 - a rewrite ONNX Runtime refuses is not kept
        return FloatFusion(layernorms=layernorms, skipped=(f"rewritten graph failed to run: {str(err).splitlines()[0][:120]}",))
    if not agree:
        return FloatFusion(layernorms=layernorms, skipped=("rewritten graph's outputs differ from the original's on a probe input",))
    model.CopyFrom(work)
    return FloatFusion(len(plans), layernorms, folded, len(qkv))


def main() -> None:
    import onnx

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, help="an INT8 graph, e.g. an onnx bundle's model.int8.onnx")
    ap.add_argument("out", type=Path)
    ap.add_argument("--no-skip-layernorm", action="store_true", help="only the q/k/v bias fold")
    ap.add_argument("--unfold-gemm-bias", action="store_true",
                    help="instead: write the artifact with its INT8 GEMMs' biases as separate Adds again (the form "
                         "shipped before issue 28 item 1), to profile beside the artifact")
    args = ap.parse_args()
    model = onnx.load(str(args.source))
    if args.unfold_gemm_bias:
        from vitedge.backends.onnxruntime.gemm_bias import unfold_gemm_bias

        print(f"{unfold_gemm_bias(model)} GEMM biases unfolded")
    else:
        print(fuse_float_ops(model, skip_layernorm=not args.no_skip_layernorm).one_line())
    onnx.save(model, str(args.out))


if __name__ == "__main__":
    main()
