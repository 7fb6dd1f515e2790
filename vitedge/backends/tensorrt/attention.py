"""Attention blocks of the Q/DQ graph, and whether TensorRT can fuse them into INT8 MHA kernels.

INT8 is often no faster than FP16 on TensorRT because multi-head attention was not fused
(field notes, "What users of the anchors struggle with"): TensorRT's INT8 fused MHA needs
Q/DQ in three places: before both inputs of the first batched GEMM (Q.K^T), after the softmax
(the P input of the second, P.V, whose V input is quantized too) and after the second GEMM's
output; a head size of 16, 32 or 64, and at most 512 tokens (NVIDIA/TensorRT #3243, #2981,
#4167, #3724; ViT-B/16 at 384 px has 577 tokens). The Q/DQ after P.V is recognised directly on
its output ("direct") or behind shape-only layers (Transpose, Reshape: "after_shape_ops"), where
vitedge's graph has it, on the input of the output projection. The second counts as placed only
if TensorRT's Q/DQ propagation moves the Q back across those layers, which no GPU has shown here:
the table and the warnings say so for each block. NVIDIA's ModelOpt (0.47.0) places that Q/DQ in the
same spot on the same graph (benchmarks/modelopt_placement.py).
``attention_blocks`` reads those facts from the graph (ONNX shape inference with data
propagation, batch fixed to 1) and ``fusion_warnings`` says, before any build, which blocks
cannot become INT8 fused MHA and why. After the build, engine_inspect checks what happened.

A block whose attention matmuls the quantizer kept float on purpose (``float_small_gemms``, on for
the NVIDIA profiles: K or N below 16, i.e. heads narrower than 16, NVIDIA ModelOpt's rule; the graph's
``vitedge.quantization`` metadata names them) is not an INT8 MHA fusion: TensorRT runs that core in
the plan's float precision (``float_precision``, FP16 on the NVIDIA profiles), as separate MatMul and
Softmax layers or an FP16 kernel if its own rules fuse one; the report says so per block.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from vitedge.onnxkit.metadata import get_metadata
from vitedge.onnxkit.structure import NodeIndex, graph_inputs, node_index

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

MHA_HEAD_SIZES = (16, 32, 64)
MHA_MAX_TOKENS = 512
SOURCE = "NVIDIA/TensorRT #3243, #2981, #4167, #3724 (field notes)"
FLOAT_CORE = ("GEMMs with K or N below 16, float as NVIDIA ModelOpt keeps them; TensorRT runs this core in the "
              "plan's float precision, FP16 on the NVIDIA profiles, not as INT8 fused MHA")


@dataclass(frozen=True)
class AttentionBlock:
    scope: str  # name prefix of the block's nodes, e.g. "/blocks/blocks.0/attn/"
    softmax: str
    qk_matmul: str
    pv_matmul: str | None
    heads: int | None
    tokens: int | None
    head_size: int | None
    qk_quantized: bool  # both inputs of Q.K^T come from DequantizeLinear
    pv_quantized: bool
    # the Q/DQ after P.V: "direct" on its output, "after_shape_ops" behind Transpose/Reshape only, "none",
    # or "unknown" (a record written before this was checked)
    pv_output_qdq: str = "unknown"
    # why the quantizer kept this core's matmuls float on purpose (float_small_gemms), else None
    float_on_purpose: str | None = None

    def int8_mha_blockers(self) -> list[str]:
        """Why TensorRT cannot fuse this block into an INT8 MHA kernel (empty: it may)."""
        out = []
        if self.float_on_purpose and not (self.qk_quantized or self.pv_quantized):
            out.append(f"its attention matmuls stay float on purpose ({FLOAT_CORE})")
        elif not (self.qk_quantized and self.pv_quantized):
            out.append("its attention matmuls have no Q/DQ on both inputs (they run in float)")
        elif self.pv_output_qdq == "none":
            out.append("no Q/DQ after its P.V matmul (TensorRT needs one after the second batched GEMM too)")
        if self.head_size is not None and self.head_size not in MHA_HEAD_SIZES:
            out.append(f"head size {self.head_size} is not 16, 32 or 64")
        if self.tokens is not None and self.tokens > MHA_MAX_TOKENS:
            out.append(f"{self.tokens} tokens is more than {MHA_MAX_TOKENS}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _scope(name: str) -> str:
    return name.rsplit("/", 1)[0] + "/" if "/" in name else ""


def _matmul_after(tensor: str, index: NodeIndex) -> Any:
    """The MatMul reading ``tensor`` directly or through one QuantizeLinear -> DequantizeLinear pair."""
    for c in index.readers(tensor):
        if c.op_type == "MatMul":
            return c
        if c.op_type == "QuantizeLinear":
            for dq in index.readers(c.output[0]):
                if dq.op_type == "DequantizeLinear":
                    found = next((m for m in index.readers(dq.output[0]) if m.op_type == "MatMul"), None)
                    if found is not None:
                        return found
    return None


_PV_OUTPUT = {"direct": "on its output", "after_shape_ops": "after Transpose+Reshape", "none": "no", "unknown": "?"}
SHAPE_OPS = ("Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze")
SCALE_OPS = ("Mul", "Div")  # by a constant, between Q.K^T and the softmax: TensorRT's MHA pattern includes the scale


def pv_output_qdq(pv: NodeProto, index: NodeIndex) -> str:
    """Where the Q/DQ after the P.V matmul sits: "direct" (a QuantizeLinear reads its output), "after_shape_ops"
    (one is reached through shape-only layers alone), else "none"."""
    frontier, hops = [pv.output[0]], 0
    while frontier and hops <= 4:
        readers = [c for t in frontier for c in index.readers(t)]
        if readers and all(c.op_type == "QuantizeLinear" for c in readers):
            return "direct" if hops == 0 else "after_shape_ops"
        if not readers or not all(c.op_type in SHAPE_OPS for c in readers):
            return "none"
        frontier, hops = [c.output[0] for c in readers], hops + 1
    return "none"


def attention_blocks(model: ModelProto) -> list[AttentionBlock]:
    """Each Softmax between two MatMuls is an attention core (a Mul or Div by a constant may sit between Q.K^T and
    the Softmax: models that scale the scores rather than q); its shapes come from shape
    inference on a batch-1 copy of the graph (None where they cannot be inferred)."""
    import onnx
    from onnx import shape_inference

    nodes = list(model.graph.node)
    index = node_index(nodes)
    producer = index.producer
    consts = {t.name for t in model.graph.initializer} | {o for n in nodes if n.op_type == "Constant" for o in n.output}
    cores = []
    for sm in nodes:
        if sm.op_type != "Softmax":
            continue
        qk = producer.get(sm.input[0])
        for _ in range(2):  # the scale applied after Q.K^T (MatMul -> Mul/Div by a constant -> Softmax), as many models do
            if qk is None or qk.op_type not in SCALE_OPS or len(qk.input) != 2 or qk.input[1] not in consts:
                break
            qk = producer.get(qk.input[0])
        if qk is None or qk.op_type != "MatMul":
            continue
        cores.append((sm, qk, _matmul_after(sm.output[0], index)))
    if not cores:
        return []

    shapes: dict[str, list[int | None]] = {}
    try:
        m = onnx.ModelProto()
        m.CopyFrom(model)
        for inp in graph_inputs(m):
            dims = inp.type.tensor_type.shape.dim
            if dims and not dims[0].HasField("dim_value"):
                dims[0].ClearField("dim_param")
                dims[0].dim_value = 1
        inferred = shape_inference.infer_shapes(m, data_prop=True)
        for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim]
    except Exception:  # shapes stay unknown; the quantization facts still hold
        shapes = {}

    def from_dq(name: str) -> bool:
        p = producer.get(name)
        return p is not None and p.op_type == "DequantizeLinear"

    on_purpose = _small_gemms(model)
    blocks = []
    for sm, qk, pv in cores:
        scores = shapes.get(sm.input[0]) or []
        query = shapes.get(qk.input[0]) or []
        heads = scores[1] if len(scores) == 4 else None
        tokens = scores[-1] if len(scores) >= 2 else None
        head_size = query[-1] if len(query) >= 2 else None
        blocks.append(AttentionBlock(
            scope=_scope(sm.name or sm.output[0]), softmax=sm.name or sm.output[0], qk_matmul=qk.name or qk.output[0],
            pv_matmul=(pv.name or pv.output[0]) if pv is not None else None, heads=heads, tokens=tokens, head_size=head_size,
            qk_quantized=all(from_dq(i) for i in qk.input[:2]),
            pv_quantized=pv is not None and all(from_dq(i) for i in pv.input[:2]),
            pv_output_qdq=pv_output_qdq(pv, index) if pv is not None else "none",
            float_on_purpose=on_purpose.get(qk.name) or (on_purpose.get(pv.name) if pv is not None else None),
        ))
    return blocks


def _small_gemms(model: ModelProto) -> dict[str, str]:
    """Layer -> why, for the layers the quantizer kept float as small GEMMs (its metadata; {} without)."""
    try:
        record = json.loads(get_metadata(model).get("vitedge.quantization") or "{}")
        found = (record.get("small_gemms") or {}).get("float") or {}
    except (ValueError, AttributeError):
        return {}
    return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}


def fusion_warnings(blocks: list[AttentionBlock] | list[dict[str, Any]]) -> list[str]:
    """One line per distinct reason INT8 fused attention cannot happen, naming how many blocks."""
    by_reason: dict[str, int] = {}
    for b in blocks:
        block = b if isinstance(b, AttentionBlock) else AttentionBlock(**b)
        for reason in block.int8_mha_blockers():
            by_reason[reason] = by_reason.get(reason, 0) + 1
    total = len(blocks)
    lines = [f"INT8 fused attention cannot happen in {n} of {total} attention block(s): {reason} "
             f"(TensorRT fuses INT8 MHA only with Q/DQ before both batched GEMMs and after the second, head size 16/32/64 "
             f"and <= 512 tokens; {SOURCE})" for reason, n in by_reason.items()]
    moved = sum(1 for b in blocks if _relies_on_propagation(b if isinstance(b, AttentionBlock) else AttentionBlock(**b)))
    if moved:
        lines.append(f"INT8 fused attention in {moved} of {total} attention block(s) relies on TensorRT moving the Q/DQ after "
                     "P.V back across Transpose+Reshape (it sits on the output projection's input, not on P.V's output): "
                     "not shown on a GPU here; the engine inspector says whether MHA fused")
    return lines


def _relies_on_propagation(block: AttentionBlock) -> bool:
    return block.qk_quantized and block.pv_quantized and block.pv_output_qdq == "after_shape_ops" and not block.int8_mha_blockers()


def fusion_table(blocks: list[AttentionBlock] | list[dict[str, Any]]) -> list[str]:
    """A markdown table, one row per attention block: its shape facts, whether both attention
    matmuls carry Q/DQ on both inputs, and whether TensorRT's INT8 fused-MHA rules allow fusion
    (and if not, why). Empty when the graph has no attention block."""
    if not blocks:
        return []
    lines = ["| attention block | heads | tokens | head size | Q.K^T Q/DQ | P.V Q/DQ | Q/DQ after P.V | INT8 fused MHA |",
             "|---|---|---|---|---|---|---|---|"]
    for b in blocks:
        block = b if isinstance(b, AttentionBlock) else AttentionBlock(**b)
        why = block.int8_mha_blockers()
        unknown = [what for what, v in (("head size", block.head_size), ("token count", block.tokens)) if v is None]
        if why:
            verdict = "no: " + "; ".join(why) + (f" [{block.float_on_purpose}]" if block.float_on_purpose else "")
        elif _relies_on_propagation(block):
            verdict = ("only if TensorRT moves the Q/DQ after P.V back across Transpose+Reshape onto P.V's output "
                       "(not shown on a GPU; the engine inspector tells on the device)")
        elif unknown:
            verdict = f"allowed as far as the graph shows ({' and '.join(unknown)} not inferred; the engine inspector tells on the device)"
        else:
            verdict = "allowed by the rules (the engine inspector confirms it on the device)"
        lines.append(f"| `{block.scope}` | {block.heads if block.heads is not None else '?'} | "
                     f"{block.tokens if block.tokens is not None else '?'} | {block.head_size if block.head_size is not None else '?'} | "
                     f"{'yes' if block.qk_quantized else 'no'} | {'yes' if block.pv_quantized else 'no'} | "
                     f"{_PV_OUTPUT[block.pv_output_qdq]} | {verdict} |")
    return lines
