"""`vitedge validate`: the workflow that re-checks a finished bundle, beside `app/build`.

    ValidateRequest -> verify the bundle's hashes -> the data (given, or the one the build recorded)
                    -> validation.bundle.validate_bundle (sharded over Ray with --workers/--ray-address)
                    -> report/ (validation.json, summary.md, junit.xml, plots) and the CI job summary

``commands/validate_cmd`` parses the flags into one ``ValidateRequest`` per bundle, calls
``run_validations`` and prints each ``ValidateOutcome``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitedge.datasources.base import CalibrationSource
from vitedge.datasources.sources import open_source
from vitedge.datasources.split import validation_part
from vitedge.distributed.cluster import ClusterSettings
from vitedge.distributed.ray_validate import ray_session, scale_from_flags, sharded_validator
from vitedge.core.errors import CalibrationError, DataError, UsageError
from vitedge.bundle.manifest import Manifest, verify_bundle
from vitedge.targets.profiles import ThresholdOverrides
from vitedge.core.ui import StageLog
from vitedge.validation.bundle import BundleValidation, ValidateOptions, validate_bundle
from vitedge.validation.data_record import DataRecord, open_recorded
from vitedge.validation.defaults import DEFAULT_LATENCY_SECONDS, DEFAULT_SENSITIVITY_SAMPLES
from vitedge.validation.latency import LatencySettings
from vitedge.validation.reference_cache import ReferenceCacheSettings
from vitedge.validation.report import append_step_summary

PRODUCER = "vitedge validate"


@dataclass(frozen=True)
class ValidateRequest:
    """One bundle to validate and how (the flags of `vitedge validate`)."""

    bundle: Path
    report_dir: Path
    data: Path | None = None  # labelled data; None: what the build validated on (manifest.json)
    data_size: int | None = None  # a seeded subset of ``data``
    seed: int = 0
    threshold_overrides: ThresholdOverrides = field(default_factory=ThresholdOverrides)  # flags over the profile's thresholds
    measure_speed: bool = True
    latency_seconds: float = DEFAULT_LATENCY_SECONDS
    sensitivity: bool = True
    sensitivity_samples: int = DEFAULT_SENSITIVITY_SAMPLES
    threads: int | None = None
    workers: int | None = None  # shard over N local Ray workers
    ray_address: str | None = None  # shard over an existing Ray cluster
    reference_cache: ReferenceCacheSettings = field(default_factory=ReferenceCacheSettings)
    config: dict[str, Any] | None = None  # the project config read and what it set (project_config.config_record)
    progress: bool = True  # progress bars while the data is read

    @property
    def scale(self) -> ClusterSettings | None:
        """The Ray cluster to shard over; None for the single-process run."""
        return scale_from_flags(self.workers, self.ray_address)


@dataclass
class ValidateOutcome:
    """One bundle's validation, the report files written and notes for the log."""

    validation: BundleValidation
    written: list[Path]
    notes: list[str]
    data_role: str  # "validation", or "calibration" when the build validated on its calibration images


@dataclass
class _Data:
    source: CalibrationSource  # model-ready batches, re-iterable
    role: str
    subset: tuple[int | None, int]  # (size, seed) the items were picked with: Ray workers re-open exactly these


def run_validations(requests: Sequence[ValidateRequest], log_for: Callable[[ValidateRequest], StageLog]) -> Iterator[ValidateOutcome]:
    """Validate each bundle in turn, yielding each outcome as it is known (to print it before the next bundle);
    with ``workers``/``ray_address``, on one Ray session for all of them."""
    if not requests:
        return
    with ray_session(requests[0].scale):
        for request in requests:
            yield run_validate(request, log_for(request))


def run_validate(request: ValidateRequest, log: StageLog) -> ValidateOutcome:
    """Verify, validate and write the reports of one bundle (Ray, when sharded, already connected)."""
    manifest = _verify(request.bundle, log)
    data = _open_data(request, manifest, log)
    validation = _validate(request, manifest, data, log)
    written, notes = validation.write(request.report_dir)
    warning = append_step_summary(validation.markdown([p.name for p in written if p.suffix == ".png"]))
    return ValidateOutcome(validation, written, notes + ([warning] if warning else []), data.role)


def _verify(bundle: Path, log: StageLog) -> Manifest:
    with log.stage("verify", str(bundle)):
        manifest = verify_bundle(bundle)
        log.info(f"{len(manifest.files)} files match manifest.json; target {manifest.target.name} "
                 f"({manifest.target.backend}), model {manifest.model.source}")
    return manifest


def _open_data(request: ValidateRequest, manifest: Manifest, log: StageLog) -> _Data:
    """The validation data: --data (its val/ part, a subset), or exactly the set the build recorded."""
    spec = manifest.spec
    if request.data is None:
        return _recorded_data(request, manifest, log)
    with log.stage("data", str(request.data)):
        data, split = validation_part(request.data, spec.class_names)
        if split:
            log.info(split.one_line())
        try:
            source = open_source(data, spec.preprocess, limit=request.data_size, seed=request.seed,
                                 class_names=spec.class_names, progress=request.progress)
        except CalibrationError as err:
            raise DataError(f"--data: {err}") from None
        log.info(source.summary.one_line())
    return _Data(source, "validation", (request.data_size, request.seed))


def _recorded_data(request: ValidateRequest, manifest: Manifest, log: StageLog) -> _Data:
    record = DataRecord.from_manifest(manifest)
    if record is None:
        raise UsageError("pass --data LABELLED_SET (an image folder with one subfolder per class, or a .npz with images "
                         "and labels); the bundle records no validation set")
    if request.data_size is not None:
        raise UsageError("--data-size takes a subset of --data; without --data the build's own set is used as it was")
    log.info(f"no --data given: re-validating on {record.describe()}")
    with log.stage("data", record.path):
        source = open_recorded(record, manifest.spec, progress=request.progress)
        log.info(source.summary.one_line())
    return _Data(source, record.role, (record.subset_size, record.seed))


def _validate(request: ValidateRequest, manifest: Manifest, data: _Data, log: StageLog) -> BundleValidation:
    options = ValidateOptions(
        data_role=data.role, threshold_overrides=request.threshold_overrides, measure_speed=request.measure_speed,
        latency=LatencySettings.for_budget(request.latency_seconds), sensitivity=request.sensitivity,
        sensitivity_samples=request.sensitivity_samples, threads=request.threads, producer=PRODUCER,
        reference_cache=request.reference_cache, config=request.config,
    )
    what = f"{manifest.target.name}: INT8 vs FP32 on {len(data.source)} inputs, same runtime"
    with log.stage("validate", what):
        scale = request.scale
        if scale is None:
            return validate_bundle(request.bundle, manifest, data.source, options, log=log, bundle_label=str(request.bundle))
        validator = sharded_validator(scale, request.bundle, data.source, *data.subset)
        validation = validate_bundle(request.bundle, manifest, data.source, options, log=log, bundle_label=str(request.bundle),
                                     artifact_validator=validator)
        validator.annotate(validation.report)
        return validation
