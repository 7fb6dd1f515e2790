"""One row of a build matrix on whichever process runs it (a Ray worker or the driver), Ray-free.

``build_row`` resumes a row whose bundle is already complete (its manifest verifies and names
this model and target), otherwise builds it with the one call into the build application
layer (``_run_one_build``); the build writes the bundle atomically, so a killed row leaves no
half-written bundle and the next run rebuilds just that row.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from vitedge.budget import BudgetSettings
from vitedge.app.build import BuildRequest, run_build
from vitedge.datasources.sources import open_source
from vitedge.datasources.split import resolve_data
from vitedge.app.matrix.config import MatrixRow
from vitedge.core.errors import VitedgeError
from vitedge.files.atomic import sha256_file
from vitedge.bundle.manifest import Manifest, read_manifest, verify_bundle
from vitedge.onnxkit.files import onnx_sha256
from vitedge.targets.profiles import load_profile
from vitedge.validation.data_record import DataRecord
from vitedge.validation.document import ValidationReport
from vitedge.core.ui import StageLog

PASS, FAIL, NOT_VALIDATED, ERROR = "pass", "fail", "not validated", "error"


@dataclass
class RowResult:
    label: str
    model: str
    target: str
    bundle: str
    status: str  # PASS | FAIL | NOT_VALIDATED | ERROR
    resumed: bool = False  # the bundle was complete from an earlier run
    calibration: str = "-"  # "computed" | "cache" | "-"
    detail: str = ""  # the gate's failures or the error
    host: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status in (FAIL, ERROR)


def completed_manifest(row: MatrixRow) -> Manifest | None:
    """The manifest of ``row``'s bundle when it is complete and was built from exactly what the row asks
    (resume_mismatch); None otherwise, and the row is built again."""

    if not (row.bundle / "manifest.json").is_file():
        return None
    try:
        manifest = verify_bundle(row.bundle)
    except VitedgeError:
        return None
    if resume_mismatch(row, manifest) is not None:
        return None
    return manifest


def resume_mismatch(row: MatrixRow, manifest: Manifest) -> str | None:
    """Why ``row`` must not be resumed from the complete bundle ``manifest`` describes, or None.

    A verdict is reused only when it was reached on what the row asks now: the same model bytes
    (its sha256; a model folder records none, so it is always rebuilt), the same target profile
    (backend, batch sizes, backend options, quantization), the same gate (the profile's thresholds
    with the matrix's overrides), the same build settings (calibration subset and seed, latency,
    accuracy budget) and the same data (the content hash of the calibration and validation items
    the build used, computed again here)."""

    if manifest.target.name != row.target_name or manifest.model.source != row.model.name:
        return "another model or target"
    if not row.model.is_file():
        return "the model is a folder, whose content the manifest does not hash"
    digest = (onnx_sha256 if row.model.suffix.lower() == ".onnx" else sha256_file)(row.model)
    if manifest.model.source_sha256 != digest:
        return "the model file changed"
    try:
        profile = load_profile(row.target)
    except VitedgeError as err:
        return f"its profile cannot be read ({err})"
    recorded = dict(manifest.target.profile or {})
    current = profile.to_dict()
    for d in (recorded, current):
        d.pop("source", None)
    if recorded != current:
        return "the target profile changed"
    report = ValidationReport.from_json(manifest.validation) if manifest.validation else None
    s = row.settings
    wanted = s.thresholds.over(profile.thresholds).to_dict()
    if report is not None and report.thresholds.limits != wanted:
        return "other thresholds"
    calibration = (manifest.calibration or {}).get("calibration") or {}
    if calibration.get("subset_size") != s.calib_size or int(calibration.get("seed") or 0) != s.seed:
        return "another calibration subset or seed"
    if report is not None and bool(report.latency.measured) != s.latency:
        return "latency measured differently"
    budget = manifest.quantization.budget or {}
    if (budget.get("status", "off") != "off") != s.fallback:  # "off": the build ran without the budget
        return "another accuracy-budget setting"
    return _data_mismatch(row, manifest, calibration)


def _data_mismatch(row: MatrixRow, manifest: Manifest, calibration: dict[str, Any]) -> str | None:
    """The calibration and validation items of the row hashed again, against what the build recorded."""

    try:
        spec = manifest.spec
        calib_path, val_path, _ = resolve_data(row.calib, row.val, spec.class_names)
        s = row.settings
        calib = open_source(calib_path, spec.preprocess, limit=s.calib_size, seed=s.seed, class_names=spec.class_names,
                            progress=False)
        if calibration.get("data_hash") != calib.summary.data_hash:
            return "other calibration data"
        recorded = DataRecord.from_manifest(manifest)
        val_hash = calib.summary.data_hash if val_path is None else open_source(
            val_path, spec.preprocess, class_names=spec.class_names, progress=False).summary.data_hash
        if recorded is None or recorded.data_hash != val_hash:
            return "other validation data"
    except VitedgeError as err:
        return f"its data cannot be read ({err})"
    return None


def _metrics(validation: dict[str, Any] | None) -> dict[str, Any]:
    """The row's figures from its bundle's validation (the manifest's section, read through the typed document)."""
    if not validation:
        return {}
    report = ValidationReport.from_json(validation)
    acc = report.accuracy
    return {"top1_fp32": acc.fp32_top1, "top1_int8": acc.int8_top1, "agreement": acc.top1_agreement,
            "speedup": report.speedup, "int8_ms": report.latency.p50_ms("int8"), "failures": list(report.failures or [])}


def result_from_manifest(row: MatrixRow, manifest: Manifest, resumed: bool) -> RowResult:
    validation = manifest.validation
    metrics = _metrics(validation)
    if validation is None:
        status, detail = NOT_VALIDATED, "not validated here (artifact finished on the device, or its runtime is missing)"
    else:
        status = PASS if ValidationReport.from_json(validation).passed else FAIL
        detail = "; ".join(metrics["failures"])
    reused = (manifest.calibration or {}).get("reused")
    return RowResult(row.label, row.model_name, row.target_name, str(row.bundle), status, resumed,
                     "cache" if reused else "computed", detail, socket.gethostname(), metrics)


def _run_one_build(row: MatrixRow) -> None:
    """The single call into the build application layer (vitedge.app.build), as `vitedge build` makes it."""

    s = row.settings
    req = BuildRequest(model=row.model, targets=(row.target,), calib=row.calib, val=row.val, out=row.bundle,
                       force=row.bundle.exists(), calib_size=s.calib_size, seed=s.seed, threshold_overrides=s.thresholds,
                       cache=s.cache, measure_speed=s.latency,
                       budget=BudgetSettings(enabled=s.fallback, measure_cost=s.latency))
    run_build(req, StageLog(quiet=True))


def build_row(row: MatrixRow) -> RowResult:
    """Resume ``row`` from its complete bundle, or build it; a gate failure is a FAIL row, not an exception."""

    done = completed_manifest(row)
    if done is not None:
        return result_from_manifest(row, done, resumed=True)
    try:
        _run_one_build(row)
    except VitedgeError as err:  # this row's failure (bad data, budget not met, ...); the other rows go on
        status = FAIL if err.exit_code == 1 else ERROR
        return RowResult(row.label, row.model_name, row.target_name, str(row.bundle), status, detail=str(err),
                         host=socket.gethostname())
    return result_from_manifest(row, read_manifest(row.bundle), resumed=False)
