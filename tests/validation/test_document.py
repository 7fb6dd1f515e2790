"""The typed validation document (vitedge.validation.document): one serializer, and the JSON it
writes is the JSON it reads, key for key and byte for byte."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from vitedge.validation.document import LatencySection, ValidationReport
from vitedge.validation.gate import GateRow
from vitedge.validation.latency import LatencyStats

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bundle_v1" / "intel-cpu" / "manifest.json"


def _bytes(doc) -> str:
    return json.dumps(doc, indent=2, allow_nan=False)


def _recorded() -> dict:
    return json.loads(FIXTURE.read_text())["validation"]


def _measured(doc: dict) -> dict:
    """``doc`` as a run that measured latency, ran sensitivity, read a project config and sharded on Ray would write it."""
    doc = copy.deepcopy(doc)
    row = {"batch": 1, "iterations": 90, "p50_ms": 1.5, "p90_ms": 1.7, "p99_ms": 2.0, "mean_ms": 1.55, "throughput": 666.7,
           "stable": True}
    doc["latency"] = {"measured": True, "method": "interleaved", "settings": {"min_seconds": 2.0},
                      "fp32": {"1": dict(row, p50_ms=3.0)}, "int8": {"1": row}, "speedup": {"1": 2.0},
                      "measured_on": "node-a (Ray node 0123456789ab)"}
    doc["sensitivity"] = {"runtime": "onnxruntime", "method": "m", "samples": 8, "output_kind": "logits", "metric": "kl",
                          "baseline": {"kl": 0.0}, "full": {"kl": 1e-4}, "kept_float": [], "seconds": 1.0, "notes": [],
                          "layers": [{"rank": 1, "name": "/head/Gemm", "kind": "head", "op_type": "Gemm", "kl": 1e-5}]}
    doc["data"].pop("role", None)  # as the validation writes it: the output caches' lookups, then the role
    doc["data"]["reference"] = {"cache": "hit", "batch": 8}
    doc["data"]["int8_outputs"] = {"cache": "miss", "batch": 8}
    doc["data"]["role"] = "calibration"
    doc["config"] = {"path": "vitedge.toml", "set": ["targets"]}
    doc["distributed"] = {"engine": "ray", "shards": 2, "nodes": ["node-a"]}
    return doc


def test_a_recorded_document_reads_back_to_the_same_bytes():
    doc = _recorded()
    report = ValidationReport.from_json(doc)
    assert _bytes(report.to_json()) == _bytes(doc)
    assert report.target.name == doc["target"]["name"] and report.accuracy.top1_agreement == doc["accuracy"]["top1_agreement"]
    assert [r.name for r in report.gate] == [r["name"] for r in doc["gate"]] and all(isinstance(r, GateRow) for r in report.gate)
    assert report.latency.measured is False and report.sensitivity is None


def test_every_optional_section_keeps_its_place_and_values():
    doc = _measured(_recorded())
    report = ValidationReport.from_json(doc)
    assert _bytes(report.to_json()) == _bytes(doc)
    assert list(report.to_json())[-2:] == ["config", "distributed"]
    assert report.latency.int8["1"] == LatencyStats(1, 90, 1.5, 1.7, 2.0, 1.55, 666.7, True)
    assert report.latency.p50_ms("fp32") == 3.0 and report.latency.measured_on.startswith("node-a")
    assert report.sensitivity.layers[0]["name"] == "/head/Gemm" and report.sensitivity.metric == "kl"
    assert report.data.role == "calibration" and report.data.cache_hit("reference") and not report.data.cache_hit("int8_outputs")


def test_keys_a_newer_vitedge_adds_are_kept():
    doc = _recorded()
    doc["accuracy"]["new_metric"] = 0.5
    doc["data"]["new_field"] = "x"
    doc["new_section"] = {"a": 1}
    assert _bytes(ValidationReport.from_json(doc).to_json()) == _bytes(doc)


def test_absent_optional_keys_stay_absent():
    doc = _recorded()
    del doc["data"]["role"]  # a run that does not know its data's role
    out = ValidationReport.from_json(doc).to_json()
    assert "config" not in out and "distributed" not in out
    assert "role" not in out["data"] and "measured_on" not in out["latency"] and "method" not in out["latency"]


@pytest.mark.parametrize("missing", ["p90_ms", "stable"])
def test_an_unmeasured_latency_row_with_missing_keys_still_reads(missing):
    row = {"batch": 1, "iterations": 0, "p50_ms": 0.0, "p90_ms": 0.0, "p99_ms": 0.0, "mean_ms": 0.0, "throughput": 0.0, "stable": False}
    del row[missing]
    section = LatencySection.from_json({"measured": False, "fp32": {"1": row}, "int8": {}, "speedup": {}})
    assert section.fp32["1"].p50_ms == 0.0
