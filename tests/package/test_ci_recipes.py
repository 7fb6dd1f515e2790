"""examples/ci/: the GitHub Actions workflow and the GitLab CI job, parsed as YAML and their shell
steps run in order with bash (pip installs and `uses:` actions excepted) on the bundled example,
with a `vitedge` on PATH that runs this checkout. The calibration images are cut to 3 per class to
keep it quick; the validation set is the example's whole one, as the recipes use it (on a few dozen images one
decisive flip would leave the gate "too few images to tell", a failure).

Latency is measured (the recipes gate it) but never asserted against a limit: the comparison of
two runs on this shared machine may pass or fail on latency; the test checks the job's exit code
agrees with the comparison's own verdict, and that an accuracy regression always fails the job."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CALIB_DIR, EXAMPLES, REPO, VAL_DIR
from helpers.profiles import untimed_targets_env

yaml = pytest.importorskip("yaml")

CI = EXAMPLES / "ci"


VAL_PER_CLASS = 10_000  # all of them


def _copy_images(dst: Path, src: Path, per_class: int) -> None:
    for cls in sorted(p for p in src.iterdir() if p.is_dir()):
        (dst / cls.name).mkdir(parents=True, exist_ok=True)
        for f in sorted(cls.iterdir())[:per_class]:
            shutil.copyfile(f, dst / cls.name / f.name)


def _count_images(src: Path) -> int:
    return sum(1 for cls in src.iterdir() if cls.is_dir() for f in cls.iterdir() if f.is_file())


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, untimed_targets_dir) -> tuple[Path, dict[str, str]]:
    """A checkout-like tree (examples/ci/vitedge.toml, examples/digits_vit.pt, calibration/digits/{calib,val})
    and the environment the recipes run in (the onnx target without its INT8-vs-FP32 timing: the recipes gate
    accuracy and latency, the timing has tests of its own)."""
    ws = tmp_path_factory.mktemp("ci") / "repo"
    (ws / "examples" / "ci").mkdir(parents=True)
    shutil.copyfile(CI / "vitedge.toml", ws / "examples" / "ci" / "vitedge.toml")
    (ws / "examples" / "digits_vit.pt").symlink_to(EXAMPLES / "digits_vit.pt")
    _copy_images(ws / "calibration" / "digits" / "calib", CALIB_DIR, 3)
    _copy_images(ws / "calibration" / "digits" / "val", VAL_DIR, VAL_PER_CLASS)
    bin_dir = ws.parent / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "vitedge"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m vitedge "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ, **untimed_targets_env(untimed_targets_dir), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    for name in ("GITHUB_STEP_SUMMARY", "CI_JOB_TOKEN"):
        env.pop(name, None)
    return ws, env


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def _vitedge_lines(script: str) -> list[str]:
    return [line.strip().split()[1] for line in script.splitlines() if line.strip().startswith("vitedge ")]


def test_both_recipes_parse_and_gate_with_build_validate_compare():
    gh = yaml.safe_load((CI / "github-actions.yml").read_text())
    gl = yaml.safe_load((CI / "gitlab-ci.yml").read_text())
    steps = gh["jobs"]["vitedge"]["steps"]
    gh_cmds = [c for s in steps if "run" in s for c in _vitedge_lines(s["run"])]
    gl_cmds = [c for line in gl["vitedge"]["script"] for c in _vitedge_lines(line)]
    assert gh_cmds == gl_cmds == ["build", "build", "validate", "compare"]
    uploads = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact")]
    assert uploads and uploads[0]["if"] == "always()"
    paths = uploads[0]["with"]["path"]
    for name in ("validation.json", "junit.xml", "summary.md", "compare.json", "compare-junit.xml", "compare.md"):
        assert name in paths
    assert gl["vitedge"]["artifacts"]["when"] == "always"
    assert "examples/ci/reports/compare/compare-junit.xml" in gl["vitedge"]["artifacts"]["reports"]["junit"]
    # the download step puts the previous report where BASELINE says
    download = next(s for s in steps if "download-artifact" in s.get("uses", ""))
    workdir = gh["jobs"]["vitedge"]["defaults"]["run"]["working-directory"]
    assert Path(download["with"]["path"]) / "validation.json" == Path(workdir) / gh["jobs"]["vitedge"]["env"]["BASELINE"]


def test_github_workflow_then_gitlab_job_on_the_bundled_example(workspace, tmp_path):
    ws, env = workspace
    gh = yaml.safe_load((CI / "github-actions.yml").read_text())["jobs"]["vitedge"]
    workdir = ws / gh["defaults"]["run"]["working-directory"]
    summary = tmp_path / "step-summary.md"
    gh_env = dict(env, **{k: str(v) for k, v in gh["env"].items()}, GITHUB_STEP_SUMMARY=str(summary))

    # 1. GitHub Actions, first run: no previous report, so nothing is compared
    ran = []
    for step in gh["steps"]:
        if "run" not in step or "pip install" in step["run"]:
            continue  # actions and the install step: not run here
        proc = _bash(step["run"], workdir, gh_env)
        assert proc.returncode == 0, f"{step['name']}: {proc.stderr[-2000:]}"
        ran.append(step["name"])
    assert ran == ["Build", "Validate", "Compare with the previous report"]
    reports = workdir / "reports"
    for name in ("validation.json", "junit.xml", "summary.md"):
        assert (reports / name).is_file()
    assert not (reports / "compare").exists()
    doc = json.loads((reports / "validation.json").read_text())
    assert doc["passed"] is True and doc["data"]["role"] == "validation" and doc["data"]["items"] == _count_images(VAL_DIR)
    assert doc["latency"]["measured"] is True
    assert "PASS" in summary.read_text()  # the Markdown reached the job summary
    baseline = tmp_path / "baseline.json"
    shutil.copyfile(reports / "validation.json", baseline)

    # 2. GitLab CI, with the GitHub run's report as the previous one
    gl = yaml.safe_load((CI / "gitlab-ci.yml").read_text())["vitedge"]
    gl_env = dict(env, **{k: str(v) for k, v in gl["variables"].items()})
    project = ws / gl["variables"]["PROJECT_DIR"]
    shutil.rmtree(project / "reports")
    (project / gl["variables"]["BASELINE"]).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(baseline, project / gl["variables"]["BASELINE"])
    proc = _bash("\n".join(gl["script"]), ws, gl_env)
    compare = project / "reports" / "compare"
    assert (compare / "compare.json").is_file(), proc.stderr[-2000:]
    for path in gl["artifacts"]["reports"]["junit"]:
        assert (ws / path).is_file()
    verdict = json.loads((compare / "compare.json").read_text())
    rows = {r["name"]: r for r in verdict["gate"]}
    assert rows["top1_regression"]["status"] == "pass" and rows["agreement_regression"]["status"] == "pass"  # same data, same graph
    assert (proc.returncode == 0) == verdict["passed"], proc.stderr[-2000:]  # latency may differ on a shared machine

    # 3. A run that lost 5 top-1 points against the previous report: the compare step fails the job
    worse = json.loads(baseline.read_text())
    worse["accuracy"]["int8_top1"] -= 0.05
    (project / "reports" / "validation.json").write_text(json.dumps(worse))
    compare_step = next(line for line in gl["script"] if "vitedge compare" in line)
    proc = _bash(compare_step, project, gl_env)
    assert proc.returncode == 1
    verdict = json.loads((compare / "compare.json").read_text())
    assert {r["name"]: r["status"] for r in verdict["gate"]}["top1_regression"] == "fail"
