"""Every parser is bounded and answers in one line (issue 46, class 5): JSON (a bundle's manifest, a report given to
`vitedge compare`, a model's `vitedge.spec` metadata) and TOML (vitedge.toml, a target profile, matrix.toml) are read
through one helper (vitedge/files/safefile.py: a size bound, a depth bound, no NaN/Infinity, the type expected), so nesting
that used to raise RecursionError, metadata that is not JSON or lacks a field, and NaN are exit 2 in one line. An ONNX
graph's external-data offsets and lengths are checked numbers; a fixed-batch graph and an INT8 graph are refused
when the model is read, not deep inside ONNX Runtime. Every case asserts that nothing changed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import onnx
import pytest
from conftest import CALIB_DIR, EXAMPLES
from onnx.external_data_helper import convert_model_to_external_data
from rel_cli import assert_one_line, cli, debris, export_fp32, snapshot

DEEP = 5000


def _unchanged(root: Path, args: list, code: int, *fragments: str, cwd: Path | None = None) -> str:
    before = snapshot(root)
    line = assert_one_line(cli(*args, cwd=cwd), code, *fragments)
    assert snapshot(root) == before and not debris(root)
    return line


@pytest.fixture(scope="module")
def fp32(tmp_path_factory) -> Path:
    return export_fp32(EXAMPLES / "digits_vit.pt", tmp_path_factory.mktemp("parsers") / "m.onnx")


# ------------------------------------------------------------------ JSON: manifest, report, metadata

JSON_CASES = {
    "deep list": "[" * DEEP + "]" * DEEP,
    "deep object": '{"a":' * DEEP + "1" + "}" * DEEP,
    "deep under a key": '{"schema": "vitedge.manifest/1", "target": ' + "[" * DEEP + "]" * DEEP + "}",
    "NaN": '{"schema": "vitedge.manifest/1", "x": NaN}',
    "-Infinity": '{"schema": "vitedge.manifest/1", "x": -Infinity}',
    "a list": '[{"schema": "vitedge.manifest/1"}]',
}
JSON_SAYS = {"deep list": "nests deeper than 64 levels", "deep object": "nests deeper than 64 levels",
             "deep under a key": "nests deeper than 64 levels", "NaN": "holds NaN", "-Infinity": "holds -Infinity",
             "a list": "holds a list"}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
def test_a_manifest_no_parser_can_use_is_one_line(tmp_path, case):
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(JSON_CASES[case])
    _unchanged(tmp_path, ["validate", "-q", bundle, "--no-latency"], 2, f"{bundle / 'manifest.json'}", JSON_SAYS[case])


@pytest.mark.parametrize("case", ["deep list", "deep under a key", "NaN"])
def test_runtime_load_answers_a_bad_manifest_with_a_bundle_error(tmp_path, case):
    from vitedge.core.errors import BundleError
    from vitedge.runtime import load

    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "manifest.json").write_text(JSON_CASES[case])
    before = snapshot(tmp_path)
    with pytest.raises(BundleError, match=JSON_SAYS[case]):
        load(bundle)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case", ["deep object", "-Infinity", "a list"])
def test_a_report_compare_cannot_parse_is_one_line(tmp_path, case):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(JSON_CASES[case])
    new.write_text(JSON_CASES[case])
    _unchanged(tmp_path, ["compare", old, new], 2, str(old), JSON_SAYS[case])


def _with_spec(fp32: Path, folder: Path, text: str) -> Path:
    model = onnx.load(str(fp32))
    for prop in model.metadata_props:
        if prop.key == "vitedge.spec":
            prop.value = text
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "m.onnx"))
    return folder / "m.onnx"


@pytest.mark.parametrize("text,says", [
    ("{not json", "is not valid JSON"),
    ("{}", "the model spec lacks 'image_size'"),
    ('{"image_size": [28, 28], "preprocess": NaN}', "holds NaN"),
    ("[" * DEEP + "]" * DEEP, "nests deeper than 64 levels"),
    ('"a string"', "holds a str"),
    ('{"image_size": 7, "preprocess": {}}', "the model spec is malformed (TypeError"),
])
def test_vitedge_spec_metadata_that_is_not_a_spec_is_one_line(fp32, tmp_path, text, says):
    model = _with_spec(fp32, tmp_path / "model", text)
    _unchanged(tmp_path, ["inspect", model], 2, f"{model}: its 'vitedge.spec' metadata", says, "re-export")


# ------------------------------------------------------------------ TOML: vitedge.toml, a profile, matrix.toml

TOML_CASES = {"deep arrays": "a = " + "[" * DEEP + "]" * DEEP + "\n",
              "deep inline tables": "a = " + "{b = " * DEEP + "1" + "}" * DEEP + "\n"}


@pytest.mark.parametrize("case", sorted(TOML_CASES))
def test_a_deep_project_config_is_one_line(tmp_path, case):
    project = tmp_path / "p"
    (project / ".git").mkdir(parents=True)
    (project / "vitedge.toml").write_text(TOML_CASES[case])
    _unchanged(tmp_path, ["config"], 2, f"{project / 'vitedge.toml'} nests deeper than 64 levels", cwd=project)


@pytest.mark.parametrize("case", sorted(TOML_CASES))
def test_a_deep_target_profile_is_one_line(tmp_path, case):
    profile = tmp_path / "mine.toml"
    profile.write_text(TOML_CASES[case])
    _unchanged(tmp_path, ["build", EXAMPLES / "digits_vit.pt", "-t", profile, "--calib", CALIB_DIR, "-o", tmp_path / "o"], 2,
               f"{profile} nests deeper than 64 levels")


def test_a_deep_matrix_is_one_line(tmp_path):
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(TOML_CASES["deep arrays"])
    _unchanged(tmp_path, ["build-matrix", matrix], 2, f"{matrix} nests deeper than 64 levels")


def test_a_config_that_is_not_utf8_is_one_line(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_bytes(b'targets = ["\xff\xfe"]\n')
    _unchanged(tmp_path, ["config", "--config", cfg], 2, f"{cfg}: not UTF-8 text")


# ------------------------------------------------------------------ ONNX: external data numbers, batch, INT8

@pytest.fixture(scope="module")
def external(fp32, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ext")
    model = onnx.load(str(fp32))
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="w.data", size_threshold=1024)
    onnx.save(model, str(folder / "m.onnx"))
    return folder / "m.onnx"


@pytest.mark.parametrize("key,value", [("offset", "-4096"), ("length", "-1"), ("offset", "abc"), ("length", "1e3"),
                                       ("offset", "99999999999999999999")])
def test_external_data_offsets_and_lengths_must_be_byte_counts(external, tmp_path, key, value):
    model = onnx.load(str(external), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.external_data)
    for entry in tensor.external_data:
        if entry.key == key:
            entry.value = value
    if key not in {e.key for e in tensor.external_data}:
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save(model, str(folder / "m.onnx"))
    shutil.copyfile(external.parent / "w.data", folder / "w.data")
    _unchanged(tmp_path, ["inspect", folder / "m.onnx"], 2, f"tensor '{tensor.name}' gives its external data {key} as '{value[:40]}'",
               "not a byte count")


def test_a_fixed_batch_graph_with_vitedge_metadata_is_refused_when_read(fp32, tmp_path):
    model = onnx.load(str(fp32))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 8
    (tmp_path / "model").mkdir()
    path = tmp_path / "model" / "m.onnx"
    onnx.save(model, str(path))
    _unchanged(tmp_path, ["calibrate", path, "--calib", CALIB_DIR, "-o", tmp_path / "q.onnx", "--cache-dir", tmp_path.parent / "c5"],
               2, "the ONNX input has a fixed batch of 8", "dynamic batch axis")


@pytest.fixture(scope="module")
def int8(fp32, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("int8") / "q.onnx"
    run = cli("calibrate", fp32, "--calib", CALIB_DIR, "-o", path, "--calib-size", "16", "-q")
    assert run.code == 0, run.err
    return path


@pytest.mark.parametrize("command", ["build", "calibrate"])
@pytest.mark.parametrize("strip_metadata", [False, True])
def test_an_int8_graph_given_as_the_model_is_refused_when_read(int8, tmp_path, command, strip_metadata):
    model = onnx.load(str(int8))
    if strip_metadata:  # another tool's INT8 graph: known by its ops alone
        del model.metadata_props[:]
        model.metadata_props.add(key="vitedge.spec", value=json.dumps(json.loads(
            onnx.load(str(int8)).metadata_props[[p.key for p in onnx.load(str(int8)).metadata_props].index("vitedge.spec")].value)))
    path = tmp_path / "m" / "q.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path))
    args = [command, "-q", path, "--calib", CALIB_DIR, "-o", tmp_path / "out" / ("b" if command == "build" else "q.onnx")]
    args += ["-t", "onnx"] if command == "build" else []
    says = "quantized ops (DequantizeLinear" if strip_metadata else "already an INT8 graph"
    _unchanged(tmp_path, args, 2, f"{path} is already an INT8 graph", says, "pass the FP32 model")
    assert not (tmp_path / "out").exists()
