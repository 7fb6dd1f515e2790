"""The public corpus (benchmarks/corpus): ViTs other people trained, loaded strictly by our own classes.

The checkpoints and test sets are not committed (they belong to their authors): these tests run where a
session filled the cache (benchmarks/corpus/fetch.md) and skip, naming what is missing, everywhere else.
What needs no cache (the manifest and the classes) is checked always."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

CORPUS = Path(__file__).resolve().parents[2] / "benchmarks" / "corpus"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


cache = _load("corpus_cache_for_tests", CORPUS / "cache.py")
classes = _load("corpus_models_for_tests", CORPUS / "models.py")
MANIFEST = cache.load_manifest()
IDS = [m.id for m in MANIFEST.models]


def test_manifest_names_a_source_hash_licence_class_and_measurement_for_every_model():
    assert len(MANIFEST.models) >= 8
    for m in MANIFEST.models:
        assert len(m.file.commit) == 40 and len(m.file.sha256) == 64, m.id
        assert m.licence and m.claimed_where and m.dataset in MANIFEST.datasets, m.id
        assert m.measured_fp32_top1 is not None and 0 < m.measured_fp32_top1 < 100, m.id
        assert len(m.mean) == len(m.std) == m.channels, m.id
        module = getattr(classes, m.model_class)()
        out = module.eval()(torch.zeros(3, m.channels, m.size, m.size))
        assert out.shape == (3, len(MANIFEST.datasets[m.dataset].classes)), m.id


def test_a_missing_file_is_named_with_how_to_bring_it(tmp_path, monkeypatch):
    monkeypatch.setenv(cache.ENV, str(tmp_path / "empty"))
    lines = cache.problems(MANIFEST, ["researchase-mnist"])
    assert any("researchase-mnist" in ln and 'fetch("github:researchase/vit-mnist-explorations")' in ln for ln in lines)
    assert any("mnist-test" in ln and "lijie2020/vae" in ln for ln in lines)


def _need(model_id: str):
    missing = cache.problems(MANIFEST, [model_id])
    if missing:
        pytest.skip(f"corpus cache incomplete ({cache.cache_dir()}): {missing[0]}")


@pytest.mark.parametrize("model_id", IDS)
def test_corpus_model_loads_strictly_and_keeps_its_measured_accuracy(model_id):
    """Our class loads the authors' state_dict with strict=True and, on 1,000 test images, scores within
    4 points of the FP32 top-1 the manifest records for the whole test set (binomial noise at ~55 % is
    +-3.1 points at 2 sigma): a wrong layout or preprocessing loses far more."""
    _need(model_id)
    m = MANIFEST.model(model_id)
    module = getattr(classes, m.model_class)()
    module.load_state_dict(torch.load(m.path, map_location="cpu", weights_only=True), strict=True)
    module.eval()
    items, labels = cache.load_images(MANIFEST.datasets[m.dataset])
    pick = cache.split_indices(len(items), 0, 1000, seed=1).val
    x = np.stack([cache.decode(items[i], m.channels) for i in pick]).astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    x = (x - np.asarray(m.mean, np.float32).reshape(1, -1, 1, 1)) / np.asarray(m.std, np.float32).reshape(1, -1, 1, 1)
    with torch.no_grad():
        pred = module(torch.from_numpy(x)).argmax(1).numpy()
    top1 = float((pred == labels[list(pick)]).mean() * 100)
    assert abs(top1 - m.measured_fp32_top1) <= 4.0, f"{model_id}: {top1:.2f} % on 1,000 images vs {m.measured_fp32_top1} % measured"


def test_results_show_the_default_bundle_beside_each_anchor_per_model():
    """benchmarks/results/corpus.md: per model, the default command's bundle on each target, then every
    anchor on the same splits, with float layers counted as the layers left out of INT8."""
    bench = _load("corpus_bench_for_tests", CORPUS.parent / "corpus.py")
    build = dict(model="m1", format="state_dict", target="onnx", exit_code=0, seconds=12.0, fp32_top1=56.3, int8_top1=56.8,
                 drop_points=-0.5, agreement=97.8, int8_layers=18, layers_total=26, float_layers_returned=None, passed=True, note="")
    res = {"date": "d", "argv": [], "cpu": {"model": "cpu", "cores": 2, "flags": ["avx2"], "vnni": False}, "calib_size": 300,
           "val_size": 1000, "targets": ["onnx"], "extra": [], "builds": [build, {**build, "format": "pt2"}],
           "anchors": [{"model": "m1", "fp32_top1": 56.3, "method": "ORT quantize_static MinMax", "runtime": "onnxruntime",
                        "seconds": 3.0, "top1": 55.9, "drop": 0.4, "agreement": 89.9},
                       {"model": "m1", "method": "NNCF default (ONNX backend)", "error": "RuntimeError: refused"}]}
    text = bench.markdown(res)
    section = text.split("## The default command beside the anchors", 1)[1].split("## Every build", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| m1 |")]
    assert len(rows) == 3  # the state_dict build only, then both anchors
    assert "**vitedge default** (onnx)" in rows[0] and "| 8 of 26 |" in rows[0] and "| pass |" in rows[0]
    assert "ORT quantize_static MinMax" in rows[1] and "| 89.90 |" in rows[1] and "none (full INT8)" in rows[1]
    assert "RuntimeError: refused" in rows[2] and "none (full INT8)" not in rows[2]
    assert "no VNNI" in text
