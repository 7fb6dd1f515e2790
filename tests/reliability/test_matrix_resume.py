"""build-matrix verdicts come only from what really ran and was asked (issue 26 item 3).

A row resumes only from a bundle built from the same model bytes, profile, thresholds, settings
and data; a row name cannot leave the output folder; two rows that resolve to one bundle folder are
refused before any work. Refusals assert the exit code, the one line and that nothing changed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import CALIB_DIR
from rel_cli import assert_one_line, cli, debris, snapshot


def _matrix(root: Path, model: Path, *, name: str | None = None, targets=("onnx",), build: str = "latency = false\nfallback = false\n",
            calib: Path | str = CALIB_DIR, file: str = "matrix.toml") -> Path:
    lines = [f"out = {json.dumps(str(root / 'mx'))}", "[build]", build, "[[models]]"]
    if name is not None:
        lines.append(f"name = {json.dumps(name)}")
    lines += [f"path = {json.dumps(str(model))}", f"calib = {json.dumps(str(calib))}", f"targets = {json.dumps(list(targets))}"]
    p = root / file
    p.write_text("\n".join(lines) + "\n")
    return p


def _twin_profile(root: Path) -> str:
    """A copy of targets/onnx.toml in another folder: the same file stem, so the same profile name 'onnx'."""
    from vitedge.core.paths import targets_dir

    (root / "mine").mkdir()
    shutil.copy(targets_dir() / "onnx.toml", root / "mine" / "onnx.toml")
    return str(root / "mine" / "onnx.toml")


CASES = [
    ("row-name-climbs-out", lambda root, m: _matrix(root, m, name="../../x"), ["name '../../x'", "plain folder name"]),
    ("row-name-absolute", lambda root, m: _matrix(root, m, name=str(root / "abs")), ["is not a plain folder name"]),
    ("row-name-dotdot", lambda root, m: _matrix(root, m, name=".."), ["name '..'"]),
    ("row-name-newline", lambda root, m: _matrix(root, m, name="a\nb"), ["control character"]),
    ("two-profiles-one-stem", lambda root, m: _matrix(root, m, targets=("onnx", _twin_profile(root))), ["both write", "distinct 'name'"]),
    ("matrix-seed-huge", lambda root, m: _matrix(root, m, build="seed = 99999999999\n"), ["[build]", "seed"]),
    ("matrix-threshold-nan", lambda root, m: _matrix(root, m, build="min_agreement = nan\n"), ["[build]", "min_agreement"]),
]


@pytest.mark.parametrize("make, fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_matrix_rows_that_could_escape_or_collide_are_refused_before_any_work(make, fragments, timm_vit, tmp_path):
    root = tmp_path / "work"
    root.mkdir()
    matrix = make(root, timm_vit[1])
    before = snapshot(tmp_path)
    run = cli("build-matrix", matrix, "--sequential", "-q", cwd=root)
    assert_one_line(run, 2, *fragments)
    assert snapshot(tmp_path) == before and not (root / "mx").exists() and debris(tmp_path) == []


def _rows(root: Path) -> dict:
    return {r["label"]: r for r in json.loads((root / "mx" / "matrix.json").read_text())["rows"]}


def test_a_row_resumes_only_from_what_it_asks(timm_vit, tmp_path, no_int8_timing):
    """Built once; the same matrix resumes; looser thresholds, another calibration subset, other data or another
    model file each rebuild the row, and the verdict is the new build's."""
    model = tmp_path / "m.pt"
    shutil.copy(timm_vit[1], model)
    data = tmp_path / "calib"
    shutil.copytree(CALIB_DIR, data)
    strict = "latency = false\nfallback = false\nnear_tie_margin = 0\ndrop_confidence = 0\n"  # the plain gate: every flip counts

    def run(build: str):
        r = cli("build-matrix", _matrix(tmp_path, model, build=build, calib=data), "--sequential", "-q", cwd=tmp_path)
        assert r.code in (0, 1), r.err[-3000:]
        return r.code, _rows(tmp_path)["m/onnx"]

    code, row = run(strict)
    assert not row["resumed"] and code == 1 and row["status"] == "fail"  # the default gate: this random ViT misses it
    code, row = run(strict)
    assert row["resumed"] and code == 1  # nothing changed: resumed, the same verdict

    loose = strict + "max_top1_drop = 100\nmin_agreement = 0\n"
    code, row = run(loose)
    assert not row["resumed"] and code == 0 and row["status"] == "pass"  # rebuilt under the looser gate it asked for
    code, row = run(strict)
    assert not row["resumed"] and code == 1  # and back: the looser bundle is not reused for the strict row

    code, row = run(strict + "calib_size = 40\n")
    assert not row["resumed"]  # another calibration subset

    victim = next((data / "5").iterdir())
    shutil.copy(next((data / "6").iterdir()), victim)  # the same path, other content
    code, row = run(strict + "calib_size = 40\n")
    assert not row["resumed"]  # other data under the same folder name

    import torch

    sd = torch.load(model, weights_only=True)
    sd["head.bias"] = sd["head.bias"] + 1.0
    torch.save(sd, model)
    code, row = run(strict + "calib_size = 40\n")
    assert not row["resumed"]  # another model file under the same name
    code, row = run(strict + "calib_size = 40\n")
    assert row["resumed"]  # and once built from all of that, it resumes again
    assert debris(tmp_path) == []
