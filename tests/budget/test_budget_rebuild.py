"""Accuracy budget (issue 8) on the digits ViT with planted outliers (tests/conftest.py: outlier_vit): a rebuild reads
the outputs of the candidates that ran to the end. Split from test_budget.py (it always had a cache of its own, so
nothing is computed twice) so `--dist loadfile` can run it on the other worker."""

from __future__ import annotations

import pytest
from conftest import CALIB_DIR, EXAMPLES, VAL_DIR
from helpers.budget_builds import NO_SQ

from vitedge.app.build import BuildRequest, run_build
from vitedge.app.overrides import ThresholdOverrides
from vitedge.bundle.manifest import read_manifest
from vitedge.core.ui import StageLog
from vitedge.validation.reference_cache import ReferenceCacheSettings

pytestmark = pytest.mark.skipif(not (EXAMPLES / "digits_vit.pt").exists(), reason="bundled example not present")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("budget-rebuild")


def test_a_rebuild_reads_complete_candidate_outputs_and_reruns_early_stops(work, outlier_vit, no_int8_timing):
    """The budget's candidates of an unchanged model are the same graphs: a rebuild reads the outputs of
    every candidate that ran to the end before (same verdicts, same figures) and runs again only the
    ones that stopped early, whose partial outputs are never stored."""
    import dataclasses

    req = BuildRequest(model=outlier_vit, targets=("onnx",), calib=CALIB_DIR, val=VAL_DIR, out=work / "rerun", cache=ReferenceCacheSettings(root=work / "rerun-cache"),
                       measure_speed=False, quant_overrides=NO_SQ,
                       # drop_confidence 0: labels that may excuse agreement (the paired test) stop no evaluation
                       # early (vitedge.budget.evaluate.certain_miss); this test needs candidates that stop
                       threshold_overrides=ThresholdOverrides(max_top1_drop=0.2, min_agreement=0.99, drop_confidence=0.0))

    def build(force: bool, int8_cache: bool = True) -> tuple[list[dict], list[str]]:
        lines: list[str] = []
        log = StageLog(quiet=True)
        log.info = lambda msg: lines.append(msg)
        result = run_build(dataclasses.replace(req, force=force, cache=dataclasses.replace(req.cache, int8_outputs=int8_cache)), log)[0]
        return read_manifest(result.bundle).quantization.budget["evaluations"], lines

    first, first_log = build(False)
    second, second_log = build(True)
    assert not any("candidate outputs on" in line for line in first_log)
    assert [(e["returned"], e["passed"], e["accuracy"]) for e in second] == [(e["returned"], e["passed"], e["accuracy"]) for e in first]
    complete = [e for e in first if "stopped_early" not in e["accuracy"]]
    assert complete and len(complete) < len(first)  # this search has both kinds
    assert sum("candidate outputs on" in line and "read from the validation cache" in line for line in second_log) == len(complete)
    third, third_log = build(True, int8_cache=False)  # --no-int8-cache: the budget runs every candidate again
    assert not any("candidate outputs on" in line for line in third_log)
    assert [(e["returned"], e["passed"], e["accuracy"]) for e in third] == [(e["returned"], e["passed"], e["accuracy"]) for e in first]
