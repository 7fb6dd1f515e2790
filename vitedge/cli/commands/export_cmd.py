"""`vitedge export MODEL -o model.onnx`: FP32 ONNX, checked against PyTorch."""

from __future__ import annotations

from pathlib import Path

import click

from vitedge.cli.options import CheckedPath, bounded_int, with_intake
from vitedge.core.errors import UsageError
from vitedge.models.export import ExportOptions, export_onnx
from vitedge.models.intake import load_model
from vitedge.files.lock import output_locks
from vitedge.files.outputs import check_output


@click.command("export")
@click.argument("model", type=CheckedPath(path_type=str))
@click.option("-o", "--out", "out", type=CheckedPath(path_type=Path), required=True, help="Where to write the FP32 ONNX graph.")
@with_intake
@click.option("--opset", type=bounded_int(1, 100), default=17, show_default=True, help="ONNX opset (17 or newer).")
@click.option("--bake-preprocess", is_flag=True, help="The graph takes uint8 NHWC frames (RGB; grey for a 1-channel model) and normalises them itself.")
@click.option("--force", is_flag=True, help="Replace an existing FP32 graph vitedge exported (never the model, nor a file vitedge did not write).")
def command(model: str, out: Path, intake, opset: int, bake_preprocess: bool, force: bool) -> None:
    """Export MODEL to an FP32 ONNX graph (dynamic batch) and prove ONNX Runtime
    computes what PyTorch computes; the export fails with the measured difference
    if it exceeds the tolerance, and when an image's output changes with the
    other images in its batch."""

    if out.suffix.lower() != ".onnx":
        raise UsageError(f"-o/--out should name an .onnx file, got {out}")
    click.get_current_context().with_resource(output_locks([out]))  # a second writer of -o: refused now, not after the export
    check_output(out, "fp32-onnx", force=force, inputs=(Path(model),))  # the one replace rule (vitedge/files/outputs.py)
    options = ExportOptions(opset=opset, bake_preprocess=bake_preprocess, batch_check=True)
    loaded = load_model(model, intake)
    result = export_onnx(loaded, out, options)
    click.echo(result.one_line())
    if result.batch_check is not None:
        click.echo(result.batch_check.one_line())
