"""`vitedge validate BUNDLE --data LABELLED_SET`: prove a bundle still keeps FP32's accuracy and speed."""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.core import ParameterSource

from vitedge import limits
from vitedge.datasources.sources import open_source
from vitedge.datasources.split import validation_part
from vitedge.cli_options import (
    CheckedPath,
    bounded_float,
    bounded_int,
    cache_dir_option,
    int8_cache_option,
    reference_cache_option,
    seed_option,
    threads_type,
    threshold_options,
)
from vitedge.commands.embedding_flags import embedding_gate_flags, embedding_overrides, noise_gate_flags, noise_overrides
from vitedge.distributed.ray_validate import (
    ray_session,
    scale_from_flags,
    sharded_validator,
)
from vitedge.errors import CalibrationError, DataError, GateFailure, UsageError
from vitedge.manifest import verify_bundle
from vitedge.outlock import output_locks
from vitedge.outputs import check_output
from vitedge.profiles import Thresholds
from vitedge.project_config import config_bundles, with_project_config
from vitedge.ui import StageLog
from vitedge.validation.bundle import ValidateOptions, validate_bundle
from vitedge.validation.data_record import DataRecord, open_recorded
from vitedge.validation.defaults import (
    DEFAULT_LATENCY_SECONDS,
    DEFAULT_SENSITIVITY_SAMPLES,
)
from vitedge.validation.latency import LatencySettings
from vitedge.validation.reference_cache import ReferenceCacheSettings
from vitedge.validation.report import append_step_summary, check_report_dir


@click.command("validate")
@with_project_config()
@click.argument("bundle", type=CheckedPath(path_type=Path), required=False)
@click.option("--data", type=CheckedPath(path_type=Path), default=None,
              help="Labelled validation data: image folder (one subfolder per class), .npy/.npz, or video. "
                   "Default: exactly what the build validated on, if it still exists unchanged. "
                   "A folder holding calib/ + val/ means its val/.")
@click.option("--data-size", type=bounded_int(1, limits.MAX_ITEMS), default=None, help="Use a seeded subset of N items of --data.")
@seed_option("Seed of the --data-size subset.")
@click.option("--report-dir", type=CheckedPath(path_type=Path), default=None,
              help="Where to write validation.json, summary.md, junit.xml and plots. Default: BUNDLE/report/.")
@threshold_options
@click.option("--no-latency", is_flag=True, help="Skip latency measurement (and the speed thresholds).")
@click.option("--latency-seconds", type=bounded_float(0.0, limits.MAX_LATENCY_SECONDS, lo_open=True), default=DEFAULT_LATENCY_SECONDS, show_default=True,
              help="Least timed seconds per model and batch size before the median may be called stable.")
@click.option("--sensitivity/--no-sensitivity", default=True, show_default=True,
              help="Per-layer sensitivity: each INT8 layer alone vs FP32, on ONNX Runtime.")
@click.option("--sensitivity-samples", type=bounded_int(1, limits.MAX_SENSITIVITY_SAMPLES), default=DEFAULT_SENSITIVITY_SAMPLES, show_default=True,
              help="Inputs the sensitivity runs on (the first N of the data).")
@click.option("--threads", type=threads_type(), default=None, help="Runtime threads (default: the profile's).")
@embedding_gate_flags
@noise_gate_flags
@click.option("--workers", type=bounded_int(1, limits.MAX_WORKERS), default=None,
              help="Shard the data over N Ray workers on a local Ray started for the run (needs vitedge[ray]); same metrics.")
@click.option("--ray-address", default=None, metavar="ADDR",
              help="Shard the data over an existing Ray cluster (e.g. auto, ray://head:10001); see docs/scale.md.")
@cache_dir_option
@reference_cache_option()
@int8_cache_option()
@click.option("-q", "--quiet", is_flag=True, help="Only the verdict and the report paths.")
def command(bundle, data, data_size, seed, report_dir, max_top1_drop, min_agreement, min_speedup, max_p99_ms, no_latency,
            latency_seconds, sensitivity, sensitivity_samples, threads, workers, ray_address, cache_dir, reference_cache, int8_cache, quiet,
            **gate_flags) -> None:
    """Validate BUNDLE's artifact against its FP32 reference on the same runtime and the same inputs.

    Verifies the bundle's file hashes first, then measures accuracy (top-1/top-5 with labels,
    agreement, logit error, KL; embedding cosine for encoders), latency (p50/p90/p99,
    throughput, speedup) and memory, applies the gate of the bundle's profile (overridable
    with the threshold flags) and writes the reports.

    Without --data: exactly the data the build validated on (recorded in manifest.json).
    Without BUNDLE: every bundle the project config's build writes (vitedge.toml).

    Exit code 0 when every threshold holds, 1 when one fails, 2 for bad input."""


    ctx = click.get_current_context()
    overrides = {"max_top1_drop": max_top1_drop, "min_agreement": min_agreement, "min_speedup": min_speedup, "max_p99_ms": max_p99_ms,
                 **embedding_overrides(gate_flags), **noise_overrides(gate_flags)}
    Thresholds(**{k: v for k, v in overrides.items() if v is not None})  # bad values: exit 2 before any work
    speed_flags = [k for k in ("min_speedup", "max_p99_ms") if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE]
    if no_latency and speed_flags:
        raise UsageError("--no-latency cannot check --min-speedup or --max-p99-ms; drop one")
    # no BUNDLE: every bundle the project config's build writes
    bundles = [Path(bundle)] if bundle is not None else config_bundles(ctx.meta.get("vitedge.project_config"))
    dirs = {b: (b / "report" if report_dir is None else Path(report_dir) / (b.name if len(bundles) > 1 else "")) for b in bundles}
    for b, d in dirs.items():
        check_report_dir(d)
        # the one replace rule: a report folder vitedge wrote (or a new or empty one), never the data, the bundle or
        # a folder holding it; outside BUNDLE/report, never inside the bundle (its files are hashed)
        own = Path(os.path.abspath(d)) == Path(os.path.abspath(b / "report"))
        check_output(d, "report", force=True, inputs=(data,), reads=() if own else (b,), flag="--report-dir")
    # two validations writing one report folder: the second is refused now (a missing bundle is not created for its lock)
    ctx.with_resource(output_locks([d for d in dirs.values() if report_dir is not None or d.parent.is_dir()], flag="--report-dir"))
    failed = []
    scale = scale_from_flags(workers, ray_address)
    with ray_session(scale):
        for b in bundles:
            result = validate_one(b, dirs[b], data, data_size, seed, overrides, no_latency, latency_seconds, sensitivity,
                                  sensitivity_samples, threads, quiet, scale=scale,
                                  reference=ReferenceCacheSettings(enabled=reference_cache, root=cache_dir,
                                                                     int8_outputs=int8_cache),
                                  config=ctx.meta.get("vitedge.config_record"))
            if not result.passed:
                failed.append(result.failure_line())
    if failed:
        raise GateFailure("; ".join(failed))


def validate_one(bundle: Path, report_dir: Path, data, data_size, seed, overrides, no_latency, latency_seconds, sensitivity,
                 sensitivity_samples, threads, quiet, scale=None, reference: ReferenceCacheSettings | None = None,
                 config: dict | None = None):
    """Validate one bundle, write its reports and print its verdict; the BundleValidation."""

    log = StageLog(quiet=quiet)
    with log.stage("verify", str(bundle)):
        manifest = verify_bundle(bundle)
        log.info(f"{len(manifest.files)} files match manifest.json; target {manifest.target.get('name')} "
                 f"({manifest.target.get('backend')}), model {manifest.model.get('source')}")
    spec = manifest.spec
    role = "validation"
    subset = (data_size, seed)  # how the items were picked: workers re-open exactly these
    if data is None:
        record = DataRecord.from_manifest(manifest)
        if record is None:
            raise UsageError("pass --data LABELLED_SET (an image folder with one subfolder per class, or a .npz with images "
                             "and labels); the bundle records no validation set")
        if data_size is not None:
            raise UsageError("--data-size takes a subset of --data; without --data the build's own set is used as it was")
        role = record.role
        subset = (record.subset_size, record.seed)
        log.info(f"no --data given: re-validating on {record.describe()}")
        with log.stage("data", record.path):
            source = open_recorded(record, spec, progress=not quiet)
            log.info(source.summary.one_line())
    else:
        with log.stage("data", str(data)):
            data, split = validation_part(data, spec.class_names)
            if split:
                log.info(split.one_line())
            try:
                source = open_source_for(data, spec, data_size, seed, progress=not quiet)
            except CalibrationError as err:
                raise DataError(f"--data: {err}") from None
            log.info(source.summary.one_line())
    options = ValidateOptions(
        data_role=role, threshold_overrides=overrides, measure_speed=not no_latency,
        latency=LatencySettings.for_budget(latency_seconds),
        sensitivity=sensitivity, sensitivity_samples=sensitivity_samples, threads=threads, producer="vitedge validate",
        reference_cache=reference if reference is not None else ReferenceCacheSettings(),
        config=config,
    )
    with log.stage("validate", f"{manifest.target.get('name')}: INT8 vs FP32 on {len(source)} inputs, same runtime"):
        validator = None
        if scale is not None:

            validator = sharded_validator(scale, bundle, source, *subset)
        result = validate_bundle(bundle, manifest, source, options, log=log, bundle_label=str(bundle),
                                 **({"artifact_validator": validator} if validator else {}))
        if validator is not None:
            validator.annotate(result.document)
    written, notes = result.write(report_dir)
    for w in (result.document.get("accuracy") or {}).get("warnings") or ():
        click.echo(f"vitedge: WARNING: {w}", err=True)
    for note in notes:
        log.info(note)
    warning = append_step_summary(result.markdown([p.name for p in written if p.suffix == ".png"]))
    if warning:
        log.info(warning)
    print_validation(result, written, quiet)
    if role == "calibration":
        click.echo("note: validated on the build's calibration images, not held-out data (pass --data for a real accuracy figure)")
    return result


def open_source_for(data: Path, spec, data_size, seed, *, progress: bool):

    return open_source(data, spec.preprocess, limit=data_size, seed=seed, class_names=spec.class_names, progress=progress)


def print_validation(result, written, quiet: bool) -> None:
    doc = result.document
    if not quiet:
        acc, lat = doc["accuracy"], doc["latency"]
        if acc.get("fp32_top1") is not None:
            click.echo(f"top-1       FP32 {100 * acc['fp32_top1']:.2f}%  INT8 {100 * acc['int8_top1']:.2f}%  "
                       f"(top-5 {100 * acc['fp32_top5']:.2f}% / {100 * acc['int8_top5']:.2f}%)")
        if acc.get("top1_agreement") is not None:
            click.echo(f"agreement   {100 * acc['top1_agreement']:.2f}% with FP32")
        if acc.get("logit_cosine_mean") is not None:
            click.echo(f"logits      cosine {acc['logit_cosine_mean']:.5f}, |err| mean {acc['logit_abs_error_mean']:.4f} "
                       f"max {acc['logit_abs_error_max']:.4f}, KL {acc['softmax_kl_mean']:.2e}")
        if acc.get("embedding_cosine_mean") is not None:
            click.echo(f"embedding   cosine mean {acc['embedding_cosine_mean']:.5f}, worst 1% {acc['embedding_cosine_worst1pct']:.5f}")
        for b, s in lat.get("int8", {}).items():
            f = lat["fp32"].get(b, {})
            click.echo(f"batch {b:<5} FP32 p50 {f.get('p50_ms', 0):.3f} ms  INT8 p50 {s['p50_ms']:.3f} / p90 {s['p90_ms']:.3f} / "
                       f"p99 {s['p99_ms']:.3f} ms  {s['throughput']:.1f} img/s  {lat['speedup'].get(b, 0):.2f}x")
        art, mem = doc["artifact"], doc["memory"]
        click.echo(f"size        {art['bytes'] / 1e6:.2f} MB (FP32 {art['reference_bytes'] / 1e6:.2f} MB); "
                   f"peak RSS {(mem.get('peak_rss_bytes') or 0) / 1e6:.0f} MB")
        sens = doc.get("sensitivity")
        if sens and sens.get("layers"):
            top = ", ".join(f"{r['name']} ({r['kind']})" for r in sens["layers"][:3])
            click.echo(f"sensitive   {top}")
        for row in doc["gate"]:
            click.echo(f"{row['status'].upper():<5} {row['name']:<14} {row['detail']}")
    click.echo(f"{'PASS' if doc['passed'] else 'FAIL'}: {doc['target']['name']}; reports in {written[0].parent}/ "
               f"({', '.join(p.name for p in written)})")
