"""An intel-cpu bundle whose INT8 payoff kept the whole model float holds its FP32 graph once, like the onnx target's:
the artifact is the FP32 reference IR itself, the FP32 ONNX graph stands for the Q/DQ graph, the manifest says so
(``artifacts.single_graph``), and every reader of the bundle (verify, validate with its per-layer analysis, the
embedding runtime, the Triton repository) works on it, as on a bundle written before, which held the model four times
(``model.xml`` an IR of the FP32 graph beside the reference IR, ``model.int8.onnx`` a copy of the FP32 ONNX graph).

The payoff times INT8 only on CPUs with VNNI/AMX, and what it decides is a timing: here the CPU is said to have VNNI
and the timing's INT8/FP32 ratio is given (1.5 for every INT8 IR), so the build, OpenVINO's conversion, compilation
and runs, validation and the readers are real on every CPU kind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import CALIB_DIR, VAL_DIR
from helpers.earlier_bundles import rename_artifacts
from helpers.encoder_checkpoint import encoder_vit_checkpoint

REFERENCE_IR = "reference.fp32.xml"
FP32_ONNX = "reference.fp32.onnx"


@pytest.fixture(scope="module")
def fp32_bundle(tmp_path_factory) -> Path:
    """A small ViT's intel-cpu bundle whose timing found INT8 slower than FP32 at every step (made so here)."""
    if not CALIB_DIR.is_dir():
        pytest.skip("calibration/digits is not in this checkout")
    pytest.importorskip("openvino")
    import vitedge.backends.openvino as ov_backend
    import vitedge.backends.ov_payoff as ov_payoff
    from vitedge.app.build import BuildRequest, run_build
    from vitedge.budget import BudgetSettings
    from vitedge.core.cpu import CpuInfo
    from vitedge.core.ui import StageLog
    from vitedge.validation.reference_cache import ReferenceCacheSettings

    vnni = CpuInfo(machine="x86_64", model="a VNNI CPU", flags=frozenset({"avx2", "avx512f", "avx512_vnni"}), known=True)

    def ratios(timer, xml: Path, precision: str) -> dict[int, float]:  # every INT8 IR slower; the FP32 IR is FP32
        return {b: 1.0 if Path(xml).name == REFERENCE_IR else 1.5 for b in timer.batches}

    tmp = tmp_path_factory.mktemp("ov-one-graph")
    enc_path, intake = encoder_vit_checkpoint(tmp, depth=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ov_backend, "read_cpu", lambda *a, **k: vnni)
        mp.setattr(ov_payoff.OvTimer, "ratios", ratios)
        [result] = run_build(BuildRequest(model=enc_path, targets=("intel-cpu",), calib=CALIB_DIR, calib_size=16, out=tmp / "out",
                                          intake=intake, cache=ReferenceCacheSettings(root=tmp / "cache"), measure_speed=False,
                                          budget=BudgetSettings(enabled=False)), StageLog(quiet=True))
    return result.bundle


def _earlier(bundle: Path, dst: Path) -> Path:
    """``bundle`` as vitedge wrote it before: ``model.xml`` an IR of the FP32 graph converted as the artifact (role
    int8), ``model.int8.onnx`` a copy of the FP32 ONNX graph, both named in the manifest, no ``artifacts.single_graph``."""
    from vitedge.backends.openvino import _convert, _input_format
    shutil.copytree(bundle, dst)
    shutil.rmtree(dst / "report")
    shutil.copyfile(dst / FP32_ONNX, dst / "model.int8.onnx")
    _convert(dst / "model.int8.onnx", "model", _input_format(dst / FP32_ONNX), dst)
    return rename_artifacts(dst, model="model.xml", qdq="model.int8.onnx", extra=["model.bin", "reference.fp32.bin"])


def _graph_bytes(bundle: Path) -> int:
    return sum(p.stat().st_size for p in bundle.iterdir() if p.suffix in (".onnx", ".bin"))


def test_the_intel_cpu_bundle_holds_the_fp32_graph_once_and_says_so(fp32_bundle):
    from vitedge.bundle.manifest import verify_bundle

    m = verify_bundle(fp32_bundle)
    record = m.quantization.int8_payoff
    assert record["whole_model_float"] and record["steps"][-1] == {"step": "whole model float", "taken": True,
                                                                   "int8_over_fp32": {"1": 1.0, "8": 1.0}}
    assert m.quantization.layers_int8 == 0 and m.backend_info["int8_layers"]["int8"] == 0  # no INT8 kernel runs
    arts = m.artifacts
    assert arts.model == arts.reference == REFERENCE_IR and arts.qdq == arts.fp32_onnx == FP32_ONNX and arts.single_graph is True
    assert arts.extra == ["reference.fp32.bin"]
    held = sorted(p.name for p in fp32_bundle.iterdir() if p.suffix in (".onnx", ".xml", ".bin"))
    assert held == sorted([FP32_ONNX, REFERENCE_IR, "reference.fp32.bin"])  # no model.xml, model.bin, model.int8.onnx
    assert sorted(f for f in m.files if f.endswith((".onnx", ".xml", ".bin"))) == held
    report = (fp32_bundle / "report.md").read_text()
    assert f"- artifact: `{REFERENCE_IR}` (the FP32 reference itself" in report
    validation = json.loads((fp32_bundle / "report" / "validation.json").read_text())
    assert validation["artifact"]["model"] == validation["artifact"]["reference"] == REFERENCE_IR


@pytest.mark.parametrize("written", ["now", "before"])
def test_both_kinds_validate_analyse_load_and_serve(fp32_bundle, tmp_path, written):
    """This version's intel-cpu bundle (one graph) and one written before (the FP32 graph as model.xml and
    model.int8.onnx too): `vitedge validate` passes, its per-layer analysis says there is no INT8 layer and why, the
    runtime loads it and gives the FP32 graph's outputs, and a Triton repository serves the IR the bundle runs."""
    import onnxruntime as ort

    import vitedge.runtime
    from vitedge.app.validate import ValidateRequest, run_validate
    from vitedge.backends import backend_facts
    from vitedge.camera_apps.exports import export_config
    from vitedge.core.ui import StageLog
    from vitedge.targets.profiles import ThresholdOverrides
    from vitedge.validation.reference_cache import ReferenceCacheSettings

    bundle = fp32_bundle if written == "now" else _earlier(fp32_bundle, tmp_path / "before")
    if written == "before":
        assert _graph_bytes(bundle) > 1.9 * _graph_bytes(fp32_bundle)  # the graph's weights held twice as often
    request = ValidateRequest(bundle, tmp_path / "report", data=VAL_DIR, data_size=32, seed=1, measure_speed=False,
                              sensitivity_samples=8, progress=False, reference_cache=ReferenceCacheSettings(root=tmp_path / "cache"),
                              threshold_overrides=ThresholdOverrides(min_decisive_agreement=0.0))
    validation = run_validate(request, StageLog(quiet=True)).validation
    assert validation.passed and validation.report.accuracy.top1_agreement == 1.0
    assert "ships its FP32 graph as its artifact" in validation.report.sensitivity.error
    x = np.random.default_rng(0).standard_normal((2, 1, 32, 32)).astype(np.float32)
    want = ort.InferenceSession(str(fp32_bundle / FP32_ONNX), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    with vitedge.runtime.load(bundle, warmup=0) as model:
        np.testing.assert_allclose(model.infer(x), want, rtol=1e-3, atol=1e-4)
    files = export_config("triton", bundle, tmp_path / "triton", facts_of=backend_facts)
    [xml] = [tmp_path / "triton" / f for f in files if f.endswith(".xml")]
    [weights] = [tmp_path / "triton" / f for f in files if f.endswith(".bin")]
    shipped = "model" if written == "before" else "reference.fp32"
    assert xml.read_bytes() == (bundle / f"{shipped}.xml").read_bytes()
    assert weights.read_bytes() == (bundle / f"{shipped}.bin").read_bytes()
