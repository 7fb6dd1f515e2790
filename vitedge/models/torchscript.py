"""A TorchScript module as a torch.export program with a dynamic batch, for the ONNX export.

A TorchScript file keeps no tensor shapes, and a scripted ViT often holds what neither ONNX exporter takes:
a list comprehension over ``chunk`` (a ``prim::Loop`` whose results have unknown rank: "ONNX export of
transpose for tensor of unknown rank"), or nn.MultiheadAttention's scripted fast-path checks
(``aten::is_autocast_enabled`` under a ``prim::If``, which torch's TorchScript-to-torch.export converter
refuses too). Running the module is what resolves both: every loop and branch is decided by the input.

So the module is run twice under ``make_fx`` (real tensors; grad on, so the scripted attention keeps the
plain ops instead of its fused kernel), at batch 2 and batch 3. A traced nn.MultiheadAttention calls the
fused CPU attention kernel (``_scaled_dot_product_flash_attention_for_cpu``), or, traced on its fast path
(eval, no_grad, batch first), ``_native_multi_head_attention`` / ``_transformer_encoder_layer_fwd``; every
traced conv is ``aten._convolution``. None has an ONNX function: the record decomposes them into plain ops
(models/fused_ops.py). ``detach`` and ``alias`` are dropped (inference; TorchScript's
profiling executor adds detaches on its second run only). Both records must be the same aten ops; an
integer argument that differs between them must be 2k at batch 2 and 3k at batch 3 (the batch times k, as
in a reshape to ``[B * heads, N, d]``) and becomes ``k * input.size(0)``; anything else that depends on the
batch (a constant tensor, a float) refuses. The batch-2 record so rewritten is exported by torch.export with
a dynamic batch; the caller's parity check then compares the ONNX graph with the TorchScript module itself.
"""

from __future__ import annotations

import operator

from vitedge.models.fused_ops import decompositions

_BATCHES = (2, 3)


class NotBatchGeneric(Exception):
    """The module's two records differ in a way a dynamic batch cannot express."""


def dynamic_batch_program(module, shape: tuple[int, int, int]):
    """An ExportedProgram of ``module`` (a TorchScript module) taking ``(batch, *shape)`` inputs."""
    import torch

    examples = [torch.randn(b, *shape, generator=torch.Generator().manual_seed(b)) for b in _BATCHES]
    first, second = (_record(module, x) for x in examples)
    _rewrite_batch(first, second)
    return torch.export.export(first, (examples[0],), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=4096)},))


def _record(module, x):
    """The aten ops ``module(x)`` runs, as an fx GraphModule (integers read from tensors are kept as values)."""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.enable_grad():
        gm = make_fx(lambda t: module(t), decomposition_table=decompositions(), tracing_mode="real",
                     _error_on_data_dependent_ops=False)(x)
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in (torch.ops.aten.alias.default, torch.ops.aten.detach.default):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    return gm


def _calls(gm) -> list:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def _rewrite_batch(first, second) -> None:
    """Make ``first`` (recorded at batch 2) read the batch from its input where ``second`` (batch 3) shows
    an argument depends on it; refuse what cannot be expressed that way."""
    import torch

    calls, others = _calls(first), _calls(second)
    if len(calls) != len(others) or any(a.target != b.target for a, b in zip(calls, others)):
        raise NotBatchGeneric("it runs different operations at batch 2 and batch 3")
    _same_constants(first, second, calls, others)
    graph = first.graph
    placeholder = next(n for n in graph.nodes if n.op == "placeholder")
    with graph.inserting_after(placeholder):
        size = graph.call_function(torch.ops.aten.sym_size.int, (placeholder, 0))
    multiples: dict[int, object] = {1: size}

    def scaled(k: int):
        if k not in multiples:
            with graph.inserting_after(size):
                multiples[k] = graph.call_function(operator.mul, (size, k))
        return multiples[k]

    for a, b in zip(calls, others):
        a.args = _merge(a.args, b.args, scaled)
        a.kwargs = {key: _merge(v, b.kwargs.get(key), scaled) for key, v in a.kwargs.items()}
    graph.lint()
    first.recompile()


def _same_constants(first, second, calls, others) -> None:
    import torch
    import torch.utils._pytree as pytree

    for a, b in zip(calls, others):
        for u, v in zip(pytree.tree_leaves((a.args, a.kwargs)), pytree.tree_leaves((b.args, b.kwargs))):
            if isinstance(u, torch.fx.Node) and u.op == "get_attr" and isinstance(v, torch.fx.Node):
                x, y = getattr(first, u.target), getattr(second, v.target)
                if x.shape != y.shape or not torch.equal(x, y):
                    raise NotBatchGeneric(f"a constant tensor ({u.target}) depends on the batch size")


def _merge(a, b, scaled):
    """``a`` (batch 2) with every integer that scales with the batch replaced by ``scaled(k)``."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return type(a)(_merge(u, v, scaled) for u, v in zip(a, b))
    if a == b or isinstance(a, bool) or not isinstance(a, (int, float)):
        return a
    if isinstance(a, int) and isinstance(b, int) and not isinstance(b, bool) and a % 2 == 0 and a // 2 * 3 == b:
        return scaled(a // 2)
    raise NotBatchGeneric(f"a value is {a} at batch 2 and {b} at batch 3, not in proportion to the batch")
