"""GPTQ rounding and bias correction (vitedge.quantize.refine) on the trained digits ViT."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.quantize_models import bundled_model, source_for

CALIB_ITEMS = 32


def _with_outputs(model, names):
    """A copy of ``model`` whose outputs are ``names``."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    m.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names)
    return m


def _run(model, names, x):
    from vitedge.onnxkit.session import ort_session

    sess = ort_session(_with_outputs(model, names).SerializeToString(), threads=2)
    return dict(zip(names, sess.run(names, {sess.get_inputs()[0].name: x})))


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from vitedge.quantize import QuantConfig, calibrate

    path, spec = bundled_model("digits")
    src = source_for(spec, limit=CALIB_ITEMS)
    x = next(src.batches(CALIB_ITEMS)).images
    cache = tmp_path_factory.mktemp("refine-cache")
    cals = {name: calibrate(path, src, QuantConfig(**kw), cache_dir=cache) for name, kw in {
        "rtn": {"bias_correction": False},
        "gptq": {"weight_rounding": "gptq", "bias_correction": False},
        "bias": {"bias_correction": True},
    }.items()}
    return {"path": path, "spec": spec, "src": src, "x": x, "cache": cache, "cals": cals}


def test_config_validates_the_new_settings():
    from vitedge.core.errors import UsageError
    from vitedge.quantize import QuantConfig

    with pytest.raises(UsageError, match="--weight-rounding"):
        QuantConfig(weight_rounding="adaround")
    with pytest.raises(UsageError, match="bias_correction"):
        QuantConfig(bias_correction="yes")
    assert QuantConfig().bias_correction and QuantConfig().refine_params()["weight_range"] == "pairwise"  # measured default
    assert QuantConfig(bias_correction=False).refine_params() is None
    assert "gptq rounding" in QuantConfig(weight_rounding="gptq").describe()


def test_gptq_keeps_the_weight_range_rule_and_lowers_each_layers_output_error(digits):
    from vitedge.quantize.graph import GraphIndex
    from vitedge.quantize.refine import refinable
    from vitedge.quantize.weight_range import PAIR_LIMIT, max_pair_sum, quantize_weight

    cal = digits["cals"]["gptq"]
    layers = refinable(cal.layers)
    assert layers and set(cal.refinement.weights) == {l.name for l in layers}
    gi = GraphIndex(cal.model)
    acts = _run(cal.model, sorted({l.inputs[0] for l in layers}), digits["x"])
    better = 0
    for layer in layers:
        q, scale = cal.refinement.weights[layer.name]
        axis = layer.weight_axis
        assert q.dtype == np.int8 and np.abs(q.astype(int)).max() <= 127
        assert max_pair_sum(q, axis) <= PAIR_LIMIT  # pre-VNNI kernels cannot saturate
        w = np.asarray(gi.value(layer.weight), dtype=np.float64)
        q_rtn, scale_rtn = quantize_weight(w.astype(np.float32), axis, layer.op_type, "pairwise")
        np.testing.assert_array_equal(scale, scale_rtn)  # same scales: only the rounding differs
        shape = [1, 1]
        shape[axis] = -1
        xw = acts[layer.inputs[0]].reshape(-1, w.shape[1 - axis]).astype(np.float64)
        kn = (lambda a: a.T) if axis == 0 else (lambda a: a)
        err_gptq = np.sum((xw @ kn(w) - xw @ kn(q * scale.reshape(shape))) ** 2)
        err_rtn = np.sum((xw @ kn(w) - xw @ kn(q_rtn * scale_rtn.reshape(shape))) ** 2)
        assert err_gptq <= err_rtn * 1.05, layer.name
        better += err_gptq < err_rtn
    assert better >= 0.8 * len(layers)


def test_bias_correction_lowers_the_mean_output_error_of_the_int8_layers(digits):
    from vitedge.quantize import build_qdq
    from vitedge.quantize.graph import GraphIndex
    from vitedge.quantize.qdq import METADATA_KEY

    cal_rtn, cal_bias = digits["cals"]["rtn"], digits["cals"]["bias"]
    fixes = cal_bias.refinement.biases
    assert fixes  # timm's MatMul + Add layers all have a bias
    plain, corrected = build_qdq(cal_rtn), build_qdq(cal_bias)
    meta = json.loads({p.key: p.value for p in corrected.model.metadata_props}[METADATA_KEY])
    assert meta["refined"]["bias_corrected_layers"] == len([n for n in corrected.quantized if n in fixes]) > 0
    gi = GraphIndex(cal_bias.model)
    outs = sorted({gi.nodes_by_name[f.node].output[0] for n, f in fixes.items() if n in corrected.quantized})
    x = digits["x"]
    ref = _run(cal_bias.model, outs, x)
    before, after = _run(plain.model, outs, x), _run(corrected.model, outs, x)

    def mean_error(got):
        return sum(float(np.sum(np.mean((got[t] - ref[t]).reshape(-1, ref[t].shape[-1]), axis=0) ** 2)) for t in outs)

    assert mean_error(after) < 0.85 * mean_error(before)  # measured 0.69: upstream layers add error the local fix does not see
    # the graph changed only in the biases: same weights, same activation scales
    w_plain = {t.name: t for t in plain.model.graph.initializer if t.name.endswith("_quantized")}
    w_corr = {t.name: t for t in corrected.model.graph.initializer if t.name.endswith("_quantized")}
    assert w_plain.keys() == w_corr.keys() and all(w_plain[k] == w_corr[k] for k in w_plain)


def test_refinement_is_cached_with_the_statistics(digits):
    from vitedge.quantize import QuantConfig, calibrate

    again = calibrate(digits["path"], digits["src"], QuantConfig(weight_rounding="gptq", bias_correction=False), cache_dir=digits["cache"])
    assert again.reused and again.forward_passes == 0
    first = digits["cals"]["gptq"].refinement.weights
    assert again.refinement.weights.keys() == first.keys()
    assert all(np.array_equal(again.refinement.weights[k][0], first[k][0]) for k in first)


def test_method_auto_picks_per_tensor_the_candidate_with_the_least_layer_output_error(digits):
    from vitedge.quantize import QuantConfig, calibrate
    from vitedge.quantize.graph import GraphIndex
    from vitedge.quantize.refine import fake_quant, refinable
    from vitedge.quantize.stats import CANDIDATES

    cal = calibrate(digits["path"], digits["src"], QuantConfig(method="auto"), cache_dir=digits["cache"])
    chosen = cal.refinement.chosen
    layers = refinable(cal.layers)
    assert set(chosen) == {l.inputs[0] for l in layers} and set(chosen.values()) <= set(CANDIDATES)
    assert all(cal.thresholds[t] == cal.refinement.thresholds[t] for t in chosen)
    entropy = digits["cals"]["rtn"].thresholds  # same statistics, method entropy
    gi = GraphIndex(cal.model)
    acts = _run(cal.model, sorted(chosen), digits["x"])
    for t in chosen:
        w = np.concatenate([np.asarray(gi.value(l.weight)) if l.weight_axis == 1 else np.asarray(gi.value(l.weight)).T
                            for l in layers if l.inputs[0] == t], axis=1)
        x = acts[t].reshape(-1, w.shape[0])

        def err(th):
            return float(np.sum(np.square((fake_quant(x, th) - x) @ w)))

        assert err(cal.thresholds[t]) <= err(entropy[t]) * (1 + 1e-6), t


def test_smoothquant_search_picks_alphas_from_the_grid_and_keeps_the_fp32_function(digits):
    from vitedge.quantize import QuantConfig, calibrate
    from vitedge.quantize.smooth_search import ALPHA_GRID

    cfg = QuantConfig(smoothquant_search=True)
    assert "alpha per layer" in cfg.describe() and cfg.smoothquant_params()["search"] is True
    cal = calibrate(digits["path"], digits["src"], cfg, cache_dir=digits["cache"])
    fixed = digits["cals"]["rtn"]
    assert cal.smoothing.keys() == fixed.smoothing.keys()
    assert any(not np.allclose(cal.smoothing[n], fixed.smoothing[n]) for n in cal.smoothing)  # some site left 0.5
    x = digits["x"][:8]
    out = _run(cal.model, [cal.model.graph.output[0].name], x)[cal.model.graph.output[0].name]
    ref = _run(fixed.model, [fixed.model.graph.output[0].name], x)[fixed.model.graph.output[0].name]
    assert np.abs(out - ref).max() <= 1e-3 * np.abs(ref).max()
    assert len(ALPHA_GRID) > 1



def test_the_image_input_is_never_clipped_while_activations_are(tmp_path):
    """The patch embedding's input keeps its exact range under the default histogram method:
    preprocessing bounds it, and with ImageNet mean/std the digits' bright strokes are its rare
    extremes, which entropy clipped (benchmarks/results/families.md, SigLIP-MAP)."""
    from helpers.quantize_models import fp32_model

    from vitedge.quantize import QuantConfig, calibrate

    path, spec = fp32_model("timm")  # timm preprocessing: ImageNet mean/std
    cal = calibrate(path, source_for(spec, limit=CALIB_ITEMS), QuantConfig(method="entropy"), cache_dir=tmp_path)
    image = {layer.inputs[0] for layer in cal.layers if layer.kind == "patch_embed"}
    assert image
    for t in image:
        assert cal.thresholds[t] == pytest.approx(cal.absmax[t], rel=1e-6), t
    chosen = calibrate(path, source_for(spec, limit=CALIB_ITEMS), QuantConfig(), cache_dir=tmp_path)  # method select
    assert chosen.config.method == "select" and set(chosen.variants) == {"entropy", "p99.99", "p99.999", "minmax", "mse"}
    for name in chosen.variants:  # every candidate keeps the image's exact range too
        for t in image:
            assert chosen.variants[name].thresholds[t] == pytest.approx(cal.absmax[t], rel=1e-6), (name, t)
    clipped = [t for layer in cal.layers if layer.kind == "linear" for t in layer.inputs[:1]
               if cal.thresholds[t] < 0.999 * cal.absmax[t]]
    assert clipped  # the rule is for the image only: entropy still clips the activations' tails
