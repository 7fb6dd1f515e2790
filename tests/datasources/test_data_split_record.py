"""Data folders laid out as calib/+val/ (a split, not two classes), and `vitedge validate BUNDLE`
without --data re-validating on exactly what the build validated on (manifest.validation_data)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import CALIB_DIR, EXAMPLES, VAL_DIR
from helpers.profiles import untimed_targets
from PIL import Image

from vitedge.datasources.split import find_split, resolve_data

LENIENT = ("--max-top1-drop", 100, "--min-agreement", 0, "--min-decisive-agreement", 0)


def _images(dst: Path, src: Path, per_class: int) -> Path:
    for cls in sorted(p for p in src.iterdir() if p.is_dir()):
        (dst / cls.name).mkdir(parents=True, exist_ok=True)
        for f in sorted(cls.iterdir())[:per_class]:
            shutil.copyfile(f, dst / cls.name / f.name)
    return dst


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory) -> Path:
    """A small copy of calibration/digits: calib/ (3 per class) + val/ (4 per class)."""
    root = tmp_path_factory.mktemp("split") / "digits"
    _images(root / "calib", CALIB_DIR, 3)
    _images(root / "val", VAL_DIR, 4)
    return root


def run_cli(capsys, *args) -> tuple[int, str, str]:
    from vitedge.cli.entry import main

    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    cap = capsys.readouterr()
    return int(exc.value.code or 0), cap.out, cap.err


def flat(text: str) -> str:
    """The console wraps long lines: compare on whitespace-normalised text."""
    return " ".join(text.split())


def test_split_layouts_are_recognised_and_class_folders_are_not(tmp_path, split_dir):
    split = find_split(split_dir)
    assert split is not None and split.calib == split_dir / "calib" and split.val == split_dir / "val"
    assert find_split(split_dir / "calib") is None  # ten class folders: a labelled set
    train = tmp_path / "tv"
    (train / "train" / "a").mkdir(parents=True)
    (train / "val" / "a").mkdir(parents=True)
    (train / ".DS_Store").write_bytes(b"")  # hidden entries do not count
    assert find_split(train).calib == train / "train"
    assert find_split(train, class_names=["train", "val"]) is None  # the model's classes are called so
    (train / "test").mkdir()
    assert find_split(train) is None  # three folders: class folders, not a split
    calib, val, notes = resolve_data(split_dir, None)
    assert (calib, val) == (split_dir / "calib", split_dir / "val") and "is a split" in notes[0]
    calib, val, _ = resolve_data(split_dir, split_dir / "val")
    assert (calib, val) == (split_dir / "calib", split_dir / "val")
    assert resolve_data(split_dir / "calib", None)[1] is None


@pytest.fixture(scope="module")
def split_bundle(split_dir, tmp_path_factory, untimed_targets_dir) -> Path:
    """`vitedge build --calib PARENT` (a split, no --val): calibrates on calib/, validates on val/."""
    from vitedge.cli.entry import main

    out = tmp_path_factory.mktemp("split-bundle") / "onnx"
    with untimed_targets(untimed_targets_dir), pytest.raises(SystemExit) as exc:  # the data split is pinned, not the INT8 timing
        main(["build", str(EXAMPLES / "digits_vit.pt"), "-t", "onnx", "--calib", str(split_dir), "-o", str(out),
              "--no-latency", "--no-fallback", "-q", *map(str, LENIENT)])
    assert exc.value.code == 0
    return out


def test_build_on_a_split_parent_records_its_val_part(split_bundle, split_dir):
    m = json.loads((split_bundle / "manifest.json").read_text())
    rec = m["validation_data"]
    assert rec["role"] == "validation" and rec["path"] == str((split_dir / "val").resolve())
    assert rec["items"] == 40 and rec["data_hash"] == m["validation"]["data"]["data_hash"]
    assert m["calibration"]["calibration"]["used"] == 30  # calib/, not calib/ + val/
    assert m["validation"]["data"]["role"] == "validation" and m["validation"]["data"]["labeled"] is True


def test_validate_without_data_uses_the_recorded_set_and_refuses_a_changed_or_moved_one(split_bundle, split_dir, tmp_path, capsys):
    bundle = tmp_path / "b"
    shutil.copytree(split_bundle, bundle)
    code, out, err = run_cli(capsys, "validate", bundle, "--no-latency", "--no-sensitivity", *LENIENT)
    assert code == 0, err
    assert "re-validating on the validation set the build validated on" in flat(err)
    doc = json.loads((bundle / "report" / "validation.json").read_text())
    rec = json.loads((bundle / "manifest.json").read_text())["validation_data"]
    assert doc["data"]["data_hash"] == rec["data_hash"] and doc["data"]["items"] == 40 and doc["data"]["role"] == "validation"

    # one image changed: its content hash differs
    val = split_dir / "val"
    victim = sorted((val / "3").iterdir())[0]
    original = victim.read_bytes()
    try:
        Image.new("RGB", (64, 64), (255, 0, 0)).save(victim)
        code, out, err = run_cli(capsys, "validate", bundle, "--no-latency", "--no-sensitivity", "-q")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "changed since the build" in err and "--data" in err
    finally:
        victim.write_bytes(original)

    # the folder moved away
    moved = split_dir.parent / "moved"
    val.rename(moved)
    try:
        code, out, err = run_cli(capsys, "validate", bundle, "--no-latency", "--no-sensitivity", "-q")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "is gone (moved or deleted)" in err and "--data" in err
        # naming it (or its split parent) with --data works
        code, out, err = run_cli(capsys, "validate", bundle, "--data", moved, "--no-latency", "--no-sensitivity", "-q", *LENIENT)
        assert code == 0, err
    finally:
        moved.rename(val)
    code, out, err = run_cli(capsys, "validate", bundle, "--data", split_dir, "--no-latency", "--no-sensitivity", *LENIENT)
    assert code == 0, err
    assert "is a split" in err
    assert json.loads((bundle / "report" / "validation.json").read_text())["data"]["items"] == 40


def test_a_build_without_val_is_revalidated_on_its_calibration_subset_and_says_so(split_dir, tmp_path, capsys, no_int8_timing):
    out = tmp_path / "calib-only"
    code, _, err = run_cli(capsys, "build", EXAMPLES / "digits_vit.pt", "-t", "onnx", "--calib", split_dir / "calib",
                           "--calib-size", 24, "--seed", 3, "-o", out, "--no-latency", "--no-fallback", "-q", *LENIENT)
    assert code == 0, err
    rec = json.loads((out / "manifest.json").read_text())["validation_data"]
    assert rec["role"] == "calibration" and rec["subset_size"] == 24 and rec["seed"] == 3 and rec["items"] == 24
    code, stdout, err = run_cli(capsys, "validate", out, "--no-latency", "--no-sensitivity", *LENIENT)
    assert code == 0, err
    assert "calibration images the build validated on" in flat(err) and "not held-out" in flat(err)
    assert "validated on the build's calibration images" in flat(stdout)
    doc = json.loads((out / "report" / "validation.json").read_text())
    assert doc["data"]["role"] == "calibration" and doc["data"]["items"] == 24 and doc["data"]["data_hash"] == rec["data_hash"]
    assert "the calibration images, not held-out data" in (out / "report" / "summary.md").read_text()


def test_calibrate_on_a_split_parent_uses_its_calib_part(split_dir, capsys):
    code, out, err = run_cli(capsys, "calibrate", EXAMPLES / "digits_vit.pt", "--calib", split_dir, "-q")
    assert code == 0, err
    assert f"{split_dir} is a split: calibration calib/, validation val/" in flat(out)
    assert "calibration data: 30 images from" in flat(out)
