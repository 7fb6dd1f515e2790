"""Validate a bundle folder: the one code path `vitedge build` (at its end) and
`vitedge validate` (on a finished bundle) share.

    manifest -> profile (re-parsed) -> backend + options -> thresholds (+ overrides)
             -> validate_artifact (accuracy, latency, memory) -> gate
             -> optional per-layer sensitivity (ONNX Runtime) -> report document

``BundleValidation.files()`` renders the reports (JSON, Markdown, JUnit, PNG) in memory;
``write(report_dir)`` writes them. Verifying the bundle's hashes is the caller's job
(`validate` does it first; `build` is writing the bundle).
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from vitedge import __version__
from vitedge.backends import get_backend
from vitedge.backends.base import Backend
from vitedge.bundle.trust import locked_thresholds
from vitedge.datasources.base import CalibrationSource
from vitedge.core.errors import BundleError, VitedgeError
from vitedge.core.json_sections import ABSENT
from vitedge.bundle.manifest import Manifest
from vitedge.bundle.sections import ArtifactsSection, QuantizationSection as ManifestQuantization
from vitedge.targets.profiles import TargetProfile, ThresholdOverrides, Thresholds, parse_profile
from vitedge.validation import report as rpt
from vitedge.validation.defaults import DEFAULT_SENSITIVITY_SAMPLES
from vitedge.validation.document import (
    AccuracySection,
    ArtifactSection,
    BundleSection,
    DataSection,
    LatencySection,
    MemorySection,
    ModelSection,
    QuantizationSection,
    RuntimeSection,
    SensitivitySection,
    TargetSection,
    ThresholdsSection,
    ValidationReport,
)
from vitedge.validation.latency import MEMORY_METHOD, LatencySettings, LatencyStats
from vitedge.validation.reference_cache import ReferenceCacheSettings
from vitedge.validation.run import ValidationResult, validate_artifact
from vitedge.validation.sensitivity import SensitivityResult, first_inputs, layer_sensitivity


class InfoLog(Protocol):
    """Where progress lines go: a ``vitedge.core.ui.StageLog``, or anything with ``info``."""

    def info(self, message: str) -> None: ...


@dataclass(frozen=True)
class ValidateOptions:
    threshold_overrides: ThresholdOverrides = field(default_factory=ThresholdOverrides)  # CLI flags over the profile's
    measure_speed: bool = True
    latency: LatencySettings = field(default_factory=LatencySettings)
    sensitivity: bool = False
    sensitivity_samples: int = DEFAULT_SENSITIVITY_SAMPLES
    threads: int | None = None
    producer: str = "vitedge validate"
    data_role: str | None = None  # "validation" | "calibration" (the build's calibration images), when known
    reference_cache: ReferenceCacheSettings = field(default_factory=ReferenceCacheSettings)  # FP32 outputs, reused when known
    config: dict[str, Any] | None = None  # the project config the command read, why, and what it set (project_config.config_record)


def bundle_profile(manifest: Manifest, bundle: Path) -> TargetProfile:
    """The target profile recorded in the manifest, parsed (and checked) again."""
    data = manifest.target.profile
    if not isinstance(data, dict):
        raise BundleError(f"{bundle}/manifest.json records no target profile; rebuild the bundle")
    clean: dict[str, Any] = {}
    for k, v in data.items():
        if k == "source" or v is None:
            continue
        clean[k] = {kk: vv for kk, vv in v.items() if vv is not None} if isinstance(v, dict) else v
    return parse_profile(clean, Path(bundle) / "manifest.json:target.profile")


def resolve_thresholds(base: Thresholds, overrides: ThresholdOverrides) -> Thresholds:
    return overrides.over(base)


def artifact_bytes(bundle: Path, rel: str | None, extra: list[str] | None = None) -> int | None:
    """Size on disk of a model file plus its weight side files (OpenVINO .bin, ONNX external data)."""
    if not rel or not (bundle / rel).is_file():
        return None
    stem = Path(rel).stem
    total = (bundle / rel).stat().st_size
    if (bundle / (rel + ".data")).is_file():  # ONNX external data (graphs past 2 GB, docs/large-graphs.md)
        total += (bundle / (rel + ".data")).stat().st_size
    for name in extra or []:
        p = bundle / name
        if name != rel and Path(name).stem == stem and p.is_file():
            total += p.stat().st_size
    return total


@dataclass
class BundleValidation:
    manifest: Manifest
    thresholds: Thresholds
    result: ValidationResult
    report: ValidationReport
    sensitivity: SensitivityResult | None = None

    @property
    def passed(self) -> bool:
        return self.result.passed

    @property
    def document(self) -> dict[str, Any]:
        """The report as the JSON document (validation.json, the manifest's ``validation``)."""
        return self.report.to_json()

    def failure_line(self) -> str:
        return f"{self.report.target.name}: gate failed: " + "; ".join(self.report.failures)

    def files(self) -> tuple[dict[str, bytes | str], list[str]]:
        """Rendered report files (name -> content) and notes (e.g. why plots were skipped)."""
        notes: list[str] = []
        files: dict[str, bytes | str] = {}
        plots: list[str] = []
        if not rpt.matplotlib_available():
            if self.result.latency_settings is not None or self.sensitivity is not None:
                notes.append(rpt.PLOTS_HINT)
        else:
            files.update(self._plots())
            plots = list(files)
        report = self.report.with_plots(plots)
        files["validation.json"] = rpt.to_json(report.to_json())
        files["summary.md"] = self.markdown(plots)
        files["junit.xml"] = rpt.validation_junit(report)
        return files, notes

    def _plots(self) -> dict[str, bytes]:
        title = f"{self.report.model.source} on {self.report.target.name}"
        pngs: dict[str, bytes | None] = {}
        if self.result.latency_settings is not None:
            pngs["latency.png"] = rpt.latency_plot(self.result.latency, f"latency, {title}")
        sens = self.report.sensitivity
        if sens is not None and sens.layers:
            pngs["sensitivity.png"] = rpt.sensitivity_plot(sens.to_json(), f"per-layer sensitivity, {title}")
        return {name: png for name, png in pngs.items() if png}

    def markdown(self, plots: list[str] | None = None) -> str:
        return rpt.validation_markdown(self.report, plots=plots or [])

    def write(self, report_dir: Path) -> tuple[list[Path], list[str]]:
        files, notes = self.files()
        return rpt.write_report_files(report_dir, files, rpt.VALIDATION_FILES), notes


def validate_bundle(bundle: Path, manifest: Manifest, source: CalibrationSource, options: ValidateOptions = ValidateOptions(), *,
                    log: InfoLog | None = None, bundle_label: str | None = None, backend: Backend | None = None,
                    artifact_validator: Callable[..., ValidationResult] = validate_artifact) -> BundleValidation:
    """Validate the artifact of ``bundle`` (described by ``manifest``) on ``source``; ``backend``: the
    one to run it with (default: the registry's for the manifest's backend).

    ``artifact_validator`` (the signature of ``validate_artifact``) measures the artifact; the
    sharded validator of `vitedge.distributed` replaces it for `validate --workers/--ray-address`."""

    start = time.perf_counter()
    bundle = Path(bundle)
    info = getattr(log, "info", None) or (lambda _m: None)
    profile = bundle_profile(manifest, bundle)
    locked, threshold_notes = locked_thresholds(manifest, profile.thresholds)
    for note in threshold_notes:
        info("NOTE " + note)
    thresholds = resolve_thresholds(locked, options.threshold_overrides)
    backend_name = manifest.target.backend or profile.backend
    backend = backend if backend is not None else get_backend(backend_name)
    env = backend.check_environment()
    if not env.can_run:
        raise BundleError(f"target {manifest.target.name} runs on {backend_name}, which is not usable here: {env.detail}"
                          + (f"; {env.install_hint}" if env.install_hint else ""))
    backend.check_options(profile.backend_options)  # e.g. an OpenVINO device this machine lacks: exit 2, not a crash
    arts = manifest.artifacts
    if not arts.is_built:
        raise BundleError(f"{bundle}: the artifact was not built here ({arts.model}); "
                          "finish it on the device, then validate there")
    for role in ("model", "reference"):
        rel = arts.model if role == "model" else arts.reference
        if not rel or not (bundle / rel).is_file():
            raise BundleError(f"{bundle}: the {role} file {rel or None!r} named in manifest.json is missing; rebuild the bundle")
    spec = manifest.spec
    kind = manifest.output.kind or spec.output_kind
    result = artifact_validator(backend, profile.backend_options, bundle / arts.model, bundle / arts.reference, source, spec,
                               thresholds, profile.batch_sizes, measure_speed=options.measure_speed, threads=options.threads,
                               latency=options.latency, output_kind=kind, log=info, reference_cache=options.reference_cache)
    sens = None
    sens_doc: dict[str, Any] | None = None
    if options.sensitivity:
        sens, sens_doc = _sensitivity(bundle, manifest, source, kind, spec, options, info)
    report = _report(bundle, manifest, profile, thresholds, options, result, sens_doc, backend, bundle_label)
    report.seconds = time.perf_counter() - start
    report.thresholds.notes = threshold_notes
    return BundleValidation(manifest, thresholds, result, report, sens)


def _sensitivity(bundle: Path, manifest: Manifest, source, kind: str, spec, options: ValidateOptions, info):

    arts = manifest.artifacts
    fp32, qdq = arts.fp32_onnx, arts.qdq
    if not fp32 or not qdq or not (bundle / fp32).is_file() or not (bundle / qdq).is_file():
        return None, {"error": "the bundle holds no FP32 ONNX graph and Q/DQ graph to compare"}
    files = manifest.files if isinstance(manifest.files, dict) else {}
    if arts.single_graph is True or any(a != b and files.get(a) and files.get(a) == files.get(b)
                                        for a, b in ((arts.model, arts.reference), (qdq, fp32))):
        # the target's INT8 payoff kept the whole model float (a bundle written before holds that graph twice: the onnx
        # target's model.int8.onnx a copy of its reference, intel-cpu's a copy of reference.fp32.onnx)
        return None, {"error": "the bundle ships its FP32 graph as its artifact (the whole model stayed float): no INT8 layer to analyse"}
    x = first_inputs(source, options.sensitivity_samples)
    info(f"per-layer sensitivity on {len(x)} inputs (ONNX Runtime) ...")
    try:
        sens = layer_sensitivity(bundle / fp32, bundle / qdq, x, output_kind=kind, preprocess=spec.preprocess,
                                 threads=options.threads)
    except VitedgeError as err:  # a diagnostic: report why, do not fail the validation
        info(f"sensitivity not computed: {err}")
        return None, {"error": str(err)}
    if sens.layers:
        top = sens.layers[0]
        info(f"most sensitive: {top.name} ({top.kind}), {sens.metric} {top.metrics[sens.metric]:.2e}; {sens.seconds:.1f} s")
    return sens, sens.to_dict()


def _report(bundle: Path, manifest: Manifest, profile: TargetProfile, thresholds: Thresholds, options: ValidateOptions,
            result: ValidationResult, sens_doc: dict[str, Any] | None, backend, bundle_label: str | None) -> ValidationReport:
    overridden = sorted(options.threshold_overrides.set_values())
    return ValidationReport(
        schema=rpt.SCHEMA, producer=options.producer, vitedge_version=__version__,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        passed=result.passed, failures=[row.detail for row in result.failures()],
        bundle=BundleSection(bundle_label if bundle_label is not None else str(bundle), manifest.created, manifest.vitedge_version),
        model=_model_section(manifest), target=TargetSection(_or_none(manifest.target.name), _or_none(manifest.target.backend),
                                                              _or_none(manifest.target.precision), list(profile.batch_sizes)),
        quantization=_quantization_section(manifest.quantization),
        artifact=_artifact_section(bundle, manifest.artifacts),
        runtime=RuntimeSection(_or_none(manifest.target.backend), _versions(backend), options.threads, platform.platform(),
                               platform.machine(), os.cpu_count()),
        data=DataSection.from_json(dict(result.data, role=options.data_role) if options.data_role else result.data),
        thresholds=ThresholdsSection(thresholds.to_dict(), overridden),
        accuracy=AccuracySection(result.accuracy),
        latency=_latency_section(result, backend),
        speedup=result.speedup,
        memory=MemorySection(dict(result.memory), MEMORY_METHOD),
        gate=list(result.gate),
        sensitivity=None if sens_doc is None else SensitivitySection(sens_doc),
        config=options.config,  # which config set what (absent when none was read)
    )


def _latency_section(result: ValidationResult, backend: Backend) -> LatencySection:
    settings = result.latency_settings

    def by_batch(side: str) -> dict[str, LatencyStats]:
        return dict(sorted(result.latency.get(side, {}).items(), key=lambda kv: int(kv[0])))

    return LatencySection(settings is not None, settings.describe() if settings else None, settings.to_dict() if settings else None,
                          by_batch("fp32"), by_batch("int8"), result.speedups(),
                          device=backend.timing_device() if settings is not None else None)  # sharded: the timing worker's


def _model_section(manifest: Manifest) -> ModelSection:
    spec = manifest.model.spec or {}
    return ModelSection(_or_none(manifest.model.source), _or_none(manifest.model.source_sha256), spec.get("family"), spec.get("variant"),
                        spec.get("image_size"), spec.get("num_classes"), manifest.output.kind or spec.get("output_kind"))


def _quantization_section(q: ManifestQuantization) -> QuantizationSection:
    return QuantizationSection(_or_none(q.layers_int8), _or_none(q.layers_total), _or_none(q.summary_line), _or_none(q.config))


def _or_none(value: object) -> Any:
    """A manifest key its file lacks is null in validation.json, as it always was."""
    return None if value is ABSENT else value


def _artifact_section(bundle: Path, arts: ArtifactsSection) -> ArtifactSection:
    extra = list(arts.extra or [])
    size = artifact_bytes(bundle, _or_none(arts.model), extra)
    ref_size = artifact_bytes(bundle, _or_none(arts.reference), extra)
    return ArtifactSection(_or_none(arts.model), size, _or_none(arts.reference), ref_size,
                           (ref_size / size) if size and ref_size else None)


def _versions(backend) -> dict[str, str]:
    try:
        return backend.versions()
    except Exception:  # a report without versions beats no report
        return {}
