"""Graphs past protobuf's 2 GiB limit travel with ONNX external data. VITEDGE_EXTERNAL_DATA_BYTES
lowers the limit so a small model takes that path: export (with its parity check), calibration,
quantization, the accuracy budget, both CPU targets, the TensorRT plan, the manifest hashes and
the runtime."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import CALIB_DIR

from vitedge.app.build import BuildRequest, run_build
from vitedge.validation.reference_cache import ReferenceCacheSettings
from vitedge.core.errors import BundleError, UsageError
from vitedge.models.export import ExportOptions, export_onnx
from vitedge.bundle.manifest import read_manifest, verify_bundle
from vitedge.models.intake import load_model
from vitedge.onnxkit.files import EXTERNAL_DATA_ENV, copy_onnx, external_data_files, onnx_sha256, save_onnx
from vitedge.onnxkit.session import ort_session
from vitedge.core.ui import StageLog


def test_export_writes_external_data_and_checks_parity(tmp_path, timm_vit, force_external):
    _, path = timm_vit
    result = export_onnx(load_model(path), tmp_path / "m.onnx", ExportOptions())
    assert result.max_abs_diff is not None and result.max_abs_diff <= result.tolerance  # the parity check ran, by file
    assert external_data_files(tmp_path / "m.onnx") == [tmp_path / "m.onnx.data"]
    assert (tmp_path / "m.onnx").stat().st_size < 100_000 < (tmp_path / "m.onnx.data").stat().st_size
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary leftovers
    # the external graph is a model vitedge reads, and a copy carries its weights under its new name
    again = export_onnx(load_model(tmp_path / "m.onnx"), tmp_path / "again.onnx", ExportOptions())
    assert again.input_name == result.input_name
    copy_onnx(tmp_path / "m.onnx", tmp_path / "copy" / "c.onnx")
    assert external_data_files(tmp_path / "copy" / "c.onnx") == [tmp_path / "copy" / "c.onnx.data"]
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    ref = ort_session(tmp_path / "m.onnx").run(None, {"input": x})[0]
    np.testing.assert_array_equal(ort_session(tmp_path / "copy" / "c.onnx").run(None, {"input": x})[0], ref)
    # a ModelProto over the limit opens through a temporary file; saving keeps its weights in memory
    model = onnx.load(tmp_path / "m.onnx")
    save_onnx(model, tmp_path / "saved.onnx")
    assert (tmp_path / "saved.onnx.data").is_file()
    np.testing.assert_array_equal(ort_session(model).run(None, {"input": x})[0], ref)
    # the hash covers the weights
    digest = onnx_sha256(tmp_path / "copy" / "c.onnx")
    data = tmp_path / "copy" / "c.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 1
    data.write_bytes(bytes(raw))
    assert onnx_sha256(tmp_path / "copy" / "c.onnx") != digest


def test_threshold_knob_rejects_nonsense(tmp_path, timm_vit, monkeypatch):
    monkeypatch.setenv(EXTERNAL_DATA_ENV, "two gigs")
    with pytest.raises(UsageError, match=EXTERNAL_DATA_ENV):
        export_onnx(load_model(timm_vit[1]), tmp_path / "m.onnx", ExportOptions())


def test_build_runs_every_target_and_the_runtime_from_external_data(tmp_path, timm_vit, force_external, no_int8_timing):
    from vitedge.runtime import load

    _, path = timm_vit
    req = BuildRequest(model=path, targets=("onnx", "intel-cpu", "jetson-orin"), calib=CALIB_DIR, out=tmp_path / "out",
                       cache=ReferenceCacheSettings(root=tmp_path / "cache"), measure_speed=False, calib_size=16)
    results = {r.profile.name: r for r in run_build(req, StageLog(quiet=True))}
    assert results["onnx"].built and results["intel-cpu"].built and not results["jetson-orin"].built
    for name in ("onnx", "intel-cpu", "jetson-orin"):
        bundle = tmp_path / "out" / name
        manifest = verify_bundle(bundle)
        for graph in ("model.int8.onnx", "reference.fp32.onnx"):
            assert external_data_files(bundle / graph) == [bundle / (graph + ".data")]
            assert graph + ".data" in manifest.files  # the weights are hashed with the rest of the bundle
        own = name if name == "jetson-orin" else "intel-cpu"  # the NVIDIA graph is its own (INT8 attention)
        assert manifest.quantization.qdq_sha256 == onnx_sha256(tmp_path / "out" / own / "model.int8.onnx")
        if name != "jetson-orin":
            assert manifest.validation is not None and manifest.validation["accuracy"]["samples"] == 16
        if name == "onnx":  # the artifact's size counts its weights
            data_bytes = (bundle / "model.int8.onnx.data").stat().st_size
            assert manifest.validation["artifact"]["bytes"] == (bundle / "model.int8.onnx").stat().st_size + data_bytes
    plan = json.loads((tmp_path / "out" / "jetson-orin" / "build_plan.json").read_text())
    assert "model.int8.onnx" in json.dumps(plan)
    frame = np.random.default_rng(0).integers(0, 256, size=(40, 40, 3), dtype=np.uint8)
    for target in ("onnx", "intel-cpu"):
        with load(tmp_path / "out" / target) as model:  # hashes checked, weights read from the .data file
            logits = model.logits(frame)
            assert logits.shape[-1] == 10 and np.isfinite(logits).all() and np.ptp(logits) > 0
            assert 0 <= model.predict(frame).index < 10
    # an altered weights file is refused before anything runs
    data = tmp_path / "out" / "onnx" / "reference.fp32.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="reference.fp32.onnx.data"):
        load(tmp_path / "out" / "onnx")
    assert read_manifest(tmp_path / "out" / "onnx").files  # the manifest itself is intact
