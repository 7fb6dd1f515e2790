"""`vitedge build`: load -> FP32 export -> calibrate (cached) -> Q/DQ graph -> target artifact
-> validation -> bundle, for one or several targets sharing one calibration."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from vitedge.app.overrides import QuantOverrides, ThresholdOverrides
from vitedge.app.reporting import kind_line, still_slower_line, write_bundle_reports
from vitedge.app.shipped import count_shipped, ships_fp32, shipped_budget_verdict
from vitedge.backends import get_backend
from vitedge.backends.base import Backend, BuildContext, BuiltArtifact
from vitedge.budget import (
    BudgetJob,
    BudgetResult,
    BudgetSettings,
    describe_record,
    record_speed_verdict,
    run_budget,
)
from vitedge.budget import budget_failure as budget_not_met
from vitedge.budget.speed import record_budget_not_met
from vitedge.bundle.trust import signing_key
from vitedge.camera_apps.exports import write_bundle_exports
from vitedge.datasources.base import CalibrationSource
from vitedge.datasources.sources import open_source
from vitedge.datasources.split import resolve_data
from vitedge.core.cpu import CPU_KINDS, cpu_kind, read_cpu
from vitedge.core.errors import BundleError, UsageError
from vitedge.models.batch_check import PROBE_IMAGES, check_batch_independence, probe_inputs
from vitedge.models.export import ExportOptions, bake_file, export_onnx
from vitedge.files.atomic import atomic_output_dir, sha256_file
from vitedge.bundle.manifest import Manifest, toolchain_versions
from vitedge.bundle.sections import (
    ArtifactsSection,
    InputSection,
    ModelSection,
    OutputSection,
    QuantizationSection,
    TargetSection,
)
from vitedge.core.memory import release_freed_memory
from vitedge.models.intake import IntakeOptions, LoadedModel, load_model
from vitedge.onnxkit.files import copy_onnx, onnx_sha256
from vitedge.onnxkit.metadata import INPUT_FORMAT_KEY, get_metadata
from vitedge.files.lock import output_locks
from vitedge.files.outputs import interrupted_after, prepare_outputs, work_prefix
from vitedge.app.preflight import check_data_labels, preflight
from vitedge.targets.profiles import TargetProfile, Thresholds, load_profile
from vitedge.quantize.calibrate import calibrate
from vitedge.quantize.config import CPU_REQUIREMENT, QuantConfig
from vitedge.quantize.qdq import QuantizedGraph, build_qdq
from vitedge.quantize.record import Calibration
from vitedge.quantize.small_gemm import SOURCE as SMALL_GEMM_SOURCE
from vitedge.bundle.spec import ModelSpec
from vitedge.core.ui import StageLog
from vitedge.validation.bundle import ValidateOptions, validate_bundle
from vitedge.validation.data_record import DataRecord
from vitedge.validation.document import ValidationReport
from vitedge.validation.normalisation import guess_notice, question_normalisation
from vitedge.validation.reference_cache import ReferenceCacheSettings, fp32_graph_record


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
    quant_overrides: QuantOverrides = field(default_factory=QuantOverrides)  # CLI flags over the profile's [quantization]
    threshold_overrides: ThresholdOverrides = field(default_factory=ThresholdOverrides)  # and over its [thresholds]
    bake_preprocess: bool = False
    # the cache root (calibration statistics, per-layer sensitivities, validation outputs) and whether FP32 and
    # byte-identical INT8 outputs are reused from it (vitedge.validation.reference_cache)
    cache: ReferenceCacheSettings = field(default_factory=ReferenceCacheSettings)
    keep_float: tuple[str, ...] = ()
    measure_speed: bool = True
    min_calib: int = 16
    budget: BudgetSettings | None = None  # None: the defaults (on), cost measured with measure_speed
    config_record: dict[str, Any] | None = None  # the project config read and what it set (recorded in validation.json)
    # the CPU kind the bundles are for (vitedge.core.cpu.CPU_KINDS): the onnx target's INT8 payoff is decided for it,
    # timed when this CPU is of that kind, from recorded figures of that kind otherwise; None: this CPU's kind
    cpu_kind: str | None = None


@dataclass
class BuildSummary:
    """What the terminal summary and the command's closing lines show of one target's build (figures None when
    the bundle was not validated here)."""

    artifact: str
    artifact_bytes: int | None = None
    top1_fp32: float | None = None
    top1_int8: float | None = None
    agreement: float | None = None
    embedding_cosine_mean: float | None = None
    embedding_cosine_low: float | None = None
    speedup: float | None = None
    fp32_ms: float | None = None  # batch-1 p50
    int8_ms: float | None = None
    failures: list[str] = field(default_factory=list)  # the gate rows that failed, the budget's failure
    warnings: list[str] = field(default_factory=list)
    budget: str | None = None  # the accuracy budget's one line
    budget_float: list[str] = field(default_factory=list)  # the layers it returned to float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class TargetResult:
    profile: TargetProfile
    bundle: Path
    built: bool  # False: the artifact must be finished on the device (TensorRT without a GPU)
    passed: bool | None  # None when nothing could be validated here
    summary: BuildSummary


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
    signing_key()  # a blank VITEDGE_SIGNING_KEY is refused before the work, not when the manifest is signed
    _check_cpu_kind(req.cpu_kind)
    profiles = _load_profiles(req.targets)
    dirs = {p.name: d for p, d in zip(profiles, bundle_dirs(req).values())}
    with output_locks(dirs.values()):  # a second build into the same -o: refused now, not after its work
        return _build_locked(req, log, profiles, dirs)


def _check_cpu_kind(kind: object) -> None:
    """--cpu-kind names one of the CPU kinds vitedge labels, or is not given."""
    if kind is not None and kind not in CPU_KINDS:
        raise UsageError(f"--cpu-kind must be one of {', '.join(CPU_KINDS)} (the CPU kind the bundles are for; default: this "
                         f"CPU's, {cpu_kind(read_cpu(capped=False))}), got {str(kind)[:40]!r}")


def _kind_not_decided(kind: str | None, profile: TargetProfile, artifact: BuiltArtifact) -> str | None:
    """For a target whose backend did not decide its INT8 payoff for --cpu-kind (only the onnx target does), when that
    kind is not this CPU's: one line saying what its decision and its times are."""
    payoff = artifact.info.get("int8_payoff") if isinstance(artifact.info.get("int8_payoff"), dict) else {}
    if not kind or kind == cpu_kind(read_cpu(capped=False)) or payoff.get("cpu_kind") == kind:
        return None
    return (f"{profile.name}: its INT8 payoff is not decided for {kind} CPUs (--cpu-kind decides the onnx target's, with "
            f"int8_payoff on): what it keeps float, if anything, and its times are this CPU's ({read_cpu().isa}), not {kind}'s")


def _load_profiles(targets: tuple[str, ...]) -> list[TargetProfile]:
    """Each --target's profile; none, one given twice or two of one name are refused."""
    if not targets:
        raise UsageError("pass at least one --target (see `vitedge targets`)")
    if len(set(targets)) != len(targets):
        raise UsageError("the same --target is given twice")
    profiles = [load_profile(t) for t in targets]
    names = [p.name for p in profiles]
    if len(set(names)) != len(names):
        raise UsageError(f"two --target profiles share the name '{next(n for n in names if names.count(n) > 1)}'; rename one")
    return profiles


@dataclass
class BuildData:
    """The calibration and validation sources a build reads, and the validation data's record."""

    calib: CalibrationSource
    val: CalibrationSource  # the calibration data when no --val was given
    val_record: dict[str, Any]  # vitedge.validation.data_record.DataRecord.to_dict()


@dataclass
class SharedGraph:
    """One Q/DQ graph every target with the same quantization config is built from, saved to ``qdq``
    (the in-memory model dropped), with its calibration and accuracy budget."""

    qdq: Path
    calibration: Calibration
    graph: QuantizedGraph
    budget: BudgetResult


def _build_locked(req: BuildRequest, log: StageLog, profiles: list[TargetProfile], dirs: dict[str, Path]) -> list[TargetResult]:
    prepare_outputs(dirs.values(), force=req.force, inputs=(req.model, req.calib, req.val))
    backends = {p.name: get_backend(p.backend) for p in profiles}
    preflight({"MODEL": req.model, "--calib": req.calib, "--val": req.val, "-o": req.out}, req.cache.root, profiles, backends, dirs)
    configs = {p.name: req.quant_overrides.config_for(p) for p in profiles}
    thresholds = {p.name: req.threshold_overrides.apply(p.thresholds) for p in profiles}

    with tempfile.TemporaryDirectory(prefix=work_prefix("build")) as work_str:
        work = Path(work_str)
        loaded, fp32 = _load_and_export(req, log, work)
        data = _open_data(req, loaded.spec, log)
        # each image's output its own, whatever else shares its batch: exit 2 if not (before any calibration)
        log.info(check_batch_independence(fp32, loaded.spec, probe_inputs(data.calib.batches(PROBE_IMAGES)), seed=req.seed).one_line())
        question_normalisation(fp32, loaded.spec, data.calib, data.val, log.info)  # a guessed mean/std: exit 2 if another is clearly better
        budget_job = partial(BudgetJob, fp32=fp32, validation=data.val, spec=loaded.spec, backends=backends, thresholds=thresholds,
                             keep_float=req.keep_float, cache=req.cache)
        shared: dict[QuantConfigKey, SharedGraph] = {}
        for p in profiles:
            key = QuantConfigKey.of(configs[p.name])
            if key not in shared:  # one graph for every target with this quantization config
                consumers = [q for q in profiles if QuantConfigKey.of(configs[q.name]) == key]
                qdq = work / f"qdq-{len(shared)}" / "model.int8.onnx"  # the bundle's name: external data keeps its location
                shared[key] = _shared_graph(req, log, configs[p.name], (fp32, data.calib), partial(budget_job, targets=consumers), qdq)
        if req.bake_preprocess:
            fp32 = _bake_preprocess(work, fp32, shared, loaded.spec)
        targets = [TargetBuild(profile=p, backend=backends[p.name], bundle_dir=dirs[p.name], fp32=fp32, loaded=loaded, val=data.val,
                               thresholds=thresholds[p.name], shared=shared[QuantConfigKey.of(configs[p.name])],
                               val_record=data.val_record) for p in profiles]
        return _build_targets(targets, req, log)


def _load_and_export(req: BuildRequest, log: StageLog, work: Path) -> tuple[LoadedModel, Path]:
    """The model, loaded, and its FP32 ONNX graph (``work/model.fp32.onnx``), checked against PyTorch."""
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
    return loaded, fp32


def _open_data(req: BuildRequest, spec: ModelSpec, log: StageLog) -> BuildData:
    """The calibration source and the validation source (the calibration data when no --val)."""
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
    return BuildData(calib, val, val_record)
def _shared_graph(req: BuildRequest, log: StageLog, config: QuantConfig, inputs: tuple[Path, CalibrationSource],
                  budget_job: Callable[..., BudgetJob], qdq: Path) -> SharedGraph:
    """Calibrate ``inputs`` (the FP32 graph, the calibration data; statistics cached), build the Q/DQ
    graph, meet the accuracy budget on the consumers' runtimes and save the graph it chose to ``qdq``."""
    fp32, calib = inputs
    with log.stage("calibrate", config.describe()):
        calibration = calibrate(fp32, calib, config, cache_dir=req.cache.root, progress=not log.quiet)
        log.info(calibration.one_line())
    with log.stage("quantize", "one Q/DQ graph for every target"):
        graph = build_qdq(calibration, keep_float=req.keep_float)
        log.info(graph.one_line())
    budget = run_budget(budget_job(calibration=calibration, graph=graph), req.budget or BudgetSettings(measure_cost=req.measure_speed), log)
    graph = budget.graph
    graph.save(qdq)
    # every later step reads the saved files: drop the two in-memory graphs (2 x 2.5 GB for vit_h_14)
    graph = graph.without_model()
    calibration = graph.calibration
    budget = dataclasses.replace(budget, graph=graph)
    release_freed_memory()
    return SharedGraph(qdq, calibration, graph, budget)


def _bake_preprocess(work: Path, fp32: Path, shared: dict[QuantConfigKey, SharedGraph], spec: ModelSpec) -> Path:
    """--bake-preprocess: copies of the FP32 and Q/DQ graphs that take uint8 NHWC frames (``shared``
    updated in place); returns the baked FP32 graph."""
    baked = work / "baked"
    baked.mkdir()
    bake_file(fp32, baked / fp32.name, spec.preprocess)
    for key, g in list(shared.items()):
        path = baked / g.qdq.parent.name / g.qdq.name
        bake_file(g.qdq, path, spec.preprocess)
        shared[key] = dataclasses.replace(g, qdq=path)
    return baked / fp32.name


def _build_targets(targets: list[TargetBuild], req: BuildRequest, log: StageLog) -> list[TargetResult]:
    """Each target's bundle in turn; an interrupt after the first names what was written and what was not."""
    results: list[TargetResult] = []
    for t in targets:
        try:
            results.append(_build_target(t, req, log))
            release_freed_memory()  # each target's runtimes (OpenVINO, ONNX Runtime) before the next opens its own
        except KeyboardInterrupt as err:
            if not results:
                raise  # nothing was written: the plain interrupt
            done = [(r.profile.name, r.bundle) for r in results]
            left = [(q.profile.name, q.bundle_dir) for q in targets[len(results):]]
            raise interrupted_after(done, left, err) from err
    return results


@dataclass(frozen=True)
class QuantConfigKey:
    items: tuple[tuple[str, object], ...]

    @classmethod
    def of(cls, config: QuantConfig) -> QuantConfigKey:
        return cls(tuple(sorted(config.to_dict().items())))


@dataclass
class TargetBuild:
    """Everything one target's bundle is built from: its profile and backend, the FP32 graph and the
    shared Q/DQ graph (with its calibration and accuracy budget), the model and the validation data."""

    profile: TargetProfile
    backend: Backend
    bundle_dir: Path
    fp32: Path  # the FP32 ONNX graph (preprocessing baked in with --bake-preprocess)
    shared: SharedGraph
    loaded: LoadedModel
    val: CalibrationSource
    thresholds: Thresholds
    val_record: dict[str, Any] | None = None  # vitedge.validation.data_record.DataRecord.to_dict()


def _build_target(t: TargetBuild, req: BuildRequest, log: StageLog) -> TargetResult:

    profile, backend, bundle_dir, val_record, calibration = t.profile, t.backend, t.bundle_dir, t.val_record, t.shared.calibration
    env = backend.check_environment()
    with log.stage("build", f"{profile.name} ({profile.backend})"):
        if not env.can_build and not backend.facts.builds_without_runtime:
            raise BundleError(f"target {profile.name} needs {profile.backend}, which is not usable here: {env.detail}"
                              + (f"; {env.install_hint}" if env.install_hint else ""))
        with atomic_output_dir(bundle_dir, force=req.force) as tmp:
            copy_onnx(t.shared.qdq, tmp / "model.int8.onnx")  # with its external data (graphs past 2 GB), if any
            copy_onnx(t.fp32, tmp / "reference.fp32.onnx")
            ctx = BuildContext(qdq_path=tmp / "model.int8.onnx", fp32_path=tmp / "reference.fp32.onnx", out_dir=tmp,
                               options=profile.backend_options, batch_sizes=profile.batch_sizes, log=log.info, cpu_kind=req.cpu_kind)
            input_section = _input_section(tmp / "model.int8.onnx", t.loaded.spec)  # before the backend: it may ship FP32 alone
            artifact = backend.build(ctx)
            report = checked = None
            if not artifact.built:
                log.info(artifact.info.get("next_step", "the artifact must be finished on the device"))
            manifest = Manifest(
                target=TargetSection(name=profile.name, backend=profile.backend, precision=profile.precision, profile=profile.to_dict()),
                model=_model_section(t.loaded),
                input=input_section,
                output=_output_section(t.loaded.spec),
                calibration=dict(calibration.to_dict(), summary_line=calibration.one_line(), reused=calibration.reused),
                quantization=_quantization_section(t.shared.graph, t.shared.budget, t.shared.qdq),
                artifacts=_artifacts_section(artifact, tmp),
                toolchain=toolchain_versions(_safe_versions(backend)),
                backend_info=artifact.info,
                validation=None,
                validation_data=val_record,
            )
            if artifact.info.get("int8_payoff"):  # the target's own keep-float decision, for the CPU kind it was made on
                manifest.quantization.int8_payoff = artifact.info["int8_payoff"]
                count_shipped(manifest.quantization, t.shared.graph, artifact.info)  # the counts of what ships
            if artifact.built and env.can_run:  # the same validation, gate and reports as `vitedge validate`
                with log.stage("validate", f"{profile.name}: INT8 vs FP32 on {len(t.val)} inputs, same runtime"):
                    checked = validate_bundle(tmp, manifest, t.val, ValidateOptions(
                        threshold_overrides=req.threshold_overrides, measure_speed=req.measure_speed,
                        producer="vitedge build", data_role=(val_record or {}).get("role"), config=req.config_record,
                        reference_cache=req.cache),
                        log=log, bundle_label=str(bundle_dir))
                    report = checked.report
                    manifest.validation = checked.document  # the manifest's section is the document's JSON
                    for row in checked.result.gate:
                        log.info(row.status.upper() + " " + row.detail)
            for line in (kind_line(manifest.quantization), _kind_not_decided(req.cpu_kind, profile, artifact),
                         still_slower_line(artifact.info, None if report is None else report.speedup)):
                if line:
                    log.info(line)
            fp32_shipped = ships_fp32(artifact.info)  # the budget's layers are not what makes this bundle slow or fast
            # the budget's speed verdict reads the speed gate's second look when there was one (CPU time, not wall time)
            second = None if checked is None else checked.result.speed_check
            budget_failure = record_speed_verdict(manifest, None if report is None or fp32_shipped
                                                  else (second.speedup if second is not None else report.speedup),
                                                  t.thresholds, profile, log)
            not_met, verdict = shipped_budget_verdict(budget_not_met(t.shared.budget, t.loaded.spec.output_kind), artifact.info,
                                                      None if checked is None else checked.result.gate)
            if verdict is not None and manifest.quantization.budget:
                manifest.quantization.budget["verdict"] = verdict
            if not_met:  # the closest INT8 graph the budget found: shipped for inspection, marked failed
                record_budget_not_met(manifest, not_met)
                log.info("FAIL " + not_met)
                budget_failure = not_met if budget_failure is None else f"{not_met}; {budget_failure}"

            write_bundle_exports(tmp, manifest, backend.facts)  # camera/: DeepStream and Triton configs in NVIDIA bundles
            manifest.hash_files(tmp)
            write_bundle_reports(tmp, manifest, checked)
            manifest.write(tmp)
    passed = None if report is None else report.passed and budget_failure is None
    if budget_failure and passed is None:  # not validated here (built on the device), but the budget already failed
        passed = False
    summary = _summary(bundle_dir, artifact, report)
    summary.budget = describe_record(manifest.quantization.budget)
    summary.budget_float = list(t.shared.budget.returned)
    guessed = guess_notice(t.loaded.spec)
    if guessed:
        summary.warnings = [guessed, *summary.warnings]
    if budget_failure:
        summary.failures.append(budget_failure)
    return TargetResult(profile, bundle_dir, artifact.built, passed, summary)


def _artifacts_section(artifact: BuiltArtifact, bundle: Path) -> ArtifactsSection:
    """The files the bundle holds, by role; one FP32 graph for every role when the target ships it as is (the onnx
    target: reference.fp32.onnx for all four; intel-cpu: its FP32 IR as artifact and reference, the FP32 ONNX graph as
    Q/DQ graph and fp32_onnx)."""
    section = ArtifactsSection(model=artifact.model, reference=artifact.reference, qdq=artifact.qdq or "model.int8.onnx",
                               fp32_onnx="reference.fp32.onnx", built=artifact.built, extra=artifact.extra_files,
                               fp32_graph=fp32_graph_record(bundle / "reference.fp32.onnx"))
    if artifact.model == artifact.reference and section.qdq == section.fp32_onnx:
        section.single_graph = True
    return section


def _model_section(loaded: LoadedModel) -> ModelSection:

    path = loaded.path
    digest = (onnx_sha256 if loaded.is_onnx else sha256_file)(path) if path.is_file() else None
    return ModelSection(source=path.name, source_sha256=digest, spec=loaded.spec.to_dict())


def _output_section(spec: ModelSpec) -> OutputSection:
    return OutputSection(name="embedding" if spec.output_kind == "embedding" else "logits", kind=spec.output_kind,
                         class_names=list(spec.class_names) if spec.class_names else None)


def _quantization_section(graph: QuantizedGraph, budget: BudgetResult | None, qdq: Path) -> QuantizationSection:
    """The shared Q/DQ graph every target of this call was built from; the onnx target's
    model.int8.onnx differs from it when its attention cores were fused."""

    section = QuantizationSection.from_json(quantization_record(graph, budget))
    section.qdq_sha256 = onnx_sha256(qdq)
    return section


def quantization_record(graph: QuantizedGraph, budget: BudgetResult | None = None) -> dict[str, Any]:
    """What the manifest says about the Q/DQ graph: settings, which layers are INT8, which stayed float
    (and, with the accuracy budget, why each did, what it costs and the search record)."""
    record = {
        "config": graph.calibration.config.to_dict(),
        "layers_total": len(graph.layers),
        "layers_int8": len(graph.quantized),
        "kept_float": list(graph.kept_float),
        "layer_kinds": {k: {"int8": a, "total": b} for k, (a, b) in graph.layer_kinds().items()},
        "summary_line": graph.one_line(),
        # which CPUs give correct INT8 results with these weights (vitedge.core.cpu, checked at load)
        "weight_range": graph.calibration.config.weight_range,
        "cpu_requirement": CPU_REQUIREMENT[graph.calibration.config.weight_range],
    }
    if graph.small_gemms:  # float by the profile's float_small_gemms (NVIDIA ModelOpt's rule), each with its shape
        record["small_gemms"] = {"rule": SMALL_GEMM_SOURCE, "float": dict(graph.small_gemms)}
        record["summary_line"] += f"; {len(graph.small_gemms)} small GEMM(s) float as NVIDIA ModelOpt keeps them"
    if budget is not None:
        rec = budget.to_dict()
        record["kept_float_detail"] = rec["layer_costs"]
        record["budget"] = rec
        if budget.returned:
            record["summary_line"] += f"; {len(budget.returned)} returned to float by the accuracy budget"
    return record


def _safe_versions(backend: Backend) -> dict[str, str]:
    try:
        return backend.versions()
    except Exception:
        return {}


def _input_section(qdq: Path, spec: ModelSpec) -> InputSection:
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


def _summary(bundle: Path, artifact: BuiltArtifact, report: ValidationReport | None) -> BuildSummary:
    size = (bundle / artifact.model).stat().st_size if (bundle / artifact.model).exists() else None
    if size is not None and (bundle / (artifact.model + ".data")).is_file():  # ONNX external data (graphs past 2 GB)
        size += (bundle / (artifact.model + ".data")).stat().st_size
    for extra in artifact.extra_files:
        if extra.endswith(".bin") and extra.startswith(Path(artifact.model).stem) and (bundle / extra).exists():
            size = (size or 0) + (bundle / extra).stat().st_size
    if report is None:
        return BuildSummary(artifact.model, size)
    acc = report.accuracy
    return BuildSummary(artifact.model, size, top1_fp32=acc.fp32_top1, top1_int8=acc.int8_top1, agreement=acc.top1_agreement,
                        embedding_cosine_mean=acc.embedding_cosine_mean, embedding_cosine_low=acc.embedding_cosine_low,
                        speedup=report.speedup, fp32_ms=report.latency.p50_ms("fp32"), int8_ms=report.latency.p50_ms("int8"),
                        failures=[r.detail for r in report.gate if not r.passed], warnings=acc.warnings)
