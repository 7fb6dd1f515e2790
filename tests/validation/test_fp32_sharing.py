"""One FP32 pass shared by the CPU runtimes (issue 28 item 4): `vitedge validate` of the onnx and intel-cpu
bundles of one build runs the FP32 graph once (ONNX Runtime); OpenVINO's FP32 side takes those outputs only
after its own FP32 graph agrees on a spot check, and runs its own pass when it does not, when the cache is
off, or when its reference IR cannot be tied to the FP32 ONNX bytes."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from conftest import VAL_DIR

from vitedge.app.validate import ValidateRequest, run_validate
from vitedge.files.atomic import sha256_file
from vitedge.bundle.manifest import read_manifest
from vitedge.core.ui import StageLog
from vitedge.targets.profiles import ThresholdOverrides
from vitedge.validation import passes
from vitedge.validation.bundle import ValidateOptions, validate_bundle
from vitedge.validation.document import ValidationReport
from vitedge.validation.reference_cache import (
    CROSS_RUNTIME_TOLERANCE,
    ReferenceCache,
    ReferenceCacheSettings,
    fp32_source_sha256,
)

pytest.importorskip("openvino")
ITEMS = 96  # 12 batches of the CPU targets' validation batch (8)


def _validate(bundle, report_dir, settings: ReferenceCacheSettings):
    request = ValidateRequest(bundle, report_dir, data=VAL_DIR, data_size=ITEMS, seed=1, measure_speed=False, sensitivity=False,
                              progress=False, reference_cache=settings,
                              threshold_overrides=ThresholdOverrides(min_decisive_agreement=0.0))  # 96 items: too few to tell
    return run_validate(request, StageLog(quiet=True)).validation


def _fp32_passes(census) -> list[str]:
    return sorted(p.runtime for p in census if p.side == "fp32")


def _shared_entry(settings: ReferenceCacheSettings):
    """(key, outputs, origin) of the one shared FP32 entry in the cache."""
    cache = ReferenceCache(settings)
    found = []
    for path in cache.folder.glob("*.npz"):
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
        if meta["parts"].get("kind") == "fp32-shared" and "variant" not in meta["parts"]:  # not the probe's shifted FP32
            outputs, origin, note = cache.load_entry(meta["key"], ITEMS)
            assert note is None
            found.append((meta["key"], meta["parts"], outputs, origin))
    assert len(found) == 1, found
    return found[0]


def test_the_reference_ir_is_tied_to_the_fp32_onnx_it_was_converted_from(runtime_bundles, tmp_path):
    """Both references name the exported FP32 graph: the IR it was converted from (the intel-cpu bundle ships that
    graph too), the onnx bundle's one FP32 graph (that graph with attention fused) the graph it computes."""
    bundles = runtime_bundles["plain"]
    onnx_sha = sha256_file(bundles["intel-cpu"] / "reference.fp32.onnx")
    assert fp32_source_sha256(bundles["onnx"] / "reference.fp32.onnx") == onnx_sha
    assert read_manifest(bundles["onnx"]).artifacts.fp32_graph == {"form": "fused", "source_sha256": onnx_sha}
    assert fp32_source_sha256(bundles["intel-cpu"] / "reference.fp32.xml") == onnx_sha
    old = tmp_path / "reference.fp32.xml"  # as an older vitedge wrote it: no source in its rt_info
    old.write_text("".join(line for line in (bundles["intel-cpu"] / "reference.fp32.xml").read_text().splitlines(True)
                           if "vitedge.fp32_source_sha256" not in line))
    assert fp32_source_sha256(old) is None


def test_validating_both_cpu_bundles_runs_the_fp32_graph_once(runtime_bundles, tmp_path):
    bundles = runtime_bundles["plain"]
    settings = ReferenceCacheSettings(root=tmp_path / "cache")
    passes.reset()
    first = _validate(bundles["onnx"], tmp_path / "onnx", settings)
    second = _validate(bundles["intel-cpu"], tmp_path / "intel-cpu", settings)
    census = passes.passes()
    assert _fp32_passes(census) == ["onnxruntime"], census  # OpenVINO's FP32 side ran its spot check only
    assert sorted(p.runtime for p in census if p.side == "int8") == ["onnxruntime", "openvino"]
    assert first.report.data.reference["cache"] == "miss" and first.report.data.shared_fp32() is None
    ref = second.report.data.reference
    assert ref["cache"] == "shared", ref
    shared = second.report.data.shared_fp32()
    assert shared["runtime"] == "onnxruntime" and shared["tolerance"] == CROSS_RUNTIME_TOLERANCE
    assert shared["source_sha256"] == sha256_file(bundles["intel-cpu"] / "reference.fp32.onnx")  # the exported graph
    rows = shared["spot_check_items"]
    assert len(rows) == 2 and all(b - a + 1 == 8 and a % 8 == 0 for a, b in rows)  # two whole batches of 8
    assert 0 <= shared["max_abs_diff"] <= CROSS_RUNTIME_TOLERANCE * shared["output_scale"]
    assert second.passed
    # the written document and its report say so, and read back
    doc = json.loads((tmp_path / "intel-cpu" / "validation.json").read_text())
    assert ValidationReport.from_json(doc).data.shared_fp32() == shared
    summary = (tmp_path / "intel-cpu" / "summary.md").read_text()
    assert "computed by onnxruntime from the same FP32 ONNX graph" in summary and "16 items run on this runtime's own" in summary
    # the shared entry names who computed it, under the cache's HMAC
    _key, parts, outputs, origin = _shared_entry(settings)
    assert origin["runtime"] == "onnxruntime" and "runtime" not in parts and parts["source_sha256"] == shared["source_sha256"]


def test_no_reference_cache_runs_each_runtimes_own_fp32(runtime_bundles, tmp_path):
    bundles = runtime_bundles["plain"]
    off = ReferenceCacheSettings(enabled=False, root=tmp_path / "cache")
    passes.reset()
    for target in ("onnx", "intel-cpu"):
        v = _validate(bundles[target], tmp_path / target, off)
        assert v.report.data.reference["cache"] == "off" and v.report.data.shared_fp32() is None
    assert _fp32_passes(passes.passes()) == ["onnxruntime", "openvino"]
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").rglob("*.npz"))


def test_shared_outputs_that_disagree_with_the_spot_check_are_not_used(runtime_bundles, tmp_path):
    """An authentic but wrong shared entry (here: one row's top-1 moved by a small amount) is caught by
    OpenVINO's spot check: one warning says what differed and its own FP32 pass runs."""
    bundles = runtime_bundles["plain"]
    settings = ReferenceCacheSettings(root=tmp_path / "cache")
    _validate(bundles["onnx"], tmp_path / "onnx", settings)
    key, parts, outputs, origin = _shared_entry(settings)
    values = outputs.values.copy()
    values += 0.01 * np.abs(values).max()  # every row off by 1% of the scale: 10x the tolerance, top-1 unchanged
    ReferenceCache(settings).save(key, parts, type(outputs)(values, outputs.labels), origin=origin)
    passes.reset()
    v = _validate(bundles["intel-cpu"], tmp_path / "intel-cpu", settings)
    assert _fp32_passes(passes.passes()) == ["openvino"]
    ref = v.report.data.reference
    assert ref["cache"] == "miss" and v.report.data.shared_fp32() is None
    assert "did not use the FP32 outputs onnxruntime computed" in ref["note"] and "of the output scale" in ref["note"], ref
    assert "ran this runtime's own FP32 pass" in ref["note"] and "\n" not in ref["note"]


def test_a_reference_ir_without_its_source_runs_its_own_fp32(runtime_bundles, tmp_path):
    """A bundle an older vitedge built (its reference IR records no source graph) never shares; the same
    bundle with it does, on the same data and cache."""
    from vitedge.datasources.sources import open_source

    bundles = runtime_bundles["plain"]
    options = ValidateOptions(measure_speed=False, reference_cache=ReferenceCacheSettings(root=tmp_path / "cache"))
    old = tmp_path / "old-intel-cpu"
    shutil.copytree(bundles["intel-cpu"], old)
    xml = old / "reference.fp32.xml"
    xml.write_text("".join(line for line in xml.read_text().splitlines(True) if "vitedge.fp32_source_sha256" not in line))
    manifest = read_manifest(bundles["onnx"])
    source = open_source(VAL_DIR, manifest.spec.preprocess, limit=ITEMS, seed=1)
    validate_bundle(bundles["onnx"], manifest, source, options)
    passes.reset()
    untied = validate_bundle(old, read_manifest(old), source, options)
    tied = validate_bundle(bundles["intel-cpu"], read_manifest(bundles["intel-cpu"]), source, options)
    assert _fp32_passes(passes.passes()) == ["openvino"]  # the untied one's; the tied one ran its spot check only
    assert untied.report.data.reference["cache"] == "miss" and "note" not in untied.report.data.reference
    assert tied.report.data.reference["cache"] == "shared"
