"""Bad input to `vitedge validate`: one clear line on stderr, exit 2, and no report written."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import VAL_DIR
from helpers.cli import run_cli


def _fails_cleanly(capsys, bundle, *args, expect: str, report_dir=None):
    report = report_dir or bundle / "report"
    extra = ("--report-dir", report) if report_dir is not None else ()
    code, out, err = run_cli(capsys, "validate", bundle, "--no-latency", "--no-sensitivity", *extra, *args)
    assert code == 2, (out, err)
    lines = [l for l in err.strip().splitlines() if l.startswith("vitedge:")]
    assert len(lines) == 1 and expect in lines[0], err
    assert not report.exists(), f"{report} was written"
    return lines[0]


def test_missing_file(bundle, capsys):
    (bundle / "model.int8.onnx").unlink()
    _fails_cleanly(capsys, bundle, "--data", VAL_DIR, expect="model.int8.onnx is listed in manifest.json but missing")


def test_altered_file(bundle, capsys):
    with open(bundle / "reference.fp32.onnx", "ab") as f:
        f.write(b"\0")
    _fails_cleanly(capsys, bundle, "--data", VAL_DIR, expect="reference.fp32.onnx does not match its sha256")


def test_not_a_bundle(tmp_path, capsys):
    code, _, err = run_cli(capsys, "validate", tmp_path, "--data", VAL_DIR)
    assert code == 2 and "no manifest.json" in err


def test_float_arrays_of_the_wrong_shape(bundle, capsys, tmp_path):
    data = tmp_path / "wrong.npz"
    np.savez(data, images=np.zeros((4, 3, 16, 16), np.float32), labels=np.arange(4))
    line = _fails_cleanly(capsys, bundle, "--data", data, expect="shape (4, 3, 16, 16)")
    assert "(N, 3, 32, 32)" in line


def test_labels_beyond_the_class_count(bundle, capsys, tmp_path):
    data = tmp_path / "labels.npz"
    frames = np.random.default_rng(0).integers(0, 255, (6, 32, 32, 3), dtype=np.uint8)
    np.savez(data, images=frames, labels=np.array([0, 1, 2, 3, 4, 12]))
    _fails_cleanly(capsys, bundle, "--data", data, expect="the model has 10 classes")


def test_class_folder_beyond_the_class_count(bundle, capsys, tmp_path):
    data = tmp_path / "folders"
    (data / "12").mkdir(parents=True)
    src = next((VAL_DIR / "3").iterdir())
    shutil.copy(src, data / "12" / src.name)
    _fails_cleanly(capsys, bundle, "--data", data, expect="not a class index of this model")


def test_empty_folder(bundle, capsys, tmp_path):
    (tmp_path / "empty").mkdir()
    _fails_cleanly(capsys, bundle, "--data", tmp_path / "empty", expect="is empty")


def test_no_data_and_none_recorded(bundle, capsys):
    path = bundle / "manifest.json"  # not a hashed file: the recorded validation set may be edited away
    m = json.loads(path.read_text())
    m["validation"]["data"]["path"] = str(bundle / "gone")
    m["validation_data"]["path"] = str(bundle / "gone")  # what `validate` without --data re-reads
    path.write_text(json.dumps(m))
    _fails_cleanly(capsys, bundle, expect="pass --data")


@pytest.mark.parametrize("flags, expect", [
    (("--min-agreement", "1.01"), "min_agreement must be a fraction"),
    (("--max-top1-drop", "-1"), "max_top1_drop must be >= 0"),
    (("--no-latency", "--min-speedup", "2"), "--no-latency cannot check"),
])
def test_invalid_thresholds(bundle, capsys, flags, expect):
    _fails_cleanly(capsys, bundle, "--data", VAL_DIR, *flags, expect=expect)


def test_report_dir_that_is_a_file(bundle, capsys, tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("keep me")
    code, _, err = run_cli(capsys, "validate", bundle, "--data", VAL_DIR, "--report-dir", target)
    assert code == 2 and "is a file" in err and target.read_text() == "keep me"
