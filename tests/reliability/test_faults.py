"""Faults around a real bundle, the exit codes themselves, and the environment (full disk, bugs, interrupts):
each class gets its documented exit code, one line on stderr without a traceback (unless --debug), and no
bundle or cache entry is half-written or lost. One small bundle is built once for the whole module."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import stat
from pathlib import Path

import pytest
from conftest import CALIB_DIR, VAL_DIR
from rel_cli import assert_one_line, cli, debris, snapshot


@pytest.fixture(scope="module")
def bundle(timm_vit, tmp_path_factory, untimed_targets_dir):
    """A tiny random-weight ViT built for `onnx` on the labelled digits sets; it is at chance, so the build warns.
    Built without the INT8-vs-FP32 timing (not what these tests pin)."""
    from helpers.profiles import untimed_targets

    root = tmp_path_factory.mktemp("rel-bundle")
    old = os.umask(0o022)
    try:
        with untimed_targets(untimed_targets_dir):
            run = cli("build", timm_vit[1], "-t", "onnx", "--calib", CALIB_DIR, "--val", VAL_DIR, "-o", root / "b", "-q",
                      "--no-latency", "--no-fallback", "--min-agreement", "0", "--min-decisive-agreement", "0", "--max-top1-drop", "100", "--cache-dir", root / "cache")
    finally:
        os.umask(old)
    assert run.code == 0, run.err[-3000:]
    return root / "b", root / "cache", run


def _copy(bundle_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "bundle"
    shutil.copytree(bundle_dir, dst)
    return dst


def _edit_manifest(b: Path, change) -> Path:
    m = json.loads((b / "manifest.json").read_text())
    change(m)
    (b / "manifest.json").write_text(json.dumps(m))
    return b


def _report(bundle_dir: Path, tmp_path: Path, change=None) -> Path:
    doc = json.loads((bundle_dir / "report" / "validation.json").read_text())
    if change:
        change(doc)
    p = tmp_path / "report.json"
    p.write_text(json.dumps(doc))
    return p


# ------------------------------------------------------------------ wrong results that pass

def test_fp32_at_chance_on_labelled_data_is_warned_loudly_and_in_the_report(bundle):
    b, _, run = bundle
    warn = [ln for ln in run.lines if "WARNING" in ln]
    # this model's bundle was built with no --mean/--std: that guess is said too (its own line), and no other warning
    chance = [ln for ln in warn if "FP32 itself is at chance" in ln]
    guess = [ln for ln in warn if "normalisation is a guess" in ln]
    assert len(chance) == 1 and len(guess) == 1 and len(warn) == 2, run.err[-2000:]
    assert "FP32 itself is at chance" in (b / "report.md").read_text()
    doc = json.loads((b / "report" / "validation.json").read_text())
    assert doc["accuracy"]["warnings"] and doc["passed"] is True


def test_bundle_is_readable_by_others_as_the_umask_allows(bundle):
    b, _, _ = bundle
    modes = {p.relative_to(b).as_posix(): stat.S_IMODE(p.stat().st_mode) for p in [b, *b.rglob("*")]}
    assert modes.pop(".") == 0o755
    assert modes and all(m == (0o755 if (b / rel).is_dir() else 0o644) for rel, m in modes.items()), modes


# ------------------------------------------------------------------ damaged bundles and reports (validate, compare)

BUNDLE_CASES = [
    ("bundle-missing", lambda b, t: ["validate", t / "nope"], 2, ["does not exist"]),
    ("bundle-without-manifest", lambda b, t: (os.remove(b / "manifest.json"), ["validate", b])[1], 2, ["no manifest.json"]),
    ("manifest-not-json", lambda b, t: ((b / "manifest.json").write_text("{not json"), ["validate", b])[1], 2, ["not valid JSON"]),
    ("manifest-files-a-string", lambda b, t: ["validate", _edit_manifest(b, lambda m: m.__setitem__("files", "model.int8.onnx"))], 2, ["'files'"]),
    ("manifest-hash-a-number", lambda b, t: ["validate", _edit_manifest(b, lambda m: m["files"].__setitem__("model.int8.onnx", 5))], 2, ["files.model.int8.onnx"]),
    ("manifest-artifact-a-list", lambda b, t: ["validate", _edit_manifest(b, lambda m: m["artifacts"].__setitem__("model", ["x"]))], 2, ["artifacts.model"]),
    ("manifest-spec-preprocess-garbage", lambda b, t: ["validate", _edit_manifest(b, lambda m: m["model"]["spec"].__setitem__("preprocess", "garbage"))], 2, ["model.spec"]),
    ("manifest-section-missing", lambda b, t: ["validate", _edit_manifest(b, lambda m: m.pop("calibration"))], 2, ["calibration"]),
    ("manifest-not-vitedge", lambda b, t: ["validate", _edit_manifest(b, lambda m: m.__setitem__("schema", "other/1"))], 2, ["not a vitedge manifest"]),
    ("artifact-tampered", lambda b, t: ((b / "model.int8.onnx").write_bytes((b / "model.int8.onnx").read_bytes() + b"x"), ["validate", b])[1], 2, ["sha256"]),
    ("artifact-deleted", lambda b, t: (os.remove(b / "model.int8.onnx"), ["validate", b])[1], 2, ["missing"]),
    ("validate-data-missing", lambda b, t: ["validate", b, "--data", t / "nothing"], 2, ["does not exist"]),
    ("validate-threshold-nan", lambda b, t: ["validate", b, "--min-agreement", "nan", "--no-latency"], 2, ["min_agreement", "finite"]),
    ("compare-report-missing", lambda b, t: ["compare", t / "a.json", t / "b.json"], 2, ["does not exist"]),
    ("compare-report-not-json", lambda b, t: ["compare", _report(b, t), (t / "bad.json", (t / "bad.json").write_text("{"))[0]], 2, ["not valid JSON"]),
    ("compare-report-string-for-number", lambda b, t: ["compare", _report(b, t), _report(b, t / "n", lambda d: d["accuracy"].__setitem__("int8_top1", "high"))], 2, ["int8_top1", "not a number"]),
    ("compare-report-section-not-object", lambda b, t: ["compare", _report(b, t), _report(b, t / "n", lambda d: d.__setitem__("data", "x"))], 2, ["data"]),
    ("compare-bad-limit", lambda b, t: ["compare", _report(b, t), _report(b, t), "--max-latency-regression", "lots"], 2, ["--max-latency-regression"]),
]


@pytest.mark.parametrize("make, code, fragments", [c[1:] for c in BUNDLE_CASES], ids=[c[0] for c in BUNDLE_CASES])
def test_damaged_bundle_or_report_is_refused_in_one_line(make, code, fragments, bundle, tmp_path):
    b = _copy(bundle[0], tmp_path)
    (tmp_path / "n").mkdir()
    before = snapshot(bundle[0], bundle[1])
    run = cli(*make(b, tmp_path), "-q", cwd=tmp_path)
    assert_one_line(run, code, *fragments)
    assert debris(tmp_path) == [] and snapshot(bundle[0], bundle[1]) == before


def test_existing_bundle_is_kept_whole_without_force(bundle, timm_vit, tmp_path):
    b = _copy(bundle[0], tmp_path)
    before = snapshot(b, bundle[1])
    run = cli("build", timm_vit[1], "-t", "onnx", "--calib", CALIB_DIR, "-o", b, "-q", "--cache-dir", bundle[1])
    assert_one_line(run, 2, "exists", "--force")
    assert snapshot(b, bundle[1]) == before and debris(tmp_path, bundle[1]) == []


def test_a_gate_that_must_fail_exits_1(bundle, tmp_path):
    """No CPU runs a ViT in a picosecond: the p99 gate must fail, and the verdict is one error line."""
    run = cli("validate", bundle[0], "--max-p99-ms", "1e-9", "--latency-seconds", "0.05", "--no-sensitivity", "-q",
              "--report-dir", tmp_path / "r")
    assert run.code == 1, run.err[-2000:]
    assert "Traceback" not in run.err and run.lines[-1].startswith("vitedge: error:") and "p99 latency" in run.lines[-1]


# ------------------------------------------------------------------ exit codes mean what the README says

def _bug(*_a, **_k):
    raise ZeroDivisionError("a bug planted by the test")


def test_a_bug_is_exit_3_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr("vitedge.targets.table.list_profiles", _bug)
    run = cli("targets", cwd=tmp_path)
    assert_one_line(run, 3, "internal error", "ZeroDivisionError", "--debug")


def test_debug_shows_the_traceback_and_keeps_the_exit_code(monkeypatch, tmp_path):
    run = cli("--debug", "inspect", tmp_path / "missing.pt")
    assert run.code == 2 and "Traceback" in run.err and run.lines[-1].startswith("vitedge: error:")
    monkeypatch.setattr("vitedge.targets.table.list_profiles", _bug)
    run = cli("--debug", "targets")
    assert run.code == 3 and "Traceback" in run.err and "ZeroDivisionError" in run.err


def test_interrupt_is_130_and_leaves_nothing(monkeypatch, timm_vit, tmp_path):
    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr("vitedge.app.build.load_model", interrupted)
    run = cli("build", timm_vit[1], "-t", "onnx", "--calib", CALIB_DIR, "-o", tmp_path / "out", "-q", "--cache-dir", tmp_path / "cache")
    assert_one_line(run, 130, "interrupted")
    assert not (tmp_path / "out").exists() and debris(tmp_path) == []


@contextlib.contextmanager
def _small_file_limit():
    """Files of this process cannot grow past 1 MiB: a write past it fails with EFBIG, as on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_full_disk_is_exit_2_and_leaves_no_partial_file(timm_vit, tmp_path):
    with _small_file_limit():
        run = cli("export", timm_vit[1], "-o", tmp_path / "m.onnx", cwd=tmp_path)
    assert_one_line(run, 2, "file too large", "choose another -o")
    assert not (tmp_path / "m.onnx").exists() and debris(tmp_path) == []
