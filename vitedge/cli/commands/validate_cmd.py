"""`vitedge validate BUNDLE --data LABELLED_SET`: prove a bundle still keeps FP32's accuracy and speed."""

from __future__ import annotations

import os
from pathlib import Path

import click
from click.core import ParameterSource

from vitedge.core import limits
from vitedge.app.validate import ValidateOutcome, ValidateRequest, run_validations
from vitedge.cli.options import (
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
from vitedge.cli.commands.embedding_flags import embedding_gate_flags, embedding_overrides, noise_gate_flags, noise_overrides
from vitedge.core.errors import GateFailure, UsageError
from vitedge.files.lock import output_locks
from vitedge.files.outputs import check_output
from vitedge.targets.profiles import ThresholdOverrides, Thresholds
from vitedge.cli.project_config import config_bundles, with_project_config
from vitedge.core.ui import StageLog
from vitedge.validation.defaults import (
    DEFAULT_LATENCY_SECONDS,
    DEFAULT_SENSITIVITY_SAMPLES,
)
from vitedge.validation.document import ValidationReport
from vitedge.validation.reference_cache import ReferenceCacheSettings
from vitedge.validation.report import check_report_dir


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
    overrides = _threshold_overrides(ctx, no_latency, gate_flags, max_top1_drop=max_top1_drop, min_agreement=min_agreement,
                                     min_speedup=min_speedup, max_p99_ms=max_p99_ms)
    # no BUNDLE: every bundle the project config's build writes
    bundles = [Path(bundle)] if bundle is not None else config_bundles(ctx.meta.get("vitedge.cli.project_config"))
    dirs = _report_dirs(ctx, bundles, report_dir, data)
    cache = ReferenceCacheSettings(enabled=reference_cache, root=cache_dir, int8_outputs=int8_cache)
    requests = [ValidateRequest(b, dirs[b], data, data_size, seed, overrides, measure_speed=not no_latency,
                                latency_seconds=latency_seconds, sensitivity=sensitivity, sensitivity_samples=sensitivity_samples,
                                threads=threads, workers=workers, ray_address=ray_address, reference_cache=cache,
                                config=ctx.meta.get("vitedge.config_record"), progress=not quiet) for b in bundles]
    failed = []
    for outcome in run_validations(requests, lambda _request: StageLog(quiet=quiet)):
        print_outcome(outcome, quiet)
        if not outcome.validation.passed:
            failed.append(outcome.validation.failure_line())
    if failed:
        raise GateFailure("; ".join(failed))


def _threshold_overrides(ctx: click.Context, no_latency: bool, gate_flags: dict[str, object],
                         **flags: float | None) -> ThresholdOverrides:
    """The threshold flags over the profile's; bad values and --no-latency with a speed limit: exit 2 before any work."""
    overrides = {**flags, **embedding_overrides(gate_flags), **noise_overrides(gate_flags)}
    Thresholds(**{k: v for k, v in overrides.items() if v is not None})
    speed_flags = [k for k in ("min_speedup", "max_p99_ms") if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE]
    if no_latency and speed_flags:
        raise UsageError("--no-latency cannot check --min-speedup or --max-p99-ms; drop one")
    return ThresholdOverrides.of(overrides)


def _report_dirs(ctx: click.Context, bundles: list[Path], report_dir: Path | None, data: Path | None) -> dict[Path, Path]:
    """Each bundle's report folder, checked and locked for the command's run."""
    dirs = {b: (b / "report" if report_dir is None else Path(report_dir) / (b.name if len(bundles) > 1 else "")) for b in bundles}
    for d in dirs.values():
        check_report_dir(d)
    # two validations writing one report folder: the second is refused first, before the replace rule looks at what
    # the other is writing (a missing bundle is not created for its lock)
    ctx.with_resource(output_locks([d for d in dirs.values() if report_dir is not None or d.parent.is_dir()], flag="--report-dir"))
    for b, d in dirs.items():
        # the one replace rule: a report folder vitedge wrote (or a new or empty one), never the data, the bundle or
        # a folder holding it; outside BUNDLE/report, never inside the bundle (its files are hashed)
        own = Path(os.path.abspath(d)) == Path(os.path.abspath(b / "report"))
        check_output(d, "report", force=True, inputs=(data,), reads=() if own else (b,), flag="--report-dir")
    return dirs


def print_outcome(outcome: ValidateOutcome, quiet: bool) -> None:
    """FP32's warnings, the notes, the figures and the verdict of one bundle."""
    for w in outcome.validation.report.accuracy.warnings:
        click.echo(f"vitedge: WARNING: {w}", err=True)
    log = StageLog(quiet=quiet)
    for note in outcome.notes:
        log.info(note)
    report = outcome.validation.report
    if not quiet:
        for line in figure_lines(report):
            click.echo(line)
    click.echo(f"{'PASS' if report.passed else 'FAIL'}: {report.target.name}; reports in {outcome.written[0].parent}/ "
               f"({', '.join(p.name for p in outcome.written)})")
    if outcome.data_role == "calibration":
        click.echo("note: validated on the build's calibration images, not held-out data (pass --data for a real accuracy figure)")


def figure_lines(report: ValidationReport) -> list[str]:
    """The terminal summary of one validation: accuracy, latency per batch size, size and memory, sensitivity, the gate."""
    acc, lat, art = report.accuracy, report.latency, report.artifact
    lines = []
    if acc.fp32_top1 is not None:
        lines.append(f"top-1       FP32 {100 * acc.fp32_top1:.2f}%  INT8 {100 * acc.int8_top1:.2f}%  "
                     f"(top-5 {100 * acc.fp32_top5:.2f}% / {100 * acc.int8_top5:.2f}%)")
    if acc.top1_agreement is not None:
        lines.append(f"agreement   {100 * acc.top1_agreement:.2f}% with FP32")
    if acc.logit_cosine_mean is not None:
        lines.append(f"logits      cosine {acc.logit_cosine_mean:.5f}, |err| mean {acc.logit_abs_error_mean:.4f} "
                     f"max {acc.logit_abs_error_max:.4f}, KL {acc.softmax_kl_mean:.2e}")
    if acc.embedding_cosine_mean is not None:
        lines.append(f"embedding   cosine mean {acc.embedding_cosine_mean:.5f}, worst 1% {acc.embedding_cosine_worst1pct:.5f}")
    for b, s in lat.int8.items():
        f = lat.p50_ms("fp32", b) or 0
        lines.append(f"batch {b:<5} FP32 p50 {f:.3f} ms  INT8 p50 {s.p50_ms:.3f} / p90 {s.p90_ms:.3f} / "
                     f"p99 {s.p99_ms:.3f} ms  {s.throughput:.1f} img/s  {lat.speedup.get(b, 0):.2f}x")
    lines.append(f"size        {art.bytes / 1e6:.2f} MB (FP32 {art.reference_bytes / 1e6:.2f} MB); "
                 f"peak RSS {(report.memory.peak_rss_bytes or 0) / 1e6:.0f} MB")
    if report.sensitivity is not None and report.sensitivity.layers:
        lines.append("sensitive   " + ", ".join(f"{r['name']} ({r['kind']})" for r in report.sensitivity.layers[:3]))
    lines += [f"{row.status.upper():<5} {row.name:<14} {row.detail}" for row in report.gate]
    return lines
