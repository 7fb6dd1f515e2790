"""A run deletes only what it wrote (issue 46, class 3). With one --target, -o names the bundle itself, so
`build -o OUT --force` over an OUT holding several targets' bundles used to replace OUT whole, deleting bundles
the run never rebuilds. A folder of bundles, a bundle holding bundles, or a place inside a bundle is refused
before any work (vitedge/files/outputs.py); every case asserts exit 2, the one line, and that every bundle is intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CALIB_DIR, EXAMPLES
from rel_cli import assert_one_line, cli, debris, snapshot

# builds here pin what they refuse, replace or trust, not the INT8-vs-FP32 timing (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("no_int8_timing")

DIGITS = EXAMPLES / "digits_vit.pt"


def _bundle(path: Path, tag: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_text(json.dumps({"schema": "vitedge.manifest/1", "tag": tag}))
    (path / "model.int8.onnx").write_text(tag)
    return path


def _build(out: Path, *targets: str) -> list:
    return ["build", "-q", DIGITS, *[a for t in targets for a in ("-t", t)], "--calib", CALIB_DIR, "-o", out, "--force",
            "--no-latency"]


def _refused(tmp_path: Path, args: list, *fragments: str) -> str:
    before = snapshot(tmp_path)
    run = cli(*args)
    line = assert_one_line(run, 2, *fragments)
    assert snapshot(tmp_path) == before and not debris(tmp_path)
    return line


@pytest.mark.parametrize("held,target", [
    (["onnx", "intel-cpu"], "onnx"),  # the other target's bundle would go
    (["intel-cpu"], "onnx"),  # only another target's bundle in OUT
    (["onnx"], "onnx"),  # OUT/onnx is the bundle to replace, not OUT
    (["intel-cpu", "jetson", "nvidia-gpu"], "intel-cpu"),
    (["row-a", "row-b"], "onnx"),  # a build-matrix OUT's row bundles
])
def test_one_target_over_a_folder_of_bundles_deletes_none_of_them(tmp_path, held, target):
    out = tmp_path / "OUT"
    for name in held:
        _bundle(out / name, name)
    line = _refused(tmp_path, _build(out, target), f"-o {out} holds the bundles of {len(held)} build",
                    f"pass -o {out / sorted(held)[0]} to replace that one")
    assert "--force would delete them all" in line


def test_a_bundle_that_holds_other_bundles_is_not_replaced_with_them(tmp_path):
    out = _bundle(tmp_path / "OUT", "top")
    _bundle(out / "intel-cpu", "inner")  # a several-target build once wrote into it
    _refused(tmp_path, _build(out, "onnx"), f"-o {out} is a bundle that holds other bundles (intel-cpu)")


@pytest.mark.parametrize("targets", [("onnx", "intel-cpu"), ("onnx",)])
def test_no_bundle_is_written_inside_another(tmp_path, targets):
    outer = _bundle(tmp_path / "B", "outer")
    out = outer if len(targets) > 1 else outer / "sub"
    _refused(tmp_path, _build(out, *targets), f"is inside the bundle {outer}", "never written into another")


def test_a_folder_of_bundles_plus_a_file_of_yours_is_still_refused(tmp_path):
    out = tmp_path / "OUT"
    _bundle(out / "onnx", "a")
    (out / "notes.txt").write_text("mine")
    _refused(tmp_path, _build(out, "onnx"), f"-o {out} holds the bundles of 1 build (onnx)")
