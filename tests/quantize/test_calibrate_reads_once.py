"""Calibration reads its data once (issue 28 item 3): with the default settings (method select, bias
correction) the one pass over the data gives the statistics, every candidate's bias correction, and
the first images with the FP32 output on them, which select scores its candidates on; nothing is
decoded or run through the FP32 graph a second time. A real image-folder source, counted from outside."""

from __future__ import annotations

import shutil

import numpy as np
from helpers.quantize_models import fp32_model, source_for

from vitedge.quantize import QuantConfig, calibrate
from vitedge.quantize.config import SELECT_SAMPLES


class Counting:
    """A calibration source that counts how often it is read and how many items it hands over."""

    def __init__(self, source):
        self.source = source
        self.reads = 0
        self.items = 0

    @property
    def summary(self):
        return self.source.summary

    def __len__(self) -> int:
        return len(self.source)

    def batches(self, batch_size: int):
        self.reads += 1
        for batch in self.source.batches(batch_size):
            self.items += len(batch.images)
            yield batch


def test_the_data_is_read_once_and_select_scores_what_the_pass_kept(tmp_path):
    path, spec = fp32_model("timm")
    n = SELECT_SAMPLES + 8  # more than select scores: it must not read them again
    src = Counting(source_for(spec, limit=n))
    cal = calibrate(path, src, QuantConfig(), cache_dir=tmp_path)
    assert (src.reads, src.items) == (1, n)
    assert cal.selection is not None and cal.selection.available == SELECT_SAMPLES and not cal.selection.reused
    assert cal.refinement is not None and cal.refinement.biases  # bias correction from the same pass
    # the pass is 9 batches of 8; the candidates' graphs run on the first look's batches, once per distinct graph,
    # and only the contenders on the other batches of the 64 images select keeps
    assert cal.forward_passes == 9 + cal.selection.runs and cal.selection.runs >= 2

    # everything cached: nothing read
    again = Counting(source_for(spec, limit=n))
    warm = calibrate(path, again, QuantConfig(), cache_dir=tmp_path)
    assert (again.reads, again.items, warm.forward_passes) == (0, 0, 0)
    assert warm.selection.reused and warm.thresholds == cal.thresholds

    # statistics cached, the choice not: only the images select scores are read, and the FP32 output on
    # them comes from the same session as in the pass, so every score is the same
    shutil.rmtree(tmp_path / "selection")
    third = Counting(source_for(spec, limit=n))
    redo = calibrate(path, third, QuantConfig(), cache_dir=tmp_path)
    assert third.reads == 1 and third.items == SELECT_SAMPLES
    assert redo.selection.to_dict() == cal.selection.to_dict()
    assert redo.thresholds == cal.thresholds and redo.variant == cal.variant
    for name, v in cal.variants.items():
        assert redo.variants[name].thresholds == v.thresholds
        for k, fix in v.refinement.biases.items():
            assert np.array_equal(redo.variants[name].refinement.biases[k].values, fix.values)
