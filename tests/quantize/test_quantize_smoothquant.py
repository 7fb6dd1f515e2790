"""SmoothQuant is a pure graph rewrite: the FP32 function must not change."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.quantize_models import (
    VAL_DIR,
    bundled_model,
    fp32_model,
    run_ort,
    source_for,
)


def _val_images(spec, n=64):
    return next(source_for(spec, limit=n, path=VAL_DIR).batches(n)).images


def _rel_diff(a, b):
    return float(np.abs(a - b).max() / (np.abs(a).max() + 1e-12))


def test_smoothing_scales_formula():
    from vitedge.quantize.smoothquant import S_MAX, S_MIN, smoothing_scales

    x = np.array([4.0, 1.0, 0.0, 9.0, 1e30])
    w = np.array([1.0, 4.0, 2.0, 0.0, 1e-30])
    s = smoothing_scales(x, w, 0.5)
    assert s[0] == pytest.approx(2.0) and s[1] == pytest.approx(0.5)
    assert s[2] == 1.0 and s[3] == 1.0  # a dead channel keeps s = 1
    assert s[4] == S_MAX and S_MIN <= s.min()


def test_fp32_outputs_unchanged_on_the_trained_model(tmp_path):
    """On the bundled, trained digits ViT: smoothed graph == FP32 graph, and the
    rewrite really moved scale (gamma changed, activations flattened)."""
    import onnx

    from vitedge.quantize import QuantConfig, calibrate

    path, spec = bundled_model("digits")
    cal = calibrate(path, source_for(spec, limit=64), QuantConfig(method="minmax", smoothquant_alpha=0.5), cache_dir=tmp_path)
    assert len(cal.smoothing) == 13  # 2 per block x 6 blocks + the final norm before the head
    assert all(not np.allclose(s, 1.0) for s in cal.smoothing.values())
    x = _val_images(spec)
    ref = run_ort(path, x)
    got = run_ort(cal.model, x)
    assert _rel_diff(ref, got) < 1e-4
    assert (ref.argmax(1) == got.argmax(1)).all()
    inits = {t.name for t in cal.model.graph.initializer}
    lns = [n for n in cal.model.graph.node if n.op_type == "LayerNormalization"]
    assert sum("smoothquant" in n.input[1] and n.input[1] in inits for n in lns) == 13
    # SmoothQuant evens out the channels feeding the Linear layers: the largest
    # per-tensor max |x| at its sites shrinks
    plain = calibrate(path, source_for(spec, limit=64), QuantConfig(method="minmax", smoothquant_alpha=None), cache_dir=tmp_path)
    sites = {t for l in cal.layers if l.name in cal.smoothed_layers for t in l.inputs}
    assert sites and max(cal.absmax[t] for t in sites) < max(plain.absmax[t] for t in sites)
    # and the original graph file was not touched
    original = onnx.load(str(path))
    assert all("smoothquant" not in t.name for t in original.graph.initializer)


@pytest.mark.parametrize("name", ["timm", "torchvision", "deit_distilled", "prenorm_encoder", "split_qkv"])
def test_fp32_outputs_unchanged_on_pre_norm_models(name, tmp_path):
    from vitedge.quantize import QuantConfig, calibrate

    path, spec = fp32_model(name)
    cal = calibrate(path, source_for(spec, limit=8), QuantConfig(method="minmax", smoothquant_alpha=0.8), cache_dir=tmp_path)
    assert cal.smoothing
    x = _val_images(spec, 16)
    assert _rel_diff(run_ort(path, x), run_ort(cal.model, x)) < 1e-4


def test_post_norm_shared_layernorms_skip_or_get_an_explicit_mul(tmp_path):
    """Post-norm LayerNorm outputs also feed the residual Add: by default they are not
    smoothed; with smoothquant_shared a per-channel Mul goes in front of the Linear."""
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    path, spec = fp32_model("postnorm")
    x = _val_images(spec, 16)
    ref = run_ort(path, x)
    skip = calibrate(path, source_for(spec, limit=8), QuantConfig(method="minmax", smoothquant_alpha=0.5), cache_dir=tmp_path)
    # only the last LayerNorm (-> class token -> head) feeds nothing but a Linear
    assert len(skip.smoothing) == 1
    assert not any(n.op_type == "Mul" and "smoothquant" in n.name for n in skip.model.graph.node)
    mul = calibrate(path, source_for(spec, limit=8), QuantConfig(method="minmax", smoothquant_alpha=0.5, smoothquant_shared=True),
                    cache_dir=tmp_path)
    assert len(mul.smoothing) == 4  # norm1 -> linear1, norm2 -> next in_proj (x2 blocks, the last feeds the head)
    muls = [n for n in mul.model.graph.node if n.op_type == "Mul" and "smoothquant" in n.name]
    assert len(muls) == 3
    assert _rel_diff(ref, run_ort(mul.model, x)) < 1e-4
    # the Q/DQ goes after the Mul, the residual Add still reads the LayerNorm's own output
    q = build_qdq(mul).model
    qs = {n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear"}
    assert {m.output[0] for m in muls} <= qs
