"""The onnx target's keep-float step is decided for the CPU kind the bundle is for (issue 47 item 2,
vitedge/backends/onnxruntime/figures.py): timed when the build machine is of that kind, from the figures recorded for
that kind otherwise (vitedge/backends/onnxruntime/payoff_figures/, written from benchmarks/results), and not at all
when none are recorded. Real graphs, real ONNX Runtime; the build machine's kind is given as recorded facts, as
tests/app/test_int8_not_faster.py gives its CPUs."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import CALIB_DIR
from helpers.encoder_checkpoint import encoder_vit_checkpoint

from vitedge.backends.float_layers import int8_layers
from vitedge.backends.onnxruntime.figures import FIGURES, decide_source, layer_shapes, load_figures, recorded_verdicts
from vitedge.core.cpu import CPU_KINDS
from vitedge.core.errors import UsageError

RECORDED_KINDS = sorted(p.stem for p in FIGURES.glob("*.json"))


@pytest.fixture(scope="module")
def narrow_vit(tmp_path_factory):
    """(FP32 path, Q/DQ path) of a width-32 ViT (the corpus's narrowest layout), exported and quantized (minmax)."""
    if not CALIB_DIR.is_dir():
        pytest.skip("calibration/digits is not in this checkout")
    from vitedge.datasources.sources import open_source
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import load_model
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    folder = tmp_path_factory.mktemp("narrow")
    enc_path, intake = encoder_vit_checkpoint(folder, depth=2)
    loaded = load_model(enc_path, intake)
    fp32 = folder / "model.fp32.onnx"
    export_onnx(loaded, fp32)
    source = open_source(CALIB_DIR, loaded.spec.preprocess, limit=16, seed=0, class_names=None)
    qdq = build_qdq(calibrate(fp32, source, QuantConfig(method="minmax"), cache_dir=folder / "cache")).save(folder / "model.qdq.onnx")
    return fp32, qdq


def _build(narrow_vit, out: Path, kind: str, host: str, lines: list[str]):
    from vitedge.backends.base import BuildContext
    from vitedge.backends.onnxruntime.backend import OnnxRuntimeBackend, OnnxRuntimeOptions

    fp32, qdq = narrow_vit
    out.mkdir()
    shutil.copyfile(qdq, out / "model.int8.onnx")  # as app/build hands it over: the Q/DQ graph under the artifact's name
    ctx = BuildContext(qdq_path=out / "model.int8.onnx", fp32_path=fp32, out_dir=out, options=OnnxRuntimeOptions(),
                       batch_sizes=(1, 8), log=lines.append, cpu_kind=kind, host_kind=host)
    return OnnxRuntimeBackend().build(ctx)


def _int8_names(path: Path) -> set[str]:
    from vitedge.backends.onnxruntime.backend import unfold_int8_rewrites

    graph = onnx.load(str(path))
    unfold_int8_rewrites(graph)
    return set(int8_layers(graph))


@functools.lru_cache(maxsize=None)
def _other_kind(than: str) -> str:
    return next(k for k in CPU_KINDS if k != than)


def test_the_recorded_path_floats_what_the_figures_of_that_kind_say_and_times_nothing(narrow_vit, tmp_path):
    """A bundle for avx2 CPUs built on another kind: its keep-float step reads the recorded avx2 figures (which the
    package holds, from benchmarks/results), floats exactly the groups they judge slower at batch 1 and 8, times
    nothing, and records that source, the figures' origin and that nothing was timed on avx2."""
    assert "avx2" in RECORDED_KINDS
    figures = load_figures("avx2")
    assert figures.source == "benchmarks/results/int8_payoff_groups_avx2.json" and figures.isa == "avx2" and figures.date
    assert (Path(__file__).resolve().parents[3] / figures.source).is_file()
    lines: list[str] = []
    artifact = _build(narrow_vit, tmp_path / "bundle", "avx2", _other_kind("avx2"), lines)
    rec = artifact.info["int8_payoff"]
    assert rec["cpu_kind"] == "avx2" and rec["decided_by"] == figures.label()
    layers = rec["layers"]
    assert layers["figures"]["source"] == figures.source and layers["timed_on"] is None and "not timed on avx2" in layers["not_timed"]
    assert "current_over_fp32" not in layers and rec["timed"]["not_timed"] and rec["timed"]["whole_model_float"] is False
    assert "not_timed" in artifact.info["reference_attention_fusion"]  # the fusion kept, as without timing
    # the same decision from the figures, computed here: the floated layers are those groups' layers
    from vitedge.backends.onnxruntime import layer_payoff

    expected = {n for c in layers["candidates"] for n in c["layers"]}
    shapes = layer_shapes(onnx.load(str(narrow_vit[1])))
    assert shapes and all(m > 0 and k > 0 and n > 0 for m, k, n in shapes.values())
    shipped = _int8_names(tmp_path / "bundle" / artifact.model)
    assert expected and not (expected & shipped)  # width-32 GEMMs lose on avx2 by its figures: some go float
    assert shipped  # and not every layer: the wider ones win there
    assert {k["name"] for k in rec["kept_float"]} >= expected
    assert all("by recorded figures for avx2 CPUs" in k["why"] and "not timed on avx2" in k["why"]
               for k in rec["kept_float"] if k["name"] in expected)
    graph = layer_payoff.optimized_graph(tmp_path / "bundle" / artifact.model)
    assert not any(v.to_float for v in recorded_verdicts(layer_payoff.layer_groups(graph), shapes, figures, (1, 8),
                                                         layer_payoff.sole_readers(graph)))  # nothing left to float
    assert any("by recorded figures for avx2 CPUs" in line and "not timed on avx2" in line for line in lines)


def test_no_figures_for_the_kind_keeps_int8_and_says_how_to_judge_it(narrow_vit, tmp_path):
    """A bundle for a kind nobody recorded figures for: every INT8 layer stays INT8, nothing is timed, and one line
    says the payoff could not be judged there and that a build on that kind measures it."""
    kind = next(k for k in CPU_KINDS if k not in RECORDED_KINDS)
    lines: list[str] = []
    artifact = _build(narrow_vit, tmp_path / "bundle", kind, "avx2" if kind != "avx2" else "amx", lines)
    rec = artifact.info["int8_payoff"]
    assert rec["cpu_kind"] == kind and rec["decided_by"] == f"none: no figures are recorded for {kind} CPUs"
    assert "layers" not in rec and rec["timed"]["whole_model_float"] is False
    assert _int8_names(tmp_path / "bundle" / artifact.model) == set(int8_layers(onnx.load(str(narrow_vit[1]))))
    said = [line for line in lines if "could not judge" in line]
    assert len(said) == 1 and f"build on an {kind} CPU to measure it" in said[0]


def test_a_kind_vitedge_does_not_label_is_refused():
    with pytest.raises(UsageError, match="must be one of avx2, avx512, avx-vnni, avx512-vnni, amx"):
        decide_source("avx9", "avx2")
    assert decide_source(None, "avx2").source == "measured" and decide_source("avx2", "avx2").source == "measured"


def test_figures_are_looked_up_by_the_nearest_shape_and_not_beyond_the_recorded_range():
    figures = load_figures("avx2")
    g = figures.groups[0]
    assert figures.at(g.m, g.k, g.n) == pytest.approx((g.int8_kernel_us, g.quantize_us, g.fp32_us))
    k8, q8, f8 = figures.at(g.m * 2 ** 0.2, g.k, g.n)  # nearest is still g: times scaled by the work
    assert k8 / f8 == pytest.approx(g.int8_kernel_us / g.fp32_us) and q8 > g.quantize_us
    top = max(x.m for x in figures.groups)
    assert figures.at(top * 3, g.k, g.n) is None and figures.at(g.m, g.k, 0) is None
    assert np.isfinite(figures.noise) and 0 < figures.noise < 1
