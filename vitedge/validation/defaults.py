"""Validation defaults shared by the command line and the code that validates: one source each.

Plain constants, no imports: the commands read them when they are declared (at `vitedge --help`).
"""

from __future__ import annotations

# Inputs (the first N of the validation data) per-layer sensitivity runs on: `vitedge validate
# --sensitivity-samples`, the bundle validation and the accuracy budget's layer ranking.
DEFAULT_SENSITIVITY_SAMPLES = 64

# Least timed seconds per model and batch size before a latency median may be called stable
# (`vitedge validate --latency-seconds`, vitedge.validation.latency.LatencySettings).
DEFAULT_LATENCY_SECONDS = 1.0

# `vitedge compare`: most INT8 median latency growth per batch size (a fraction) and most top-1
# points lost before a change counts as a regression.
DEFAULT_MAX_LATENCY_REGRESSION = 0.10
DEFAULT_MAX_ACCURACY_REGRESSION = 0.2
