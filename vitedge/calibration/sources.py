"""The old import path of `vitedge.datasources.sources` (see `vitedge/calibration/__init__.py`)."""

from vitedge.datasources.sources import open_source

__all__ = ["open_source"]
