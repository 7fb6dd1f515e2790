"""`vitedge build --cpu-kind KIND`: the bundles are for that CPU kind (issue 47 item 2). The onnx target's INT8 payoff
is decided for it (timed here when this CPU is of that kind, from recorded figures of that kind otherwise, not at all
without them), the manifest records which source decided, and the report and the console say that the bundle's
speed is not timed on that kind. A bad value is refused in one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CALIB_DIR, VAL_DIR

from helpers.cli import vitedge_in_process
from helpers.encoder_checkpoint import encoder_vit_checkpoint
from vitedge.backends.onnxruntime.figures import FIGURES, host_kind, load_figures
from vitedge.core.cpu import CPU_KINDS

REPO = Path(__file__).resolve().parents[2]


def _other_kind() -> str:
    """A kind that is not this CPU's: avx2 (whose figures the package holds) where this CPU is another kind, else one
    without recorded figures."""
    host = host_kind()
    recorded = {p.stem for p in FIGURES.glob("*.json")}
    return "avx2" if host != "avx2" else next(k for k in CPU_KINDS if k not in recorded)


@pytest.mark.skipif(not CALIB_DIR.is_dir(), reason="calibration/digits is not in this checkout")
def test_a_bundle_for_another_kind_records_its_source_and_says_it_was_not_timed_there(tmp_path):
    from vitedge.app.build import BuildRequest, run_build
    from vitedge.budget import BudgetSettings
    from vitedge.bundle.manifest import verify_bundle
    from vitedge.core.ui import StageLog
    from vitedge.validation.reference_cache import ReferenceCacheSettings

    enc_path, intake = encoder_vit_checkpoint(tmp_path, depth=1)
    kind = _other_kind()
    log = StageLog(quiet=True)
    [result] = run_build(BuildRequest(model=enc_path, targets=("onnx",), calib=CALIB_DIR, val=VAL_DIR, calib_size=16,
                                      out=tmp_path / "out", cpu_kind=kind, cache=ReferenceCacheSettings(root=tmp_path / "cache"),
                                      intake=intake,
                                      measure_speed=False, budget=BudgetSettings(enabled=False)), log)
    rec = verify_bundle(result.bundle).quantization.int8_payoff
    figures = load_figures(kind)
    assert rec["cpu_kind"] == kind and rec["built_on"] == host_kind()
    assert rec["decided_by"] == (figures.label() if figures else f"none: no figures are recorded for {kind} CPUs")
    assert rec["timed"]["not_timed"] == f"not timed on {kind} CPUs: this build ran on an {host_kind()} CPU"
    if figures:
        assert rec["layers"]["figures"]["source"] == figures.source
    said = f"bundle for {kind} CPUs, built on an {host_kind()} CPU: its INT8 payoff was decided by {rec['decided_by']}"
    assert said in (result.bundle / "report.md").read_text()
    assert "its speed is not timed on " + kind in (result.bundle / "report.md").read_text()


def test_a_cpu_kind_vitedge_does_not_label_is_refused_in_one_line(tmp_path):
    proc = vitedge_in_process("build", REPO / "examples" / "digits_vit.pt", "--target", "onnx", "--calib", CALIB_DIR,
                              "--cpu-kind", "avx-512", "-o", tmp_path / "out")
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--cpu-kind must be one of avx2, avx512, avx-vnni, avx512-vnni, amx" in lines[0] and "'avx-512'" in lines[0]
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()


def test_a_target_that_does_not_decide_for_the_kind_says_its_payoff_and_times_are_this_cpus():
    """intel-cpu (or onnx with int8_payoff off) records no decision for --cpu-kind: one line says so; a target that
    decided for that kind, or a kind that is this CPU's, needs none."""
    from types import SimpleNamespace

    from vitedge.app.build import _kind_not_decided
    from vitedge.backends.base import BuiltArtifact

    kind, profile = _other_kind(), SimpleNamespace(name="intel-cpu")
    line = _kind_not_decided(kind, profile, BuiltArtifact("model.xml", "reference.fp32.xml", info={"int8_payoff": {"cpu": "x"}}))
    assert line.startswith(f"intel-cpu: its INT8 payoff is not decided for {kind} CPUs") and f"not {kind}'s" in line
    assert _kind_not_decided(kind, profile, BuiltArtifact("m", "r", info={"int8_payoff": {"cpu_kind": kind}})) is None
    assert _kind_not_decided(host_kind(), profile, BuiltArtifact("m", "r")) is None and _kind_not_decided(None, profile, BuiltArtifact("m", "r")) is None
