"""Keep ONNX Runtime from fusing a post-norm block's residual Add into SkipLayerNormalization (issue 47 item 2).

ONNX Runtime's SkipLayerNormFusion (core/optimizer/skip_layer_norm_fusion.cc) turns ``Add -> LayerNormalization``
into ``com.microsoft.SkipLayerNormalization`` when the Add's output is read by that LayerNormalization alone and both
of its inputs have the same static 3-D shape (the batch may be symbolic). In a post-norm block (``x = norm(x +
sublayer(x))``: nn.TransformerEncoder's default, the original ViT of some authors) every residual Add is such an Add;
in a pre-norm block the residual sum is also read by the next residual, so nothing fuses, except the last block's,
which only the final LayerNormalization reads (one Add per pre-norm model).

Measured with ONNX Runtime 1.32 on an AVX2 CPU (one thread, side by side, benchmarks/results/onnx_int8_ceiling_avx2.md):
its CPU SkipLayerNormalization takes 1.2-3x the time of the Add and the LayerNormalization it replaces at batch 1 and
2.2-4.2x at batch 8 on ViT token shapes (17-197 tokens, widths 32-192); in a post-norm corpus ViT whose INT8 graph
got the fusion (its FP32 graph, without static shapes there, did not) it was a fifth of the INT8 graph's time. The
fusion depends on which shapes ONNX Runtime can infer, so the INT8 graph and its FP32 reference need not get it alike.

So the onnx target writes such an Add as ``Sum`` of its two inputs, the same element-wise float addition (identical
outputs), which the fusion does not match, in the INT8 graph and in its FP32 reference alike. Only an Add whose two
inputs are both computed (no constant: a bias Add is not a residual) and whose output only one LayerNormalization reads
(as its input X) and no graph output names is rewritten. The node keeps its name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vitedge.onnxkit.structure import node_index

if TYPE_CHECKING:
    from onnx import ModelProto


def unfuse_skip_norm(model: ModelProto) -> int:
    """Rewrite each residual Add that only a LayerNormalization reads as Sum (in place); returns how many."""
    graph = model.graph
    index = node_index(graph.node)
    constants = {i.name for i in graph.initializer} | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    outputs = {o.name for o in graph.output}
    done = 0
    for n in graph.node:
        if n.op_type != "Add" or n.domain not in ("", "ai.onnx") or len(n.input) != 2 or n.output[0] in outputs:
            continue
        if any(i in constants or not i for i in n.input):
            continue
        readers = index.consumers.get(n.output[0], ())
        if len(readers) != 1:
            continue
        reader, slot = readers[0]
        if reader.op_type != "LayerNormalization" or slot != 0:
            continue
        n.op_type = "Sum"
        done += 1
    return done
