"""`vitedge build` as a user types it on the bundled example: the summary, the stage lines and the exit code of a
passing and of a failing build (split from test_build.py so `--dist loadfile` can run it on the other worker)."""

from __future__ import annotations

import json

import pytest
from conftest import CALIB_DIR, EXAMPLES, VAL_DIR
from helpers.cli import run_vitedge, spawn_vitedge

DIGITS = EXAMPLES / "digits_vit.pt"
pytestmark = pytest.mark.skipif(not DIGITS.exists(), reason="bundled example not present")


def test_cli_build_summary_and_exit_code(tmp_path, no_int8_timing):
    out = tmp_path / "b"
    proc = spawn_vitedge("build", DIGITS, "--target", "onnx", "--calib", CALIB_DIR, "--val", VAL_DIR, "-o", out, "--cache-dir",
                         tmp_path / "cache", "--no-latency", "--min-agreement", "0.5", "--max-top1-drop", "5")
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr
    assert "vitedge build" in stdout and "PASS" in stdout and "onnx" in stdout
    for stage in ("load", "export", "calibrate", "quantize", "build", "validate"):
        assert f"{stage} done in" in stderr
    # a pipe is not a terminal: rich would wrap at 80 columns; each gate row stays one line (CI logs, grep)
    [drop_line] = [ln for ln in stderr.splitlines() if "PASS top-1" in ln and "% vs FP32" in ln]
    assert "interval" in drop_line and "exact paired test" in drop_line and len(drop_line) > 80, drop_line
    # A build that must fail its gate: no ViT runs a batch in 1 microsecond at p99. Run in this process (the same
    # `main` as `python -m vitedge`): the child above already showed what a user's terminal gets, this one pins the
    # exit code, and a second child would import torch and timm again for nothing.
    code, err = run_vitedge(["build", str(DIGITS), "--target", "onnx", "--calib", str(CALIB_DIR), "-o", str(tmp_path / "c"),
                             "--cache-dir", str(tmp_path / "cache"), "--max-p99-ms", "0.001", "-q"])
    assert code == 1, err
    assert "1 of 1 target(s) failed the parity gate" in err and "p99 latency" in err and "max_p99_ms" not in err
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())  # the bundle is kept, marked failed
    rows = {r["name"]: r for r in manifest["validation"]["gate"]}
    assert manifest["validation"]["passed"] is False and rows["max_p99_ms"]["passed"] is False
