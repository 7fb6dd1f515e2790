"""`vitedge build` and `vitedge engine` write one bundle schema: a jetson-orin bundle completed on a
"device" (the recording TensorRT stand-in) carries the manifest sections, the report/ folder and
the report.md sections of an intel-cpu bundle built beside it from the same Q/DQ graph."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import CALIB_DIR, EXAMPLES, VAL_DIR
from helpers.cli import run_vitedge
from helpers.jetson_devices import STANDIN_GPU
from helpers.tensorrt_standin import (
    make_fake_cudart,
    make_fake_trt,
    skip_if_real_tensorrt,
)

from vitedge.bundle.manifest import read_manifest, verify_bundle
from vitedge.validation.reference_cache import HIT, MISS, OFF, SHARED

# Free-form maps whose keys name things of the backend or the machine, not schema fields.
# A profile's [quantization] overrides are its own too (the NVIDIA profiles set quantize_attention).
BACKEND_OWN = ("backend_info", "toolchain", "files", "target.profile.backend_options", "target.profile.quantization",
               "validation.runtime.versions", "validation.memory")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One GPU-less build of the bundled example for intel-cpu and jetson-orin (one Q/DQ graph: the flags
    override jetson-orin's quantize_attention and float_small_gemms, which would otherwise give it a graph and a budget of its own)."""
    example = EXAMPLES / "digits_vit.pt"
    if not (example.is_file() and CALIB_DIR.is_dir() and VAL_DIR.is_dir()):
        pytest.skip("the bundled example is not in this checkout")
    skip_if_real_tensorrt("this test completes the GPU-less bundle with the stand-in")
    work = tmp_path_factory.mktemp("schema")
    out = work / "digits"
    # a cache of its own: with the suite's shared one, whether intel-cpu's FP32 reference was read back or shared
    # from ONNX Runtime's outputs (another test's) depended on which tests had run before, on either worker
    code, text = run_vitedge(["build", str(example), "--target", "intel-cpu", "--target", "jetson-orin", "--calib", str(CALIB_DIR),
                       "--val", str(VAL_DIR), "-o", str(out), "--no-latency", "--no-quantize-attention", "--quantize-small-gemms",
                       "--cache-dir", str(work / "cache")])
    assert code == 0, text
    return out


@pytest.fixture(scope="module")
def completed(built, tmp_path_factory):
    from vitedge.app.engine_completion import complete_bundle

    bundle = tmp_path_factory.mktemp("device") / "jetson-orin"
    shutil.copytree(built / "jetson-orin", bundle)
    cudart = make_fake_cudart()
    result = complete_bundle(bundle, val=VAL_DIR, trt=make_fake_trt("10.3.0", cudart=cudart), cudart=cudart,
                             facts=STANDIN_GPU, measure_speed=False)
    assert result.passed is True
    return bundle


def _key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path of a JSON value (list items merged), except inside the backend's own maps."""
    if prefix.rstrip(".") in BACKEND_OWN:
        return set()
    paths: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            paths.add(prefix + k)
            paths |= _key_paths(v, f"{prefix}{k}.")
    elif isinstance(value, list):
        for item in value:
            paths |= _key_paths(item, prefix)
    return paths


REFERENCE = "validation.data.reference."
# validation.data.reference takes one of its forms (docs/reports.md): outputs read back or computed here (cache hit /
# miss, with key and path), or shared from another runtime's FP32 pass after a spot check (cache shared, with shared)
REFERENCE_FORMS = {HIT: {"key", "path"}, MISS: {"key", "path"}, SHARED: {"shared"}, OFF: set()}


def _reference_form(reference: dict[str, Any]) -> str:
    """The reference's form, after checking it carries that form's fields."""
    form = reference["cache"]
    assert REFERENCE_FORMS[form] <= set(reference), reference
    assert isinstance(reference["batch"], int), reference
    return form


def _schema_paths(bundle_dict: dict[str, Any]) -> set[str]:
    """The key paths of a manifest, the reference's form-specific fields left to ``_reference_form``."""
    return {p for p in _key_paths(bundle_dict) if not p.startswith(REFERENCE) or p[len(REFERENCE):] in ("cache", "batch")}


PAYOFF = "quantization.int8_payoff"


def _without_speed_verdict(quantization: dict[str, Any]) -> dict[str, Any]:
    """The quantization section without what each target decides for itself: the speed verdict, the INT8 timing."""
    kept = {k: v for k, v in quantization.items() if k != "int8_payoff"}
    return dict(kept, budget={k: v for k, v in quantization["budget"].items() if k != "speed_verdict"})


def _sections(report: Path) -> list[str]:
    """report.md's section headings, without the target's name, backend and producer."""
    out = []
    for line in report.read_text().splitlines():
        if line.startswith("#"):
            level, title = line.split(" ", 1)
            out.append(f"{level} {re.split(r'[:(`]', title)[0].strip()}")
    return out


def test_engine_completion_writes_the_schema_vitedge_build_writes(built, completed):
    cpu = verify_bundle(built / "intel-cpu")
    device = verify_bundle(completed)
    assert device.schema == cpu.schema == "vitedge.manifest/1"
    # the INT8-vs-FP32 timing is a CPU target's own decision (quantization.int8_payoff): a TensorRT bundle has none
    assert _schema_paths(device.to_dict()) == {p for p in _schema_paths(cpu.to_dict()) if not p.startswith(PAYOFF)}
    # in its own cache the intel-cpu validation reads back the FP32 outputs its budget pass (OpenVINO) computed; with
    # the suite's shared cache it was "shared" (ONNX Runtime's, from another test) or "hit", by test order
    assert _reference_form(cpu.validation["data"]["reference"]) == HIT
    assert _reference_form(device.validation["data"]["reference"]) in (HIT, MISS)
    assert device.validation["schema"] == cpu.validation["schema"] == "vitedge.validation/1"
    assert device.validation["producer"] == "vitedge engine" and cpu.validation["producer"] == "vitedge build"
    # one Q/DQ graph and one accuracy budget; only the speed verdict is each target's own
    assert _without_speed_verdict(device.quantization.to_json()) == _without_speed_verdict(cpu.quantization.to_json())

    assert sorted(p.name for p in (completed / "report").iterdir()) == sorted(p.name for p in (built / "intel-cpu" / "report").iterdir())
    assert {"validation.json", "summary.md", "junit.xml"} <= {p.name for p in (completed / "report").iterdir()}

    cpu_sections, device_sections = _sections(built / "intel-cpu" / "report.md"), _sections(completed / "report.md")
    assert [s for s in device_sections if s != "## TensorRT"] == cpu_sections  # plus the backend's own section
    assert "## Accuracy budget" in cpu_sections and "## ✅ PASS" in cpu_sections


def test_engine_completion_says_where_the_accuracy_budget_ran(built, completed):
    text = (completed / "report.md").read_text()
    budget = text[text.index("## Accuracy budget"):]
    assert "it ran at build time" in budget
    assert "ran at build time" not in (built / "intel-cpu" / "report.md").read_text()


def test_the_planned_bundle_has_the_build_reports_too(built):
    planned = read_manifest(built / "jetson-orin")
    assert planned.artifacts.built is False and planned.validation is None
    sections = _sections(built / "jetson-orin" / "report.md")
    assert sections[0] == "# vitedge bundle" and "## Accuracy budget" in sections


ADDED_SINCE_V1 = ("quantization.config.", "calibration.config.", "validation.quantization.config.", "validation.data.reference",
                  "validation.data.int8_outputs",
                  # issue 47: the build's INT8-vs-FP32 timing on this CPU kind and what it kept float
                  "quantization.int8_payoff",
                  # issue 30: method select's choice and evidence, the budget's calibration candidates, the near-tie gate
                  "calibration.selection", "quantization.budget.calibration", "quantization.budget.evaluations.calibration",
                  "quantization.budget.verdict", "quantization.budget.thresholds.near_tie_margin",
                  "quantization.budget.thresholds.drop_confidence", "target.profile.thresholds.near_tie_margin",
                  "target.profile.thresholds.drop_confidence", "validation.thresholds.near_tie_margin",
                  "validation.thresholds.drop_confidence", "validation.accuracy.decisive_", "validation.accuracy.near_tie_",
                  "validation.accuracy.expected_drop_points", "validation.accuracy.fp32_margin_median",
                  "validation.accuracy.top1_discordant", "validation.accuracy.top1_drop_ci_points",
                  "validation.accuracy.top1_drop_confidence", "validation.accuracy.top1_loss_p_value",
                  "validation.accuracy.fp32_preprocessing_probe", "validation.accuracy.fp32_at_chance",
                  # what vitedge compare reads: per-image bits (its paired test) and where latency was timed
                  "validation.accuracy.per_sample", "validation.latency.device",
                  # issue 43: the decisive-agreement row's limit
                  "quantization.budget.thresholds.min_decisive_agreement", "target.profile.thresholds.min_decisive_agreement",
                  "validation.thresholds.min_decisive_agreement",
                  # issue 47: the floor the budget's speed verdict held its graph to, and the CPU kind's allowance
                  "quantization.budget.speed_verdict.floor", "quantization.budget.speed_verdict.allowance",
                  # which FP32 graph fp32_onnx is (the onnx bundle ships one: fused or exported) and the exported graph's sha256
                  "artifacts.fp32_graph",
                  # issue 47: an onnx bundle that ships its FP32 graph as is holds it once (model = reference = qdq)
                  "artifacts.single_graph",
                  # issue 43: the normalisation probe's shifted FP32 passes (cache records), now run on every labelled build
                  "validation.data.probe_outputs",
                  # issue 43: how likely INT8's flips are to lean between classes as much as they do by chance
                  "validation.accuracy.flip_symmetry_p")


def test_the_typed_manifest_writes_the_v1_schema_of_the_committed_bundle(built):
    """tests/fixtures/bundle_v1 was written before the manifest sections were typed: the same
    build now writes the same key paths, report/ files and report.md sections."""
    import json

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "bundle_v1" / "intel-cpu"
    now = read_manifest(built / "intel-cpu")
    recorded = json.loads((fixture / "manifest.json").read_text())
    paths, before = _key_paths(now.to_dict()), _key_paths(recorded)
    assert before - paths == set(), "v1 keys no longer written"
    # Additions a v1 reader ignores: settings that grew with new quantizer options, and the
    # FP32 reference cache's record (both documented in docs/reports.md).
    added = {p for p in paths - before if not p.startswith(ADDED_SINCE_V1)}
    assert added == set(), f"new manifest keys: list them in ADDED_SINCE_V1 (and docs/reports.md) or bump the schema: {sorted(added)}"
    assert list(now.to_dict()) == list(recorded)
    for section in ("target", "model", "input", "output", "quantization", "artifacts"):
        written = [k for k in getattr(now, section).to_json() if not f"{section}.{k}".startswith(ADDED_SINCE_V1)]
        assert written == list(recorded[section]), section
    assert sorted(p.name for p in (built / "intel-cpu" / "report").iterdir()) == sorted(p.name for p in (fixture / "report").iterdir())
    assert _sections(built / "intel-cpu" / "report.md") == _sections(fixture / "report.md")
