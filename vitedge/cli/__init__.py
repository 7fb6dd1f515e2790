"""The command line: flags, `vitedge.toml`, and one module per command in `commands/`."""

from vitedge.cli.entry import main

__all__ = ["main"]
