"""`vitedge init MODEL`: write a commented starter vitedge.toml from what `inspect` understood."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click

from vitedge.cli.options import MODEL_OPTION_NAMES, CheckedPath, with_intake
from vitedge.core.errors import UsageError
from vitedge.files.atomic import atomic_write_path
from vitedge.models.intake import load_model
from vitedge.files.lock import output_locks
from vitedge.targets.profiles import list_profiles, resolve_profile_path
from vitedge.files.outputs import check_output
from vitedge.cli.project_config import check_config_text
from vitedge.cli.project_init import config_target, render_config


@click.command("init")
@click.argument("model", type=CheckedPath(path_type=Path))
@click.option("--calib", type=CheckedPath(path_type=Path, exists=True), default=None, help="Calibration data to write into the config.")
@click.option("--val", type=CheckedPath(path_type=Path, exists=True), default=None, help="Validation data to write into the config.")
@click.option("-t", "--target", "targets", multiple=True, metavar="NAME", help="Targets to write (default: onnx).")
@click.option("--output", default="build", show_default=True, help="Bundle folder to write into the config.")
@click.option("-o", "--out", "config_out", type=CheckedPath(path_type=Path), default=None,
              help="Where to write the config (default: ./vitedge.toml).")
@click.option("--force", is_flag=True, help="Replace a config `vitedge init` wrote earlier (never pyproject.toml, the model, or a file it did not write).")
@with_intake
def command(model, calib, val, targets, output, config_out, force, intake) -> None:
    """Write a commented starter vitedge.toml for MODEL: the model, what vitedge understood of it
    (family, size, heads, classes, preprocessing), calibration and validation data, targets,
    output folder and the thresholds table. Model flags given here are written too."""

    path = config_target(config_out)
    click.get_current_context().with_resource(output_locks([path]))  # a second init into the same file: refused now
    # the one replace rule: never the model or data, and --force replaces only a config `vitedge init` wrote
    check_output(path, "config", force=force, inputs=(Path(model), calib, val))
    for t in targets:
        resolve_profile_path(t)  # an unknown target: exit 2 before loading the model
    loaded = load_model(model, intake)
    flags = {k: v for k, v in dataclasses.asdict(intake).items() if k in MODEL_OPTION_NAMES}
    text = render_config(loaded, path, calib=calib, val=val, targets=tuple(targets), output=output, model_flags=flags,
                         known_targets=[p.stem for p in list_profiles()])
    check_config_text(text, path)  # what init writes, build reads: checked before it replaces anything
    with atomic_write_path(path) as tmp:
        tmp.write_text(text)
    click.echo(f"wrote {path}" + ("" if calib else "; set calib in it (or pass --calib) before `vitedge build`"))
