"""One row of a validation gate (a threshold, its measured value, its limit and the verdict) and
the three verdicts; shared by the accuracy gate (run), the embedding rows and `vitedge compare`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass
class GateRow:
    """One threshold of the gate: its measured value, its limit and the verdict.

    ``margin`` is how far the value is on the wrong side of the limit (positive: failing
    by that much, in the threshold's unit); ``status`` is pass, fail or skip (not
    measurable here: no labels, latency not measured, no limit set)."""

    name: str
    value: float | None
    limit: float | None
    passed: bool
    detail: str
    status: str = PASS
    unit: str = ""
    margin: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "passed": self.passed, "value": _finite(self.value),
                "limit": self.limit, "unit": self.unit, "margin": _finite(self.margin), "detail": self.detail}


def _finite(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else float(v)
