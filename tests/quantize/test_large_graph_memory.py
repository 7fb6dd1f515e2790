"""What keeps a graph past 2 GiB (vit_h_14: 2.5 GB of weights) within memory, pinned on a small
model that takes the large-graph path (VITEDGE_EXTERNAL_DATA_BYTES=0): the export frees the torch
module before its parity check and checks the file it wrote; external data is streamed without
copying or changing the in-memory graph; large-graph sessions skip pre-packing and the arena;
calibration runs large graphs one image at a time; the build drops its in-memory graphs once saved.
The figures themselves are in benchmarks/results/large_graph.md."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers.quantize_models import fp32_model, source_for

from vitedge.core.errors import ExportError
from vitedge.models.export import ExportOptions, export_onnx
from vitedge.models.intake import load_model
from vitedge.onnxkit.files import (
    EXTERNAL_ALIGN,
    EXTERNAL_DATA_ENV,
    external_data_files,
    has_external_tensors,
    save_external,
    save_onnx,
)
from vitedge.onnxkit.session import _session_options, lean_settings, ort_session
from vitedge.quantize import QuantConfig, build_qdq, calibrate
from vitedge.quantize.calibrate import CALIBRATION_BATCH, LARGE_GRAPH_BATCH

MINMAX = QuantConfig(method="minmax", smoothquant_alpha=None, bias_correction=False)  # one pass, no refinement


def _x(spec, n=2):
    h, w = spec.image_size
    return np.random.default_rng(0).standard_normal((n, spec.preprocess.channels, h, w)).astype(np.float32)


def test_export_frees_the_module_and_checks_the_written_file(tmp_path, timm_vit, force_external):
    loaded = load_model(timm_vit[1])
    result = export_onnx(loaded, tmp_path / "m.onnx", ExportOptions(free_module=True))
    assert loaded.module is None  # gone before ONNX Runtime opened the graph
    assert result.max_abs_diff is not None and result.max_abs_diff <= result.tolerance  # compared with PyTorch's output all the same
    assert external_data_files(tmp_path / "m.onnx") == [tmp_path / "m.onnx.data"]
    # the default keeps the module for callers that still need it
    kept = load_model(timm_vit[1])
    export_onnx(kept, tmp_path / "k.onnx", ExportOptions())
    assert kept.module is not None


def test_failed_parity_check_leaves_no_file(tmp_path, timm_vit, force_external):
    with pytest.raises(ExportError, match="disagrees with PyTorch"):
        export_onnx(load_model(timm_vit[1]), tmp_path / "m.onnx", ExportOptions(atol=-1.0, rtol=0.0))
    assert list(tmp_path.iterdir()) == []  # neither the graph nor its data file


def test_save_external_streams_without_touching_the_graph(tmp_path):
    path, spec = fp32_model("timm")
    model = onnx.load(str(path))
    before = model.SerializeToString()
    save_external(model, tmp_path / "a.onnx")
    assert model.SerializeToString() == before  # neither emptied nor re-read: no second copy of the weights
    shell = onnx.load(str(tmp_path / "a.onnx"), load_external_data=False)
    offsets = [int(e.value) for t in shell.graph.initializer for e in t.external_data if e.key == "offset"]
    assert offsets and all(o % EXTERNAL_ALIGN == 0 for o in offsets)  # page-aligned: ONNX Runtime may map them
    x = _x(spec)
    ref = ort_session(path).run(None, {"input": x})[0]
    np.testing.assert_array_equal(ort_session(tmp_path / "a.onnx").run(None, {"input": x})[0], ref)
    # a graph held without its weights is written from its files: the exporter's many files become one
    save_onnx(shell, tmp_path / "b" / "b.onnx", base_dir=tmp_path)
    assert has_external_tensors(shell)
    assert external_data_files(tmp_path / "b" / "b.onnx") == [tmp_path / "b" / "b.onnx.data"]
    np.testing.assert_array_equal(ort_session(tmp_path / "b" / "b.onnx").run(None, {"input": x})[0], ref)


def test_lean_settings_turn_off_prepacking_and_the_arena():
    so = _session_options(lean_settings())
    assert so.get_session_config_entry("session.disable_prepacking") == "1"
    assert not so.enable_cpu_mem_arena
    default = _session_options(lean_settings().__class__())
    assert default.enable_cpu_mem_arena


def test_calibration_runs_large_graphs_one_image_at_a_time(tmp_path, monkeypatch):
    path, spec = fp32_model("timm")
    small = calibrate(path, source_for(spec, limit=16), MINMAX, cache_dir=tmp_path / "a")
    assert small.forward_passes == -(-16 // CALIBRATION_BATCH)
    monkeypatch.setenv(EXTERNAL_DATA_ENV, "0")
    large = calibrate(path, source_for(spec, limit=16), MINMAX, cache_dir=tmp_path / "b")
    assert large.forward_passes == 16 // LARGE_GRAPH_BATCH
    assert large.thresholds == pytest.approx(small.thresholds, rel=1e-6)  # the same statistics, batch by batch


def test_saved_graph_record_drops_both_graphs(tmp_path):
    path, spec = fp32_model("timm")
    graph = build_qdq(calibrate(path, source_for(spec, limit=8), MINMAX, cache_dir=tmp_path))
    light = graph.without_model()
    assert light.model is None and light.calibration.model is None
    assert graph.model is not None and graph.calibration.model is not None  # the original is untouched
    assert light.quantized == graph.quantized and light.one_line() == graph.one_line()
    assert light.calibration.to_dict() == graph.calibration.to_dict()


def test_size_estimate_matches_protobuf(tmp_path):
    from vitedge.onnxkit.files import serialized_size

    model = onnx.load(str(fp32_model("timm")[0]))
    # ByteSize() would encode the whole graph (upb): the estimate counts raw weights by their length
    assert abs(serialized_size(model) - model.ByteSize()) <= 16 * len(model.graph.initializer)


def test_prepare_infers_shapes_of_large_graphs_without_their_weights(monkeypatch):
    from vitedge.quantize.graph import prepare

    model = onnx.load(str(fp32_model("timm")[0]))
    small = prepare(model)
    monkeypatch.setenv(EXTERNAL_DATA_ENV, "0")
    large = prepare(model)
    assert len(large.graph.value_info) == len(small.graph.value_info) > 0  # the same shapes, found on the weightless copy
    assert [t.raw_data for t in large.graph.initializer] == [t.raw_data for t in model.graph.initializer]  # weights untouched


def test_cleanup_deletes_unused_initializers_in_place():
    from onnx import numpy_helper

    from vitedge.onnxkit.structure import cleanup

    model = onnx.load(str(fp32_model("timm")[0]))
    names = [t.name for t in model.graph.initializer]
    model.graph.initializer.insert(1, numpy_helper.from_array(np.zeros(300, np.float32), "nobody_reads_this"))
    model.graph.initializer.append(numpy_helper.from_array(np.ones(3, np.float32), "nor_this"))
    cleanup(model)
    assert [t.name for t in model.graph.initializer] == names  # the rest kept, in order (no clear-and-re-add copy)


def test_calibration_runner_holds_no_view_into_the_graph():
    from vitedge.quantize.calibrate import _Runner

    path, spec = fp32_model("timm")
    model = onnx.load(str(path))
    runner = _Runner(model, {}, source_for(spec, limit=2), progress=False)
    model.graph.input[0].name = "renamed"
    # a sub-message view would keep the whole graph (2.5 GB for vit_h_14) alive after the runner moves on
    assert runner.input.name == "input"


def test_bake_preprocess_on_a_graph_whose_weights_stay_in_files(tmp_path, timm_vit, force_external):
    first = export_onnx(load_model(timm_vit[1]), tmp_path / "m.onnx", ExportOptions())
    baked = export_onnx(load_model(tmp_path / "m.onnx"), tmp_path / "b.onnx", ExportOptions(bake_preprocess=True))
    assert baked.input_format == "uint8-nhwc-rgb" and first.input_name == "input"
    assert external_data_files(tmp_path / "b.onnx") == [tmp_path / "b.onnx.data"]
    frames = np.random.default_rng(0).integers(0, 256, size=(1, 32, 32, 3), dtype=np.uint8)
    assert np.isfinite(ort_session(tmp_path / "b.onnx").run(None, {"frames": frames})[0]).all()
