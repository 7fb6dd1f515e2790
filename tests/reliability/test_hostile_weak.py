"""Weak spots closed (docs/reliability.md, "Hostile inputs, third round"): an empty signing key, a manifest of an
unknown schema, Unicode format characters (bidi overrides) reaching the terminal, an option given twice, and a
class folder vitedge cannot read. Each case: its exit code or error, one line naming what was wrong, nothing changed."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import sys
import unicodedata
from pathlib import Path

import pytest
from conftest import CALIB_DIR, EXAMPLES, VAL_DIR
from rel_cli import assert_one_line, cli, cli_proc, snapshot

from vitedge.core.errors import FORMAT_RANGES, BundleError, UsageError, one_line, shown_controls
from vitedge.runtime import load
from vitedge.core.ui import literal

# builds here pin what they refuse, replace or trust, not the INT8-vs-FP32 timing (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("no_int8_timing")


@pytest.fixture
def bundle(runtime_bundles, tmp_path) -> Path:
    copy = tmp_path / "bundle"
    shutil.copytree(runtime_bundles["plain"]["onnx"], copy)
    return copy


# ---- an empty signing key ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["", "  ", "\t"], ids=["empty", "spaces", "tab"])
def test_empty_signing_key_is_refused_by_validate(bundle, key, monkeypatch):
    monkeypatch.setenv("VITEDGE_SIGNING_KEY", key)
    before = snapshot(bundle)
    run = cli("validate", bundle, "--data", VAL_DIR, "-q", "--no-latency")
    assert_one_line(run, 2, "VITEDGE_SIGNING_KEY is set but empty", "signature checks off")
    assert snapshot(bundle) == before


def test_empty_signing_key_is_refused_by_runtime_load(bundle, monkeypatch):
    monkeypatch.setenv("VITEDGE_SIGNING_KEY", "")
    with pytest.raises(UsageError, match="VITEDGE_SIGNING_KEY is set but empty"):
        load(bundle)


def test_a_key_that_is_not_utf8_signs_and_checks(bundle, monkeypatch):
    from vitedge.bundle import trust as bundle_trust

    monkeypatch.setitem(os.environb, b"VITEDGE_SIGNING_KEY", b"k\xff\xfe")
    bundle_trust.sign(bundle)
    load(bundle).close()
    monkeypatch.setitem(os.environb, b"VITEDGE_SIGNING_KEY", b"k\xff\xfd")
    with pytest.raises(BundleError, match="does not match"):
        load(bundle)


# ---- a manifest of a schema this vitedge does not read ----------------------------------------------------------

@pytest.mark.parametrize("schema", ["vitedge.manifest/2", "vitedge.manifest/1.1", "vitedge.manifest/", "vitedge.manifest/1 "])
def test_unknown_manifest_schema_is_refused(bundle, schema):
    path = bundle / "manifest.json"
    data = json.loads(path.read_text())
    data["schema"] = schema
    path.write_text(json.dumps(data))
    before = snapshot(bundle)
    with pytest.raises(BundleError, match="which this vitedge does not read"):
        load(bundle)
    run = cli("validate", bundle, "--data", VAL_DIR, "-q", "--no-latency")
    assert_one_line(run, 2, "which this vitedge does not read", "vitedge.manifest/1")
    assert snapshot(bundle) == before


# ---- Unicode format characters ----------------------------------------------------------------------------------

FORMAT_CHARS = ["\u202e", "\u202d", "\u2066", "\u2069", "\u200f", "\u061c", "\u200b", "\ufeff", "\u206e", "\U000e0041"]  # (U+2028 is whitespace: one_line makes it a space)


@pytest.mark.parametrize("char", FORMAT_CHARS, ids=[f"U+{ord(c):04X}" for c in FORMAT_CHARS])
def test_format_characters_in_a_path_are_shown_escaped(tmp_path, char):
    name = f"model{char}tp.pt"
    run = cli("inspect", tmp_path / name)
    line = assert_one_line(run, 2)
    assert char not in run.err and char not in run.out
    assert f"\\u{ord(char):04x}" in line or f"\\U{ord(char):08x}" in line, line
    assert list(tmp_path.iterdir()) == []


def test_literal_and_one_line_escape_format_characters():
    assert literal("a\u202eb[x]") == "a\\u202eb\\[x]"
    assert one_line("row\u2067 name") == "row\\u2067 name"
    assert shown_controls("é 中 ok") == "é 中 ok"  # letters of any script are left alone
    assert shown_controls("bad\udcffname") == "bad\\udcffname"  # a file name's byte that is not UTF-8


def test_format_ranges_cover_this_pythons_unicode():
    """FORMAT_RANGES is Unicode's Cf, Zl and Zp: every such character of the running Python's database is in it."""
    covered = {c for a, b in FORMAT_RANGES for c in range(a, b + 1)}
    wanted = {c for c in range(0xA0, sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF
              and unicodedata.category(chr(c)) in ("Cf", "Zl", "Zp")}
    assert wanted <= covered, sorted(hex(c) for c in wanted - covered)[:10]


# ---- an option given twice ----------------------------------------------------------------------------------------

REPEATS = {
    "build -o": ["build", EXAMPLES / "digits_vit.pt", "-t", "onnx", "--calib", CALIB_DIR, "-o", "{t}/a", "-o", "{t}/b"],
    "build --calib=": ["build", EXAMPLES / "digits_vit.pt", "-t", "onnx", "--calib", CALIB_DIR, f"--calib={VAL_DIR}", "-o", "{t}/a"],
    "build --val": ["build", EXAMPLES / "digits_vit.pt", "-t", "onnx", "--calib", CALIB_DIR, "--val", VAL_DIR, "--val", CALIB_DIR, "-o", "{t}/a"],
    "build --out/-o": ["build", EXAMPLES / "digits_vit.pt", "-t", "onnx", "--calib", CALIB_DIR, "--out", "{t}/a", "-o", "{t}/a"],
    "build --input-size": ["build", EXAMPLES / "digits_vit.pt", "-t", "onnx", "--calib", CALIB_DIR, "--input-size", "32", "32",
                           "--input-size", "16", "16", "-o", "{t}/a"],
    "calibrate --calib": ["calibrate", EXAMPLES / "digits_vit.pt", "--calib", CALIB_DIR, "--calib", VAL_DIR, "-o", "{t}/m.onnx"],
    "export -o": ["export", EXAMPLES / "digits_vit.pt", "-o", "{t}/a.onnx", "-o", "{t}/b.onnx"],
    "validate --data": ["validate", "{t}/bundle", "--data", VAL_DIR, "--data", CALIB_DIR],
    "compare --report-dir": ["compare", "{t}/old.json", "{t}/new.json", "--report-dir", "{t}/r", "--report-dir", "{t}/s"],
    "inspect --crop-pct": ["inspect", EXAMPLES / "digits_vit.pt", "--crop-pct", "0.9", "--crop-pct", "1.0"],
}


@pytest.mark.parametrize("case", sorted(REPEATS))
def test_an_option_given_twice_is_refused(tmp_path, case):
    args = [str(a).replace("{t}", str(tmp_path)) for a in REPEATS[case]]
    run = cli(*args)
    assert_one_line(run, 2, "is given twice", "keep the one you mean")
    assert list(tmp_path.iterdir()) == []


def test_options_that_take_several_values_may_repeat(tmp_path):
    run = cli("build", EXAMPLES / "digits_vit.pt", "-t", "onnx", "-t", "intel-cpu", "--calib", CALIB_DIR, "-o", tmp_path / "o",
              "--dry-run", "-q", "--mean", "0.5", "0.5", "0.5")
    assert run.code == 0, run.err
    assert list(tmp_path.iterdir()) == []


# ---- a class folder vitedge cannot read --------------------------------------------------------------------------

def _without_dac_override() -> None:
    """In the child: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH, so root too is refused a folder of mode 000."""
    libc = ctypes.CDLL(None, use_errno=True)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    for cap in (1, 2):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP: gone after exec too
    header, data = Header(0x20080522, 0), (Data * 2)()
    if libc.capget(ctypes.byref(header), data) == 0:
        for d in data:
            d.effective &= ~0b110
            d.permitted &= ~0b110
        libc.capset(ctypes.byref(header), data)


@pytest.mark.skipif(sys.platform != "linux", reason="folder permissions as Linux keeps them")
def test_an_unreadable_class_folder_is_refused(tmp_path):
    data = tmp_path / "calib"
    shutil.copytree(CALIB_DIR, data)
    locked = data / "3"
    locked.chmod(0)
    try:
        probe = cli_proc("inspect", "--list-archs", preexec_fn=_without_dac_override)  # the child runs at all
        assert probe.code == 0, probe.err
        if os.access(locked, os.R_OK) and os.geteuid() != 0:
            pytest.skip("this user can read a folder of mode 000")
        before = snapshot(data.parent)
        run = cli_proc("calibrate", EXAMPLES / "digits_vit.pt", "--calib", data, "-o", tmp_path / "m.onnx",
                       "--cache-dir", tmp_path / "cache", preexec_fn=_without_dac_override)
        assert_one_line(run, 2, "folder '3'", "cannot be read", "permission denied", "chmod")
        assert snapshot(data.parent) == before and not (tmp_path / "m.onnx").exists()
    finally:
        locked.chmod(0o755)


def test_empty_signing_key_is_refused_by_build_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setenv("VITEDGE_SIGNING_KEY", "")
    run = cli("build", EXAMPLES / "digits_vit.pt", "-t", "onnx", "--calib", CALIB_DIR, "-o", tmp_path / "out", "-q",
              "--cache-dir", tmp_path / "cache")
    assert_one_line(run, 2, "VITEDGE_SIGNING_KEY is set but empty")
    assert list(tmp_path.iterdir()) == []
