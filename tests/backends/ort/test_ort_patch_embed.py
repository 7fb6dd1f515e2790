"""The INT8 patch embedding as a GEMM for the `onnx` target (vitedge.backends.onnxruntime.patch_embed): ONNX Runtime runs
the patch-embedding Conv as a MatMulIntegerToFloat instead of a float Conv over dequantized inputs; the embedding
it computes is the Conv's up to float rounding; the Q/DQ Conv comes back under its name; Convs that are not
patch embeddings are left as they were, with a reason."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from conftest import CALIB_DIR
from onnx import TensorProto, helper, numpy_helper

from vitedge.backends.onnxruntime.attention import fuse_attention
from vitedge.backends.onnxruntime.gemm_bias import fuse_gemm_bias
from vitedge.backends.onnxruntime.patch_embed import fuse_patch_embedding, unfold_patch_embedding
from vitedge.onnxkit.session import SessionSettings, ort_session


@pytest.fixture(scope="module")
def fused_timm(timm_qdq):
    """The Q/DQ graph of the 2-block timm ViT (32x32, patch 8) with attention and GEMM biases fused, as the onnx
    target has it before this rewrite."""
    model = _copy(timm_qdq[0])
    fuse_attention(model)
    fuse_gemm_bias(model)
    return model


def _copy(model):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _conv(model):
    return next(n for n in model.graph.node if n.op_type == "Conv")


def _run(model, x, extra=()):
    m = _copy(model)
    for name in extra:
        m.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    sess = ort_session(m.SerializeToString(), threads=2)
    return sess.run(None, {sess.get_inputs()[0].name: x})


def _optimized_ops(model, tmp_path, name):
    out = tmp_path / f"{name}.optimized.onnx"
    ort_session(model.SerializeToString(), SessionSettings(optimized_model_path=out))
    return collections.Counter(n.op_type for n in onnx.load(str(out)).graph.node)


@pytest.mark.skipif(not CALIB_DIR.is_dir(), reason="calibration/digits is not in this checkout")
def test_the_patch_embedding_runs_as_an_int8_gemm_and_computes_the_convs_embedding(fused_timm, tmp_path):
    plain = fused_timm
    conv = _conv(plain)
    embedding = conv.output[0]
    gemm = _copy(plain)
    report = fuse_patch_embedding(gemm)
    assert (report.convs, report.folded, report.skipped) == (1, 1, ())
    assert "1 of 1 INT8 Convs" in report.one_line()
    onnx.checker.check_model(gemm)
    assert not [n for n in gemm.graph.node if n.op_type == "Conv"]
    assert [n.name for n in gemm.graph.node if n.op_type == "MatMulIntegerToFloat" and n.name.startswith(conv.name)] == [f"{conv.name}/as_gemm"]

    before, after = _optimized_ops(plain, tmp_path, "plain"), _optimized_ops(gemm, tmp_path, "gemm")
    # what ONNX Runtime runs: one more INT8 GEMM, no float Conv, and the image and weight no longer dequantized
    assert (before["Conv"], after["Conv"]) == (1, 0)
    assert after["MatMulIntegerToFloat"] == before["MatMulIntegerToFloat"] + 1
    assert after["DequantizeLinear"] == before["DequantizeLinear"] - 2, (before, after)
    for b in (1, 3):
        x = np.random.default_rng(b).standard_normal((b, 3, 32, 32)).astype(np.float32)
        (ref, ref_embedding), (got, got_embedding) = _run(plain, x, [embedding]), _run(gemm, x, [embedding])
        peak = float(np.max(np.abs(ref_embedding)))
        # integer products summed exactly against float32 sums of dequantized products: float rounding apart
        assert peak > 0 and got_embedding.shape == ref_embedding.shape
        assert float(np.max(np.abs(got_embedding - ref_embedding))) <= 1e-5 * peak, f"batch {b}"
        assert got.shape == ref.shape
    assert fuse_patch_embedding(gemm).convs == 0  # nothing left to find


@pytest.mark.skipif(not CALIB_DIR.is_dir(), reason="calibration/digits is not in this checkout")
def test_unfold_gives_back_the_qdq_conv_under_its_name(fused_timm):
    """Per-layer sensitivity finds the patch embedding as DequantizeLinear -> Conv by its node name."""
    plain = fused_timm
    name = _conv(plain).name
    back = _copy(plain)
    fuse_patch_embedding(back)
    assert unfold_patch_embedding(back) == 1
    conv = _conv(back)
    prod = {o: n for n in back.graph.node for o in n.output}
    assert conv.name == name and all(prod[i].op_type == "DequantizeLinear" for i in conv.input[:2])
    w_back = numpy_helper.to_array(next(t for t in back.graph.initializer if t.name == prod[conv.input[1]].input[0]))
    w_plain_name = {o: n for n in plain.graph.node for o in n.output}[_conv(plain).input[1]].input[0]
    w_plain = numpy_helper.to_array(next(t for t in plain.graph.initializer if t.name == w_plain_name))
    assert w_back.dtype == w_plain.dtype and np.array_equal(w_back, w_plain)
    x = np.random.default_rng(5).standard_normal((2, 3, 32, 32)).astype(np.float32)
    # the same Conv on the same real values (the image is uint8 now, shifted by 128 with its zero point)
    assert np.array_equal(_run(back, x)[0], _run(plain, x)[0])


def _hand_made(*, kernel=4, stride=4, pads=(0, 0, 0, 0), size=(8, 8), bias=True, per_channel=True, shared_dq=False, baked=False):
    """x (N, 2, H, W) -> Q -> DQ, W_q (3, 2, k, k) -> DQ, Conv -> y. ``baked``: the graph takes uint8 frames
    (N, H, W, 2) and makes x itself, as ``--bake-preprocess`` exports do (Cast, Transpose, Mul, Add; no shape
    declared for x)."""
    rng = np.random.default_rng(0)
    w = rng.integers(-60, 61, (3, 2, kernel, kernel)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "w_q"),
             numpy_helper.from_array(np.array([0.02, 0.03, 0.05], np.float32) if per_channel else np.array(0.02, np.float32), "w_s"),
             numpy_helper.from_array(np.zeros(3, np.int8) if per_channel else np.array(0, np.int8), "w_z"),
             numpy_helper.from_array(np.array(0.03, np.float32), "x_s"),
             numpy_helper.from_array(np.array(0, np.int8), "x_z"),
             numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_s", "x_z"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "x_s", "x_z"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "w_s", "w_z"], ["w_dq"], **({"axis": 0} if per_channel else {})),
             helper.make_node("Conv", ["x_dq", "w_dq"] + (["b"] if bias else []), ["y"], name="patch", kernel_shape=[kernel, kernel],
                              strides=[stride, stride], pads=list(pads))]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if shared_dq:
        nodes.append(helper.make_node("Relu", ["x_dq"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    graph_input = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, *size])
    if baked:
        inits += [numpy_helper.from_array(np.full((1, 2, 1, 1), 1 / 64, np.float32), "scale"),
                  numpy_helper.from_array(np.array([-1.9, -2.1], np.float32).reshape(1, 2, 1, 1), "shift")]
        nodes[:0] = [helper.make_node("Cast", ["frames"], ["f"], to=TensorProto.FLOAT),
                     helper.make_node("Transpose", ["f"], ["nchw"], perm=[0, 3, 1, 2]),
                     helper.make_node("Mul", ["nchw", "scale"], ["scaled"]),
                     helper.make_node("Add", ["scaled", "shift"], ["x"])]
        graph_input = helper.make_tensor_value_info("frames", TensorProto.UINT8, ["n", *size, 2])
    graph = helper.make_graph(nodes, "g", [graph_input], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _image(rng, batch, baked):
    if baked:
        return rng.integers(0, 256, (batch, 8, 8, 2)).astype(np.uint8)
    return rng.standard_normal((batch, 2, 8, 8)).astype(np.float32)


@pytest.mark.parametrize("bias, per_channel, baked", [(True, True, False), (False, True, False), (True, False, False), (True, True, True)])
def test_hand_made_patch_embedding_matches_the_conv(bias, per_channel, baked):
    model = _hand_made(bias=bias, per_channel=per_channel, baked=baked)
    gemm = _copy(model)
    assert fuse_patch_embedding(gemm).folded == 1
    for b in (1, 2):
        x = _image(np.random.default_rng(b), b, baked)
        ref, got = _run(model, x)[0], _run(gemm, x)[0]
        assert ref.shape == got.shape == (b, 3, 2, 2)
        assert float(np.max(np.abs(ref))) > 0 and float(np.max(np.abs(got - ref))) <= 1e-5 * float(np.max(np.abs(ref)))
    back = _copy(gemm)
    assert unfold_patch_embedding(back) == 1
    x = _image(np.random.default_rng(7), 2, baked)
    assert np.array_equal(_run(back, x)[0], _run(model, x)[0])


@pytest.mark.parametrize("kind, reason", [
    ("overlapping", "not a patch embedding"),
    ("padded", "not a patch embedding"),
    ("dynamic_size", "not fixed in the graph"),
    ("ragged", "not a multiple of the patch size"),
    ("shared_dq", "other readers"),
])
def test_convs_that_are_not_patch_embeddings_are_left_alone(kind, reason):
    model = {"overlapping": lambda: _hand_made(stride=2),
             "padded": lambda: _hand_made(pads=(1, 1, 1, 1)),
             "dynamic_size": lambda: _hand_made(size=("h", "w")),
             "ragged": lambda: _hand_made(size=(10, 8)),
             "shared_dq": lambda: _hand_made(shared_dq=True)}[kind]()
    gemm = _copy(model)
    report = fuse_patch_embedding(gemm)
    assert (report.convs, report.folded) == (1, 0)
    assert report.skipped[0].startswith("patch: ") and reason in report.skipped[0], report.skipped
    assert gemm == model
