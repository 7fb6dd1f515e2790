"""The Q/DQ graph of the bundled, trained model in ONNX Runtime and OpenVINO; determinism;
the calibrate command end to end."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from helpers.quantize_models import (
    CALIB_DIR,
    DIGITS_PT,
    VAL_DIR,
    bundled_model,
    fp32_model,
    run_ort,
    source_for,
)


@functools.lru_cache(maxsize=None)
def _val(which: str):
    _, spec = bundled_model(which)
    src = source_for(spec, limit=None, path=VAL_DIR)
    return next(src.batches(len(src))).images


@functools.lru_cache(maxsize=None)
def _default_graph(which: str) -> bytes:
    import tempfile

    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    path, spec = bundled_model(which)
    with tempfile.TemporaryDirectory() as cache:
        cal = calibrate(path, source_for(spec, limit=None), QuantConfig(), cache_dir=cache)
    return build_qdq(cal).model.SerializeToString()


@pytest.mark.parametrize("which", ["digits", "postnorm"])
def test_default_int8_tracks_fp32_in_onnxruntime_and_openvino(which, tmp_path):
    ov = pytest.importorskip("openvino")
    path, _ = bundled_model(which)
    x = _val(which)
    ref = run_ort(path, x)
    qdq = tmp_path / "model.int8.onnx"
    qdq.write_bytes(_default_graph(which))
    got_ort = run_ort(qdq, x)
    got_ov = ov.Core().compile_model(str(qdq), "CPU").create_infer_request().infer({0: x})[0]
    scale = np.abs(ref).max()
    for got in (got_ort, got_ov):
        assert got.shape == ref.shape
        assert (got.argmax(1) == ref.argmax(1)).mean() >= 0.99
        assert np.abs(got - ref).max() < 0.1 * scale


def test_two_runs_same_seed_give_byte_identical_graphs(tmp_path):
    from vitedge.quantize import QuantConfig, quantize

    path, spec = fp32_model("timm")
    outs = []
    for k in range(2):
        src = source_for(spec, limit=12, seed=3)
        cfg = QuantConfig(method="entropy", smoothquant_alpha=0.5)
        q = quantize(path, src, cfg, tmp_path / f"run{k}.int8.onnx", cache_dir=tmp_path / f"cache{k}")
        assert not q.calibration.reused
        outs.append((tmp_path / f"run{k}.int8.onnx").read_bytes())
    assert outs[0] == outs[1]


def test_uint8_input_graph_calibrates_like_the_float_graph(tmp_path):
    """A graph with the preprocessing baked in (uint8 NHWC frames) gets the same statistics."""
    from vitedge.models.export import ExportOptions, export_onnx
    from vitedge.models.intake import IntakeOptions, load_model
    from vitedge.quantize import QuantConfig, calibrate

    path, spec = fp32_model("timm")
    baked = tmp_path / "baked.onnx"
    export_onnx(load_model(path.with_suffix(".pt"), IntakeOptions(num_heads=3)), baked, ExportOptions(bake_preprocess=True))
    src = source_for(spec, limit=8)
    a = calibrate(path, src, QuantConfig(method="minmax"), cache_dir=tmp_path)
    b = calibrate(baked, src, QuantConfig(method="minmax"), cache_dir=tmp_path)
    assert a.thresholds.keys() == b.thresholds.keys()
    for t in a.thresholds:
        assert b.thresholds[t] == pytest.approx(a.thresholds[t], rel=1e-3)


def test_calibrate_command_caches_and_writes_the_graph(tmp_path, capsys):
    import onnx

    from vitedge.cli.entry import main
    from vitedge.quantize import check_qdq_graph

    if not DIGITS_PT.exists():
        pytest.skip("examples/digits_vit.pt is not in this checkout")
    cache = tmp_path / "cache"
    args = ["calibrate", str(DIGITS_PT), "--calib", str(CALIB_DIR), "--calib-size", "32", "--cache-dir", str(cache), "-q"]
    with pytest.raises(SystemExit) as done:
        main(args + ["-o", str(tmp_path / "a.int8.onnx")])
    assert done.value.code == 0
    first = capsys.readouterr().out
    assert "32 used, 0 skipped, 0 converted" in first and "statistics: computed" in first and "data hash" in first
    with pytest.raises(SystemExit) as done:
        main(args + ["-o", str(tmp_path / "b.int8.onnx")])
    assert done.value.code == 0
    second = capsys.readouterr().out
    assert "reused from the cache" in second and "no forward pass" in second
    assert (tmp_path / "a.int8.onnx").read_bytes() == (tmp_path / "b.int8.onnx").read_bytes()
    assert check_qdq_graph(onnx.load(str(tmp_path / "a.int8.onnx"))) == []
    with pytest.raises(SystemExit) as done:
        main(args + ["-o", str(tmp_path / "a.int8.onnx")])
    assert done.value.code == 2 and "--force" in capsys.readouterr().err
