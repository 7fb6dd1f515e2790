"""Names the OS refuses are refused where they enter, in one line, before any work (docs/reliability.md, "Hostile
inputs, third round"): a name longer than the file system's limit (255 bytes), a path longer than PATH_MAX, a name
whose bytes are not UTF-8, in flags, vitedge.toml, matrix.toml (every row checked before the first is built) and the
environment variables that name folders. Each was an OSError or UnicodeEncodeError deep in the run (exit 3)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import CALIB_DIR, EXAMPLES, VAL_DIR
from rel_cli import assert_one_line, cli, cli_proc

# builds here pin what they refuse, replace or trust, not the INT8-vs-FP32 timing (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("no_int8_timing")

MODEL = EXAMPLES / "digits_vit.pt"
LONG = "n" * 300  # one name past the 255-byte limit
DEEP = "/".join(["d" * 200] * 25)  # 5,000 bytes: past PATH_MAX
NOT_UTF8 = os.fsdecode(b"caf\xe9")  # Latin-1 bytes, as a name from an old archive reads


def _cases():
    base = {
        "inspect MODEL": ["inspect", "{x}"],
        "build MODEL": ["build", "{x}", "-t", "onnx", "--calib", CALIB_DIR, "-o", "{t}/o"],
        "build --calib": ["build", MODEL, "-t", "onnx", "--calib", "{x}", "-o", "{t}/o"],
        "build --val": ["build", MODEL, "-t", "onnx", "--calib", CALIB_DIR, "--val", "{x}", "-o", "{t}/o"],
        "build -o": ["build", MODEL, "-t", "onnx", "--calib", CALIB_DIR, "-o", "{x}"],
        "build --cache-dir": ["build", MODEL, "-t", "onnx", "--calib", CALIB_DIR, "-o", "{t}/o", "--cache-dir", "{x}"],
        "calibrate -o": ["calibrate", MODEL, "--calib", CALIB_DIR, "-o", "{x}"],
        "export -o": ["export", MODEL, "-o", "{x}"],
        "validate BUNDLE": ["validate", "{x}", "--data", VAL_DIR],
        "validate --report-dir": ["validate", "{t}/b", "--data", VAL_DIR, "--report-dir", "{x}"],
        "compare NEW": ["compare", "{t}/old.json", "{x}"],
        "build-matrix MATRIX": ["build-matrix", "{x}"],
        "config --config": ["config", "--config", "{x}"],
    }
    out = []
    for name, args in base.items():
        for kind, value in (("long-name", LONG), ("not-utf8", NOT_UTF8)):
            out.append(pytest.param(args, value, kind, id=f"{name}-{kind}"))
    for name in ("inspect MODEL", "build -o", "build --calib"):
        out.append(pytest.param(base[name], DEEP, "deep", id=f"{name}-deep"))
    return out


MESSAGES = {"long-name": "longer than this file system's limit of 255 bytes per name",
            "not-utf8": "not UTF-8", "deep": "over this system's limit of 4095"}


@pytest.mark.parametrize("args,value,kind", _cases())
def test_a_path_the_os_refuses_is_a_usage_error(tmp_path, args, value, kind):
    where = str(tmp_path / value) if kind != "deep" else str(tmp_path / value)
    argv = [str(a).replace("{x}", where).replace("{t}", str(tmp_path)) for a in args]
    run = cli(*argv, cwd=tmp_path)
    line = assert_one_line(run, 2, MESSAGES[kind])
    assert "\udce9" not in line  # shown escaped
    assert list(tmp_path.iterdir()) == []


def test_a_model_named_in_latin1_is_refused_not_crashed(tmp_path):
    """A real file whose name is not UTF-8 (it exists): refused at the flag, nothing read or written."""
    model = Path(os.fsdecode(bytes(tmp_path) + b"/mod\xe8le.pt"))
    shutil.copy(MODEL, model)
    run = cli("build", model, "-t", "onnx", "--calib", CALIB_DIR, "-o", tmp_path / "out", cwd=tmp_path)
    assert_one_line(run, 2, "not UTF-8", "rename it")
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(model)]


@pytest.mark.parametrize("value,kind", [(LONG, "long-name"), (NOT_UTF8, "not-utf8")])
def test_vitedge_toml_path_values_are_checked(tmp_path, value, kind):
    (tmp_path / "vitedge.toml").write_text(f'model = {json.dumps(str(MODEL))}\ncalib = {json.dumps(value, ensure_ascii=False)}\n'
                                           if kind != "not-utf8" else f'model = {json.dumps(str(MODEL))}\ncalib = "{LONG}/x"\n')
    run = cli("config", cwd=tmp_path)
    assert_one_line(run, 2, "calib", MESSAGES["long-name"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vitedge.toml"]


def _matrix(root: Path, rows: list[tuple[str, str]]) -> Path:
    lines = [f"out = {json.dumps(str(root / 'mx'))}", "[build]", "latency = false", "fallback = false"]
    for name, calib in rows:
        lines += ["[[models]]", f"name = {json.dumps(name)}", f"path = {json.dumps(str(MODEL))}", f"calib = {json.dumps(calib)}",
                  'targets = ["onnx"]']
    (root / "matrix.toml").write_text("\n".join(lines) + "\n")
    return root / "matrix.toml"


MATRIX_CASES = [
    ("second-row-300-chars", [("digits", str(CALIB_DIR)), ("r" * 300, str(CALIB_DIR))], "#2 name"),
    ("row-240-chars", [("r" * 240, str(CALIB_DIR))], "takes at most"),
    ("second-row-calib-long", [("digits", str(CALIB_DIR)), ("b", "c" * 300)], "longer than this file system's limit"),
    ("row-calib-deep", [("digits", DEEP)], "over this system's limit"),
]


@pytest.mark.parametrize("rows,message", [pytest.param(r, m, id=i) for i, r, m in MATRIX_CASES])
def test_matrix_rows_are_all_checked_before_the_first_is_built(tmp_path, rows, message):
    matrix = _matrix(tmp_path, rows)
    run = cli("build-matrix", matrix, "--sequential", "-q", cwd=tmp_path)
    assert_one_line(run, 2, "matrix.toml", message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["matrix.toml"]  # no OUT, no row built


ENV_CASES = [
    ("VITEDGE_TARGETS_PATH", LONG, "longer than this file system's limit"),
    ("VITEDGE_TARGETS_PATH", NOT_UTF8, "not UTF-8"),
    ("VITEDGE_CACHE_DIR", LONG, "longer than this file system's limit"),
    ("VITEDGE_CACHE_DIR", NOT_UTF8, "not UTF-8"),
]


@pytest.mark.parametrize("name,value,message", ENV_CASES, ids=[f"{n}-{'long' if v == LONG else 'latin1'}" for n, v, _ in ENV_CASES])
def test_environment_folders_the_os_refuses(tmp_path, name, value, message, monkeypatch):
    """`targets` runs as a child process, as a user's shell starts it with the variable set; `calibrate` (which meets
    VITEDGE_CACHE_DIR only after loading, exporting and reading its data) runs in this process with the variable set
    here, the same string the child's interpreter would read from its environment: no second torch import per case."""
    if name == "VITEDGE_TARGETS_PATH":
        run = cli_proc("targets", cwd=tmp_path, env={name: str(tmp_path / value)})
    else:
        monkeypatch.setenv(name, str(tmp_path / value))
        run = cli("calibrate", MODEL, "--calib", CALIB_DIR, "-o", tmp_path / "m.onnx", cwd=tmp_path)
    assert_one_line(run, 2, name, message)
    assert list(tmp_path.iterdir()) == []


def test_a_long_name_past_the_flags_is_still_exit_2(tmp_path):
    """The last line of defence: an ENAMETOOLONG from anywhere maps to a usage error, never exit 3."""
    from vitedge.core.errors import environment_error

    err = OSError(36, "File name too long", str(tmp_path / LONG))
    mapped = environment_error(err)
    assert mapped is not None and mapped.exit_code == 2 and "longer than the file system allows" in str(mapped)
    mapped = environment_error(UnicodeEncodeError("utf-8", "a\udcffb", 1, 2, "surrogates not allowed"))
    assert mapped is not None and mapped.exit_code == 2 and "not UTF-8" in str(mapped)
