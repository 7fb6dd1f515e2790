"""Per-layer sensitivity reads the bundle's one FP32 graph: in an onnx bundle the exported graph with the INT8
graph's float rewrites (q/k/v merged, attention cores fused). From it the analysis finds the layers and figures it
finds from the exported graph, also where the INT8 graph quantizes the attention matmuls (its cores then stay
unfused, while the FP32 graph holds them inside MultiHeadAttention)."""

from __future__ import annotations

import pytest
from conftest import CALIB_DIR, VAL_DIR

from vitedge.backends.onnxruntime.backend import _fuse_file, _fuse_reference
from vitedge.bundle.manifest import read_manifest
from vitedge.datasources.sources import open_source
from vitedge.quantize import QuantConfig, quantize
from vitedge.validation.sensitivity import first_inputs, layer_sensitivity


@pytest.mark.parametrize("quantize_attention", [False, True], ids=["float-attention", "int8-attention"])
def test_the_fused_fp32_graph_gives_the_analysis_of_the_exported_one(runtime_bundles, tmp_path, monkeypatch, quantize_attention):
    bundles = runtime_bundles["plain"]
    exported = bundles["intel-cpu"] / "reference.fp32.onnx"  # the exported graph, as the intel-cpu bundle ships it
    pre = read_manifest(bundles["onnx"]).spec.preprocess
    qdq = tmp_path / "qdq.onnx"
    quantize(exported, open_source(CALIB_DIR, pre, limit=32, seed=0), QuantConfig(quantize_attention=quantize_attention), qdq,
             cache_dir=tmp_path / "cache")
    artifact = tmp_path / "model.int8.onnx"  # as the onnx bundle ships it: attention, GEMM biases, patch embedding fused
    fusion = _fuse_file(qdq, artifact)[0]
    assert fusion.fused == (0 if quantize_attention else 6)
    fused = tmp_path / "reference.fp32.onnx"
    assert _fuse_reference(exported, fused).fused == 6  # the FP32 graph fuses every core either way
    x = first_inputs(open_source(VAL_DIR, pre, limit=16, seed=0), 16)
    ran = {name: layer_sensitivity(path, artifact, x, preprocess=pre) for name, path in (("exported", exported), ("fused", fused))}
    layers = {name: {layer.name: layer for layer in r.layers} for name, r in ran.items()}
    assert len(layers["fused"]) == len(layers["exported"]) == (38 if quantize_attention else 26)
    assert set(layers["fused"]) == set(layers["exported"])
    assert sum(layer.kind == "attention_matmul" for layer in layers["fused"].values()) == (12 if quantize_attention else 0)
    for name, layer in layers["exported"].items():
        assert layers["fused"][name].kind == layer.kind
        assert layers["fused"][name].metrics["kl"] == pytest.approx(layer.metrics["kl"], rel=1e-2, abs=1e-9)
    assert ran["fused"].baseline["kl"] == pytest.approx(ran["exported"].baseline["kl"], rel=0.1, abs=1e-8)
    assert not [n for n in ran["fused"].notes if "not in the Q/DQ graph" in n]
    if quantize_attention:  # not vacuous: without taking them from the Q/DQ graph, the fused graph hides those 12 layers
        import vitedge.validation.sensitivity as sensitivity

        monkeypatch.setattr(sensitivity, "_fused_away", lambda gi, found: [])
        assert len(layer_sensitivity(fused, artifact, x[:4], preprocess=pre).layers) == 26

