"""Nothing leaves the machine: every library vitedge loads keeps its usage reporting off in vitedge's
processes unless the user opts in (VITEDGE_ALLOW_VENDOR_TELEMETRY=1). What can be seen from here is
checked: the files ONNX Runtime and OpenVINO write under the home folder before they report, the
switches in the environment a Ray worker inherits, and ONNX Runtime's own state (docs/reliability.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

ORT_PROBE = """
import sys
from onnx import TensorProto, helper
from vitedge.onnxkit.session import ort_session
graph = helper.make_graph([helper.make_node('Relu', ['x'], ['y'])], 'g',
                          [helper.make_tensor_value_info('x', TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info('y', TensorProto.FLOAT, [1])])
session = ort_session(helper.make_model(graph).SerializeToString())
print(session.run(None, {'x': __import__('numpy').ones(1, 'float32')})[0].tolist())
"""


def _env(home: Path, allow: bool) -> dict[str, str]:
    """This process's environment minus every library's own switch (so only vitedge can turn them off)."""
    drop = {"CI", "TF_BUILD", "JENKINS_URL", "ORT_DISABLE_TELEMETRY", "RAY_USAGE_STATS_ENABLED", "HF_HUB_DISABLE_TELEMETRY",
            "DO_NOT_TRACK", "VITEDGE_ALLOW_VENDOR_TELEMETRY"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(HOME=str(home), PYTHONPATH=str(REPO), VITEDGE_ALLOW_VENDOR_TELEMETRY="1" if allow else "0")
    if allow:  # OpenVINO's sender would try the network: answer "declined" from its consent file instead
        (home / "intel").mkdir(parents=True)
        (home / "intel" / "openvino_telemetry").write_text("0")
    return env


def _files(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())


@pytest.mark.parametrize("allow", [False, True], ids=["default", "opted-in"])
def test_onnxruntime_writes_nothing_under_home(tmp_path, allow):
    """ONNX Runtime creates a device id and an event queue under ~/.cache/Microsoft as it is imported;
    opened through vitedge it does not, unless the user opted in (then it does: the probe can fail)."""
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.run([sys.executable, "-c", ORT_PROBE], capture_output=True, text=True, timeout=300, env=_env(home, allow))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("[1.0]")
    written = [f for f in _files(home) if "onnxruntime" in f]
    if allow:
        assert written, _files(home)
    else:
        assert written == [], written


@pytest.mark.parametrize("allow", [False, True], ids=["default", "opted-in"])
def test_cli_process_leaves_home_untouched(tmp_path, allow):
    """`vitedge targets` imports ONNX Runtime and OpenVINO to say what runs here: nothing of theirs under HOME."""
    home = tmp_path / "home"
    home.mkdir()
    before = _files(home)
    proc = subprocess.run([sys.executable, "-m", "vitedge", "targets", "--json"], capture_output=True, text=True,
                          timeout=300, env=_env(home, allow), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    json.loads(proc.stdout)
    if allow:
        assert _files(home) != before
    else:
        assert _files(home) == before


def test_switches_are_set_and_onnxruntime_events_off(monkeypatch):
    """In-process: silence() sets every library's switch and turns ONNX Runtime's event sink off."""
    from vitedge.core import telemetry

    for name in telemetry.OFF_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(telemetry.ALLOW_TELEMETRY_ENV, raising=False)
    ort = telemetry.onnxruntime()
    assert {k: os.environ.get(k) for k in telemetry.OFF_SWITCHES} == telemetry.OFF_SWITCHES
    assert sys.modules.get("openvino_telemetry", 0) is None or "openvino_telemetry" not in sys.modules
    assert callable(ort.disable_telemetry_events)  # the call silence() makes exists in this ONNX Runtime


def test_opt_in_leaves_the_environment_alone(monkeypatch):
    from vitedge.core import telemetry

    monkeypatch.setenv(telemetry.ALLOW_TELEMETRY_ENV, "1")
    for name in telemetry.OFF_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    assert telemetry.silence() is False
    assert [k for k in telemetry.OFF_SWITCHES if k in os.environ] == []


RAY_PROBE = """
import json, os, sys
from vitedge.distributed.cluster import ClusterSettings, connected, run_tasks
def probe(_):
    return {k: os.environ.get(k) for k in ('RAY_USAGE_STATS_ENABLED', 'HF_HUB_DISABLE_TELEMETRY', 'ORT_DISABLE_TELEMETRY')}
with connected(ClusterSettings(workers=1)):
    [outcome] = run_tasks(probe, [0])
print(json.dumps(outcome.value))
"""


def test_ray_workers_inherit_the_switches(tmp_path):
    """A local Ray cluster started by vitedge reports no usage stats, and its workers run with every switch off."""
    pytest.importorskip("ray")
    home = tmp_path / "home"
    home.mkdir()
    proc = subprocess.run([sys.executable, "-c", RAY_PROBE], capture_output=True, text=True, timeout=300,
                          env=_env(home, False), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_DISABLE_TELEMETRY": "1", "ORT_DISABLE_TELEMETRY": "1"}, seen
