"""The FP32 preprocessing probe runs once per build and not again on a warm one (issue 28 item 4).

Where the near-tie gate would excuse flips on labelled data (agreement under its limit), validation runs
FP32 twice more, with the mean moved by -0.25 and +0.25 (docs/gate.md). Those outputs depend on the FP32
graph, the data, the preprocessing and the shift only, like the FP32 reference: so OpenVINO takes the ones
ONNX Runtime computed for the same FP32 ONNX bytes after its own spot check, and a second validation on
the same machine reads them from the validation cache.

The artifact validated here is the bundle's FP32 reference with its head bias moved (class 0 raised by
3 logits): a stand-in "INT8" graph whose agreement with FP32 is under the limit on any CPU. It is validated
with a top-1 drop limit it cannot miss (100 points) and no limit on its decisive images (min_decisive_agreement
0), so no other accuracy row fails, the agreement row is information without the probe, and the probe (which runs
only where it can change the verdict) always runs, whatever the INT8 kernels of this machine round to."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import VAL_DIR

from vitedge.datasources.sources import open_source
from vitedge.bundle.manifest import read_manifest
from vitedge.targets.profiles import ThresholdOverrides
from vitedge.validation import passes
from vitedge.validation.bundle import ValidateOptions, validate_bundle
from vitedge.validation.reference_cache import ReferenceCache, ReferenceCacheSettings

ov = pytest.importorskip("openvino")
ITEMS = 96  # 12 batches of the CPU targets' validation batch (8)
SHIFTS = ("-0.25", "+0.25")


def _moved_head(reference: Path, out: Path) -> Path:
    """``reference`` with class 0's head bias raised by 3: many near-ties flip to class 0."""
    model = onnx.load(str(reference))
    head = next(n for n in model.graph.node if n.output[0] == model.graph.output[0].name)
    bias = next(i for i in model.graph.initializer if i.name == head.input[2])
    values = onnx.numpy_helper.to_array(bias).copy()
    values[0] += 3.0
    bias.CopyFrom(onnx.numpy_helper.from_array(values, bias.name))
    onnx.save(model, str(out))
    return out


@pytest.fixture(scope="module")
def moved(runtime_bundles, tmp_path_factory) -> dict[str, Path]:
    """{target: a copy of the plain bundle whose artifact is the moved-head FP32 graph}."""
    root = tmp_path_factory.mktemp("probe-bundles")
    out = {}
    for target in ("onnx", "intel-cpu"):
        bundle = shutil.copytree(runtime_bundles["plain"][target], root / target)
        # the exported FP32 graph (the intel-cpu bundle's; the onnx bundle ships it with attention fused, a graph
        # OpenVINO's converter is not asked to read)
        model = _moved_head(runtime_bundles["plain"]["intel-cpu"] / "reference.fp32.onnx", root / f"{target}-moved.onnx")
        artifact = bundle / read_manifest(bundle).artifacts.model
        if target == "onnx":
            shutil.copyfile(model, artifact)
        else:
            ov.save_model(ov.convert_model(str(model)), str(artifact))
        out[target] = bundle
    return out


def _validate(bundle: Path, settings: ReferenceCacheSettings, max_top1_drop: float = 100.0):
    manifest = read_manifest(bundle)
    source = open_source(VAL_DIR, manifest.spec.preprocess, limit=ITEMS, seed=1)
    options = ValidateOptions(measure_speed=False, reference_cache=settings,
                              threshold_overrides=ThresholdOverrides(max_top1_drop=max_top1_drop, min_decisive_agreement=0.0))
    return validate_bundle(bundle, manifest, source, options)


def _probe_passes(census) -> list[tuple[str, str]]:
    return sorted((p.runtime, p.side) for p in census if p.stage == "probe")


def test_the_probe_runs_once_for_both_cpu_runtimes_and_not_again_warm(moved, tmp_path):
    settings = ReferenceCacheSettings(root=tmp_path / "cache")
    passes.reset()
    first = _validate(moved["onnx"], settings)
    second = _validate(moved["intel-cpu"], settings)
    assert _probe_passes(passes.passes()) == [("onnxruntime", "fp32+0.25"), ("onnxruntime", "fp32-0.25")], passes.passes()
    for v in (first, second):
        assert v.result.accuracy["top1_agreement"] < v.thresholds.min_agreement  # the probe's condition held
    assert {s: first.report.data.probe_outputs[s]["cache"] for s in SHIFTS} == {s: "miss" for s in SHIFTS}
    for shift in SHIFTS:
        found = second.report.data.probe_outputs[shift]
        assert found["cache"] == "shared" and found["shared"]["runtime"] == "onnxruntime", found
        assert len(found["shared"]["spot_check_items"]) == 2
        assert found["shared"]["max_abs_diff"] <= found["shared"]["tolerance"] * found["shared"]["output_scale"]
    # what the probe measured is what OpenVINO's own FP32 measures (next test) and what ONNX Runtime's did
    assert _probe_top1(first) == _probe_top1(second)
    # the written document says where the outputs came from, and reads back
    second.write(tmp_path / "report")
    doc = json.loads((tmp_path / "report" / "validation.json").read_text())
    assert doc["data"]["probe_outputs"]["-0.25"]["cache"] == "shared"
    assert "mean moved by -0.25: computed by onnxruntime and spot-checked here" in (tmp_path / "report" / "summary.md").read_text()

    passes.reset()  # warm: the same validations again read every FP32 output, the probe's too
    again = [_validate(moved[t], settings) for t in ("onnx", "intel-cpu")]
    assert _probe_passes(passes.passes()) == [] and [p for p in passes.passes() if p.side == "fp32"] == []
    assert [again[0].report.data.probe_outputs[s]["cache"] for s in SHIFTS] == ["hit", "hit"]
    assert _probe_top1(again[0]) == _probe_top1(first) and _probe_top1(again[1]) == _probe_top1(second)


def _probe_top1(v) -> list[tuple[float, float]]:
    return [(row["mean_shift"], row["fp32_top1"]) for row in v.result.accuracy["fp32_preprocessing_probe"]["shifts"]]


def test_without_the_cache_each_runtime_runs_its_own_probe(moved, tmp_path):
    off = ReferenceCacheSettings(enabled=False, root=tmp_path / "cache")
    passes.reset()
    own = [_validate(moved[t], off) for t in ("onnx", "intel-cpu")]
    assert _probe_passes(passes.passes()) == sorted((r, s) for r in ("onnxruntime", "openvino") for s in ("fp32-0.25", "fp32+0.25"))
    assert [own[1].report.data.probe_outputs[s]["cache"] for s in SHIFTS] == ["off", "off"]
    assert _probe_top1(own[0]) == _probe_top1(own[1])  # OpenVINO's own FP32 probe measures what the shared one said
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("*.npz"))


def test_shared_probe_outputs_that_disagree_with_the_spot_check_are_not_used(moved, tmp_path):
    """A wrong shared probe entry (every row moved by 1% of the output scale) is caught by OpenVINO's spot check:
    one warning and its own probe pass for that shift."""
    settings = ReferenceCacheSettings(root=tmp_path / "cache")
    _validate(moved["onnx"], settings)
    cache = ReferenceCache(settings)
    for path in cache.folder.glob("*.npz"):
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
        if meta["parts"].get("variant") == {"probe_mean_shift": -0.25}:
            outputs, origin, _ = cache.load_entry(meta["key"], ITEMS)
            values = outputs.values + 0.01 * np.abs(outputs.values).max()
            cache.save(meta["key"], meta["parts"], type(outputs)(values, outputs.labels), origin=origin)
    passes.reset()
    v = _validate(moved["intel-cpu"], settings)
    assert _probe_passes(passes.passes()) == [("openvino", "fp32-0.25")]
    found = v.report.data.probe_outputs
    assert found["+0.25"]["cache"] == "shared" and found["-0.25"]["cache"] == "miss"
    assert "did not use the FP32 outputs onnxruntime computed" in found["-0.25"]["note"] and "\n" not in found["-0.25"]["note"]


def test_no_probe_where_it_cannot_change_the_verdict(moved, tmp_path):
    """At the profile's 0.2-point drop limit the labels show the moved head's loss: the drop row fails whatever
    the probe would say (it only ever turns the agreement row into a failure), so its two FP32 passes are not
    run; with a limit the moved head meets, they are."""
    settings = ReferenceCacheSettings(root=tmp_path / "cache")
    passes.reset()
    strict = _validate(moved["onnx"], settings, max_top1_drop=0.2)
    rows = {r.name: r for r in strict.result.gate}
    assert not rows["max_top1_drop"].passed and "real loss" in rows["max_top1_drop"].detail
    assert rows["min_agreement"].status == "skip" and "the labels show a real loss" in rows["min_agreement"].detail
    assert "fp32_preprocessing_probe" not in strict.result.accuracy and not strict.report.data.probe_outputs
    assert _probe_passes(passes.passes()) == []
    lenient = _validate(moved["onnx"], settings)
    assert {r.name: r for r in lenient.result.gate}["min_agreement"].passed
    assert _probe_passes(passes.passes()) == [("onnxruntime", "fp32+0.25"), ("onnxruntime", "fp32-0.25")]
