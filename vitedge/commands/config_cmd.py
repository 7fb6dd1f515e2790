"""`vitedge config`: which project config applies here and what it sets."""

from __future__ import annotations

from pathlib import Path

import click

from vitedge.cli_options import CheckedPath
from vitedge.errors import UsageError
from vitedge.project_config import (
    CONFIG_NAME,
    Setting,
    find_config,
    format_settings,
    load_config,
)


@click.command("config")
@click.option("--config", "config_path", type=CheckedPath(path_type=Path), default=None, metavar="FILE",
              help="Check this file instead of the one found from the working directory upward.")
def command(config_path) -> None:
    """Find the project config (vitedge.toml, or [tool.vitedge] in pyproject.toml, from the working
    directory upward), check it strictly and print each setting with its resolved value.
    `vitedge build --dry-run` shows how flags and defaults combine with it."""

    found = config_path or find_config()
    if found is None:
        raise UsageError(f"no {CONFIG_NAME} (or [tool.vitedge] in pyproject.toml) from {Path.cwd()} upward; "
                         "`vitedge init MODEL` writes one")
    config = load_config(found)
    settings = [Setting(config.keys[p], v, "") for p, v in config.values.items()]
    for line in format_settings(settings, config):
        click.echo(line.rstrip())
