"""`vitedge export-config --for deepstream|triton BUNDLE [-o OUT]`: camera-app configs for any bundle."""

from __future__ import annotations

from pathlib import Path

import click

from vitedge.backends import backend_facts
from vitedge.cli.options import CheckedPath
from vitedge.camera_apps.exports import export_config
from vitedge.files.lock import output_locks


@click.command("export-config")
@click.argument("bundle", type=CheckedPath(path_type=Path))
@click.option("--for", "kind", type=click.Choice(["deepstream", "triton"]), required=True,
              help="deepstream: an nvinfer config (config_infer.txt, labels); triton: a model repository (<name>/config.pbtxt, <name>/1/<artifact>).")
@click.option("-o", "--out", type=CheckedPath(path_type=Path), default=None,
              help="Folder to write (outside the bundle). Default: BUNDLE-deepstream or BUNDLE-triton beside the bundle.")
@click.option("--force", is_flag=True, help="Replace an existing output folder.")
def command(bundle: Path, kind: str, out: Path | None, force: bool) -> None:
    """Write the config a camera app needs to run BUNDLE with the preprocessing it was validated with:
    DeepStream's nvinfer (a primary classifier, or tensor output for embedding models) or a Triton
    model repository for the bundle's backend (TensorRT plan, ONNX Runtime, OpenVINO).
    See docs/camera-apps.md; neither is run on a device by vitedge."""

    out = out or bundle.with_name(f"{bundle.name}-{kind}")
    click.get_current_context().with_resource(output_locks([out]))  # a second writer of OUT: refused before any work
    files = export_config(kind, bundle, out, facts_of=backend_facts, force=force)
    click.echo(f"wrote {out}/: " + ", ".join(files))
