"""`vitedge build`: load -> FP32 export -> calibrate (cached) -> Q/DQ graph -> target artifact
-> validation -> bundle, for one or several targets sharing one calibration."""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitedge.backends import get_backend
from vitedge.backends.base import BuildContext
from vitedge.budget import (
    BudgetJob,
    BudgetSettings,
    describe_record,
    record_speed_verdict,
    run_budget,
)
from vitedge.budget import budget_failure as budget_not_met
from vitedge.app.reporting import write_bundle_reports
from vitedge.datasources.sources import open_source
from vitedge.datasources.split import resolve_data
from vitedge.camera_apps.exports import write_bundle_exports
from vitedge.errors import BundleError, UsageError
from vitedge.export import ExportOptions, bake_file, export_onnx
from vitedge.fsutil import atomic_output_dir, sha256_file
from vitedge.manifest import Manifest, toolchain_versions
from vitedge.manifest_sections import (
    ArtifactsSection,
    InputSection,
    ModelSection,
    OutputSection,
    QuantizationSection,
    TargetSection,
)
from vitedge.memory import release_freed_memory
from vitedge.models.intake import IntakeOptions, load_model
from vitedge.onnxutil import INPUT_FORMAT_KEY, copy_onnx, get_metadata, onnx_sha256
from vitedge.outlock import output_locks
from vitedge.outputs import interrupted_after, prepare_outputs, work_prefix
from vitedge.preflight import check_data_labels, preflight
from vitedge.profiles import TargetProfile, Thresholds, load_profile
from vitedge.quantize.calibrate import calibrate
from vitedge.quantize.config import CPU_REQUIREMENT, QuantConfig
from vitedge.quantize.qdq import build_qdq
from vitedge.ui import StageLog
from vitedge.validation.bundle import ValidateOptions, validate_bundle
from vitedge.validation.data_record import DataRecord
from vitedge.validation.reference_cache import ReferenceCacheSettings


@dataclass(frozen=True)
class BuildRequest:
    model: Path
    targets: tuple[str, ...]
    calib: Path
    out: Path | None = None
    val: Path | None = None  # labelled validation data; default: the calibration data
    force: bool = False
    intake: IntakeOptions = field(default_factory=IntakeOptions)
    calib_size: int | None = None
    seed: int = 0
    quant_overrides: dict[str, Any] = field(default_factory=dict)  # CLI flags over the profile's [quantization]
    threshold_overrides: dict[str, Any] = field(default_factory=dict)
    bake_preprocess: bool = False
    cache_dir: Path | None = None
    reference_cache: bool = True  # reuse FP32 validation outputs cached under cache_dir (vitedge.validation.reference_cache)
    int8_cache: bool = True  # also reuse the INT8 outputs of a byte-identical artifact (needs reference_cache)
    keep_float: tuple[str, ...] = ()
    measure_speed: bool = True
    min_calib: int = 16
    budget: Any = None  # vitedge.budget.BudgetSettings; None: the defaults (on)
    config_record: dict[str, Any] | None = None  # the project config read and what it set (recorded in validation.json)


@dataclass
class TargetResult:
    profile: TargetProfile
    bundle: Path
    built: bool  # False: the artifact must be finished on the device (TensorRT without a GPU)
    passed: bool | None  # None when nothing could be validated here
    summary: dict[str, Any]


def bundle_dirs(req: BuildRequest) -> dict[str, Path]:
    """Target argument -> bundle folder."""
    stem = req.model.stem if req.model.is_file() else req.model.name
    if req.out is None:
        return {t: Path(f"{stem}-{Path(t).stem}") for t in req.targets}
    if len(req.targets) == 1:
        return {req.targets[0]: req.out}
    return {t: req.out / Path(t).stem for t in req.targets}


def run_build(req: BuildRequest, log: StageLog | None = None) -> list[TargetResult]:

    log = log or StageLog()
    if not req.targets:
        raise UsageError("pass at least one --target (see `vitedge targets`)")
    if len(set(req.targets)) != len(req.targets):
        raise UsageError("the same --target is given twice")
    profiles = [load_profile(t) for t in req.targets]
    names = [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise UsageError(f"two --target profiles share the name '{next(n for n in names if names.count(n) > 1)}'; rename one")
    dirs = {p.name: d for p, d in zip(profiles, bundle_dirs(req).values())}
    with output_locks(dirs.values()):  # a second build into the same -o: refused now, not after its work
        return _build_locked(req, log, profiles, dirs)


def _build_locked(req: BuildRequest, log: StageLog, profiles: list[TargetProfile], dirs: dict[str, Path]) -> list[TargetResult]:
    prepare_outputs(dirs.values(), force=req.force, inputs=(req.model, req.calib, req.val))
    backends = {p.name: get_backend(p.backend) for p in profiles}
    preflight(req, profiles, backends, dirs)
    configs = {p.name: _quant_config(QuantConfig, p, req.quant_overrides) for p in profiles}
    thresholds = {p.name: _thresholds(p.thresholds, req.threshold_overrides) for p in profiles}

    with tempfile.TemporaryDirectory(prefix=work_prefix("build")) as work_str:
        work = Path(work_str)
        with log.stage("load", str(req.model)):
            loaded = load_model(req.model, req.intake)
            spec = loaded.spec
            log.info(f"{spec.family} {spec.variant}, {spec.image_size[0]}x{spec.image_size[1]}, "
                     f"{spec.num_params or 0:,} parameters, output {spec.output_kind}")
            release_freed_memory()  # the checkpoint the module was loaded from (as large as the weights)
        with log.stage("export", "FP32 ONNX, checked against PyTorch"):
            fp32 = work / "model.fp32.onnx"
            # only the ONNX graph is used from here: the module's weights (2.5 GB for vit_h_14) go before the parity check
            result = export_onnx(loaded, fp32, ExportOptions(free_module=True))
            log.info(result.one_line())
            loaded.module = None
            release_freed_memory()
        with log.stage("data", f"calibration set {req.calib}"):
            calib_path, val_path, notes = resolve_data(req.calib, req.val, spec.class_names)
            for note in notes:
                log.info(note)
            calib = open_source(calib_path, spec.preprocess, limit=req.calib_size, seed=req.seed,
                                min_count=req.min_calib, class_names=spec.class_names, progress=not log.quiet)
            log.info(calib.summary.one_line())
            if val_path is not None:
                val = open_source(val_path, spec.preprocess, class_names=spec.class_names, progress=not log.quiet)
                log.info("validation: " + val.summary.one_line())
            else:
                val = calib
                log.info("validation: no --val given; validating on the calibration set (pass held-out labelled data for a real accuracy figure)")
            val_record = DataRecord.of(val, "validation" if val_path is not None else "calibration").to_dict()
            check_data_labels(val, spec)
        qdq_paths: dict[QuantConfigKey, tuple[Path, Any, Any]] = {}
        budgets: dict[QuantConfigKey, Any] = {}
        for p in profiles:
            key = QuantConfigKey.of(configs[p.name])
            if key in qdq_paths:
                continue
            with log.stage("calibrate", configs[p.name].describe()):
                calibration = calibrate(fp32, calib, configs[p.name], cache_dir=req.cache_dir, progress=not log.quiet)
                log.info(calibration.one_line())
            with log.stage("quantize", "one Q/DQ graph for every target"):
                graph = build_qdq(calibration, keep_float=req.keep_float)
                log.info(graph.one_line())
            consumers = [q for q in profiles if QuantConfigKey.of(configs[q.name]) == key]
            budgets[key] = budget = run_budget(BudgetJob(
                calibration=calibration, graph=graph, fp32=fp32, validation=val, spec=spec, targets=consumers, backends=backends,
                thresholds=thresholds, keep_float=req.keep_float, cache_dir=req.cache_dir,
                reference_cache=req.reference_cache, int8_cache=req.int8_cache),
                req.budget or BudgetSettings(measure_cost=req.measure_speed), log)
            graph = budget.graph
            qdq = work / f"qdq-{len(qdq_paths)}" / "model.int8.onnx"  # the bundle's name: external data keeps its location
            graph.save(qdq)
            # every later step reads the saved files: drop the two in-memory graphs (2 x 2.5 GB for vit_h_14)
            graph = graph.without_model()
            calibration = graph.calibration
            budget = budgets[key] = dataclasses.replace(budget, graph=graph)
            qdq_paths[key] = (qdq, calibration, graph)
            release_freed_memory()
        if req.bake_preprocess:
            baked = work / "baked"
            baked.mkdir()
            bake_file(fp32, baked / fp32.name, spec.preprocess)
            fp32 = baked / fp32.name
            for key, (qdq, calibration, graph) in list(qdq_paths.items()):
                bake_file(qdq, baked / qdq.parent.name / qdq.name, spec.preprocess)
                qdq_paths[key] = (baked / qdq.parent.name / qdq.name, calibration, graph)

        results = []
        for p in profiles:
            qdq, calibration, graph = qdq_paths[QuantConfigKey.of(configs[p.name])]
            try:
                target = TargetBuild(profile=p, backend=backends[p.name], bundle_dir=dirs[p.name], fp32=fp32, qdq=qdq,
                                     calibration=calibration, graph=graph, loaded=loaded, val=val, thresholds=thresholds[p.name],
                                     budget=budgets[QuantConfigKey.of(configs[p.name])], val_record=val_record)
                results.append(_build_target(target, req, log))
                release_freed_memory()  # each target's runtimes (OpenVINO, ONNX Runtime) before the next opens its own
            except KeyboardInterrupt as err:
                if not results:
                    raise  # nothing was written: the plain interrupt
                done, left = [(r.profile.name, r.bundle) for r in results], [(q.name, dirs[q.name]) for q in profiles[len(results):]]
                raise interrupted_after(done, left, err) from err
    return results


@dataclass(frozen=True)
class QuantConfigKey:
    items: tuple

    @classmethod
    def of(cls, config) -> "QuantConfigKey":
        return cls(tuple(sorted(config.to_dict().items())))


def _quant_config(cls, profile: TargetProfile, overrides: dict[str, Any]):
    values = dict(profile.quantization)
    values.update({k: v for k, v in overrides.items() if v is not None or k == "smoothquant_alpha" and "smoothquant_alpha" in overrides})
    return cls(**values)


def _thresholds(base: Thresholds, overrides: dict[str, Any]) -> Thresholds:
    changes = {k: v for k, v in overrides.items() if v is not None}
    for k, v in changes.items():  # name the flag, not the profile key
        try:
            dataclasses.replace(Thresholds(), **{k: v})
        except UsageError as err:
            raise UsageError(f"--{k.replace('_', '-')}: {err}") from None
    return base.with_overrides(overrides)


@dataclass
class TargetBuild:
    """Everything one target's bundle is built from: its profile and backend, the shared FP32 and
    Q/DQ graphs (and their calibration and accuracy budget), the model and the validation data."""

    profile: TargetProfile
    backend: Any  # vitedge.backends.base.Backend
    bundle_dir: Path
    fp32: Path  # the FP32 ONNX graph (preprocessing baked in with --bake-preprocess)
    qdq: Path  # the shared Q/DQ graph
    calibration: Any  # vitedge.quantize.calibrate.CalibrationResult
    graph: Any  # vitedge.quantize.qdq.QdqGraph
    loaded: Any  # vitedge.models.intake.LoadedModel
    val: Any  # the validation source
    thresholds: Thresholds
    budget: Any = None  # vitedge.budget.BudgetResult
    val_record: dict[str, Any] | None = None  # vitedge.validation.data_record.DataRecord.to_dict()


def _build_target(t: TargetBuild, req: BuildRequest, log: StageLog) -> TargetResult:

    profile, backend, bundle_dir, val_record = t.profile, t.backend, t.bundle_dir, t.val_record
    env = backend.check_environment()
    with log.stage("build", f"{profile.name} ({profile.backend})"):
        if not env.can_build and not backend.facts.builds_without_runtime:
            raise BundleError(f"target {profile.name} needs {profile.backend}, which is not usable here: {env.detail}"
                              + (f"; {env.install_hint}" if env.install_hint else ""))
        with atomic_output_dir(bundle_dir, force=req.force) as tmp:
            copy_onnx(t.qdq, tmp / "model.int8.onnx")  # with its external data (graphs past 2 GB), if any
            copy_onnx(t.fp32, tmp / "reference.fp32.onnx")
            ctx = BuildContext(qdq_path=tmp / "model.int8.onnx", fp32_path=tmp / "reference.fp32.onnx", out_dir=tmp,
                               options=profile.backend_options, batch_sizes=profile.batch_sizes, log=log.info)
            artifact = backend.build(ctx)
            validation = checked = None
            if not artifact.built:
                log.info(artifact.info.get("next_step", "the artifact must be finished on the device"))
            manifest = Manifest(
                target=TargetSection(name=profile.name, backend=profile.backend, precision=profile.precision, profile=profile.to_dict()),
                model=_model_section(t.loaded),
                input=_input_section(tmp / "model.int8.onnx", t.loaded.spec),
                output=_output_section(t.loaded.spec),
                calibration=dict(t.calibration.to_dict(), summary_line=t.calibration.one_line(), reused=t.calibration.reused),
                quantization=_quantization_section(t.graph, t.budget, t.qdq),
                artifacts=ArtifactsSection(model=artifact.model, reference=artifact.reference, qdq="model.int8.onnx",
                                           fp32_onnx="reference.fp32.onnx", built=artifact.built, extra=artifact.extra_files),
                toolchain=toolchain_versions(_safe_versions(backend)),
                backend_info=artifact.info,
                validation=validation,
                validation_data=val_record,
            )
            if artifact.built and env.can_run:  # the same validation, gate and reports as `vitedge validate`
                with log.stage("validate", f"{profile.name}: INT8 vs FP32 on {len(t.val)} inputs, same runtime"):
                    checked = validate_bundle(tmp, manifest, t.val, ValidateOptions(
                        threshold_overrides=req.threshold_overrides, measure_speed=req.measure_speed, producer="vitedge build",
                        data_role=(val_record or {}).get("role"), config=req.config_record,
                        reference_cache=ReferenceCacheSettings(enabled=req.reference_cache, root=req.cache_dir,
                                                             int8_outputs=req.int8_cache)),
                        log=log, bundle_label=str(bundle_dir))
                    validation = manifest.validation = checked.document
                    for row in checked.result.gate:
                        log.info(row.status.upper() + " " + row.detail)
            budget_failure = record_speed_verdict(manifest, validation, t.thresholds, profile, log)
            not_met = budget_not_met(t.budget, t.loaded.spec.output_kind)
            if not_met:  # the closest INT8 graph the budget found: shipped for inspection, marked failed
                manifest.quantization["budget"]["verdict"] = {"passed": False, "detail": not_met}
                log.info("FAIL " + not_met)
                budget_failure = not_met if budget_failure is None else f"{not_met}; {budget_failure}"

            write_bundle_exports(tmp, manifest, backend.facts)  # camera/: DeepStream and Triton configs in NVIDIA bundles
            manifest.hash_files(tmp)
            write_bundle_reports(tmp, manifest, checked)
            manifest.write(tmp)
    passed = None if validation is None else bool(validation["passed"]) and budget_failure is None
    if budget_failure and passed is None:  # not validated here (built on the device), but the budget already failed
        passed = False
    summary = _summary(bundle_dir, artifact, validation)
    if t.budget is not None:

        summary["budget"] = describe_record(manifest.quantization["budget"])
        summary["budget_float"] = list(t.budget.returned)
    if budget_failure:
        summary.setdefault("failures", []).append(budget_failure)
    return TargetResult(profile, bundle_dir, artifact.built, passed, summary)


def _model_section(loaded) -> ModelSection:

    path = loaded.path
    digest = (onnx_sha256 if loaded.is_onnx else sha256_file)(path) if path.is_file() else None
    return ModelSection(source=path.name, source_sha256=digest, spec=loaded.spec.to_dict())


def _output_section(spec) -> OutputSection:
    return OutputSection(name="embedding" if spec.output_kind == "embedding" else "logits", kind=spec.output_kind,
                         class_names=list(spec.class_names) if spec.class_names else None)


def _quantization_section(graph, budget, qdq: Path) -> QuantizationSection:
    """The shared Q/DQ graph every target of this call was built from; the onnx target's
    model.int8.onnx differs from it when its attention cores were fused."""

    section = QuantizationSection.from_json(quantization_record(graph, budget))
    section.qdq_sha256 = onnx_sha256(qdq)
    return section


def quantization_record(graph, budget=None) -> dict[str, Any]:
    """What the manifest says about the Q/DQ graph: settings, which layers are INT8, which stayed float
    (and, with the accuracy budget, why each did, what it costs and the search record)."""
    record = {
        "config": graph.calibration.config.to_dict(),
        "layers_total": len(graph.layers),
        "layers_int8": len(graph.quantized),
        "kept_float": list(graph.kept_float),
        "layer_kinds": {k: {"int8": a, "total": b} for k, (a, b) in graph.layer_kinds().items()},
        "summary_line": graph.one_line(),
        # which CPUs give correct INT8 results with these weights (vitedge.cpu, checked at load)
        "weight_range": graph.calibration.config.weight_range,
        "cpu_requirement": CPU_REQUIREMENT[graph.calibration.config.weight_range],
    }
    if budget is not None:
        rec = budget.to_dict()
        record["kept_float_detail"] = rec["layer_costs"]
        record["budget"] = rec
        if budget.returned:
            record["summary_line"] += f"; {len(budget.returned)} returned to float by the accuracy budget"
    return record


def _safe_versions(backend) -> dict[str, str]:
    try:
        return backend.versions()
    except Exception:
        return {}


def _input_section(qdq: Path, spec) -> InputSection:
    import onnx


    model = onnx.load(str(qdq), load_external_data=False)
    fmt = get_metadata(model).get(INPUT_FORMAT_KEY, "float32-nchw")
    name = model.graph.input[0].name
    h, w = spec.image_size
    c = spec.preprocess.channels
    shape = [None, h, w, c] if fmt.startswith("uint8") else [None, c, h, w]
    return InputSection(name=name, format=fmt, shape=shape, dtype="uint8" if fmt.startswith("uint8") else "float32",
                        channels=c, color_mode=spec.preprocess.color_mode, preprocess=spec.preprocess.to_dict(),
                        preprocess_baked=fmt.startswith("uint8"))


def _summary(bundle: Path, artifact, validation) -> dict[str, Any]:
    size = (bundle / artifact.model).stat().st_size if (bundle / artifact.model).exists() else None
    if size is not None and (bundle / (artifact.model + ".data")).is_file():  # ONNX external data (graphs past 2 GB)
        size += (bundle / (artifact.model + ".data")).stat().st_size
    for extra in artifact.extra_files:
        if extra.endswith(".bin") and extra.startswith(Path(artifact.model).stem) and (bundle / extra).exists():
            size = (size or 0) + (bundle / extra).stat().st_size
    out: dict[str, Any] = {"artifact": artifact.model, "artifact_bytes": size}
    if validation:
        acc = validation["accuracy"]
        out.update({
            "top1_fp32": acc.get("fp32_top1"), "top1_int8": acc.get("int8_top1"), "agreement": acc.get("top1_agreement"),
            "embedding_cosine_mean": acc.get("embedding_cosine_mean"), "embedding_cosine_low": acc.get("embedding_cosine_low"),
            "speedup": validation.get("speedup"),
            "fp32_ms": validation["latency"].get("fp32", {}).get("1", {}).get("p50_ms"),
            "int8_ms": validation["latency"].get("int8", {}).get("1", {}).get("p50_ms"),
            "failures": [r["detail"] for r in validation["gate"] if not r["passed"]],
            "warnings": list(acc.get("warnings") or ()),
        })
    return out
