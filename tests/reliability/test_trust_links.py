"""Trust through a link (issue 46, class 1): a project config found upward is judged by who owns the link
itself and every folder on the way (``lstat``, never through the link), not by the file the link leads to.

Another local user who can write a shared parent folder must not be able to plant ``vitedge.toml ->
/home/you/some-config-of-yours`` (a file you own, so ``stat`` said "yours") and have its keys honoured.
Each case asserts the exit code, the warning line naming the reason, that nothing the config asks for ran,
and that no file changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import CALIB_DIR
from rel_cli import cli, snapshot

# builds here pin what they refuse, replace or trust, not the INT8-vs-FP32 timing (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("no_int8_timing")

OTHER = 4242  # a user id that is not ours

needs_root = pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0,
                                reason="giving a link or folder to another user needs root")


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('code ran')",))


def _project(root: Path) -> Path:
    project = root / "project"
    (project / ".git").mkdir(parents=True)
    return project


def _own_file(folder: Path, name: str, text: str, mode: int = 0o644) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text)
    os.chmod(path, mode)
    return path


def _link(at: Path, to: Path, uid: int | None = None) -> Path:
    at.symlink_to(to)
    if uid is not None:
        os.lchown(at, uid, uid)
    return at


def _ignored(tmp_path: Path, project: Path, shown: Path, why: str) -> None:
    """`vitedge config` ignores the config with one warning naming ``why``, and nothing changed."""
    before = snapshot(tmp_path)
    run = cli("config", cwd=project)
    assert "Traceback" not in run.err, run.err[-2000:]
    assert run.code == 2 and len(run.lines) == 2, (run.code, run.err)
    assert run.lines[0].startswith(f"vitedge: WARNING: ignoring {shown}: ") and why in run.lines[0], run.lines[0]
    assert "--config" in run.lines[0] and "vitedge init" in run.lines[1]
    assert snapshot(tmp_path) == before


@needs_root
@pytest.mark.parametrize("name,text", [("vitedge.toml", "trust-pickle = true\n"),
                                       ("pyproject.toml", "[tool.vitedge]\ntrust-pickle = true\n")])
def test_a_link_another_user_planted_to_a_file_of_yours_is_ignored(tmp_path, name, text):
    project = _project(tmp_path)
    mine = _own_file(tmp_path / "mine", "settings.toml", text)
    cfg = _link(project / name, mine, OTHER)
    _ignored(tmp_path, project, cfg, f"it is a link owned by uid {OTHER}, not by you")


@needs_root
def test_the_planted_links_key_runs_nothing_in_a_build(tmp_path):
    project = _project(tmp_path)
    mine = _own_file(tmp_path / "mine", "old.toml", "trust-pickle = true\n")
    cfg = _link(project / "vitedge.toml", mine, OTHER)
    marker = tmp_path / "CODE-RAN"
    import torch

    torch.save(_RunsCode(marker), project / "downloaded.pt")
    before = snapshot(tmp_path)
    run = cli("build", "-q", project / "downloaded.pt", "-t", "onnx", "--calib", CALIB_DIR, "-o", tmp_path / "out", cwd=project)
    assert "Traceback" not in run.err and run.code == 2 and len(run.lines) == 2, run.err
    assert run.lines[0].startswith(f"vitedge: WARNING: ignoring {cfg}: it is a link owned by uid {OTHER}")
    assert "--trust-pickle" in run.lines[1]
    assert not marker.exists() and not (tmp_path / "out").exists() and snapshot(tmp_path) == before


@needs_root
def test_a_link_of_yours_into_a_folder_another_user_owns_is_ignored(tmp_path):
    project = _project(tmp_path)
    theirs = tmp_path / "theirs"
    target = _own_file(theirs, "cfg.toml", "trust-pickle = true\n")
    os.chown(theirs, OTHER, OTHER)  # they can swap cfg.toml for anything at any time
    cfg = _link(project / "vitedge.toml", target)
    _ignored(tmp_path, project, cfg, f"the folder {theirs} on its way is owned by uid {OTHER}")


@needs_root
def test_a_chain_of_links_with_one_planted_hop_is_ignored(tmp_path):
    project = _project(tmp_path)
    mine = _own_file(tmp_path / "mine", "cfg.toml", "trust-pickle = true\n")
    hop = _link(tmp_path / "mine" / "hop.toml", mine, OTHER)
    cfg = _link(project / "vitedge.toml", hop)
    _ignored(tmp_path, project, cfg, f"{hop} is a link owned by uid {OTHER}")


@needs_root
def test_a_folder_above_the_project_owned_by_another_user_is_ignored(tmp_path):
    shared = tmp_path / "shared"
    project = _project(shared)
    cfg = _own_file(project, "vitedge.toml", "trust-pickle = true\n")
    os.chown(shared, OTHER, OTHER)  # they can rename project/ away and put their own in its place
    _ignored(tmp_path, project, cfg, f"the folder {shared} on its way is owned by uid {OTHER}")


@pytest.mark.parametrize("mode,who", [(0o777, "group and others"), (0o757, "others"), (0o775, "group")])
def test_a_config_in_a_folder_others_can_write_is_ignored(tmp_path, mode, who):
    project = _project(tmp_path)
    cfg = _own_file(project, "vitedge.toml", "trust-pickle = true\n")
    os.chmod(project, mode)  # anyone (in the group) can replace vitedge.toml, though you own the file now
    _ignored(tmp_path, project, cfg, f"{who} can write the folder {project} on its way (mode {mode:04o})")


def test_a_link_of_yours_to_a_file_others_can_write_is_ignored(tmp_path):
    project = _project(tmp_path)
    target = _own_file(tmp_path / "mine", "cfg.toml", "trust-pickle = true\n", 0o646)
    cfg = _link(project / "vitedge.toml", target)
    _ignored(tmp_path, project, cfg, "others can write it (mode 0646)")


def test_a_link_to_a_fifo_is_ignored_without_blocking(tmp_path):
    project = _project(tmp_path)
    (tmp_path / "mine").mkdir()
    fifo = tmp_path / "mine" / "cfg.toml"
    os.mkfifo(fifo)
    cfg = _link(project / "vitedge.toml", fifo)
    run = cli("config", cwd=project)  # is_file() is False for a FIFO: no config found, nothing read
    assert run.code == 2 and len(run.lines) == 1 and "vitedge init" in run.lines[0], run.err
    assert not str(cfg) in run.err


@pytest.mark.parametrize("how", ["sticky shared folder", "your own link"])
def test_what_only_you_could_have_written_is_still_read(tmp_path, how):
    if how == "sticky shared folder":
        shared = tmp_path / "shared"
        shared.mkdir()
        os.chmod(shared, 0o1777)  # as /tmp: others may add entries but not replace yours
        project = _project(shared)
        cfg = _own_file(project, "vitedge.toml", 'targets = ["onnx"]\n')
    else:
        project = _project(tmp_path)
        mine = _own_file(tmp_path / "mine", "cfg.toml", 'targets = ["onnx"]\n')
        cfg = _link(project / "vitedge.toml", mine)
    run = cli("config", cwd=project)
    assert run.code == 0 and "owned by you and writable only by you" in run.out and str(cfg) in run.out, (run.out, run.err)
