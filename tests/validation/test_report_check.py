"""check_validation_document: a malformed validation.json is a list of problems (exit 2 in
`vitedge compare`), never an exception."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from vitedge.validation.document import ValidationReport
from vitedge.validation.report import check_validation_document

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bundle_v1" / "intel-cpu" / "manifest.json"


def _doc() -> dict:
    doc = json.loads(FIXTURE.read_text())["validation"]
    doc["latency"] = dict(doc["latency"], measured=True)  # a measured run: every latency row must be complete
    return doc


def test_the_recorded_document_conforms():
    assert check_validation_document(json.loads(FIXTURE.read_text())["validation"]) == []


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d.__setitem__("accuracy", 2), "accuracy is not an object"),
    (lambda d: d["latency"].__setitem__("fp32", 3), "latency.fp32 is not an object"),
    (lambda d: d["latency"].__setitem__("int8", [1]), "latency.int8 is not an object"),
    (lambda d: d["latency"].__setitem__("int8", {}), "latency.int8 has no batch 1"),
    (lambda d: d["gate"][0].__setitem__("status", "maybe"), "gate[0].status is 'maybe'"),
])
def test_a_malformed_document_is_a_problem_not_a_crash(edit, expected):
    doc = _doc()
    edit(doc)
    assert expected in check_validation_document(doc)


def test_a_malformed_section_reads_back_without_a_crash():
    doc = copy.deepcopy(json.loads(FIXTURE.read_text())["validation"])
    doc["sensitivity"], doc["latency"]["fp32"] = "garbage", {"1": 5}
    report = ValidationReport.from_json(doc)
    assert report.sensitivity is not None and report.sensitivity.layers == [] and report.latency.fp32 == {}
