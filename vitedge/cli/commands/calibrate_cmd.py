"""`vitedge calibrate MODEL --calib DATA [-o model.int8.onnx]`: statistics (cached) and the Q/DQ graph."""

from __future__ import annotations

from pathlib import Path

import click

from vitedge.app.calibrate import CalibrateRequest, run_calibrate
from vitedge.app.overrides import QuantOverrides
from vitedge.cli.options import (
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
from vitedge.core.errors import UsageError
from vitedge.files.lock import output_locks
from vitedge.files.outputs import check_output


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

    config = QuantOverrides.from_flags(method=method, percentile=percentile, smoothquant_alpha=smoothquant_alpha, no_smoothquant=no_smoothquant,
                                       quantize_attention=quantize_attention, weight_range=weight_range).config()
    if out is not None:
        if out.suffix.lower() != ".onnx":
            raise UsageError(f"-o/--out should name an .onnx file, got {out}")
        click.get_current_context().with_resource(output_locks([out]))  # a second writer of -o: refused now, not after calibrating
        check_output(out, "qdq-onnx", force=force, inputs=(Path(model), Path(calib), cache_dir))  # the one replace rule
    request = CalibrateRequest(model, Path(calib), out, intake, config, calib_size=calib_size, seed=seed, keep_float=keep_float,
                               cache_dir=cache_dir, quiet=quiet)
    run_calibrate(request, click.echo)
