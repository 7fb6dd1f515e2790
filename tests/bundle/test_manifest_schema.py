"""The manifest's versioned schema: a bundle written before the typed manifest sections
(tests/fixtures/bundle_v1, an intel-cpu build of the bundled digits example, its model files
left out) still loads, validates and round-trips key for key; an onnx bundle of the layouts before it held one FP32
graph still validates and analyses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import VAL_DIR

from vitedge.core.errors import BundleError
from vitedge.core.json_sections import ABSENT
from vitedge.bundle.manifest import SCHEMA, Manifest, read_manifest

FIXTURE = Path(__file__).parents[1] / "fixtures" / "bundle_v1" / "intel-cpu"


def _recorded() -> dict:
    return json.loads((FIXTURE / "manifest.json").read_text())


def test_the_v1_bundle_manifest_loads_and_validates():
    manifest = read_manifest(FIXTURE)  # schema prefix, required sections, field types, contained paths
    assert manifest.schema == SCHEMA == "vitedge.manifest/1"
    assert manifest.target.name == "intel-cpu" and manifest.target.backend == "openvino"
    assert manifest.spec.image_size == tuple(_recorded()["model"]["spec"]["image_size"])
    assert manifest.artifacts.model == "model.xml" and manifest.artifacts.built is True
    assert manifest.validation["schema"] == "vitedge.validation/1" and manifest.validation["passed"] is True
    assert manifest.quantization.budget["status"] in ("int8", "fallback", "off")
    assert set(manifest.files) >= {"model.xml", "model.bin", "model.int8.onnx", "reference.fp32.onnx"}


def test_a_section_still_reads_as_the_json_it_was_for_code_written_against_dicts():
    manifest = read_manifest(FIXTURE)  # vitedge.runtime.load(...).manifest is this object
    assert manifest.target["name"] == manifest.target.name == "intel-cpu"
    assert manifest.artifacts.get("built") is True and manifest.quantization.get("no such key", 7) == 7
    with pytest.raises(KeyError):
        manifest.model["no such key"]


def test_the_v1_manifest_round_trips_key_for_key():
    recorded = _recorded()
    assert Manifest.from_dict(recorded).to_dict() == recorded
    assert list(Manifest.from_dict(recorded).to_dict()) == list(recorded)  # the same key order on disk


def test_a_damaged_v1_manifest_is_a_one_line_bundle_error():
    broken = _recorded()
    broken["artifacts"]["model"] = 3
    with pytest.raises(BundleError, match="'artifacts.model' is int"):
        Manifest.from_dict(broken)
    del broken["quantization"]
    with pytest.raises(BundleError, match="lacks 'quantization'"):
        Manifest.from_dict(broken)


def test_the_v1_report_files_are_the_build_reports():
    headings = [line for line in (FIXTURE / "report.md").read_text().splitlines() if line.startswith("#")]
    assert headings[0] == "# vitedge bundle: intel-cpu (openvino, int8)" and "## Accuracy budget" in headings
    assert sorted(p.name for p in (FIXTURE / "report").iterdir()) == ["junit.xml", "summary.md", "validation.json"]
    document = json.loads((FIXTURE / "report" / "validation.json").read_text())
    assert document["schema"] == "vitedge.validation/1" and document["passed"] is True


def test_vitedge_reads_manifest_sections_by_attribute():
    """The JSON view above is for code outside vitedge; vitedge reads each section's typed attributes."""
    import re

    package = Path(__file__).resolve().parents[1] / "vitedge"
    by_key = re.compile(r"\b(manifest|m)\.(target|model|input|output|quantization|artifacts)(\[|\.get\()")
    found = [f"{p.relative_to(package.parent)}:{i}" for p in sorted(package.rglob("*.py"))
             if p.name != "manifest_sections.py"  # its own module
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if by_key.search(line)]
    assert not found, "manifest sections read by string key:\n" + "\n".join(found)


def test_the_small_gemms_record_is_a_typed_quantization_field_and_older_manifests_have_none():
    """The NVIDIA bundles say which layers stayed float by NVIDIA ModelOpt's small-GEMM rule, and why
    (quantization.small_gemms); a manifest written before it reads without one and round-trips unchanged."""
    recorded = _recorded()
    assert "small_gemms" not in recorded["quantization"]
    assert "small_gemms" not in Manifest.from_dict(recorded).to_dict()["quantization"]
    record = {"rule": "NVIDIA ModelOpt, modelopt/onnx/quantization/graph_utils.py", "float": {"/head/Gemm": "GEMV"}}
    recorded["quantization"]["small_gemms"] = record
    manifest = Manifest.from_dict(recorded)
    assert manifest.quantization.small_gemms == record
    assert "small_gemms" not in (manifest.quantization.more or {})
    assert manifest.to_dict()["quantization"]["small_gemms"] == record


def _earlier_onnx_bundle(bundle: Path, exported: Path, dst: Path, *, two_graphs: bool) -> Path:
    """``bundle`` (an onnx bundle of this version: one FP32 graph, the exported one with attention fused) as an earlier
    vitedge wrote it: the fused graph as reference.fp32.fused.onnx beside the exported reference.fp32.onnx
    (``two_graphs``), or the exported graph alone as the reference; no ``artifacts.fp32_graph``."""
    import shutil

    shutil.copytree(bundle, dst)
    shutil.rmtree(dst / "report")
    d = json.loads((dst / "manifest.json").read_text())
    if two_graphs:
        (dst / "reference.fp32.onnx").rename(dst / "reference.fp32.fused.onnx")
        d["artifacts"]["reference"] = "reference.fp32.fused.onnx"
    shutil.copyfile(exported, dst / "reference.fp32.onnx")
    d["artifacts"].pop("fp32_graph")
    manifest = Manifest.from_dict(d)
    manifest.hash_files(dst)
    manifest.write(dst)
    return dst


@pytest.mark.parametrize("two_graphs", [True, False], ids=["fused-beside-exported", "exported-only"])
def test_an_earlier_onnx_bundle_still_loads_and_validates_and_analyses_as_one_with_one_fp32_graph(runtime_bundles, tmp_path, two_graphs):
    """Bundles written before the onnx bundle held one FP32 graph (two: the exported graph and its fused rewrite; or
    the exported graph alone) load, validate, and give the per-layer analysis this version's bundle gives from its one
    (fused) graph: the same layers, the same figures within float noise."""
    from vitedge.app.validate import ValidateRequest, run_validate
    from vitedge.bundle.manifest import verify_bundle
    from vitedge.core.ui import StageLog
    from vitedge.targets.profiles import ThresholdOverrides
    from vitedge.validation.reference_cache import ReferenceCacheSettings

    now = runtime_bundles["plain"]["onnx"]
    old = _earlier_onnx_bundle(now, runtime_bundles["plain"]["intel-cpu"] / "reference.fp32.onnx", tmp_path / "old", two_graphs=two_graphs)
    m = verify_bundle(old)
    assert m.artifacts.fp32_graph is ABSENT and m.artifacts.fp32_onnx == "reference.fp32.onnx"
    assert m.artifacts.reference == ("reference.fp32.fused.onnx" if two_graphs else "reference.fp32.onnx")
    cache = ReferenceCacheSettings(root=tmp_path / "cache")
    runs = {}
    for name, bundle in (("now", now), ("old", old)):
        request = ValidateRequest(bundle, tmp_path / f"report-{name}", data=VAL_DIR, data_size=48, seed=1, measure_speed=False,
                                  sensitivity_samples=16, progress=False, reference_cache=cache,
                                  threshold_overrides=ThresholdOverrides(min_decisive_agreement=0.0))  # 48 items: too few to tell
        runs[name] = run_validate(request, StageLog(quiet=True)).validation
    assert runs["old"].passed and runs["now"].passed
    if two_graphs:  # the earlier bundle's reference is this version's one FP32 graph, byte for byte: its outputs are read
        assert runs["old"].report.data.reference["cache"] == "hit"
    now_layers, old_layers = (run.sensitivity.layers for run in (runs["now"], runs["old"]))
    assert len(now_layers) == len(old_layers) > 20
    by_name = {layer.name: layer for layer in old_layers}
    for layer in now_layers:
        assert by_name[layer.name].kind == layer.kind
        assert by_name[layer.name].metrics["kl"] == pytest.approx(layer.metrics["kl"], rel=1e-2, abs=1e-9)
