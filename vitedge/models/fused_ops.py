"""Plain-op forms of the fused kernels a traced ViT may call, for recording it (models/torchscript.py).

A TorchScript trace keeps the kernel the eager run took. None of these has an ONNX function, and torch has no
decomposition for the two fast-path ones (nn.MultiheadAttention and nn.TransformerEncoderLayer in eval mode
under ``no_grad``, batch first), so they are written here from their documented meaning: the same linear
projections, per-head softmax(q k^T / sqrt(d)) v, output projection, layer norms and feed-forward. Attention
masks are refused (a ViT classifier has none); the parity check compares the result with the module.
"""

from __future__ import annotations


def decompositions() -> dict:
    """aten op -> a function of plain ops, for ``make_fx(decomposition_table=...)``."""
    import torch
    from torch._decomp import get_decompositions

    aten = torch.ops.aten
    table = get_decompositions([aten._scaled_dot_product_flash_attention_for_cpu, aten.scaled_dot_product_attention])
    table[aten._convolution.default] = _convolution  # what a trace records for every nn.Conv2d
    table[aten._native_multi_head_attention.default] = _native_multi_head_attention
    table[aten._transformer_encoder_layer_fwd.default] = _transformer_encoder_layer_fwd
    return table


class MaskedFastPath(Exception):
    """A fused attention op with a mask: not written here."""


def _convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups, *_backend_flags):
    """aten._convolution as aten.convolution: the same arguments less the backend flags."""
    import torch

    return torch.ops.aten.convolution.default(x, weight, bias, stride, padding, dilation, transposed, output_padding,
                                              groups)


def _native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight,
                                 proj_bias, mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
    import torch
    import torch.nn.functional as F

    if mask is not None:
        raise MaskedFastPath("a fused multi-head attention with a mask")
    wq, wk, wv = qkv_weight.chunk(3)
    bq, bk, bv = qkv_bias.chunk(3)
    batch, d = query.shape[0], embed_dim // num_head

    def heads(t, w, b):  # (B, L, E) -> (B, heads, L, d)
        return F.linear(t, w, b).reshape(batch, t.shape[1], num_head, d).transpose(1, 2)

    q, k, v = heads(query, wq, bq), heads(key, wk, bk), heads(value, wv, bv)
    attn = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * (d ** -0.5), dim=-1)
    out = torch.matmul(attn, v).transpose(1, 2).reshape(batch, query.shape[1], embed_dim)
    weights = (attn.mean(1) if average_attn_weights else attn) if need_weights else query.new_empty(0)
    return F.linear(out, proj_weight, proj_bias), weights


def _transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu,
                                   norm_first, eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                                   ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2, mask=None, mask_type=None):
    import torch.nn.functional as F

    if mask is not None:
        raise MaskedFastPath("a fused transformer encoder layer with a mask")

    def attention(x):
        return _native_multi_head_attention(x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight,
                                            proj_bias, need_weights=False)[0]

    def feed_forward(x):
        hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(hidden) if use_gelu else F.relu(hidden), ffn_weight_2, ffn_bias_2)

    def norm1(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_1, norm_bias_1, eps)

    def norm2(x):
        return F.layer_norm(x, (embed_dim,), norm_weight_2, norm_bias_2, eps)

    if norm_first:
        x = src + attention(norm1(src))
        return x + feed_forward(norm2(x))
    x = norm1(src + attention(src))
    return norm2(x + feed_forward(x))
