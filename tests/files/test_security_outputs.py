"""Data safety of outputs: --force replaces only what vitedge wrote, a --force swap killed between its
steps never leaves the bundle path empty, killed runs' debris is cleaned by later runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from helpers.cli import default_sigint

from vitedge.core.errors import UsageError
from vitedge.files.outputs import check_replaceable, prepare_outputs
from vitedge.files.swap import journal_path, recover_swap

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "examples" / "digits_vit.pt"
CALIB = REPO / "calibration" / "digits" / "calib"


def _bundle(path: Path, tag: str) -> Path:
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(json.dumps({"schema": "vitedge.manifest/1", "tag": tag}))
    (path / "model.onnx").write_text(tag)
    return path


def _tag(path: Path) -> str:
    return json.loads((path / "manifest.json").read_text())["tag"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_force_refuses_what_vitedge_did_not_write(tmp_path):
    user = tmp_path / "d"
    (user / "cal").mkdir(parents=True)
    (user / "model.pt").write_bytes(b"weights")
    (user / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="did not write"):
        check_replaceable(user)
    afile = tmp_path / "existing_file"
    afile.write_text("x")
    with pytest.raises(UsageError, match="existing file"):
        check_replaceable(afile)
    check_replaceable(_bundle(tmp_path / "b", "old"))  # a bundle: fine
    tree = tmp_path / "tree"
    _bundle(tree / "onnx", "a"), _bundle(tree / "intel-cpu", "b")
    with pytest.raises(UsageError, match="holds the bundles of 2 builds"):
        check_replaceable(tree)  # a folder of bundles: a one-bundle output would delete them all
    (tmp_path / "empty").mkdir()
    check_replaceable(tmp_path / "empty")
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "manifest.json").write_text('{"schema": "somebody-else/1"}')
    with pytest.raises(UsageError, match="did not write"):
        check_replaceable(fake)


def test_cli_build_force_into_user_folder_deletes_nothing(tmp_path):
    d = tmp_path / "d"
    (d / "cal").mkdir(parents=True)
    model = d / "model.pt"
    model.write_bytes(DIGITS.read_bytes())
    (d / "unrelated.txt").write_text("keep me")
    r = subprocess.run([sys.executable, "-m", "vitedge", "build", str(model), "--target", "onnx", "--calib", str(CALIB), "-o", str(d),
                        "--force"], capture_output=True, text=True, timeout=300)
    # the folder holds the model: refused as an input's folder, the first check of the replace rule
    assert r.returncode == 2 and "an input of this run" in r.stderr and "Traceback" not in r.stderr
    assert model.is_file() and (d / "cal").is_dir() and (d / "unrelated.txt").read_text() == "keep me"


_SWAP = textwrap.dedent("""
    import os, signal, sys, json
    from pathlib import Path
    from vitedge.files import atomic as fsutil, swap
    final, step, exchange = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "exchange"
    if not exchange:
        swap.exchange = lambda a, b: False
    def hook(name):
        if name == step:
            os.kill(os.getpid(), signal.SIGKILL)
    swap.between_steps = hook
    with fsutil.atomic_output_dir(final, force=True) as tmp:
        (tmp / "manifest.json").write_text(json.dumps({"schema": "vitedge.manifest/1", "tag": "new"}))
        (tmp / "model.onnx").write_text("new")
    print("finished")
""")


def _killed_swap(final: Path, step: str, mode: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _SWAP, str(final), step, mode], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_exchange_swap_killed_before_cleanup_keeps_a_whole_bundle(tmp_path):
    final = _bundle(tmp_path / "bundle", "old")
    _killed_swap(final, "exchanged", "exchange")
    assert _tag(final) == "new" and (final / "model.onnx").read_text() == "new"  # one exchange: never empty
    debris = [p for p in tmp_path.iterdir() if p.name != "bundle"]
    assert len(debris) == 1 and debris[0].name.endswith(".partial")  # the old bundle, awaiting cleanup
    prepare_outputs([final], force=True)  # the next run
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]


@pytest.mark.parametrize("step,expect,said", [
    ("journal written", "old", None),  # nothing renamed yet: rolled back silently
    ("old moved aside", "new", "finished the swap"),  # the bundle path was empty: completed, and said so
    ("new moved in", "new", None),  # only the old copy's removal was left
])
def test_journalled_swap_killed_between_renames_is_completed_or_rolled_back(tmp_path, step, expect, said):
    final = _bundle(tmp_path / "bundle", "old")
    _killed_swap(final, step, "journal")
    assert journal_path(final).exists()
    messages: list[str] = []
    recover_swap(final, say=messages.append)
    assert _tag(final) == expect
    assert (said is None and not messages) or (said and said in messages[0])
    prepare_outputs([final], force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["bundle"]


def test_readers_recover_a_half_done_swap(tmp_path):
    from vitedge.core.errors import BundleError
    from vitedge.bundle.manifest import read_manifest

    final = _bundle(tmp_path / "bundle", "old")
    _killed_swap(final, "old moved aside", "journal")
    assert not final.exists()
    with pytest.raises(BundleError, match="lacks"):  # the fake manifest is read: the bundle is back at its path
        read_manifest(final)
    assert _tag(final) == "new"


def test_debris_of_killed_runs_is_cleaned_and_live_runs_are_left_alone(tmp_path, monkeypatch):
    dead, alive = _dead_pid(), os.getppid()
    final = _bundle(tmp_path / "bundle", "old")
    stale = [tmp_path / f".bundle.vitedge-{dead}-k3x_9abc.partial", tmp_path / f".bundle.vitedge-old-{dead}",
             tmp_path / f".bundle.json.vitedge-{dead}-ab12cd34.partial"]
    stale[0].mkdir(), stale[1].mkdir()
    stale[2].write_text("{")
    live = tmp_path / f".bundle.vitedge-{alive}-zzzzzzzz.partial"
    live.mkdir()
    users = [tmp_path / f".bundle.{dead}.k3x_9.partial", tmp_path / f".bundle.old-{dead}"]  # look-alikes a user made
    users[0].mkdir(), users[1].mkdir()
    work = tmp_path / "tmp"
    work.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(work))
    (work / f"vitedge-build-{dead}-abc_1234").mkdir()
    (work / f"vitedge-build-{alive}-abc_1234").mkdir()
    (work / "unrelated-123.partial").mkdir()
    (work / f"vitedge-build-{dead}-mine").mkdir()  # not the 8 random characters tempfile adds: not ours
    from vitedge.files.atomic import atomic_write_path

    with atomic_write_path(tmp_path / "other.txt") as tmp:
        tmp.write_text("x")
    prepare_outputs([final], force=True)
    assert not any(p.exists() for p in stale) and live.exists() and final.exists() and all(p.exists() for p in users)
    assert sorted(p.name for p in work.iterdir()) == sorted([f"vitedge-build-{alive}-abc_1234", "unrelated-123.partial",
                                                             f"vitedge-build-{dead}-mine"])


# Runs `vitedge build` in a child that signals itself inside the Nth bundle write: deterministic, and the
# partial bundle folder and the temporary build folder exist when the signal arrives.
_SIGNAL_IN_BUILD = textwrap.dedent("""
    import contextlib, os, signal, sys
    from vitedge.cli import entry as cli
    from vitedge.app import build as pipeline
    sig, nth = getattr(signal, sys.argv[1]), int(sys.argv[2])
    real, calls = pipeline.atomic_output_dir, []
    @contextlib.contextmanager
    def signalling(final, **kw):
        with real(final, **kw) as tmp:
            calls.append(final)
            if len(calls) == nth:
                os.kill(os.getpid(), sig)
            yield tmp
    pipeline.atomic_output_dir = signalling
    cli.main(sys.argv[3:])
""")


def _build_signalled(tmp_path: Path, sig: str, nth: int, *args) -> subprocess.CompletedProcess:
    work = tmp_path / "tmp"
    work.mkdir()
    env = dict(os.environ, TMPDIR=str(work))
    return subprocess.run([sys.executable, "-c", _SIGNAL_IN_BUILD, sig, str(nth), "build", str(DIGITS), "--calib", str(CALIB),
                           "--no-latency", "--no-fallback", "--calib-size", "16", *map(str, args)],
                          capture_output=True, text=True, timeout=600, env=env, preexec_fn=default_sigint)


def _leftovers(tmp_path: Path) -> list[str]:
    found = [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("vitedge-")]
    return found + [str(p) for p in tmp_path.rglob("*.partial")] + [str(p) for p in tmp_path.rglob("*.vitedge-old-*")]


def test_sigterm_cleans_up_like_ctrl_c_and_exits_143(tmp_path):
    out = tmp_path / "bundle"
    r = _build_signalled(tmp_path, "SIGTERM", 1, "--target", "onnx", "-o", out)
    assert r.returncode == 143, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("vitedge: terminated (SIGTERM)") and "Traceback" not in r.stderr
    assert not out.exists() and _leftovers(tmp_path) == []


def test_ctrl_c_during_the_second_target_says_what_was_kept(tmp_path):
    profile = tmp_path / "edge-box.toml"
    profile.write_text('backend = "onnxruntime"\nprecision = "int8"\nbatch_sizes = [1]\n[backend_options]\ngraph_optimization = "basic"\n')
    out = tmp_path / "out"
    r = _build_signalled(tmp_path, "SIGINT", 2, "--target", "onnx", "--target", profile, "-o", out)
    assert r.returncode == 130, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "complete bundles kept: onnx" in last and "--target edge-box -o" in last and "Traceback" not in r.stderr
    assert (out / "onnx" / "manifest.json").is_file() and not (out / "edge-box").exists() and _leftovers(tmp_path) == []


def test_force_refuses_a_bundle_holding_an_input_of_the_run(tmp_path):
    out = _bundle(tmp_path / "bundle", "old")
    model = out / "digits_vit.pt"
    model.write_bytes(DIGITS.read_bytes())
    with pytest.raises(UsageError, match="an input of this run"):
        prepare_outputs([out], force=True, inputs=(model, CALIB, None))
    assert model.is_file()
    prepare_outputs([out], force=True, inputs=(DIGITS, CALIB, None))  # inputs elsewhere: fine


def test_export_force_never_overwrites_its_own_model(tmp_path):
    import onnx

    src = tmp_path / "m.onnx"
    onnx.save(onnx.helper.make_model(onnx.helper.make_graph([], "g", [], [])), str(src))
    before = src.read_bytes()
    r = subprocess.run([sys.executable, "-m", "vitedge", "export", str(src), "-o", str(src), "--force"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "an input of this run" in r.stderr and src.read_bytes() == before


def test_a_forged_journal_cannot_make_recovery_delete_other_folders(tmp_path):
    final = _bundle(tmp_path / "bundle", "old")
    precious = tmp_path / "precious"
    precious.mkdir()
    journal_path(final).write_text(json.dumps({"pid": _dead_pid(), "new": "precious", "old": "precious"}))
    messages: list[str] = []
    recover_swap(final, say=messages.append)
    assert precious.is_dir() and _tag(final) == "old" and "unreadable swap journal" in messages[0]
