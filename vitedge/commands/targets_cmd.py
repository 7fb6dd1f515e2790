"""`vitedge targets`: the profiles, whether each can build here, and what to install if not."""

from __future__ import annotations

import click


@click.command("targets")
def command() -> None:
    """List target profiles and whether each can build and run on this machine."""
    from rich.console import Console
    from rich.table import Table

    from vitedge.backends import get_backend
    from vitedge.errors import VitedgeError
    from vitedge.profiles import list_profiles, load_profile

    table = Table(show_header=True, header_style="bold")
    for col in ("target", "backend", "batch sizes", "gate", "here"):
        table.add_column(col)
    for path in list_profiles():
        try:
            p = load_profile(str(path))
        except VitedgeError as err:
            table.add_row(path.stem, "?", "", "", f"[red]invalid profile: {err}[/red]")
            continue
        status = get_backend(p.backend).check_environment()
        if status.can_build and status.can_run:
            here = f"[green]builds and runs[/green] ({status.detail})"
        elif status.can_build or getattr(get_backend(p.backend), "builds_without_runtime", False):
            here = f"[yellow]bundle only[/yellow]: {status.detail}" + (f"; to finish: {status.install_hint}" if status.install_hint else "")
        else:
            here = f"[red]cannot build[/red]: {status.detail}" + (f"; install: {status.install_hint}" if status.install_hint else "")
        t = p.thresholds
        gate = f"drop<={t.max_top1_drop:g}pt agree>={t.min_agreement:g} speedup>={t.min_speedup:g}x"
        table.add_row(p.name, p.backend, ",".join(map(str, p.batch_sizes)), gate, here)
    Console().print(table)
