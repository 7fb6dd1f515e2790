"""A DINOv2-style headless encoder builds and passes: its gate and the accuracy budget both hold it
to the per-sample cosine of INT8 vs FP32 embeddings; nearest-neighbour agreement (chaotic for
embeddings that lie close together, as a random-weight DINOv2's do) is reported, and gated only
when asked for."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import CALIB_DIR
from helpers.profiles import untimed_targets

from vitedge.app.build import BuildRequest, run_build
from vitedge.validation.reference_cache import ReferenceCacheSettings
from vitedge.bundle.manifest import read_manifest
from vitedge.targets.profiles import Thresholds
from vitedge.core.ui import StageLog


@pytest.fixture(scope="module")
def dinov2_build(tmp_path_factory, untimed_targets_dir):
    import timm
    import torch

    root = tmp_path_factory.mktemp("dinov2")
    torch.manual_seed(0)
    m = timm.create_model("vit_small_patch14_dinov2", pretrained=False, img_size=56, depth=2, num_classes=0).eval()
    path = root / "dinov2_small.pt"
    torch.save(m.state_dict(), path)
    req = BuildRequest(model=path, targets=("onnx", "intel-cpu"), calib=CALIB_DIR, out=root / "out", cache=ReferenceCacheSettings(root=root / "cache"),
                       measure_speed=False, calib_size=16)
    with untimed_targets(untimed_targets_dir):  # the embedding gate is pinned here, not the INT8 timing
        return root, {r.profile.name: r for r in run_build(req, StageLog(quiet=True))}


def test_dinov2_encoder_builds_and_passes_on_embedding_cosine(dinov2_build):
    root, results = dinov2_build
    for name in ("onnx", "intel-cpu"):
        assert results[name].passed is True, results[name].summary
        manifest = read_manifest(root / "out" / name)
        acc = manifest.validation["accuracy"]
        assert acc["output_kind"] == "embedding"
        assert acc["embedding_cosine_mean"] >= 0.99 and acc["embedding_cosine_low"] >= 0.98
        gate = {r["name"]: r for r in manifest.validation["gate"]}
        assert gate["min_embedding_cosine"]["status"] == gate["min_embedding_cosine_low"]["status"] == "pass"
        assert gate["min_agreement"]["status"] == "skip" and "min_nn_agreement" not in gate
        # the budget judged the same graph by the same rows: met by the full INT8 graph at once
        budget = manifest.quantization.budget
        assert budget["status"] == "int8" and budget["evaluations_used"] == 1
        first = budget["evaluations"][0]["accuracy"]
        assert first["embedding_cosine_low"] >= 0.98 and "nn_agreement" in first
    report = (root / "out" / "onnx" / "report.md").read_text()
    assert "embedding cosine, mean >=" in report  # the budget section states the cosine criterion


def test_neighbour_agreement_is_gated_only_when_asked(dinov2_build):
    root, results = dinov2_build
    agreement = read_manifest(root / "out" / "onnx").validation["accuracy"]["nn_agreement"]
    base = [sys.executable, "-m", "vitedge", "validate", str(root / "out" / "onnx"), "--data", str(CALIB_DIR), "--data-size", "16",
            "--no-latency", "--no-sensitivity", "--report-dir"]
    ok = subprocess.run(base + [str(root / "r1")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    strict = subprocess.run(base + [str(root / "r2"), "--min-nn-agreement", f"{min(1.0, agreement + 0.01):.4f}"],
                            capture_output=True, text=True)
    assert strict.returncode == 1 and "nearest-neighbour agreement" in strict.stdout + strict.stderr
    bad = subprocess.run(base + [str(root / "r3"), "--min-embedding-cosine", "1.5"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--min-embedding-cosine" in bad.stderr


def test_budget_applies_the_embedding_rows():
    from vitedge.budget import Evaluator, strictest

    t = strictest([Thresholds(), Thresholds(min_embedding_cosine_low=0.995, embedding_cosine_percentile=10.0),
                   Thresholds(min_nn_agreement=0.5)])
    assert (t.min_embedding_cosine_low, t.embedding_cosine_percentile, t.min_nn_agreement) == (0.995, 5.0, 0.5)
    ev = Evaluator.__new__(Evaluator)  # verdict() only reads the thresholds
    acc = {"output_kind": "embedding", "embedding_cosine_mean": 0.9999, "embedding_cosine_low": 0.999, "nn_agreement": 0.03,
           "top1_agreement": 0.03, "samples": 32}
    ev.thresholds = Thresholds()
    assert ev.verdict(acc) == (True, [])
    ev.thresholds = t
    passed, failures = ev.verdict(acc)
    assert not passed and len(failures) == 1 and "nearest-neighbour" in failures[0]
    ev.thresholds = Thresholds(min_embedding_cosine_low=0.9995)
    passed, failures = ev.verdict(acc)
    assert not passed and "p5" in failures[0]
