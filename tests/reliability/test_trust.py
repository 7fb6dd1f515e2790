"""Trust is explicit (issue #26 item 1): a project config found upward is read only inside the project
(no higher than the repository root or $HOME), only when the user owns it and no one else can write it;
keys that run code or loosen a gate are announced on stderr even with -q; reports record which config set
what; `vitedge init` writes any file name as a TOML string that cannot become a key.

Each case runs the CLI end to end and asserts the exit code, the line(s) on stderr, and that nothing
outside the output changed (the marker a hostile pickle would write, the user's files)."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
from conftest import CALIB_DIR, CUSTOM_VIT_SOURCE, EXAMPLES, VAL_DIR
from rel_cli import assert_one_line, cli, debris, snapshot

# builds here pin what they refuse, replace or trust, not the INT8-vs-FP32 timing (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("no_int8_timing")

DIGITS = EXAMPLES / "digits_vit.pt"


class _RunsCode:
    """Unpickling this writes a marker file: proof that code from the model file ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('code ran')",))


def _hostile_model(root: Path) -> tuple[Path, Path]:
    marker = root / "CODE-RAN"
    model = root / "downloaded.pt"
    import torch

    torch.save(_RunsCode(marker), model)  # a checkpoint archive whose pickle calls exec()
    return model, marker


def _config(folder: Path, text: str, mode: int = 0o644) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "vitedge.toml"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def _build(model: Path, out: Path, *extra) -> list:
    return ["build", "-q", model, "-t", "onnx", "--calib", CALIB_DIR, "-o", out, "--no-latency", *extra]


def _stderr(run) -> list[str]:
    assert "Traceback" not in run.err, run.err[-2000:]
    return run.lines


# ------------------------------------------------------------------ a config found upward

@pytest.mark.parametrize("mode,why", [(0o646, "others can write it"), (0o664, "group can write it"), (0o666, "group and others")])
def test_a_config_others_can_write_is_ignored_and_its_trust_pickle_runs_nothing(tmp_path, mode, why):
    project = tmp_path / "project"
    cfg = _config(project, "trust-pickle = true\n", mode)
    model, marker = _hostile_model(project)
    before = snapshot(project)
    run = cli(*_build(model, tmp_path / "out"), cwd=project)
    lines = _stderr(run)
    assert run.code == 2 and len(lines) == 2, run.err
    assert lines[0].startswith(f"vitedge: WARNING: ignoring {cfg}: {why}") and "chmod go-w" in lines[0] and "--config" in lines[0]
    assert "--trust-pickle" in lines[1]  # refused as without the key
    assert not marker.exists() and snapshot(project) == before and not (tmp_path / "out").exists()


def test_a_config_owned_by_another_user_is_ignored(tmp_path):
    if not hasattr(os, "getuid") or os.getuid() != 0:
        pytest.skip("giving a file to another user needs root")
    project = tmp_path / "project"
    cfg = _config(project, "trust-pickle = true\n")
    os.chown(cfg, 4242, 4242)
    model, marker = _hostile_model(project)
    run = cli(*_build(model, tmp_path / "out"), cwd=project)
    lines = _stderr(run)
    assert run.code == 2 and "owned by uid 4242, not by you" in lines[0] and "--trust-pickle" in lines[-1], run.err
    assert not marker.exists()


@pytest.mark.parametrize("stop", ["repository root", "home"])
def test_the_search_stops_at_the_repository_root_or_home(tmp_path, monkeypatch, stop):
    outer = tmp_path / "outer"
    _config(outer, "trust-pickle = true\n")  # above the project: never read, not even mentioned
    project = outer / "project"
    (project / "src").mkdir(parents=True)
    if stop == "repository root":
        (project / ".git").mkdir()
    else:
        monkeypatch.setenv("HOME", str(project))
    model, marker = _hostile_model(project)
    run = cli(*_build(model, tmp_path / "out"), cwd=project / "src")
    line = assert_one_line(run, 2, "--trust-pickle")
    assert "ignoring" not in line and not marker.exists()


def test_a_config_in_the_project_is_read_and_its_trust_pickle_is_announced_even_with_q(tmp_path):
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    cfg = _config(project, "trust-pickle = true\n")
    model, marker = _hostile_model(project)
    run = cli(*_build(model, tmp_path / "out"), cwd=project)
    lines = _stderr(run)
    assert run.code == 2 and len(lines) == 2, run.err
    assert lines[0].startswith(f"vitedge: {cfg} (found from the working directory upward") and "trust-pickle = true" in lines[0]
    assert "can run code" in lines[0]
    assert marker.exists()  # the user's own project config asked for it: honoured, and said
    assert not (tmp_path / "out").exists() and not debris(tmp_path)


def test_a_config_named_with_config_is_trusted_even_if_others_can_write_it_and_announced(tmp_path):
    cfg = _config(tmp_path / "elsewhere", f'model-class = "{tmp_path / "vit.py"}:TinyViT"\n', 0o666)
    (tmp_path / "vit.py").write_text(CUSTOM_VIT_SOURCE)
    run = cli("build", "-q", "--dry-run", "--config", cfg, DIGITS, "-t", "onnx", "--calib", CALIB_DIR, cwd=tmp_path)
    assert run.code == 0, run.err
    [line] = _stderr(run)
    assert line.startswith(f"vitedge: {cfg} (named with --config) sets what runs code or loosens a gate: model-class = ")
    assert "imports and runs a Python file" in line


def test_config_command_says_why_a_config_is_trusted_or_ignored(tmp_path):
    project = tmp_path / "project"
    cfg = _config(project, 'targets = ["onnx"]\n[thresholds]\nmin_agreement = 0.5\n')
    run = cli("config", cwd=project)
    assert run.code == 0 and "owned by you and writable only by you" in run.out and "run code or loosen a gate" in run.out, run.out
    os.chmod(cfg, 0o666)
    run = cli("config", cwd=project)
    lines = _stderr(run)
    assert run.code == 2 and len(lines) == 2 and lines[0].startswith(f"vitedge: WARNING: ignoring {cfg}") and "vitedge init" in lines[1]


# ------------------------------------------------------------------ thresholds from a config, and what the reports record

@pytest.fixture(scope="module")
def project_build(tmp_path_factory):
    """A project (a git root) whose vitedge.toml names model, data and a loosened gate; built with -q."""
    project = tmp_path_factory.mktemp("trust-project")
    (project / ".git").mkdir()
    cfg = _config(project, f'model = "{DIGITS}"\ncalib = "{CALIB_DIR}"\nval = "{VAL_DIR}"\ntargets = ["onnx"]\noutput = "b"\n'
                           'calib-size = 32\nno-latency = true\nno-fallback = true\n[thresholds]\nmin_agreement = 0.5\n')
    run = cli("build", "-q", "--cache-dir", project / "cache", cwd=project)
    return project, cfg, run


def test_gate_keys_from_the_project_config_are_announced_and_recorded(project_build):
    project, cfg, run = project_build
    assert run.code == 0, run.err[-3000:]
    announced = [ln for ln in run.lines if "sets what runs code or loosens a gate" in ln]
    assert len(announced) == 1 and "thresholds.min_agreement = 0.5 (sets the parity gate)" in announced[0]
    assert "no-latency = true (drops the speed gate)" in announced[0]
    doc = json.loads((project / "b" / "report" / "validation.json").read_text())
    record = doc["config"]
    assert record["file"] == str(cfg) and record["trusted"].startswith("found from the working directory upward")
    assert record["set"]["thresholds.min_agreement"] == 0.5 and record["set"]["calib-size"] == 32
    assert sorted(record["sensitive"]) == ["no-latency", "thresholds.min_agreement"]
    manifest = json.loads((project / "b" / "manifest.json").read_text())
    assert manifest["validation"]["config"] == record


def test_validate_ignores_gate_keys_of_a_config_others_can_write_and_records_that(project_build, tmp_path):
    project, _, run = project_build
    assert run.code == 0, run.err[-3000:]
    work = tmp_path / "work"
    cfg = _config(work, "[thresholds]\nmin_agreement = 0.0\nmax_top1_drop = 100.0\n", 0o666)
    run = cli("validate", project / "b", "--no-latency", "--no-sensitivity", "-q", "--report-dir", tmp_path / "r", cwd=work)
    assert run.code == 0, run.err[-2000:]
    assert any(ln.startswith(f"vitedge: WARNING: ignoring {cfg}") for ln in run.lines)
    assert not any("sets what runs code" in ln for ln in run.lines)
    doc = json.loads((tmp_path / "r" / "validation.json").read_text())
    assert doc["thresholds"]["overridden"] == [] and doc["thresholds"]["min_agreement"] != 0.0
    assert doc["config"]["file"] is None and doc["config"]["ignored"] == str(cfg) and "others" in doc["config"]["why_ignored"]


def test_validate_with_a_trusted_gate_key_says_so_even_with_q(project_build, tmp_path):
    project, _, run = project_build
    work = tmp_path / "work"
    (work / ".git").mkdir(parents=True)
    cfg = _config(work, "[thresholds]\nmin_agreement = 0.25\n")
    run = cli("validate", project / "b", "--no-latency", "--no-sensitivity", "-q", "--report-dir", tmp_path / "r", cwd=work)
    assert run.code == 0, run.err[-2000:]
    [line] = [ln for ln in run.lines if "sets what runs code" in ln]
    assert line.startswith(f"vitedge: {cfg} (found") and "thresholds.min_agreement = 0.25" in line
    doc = json.loads((tmp_path / "r" / "validation.json").read_text())
    assert doc["thresholds"]["min_agreement"] == 0.25 and doc["config"]["sensitive"] == ["thresholds.min_agreement"]


# ------------------------------------------------------------------ vitedge init writes any name safely

@pytest.mark.parametrize("name", [
    'm\nmodel-class = "evil.py:C"\n#.pt',  # a newline: must not end the comment or the string
    'q"uote.pt',
    "back\\slash.pt",
    "del\x7fete.pt",
    "tab\tand\u2028sep.pt",
])
def test_init_writes_any_file_name_as_one_toml_string(tmp_path, name):
    model = tmp_path / name
    model.write_bytes(DIGITS.read_bytes())
    out = tmp_path / "vitedge.toml"
    outside = snapshot(EXAMPLES)
    run = cli("init", model, "-o", out, cwd=tmp_path)
    assert run.code == 0 and not run.lines, run.err
    data = tomllib.loads(out.read_text())
    assert "model-class" not in data and "model_class" not in data
    assert data["model"] == name
    assert "evil.py" not in "".join(ln for ln in out.read_text().splitlines() if not ln.startswith("#")
                                                                             and not ln.startswith("model ="))
    assert snapshot(EXAMPLES) == outside and sorted(p.name for p in tmp_path.iterdir()) == sorted([name, "vitedge.toml"])


@pytest.mark.parametrize("targets,announced", [('["onnx"]', False), ('["loose.toml"]', True)])
def test_targets_are_announced_only_when_one_is_a_profile_file(tmp_path, targets, announced):
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "loose.toml").write_text('backend = "onnxruntime"\nprecision = "int8"\n[thresholds]\nmin_agreement = 0.0\n')
    _config(project, f"targets = {targets}\n")
    run = cli("build", "-q", "--dry-run", DIGITS, "--calib", CALIB_DIR, cwd=project)
    assert run.code == 0, run.err
    lines = _stderr(run)
    if announced:
        assert len(lines) == 1 and "targets = [" in lines[0] and "a profile file carries its own [thresholds]" in lines[0], run.err
    else:
        assert lines == [], run.err
