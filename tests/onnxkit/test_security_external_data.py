"""An ONNX model's external data is read only from files inside the model's folder, as ONNX's own loader reads it.

vitedge used to open ``folder / location`` as written in the graph: a model from someone else whose initializers
named ``../secret`` or ``/home/me/.ssh/id_ed25519`` (or a link out of the folder) had that file's bytes copied into
the bundle's weights, which then go to devices and CI artifacts. Such a model, a missing data file and one too short
for the graph are each refused in one line when the model is read, before anything is written."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import onnx
import pytest
from conftest import CALIB_DIR
from helpers.cli import run_vitedge
from onnx.external_data_helper import convert_model_to_external_data

from vitedge.core.errors import ModelLoadError
from vitedge.models.export import ExportOptions, export_onnx
from vitedge.models.intake import load_model


@pytest.fixture(scope="module")
def external_graph(timm_vit, tmp_path_factory) -> Path:
    """The timm fixture exported, then saved with every weight in one data file beside it."""
    root = tmp_path_factory.mktemp("external")
    plain = root / "plain.onnx"
    export_onnx(load_model(timm_vit[1]), plain, ExportOptions(check=False))
    model = onnx.load(str(plain))
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="weights.data", size_threshold=0)
    onnx.save(model, str(root / "model.onnx"))
    return root / "model.onnx"


def _rewritten(graph: Path, folder: Path, edit) -> Path:
    """A copy of ``graph`` (its graph only) in ``folder`` with every external entry passed through ``edit(key, value)``."""
    model = onnx.load(str(graph), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            entry.value = edit(entry.key, entry.value)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "model.onnx"
    onnx.save(model, str(out))
    return out


def _moved_location(value_for_location):
    return lambda key, value: value_for_location if key == "location" else value


def test_a_model_with_its_data_file_beside_it_loads_and_exports(external_graph, tmp_path):
    result = export_onnx(load_model(external_graph), tmp_path / "out.onnx", ExportOptions(check=False))
    assert result.input_name


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink-out"])
def test_external_data_outside_the_model_folder_is_refused_and_never_copied(where, external_graph, tmp_path):
    secret = tmp_path / "secret.bin"  # a file of this machine the graph should not be able to reach
    secret.write_bytes((external_graph.parent / "weights.data").read_bytes())  # sized so the old code read it whole
    folder = tmp_path / "model"
    folder.mkdir()
    location = {"parent": "../secret.bin", "absolute": str(secret), "symlink-out": "link.data"}[where]
    if where == "symlink-out":
        (folder / "link.data").symlink_to(secret)
    model = _rewritten(external_graph, folder, _moved_location(location))
    with pytest.raises(ModelLoadError, match="not a file inside the model's folder"):
        load_model(model)
    out = tmp_path / "out"
    code, text = run_vitedge([os.fspath(a) for a in ("build", model, "-t", "onnx", "--calib", CALIB_DIR, "-o", out, "-q",
                                                    "--no-latency", "--cache-dir", tmp_path / "cache")])
    assert code == 2 and "not a file inside the model's folder" in text, text
    assert not out.exists()


def test_a_link_inside_the_model_folder_is_followed(external_graph, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    shutil.copyfile(external_graph.parent / "weights.data", folder / "real.data")
    (folder / "link.data").symlink_to("real.data")
    model = _rewritten(external_graph, folder, _moved_location("link.data"))
    assert load_model(model).onnx_path == model


def test_a_missing_or_short_data_file_is_named(external_graph, tmp_path):
    missing = _rewritten(external_graph, tmp_path / "missing", lambda key, value: value)
    with pytest.raises(ModelLoadError, match="'weights.data', which is missing from .*copy the data file beside the model"):
        load_model(missing)
    short = tmp_path / "short"
    short.mkdir()
    data = (external_graph.parent / "weights.data").read_bytes()
    (short / "weights.data").write_bytes(data[: len(data) // 2])
    model = _rewritten(external_graph, short, lambda key, value: value)
    with pytest.raises(ModelLoadError, match="truncated or belongs to another model"):
        load_model(model)


@pytest.mark.parametrize("location", ["/dev/zero", "../weights.data"])
def test_hashing_a_graph_from_elsewhere_never_reads_outside_its_folder(location, external_graph, tmp_path):
    """A bundle's graph is hashed (the reference cache's key) before ONNX Runtime sees it: a location of /dev/zero
    read forever, one out of the folder read a file of this machine."""
    from vitedge.onnxkit.files import onnx_sha256

    (tmp_path / "weights.data").write_bytes((external_graph.parent / "weights.data").read_bytes())
    graph = _rewritten(external_graph, tmp_path / "bundle", _moved_location(location))
    with pytest.raises(ModelLoadError, match="is not a regular file inside"):
        onnx_sha256(graph)
