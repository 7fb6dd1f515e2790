"""Q/DQ placement on small real ViTs of every shape vitedge meets (random weights); the models
come from tests/helpers/quantize_models.py."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from helpers.quantize_models import MODELS, fp32_model, graph_io, run_ort, source_for

# --------------------------------------------------------------------------- placement tests

EXPECTED = {
    # name: (linear, patch_embed, head, attention_matmul)
    "timm": (8, 1, 1, 4),
    "torchvision": (8, 1, 1, 4),
    "deit_distilled": (8, 1, 2, 4),
    "prenorm_encoder": (8, 1, 1, 4),
    "postnorm": (8, 1, 1, 4),  # patch embedding is a Linear on unfolded patches here
    "split_qkv": (8, 1, 1, 4),  # q, k and v merged into one GEMM per block (vitedge/quantize/merge.py)
}
LAYER_OPS = {"MatMul", "Gemm", "Conv"}
FLOAT_ONLY = {"LayerNormalization", "Softmax", "Add", "Erf", "Div", "Mul", "Sub", "Pow", "Sqrt", "ReduceMean"}


@pytest.fixture(scope="module")
def calibrations(tmp_path_factory):
    from vitedge.quantize import QuantConfig, calibrate

    cache = tmp_path_factory.mktemp("cache")
    out = {}
    for name in MODELS:
        path, spec = fp32_model(name)
        out[name] = calibrate(path, source_for(spec), QuantConfig(method="minmax", quantize_attention=True), cache_dir=cache)
    return out


@pytest.mark.parametrize("name", MODELS)
def test_layer_kinds_come_from_structure(name, calibrations):
    cal = calibrations[name]
    kinds = collections.Counter(l.kind for l in cal.layers)
    linear, patch, head, attn = EXPECTED[name]
    assert (kinds["linear"], kinds["patch_embed"], kinds["head"], kinds["attention_matmul"]) == (linear, patch, head, attn), kinds
    for layer in cal.layers:
        assert layer.name and layer.op_type in LAYER_OPS
        if layer.kind == "attention_matmul":
            assert layer.weight is None and len(layer.inputs) == 2
        else:
            assert layer.weight is not None and len(layer.inputs) == 1 and layer.channels > 0
            expected_axis = 0 if layer.op_type in ("Conv",) or (layer.op_type == "Gemm") else 1
            assert layer.weight_axis == expected_axis


@pytest.mark.parametrize("name", MODELS)
def test_qdq_only_feeds_layers_and_residual_stream_stays_float(name, calibrations):
    from vitedge.quantize import build_qdq, check_qdq_graph

    cal = calibrations[name]
    q = build_qdq(cal)  # quantize_attention=True in this calibration
    m = q.model
    assert check_qdq_graph(m) == []
    producer, consumers = graph_io(m)
    inits = {t.name: t for t in m.graph.initializer}
    dq_outputs = {n.output[0] for n in m.graph.node if n.op_type == "DequantizeLinear"}
    # every DQ output is read only by a quantized layer: never by LayerNorm, Softmax, GELU (Erf), Add
    for t in dq_outputs:
        for c in consumers[t]:
            assert c.op_type in LAYER_OPS, f"{c.op_type} {c.name} reads dequantized {t}"
    nodes = {n.name: n for n in m.graph.node}
    for layer in cal.layers:
        node = nodes[layer.name]
        n_inputs = 2 if layer.kind == "attention_matmul" else 1
        for i in range(n_inputs):
            dq = producer[node.input[i]]
            assert dq.op_type == "DequantizeLinear"
            assert producer[dq.input[0]].op_type == "QuantizeLinear"
        if layer.weight is not None:
            dq = producer[node.input[1]]
            assert dq.op_type == "DequantizeLinear" and inits[dq.input[0]].data_type == 3  # INT8 initializer
    for n in m.graph.node:
        if n.op_type in FLOAT_ONLY:
            for i in n.input:
                assert i not in dq_outputs, f"{n.op_type} {n.name} reads a dequantized tensor"
    # one Q per distinct activation tensor, however many layers read it
    acts = {t for l in cal.layers for t in l.inputs}
    qs = [n for n in m.graph.node if n.op_type == "QuantizeLinear"]
    assert len(qs) == len(acts) == len({n.input[0] for n in qs})


def test_split_qkv_is_one_gemm_with_its_own_qdq_pair(calibrations):
    """Separate q/k/v layers reading one LayerNorm output are merged into one GEMM before quantization: its
    activation DequantizeLinear feeds that GEMM alone (ONNX Runtime runs a MatMul in float when its
    DequantizeLinear has a second reader), and a Split gives back q, k and v under their tensor names."""
    from vitedge.quantize import build_qdq

    cal = calibrations["split_qkv"]
    m = build_qdq(cal).model
    _, consumers = graph_io(m)
    fan = [len([c for c in consumers[n.output[0]] if c.op_type == "MatMul"]) for n in m.graph.node if n.op_type == "DequantizeLinear"]
    assert max(fan) == 1
    merged = [l for l in cal.layers if l.name.endswith("/merged")]
    assert len(merged) == 2 and len({l.channels for l in merged}) == 1
    splits = [n for n in m.graph.node if n.op_type == "Split" and len(n.output) == 3]
    assert len(splits) >= 2


@pytest.mark.parametrize("name", MODELS)
def test_attention_matmuls_follow_the_switch(name, calibrations):
    import dataclasses

    from vitedge.quantize import QuantConfig, build_qdq

    cal = calibrations[name]  # calibrated with quantize_attention=True
    off = dataclasses.replace(cal, config=QuantConfig(method="minmax", quantize_attention=False))
    assert build_qdq(off, quantize_attention=True).layer_kinds()["attention_matmul"][0] == 4
    q = build_qdq(cal, quantize_attention=False)
    assert build_qdq(off).quantized == q.quantized
    producer, _ = graph_io(q.model)
    nodes = {n.name: n for n in q.model.graph.node}
    attn = [l for l in cal.layers if l.kind == "attention_matmul"]
    assert attn and all(l.name in q.kept_float for l in attn)
    for layer in attn:
        for i in nodes[layer.name].input:
            assert producer.get(i) is None or producer[i].op_type != "DequantizeLinear"
    assert q.layer_kinds()["attention_matmul"] == (0, len(attn))


@pytest.mark.parametrize("name", MODELS)
def test_qdq_graph_runs_and_tracks_fp32(name, calibrations):
    from vitedge.quantize import build_qdq

    path, spec = fp32_model(name)
    x = next(source_for(spec, limit=8).batches(8)).images
    ref = run_ort(path, x)
    got = run_ort(build_qdq(calibrations[name], keep_float="attention_matmul").model, x)
    assert got.shape == ref.shape
    err = np.abs(got - ref).max() / (np.abs(ref).max() + 1e-6)
    assert err < 0.15, err


def test_placement_ignores_names(calibrations, tmp_path):
    """Rename every node and tensor: the same layers are found, of the same kinds."""
    import onnx

    from vitedge.quantize import QuantConfig, calibrate

    path, spec = fp32_model("timm")
    m = onnx.load(str(path))
    keep = {i.name for i in m.graph.input} | {o.name for o in m.graph.output}
    mapping: dict[str, str] = {}

    def rename(t: str) -> str:
        if not t or t in keep:
            return t
        return mapping.setdefault(t, f"t{len(mapping)}")

    for init in m.graph.initializer:
        init.name = rename(init.name)
    for k, n in enumerate(m.graph.node):
        n.name = f"n{k}"
        n.input[:] = [rename(i) for i in n.input]
        n.output[:] = [rename(o) for o in n.output]
    for vi in m.graph.value_info:
        vi.name = rename(vi.name)
    anon = tmp_path / "anon.onnx"
    onnx.save(m, str(anon))
    cal = calibrate(anon, source_for(spec), QuantConfig(method="minmax", quantize_attention=True), cache_dir=tmp_path / "c")
    before = [l.kind for l in calibrations["timm"].layers]
    assert [l.kind for l in cal.layers] == before
    assert all(l.name.startswith("n") for l in cal.layers)


def test_weights_are_int8_per_output_channel_and_the_file_shrinks(calibrations, tmp_path):
    import onnx
    from onnx import numpy_helper

    from vitedge.quantize import build_qdq
    from vitedge.quantize.weight_range import max_pair_sum

    path, _ = fp32_model("timm")
    q = build_qdq(calibrations["timm"])
    out = q.save(tmp_path / "m.int8.onnx")
    assert out.stat().st_size < 0.46 * path.stat().st_size  # INT8 weights: ~1/4 of FP32, plus scales and metadata
    m = onnx.load(str(out))
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    nodes = {n.name: n for n in m.graph.node}
    producer, _ = graph_io(m)
    for layer in q.layers:
        if layer.weight is None:
            continue
        dq = producer[nodes[layer.name].input[1]]
        w, scale, zp = (inits[i] for i in dq.input)
        axis = next(a.i for a in dq.attribute if a.name == "axis")
        assert w.dtype == np.int8 and zp.dtype == np.int8 and not zp.any()
        assert axis == layer.weight_axis and scale.shape == (layer.channels,) and w.shape[axis] == layer.channels
        # the default weight range (vitedge.quantize.weight_range "pairwise"): no pair a CPU kernel
        # adds in int16 sums past 128 (no saturation on pre-VNNI x86), and the binding bound is reached
        pairs = max_pair_sum(w, axis)
        assert pairs <= 128 and (np.abs(w).max() == 127 or pairs >= 126)


def test_keep_float_by_name_kind_and_pattern_without_recalibrating(calibrations):
    from vitedge.core.errors import UsageError
    from vitedge.quantize import build_qdq

    cal = calibrations["timm"]
    head = next(l for l in cal.layers if l.kind == "head")
    by_name = build_qdq(cal, keep_float=[head.name])
    assert head.name in by_name.kept_float and head.name not in by_name.quantized
    by_kind = build_qdq(cal, keep_float={"head", "patch_embed"})
    assert {l.kind for l in cal.layers if l.name in by_kind.kept_float} == {"head", "patch_embed"}
    by_pattern = build_qdq(cal, keep_float=("*/mlp/*",))
    assert sum(1 for n in by_pattern.kept_float if "/mlp/" in n) == 4
    assert all(q.calibration is cal for q in (by_name, by_kind, by_pattern))
    with pytest.raises(UsageError, match="matches no quantizable layer"):
        build_qdq(cal, keep_float=["no/such/node"])
    with pytest.raises(UsageError):
        build_qdq(cal, keep_float=[""])


def test_metadata_keeps_spec_and_records_the_quantizer(calibrations):
    import json

    import onnx

    from vitedge.onnxkit.metadata import INPUT_FORMAT_KEY, SPEC_KEY, get_metadata
    from vitedge.quantize import METADATA_KEY, build_qdq

    path, _ = fp32_model("deit_distilled")
    fp32_meta = get_metadata(onnx.load(str(path)))
    meta = get_metadata(build_qdq(calibrations["deit_distilled"]).model)
    assert meta[SPEC_KEY] == fp32_meta[SPEC_KEY] and meta[INPUT_FORMAT_KEY] == fp32_meta[INPUT_FORMAT_KEY]
    info = json.loads(meta[METADATA_KEY])
    assert info["config"]["method"] == "minmax"
    assert info["calibration"]["used"] == 16 and info["calibration"]["data_hash"]
    assert info["quantized_layers"] == 15 and info["layers"] == 15
