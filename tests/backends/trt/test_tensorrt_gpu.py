"""What to run where TensorRT and an NVIDIA GPU exist: `python benchmarks/tensorrt_device.py` runs these
(``pytest -m tensorrt``). Here, with no TensorRT and no GPU, every test skips and says why. Nothing in
this repository claims that an engine was built or timed; these tests are how that gets checked.

* the installed TensorRT against the API surface recorded from its bindings wheel (needs TensorRT only);
* one engine per plan vitedge makes for the installed version (INT8 weakly or strongly typed, FP32 floats,
  version-compatible, DLA where the device has one), each built through ``apply_plan`` with the real
  module and inspected at the opt shape: no tensor may say "N/A due to dynamic shapes";
* Triton loads the engine as a ``tensorrt_plan`` model (needs ``tritonserver`` on PATH), with
  ``--backend-config=tensorrt,version-compatible=true`` for a version-compatible plan.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import onnx
import pytest
from helpers.tensorrt_graphs import write_tiny_qdq_graph

from vitedge.backends.tensorrt import versions as tv
from vitedge.backends.tensorrt.apply import apply_plan
from vitedge.backends.tensorrt.plan import TensorRtOptions, capabilities_from_module, plan_build
from vitedge.backends.tensorrt.typed import make_strongly_typed

ROOT = Path(__file__).resolve().parents[3]


def _tensorrt():
    return pytest.importorskip("tensorrt", reason="TensorRT not installed: these tests run only where TensorRT is")


def _gpu_tensorrt():
    trt = _tensorrt()
    from vitedge.backends import get_backend

    env = get_backend("tensorrt").check_environment()
    if not env.can_build:
        pytest.skip(f"no CUDA GPU: {env.detail}")
    return trt


@pytest.mark.tensorrt
def test_installed_tensorrt_matches_its_recorded_surface():
    trt = _tensorrt()
    major, minor, _patch = tv.parse_release(trt.__version__)
    surface = tv.surface_for((major, minor))
    if surface is None:
        pytest.skip(f"TensorRT {trt.__version__} is newer than the recorded surfaces ({', '.join(tv.supported_surfaces())}): "
                    "record it with tools/trt_surface.py")
    missing = []
    for name, entry in surface["classes"].items():
        cls = getattr(trt, name, None)
        if cls is None:
            missing.append(name)
            continue
        names = entry.get("values", []) + [m for m in entry["members"] if not m.startswith("_")]
        missing += [f"{name}.{m}" for m in names if not hasattr(cls, m)]
    assert not missing, f"TensorRT {trt.__version__} lacks what its wheel's surface records: {missing[:10]}"


def _variants(caps, dla_cores: int) -> list[tuple[str, TensorRtOptions]]:
    out = [("int8", TensorRtOptions(opt_batch=4)), ("int8-fp32-floats", TensorRtOptions(opt_batch=4, float_precision="fp32")),
           ("version-compatible", TensorRtOptions(opt_batch=4, version_compatible=True))]
    if caps.dla and dla_cores > 0:
        out.append(("dla", TensorRtOptions(opt_batch=4, dla_core=0)))
    return out


@pytest.mark.tensorrt
def test_engine_builds_for_every_plan_of_the_installed_version(tmp_path):
    trt = _gpu_tensorrt()
    path, graph = write_tiny_qdq_graph(tmp_path)
    typed, _report = make_strongly_typed(onnx.load(str(path)), float_precision="fp16", layernorm_fp32=True)
    onnx.save(typed, str(tmp_path / "model.int8.typed.onnx"))  # the helper's copy is untyped: real TensorRT needs the casts
    caps = capabilities_from_module(trt)
    cores = int(trt.Builder(trt.Logger(trt.Logger.WARNING)).num_DLA_cores)
    results = {}
    for name, options in _variants(caps, cores):
        plan = plan_build(options, (1, 4, 8), caps, graph=graph)
        built = apply_plan(trt, plan, tmp_path / plan.graph)
        layers = built.layers or {}
        assert built.engine and layers.get("count"), name
        assert layers.get("context_bound") is True and not layers.get("precision_unknown"), (name, layers)
        assert "int8" in layers.get("precision_counts", {}), (name, layers.get("precision_counts"))
        results[name] = {"engine_bytes": len(built.engine), "precision_counts": layers["precision_counts"],
                         "schema": layers["schema"], "warnings": built.warnings}
    (tmp_path / "engines.json").write_text(json.dumps({"tensorrt": trt.__version__, "engines": results}, indent=2))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.tensorrt
@pytest.mark.parametrize("version_compatible", [False, True])
def test_triton_loads_the_engine(tmp_path, version_compatible):
    trt = _gpu_tensorrt()
    server = shutil.which("tritonserver")
    if server is None:
        pytest.skip("tritonserver is not on PATH: the Triton load test runs only where Triton is installed")
    path, graph = write_tiny_qdq_graph(tmp_path / "graph")
    caps = capabilities_from_module(trt)
    options = TensorRtOptions(opt_batch=4, float_precision="fp32", version_compatible=version_compatible)
    plan = plan_build(options, (1, 4, 8), caps, graph=graph)
    built = apply_plan(trt, plan, path.parent / plan.graph)
    repo = tmp_path / "models"
    (repo / "vit" / "1").mkdir(parents=True)
    (repo / "vit" / "1" / "model.plan").write_bytes(built.engine)
    (repo / "vit" / "config.pbtxt").write_text('name: "vit"\nplatform: "tensorrt_plan"\nmax_batch_size: 0\n')
    port = _free_port()
    cmd = [server, f"--model-repository={repo}", f"--http-port={port}", "--grpc-port=0", "--metrics-port=0",
           "--allow-grpc=false", "--allow-metrics=false"]
    if version_compatible:  # Triton's TensorRT backend README: "--backend-config=tensorrt,...,version-compatible=true"
        cmd.append("--backend-config=tensorrt,version-compatible=true")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ready = False
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/vit/ready", timeout=1) as r:
                    ready = r.status == 200
            except OSError:
                pass
            if ready or proc.poll() is not None:
                break
            time.sleep(0.5)
        assert ready, f"Triton did not load the plan: {proc.stdout.read() if proc.poll() is not None else 'still starting'}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_surfaces_cover_what_a_device_can_run():
    """Not a GPU test: the versions a device may have (JetPack 6's 10.3, desktop 10.x, 11.4) are recorded,
    so the surface check above has something to compare with wherever it runs."""
    recorded = set(tv.supported_surfaces())
    assert {"8.6", "10.3", "10.16", "11.4"} <= recorded
    assert Path(tv.SURFACE_DIR / "10.3.json").is_file()


def test_the_one_command_says_why_it_runs_nothing_without_a_gpu(tmp_path):
    spec = importlib.util.spec_from_file_location("tensorrt_device", ROOT / "benchmarks" / "tensorrt_device.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if bench.gpu_status()[0]:
        pytest.skip("an NVIDIA GPU is here: run `python benchmarks/tensorrt_device.py` itself")
    out = tmp_path / "tensorrt_device.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tensorrt_device.py"), "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("skipped: no NVIDIA GPU here (") and not out.exists()
    assert "nothing was built, run or written" in proc.stdout
