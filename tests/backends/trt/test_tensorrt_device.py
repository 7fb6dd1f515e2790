"""Device facts and the refusal of an engine built for another device (fake facts vs
recorded ones), plus the honest environment report on this GPU-less machine."""

from __future__ import annotations

import json

import pytest
from helpers.tensorrt_standin import make_fake_cudart, make_fake_trt

from vitedge.backends.tensorrt.device import (
    DeviceFacts,
    check_engine_facts,
    check_engine_manifest,
    compare_facts,
    parse_dpkg_jetpack,
    parse_nv_tegra_release,
    read_device_facts,
)
from vitedge.core.errors import BundleError, IncompatibleEngineError

ORIN = DeviceFacts(tensorrt="10.3.0", gpu_name="Orin", compute_capability="8.7", cuda_runtime="12.6", cuda_driver="12.6",
                   l4t="36.4.0", jetpack="6.1+b123", machine="aarch64")


def _record(facts=ORIN, hw="none", vc=False):
    return {"engine_built": True, "engine": "model.engine", "device": facts.to_dict(), "hardware_compatibility": hw,
            "version_compatible": vc}


def _with(**changes):
    return DeviceFacts(**{**ORIN.to_dict(), **changes})


def test_jetson_release_parsers():
    text = "# R36 (release), REVISION: 4.0, GCID: 37537400, BOARD: generic, EABI: aarch64, DATE: Fri Sep 13 04:36:44 UTC 2024\n"
    assert parse_nv_tegra_release(text) == "36.4.0"
    assert parse_nv_tegra_release("# R35 (release), REVISION: 5.0, GCID: 1") == "35.5.0"
    assert parse_nv_tegra_release("garbage") is None
    assert parse_dpkg_jetpack("nvidia-jetpack\t6.1+b123\n") == "6.1+b123"
    assert parse_dpkg_jetpack("dpkg-query: no packages found matching nvidia-jetpack") is None


def test_same_device_loads():
    assert check_engine_facts(_record(), ORIN) == []


@pytest.mark.parametrize("changes, fact", [
    ({"gpu_name": "NVIDIA GeForce RTX 4090", "compute_capability": "8.9", "machine": "x86_64", "l4t": None, "jetpack": None}, "GPU"),
    ({"tensorrt": "10.7.0"}, "TensorRT"),
    ({"l4t": "36.3.0"}, "L4T release"),
    ({"jetpack": "6.0+b106"}, "JetPack"),
    ({"compute_capability": "8.6"}, "compute capability"),
    ({"cuda_runtime": "13.0"}, "CUDA major"),
    ({"machine": "x86_64"}, "platform"),
])
def test_a_mismatched_engine_is_refused_naming_the_fact(changes, fact):
    with pytest.raises(IncompatibleEngineError, match=fact) as info:
        check_engine_facts(_record(), _with(**changes))
    assert "vitedge engine BUNDLE --force" in str(info.value) and "Orin (compute 8.7)" in str(info.value)


def test_the_manifest_path_refuses_too():
    class M:
        backend_info = _record()

    with pytest.raises(IncompatibleEngineError, match="TensorRT '10.8.0' here vs '10.3.0' recorded"):
        check_engine_manifest(M(), _with(tensorrt="10.8.0"))

    class Planned:
        backend_info = {"engine_built": False}

    with pytest.raises(BundleError, match="no TensorRT engine yet"):
        check_engine_manifest(Planned(), ORIN)


def test_hardware_compatibility_relaxes_the_gpu_and_says_so():
    desktop = DeviceFacts(tensorrt="10.3.0", gpu_name="NVIDIA RTX A6000", compute_capability="8.6", cuda_runtime="12.6",
                          machine="x86_64")
    recorded = _record(DeviceFacts(**{**desktop.to_dict(), "gpu_name": "NVIDIA A100", "compute_capability": "8.0"}), hw="ampere_plus")
    relaxed = check_engine_facts(recorded, desktop)
    assert len(relaxed) == 1 and "allowed: built hardware-compatible" in relaxed[0]
    turing = DeviceFacts(**{**desktop.to_dict(), "gpu_name": "Tesla T4", "compute_capability": "7.5"})
    with pytest.raises(IncompatibleEngineError, match="needs compute capability 8.0"):
        check_engine_facts(recorded, turing)
    same_cc = _record(desktop, hw="same_compute_capability")
    assert "same compute capability" in check_engine_facts(same_cc, DeviceFacts(**{**desktop.to_dict(), "gpu_name": "NVIDIA RTX 3090"}))[0]
    with pytest.raises(IncompatibleEngineError, match="compute capability"):
        check_engine_facts(same_cc, DeviceFacts(**{**desktop.to_dict(), "compute_capability": "8.9"}))


def test_version_compatibility_allows_newer_tensorrt_only():
    rec = _record(vc=True)
    newer = check_engine_facts(rec, _with(tensorrt="10.7.0", l4t="36.5.0", jetpack="6.2+b1"))
    assert any("version-compatible" in r for r in newer) and len(newer) == 3
    with pytest.raises(IncompatibleEngineError, match="same or a newer TensorRT"):
        check_engine_facts(rec, _with(tensorrt="10.1.0"))
    refuse, relaxed = compare_facts(ORIN, _with(tensorrt="10.7.0"))
    assert refuse and not relaxed


def test_device_facts_read_through_cuda_python():
    facts = read_device_facts(make_fake_trt("10.3.0"), make_fake_cudart(gpu=b"Orin\x00\x00", cc=(8, 7), runtime=12060))
    assert (facts.gpu_name, facts.compute_capability, facts.cuda_runtime, facts.tensorrt) == ("Orin", "8.7", "12.6", "10.3.0")
    assert json.loads(json.dumps(facts.to_dict())) == facts.to_dict()


def test_environment_report_here_is_plain():
    from vitedge.backends import get_backend

    env = get_backend("tensorrt").check_environment()
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        assert not env.can_build and not env.can_run
        assert env.detail == "TensorRT is not installed"
        assert "pip install 'vitedge[tensorrt]'" in env.install_hint and "python3-libnvinfer" in env.install_hint
        return
    if not env.can_build:
        assert env.detail.startswith("no CUDA GPU") or "cuda-python" in env.detail


# -- cuda-python's two module layouts ------------------------------------------------------------

def _cuda_package(monkeypatch, *, bindings=None, cudart=None):
    """Install a `cuda` package with `cuda.bindings.runtime` and/or `cuda.cudart` (None: absent)."""
    import sys
    import types

    cuda = types.ModuleType("cuda")
    cuda.__path__ = []
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    if bindings is not None:
        pkg = types.ModuleType("cuda.bindings")
        pkg.__path__ = []
        pkg.runtime = bindings
        cuda.bindings = pkg
        monkeypatch.setitem(sys.modules, "cuda.bindings", pkg)
        monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", bindings)
    else:
        monkeypatch.setitem(sys.modules, "cuda.bindings", None)  # import fails, as where it is not installed
    if cudart is not None:
        cuda.cudart = cudart
        monkeypatch.setitem(sys.modules, "cuda.cudart", cudart)
    else:
        monkeypatch.setitem(sys.modules, "cuda.cudart", None)


def _runtime_module(name):
    import types

    mod = types.ModuleType(name)
    for key, value in vars(make_fake_cudart()).items():
        setattr(mod, key, value)
    return mod


def test_cudart_from_either_cuda_python_layout(monkeypatch):
    from vitedge.backends.tensorrt.device import cudart_module

    new = _runtime_module("cuda.bindings.runtime")  # cuda-python 12.6+ and 13.x
    _cuda_package(monkeypatch, bindings=new)
    assert cudart_module() is new
    old = _runtime_module("cuda.cudart")  # cuda-python 12.0-12.5
    _cuda_package(monkeypatch, cudart=old)
    assert cudart_module() is old


def test_cuda_python_missing_or_incomplete_is_reported(monkeypatch):
    import sys

    from vitedge.backends.tensorrt.backend import TensorRtBackend
    from vitedge.backends.tensorrt.device import cudart_module
    from vitedge.core.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "tensorrt", make_fake_trt("10.3.0"))
    _cuda_package(monkeypatch)
    with pytest.raises(ImportError):
        cudart_module()
    env = TensorRtBackend().check_environment()
    assert not env.can_build and "cuda-python is not" in env.detail and "cuda-python>=12.0,<14" in env.install_hint
    partial = _runtime_module("cuda.bindings.runtime")
    del partial.cudaMemcpyAsync
    _cuda_package(monkeypatch, bindings=partial)
    with pytest.raises(MissingDependencyError, match="cudaMemcpyAsync"):
        cudart_module()
    env = TensorRtBackend().check_environment()
    assert not env.can_build and "cudaMemcpyAsync" in env.detail


def test_the_tensorrt_extra_pins_the_cuda_python_range_the_runner_handles():
    from pathlib import Path

    import tomllib

    from vitedge.backends.tensorrt.device import CUDA_PYTHON_RANGE

    root = Path(__file__).resolve().parents[3]
    for pyproject in (root / "pyproject.toml", root / "packaging" / "runtime" / "pyproject.toml"):
        extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["tensorrt"]
        assert f"cuda-python{CUDA_PYTHON_RANGE}" in extra, pyproject


def test_tensorrt_latency_is_recorded_as_timed_on_the_gpu_and_its_module():
    """`latency.device` of a TensorRT validation names the GPU (and the Jetson module), not the host CPU: two Jetsons
    with other GPUs (an Orin Nano, an Orin NX) are then compared by INT8/FP32 ratio, never by milliseconds."""
    from vitedge.backends.tensorrt.backend import BoundTensorRtBackend
    from vitedge.backends.tensorrt.device import DeviceFacts

    cudart = make_fake_cudart()
    nano = DeviceFacts(tensorrt="10.3.0", gpu_name="Orin", compute_capability="8.7",
                       module="NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super", machine="aarch64")
    device = BoundTensorRtBackend(make_fake_trt("10.3.0", cudart=cudart), cudart, nano).timing_device()
    assert device == {"kind": "gpu", "model": nano.module, "gpu": "Orin", "compute_capability": "8.7"}
    desktop = DeviceFacts(tensorrt="10.3.0", gpu_name="NVIDIA GeForce RTX 4090", compute_capability="8.9")
    assert BoundTensorRtBackend(make_fake_trt("10.3.0", cudart=cudart), cudart, desktop).timing_device()["model"] == desktop.gpu_name


@pytest.mark.parametrize("text, mode", [
    ("NV Fan Mode:cool\nNV Power Mode: MODE_30W_4CORE\n5\n", "MODE_30W_4CORE"),  # recorded on a Xavier (JetPack 4)
    ("NV Power Mode: MAXN\n0\n", "MAXN"),
    ("NV Power Mode: 15W\n1\n", "15W"),
    ("nvpmodel: command failed\n", None),
    ("", None),
])
def test_nvpmodel_power_mode_is_read_from_its_query(text, mode):
    from vitedge.backends.tensorrt.device import parse_nvpmodel_query

    assert parse_nvpmodel_query(text) == mode


def test_power_mode_is_part_of_the_timing_device_but_not_of_engine_compatibility():
    from vitedge.backends.tensorrt.device import DeviceFacts, compare_facts

    full = DeviceFacts(tensorrt="10.3.0", gpu_name="Orin", compute_capability="8.7", module="Orin Nano", machine="aarch64",
                       power_mode="MAXN_SUPER")
    low = DeviceFacts(**{**full.to_dict(), "power_mode": "7W"})
    assert full.timing_device()["power_mode"] == "MAXN_SUPER" and full.timing_device() != low.timing_device()
    assert compare_facts(full, low) == ([], [])  # an engine built at MAXN loads at 7W
    assert DeviceFacts.from_dict({k: v for k, v in full.to_dict().items() if k != "power_mode"}).power_mode is None


def test_report_names_the_power_mode_the_engine_was_built_at():
    from vitedge.backends.tensorrt.report import report_lines

    device = {"tensorrt": "10.3.0", "gpu_name": "Orin", "compute_capability": "8.7"}
    built = report_lines({"engine_built": True, "device": dict(device, power_mode="15W")})
    assert "- built with TensorRT 10.3.0 on Orin (compute 8.7, power mode 15W)" in built
    assert "- built with TensorRT 10.3.0 on Orin (compute 8.7)" in report_lines({"engine_built": True, "device": device})
