"""`vitedge engine BUNDLE [--val DATA]`: build a TensorRT bundle's engine on the device."""

from __future__ import annotations

from pathlib import Path

import click

from vitedge.cli.options import CheckedPath
from vitedge.app.engine_completion import complete_bundle
from vitedge.core.errors import GateFailure
from vitedge.files.lock import output_locks
from vitedge.files.outputs import check_output
from vitedge.core.ui import StageLog
from vitedge.validation.document import ValidationReport


@click.command("engine")
@click.argument("bundle", type=CheckedPath(path_type=Path))
@click.option("--val", type=CheckedPath(path_type=Path), default=None,
              help="Labelled validation data: validate the engine against its FP32 reference engine here.")
@click.option("--force", is_flag=True, help="Rebuild an engine the bundle already holds (e.g. for this device).")
@click.option("--no-latency", is_flag=True, help="Skip latency measurement (and the speed gate).")
@click.option("--profile", "profile_name", metavar="NAME", default=None,
              help="For a family bundle (--target jetson / nvidia-gpu): the profile to build with, when the device is not recognised.")
@click.option("-q", "--quiet", is_flag=True, help="Only the result line.")
def command(bundle: Path, val: Path | None, force: bool, no_latency: bool, profile_name: str | None, quiet: bool) -> None:
    """Build the TensorRT engine of BUNDLE (written by `vitedge build --target jetson-orin ...`
    where no GPU was) on this device, validate it when --val is given, and complete the
    bundle atomically: the manifest records this device and every file's hash.

    Exit code 0 when built (and the gate holds), 1 when the gate fails, 2 for bad input."""

    click.get_current_context().with_resource(output_locks([bundle], flag="BUNDLE"))  # a second writer of BUNDLE: refused now
    check_output(bundle, "bundle", force=True, inputs=(val,), flag="BUNDLE")  # completed in place: never over its --val data
    log = StageLog(quiet=quiet)
    with log.stage("engine", f"TensorRT engine for {bundle}"):
        result = complete_bundle(bundle, val=val, force=force, measure_speed=not no_latency, log=log.info,
                                 profile_name=profile_name)
    info = result.manifest.backend_info
    device = info.get("device") or {}
    where = f"{device.get('gpu_name')} (compute {device.get('compute_capability')}), TensorRT {device.get('tensorrt')}"
    family = result.manifest.target.family
    if family:
        where += f", profile {family['selected']} of the {family['name']} family"
    if result.passed is None:
        click.echo(f"built {bundle}/model.engine on {where}; not validated (pass --val DATA to check it against FP32)")
    elif result.passed:
        click.echo(f"built and validated {bundle}/model.engine on {where}: every gate holds")
    else:
        failures = [r.detail for r in ValidationReport.from_json(result.manifest.validation).gate if not r.passed]
        raise GateFailure(f"{bundle}/model.engine built on {where} but failed the parity gate: " + "; ".join(failures))
