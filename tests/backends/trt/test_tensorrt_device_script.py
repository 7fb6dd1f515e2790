"""The parts of `python benchmarks/tensorrt_device.py` that run without a GPU: its command line, the list of
models it builds, what it asks a user to bring, and the check of an engine against what the bundle promised.

The device part (engine builds, timings, the camera frame) has never run: there is no GPU here. The promise
check reads the records a device build writes (``backend_info`` with the engine inspector's summary, made here
by the real ``summarize_layers`` from inspector JSON in TensorRT 10's schema, and the validation section).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace

import pytest

from vitedge.backends.tensorrt.attention import AttentionBlock
from vitedge.backends.tensorrt.engine_inspect import summarize_layers

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "tensorrt_device.py"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def device():
    return _load("tensorrt_device")


@pytest.fixture(scope="module")
def models():
    return _load("tensorrt_device_models")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.parametrize("args, message", [
    (["--versions", "9.9"], "error: no recorded TensorRT 9.9; known: "),
    (["--imagenet", "no-such-folder"], "error: --imagenet no-such-folder: no such file or folder"),
    (["--vit-b16", "no-such.pth"], "error: --vit-b16 no-such.pth: no such file or folder"),
])
def test_a_bad_command_line_is_one_line_before_anything_runs(args, message):
    """Without a GPU the command used to print `skipped` and exit 0 for any typo; it now refuses first."""
    proc = _run(*args)
    assert proc.returncode == 2 and proc.stderr.startswith(message) and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_an_imagenet_folder_needs_calib_and_val(tmp_path):
    (tmp_path / "calib").mkdir()
    proc = _run("--imagenet", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: --imagenet {tmp_path}: no val/ folder in it"


def test_the_known_versions_are_the_recorded_surfaces(device):
    args = device.parse_args(["--versions", "10.3", "11.4", "--models", "vit_base_patch16_224"])
    assert device.input_errors(args) == [] and args.versions == ["10.3", "11.4"] and not args.no_models
    assert device.parse_args([]).versions is None  # the TensorRT installed there


def test_the_default_models_are_vit_b16_and_the_first_two_corpus_models(models):
    manifest = tomllib.loads((ROOT / "benchmarks" / "corpus" / "manifest.toml").read_text())
    assert models.default_models() == ["vit_base_patch16_224"] + [m["id"] for m in manifest["model"][:2]]


def test_a_model_without_its_inputs_says_what_to_bring(models, tmp_path, monkeypatch):
    args = SimpleNamespace(imagenet=None, vit_b16=None)
    assert models._sources("vit_base_patch16_224", args, tmp_path) == \
        "ViT-B/16 needs --imagenet DIR with ImageNet-style calib/ and val/ folders"
    monkeypatch.setenv("VITEDGE_CORPUS_CACHE", str(tmp_path / "empty"))
    first = models.default_models()[1]
    said = models._sources(first, args, tmp_path)
    assert said.startswith(f"corpus model {first}: ") and "is missing" in said and said.endswith("(benchmarks/corpus/fetch.md)")
    row = models.run_model(first, args, tmp_path)
    assert row.missing == said and row.bundle is None and not row.mismatches


# -- the engine against what the bundle promised ---------------------------------------------------

def _block(scope: str, pv_output: str, head_size: int = 32) -> AttentionBlock:
    return AttentionBlock(scope=scope, softmax=f"{scope}Softmax", qk_matmul=f"{scope}MatMul", pv_matmul=f"{scope}MatMul_1",
                          heads=4, tokens=65, head_size=head_size, qk_quantized=True, pv_quantized=True, pv_output_qdq=pv_output)


def _layer(name: str, dtype: str, tactic: str = "") -> dict:
    return {"Name": name, "LayerType": "CaskGemm", "Inputs": [{"Name": f"{name}:in", "Format/Datatype": f"Row major linear {dtype}"}],
            "Outputs": [{"Name": f"{name}:out", "Format/Datatype": f"Row major linear {dtype}"}], "TacticName": tactic}


def _info(blocks: list[AttentionBlock], layers: list[dict]) -> dict:
    attention = [b.to_dict() for b in blocks]
    return {"engine_built": True, "device": {"tensorrt": "10.3.0"}, "attention": {"blocks": attention, "warnings": []},
            "build": {"int8": {"engine_layers": summarize_layers({"Layers": layers, "Bindings": ["input", "logits"]}, attention)}}}


GATE_PASSED = {"accuracy": {"agreement": 99.5}, "gate": [{"name": "top-1 drop", "passed": True}]}


def test_a_promised_block_that_fused_is_no_mismatch(models):
    a, b = _block("/blocks.0/attn/", "direct"), _block("/blocks.1/attn/", "after_shape_ops")
    layers = [_layer("/blocks.0/attn/fmha_v2", "Int8", "sm87_fmha_i8"), _layer("/blocks.1/attn/MatMul", "Int8"),
              _layer("/blocks.1/attn/MatMul_1", "Half"), _layer("/head/Gemm", "Float")]
    row = models.ModelRun("m")
    models.promise_check(row, _info([a, b], layers), GATE_PASSED)
    assert row.mismatches == [] and row.tensorrt == "10.3.0" and row.agreement == 99.5
    assert (row.int8_layers, row.layers) == (2, 4)
    # block 1 did not fuse, but its only Q/DQ after P.V sits behind Transpose+Reshape: nothing was promised
    assert row.mha == {"fused": 1, "not_fused": 1, "unknown": 0}


def test_a_promised_block_that_did_not_fuse_is_a_mismatch(models):
    a = _block("/blocks.0/attn/", "direct")
    row = models.ModelRun("m")
    models.promise_check(row, _info([a], [_layer("/blocks.0/attn/MatMul", "Int8"), _layer("/blocks.0/attn/MatMul_1", "Int8")]),
                         GATE_PASSED)
    assert row.mismatches == ["/blocks.0/attn/: the plan allowed INT8 fused MHA, the engine shows not fused"]


def test_a_block_the_rule_excludes_promises_nothing(models):
    wide = _block("/blocks.0/attn/", "direct", head_size=48)  # not 16, 32 or 64
    row = models.ModelRun("m")
    models.promise_check(row, _info([wide], [_layer("/blocks.0/attn/MatMul", "Int8")]), GATE_PASSED)
    assert row.mismatches == []


def test_a_missed_gate_or_no_engine_is_a_mismatch(models):
    row = models.ModelRun("m")
    models.promise_check(row, _info([], [_layer("/head/Gemm", "Int8")]), {"gate": [{"name": "agreement", "passed": False}]})
    assert row.mismatches == ["the INT8 engine missed the bundle's gate on this device"]
    row = models.ModelRun("m")
    models.promise_check(row, {"engine_built": False}, GATE_PASSED)
    assert row.mismatches == ["no engine was built by vitedge build on this device"] and row.layers is None
