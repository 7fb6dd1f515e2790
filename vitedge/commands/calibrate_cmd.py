"""`vitedge calibrate MODEL --calib DATA [-o model.int8.onnx]`: statistics (cached) and the Q/DQ graph."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from vitedge.datasources.sources import open_source
from vitedge.datasources.split import calibration_part
from vitedge.cli_options import (
    CheckedPath,
    cache_dir_option,
    calib_size_option,
    calibration_method_option,
    keep_float_option,
    percentile_option,
    quantize_attention_option,
    seed_option,
    smoothquant_options,
    weight_range_option,
    with_intake,
)
from vitedge.errors import UsageError
from vitedge.export import ExportOptions, export_onnx
from vitedge.models.intake import load_model
from vitedge.outlock import output_locks
from vitedge.outputs import check_output, work_prefix
from vitedge.quantize import QuantConfig, build_qdq, calibrate


@click.command("calibrate")
@click.argument("model", type=CheckedPath(path_type=str))
@click.option("--calib", type=CheckedPath(path_type=str), required=True, help="Calibration data: image folder, .npy/.npz, or a video file.")
@click.option("-o", "--out", "out", type=CheckedPath(path_type=Path), default=None, help="Write the INT8 Q/DQ ONNX graph here.")
@click.option("--force", is_flag=True, help="Replace an existing Q/DQ graph vitedge wrote (never the model or data, nor a file vitedge did not write).")
@with_intake
@calib_size_option("Use a seeded subset of N calibration items (default: all).")
@seed_option("Seed of the --calib-size subset.")
@calibration_method_option("How activation ranges are chosen [default: {method}].")
@percentile_option("Percentile of |x| kept; implies --method percentile [default: {percentile}].")
@smoothquant_options("SmoothQuant migration strength in [0, 1] [default: {smoothquant_alpha}].")
@quantize_attention_option("Quantize the Q.K^T and P.V matmuls [default: {quantize_attention}].")
@weight_range_option("INT8 weight range [default: {weight_range}, correct on every x86 CPU; full: VNNI/AMX CPUs and GPUs only].")
@keep_float_option
@cache_dir_option
@click.option("-q", "--quiet", is_flag=True, help="No progress bars.")
def command(model: str, calib: str, out: Path | None, force: bool, intake, calib_size: int | None, seed: int, method: str | None,
            percentile: float | None, smoothquant_alpha: float | None, no_smoothquant: bool, quantize_attention: bool | None,
            weight_range: str | None, keep_float: tuple[str, ...], cache_dir: Path | None, quiet: bool) -> None:
    """Calibrate MODEL on real images and, with -o, write its INT8 Q/DQ ONNX graph.

    Statistics are cached (keyed by the FP32 graph, the data, preprocessing and
    settings), so running it again with the same inputs does no forward pass."""


    if no_smoothquant and smoothquant_alpha is not None:
        raise UsageError("--no-smoothquant and --smoothquant-alpha contradict each other; pass one")
    if out is not None:
        if out.suffix.lower() != ".onnx":
            raise UsageError(f"-o/--out should name an .onnx file, got {out}")
        check_output(out, "qdq-onnx", force=force, inputs=(Path(model), Path(calib), cache_dir))  # the one replace rule
    settings: dict = {}
    if method is not None:
        settings["method"] = method
    if percentile is not None:
        if (method or "percentile") != "percentile":
            raise UsageError(f"--percentile goes with --method percentile, not --method {method}")
        settings["method"] = "percentile"
        settings["percentile"] = percentile
    if smoothquant_alpha is not None:
        settings["smoothquant_alpha"] = smoothquant_alpha
    if no_smoothquant:
        settings["smoothquant_alpha"] = None
    if quantize_attention is not None:
        settings["quantize_attention"] = quantize_attention
    if weight_range is not None:
        settings["weight_range"] = weight_range
    config = QuantConfig(**settings)  # validates: UsageError with the flag's name
    click.get_current_context().with_resource(output_locks([out]))  # a second writer of -o: refused now, not after calibrating

    loaded = load_model(model, intake)
    spec = loaded.spec
    calib_part, split = calibration_part(Path(calib), spec.class_names)
    if split:
        click.echo(split.one_line())
    source = open_source(calib_part, spec.preprocess, limit=calib_size, seed=seed, class_names=spec.class_names, progress=not quiet)
    click.echo(f"calibration data: {source.summary.one_line()}")

    with tempfile.TemporaryDirectory(prefix=work_prefix("calibrate")) as work:
        fp32 = Path(work) / "model.fp32.onnx"
        export_onnx(loaded, fp32, ExportOptions())
        cal = calibrate(fp32, source, config, cache_dir=cache_dir, progress=not quiet)
        graph = build_qdq(cal, keep_float=keep_float) if (out is not None or keep_float) else None
    s = cal.summary
    skipped = sum(s.skipped.values())
    converted = sum(s.converted.values())
    click.echo(f"method: {config.describe()}")
    click.echo(f"items: {s.used} used, {skipped} skipped, {converted} converted; seed {s.seed}; data hash {s.data_hash[:16]}")
    if cal.reused:
        click.echo(f"statistics: reused from the cache ({cal.cache_path}), no forward pass")
    else:
        where = f", cached in {cal.cache_path}" if cal.cache_path else ""
        click.echo(f"statistics: computed, {cal.forward_passes} forward passes in {cal.timings.get('statistics', 0.0):.1f} s{where}")
    if cal.cache_note:
        click.echo(f"note: {cal.cache_note}")
    if graph is not None:
        click.echo(f"layers: {graph.one_line()}")
    if out is not None and graph is not None:
        graph.save(out)
        click.echo(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
