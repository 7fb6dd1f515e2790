"""Numerics never crash a build (issue 47 item 3): float32 denormal (~1e-41), zero, huge (1e30) weights or
activations in a channel of a small CCT (tests/helpers/cct_vit.py) give a working calibration, built end to end
through the CLI, with every Q/DQ scale of the INT8 graph a normal float32 no smaller than stats.MIN_SCALE; NaN or Inf
weights and activations are refused in one line naming the tensor (exit 2). Never exit 3."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import CALIB_DIR
from helpers.profiles import untimed_onnx_profile
from rel_cli import assert_one_line, cli

from vitedge.quantize.stats import MIN_SCALE

CCT_CLASS = f"{Path(__file__).resolve().parents[1] / 'helpers' / 'cct_vit.py'}:CCT"


def _denormal_qk(sd):  # the crash of the issue: trained query/key projections that are float32 denormals
    for i in range(2):
        w = sd[f"encoder.layers.{i}.self_attn.in_proj_weight"]
        w[:64] = w[:64].sign() * 1e-41
        sd[f"encoder.layers.{i}.self_attn.in_proj_bias"][:64] = 0.0


def _denormal_channel(sd):  # one activation channel of denormals, at a SmoothQuant site and a bias-corrected input
    sd["encoder.layers.0.linear1.weight"][6] *= 1e-39
    sd["encoder.layers.0.linear1.bias"][6] = 1e-41
    sd["norm.weight"][3] = 1e-41
    sd["norm.bias"][3] = 0.0


def _zero_channel(sd):  # all-zero channels: a conv filter, a hidden unit, a LayerNorm output, a weight column
    sd["tokenizer.0.weight"][5] = 0.0
    sd["encoder.layers.0.linear1.weight"][3] = 0.0
    sd["encoder.layers.0.linear1.bias"][3] = 0.0
    sd["encoder.layers.1.self_attn.in_proj_weight"][:, 7] = 0.0
    sd["norm.weight"][4] = 0.0
    sd["norm.bias"][4] = 0.0


def _huge_activation(sd):  # a hidden unit at 1e30 that the next layer ignores (its weight column is zero)
    sd["encoder.layers.0.linear1.bias"][5] = 1e30
    sd["encoder.layers.0.linear2.weight"][:, 5] = 0.0


def _nan_weight(sd):
    sd["encoder.layers.1.linear2.weight"][0, 0] = float("nan")


def _inf_activation(sd):  # finite weights whose product overflows float32: an activation of inf
    sd["encoder.layers.0.linear1.weight"][5] = 1e30
    sd["encoder.layers.0.linear1.bias"][5] = 3e38


def _checkpoint(tmp_path: Path, change) -> Path:
    import sys

    import torch

    sys.path.insert(0, str(Path(CCT_CLASS.rsplit(":", 1)[0]).parent))
    try:
        from cct_vit import CCT
    finally:
        sys.path.pop(0)
    torch.manual_seed(0)
    sd = CCT().eval().state_dict()
    with torch.no_grad():
        change(sd)
    path = tmp_path / "cct.pt"
    torch.save(sd, path)
    return path


def _build(tmp_path: Path, model: Path, *extra):
    return cli("build", model, "--model-class", CCT_CLASS, "--input-size", "32", "32", "-t", untimed_onnx_profile(tmp_path), "--calib", CALIB_DIR,
               "--calib-size", "16", "--no-latency", "-o", tmp_path / "out", "--cache-dir", tmp_path / "cache", "-q", *extra)


def _scales(graph: Path) -> np.ndarray:
    import onnx
    from onnx import numpy_helper

    m = onnx.load(graph)
    inits = {i.name: i for i in m.graph.initializer}
    found = [numpy_helper.to_array(inits[n.input[1]]).ravel() for n in m.graph.node
             if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[1] in inits]
    return np.concatenate(found)


@pytest.mark.parametrize("change,method", [(_denormal_qk, None), (_denormal_qk, "entropy"), (_denormal_channel, None),
                                           (_zero_channel, None), (_huge_activation, None)],
                         ids=["denormal-qk-select", "denormal-qk-entropy", "denormal-channel", "zero-channel", "1e30-activation"])
def test_extreme_values_calibrate(tmp_path, change, method):
    run = _build(tmp_path, _checkpoint(tmp_path, change), *(("--method", method) if method else ()))
    # a working calibration: a bundle and a verdict (exit 1 would be an honest failed gate, never exit 3)
    assert run.code in (0, 1), run.err
    assert "internal error" not in run.err, run.err
    scales = _scales(tmp_path / "out" / "model.int8.onnx")
    assert scales.size and np.all(np.isfinite(scales)), scales
    assert scales.min() >= np.float32(MIN_SCALE), scales.min()  # never 0 nor a denormal: invalid in QuantizeLinear


@pytest.mark.parametrize("change,names", [(_nan_weight, ("encoder.layers.1.linear2.weight", "NaN")),
                                          (_inf_activation, ("not finite", "first in module 'encoder.layers."))], ids=["nan-weight", "inf-activation"])
def test_non_finite_refused_naming_the_tensor(tmp_path, change, names):
    run = _build(tmp_path, _checkpoint(tmp_path, change))
    assert_one_line(run, 2, *names)
    assert not (tmp_path / "out").exists()
