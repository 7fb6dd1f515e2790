"""SIGTERM in the build stages after calibration exits 143 (issue 26 item 4), vitedge/core/signals.py: the same checks as
test_sigterm.py's stage cases (tests/reliability/sigterm_build.py), in a file of its own so `--dist loadfile` can run
the two halves on two workers.

Each build starts from a cache that holds the earlier build's calibration statistics (calibration, refinement and
selection entries; the same calibration set, so the same keys), and no FP32 or INT8 reference outputs: what the build has
on disk when one of these stages starts is what a fresh-cache build has then (its calibration just saved), and the
budget and validation outputs are still computed and written in the stage the signal interrupts. Running calibration
again in each case (about a fifth of a build) proved nothing more: its interruption is test_sigterm.py's 'calibrate'.
"""

from __future__ import annotations

import shutil

import pytest
from sigterm_build import sigterm_at_stage

from vitedge.validation.reference_cache import SUBDIR as REFERENCES

STAGES = ["budget ", "build onnx", "validate onnx"]


@pytest.mark.parametrize("stage", STAGES)
def test_sigterm_after_calibration_exits_143_and_keeps_the_earlier_bundle(stage, earlier_onnx_bundle, tmp_path):
    earlier, warm = earlier_onnx_bundle
    cache = tmp_path / "cache"
    shutil.copytree(warm, cache, ignore=lambda folder, names: [REFERENCES] if folder == str(warm) else [])
    assert not (cache / REFERENCES).exists() and any((cache / "calibration").iterdir())
    sigterm_at_stage(stage, earlier, tmp_path, cache)
