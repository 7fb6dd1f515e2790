"""The accuracy budget's settings: how the search runs (``BudgetSettings``) and the version
its records and cached rankings carry."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vitedge.core.errors import UsageError
from vitedge.validation.defaults import DEFAULT_SENSITIVITY_SAMPLES

BUDGET_VERSION = "1"  # bump when the search or the sensitivity it caches changes meaning
DEFAULT_MAX_EVALS = 12
SCHEDULES = ("doubling", "fixed")


@dataclass(frozen=True, kw_only=True)
class BudgetSettings:
    """How the accuracy-budget search runs.

    enabled              search at all (``--no-fallback`` switches it off)
    max_evals            accuracy evaluations at most, the first (full INT8) one included
    schedule             "doubling" (return 1, 2, 4, ... top-ranked layers) or "fixed"
                         (return ``group`` more each step)
    group                layers per step for schedule="fixed"
    refine               after the first passing group: bisect back to the fewest top-ranked
                         layers, then try re-quantizing each of them (while evaluations last)
    sensitivity_samples  inputs (the first N of the validation data) the ranking runs on
    measure_cost         time what the float layers cost (ORT, batch 1)
    early_stop           stop an evaluation once its miss is certain (exact bounds: verdicts unchanged)
    threads              ONNX Runtime intra-op threads (None: ONNX Runtime's default)
    """

    enabled: bool = True
    max_evals: int = DEFAULT_MAX_EVALS
    schedule: str = "doubling"
    group: int = 1
    refine: bool = True
    sensitivity_samples: int = DEFAULT_SENSITIVITY_SAMPLES
    measure_cost: bool = True
    early_stop: bool = True
    threads: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_evals, bool) or not isinstance(self.max_evals, int) or self.max_evals < 1:
            raise UsageError(f"--fallback-max-evals must be a positive integer, got {self.max_evals!r}")
        if self.schedule not in SCHEDULES:
            raise UsageError(f"budget schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if isinstance(self.group, bool) or not isinstance(self.group, int) or self.group < 1:
            raise UsageError(f"budget group size must be a positive integer, got {self.group!r}")
        if isinstance(self.sensitivity_samples, bool) or not isinstance(self.sensitivity_samples, int) or self.sensitivity_samples < 2:
            raise UsageError(f"sensitivity samples must be an integer >= 2, got {self.sensitivity_samples!r}")

    def describe(self) -> str:
        step = "doubling groups" if self.schedule == "doubling" else f"groups of {self.group}"
        return f"{step}{', then fewest-layer refinement' if self.refine else ''}, at most {self.max_evals} evaluations"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
