"""The old name of `vitedge.datasources`, kept so that code written against it still runs.

`vitedge.calibration.sources.open_source` was the documented way to open a data folder.
The package was renamed because it serves validation as much as calibration; new code
imports `vitedge.datasources`. Nothing else lives here.
"""
