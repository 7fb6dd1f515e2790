"""Fuse float attention cores into ONNX Runtime's MultiHeadAttention operator.

An exported ViT computes each block's attention as a dozen small kernels: reshape the
q/k/v projection, transpose it, split it, scale q and k, Q.K^T, Softmax, P.V, transpose
back, reshape. ONNX Runtime's ``com.microsoft.MultiHeadAttention`` does the same work in
one kernel, without the transposes. On ViT-B/16 (2 cores, docs/cpu-targets.md): the INT8
median is unchanged when the machine is quiet, ~10 % lower when it is contended, and the
p90 8-11 % lower in both full benchmark runs; FP32 with the same fusion is 3-5 % faster.

Found by structure, confirmed by numbers. A candidate is a Softmax fed by a MatMul (through
scalar scaling only) whose output feeds one MatMul; q, k and v are traced back through
layout ops (Reshape, Transpose, Split, Squeeze, Gather, Slice, scalar Mul/Div) to one packed
``[B, S, 3E]`` tensor (timm), its sequence-first ``[S, B, 3E]`` form (PyTorch
nn.MultiheadAttention) or three ``[B, S, E]`` projections (Hugging Face, whose export also
puts float -> float Casts after the Softmax), and the result forward through layout ops to
the tensor the output projection reads. The graph then runs once on a random input and the fusion is
kept only if MultiHeadAttention's arithmetic (q, k, v as the thirds of the packed tensor,
heads as contiguous slices of E, one scale read off the logits) reproduces the captured
logits and output. Anything else (quantized attention matmuls with Q/DQ inside the core,
masks, sequence-first layouts that do not match) stays as it was, with the reason recorded.

The result runs on any stock ONNX Runtime (contrib operators ship in every build) but not
on runtimes that only know the standard ONNX domain; the `onnx` profile's
``fuse_attention = false`` keeps the plain graph for those.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from vitedge.onnxkit.session import SessionSettings, ort_session
from vitedge.onnxkit.structure import NameScope, cleanup, node_index, require_opset_import, topological_sort

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

MS_DOMAIN = "com.microsoft"
LAYOUT_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Split", "Gather", "Slice", "Flatten", "Identity"})
SCALE_OPS = frozenset({"Mul", "Div"})
OUTPUT_LAYOUT_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"})
# The numbers must agree to this fraction of the largest magnitude (float32 arithmetic in a
# different order differs by ~1e-6 of it; a wrong hypothesis by order 1).
REL_TOL = 1e-3


@dataclass(frozen=True)
class AttentionFusion:
    """What ``fuse_attention`` did."""

    candidates: int
    fused: int
    num_heads: tuple[int, ...] = ()
    skipped: tuple[str, ...] = field(default=())  # one reason per candidate left as it was

    def one_line(self) -> str:
        if not self.candidates:
            return "attention fusion: no attention core found"
        heads = f", {self.num_heads[0]} heads" if self.num_heads and len(set(self.num_heads)) == 1 else ""
        line = f"attention fusion: {self.fused} of {self.candidates} cores -> MultiHeadAttention{heads}"
        if self.skipped:
            line += f" (first left as is: {self.skipped[0]})"
        return line

    def to_dict(self) -> dict[str, Any]:
        return {"operator": f"{MS_DOMAIN}.MultiHeadAttention", "candidates": self.candidates, "fused": self.fused,
                "num_heads": sorted(set(self.num_heads)), "skipped": list(self.skipped)}


@dataclass
class _Core:
    softmax: Any
    logits: str
    sources: tuple[str, ...]  # (packed,) or (q, k, v)
    nodes: list[Any]  # the data path up to P.V, removed when fused
    outputs: list[tuple[str, list[Any]]]  # candidate [B, S, E] tensors after P.V, nearest first, with their layout ops
    output: str = ""  # the one the numbers confirmed
    concat: Any = None  # a per-head core: the Concat joining its P.V output with the other heads' (last axis)
    pv: str = ""  # the P.V MatMul's output
    parts: dict[str, list[str]] = field(default_factory=dict)  # a head group's q/k/v: name -> the heads' tensors
    head_logits: tuple[str, ...] = ()  # a head group's logits: each head's

    def with_output(self, k: int) -> "_Core":
        out, path = self.outputs[k]
        return _Core(self.softmax, self.logits, self.sources, self.nodes + path, self.outputs, out, self.concat, self.pv,
                     self.parts, self.head_logits)

    def probed(self) -> set[str]:
        """The tensors the numbers are read from."""
        real = {t for t in self.sources if t not in self.parts} | {t for ts in self.parts.values() for t in ts}
        return real | set(self.head_logits or (self.logits,)) | {o for o, _ in self.outputs}


class _Graph:
    def __init__(self, model: ModelProto):
        from onnx import numpy_helper, shape_inference

        g = model.graph
        self.model = model
        self.index = node_index(g.node)
        self.producer = self.index.producer
        self.outputs = {o.name for o in g.output}
        self.numel: dict[str, int | None] = {}
        for t in g.initializer:
            self.numel[t.name] = int(np.prod(t.dims)) if len(t.dims) else 1
        for n in g.node:
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
                self.numel[n.output[0]] = int(numpy_helper.to_array(n.attribute[0].t).size)
        try:
            inferred = shape_inference.infer_shapes(model).graph.value_info
        except Exception:  # noqa: BLE001 - shapes only sharpen scalar detection
            inferred = []
        for vi in inferred:
            dims = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else None
            if dims is None:
                continue
            if all(d.HasField("dim_value") for d in dims):
                self.numel.setdefault(vi.name, int(np.prod([d.dim_value for d in dims])) if len(dims) else 1)

    def is_scalar(self, tensor: str) -> bool:
        return self.numel.get(tensor) == 1

    def data_input(self, node: NodeProto) -> str | None:
        """The tensor a layout or scalar-scaling node passes along, else None."""
        if node.op_type in LAYOUT_OPS:
            return node.input[0]
        if node.op_type == "Div" and self.is_scalar(node.input[1]) and not self.is_scalar(node.input[0]):
            return node.input[0]
        if node.op_type == "Mul":
            a, b = node.input
            if self.is_scalar(b) and not self.is_scalar(a):
                return a
            if self.is_scalar(a) and not self.is_scalar(b):
                return b
        return None

    def walk_up(self, tensor: str) -> tuple[str, list[Any]]:
        path = []
        while tensor in self.producer:
            node = self.producer[tensor]
            nxt = self.data_input(node)
            if nxt is None:
                break
            path.append(node)
            tensor = nxt
        return tensor, path

    def only_consumer(self, tensor: str) -> Any | None:
        users = self.index.readers(tensor)
        return users[0] if len(users) == 1 and tensor not in self.outputs else None

    def only_data_reader(self, tensor: str) -> Any | None:
        """The one reader of ``tensor`` besides Shape nodes (a layout exported with dynamic sizes, e.g. einops'
        rearrange, reads the P.V output's shape to build the Reshape after it); None otherwise. Whether those Shape
        nodes die with the core is ``_private``'s check."""
        users = [u for u in self.index.readers(tensor) if u.op_type != "Shape"]
        return users[0] if len(users) == 1 and tensor not in self.outputs else None


def _is_float_cast(node: NodeProto) -> bool:
    """Identity, or a Cast to float32 (a no-op on the float32 probabilities)."""
    if node.op_type == "Identity":
        return True
    return node.op_type == "Cast" and any(a.name == "to" and a.i == 1 for a in node.attribute)  # TensorProto.FLOAT


def _safe_softmax(gr: _Graph, probs: str) -> Any | None:
    """``Where(all logits -inf, 0, probs)``: the guard PyTorch's decomposed scaled_dot_product_attention puts after
    the Softmax (a torch.export / TorchScript fast-path export), a no-op without a mask. Its other reader of the
    probabilities is a Shape (of the zeros); the numbers check that the guard changed nothing on the probe."""
    readers = gr.index.readers(probs)
    wheres = [n for n in readers if n.op_type == "Where" and len(n.input) == 3 and n.input[2] == probs and n.input[1] != probs]
    if len(wheres) != 1 or probs in gr.outputs or any(n.op_type != "Shape" for n in readers if n is not wheres[0]):
        return None
    return wheres[0]


def _find_cores(gr: _Graph) -> tuple[list[_Core], list[str]]:
    cores, skipped = [], []
    for s in [n for n in gr.model.graph.node if n.op_type == "Softmax"]:
        logits = s.input[0]
        t, scale_path = logits, []
        while t in gr.producer and gr.producer[t].op_type in SCALE_OPS | {"Reshape"} and gr.data_input(gr.producer[t]) is not None:
            scale_path.append(gr.producer[t])
            t = gr.data_input(gr.producer[t])
        mm1 = gr.producer.get(t)
        # P.V: the one MatMul taking the probabilities as its first input; any other reader of
        # them (or the probabilities being a graph output) is caught by _private, with that reason
        # Hugging Face exports put float -> float Casts between them (a dtype round trip)
        probs, cast_path = s.output[0], []
        while (c := gr.only_consumer(probs) or _safe_softmax(gr, probs)) is not None and (
                _is_float_cast(c) or c.op_type in ("Reshape", "Where")):
            cast_path.append(c)
            probs = c.output[0]
        pv = [n for n in gr.index.readers(probs) if n.op_type == "MatMul" and n.input[0] == probs]
        mm2 = pv[0] if len(pv) == 1 else None
        quantized = any(u.op_type == "QuantizeLinear" for u in gr.index.readers(s.output[0])) or (
            mm1 is not None and any(gr.producer.get(i) is not None and gr.producer[i].op_type == "DequantizeLinear" for i in mm1.input))
        if quantized:
            skipped.append(f"{s.name}: Q/DQ inside the core (attention matmuls quantized)")
            continue
        if mm1 is None or mm1.op_type != "MatMul" or mm2 is None:
            skipped.append(f"{s.name}: not MatMul -> Softmax -> MatMul")
            continue
        q_src, q_path = gr.walk_up(mm1.input[0])
        k_src, k_path = gr.walk_up(mm1.input[1])
        v_src, v_path = gr.walk_up(mm2.input[1])
        if q_src == k_src == v_src:
            sources: tuple[str, ...] = (q_src,)
        elif len({q_src, k_src, v_src}) == 3:
            sources = (q_src, k_src, v_src)
        else:
            skipped.append(f"{s.name}: q, k and v come from an unexpected mix of tensors")
            continue
        out, out_path, candidates = mm2.output[0], [], []
        while (nxt := gr.only_data_reader(out)) is not None and nxt.op_type in OUTPUT_LAYOUT_OPS:
            out_path.append(nxt)
            out = nxt.output[0]
            candidates.append((out, list(out_path)))
        concat = _head_concat(gr, mm2.output[0]) if not candidates else None
        if not candidates and concat is None:
            skipped.append(f"{s.name}: no layout ops after P.V to a [B, S, E] tensor")
            continue
        nodes = {id(n): n for n in [s, *cast_path, mm1, mm2, *scale_path, *q_path, *k_path, *v_path]}
        cores.append(_Core(s, logits, sources, list(nodes.values()), candidates, concat=concat, pv=mm2.output[0]))
    return cores, skipped


def _head_concat(gr: _Graph, pv: str) -> Any | None:
    """The Concat on the last axis that alone reads a per-head P.V output (heads as separate modules), else None."""
    node = gr.only_consumer(pv)
    if node is None or node.op_type != "Concat":
        return None
    axis = next((a.i for a in node.attribute if a.name == "axis"), None)
    return node if axis in (-1, 2) else None


def _group_heads(gr: _Graph, cores: list[_Core], skipped: list[str]) -> list[_Core]:
    """Per-head cores joined by one Concat as one core over all heads: q, k and v one packed tensor (the heads' q/k/v
    merged into one GEMM before quantization, vitedge.quantize.merge) or, per head, their own tensors (then
    concatenated in head order). The numbers decide, as for any core; a Concat with anything but head outputs
    leaves its heads as they were."""
    whole = [c for c in cores if c.concat is None]
    by_concat: dict[int, list[_Core]] = {}
    for c in cores:
        if c.concat is not None:
            by_concat.setdefault(id(c.concat), []).append(c)
    for heads in by_concat.values():
        concat = heads[0].concat
        pv = {c.pv: c for c in heads}
        order = [pv.get(i) for i in concat.input]
        name = heads[0].softmax.name
        if any(c is None for c in order) or len(set(map(id, order))) != len(order):
            skipped.extend(f"{c.softmax.name}: its P.V output is concatenated with tensors other than heads" for c in heads)
            continue
        if len({c.sources for c in order}) == 1 and len(order[0].sources) == 1:
            sources, parts = order[0].sources, {}
        elif all(len(c.sources) == 3 for c in order):
            sources = tuple(f"{concat.output[0]}/heads_{r}" for r in "qkv")
            parts = {sources[r]: [c.sources[r] for c in order] for r in range(3)}
        else:
            skipped.extend(f"{c.softmax.name}: the heads' q, k and v come from an unexpected mix of tensors" for c in heads)
            continue
        out, path, candidates = concat.output[0], [concat], [(concat.output[0], [concat])]
        while (nxt := gr.only_data_reader(out)) is not None and nxt.op_type in OUTPUT_LAYOUT_OPS:
            path = [*path, nxt]
            out = nxt.output[0]
            candidates.append((out, path))
        nodes = {id(n): n for c in order for n in c.nodes}
        whole.append(_Core(order[0].softmax, f"{name}/heads_logits", sources, list(nodes.values()), candidates,
                           parts=parts, head_logits=tuple(c.logits for c in order)))
    return whole


def _join_heads(core: _Core, values: dict[str, np.ndarray], batch: int) -> None:
    """A head group's probed q/k/v and logits as one attention's: heads side by side (in place)."""
    for name, heads in core.parts.items():
        values[name] = np.concatenate([values[t] for t in heads], axis=-1)
    if core.head_logits:
        s = values[core.head_logits[0]].shape[-1]
        values[core.logits] = np.concatenate([values[t].reshape(batch, -1, s, s) for t in core.head_logits], axis=1)


def _private(gr: _Graph, core: _Core) -> bool:
    """True when, with the core gone, no live node reads the core's intermediate tensors.

    Side computations that only fed the core (Shape -> ... -> the q/k scale) die with it.
    """
    inside = {id(n) for n in core.nodes}
    intermediate = {o for n in core.nodes for o in n.output if o and o != core.output}
    if intermediate & gr.outputs:
        return False
    sources = set(core.sources) | {t for ts in core.parts.values() for t in ts}
    needed = set(gr.outputs) | sources | {i for u in gr.index.readers(core.output) for i in u.input}
    live = [n for n in gr.model.graph.node if id(n) not in inside]
    while True:
        used = needed | {i for n in live for i in n.input if i}
        keep = [n for n in live if any(o in used for o in n.output if o)]
        if len(keep) == len(live):
            break
        live = keep
    return not any(i in intermediate for n in live for i in n.input)


PROBE_BATCH = 2  # a dynamic batch is probed at 2, so batch-first and sequence-first layouts differ


def _random_input(model: ModelProto) -> tuple[dict[str, np.ndarray], int]:
    from onnx import helper

    inp = model.graph.input[0]
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in inp.type.tensor_type.shape.dim]
    batch = dims[0] if dims and dims[0] else PROBE_BATCH
    dims = [batch] + [d or 1 for d in dims[1:]]
    dtype = helper.tensor_dtype_to_np_dtype(inp.type.tensor_type.elem_type)
    rng = np.random.default_rng(0)
    if np.issubdtype(dtype, np.integer):
        return {inp.name: rng.integers(0, 256, size=dims).astype(dtype)}, batch
    return {inp.name: rng.standard_normal(dims).astype(dtype)}, batch


def _capture(model: ModelProto, tensors: list[str]) -> tuple[dict[str, np.ndarray], int]:
    import onnx
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    existing = {o.name for o in m.graph.output}
    for t in tensors:
        if t not in existing:
            m.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
            existing.add(t)
    sess = ort_session(m.SerializeToString(), SessionSettings(optimization="disabled"))  # the graph as written, no ORT rewrites
    names = [o.name for o in sess.get_outputs()]
    feed, batch = _random_input(model)
    values = sess.run(None, feed)
    return {n: np.asarray(v) for n, v in zip(names, values) if n in set(tensors)}, batch


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    scale = max(float(np.max(np.abs(b))), 1e-6)
    return a.shape == b.shape and float(np.max(np.abs(a - b))) <= REL_TOL * scale


@dataclass(frozen=True)
class _Plan:
    heads: int
    scale: float
    width: int  # E
    source_layout: str  # "bse", "sbe" (PyTorch nn.MultiheadAttention), or flattened tokens "(bs)e" / "(sb)e"
    output_layout: str  # "bse", "sbe", "(sb)e" or "(bs)e"
    tokens: int = 0  # S


def _to_layout(o: np.ndarray, layout: str) -> np.ndarray:
    """[B, S, E] -> the given layout."""
    b, s, e = o.shape
    return {"bse": lambda: o, "sbe": lambda: o.transpose(1, 0, 2), "(sb)e": lambda: o.transpose(1, 0, 2).reshape(s * b, e),
            "(bs)e": lambda: o.reshape(b * s, e)}[layout]()


def _check(core: _Core, values: dict[str, np.ndarray], batch: int) -> _Plan | str:
    """How MultiHeadAttention reproduces the core, else why it does not."""
    y, logits = values[core.output], values[core.logits]
    s = logits.shape[-1]
    b = batch
    src = [values[t] for t in core.sources]
    layouts = _source_layouts(src, b, s)
    if isinstance(layouts, str):
        return layouts
    verdict = "no source layout"
    for layout in layouts:  # a flattened [B*S, .] source may be either order of its tokens
        verdict = _check_as(core, values, [_from_layout(x, layout, b, s) for x in src], b, s)
        if not isinstance(verdict, str):
            return dataclasses.replace(verdict, source_layout=layout, tokens=s)
    return verdict


def _source_layouts(src: list[np.ndarray], b: int, s: int) -> list[str] | str:
    if any(x.ndim != src[0].ndim for x in src) or src[0].ndim not in (2, 3):
        return f"q/k/v source is {src[0].ndim}-D, not 3-D nor flattened tokens"
    if src[0].ndim == 2:
        return ["(bs)e", "(sb)e"] if src[0].shape[0] == b * s else f"q/k/v source {src[0].shape} does not hold B x S = {b * s} rows"
    lead = src[0].shape[:2]
    found = [layout for layout, want in (("bse", (b, s)), ("sbe", (s, b))) if lead == want]
    return found or f"q/k/v source {src[0].shape} is neither [B, S, .] nor [S, B, .] for B={b}, S={s}"


def _from_layout(x: np.ndarray, layout: str, b: int, s: int) -> np.ndarray:
    """A source in ``layout`` as [B, S, .]."""
    return {"bse": lambda: x, "sbe": lambda: x.transpose(1, 0, 2), "(bs)e": lambda: x.reshape(b, s, -1),
            "(sb)e": lambda: x.reshape(s, b, -1).transpose(1, 0, 2)}[layout]()


def _check_as(core: _Core, values: dict[str, np.ndarray], src: list[np.ndarray], b: int, s: int) -> _Plan | str:
    """How MultiHeadAttention reproduces the core from [B, S, .] sources, else why it does not."""
    y, logits = values[core.output], values[core.logits]
    if len(src) == 1:
        if src[0].shape[-1] % 3:
            return f"packed q/k/v width {src[0].shape[-1]} is not 3 x E"
        e = src[0].shape[-1] // 3
        q, k, v = (src[0][..., i * e:(i + 1) * e] for i in range(3))
    else:
        e = src[0].shape[-1]
        if any(x.shape != (b, s, e) for x in src):
            return f"q/k/v shapes {[x.shape for x in src]} differ"
        q, k, v = src
    if logits.size % (b * s * s):
        return f"logits {logits.shape} do not hold B x heads x S x S"
    heads = logits.size // (b * s * s)
    if heads < 1 or e % heads:
        return f"{heads} heads do not divide width {e}"
    d = e // heads

    def split(x: np.ndarray) -> np.ndarray:
        return x.astype(np.float64).reshape(b, s, heads, d).transpose(0, 2, 1, 3)

    qh, kh, vh = split(q), split(k), split(v)
    raw = qh @ kh.transpose(0, 1, 3, 2)
    observed = logits.astype(np.float64).reshape(b, heads, s, s)
    denom = float(np.sum(raw * raw))
    if denom == 0.0:
        return "q.k^T is zero on the probe input"
    scale = float(np.sum(observed * raw) / denom)
    if not (np.isfinite(scale) and scale > 0) or not _close(scale * raw, observed):
        return "logits are not a scaled q.k^T of the traced q and k"
    out = (_softmax(scale * raw) @ vh).transpose(0, 2, 1, 3).reshape(b, s, e)
    for layout in ("bse", "sbe", "(sb)e", "(bs)e"):
        if _close(_to_layout(out, layout), y.astype(np.float64)):
            return _Plan(int(heads), scale, int(e), "bse", layout)
    return f"the traced output {y.shape} is not softmax(q.k^T) v with contiguous heads"


def _rewrite(core: _Core, plan: _Plan, names: NameScope, inits: list[Any]) -> list[Any]:
    """The nodes that replace the core: [Transpose] -> [Split] -> MultiHeadAttention -> [Transpose] [Reshape]."""
    from onnx import helper, numpy_helper

    base = core.softmax.name.rsplit("/", 1)[0] or "attention"
    e = plan.width
    nodes: list[Any] = []
    sources = list(core.sources)
    if plan.source_layout in ("(bs)e", "(sb)e"):  # flattened tokens: [B, S, .] or [S, B, .] again
        shape = names(f"{base}/token_shape")
        w = 3 * e if len(sources) == 1 else e
        inits.append(numpy_helper.from_array(np.array([-1, plan.tokens, w] if plan.source_layout == "(bs)e" else [plan.tokens, -1, w],
                                                      dtype=np.int64), shape))
        for i, t in enumerate(sources):
            sources[i] = names(f"{base}/tokens_{i}")
            nodes.append(helper.make_node("Reshape", [t, shape], [sources[i]], name=names(f"{base}/unflatten_tokens")))
    if plan.source_layout in ("sbe", "(sb)e"):
        for i, t in enumerate(sources):
            sources[i] = names(f"{base}/batch_first_{i}")
            nodes.append(helper.make_node("Transpose", [t], [sources[i]], perm=[1, 0, 2], name=names(f"{base}/to_batch_first")))
    if len(sources) == 1:
        sizes = names(f"{base}/qkv_split_sizes")
        inits.append(numpy_helper.from_array(np.array([e, e, e], dtype=np.int64), sizes))
        qkv = [names(f"{base}/{x}") for x in ("q", "k", "v")]
        nodes.append(helper.make_node("Split", [sources[0], sizes], qkv, axis=-1, name=names(f"{base}/qkv_split")))
    else:
        qkv = sources
    for name in qkv:  # a head group with each head's own q, k and v: side by side, in head order
        if name in core.parts:
            nodes.append(helper.make_node("Concat", core.parts[name], [name], axis=-1, name=names(f"{base}/join_heads")))
    out = core.output if plan.output_layout == "bse" else names(f"{base}/attention_bse")
    nodes.append(helper.make_node("MultiHeadAttention", qkv, [out], domain=MS_DOMAIN, num_heads=plan.heads,
                                  scale=float(plan.scale), name=names(f"{base}/MultiHeadAttention")))
    if plan.output_layout in ("sbe", "(sb)e"):
        t = core.output if plan.output_layout == "sbe" else names(f"{base}/attention_sbe")
        nodes.append(helper.make_node("Transpose", [out], [t], perm=[1, 0, 2], name=names(f"{base}/to_seq_first")))
        out = t
    if plan.output_layout in ("(sb)e", "(bs)e"):
        shape = names(f"{base}/flat_shape")
        inits.append(numpy_helper.from_array(np.array([-1, e], dtype=np.int64), shape))
        nodes.append(helper.make_node("Reshape", [out, shape], [core.output], name=names(f"{base}/flatten_tokens")))
    return nodes


def fuse_attention(model: ModelProto) -> AttentionFusion:
    """Replace every float attention core that checks out with MultiHeadAttention (in place)."""

    gr = _Graph(model)
    cores, skipped = _find_cores(gr)
    cores = _group_heads(gr, cores, skipped)
    candidates = len(cores) + len(skipped)
    if not cores:
        return AttentionFusion(candidates, 0, (), tuple(skipped))
    wanted = sorted(set().union(*(c.probed() for c in cores)))
    try:
        values, batch = _capture(model, wanted)
    except Exception as err:  # noqa: BLE001 - a graph ONNX Runtime cannot probe is left unfused
        return AttentionFusion(candidates, 0, (), tuple(skipped) + (f"probe run failed: {str(err).splitlines()[0][:120]}",))
    for c in cores:
        _join_heads(c, values, batch)

    names = NameScope(model)
    g = model.graph
    added: list[Any] = []  # the fused nodes; topological_sort puts each right after the tensors it reads
    drop: set[int] = set()
    inits: list[Any] = []
    heads_used = []
    for found in cores:
        verdict: _Plan | str = "no [B, S, E] tensor after P.V"
        for k in reversed(range(len(found.outputs))):  # the furthest output that checks out
            c = found.with_output(k)
            verdict = _check(c, values, batch)
            if not isinstance(verdict, str):
                break
        if isinstance(verdict, str):
            skipped.append(f"{found.softmax.name}: {verdict}")
            continue
        if not _private(gr, c):
            skipped.append(f"{found.softmax.name}: its intermediate tensors are read outside the attention core")
            continue
        added.extend(_rewrite(c, verdict, names, inits))
        drop.update(id(n) for n in [*c.nodes, gr.producer[c.output]])
        heads_used.append(verdict.heads)
    if not heads_used:
        return AttentionFusion(candidates, 0, (), tuple(skipped))

    ordered = topological_sort(added + [n for n in g.node if id(n) not in drop])
    del g.node[:]
    g.node.extend(ordered)
    g.initializer.extend(inits)
    require_opset_import(model, MS_DOMAIN, 1)
    cleanup(model)
    return AttentionFusion(candidates, len(heads_used), tuple(heads_used), tuple(skipped))
