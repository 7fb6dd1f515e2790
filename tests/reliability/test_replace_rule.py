"""One replace rule for every writer (issue #26 item 2, vitedge/files/outputs.py check_output): --force replaces only
an output of the command's own kind that vitedge wrote, never an input, a folder holding an input or the bundle
it reads, nor the user's file or folder; it is checked before any work.

Each refusal is exit 2 with one line, and every file outside the (refused) output is byte-for-byte unchanged."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import CALIB_DIR, EXAMPLES
from rel_cli import assert_one_line, cli, debris, export_fp32, snapshot

# builds here pin what they refuse, replace or trust, not the INT8-vs-FP32 timing (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("no_int8_timing")

DIGITS = EXAMPLES / "digits_vit.pt"


@pytest.fixture(scope="module")
def fp32(tmp_path_factory) -> Path:
    """An FP32 graph `vitedge export` wrote."""
    return export_fp32(DIGITS, tmp_path_factory.mktemp("replace-fp32") / "fp32.onnx")


def _unchanged(root: Path, case) -> None:
    before = snapshot(root)
    case()
    assert snapshot(root) == before and not debris(root)


# ------------------------------------------------------------------ a file output: export, calibrate, init

def test_calibrate_force_never_overwrites_its_own_input(fp32, tmp_path):
    model = tmp_path / "fp32.onnx"
    shutil.copyfile(fp32, model)

    def case():
        run = cli("calibrate", model, "--calib", CALIB_DIR, "-o", model, "--force", "-q", "--cache-dir", tmp_path / "cache")
        assert_one_line(run, 2, f"-o {model} is {model}, an input of this run")
    _unchanged(tmp_path, case)
    assert not (tmp_path / "cache").exists()  # refused before any work


def test_calibrate_force_never_overwrites_its_input_through_a_hard_link(fp32, tmp_path):
    model = tmp_path / "fp32.onnx"
    shutil.copyfile(fp32, model)
    (tmp_path / "out").mkdir()
    link = tmp_path / "out" / "int8.onnx"
    link.hardlink_to(model)

    def case():
        run = cli("calibrate", model, "--calib", CALIB_DIR, "-o", link, "--force", "-q")
        assert_one_line(run, 2, "an input of this run")
    _unchanged(tmp_path, case)


def test_init_force_never_overwrites_the_model(tmp_path):
    model = tmp_path / "m.pt"
    shutil.copyfile(DIGITS, model)

    def case():
        assert_one_line(cli("init", model, "-o", model, "--force", cwd=tmp_path), 2, f"-o {model} is {model}, an input of this run")
    _unchanged(tmp_path, case)


@pytest.mark.parametrize("name,text", [
    ("pyproject.toml", '[project]\nname = "mine"\n\n[tool.vitedge]\nmodel = "m.pt"\n'),  # a project's own file, whatever it holds
    ("vitedge.toml", 'model = "m.pt"\n# written by hand\n'),  # a config the user wrote, not init
    ("notes.toml", "anything\n"),
])
def test_init_force_replaces_only_a_config_init_wrote(tmp_path, name, text):
    model = tmp_path / "m.pt"
    shutil.copyfile(DIGITS, model)
    (tmp_path / name).write_text(text)

    def case():
        run = cli("init", model, "-o", tmp_path / name, "--force", cwd=tmp_path)
        assert_one_line(run, 2, "is not a config `vitedge init` wrote", "--force replaces only that")
    _unchanged(tmp_path, case)


def test_init_force_replaces_its_own_config(tmp_path):
    model = tmp_path / "m.pt"
    shutil.copyfile(DIGITS, model)
    assert cli("init", model, cwd=tmp_path).code == 0
    first = (tmp_path / "vitedge.toml").read_text()
    assert_one_line(cli("init", model, cwd=tmp_path), 2, "exists; pass --force")
    run = cli("init", model, "--force", "--output", "elsewhere", cwd=tmp_path)
    assert run.code == 0, run.err
    assert (tmp_path / "vitedge.toml").read_text() != first and 'output = "elsewhere"' in (tmp_path / "vitedge.toml").read_text()
    assert model.read_bytes() == DIGITS.read_bytes() and not debris(tmp_path)


def test_export_force_replaces_only_a_graph_vitedge_exported(fp32, tmp_path):
    user = tmp_path / "theirs.onnx"
    user.write_bytes(b"an ONNX file from another tool")

    def case():
        assert_one_line(cli("export", DIGITS, "-o", user, "--force"), 2, "is not an FP32 ONNX graph vitedge exported")
    _unchanged(tmp_path, case)
    ours = tmp_path / "ours.onnx"
    shutil.copyfile(fp32, ours)
    run = cli("export", DIGITS, "-o", ours, "--force")
    assert run.code == 0 and ours.read_bytes() != b"", run.err


def test_calibrate_force_does_not_replace_an_fp32_graph_with_int8(fp32, tmp_path):
    other = tmp_path / "other.fp32.onnx"  # vitedge's, but another kind of output: export's
    shutil.copyfile(fp32, other)

    def case():
        run = cli("calibrate", DIGITS, "--calib", CALIB_DIR, "-o", other, "--force", "-q")
        assert_one_line(run, 2, "is not an INT8 Q/DQ graph vitedge wrote")
    _unchanged(tmp_path, case)


def test_a_folder_where_a_file_goes_is_named_before_force_is_considered(tmp_path):
    folder = tmp_path / "x.onnx"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")

    def case():
        assert_one_line(cli("export", DIGITS, "-o", folder), 2, f"-o {folder} is a folder; -o names the file to write")
    _unchanged(tmp_path, case)


# ------------------------------------------------------------------ a folder output: export-config, validate --report-dir, build

def test_export_config_force_never_deletes_the_bundle_it_reads_or_the_users_files(bundle, tmp_path):
    (tmp_path / "notes.txt").write_text("the user's")  # bundle is tmp_path/bundle: tmp_path holds it

    def case():
        run = cli("export-config", "--for", "deepstream", bundle, "-o", tmp_path, "--force")
        assert_one_line(run, 2, f"-o {tmp_path} holds {bundle}, which this run reads", "--force would delete it")
    _unchanged(tmp_path, case)


def test_export_config_into_the_bundle_is_refused(bundle, tmp_path):
    def case():
        run = cli("export-config", "--for", "triton", bundle, "-o", bundle / "camera", "--force")
        assert_one_line(run, 2, "is inside", "manifest.json hashes")
    _unchanged(tmp_path, case)


def test_export_config_force_replaces_only_a_folder_it_wrote(bundle, tmp_path):
    user = tmp_path / "ds"
    user.mkdir()
    (user / "config_infer.txt").write_text("[property]\n# the user's own nvinfer config\n")

    def case():
        run = cli("export-config", "--for", "deepstream", bundle, "-o", user, "--force")
        assert_one_line(run, 2, "is a folder vitedge did not write", "camera-app folder")
    _unchanged(tmp_path, case)
    ours = tmp_path / "ours"
    for kind in ("deepstream", "triton", "deepstream"):  # each replaces the previous one: its own kind
        run = cli("export-config", "--for", kind, bundle, "-o", ours, "--force")
        assert run.code == 0, run.err
    assert (ours / "config_infer.txt").is_file() and not debris(tmp_path)


@pytest.mark.parametrize("where", ["user folder", "holds the bundle", "inside the bundle"])
def test_validate_report_dir_is_checked_before_any_work(bundle, tmp_path, where):
    if where == "user folder":
        report = tmp_path / "mine"
        report.mkdir()
        (report / "summary.md").write_text("my own summary")
        expect = ("a folder vitedge did not write", "report folder")
    elif where == "holds the bundle":
        report, expect = tmp_path, (f"holds {bundle}, which this run reads",)
    else:
        report, expect = bundle / "extra", ("is inside", "manifest.json hashes")

    def case():
        run = cli("validate", bundle, "--no-latency", "--report-dir", report, "-q")
        assert_one_line(run, 2, f"--report-dir {report}", *expect)
    _unchanged(tmp_path, case)


def test_build_force_refuses_an_output_holding_its_calibration_data(tmp_path):
    data = tmp_path / "out" / "calib"
    shutil.copytree(CALIB_DIR, data)

    def case():
        run = cli("build", DIGITS, "-t", "onnx", "--calib", data, "-o", tmp_path / "out", "--force", "-q", "--no-latency")
        assert_one_line(run, 2, f"holds {data}, an input of this run")
    _unchanged(tmp_path, case)


def test_build_matrix_never_overwrites_a_users_matrix_report(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "matrix.md").write_text("# my own matrix notes\n")
    matrix = tmp_path / "matrix.toml"
    matrix.write_text(f'targets = ["onnx"]\nout = "out"\n[[models]]\nname = "digits"\npath = "{DIGITS}"\ncalib = "{CALIB_DIR}"\n')

    def case():
        run = cli("build-matrix", matrix, "--sequential", "-q")
        assert run.code == 2, run.err
        assert "is a folder vitedge did not write" in run.lines[-1] and "build-matrix output folder" in run.lines[-1], run.err
    _unchanged(tmp_path, case)


def test_calibrate_output_that_is_its_cache_folder_to_be_made_is_refused(tmp_path):
    """--cache-dir X does not exist yet and -o X: calibrate would have created the cache folder at X, then failed
    writing the graph onto it after all its work. An input the run will create is compared by its path too."""
    out = tmp_path / "int8.onnx"

    def case():
        run = cli("calibrate", DIGITS, "--calib", CALIB_DIR, "-o", out, "--cache-dir", out, "-q")
        assert_one_line(run, 2, f"-o {out} is {out}, an input of this run")
    _unchanged(tmp_path, case)
    assert not out.exists()
