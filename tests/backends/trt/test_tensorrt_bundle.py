"""The TensorRT bundle on a machine without TensorRT or a GPU (this one), its completion by
`vitedge engine` (driven here by the recording stand-in, which runs the graphs with ONNX
Runtime: the plumbing is real, the "engine" is not), and, where TensorRT and a GPU
exist, a real build, run and validation (marked `tensorrt`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import CALIB_DIR, EXAMPLES, VAL_DIR
from helpers.cli import run_vitedge
from helpers.jetson_devices import STANDIN_GPU
from helpers.tensorrt_standin import (
    make_fake_cudart,
    make_fake_trt,
    skip_if_real_tensorrt,
)

from vitedge.backends.tensorrt.device import DeviceFacts
from vitedge.core.errors import BundleError, IncompatibleEngineError, UsageError
from vitedge.bundle.manifest import read_manifest, verify_bundle

EXAMPLE = EXAMPLES / "digits_vit.pt"
NEXT_STEP = "build the engine on the device: vitedge engine BUNDLE"


def _have_example() -> bool:
    return EXAMPLE.is_file() and CALIB_DIR.is_dir()


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """`vitedge build --target jetson-orin examples/digits_vit.pt --calib calibration/digits/calib -o OUT` here."""
    if not _have_example():
        pytest.skip("the bundled example (examples/digits_vit.pt, calibration/digits/calib) is not in this checkout yet")
    skip_if_real_tensorrt("this test is about the GPU-less bundle")
    out = tmp_path_factory.mktemp("bundles") / "digits-jetson-orin"
    # the held-out digits as --val: the accuracy budget of the NVIDIA graph (INT8 attention) is then measured on the
    # data `vitedge engine --val` validates with, as a user would build it
    val = ["--val", str(VAL_DIR)] if VAL_DIR.is_dir() else []
    code, text = run_vitedge(["build", "--target", "jetson-orin", str(EXAMPLE), "--calib", str(CALIB_DIR), *val, "-o", str(out)])
    assert code == 0, text
    return out, text


def _copy(bundle: Path, tmp_path: Path) -> Path:
    dst = tmp_path / bundle.name
    shutil.copytree(bundle, dst)
    return dst


def test_gpu_less_build_writes_the_planned_bundle(planned):
    out, text = planned
    names = {p.name for p in out.iterdir()}
    assert {"model.int8.onnx", "reference.fp32.onnx", "build_plan.json", "trtexec.txt", "manifest.json", "report.md"} <= names
    assert not {"model.engine", "reference.fp32.engine", "timing.cache", "engine_facts.json"} & names
    manifest = verify_bundle(out)  # every listed file present with its hash
    assert manifest.artifacts.built is False and manifest.artifacts.model == "model.engine"
    assert set(manifest.artifacts.extra) == {"build_plan.json", "trtexec.txt"}
    info = manifest.backend_info
    assert info["engine_built"] is False and info["next_step"] == NEXT_STEP
    assert info["reason"] == "TensorRT is not installed" and "vitedge[tensorrt]" in info["install_hint"]
    assert "no engine was built here" in info["measured"]
    assert manifest.validation is None  # nothing was measured, so nothing is reported
    assert "not built here" in (out / "report.md").read_text()
    # said before any engine exists, per block: the NVIDIA graph quantizes the attention matmuls (head size 32, 65
    # tokens), so INT8 fused MHA is allowed wherever the accuracy budget kept both matmuls of a block INT8
    blocks = info["attention"]["blocks"]
    assert len(blocks) == 6 and blocks[0]["head_size"] == 32 and blocks[0]["tokens"] == 65
    kept = set(manifest.quantization.kept_float)
    float_blocks = sum(1 for b in blocks if b["qk_matmul"] in kept or b["pv_matmul"] in kept)
    assert all(b["qk_quantized"] and b["pv_quantized"] for b in blocks if b["qk_matmul"] not in kept and b["pv_matmul"] not in kept)
    report = (out / "report.md").read_text()
    # the Q/DQ after P.V sits after Transpose+Reshape: fusion then relies on TensorRT moving it back, said per block
    assert all(b["pv_output_qdq"] == "after_shape_ops" for b in blocks)
    assert report.count("| only if TensorRT moves the Q/DQ after P.V back") == 6 - float_blocks
    assert ("relies on TensorRT moving the Q/DQ after P.V back" in report) == (float_blocks < 6)
    assert (f"INT8 fused attention cannot happen in {float_blocks} of 6" in report) == bool(float_blocks)
    assert ("# warning: INT8 fused attention cannot happen" in (out / "trtexec.txt").read_text()) == bool(float_blocks)
    assert json.loads((out / "build_plan.json").read_text())["attention"]["warnings"] == info["attention"]["warnings"]


def test_gpu_less_build_says_so_in_one_line(planned):
    _, text = planned
    lines = [line.strip() for line in text.splitlines()]
    assert lines.count(NEXT_STEP) == 1
    assert any("TensorRT engine not built here (TensorRT is not installed)" in line for line in lines)
    assert "not validated here" in text


def test_the_checker_passed_on_the_bundled_graph(planned):
    import onnx

    from vitedge.quantize.checker import check_qdq_graph

    out, _ = planned
    assert check_qdq_graph(onnx.load(str(out / "model.int8.onnx"))) == []


def test_plan_and_trtexec_use_the_real_input(planned):
    import shlex

    out, _ = planned
    plan = json.loads((out / "build_plan.json").read_text())
    assert plan["tensorrt"]["assumed"] is True and plan["tensorrt"]["major"] == 10
    int8, ref = plan["engines"]
    assert int8["input_name"] == "input" and int8["profile_opt"] == [4, 3, 32, 32] and int8["builder_flags"] == ["INT8", "FP16", "OBEY_PRECISION_CONSTRAINTS"]
    assert len(int8["fp32_layers"]) == 13 and ref["engine"] == "reference.fp32.engine"
    commands = [line for line in (out / "trtexec.txt").read_text().splitlines() if line.startswith("trtexec ")]
    assert len(commands) == 2
    args = shlex.split(commands[0])
    for expected in ("--onnx=model.int8.onnx", "--int8", "--fp16", "--minShapes=input:1x3x32x32", "--optShapes=input:4x3x32x32",
                     "--maxShapes=input:8x3x32x32", "--memPoolSize=workspace:2048M", "--builderOptimizationLevel=3",
                     "--timingCacheFile=timing.cache", "--saveEngine=model.engine", "--precisionConstraints=obey"):
        assert expected in args, expected


def test_engine_command_here_refuses_and_leaves_the_bundle(planned):
    out, _ = planned
    before = (out / "manifest.json").read_bytes()
    code, text = run_vitedge(["engine", str(out)])
    assert code == 2 and "TensorRT is not installed" in text and "the bundle is unchanged" in text
    assert (out / "manifest.json").read_bytes() == before
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".partial")]


def test_the_cast_graph_for_trt11_keeps_the_example_accurate(planned):
    """The FP16-region graph TensorRT 11 would build from, on held-out images, vs FP32 and the FP32-region INT8 graph."""
    import onnx

    from vitedge.backends.tensorrt.typed import make_strongly_typed
    from vitedge.datasources.sources import open_source
    from vitedge.onnxkit.session import ort_session

    if not VAL_DIR.is_dir():
        pytest.skip("calibration/digits/val is not in this checkout yet")
    out, _ = planned
    spec = read_manifest(out).spec
    val = open_source(VAL_DIR, spec.preprocess, class_names=spec.class_names)
    batches = list(val.batches(100))[:2]  # 200 of the 397 held-out images keep this test short
    x = np.concatenate([b.images for b in batches])
    labels = np.concatenate([b.labels for b in batches])
    typed, _ = make_strongly_typed(onnx.load(str(out / "model.int8.onnx")))

    def top1(src):
        s = ort_session(src, threads=2)
        return s.run(None, {"input": x})[0].argmax(1)

    ref, int8, half = top1(out / "reference.fp32.onnx"), top1(out / "model.int8.onnx"), top1(typed.SerializeToString())
    assert np.mean(half == int8) >= 0.98
    assert np.mean(half == ref) >= np.mean(int8 == ref) - 0.01
    assert np.mean(half == labels) >= np.mean(ref == labels) - 0.015


# -- `vitedge engine` on a "device", with the stand-in ------------------------------------------

def _complete(bundle, version="10.3.0", facts=STANDIN_GPU, **kwargs):
    from vitedge.app.engine_completion import complete_bundle

    cudart = make_fake_cudart()
    trt = make_fake_trt(version, cudart=cudart, dla_cores=kwargs.pop("dla_cores", 0))
    return complete_bundle(bundle, trt=trt, cudart=cudart, facts=facts, measure_speed=False, **kwargs), trt, cudart


def test_engine_completion_with_the_standin(planned, tmp_path, monkeypatch):
    monkeypatch.setenv("VITEDGE_CACHE_DIR", str(tmp_path / "user-cache"))  # no timing cache from earlier runs
    bundle = _copy(planned[0], tmp_path)
    result, trt, _ = _complete(bundle, val=VAL_DIR if VAL_DIR.is_dir() else None)
    manifest = verify_bundle(bundle)  # rewritten with every file's hash
    for name in ("model.engine", "reference.fp32.engine", "timing.cache", "engine_facts.json"):
        assert name in manifest.files, name
    assert manifest.artifacts.built is True and {"timing.cache", "engine_facts.json"} <= set(manifest.artifacts.extra)
    info = manifest.backend_info
    assert info["engine_built"] is True and info["device"]["gpu_name"] == STANDIN_GPU.gpu_name
    assert info["device"]["l4t"] == "36.4.0" and info["device"]["jetpack"] == "6.1+b123"
    assert info["plan"]["builder_flags"] == ["INT8", "FP16", "OBEY_PRECISION_CONSTRAINTS"] and info["plan"]["fp32_layers"] == 13
    assert info["timing_cache"]["device"]["tensorrt"] == "10.3.0" and info["timing_cache"]["reused"] is False
    assert manifest.toolchain["tensorrt"] == "10.3.0"
    assert [c for c in trt.calls if c[0] == "parser.parse_from_file"] == [("parser.parse_from_file", "model.int8.onnx"),
                                                                         ("parser.parse_from_file", "reference.fp32.onnx"),
                                                                         ("parser.parse_from_file", "model.deepstream.onnx")]
    assert not [p for p in bundle.parent.iterdir() if p.name.endswith(".partial") or ".old-" in p.name]
    if VAL_DIR.is_dir():
        assert result.passed is True and manifest.validation["passed"] is True
        assert manifest.validation["accuracy"]["samples"] == 397

    # A second run needs --force, and then reuses the bundle's timing cache (same device and flags).
    with pytest.raises(UsageError, match="already holds an engine built on GPU Stand-in GPU"):
        _complete(bundle)
    _complete(bundle, force=True)
    again = read_manifest(bundle)
    assert again.backend_info["timing_cache"]["reused"] is True and again.validation is None
    assert "the bundle's timing cache" in again.backend_info["timing_cache"]["source"]
    first_cache = manifest.backend_info["timing_cache"]
    assert again.backend_info["timing_cache"]["input_sha256"] == first_cache["sha256"]  # the very cache recorded, checked
    assert list((tmp_path / "user-cache" / "tensorrt").glob("timing-*.cache"))  # kept for rebuilds of other bundles too

    # The runner refuses the engine on another device, naming the fact.
    from vitedge.backends.tensorrt.runner import TensorRtRunner

    other = DeviceFacts(**{**STANDIN_GPU.to_dict(), "gpu_name": "NVIDIA A100", "compute_capability": "8.0", "machine": "x86_64",
                           "l4t": None, "jetpack": None})
    runner = TensorRtRunner(bundle / "model.engine", trt=make_fake_trt("10.3.0", cudart=make_fake_cudart()),
                            cudart=make_fake_cudart(), device_facts=other)
    with pytest.raises(IncompatibleEngineError, match="GPU 'NVIDIA A100' here vs 'Stand-in GPU"):
        runner.open()


def test_runner_binds_by_name_and_splits_batches(planned, tmp_path):
    from vitedge.backends.tensorrt.runner import TensorRtRunner
    from vitedge.onnxkit.session import ort_session

    bundle = _copy(planned[0], tmp_path)
    _complete(bundle)
    cudart = make_fake_cudart()
    trt = make_fake_trt("10.3.0", cudart=cudart)
    x = np.random.default_rng(0).standard_normal((19, 3, 32, 32)).astype(np.float32)  # > max batch 8: split in 3
    with TensorRtRunner(bundle / "model.engine", trt=trt, cudart=cudart, device_facts=STANDIN_GPU) as runner:
        assert runner.input_name == "input" and runner.input_hw == (32, 32) and (runner.min_batch, runner.max_batch) == (1, 8)
        got = runner.infer(x)
    expected = ort_session(bundle / "model.int8.onnx").run(None, {"input": x})[0]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert not cudart.allocations  # close() freed the device buffers


def test_engine_completion_on_trt11_builds_from_the_cast_graph(planned, tmp_path):
    bundle = _copy(planned[0], tmp_path)
    facts = DeviceFacts(**{**STANDIN_GPU.to_dict(), "tensorrt": "11.4.0"})
    _, trt, _ = _complete(bundle, version="11.4.0", facts=facts)
    manifest = verify_bundle(bundle)
    assert "model.int8.typed.onnx" in manifest.files and manifest.backend_info["plan"]["strongly_typed"] is True
    assert manifest.backend_info["typed_graph"]["fp32_layernorms"]
    assert ("parser.parse_from_file", "model.int8.typed.onnx") in trt.calls
    assert not [c for c in trt.calls if c[0] == "config.set_flag"]
    assert "--stronglyTyped" in (bundle / "trtexec.txt").read_text()


def test_engine_completion_with_dla_reports_gpu_fallback(planned, tmp_path):
    bundle = _copy(planned[0], tmp_path)
    data = json.loads((bundle / "manifest.json").read_text())
    data["target"]["profile"]["backend_options"]["dla_core"] = 0
    (bundle / "manifest.json").write_text(json.dumps(data))
    _complete(bundle, dla_cores=2)
    dla = read_manifest(bundle).backend_info["dla"]
    assert dla["core"] == 0 and dla["gpu_fallback"] is True and dla["gpu_fallback_count"] > 0
    assert any("LayerNormalization" in name for name in dla["gpu_fallback_layers"])


def test_a_failed_engine_build_leaves_the_bundle_untouched(planned, tmp_path):
    from vitedge.app.engine_completion import complete_bundle

    bundle = _copy(planned[0], tmp_path)
    before = _snapshot(bundle)
    trt = make_fake_trt("10.3.0", fail={"build"})  # build_serialized_network returns None, as TensorRT does
    with pytest.raises(BundleError, match="could not build model.engine from model.int8.onnx: .*out of memory"):
        complete_bundle(bundle, trt=trt, cudart=make_fake_cudart(), facts=STANDIN_GPU)
    assert _snapshot(bundle) == before
    assert not [p for p in tmp_path.iterdir() if p.name != bundle.name]


# -- `vitedge engine` when TensorRT fails, through the CLI ---------------------------------------

@pytest.fixture
def standin_installed(monkeypatch):
    """Install the stand-in as `tensorrt` (and cuda-python's runtime) for the CLI; returns a setter."""
    import sys

    from vitedge.backends.tensorrt import backend as tensorrt_backend
    from vitedge.backends.tensorrt import device as tensorrt_device
    from vitedge.backends.tensorrt import runner as tensorrt_runner

    def install(version="10.3.0", **fake):
        cudart = make_fake_cudart()
        trt = make_fake_trt(version, cudart=cudart, **fake)
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        monkeypatch.setattr(tensorrt_device, "cudart_module", lambda: cudart)
        monkeypatch.setattr(tensorrt_runner, "cudart_module", lambda: cudart)
        monkeypatch.setattr(tensorrt_backend, "cudart_module", lambda: cudart)
        return trt

    return install


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (subfolders such as camera/ too), by relative path."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("fake, val, match", [
    ({"fail": {"parse"}}, False, "ONNX parser rejected model.int8.onnx: In node 0 with name: "),
    ({"fail": {"build"}}, False, "could not build model.engine from model.int8.onnx: [defaultAllocator.cpp::allocate] Error Code 1"),
    ({"fail": {"deserialize"}}, False, "built model.engine but cannot deserialise it: 1: [runtime.cpp::deserializeCudaEngine]"),
    ({"fail": {"shape"}}, True, "TensorRT rejected input shape"),
    ({"fail": {"context"}}, True, "could not create an execution context for"),
    ({"dla": True}, False, "dla_core = 0 but this device has 0 DLA core(s)"),
])
def test_engine_cli_reports_each_tensorrt_failure_in_one_line(planned, tmp_path, monkeypatch, standin_installed, fake, val, match):
    if val and not VAL_DIR.is_dir():
        pytest.skip("calibration/digits/val is not in this checkout yet")
    monkeypatch.setenv("VITEDGE_CACHE_DIR", str(tmp_path / "user-cache"))
    bundle = _copy(planned[0], tmp_path)
    if fake.pop("dla", False):  # a profile asking for DLA core 0, on a device without DLA (Orin Nano)
        data = json.loads((bundle / "manifest.json").read_text())
        data["target"]["profile"]["backend_options"]["dla_core"] = 0
        (bundle / "manifest.json").write_text(json.dumps(data))
    before = _snapshot(bundle)
    standin_installed(**fake)
    code, text = run_vitedge(["engine", str(bundle), "-q"] + (["--val", str(VAL_DIR), "--no-latency"] if val else []))
    errors = [line for line in text.splitlines() if line.startswith("vitedge: error:")]
    assert code == 2 and len(errors) == 1 and match in errors[0], text
    assert "Traceback" not in text
    assert _snapshot(bundle) == before  # nothing half-written
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "user-cache") == [bundle.name]  # no leftovers
    caches = list((tmp_path / "user-cache").glob("tensorrt/*.cache"))
    if not val:
        assert not caches  # the build itself failed: no timing cache entry
    for cache in caches:  # the engines were built, the run failed: a complete entry, checked by its hash
        from vitedge.files.atomic import sha256_file

        assert cache.with_suffix(".sha256").read_text().strip() == sha256_file(cache)


def test_a_bug_is_exit_code_3_in_one_line_and_debug_shows_the_traceback(planned, tmp_path, monkeypatch, standin_installed, capsys):
    """Exit code 3 is documented for internal errors: a call TensorRT's bindings reject (TypeError)."""
    monkeypatch.setenv("VITEDGE_CACHE_DIR", str(tmp_path / "user-cache"))
    bundle = _copy(planned[0], tmp_path)
    before = _snapshot(bundle)
    standin_installed(fail={"api"})
    code, text = run_vitedge(["engine", str(bundle), "-q"])
    lines = [line for line in text.splitlines() if line.startswith("vitedge: ")]
    assert code == 3 and len(lines) == 1, text
    assert lines[0].startswith("vitedge: internal error: TypeError: build_serialized_network(): incompatible function arguments")
    assert lines[0].endswith("(re-run with --debug for the traceback)") and "Traceback" not in text
    assert _snapshot(bundle) == before and sorted(p.name for p in tmp_path.iterdir() if p.name != "user-cache") == [bundle.name]
    from vitedge.cli.entry import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # --debug adds the traceback, never changes the exit code
        main(["--debug", "engine", str(bundle), "-q"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 3 and "Traceback" in err and "incompatible function arguments" in err


def test_engine_cli_completes_the_bundle_with_the_standin(planned, tmp_path, monkeypatch, standin_installed):
    """The success path through the CLI, for contrast with the failures above."""
    monkeypatch.setenv("VITEDGE_CACHE_DIR", str(tmp_path / "user-cache"))
    bundle = _copy(planned[0], tmp_path)
    standin_installed()
    code, text = run_vitedge(["engine", str(bundle)])
    assert code == 0 and "built " in text, text
    info = verify_bundle(bundle).backend_info
    blocked = sum(1 for b in info["attention"]["blocks"] if not (b["qk_quantized"] and b["pv_quantized"]))
    assert bool(blocked) == ("warning: INT8 fused attention cannot happen" in text)
    assert ("relies on TensorRT moving the Q/DQ after P.V back" in " ".join(info["attention"]["warnings"])) == (blocked < 6)
    if blocked:  # said before the build: the blocks whose attention matmuls the budget returned to float
        assert f"INT8 fused attention cannot happen in {blocked} of 6" in info["attention"]["warnings"][0]
    assert "DeepStream: camera/deepstream/config_infer.txt points at model.deepstream.engine" in " ".join(text.split())
    layers = info["build"]["int8"]["engine_layers"]
    assert len(layers["attention"]["blocks"]) == 6 and layers["layer_precision"]
    report = (bundle / "report.md").read_text()
    assert "## TensorRT" in report and ("INT8 fused attention cannot happen" in report) == bool(blocked)
    assert "fused MHA kernel" in report and report.count("| only if TensorRT moves the Q/DQ after P.V back") == 6 - blocked


# -- the timing cache is keyed and checked by hash -----------------------------------------------

def test_timing_cache_is_reused_only_when_key_and_hash_match(tmp_path, monkeypatch):
    from vitedge.backends.tensorrt.bundle import (
        _load_timing_cache,
        _store_user_cache,
        timing_cache_key,
        timing_cache_parts,
    )
    from vitedge.backends.tensorrt.plan import (
        TensorRtOptions,
        assumed_capabilities,
        plan_build,
    )
    from vitedge.files.atomic import sha256_bytes

    monkeypatch.setenv("VITEDGE_CACHE_DIR", str(tmp_path / "user-cache"))
    plan = plan_build(TensorRtOptions(), (1, 4), assumed_capabilities(10))
    parts, key = timing_cache_parts(STANDIN_GPU, plan), timing_cache_key(STANDIN_GPU, plan)
    (tmp_path / "timing.cache").write_bytes(b"cache-bytes")
    recorded = {"timing_cache": {"key": key, "parts": parts, "sha256": sha256_bytes(b"cache-bytes")}}
    data, why = _load_timing_cache(tmp_path, recorded, key, parts)
    assert data == b"cache-bytes" and "checked" in why

    (tmp_path / "timing.cache").write_bytes(b"cache-bytes, edited")
    data, why = _load_timing_cache(tmp_path, recorded, key, parts)
    assert data is None and "does not match the sha256 recorded" in why and why.endswith("started a fresh one")

    newer = DeviceFacts(**{**STANDIN_GPU.to_dict(), "tensorrt": "10.4.0"})
    data, why = _load_timing_cache(tmp_path, recorded, timing_cache_key(newer, plan), timing_cache_parts(newer, plan))
    assert data is None and "tensorrt '10.4.0' here vs '10.3.0'" in why

    _store_user_cache(key, b"user-cache-bytes")  # the copy kept for other bundles, with its sha256 beside it
    (tmp_path / "timing.cache").unlink()
    assert _load_timing_cache(tmp_path, None, key, parts)[0] == b"user-cache-bytes"
    user = next((tmp_path / "user-cache" / "tensorrt").glob("timing-*.cache"))
    user.write_bytes(b"corrupted")
    data, why = _load_timing_cache(tmp_path, None, key, parts)
    assert data is None and "does not match its recorded sha256" in why


# -- with TensorRT and a GPU ------------------------------------------------------------------

def _real_tensorrt():
    trt = pytest.importorskip("tensorrt", reason="TensorRT not installed: the real engine build runs only where TensorRT and a GPU are")
    from vitedge.backends import get_backend

    env = get_backend("tensorrt").check_environment()
    if not env.can_build:
        pytest.skip(f"no CUDA GPU: {env.detail}")
    return trt


@pytest.mark.tensorrt
def test_real_engine_builds_runs_and_validates(tmp_path):
    _real_tensorrt()
    if not (_have_example() and VAL_DIR.is_dir()):
        pytest.skip("the bundled example is not in this checkout yet")
    out = tmp_path / "digits-desktop-gpu"
    code, text = run_vitedge(["build", "--target", "desktop-gpu", str(EXAMPLE), "--calib", str(CALIB_DIR), "--val", str(VAL_DIR), "-o", str(out)])
    assert code == 0, text
    manifest = verify_bundle(out)
    assert manifest.artifacts.built is True and (out / "model.engine").is_file() and (out / "timing.cache").is_file()
    assert manifest.validation["passed"] is True and manifest.backend_info["device"]["gpu_name"]
