"""The calibration cache: hits run no forward pass, every key part invalidates, corrupt
entries are rewritten, and writes are atomic."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.quantize_models import fp32_model, source_for

from vitedge.quantize import QuantConfig, calibrate

BASE = dict(method="percentile", percentile=99.9, smoothquant_alpha=0.5)


def _model():
    return fp32_model("timm")


def test_second_run_loads_without_forward_passes(tmp_path):
    path, spec = _model()
    src = source_for(spec, limit=8)
    first = calibrate(path, src, QuantConfig(**BASE), cache_dir=tmp_path)
    assert not first.reused and first.forward_passes == 1  # 1 batch, one pass (statistics and bias correction together)
    assert first.cache_path is not None and first.cache_path.is_file()
    second = calibrate(path, src, QuantConfig(**BASE), cache_dir=tmp_path)
    assert second.reused and second.forward_passes == 0
    assert second.key == first.key and second.cache_path == first.cache_path
    assert second.thresholds == first.thresholds and second.absmax == first.absmax
    assert second.smoothing.keys() == first.smoothing.keys()
    assert all(np.array_equal(second.smoothing[k], first.smoothing[k]) for k in first.smoothing)
    assert [l.name for l in second.layers] == [l.name for l in first.layers]
    # nothing half-written is left beside the entry
    assert [p.name for p in (tmp_path / "calibration").iterdir()] == [first.cache_path.name]


def test_hit_gives_the_same_graph_bytes(tmp_path):
    from vitedge.quantize import build_qdq

    path, spec = _model()
    src = source_for(spec, limit=8)
    a = build_qdq(calibrate(path, src, QuantConfig(**BASE), cache_dir=tmp_path)).model.SerializeToString()
    b = build_qdq(calibrate(path, src, QuantConfig(**BASE), cache_dir=tmp_path)).model.SerializeToString()
    assert a == b


@pytest.mark.parametrize("change", [
    {"method": "mse", "percentile": 99.99},
    {"percentile": 99.5},
    {"num_bins": 1024},
    {"smoothquant_alpha": 0.6},
    {"smoothquant_alpha": None},
    {"smoothquant_shared": True},
])
def test_each_setting_in_the_key_recalibrates(change, tmp_path):
    path, spec = _model()
    src = source_for(spec, limit=8)
    base = calibrate(path, src, QuantConfig(**BASE), cache_dir=tmp_path)
    other = calibrate(path, src, QuantConfig(**{**BASE, **change}), cache_dir=tmp_path)
    assert not other.reused and other.forward_passes > 0 and other.key != base.key
    again = calibrate(path, src, QuantConfig(**BASE), cache_dir=tmp_path)
    assert again.reused  # the first entry is still there


def test_attention_switch_is_not_in_the_key(tmp_path):
    """Statistics cover the attention matmuls either way: switching needs no calibration."""
    path, spec = _model()
    src = source_for(spec, limit=8)
    calibrate(path, src, QuantConfig(**BASE, quantize_attention=False), cache_dir=tmp_path)
    assert calibrate(path, src, QuantConfig(**BASE, quantize_attention=True), cache_dir=tmp_path).reused


def test_data_change_recalibrates(tmp_path):
    path, spec = _model()
    calibrate(path, source_for(spec, limit=8, seed=0), QuantConfig(**BASE), cache_dir=tmp_path)
    other = calibrate(path, source_for(spec, limit=8, seed=1), QuantConfig(**BASE), cache_dir=tmp_path)
    assert not other.reused
    more = calibrate(path, source_for(spec, limit=9, seed=0), QuantConfig(**BASE), cache_dir=tmp_path)
    assert not more.reused


def test_model_change_recalibrates(tmp_path):
    import onnx

    path, spec = _model()
    src = source_for(spec, limit=8)
    calibrate(path, src, QuantConfig(**BASE), cache_dir=tmp_path)
    m = onnx.load(str(path))
    w = next(t for t in m.graph.initializer if len(t.dims) == 2)
    from onnx import numpy_helper

    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 1.01, w.name))
    changed = tmp_path / "changed.onnx"
    onnx.save(m, str(changed))
    assert not calibrate(changed, src, QuantConfig(**BASE), cache_dir=tmp_path).reused


def test_preprocess_change_recalibrates(tmp_path):
    import onnx

    from vitedge.onnxkit.metadata import SPEC_KEY, get_metadata, set_metadata

    path, spec = _model()
    src = source_for(spec, limit=8)
    base = calibrate(path, src, QuantConfig(**BASE), cache_dir=tmp_path)
    m = onnx.load(str(path))
    d = json.loads(get_metadata(m)[SPEC_KEY])
    d["preprocess"]["interpolation"] = "nearest"
    set_metadata(m, {SPEC_KEY: json.dumps(d)})
    other = tmp_path / "other_preprocess.onnx"
    onnx.save(m, str(other))
    cal = calibrate(other, src, QuantConfig(**BASE), cache_dir=tmp_path)
    assert not cal.reused and cal.key != base.key


def test_quantizer_version_change_recalibrates(tmp_path, monkeypatch):
    import importlib

    calmod = importlib.import_module("vitedge.quantize.calibrate")  # the module, not the function

    path, spec = _model()
    src = source_for(spec, limit=8)
    calibrate(path, src, QuantConfig(**BASE), cache_dir=tmp_path)
    monkeypatch.setattr(calmod, "QUANTIZER_VERSION", "999-test")
    assert not calibrate(path, src, QuantConfig(**BASE), cache_dir=tmp_path).reused


@pytest.mark.parametrize("damage", ["garbage", "truncate", "empty", "wrong_key"])
def test_corrupt_entry_is_ignored_and_rewritten(damage, tmp_path):
    path, spec = _model()
    src = source_for(spec, limit=8)
    first = calibrate(path, src, QuantConfig(**BASE), cache_dir=tmp_path)
    entry = first.cache_path
    data = entry.read_bytes()
    if damage == "garbage":
        entry.write_bytes(b"not a cache entry at all")
    elif damage == "truncate":
        entry.write_bytes(data[: len(data) // 2])
    elif damage == "empty":
        entry.write_bytes(b"")
    else:  # a valid file stored under the wrong name
        other = calibrate(path, src, QuantConfig(**{**BASE, "percentile": 99.0}), cache_dir=tmp_path)
        entry.write_bytes(other.cache_path.read_bytes())
    again = calibrate(path, src, QuantConfig(**BASE), cache_dir=tmp_path)
    assert not again.reused and again.forward_passes > 0
    assert again.thresholds == first.thresholds
    assert calibrate(path, src, QuantConfig(**BASE), cache_dir=tmp_path).reused  # rewritten, readable


def test_default_dir_from_environment(tmp_path, monkeypatch):
    from vitedge.quantize.cache import default_cache_dir

    monkeypatch.setenv("VITEDGE_CACHE_DIR", str(tmp_path / "env-cache"))
    assert default_cache_dir() == tmp_path / "env-cache"
    path, spec = _model()
    cal = calibrate(path, source_for(spec, limit=8), QuantConfig(**BASE))
    assert cal.cache_path.parent.parent == tmp_path / "env-cache"
    monkeypatch.delenv("VITEDGE_CACHE_DIR")
    assert default_cache_dir() == (tmp_path / "x").home() / ".cache" / "vitedge"


def test_unwritable_cache_is_a_note_not_a_failure(tmp_path):
    path, spec = _model()
    blocker = tmp_path / "file-not-dir"
    blocker.write_text("x")
    cal = calibrate(path, source_for(spec, limit=8), QuantConfig(**BASE), cache_dir=blocker)
    assert cal.cache_path is None and cal.cache_note and "could not write" in cal.cache_note
    assert cal.thresholds
