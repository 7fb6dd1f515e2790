"""`vitedge targets [--json]`: the profiles and families, whether each can build here, and
what to install if not (each hint once, below the table)."""

from __future__ import annotations

import json

import click

from vitedge.targets.table import collect, render_text


@click.command("targets")
@click.option("--json", "as_json", is_flag=True, help="One JSON document (targets, families, install hints) for scripts.")
def command(as_json: bool) -> None:
    """List target profiles and families, and whether each can build and run on this machine."""

    listing = collect()
    if as_json:
        click.echo(json.dumps(listing.to_dict(), indent=2))
    else:
        click.echo(render_text(listing))
