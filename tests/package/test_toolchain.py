"""The test suite's own toolchain (issue 25): pinned test tools that the README, .ci/run and the
constraints file agree on; documents compared numbers-as-numbers; no process outlives a run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib

import pytest
from conftest import REPO
from helpers.documents import mismatches
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

CONSTRAINTS = REPO / "constraints" / "test.txt"
# The versions these matter most for (issue 25); each must be pinned, exactly.
KEY_TOOLS = ("pytest", "pytest-xdist", "numpy", "onnx", "onnxruntime", "openvino", "nncf", "ray", "timm",
             "transformers", "tritonclient", "scikit-learn", "opencv-python-headless", "onnxscript")


def _readme_commands() -> list[str]:
    readme = (REPO / "README.md").read_text()
    return [b.split("```")[0].strip() for b in readme.split("```bash\n")[1:]][:2]


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            assert re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", line), f"not name==version: {line!r}"
            name, version = line.split("==")
            assert canonicalize_name(name) not in pins, f"pinned twice: {name}"
            pins[canonicalize_name(name)] = version
    return pins


def test_readme_ci_and_constraints_agree():
    _, test_command = _readme_commands()
    assert "-c constraints/test.txt" in test_command, "the README's test command must install with the pins"
    assert test_command in (REPO / ".ci" / "run").read_text()
    main_command = _readme_commands()[0]
    assert "constraints" not in main_command, "the user's own install stays unpinned"
    pins = _pins()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]]
    for req in wanted:
        name = canonicalize_name(req.name)
        if name in ("torch", "torchvision"):  # the machine's builds, from `pip install torch torchvision`
            assert name not in pins
            continue
        assert name in pins, f"{req.name} is a test dependency but not in constraints/test.txt: python tools/pins.py freeze"
        assert req.specifier.contains(pins[name], prereleases=True), f"pin {name}=={pins[name]} outside pyproject's {req}"
    for tool in KEY_TOOLS:
        assert canonicalize_name(tool) in pins, tool


def test_pins_describe_this_environment_or_say_which_differ():
    """Not a gate on the developer's own environment (a `latest` run differs on purpose): the report
    header names every pinned package whose installed version differs, so a red run shows the drift."""
    from importlib.metadata import PackageNotFoundError, version

    differ = []
    for name, pinned in _pins().items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            continue  # an optional dependency of a dependency that this platform skips
        if installed != pinned:
            differ.append(f"{name} {installed} (pinned {pinned})")
    print("packages off their pins:", ", ".join(differ) or "none")


def test_documents_compare_numbers_as_numbers_and_the_rest_exactly():
    a = {"top1": 0.9723, "kind": "logits", "ok": True, "none": None, "rows": [1, 2.0], "nan": float("nan")}
    assert mismatches(dict(a, top1=0.9723000001), a, rel=1e-6, abs_tol=1e-9) == []
    assert mismatches(dict(a, kind="embedding"), a, rel=1e-6, abs_tol=1e-9) == [".kind: 'embedding' != 'logits'"]
    assert mismatches(dict(a, top1=0.98), a, rel=1e-6, abs_tol=1e-9) == [".top1: 0.98 != 0.9723"]
    assert mismatches(dict(a, ok=1), a, rel=1e-6, abs_tol=1e-9) == [".ok: 1 != True"]  # a flag is not a number
    assert mismatches(dict(a, rows=[1]), a, rel=1e-6, abs_tol=1e-9) == [".rows: length 1 != 2"]
    assert mismatches({"x": 1}, {"y": 1}, rel=0, abs_tol=0) == [": keys ['x'] != ['y']"]


PLANTED = textwrap.dedent("""
    import os, subprocess, sys
    def test_starts_a_process_and_forgets_it():
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open(os.environ["PLANTED_PID_FILE"], "w").write(str(p.pid))
""")


@pytest.mark.parametrize("xdist", [[], ["-n", "1"]], ids=["one-process", "xdist"])
def test_a_run_that_leaves_a_process_fails_and_kills_it(tmp_path, xdist):
    """The session-finish hook (tests/helpers/leftover_plugin.py) on a planted leftover: the run exits 1,
    names the process, and the process is gone when pytest returns."""
    (tmp_path / "test_planted.py").write_text(PLANTED)
    pid_file = tmp_path / "planted.pid"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
           "PLANTED_PID_FILE": str(pid_file), "VITEDGE_TEST_REAP_GRACE": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "helpers.leftover_plugin", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), *xdist, str(tmp_path / "test_planted.py")],
                          capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "leftover processes" in out and "time.sleep(600)" in out, out
    assert "1 passed" in out  # the test itself passed: the leftover alone fails the run
    pid = int(pid_file.read_text())
    assert not _alive(pid), f"the planted process {pid} outlived the run"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead, waiting for init to reap it
    except OSError:
        return False


def test_a_clean_run_passes_with_the_hook(tmp_path):
    (tmp_path / "test_clean.py").write_text("def test_nothing_left():\n    assert True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "helpers.leftover_plugin", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-n", "1", str(tmp_path / "test_clean.py")],
                          capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert proc.returncode == 0 and "leftover" not in proc.stdout, proc.stdout + proc.stderr


TELEMETRY_PROBE = textwrap.dedent("""
    import json, sys
    import onnx
    from onnx import TensorProto, helper
    from vitedge.backends.openvino import OpenVinoBackend
    OpenVinoBackend().check_environment()  # the first thing vitedge does with OpenVINO
    import openvino as ov
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1])
    ov.convert_model(sys.argv[1])  # ovc's telemetry would fork its GA4 sender here
    from openvino.tools.ovc import telemetry_utils
    import multiprocessing
    print(json.dumps({"tm": telemetry_utils.tm.__name__, "children": len(multiprocessing.active_children())}))
""")


@pytest.mark.parametrize("allow", [False, True], ids=["blocked", "allowed"])
def test_openvino_telemetry_is_off_in_vitedge_processes(tmp_path, allow):
    """ovc's GA4 telemetry forks a sender per event; on this closed network it hangs in getaddrinfo and
    holds the run's stdout (a run under a pipe never ended). vitedge blocks it unless the user allows it.
    CI=true would switch it off by itself, so the probe runs without it, with a HOME that has no consent file."""
    pytest.importorskip("openvino")
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "JENKINS_URL")}
    env.update(HOME=str(tmp_path), VITEDGE_ALLOW_VENDOR_TELEMETRY="1" if allow else "0")
    if allow:  # the sender would try the network: answer "declined" from the consent file instead
        (tmp_path / "intel").mkdir()
        (tmp_path / "intel" / "openvino_telemetry").write_text("0")
    proc = subprocess.run([sys.executable, "-c", TELEMETRY_PROBE, str(tmp_path / "relu.onnx")], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    if allow:
        assert seen["tm"] == "openvino_telemetry", seen  # the user's choice is left alone
    else:
        assert seen == {"tm": "openvino.tools.ovc.telemetry_stub", "children": 0}, seen
