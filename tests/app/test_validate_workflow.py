"""The validate workflow of the app layer (vitedge.app.validate): a typed request in, the bundle's
reports out, the same files `vitedge validate` writes; the command only parses and prints."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import VAL_DIR

from vitedge.app.validate import ValidateRequest, run_validate, run_validations
from vitedge.core.errors import UsageError
from vitedge.core.ui import StageLog
from vitedge.validation.document import ValidationReport


def _request(bundle, **kw) -> ValidateRequest:
    return ValidateRequest(bundle, bundle / "report", measure_speed=False, sensitivity=False, progress=False, **kw)


def test_a_request_validates_a_bundle_and_writes_its_reports(bundle):
    request = _request(bundle, data=VAL_DIR, data_size=40, seed=3)
    outcome = run_validate(request, StageLog(quiet=True))
    assert {p.name for p in outcome.written} >= {"validation.json", "summary.md", "junit.xml"}
    assert outcome.data_role == "validation" and outcome.validation.passed
    text = (bundle / "report" / "validation.json").read_text()
    doc = json.loads(text)
    # the written file is the typed report's one serializer, and reads back to the same bytes
    assert json.dumps(ValidationReport.from_json(doc).to_json(), indent=2) + "\n" == text
    report = outcome.validation.report
    assert doc["producer"] == report.producer == "vitedge validate"
    assert doc["data"]["items"] == report.data.items == 40
    assert doc["accuracy"]["int8_top1"] == report.accuracy.int8_top1 is not None
    assert (bundle / "report" / "summary.md").read_text().startswith("## ")


def test_without_data_it_revalidates_on_the_recorded_set_and_refuses_a_subset(bundle):
    with pytest.raises(UsageError, match="--data-size takes a subset of --data"):
        run_validate(_request(bundle, data_size=10), StageLog(quiet=True))
    assert not (bundle / "report").exists()  # refused before anything was written


def test_run_validations_yields_each_bundle_in_turn(bundle, tmp_path):
    import shutil

    second = tmp_path / "second"
    shutil.copytree(bundle, second)
    requests = [_request(b, data=VAL_DIR, data_size=16) for b in (bundle, second)]
    seen = [o.validation.report.bundle.path for o in run_validations(requests, lambda _r: StageLog(quiet=True))]
    assert seen == [str(bundle), str(second)]


def test_the_request_is_frozen(bundle):
    with pytest.raises(dataclasses.FrozenInstanceError):
        _request(bundle).threads = 2  # type: ignore[misc]
    assert _request(bundle).scale is None and _request(bundle, workers=2).scale.workers == 2
