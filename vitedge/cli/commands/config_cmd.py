"""`vitedge config`: which project config applies here and what it sets."""

from __future__ import annotations

from pathlib import Path

import click

from vitedge.cli.options import CheckedPath
from vitedge.core.errors import UsageError
from vitedge.cli.project_config import (
    CONFIG_NAME,
    Setting,
    choose_config,
    format_settings,
    ignored_warning,
    is_sensitive,
    load_config,
)


@click.command("config")
@click.option("--config", "config_path", type=CheckedPath(path_type=Path), default=None, metavar="FILE",
              help="Check this file instead of the one found from the working directory upward.")
def command(config_path) -> None:
    """Find the project config (vitedge.toml, or [tool.vitedge] in pyproject.toml, from the working
    directory upward), check it strictly and print each setting with its resolved value.
    `vitedge build --dry-run` shows how flags and defaults combine with it."""

    choice = choose_config(config_path)
    if choice.ignored is not None:
        click.echo(ignored_warning(choice), err=True)
    if choice.path is None:
        raise UsageError(f"no {CONFIG_NAME} (or [tool.vitedge] in pyproject.toml) vitedge would read from {Path.cwd()} upward "
                         "(to the repository root or $HOME); `vitedge init MODEL` writes one")
    config = load_config(choice.path)
    settings = [Setting(config.keys[p], v, "run code or loosen a gate" if is_sensitive(p, v) else "") for p, v in config.values.items()]
    lines = format_settings(settings, config)
    click.echo(f"{lines[0]} ({choice.how})")
    for line in lines[1:]:
        click.echo(line.rstrip())
