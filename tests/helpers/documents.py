"""Compare two JSON-like documents: numbers within a tolerance, everything else exactly.

`pytest.approx` is for numbers; pytest 9.2 refuses it on a string ("expected value must support
abs(...)"), and a report mixes both (`accuracy.output_kind` is a string beside float metrics)."""

from __future__ import annotations

import math
from numbers import Real
from typing import Any


def mismatches(got: Any, want: Any, *, rel: float, abs_tol: float, where: str = "") -> list[str]:
    """Every place where `got` differs from `want`: numbers (not bools) by rel/abs tolerance, NaN equal
    to NaN, strings, bools and None exactly, dicts by keys then values, lists item by item."""
    if isinstance(want, bool) or isinstance(got, bool) or want is None or got is None:
        return [] if got is want or got == want and type(got) is type(want) else [f"{where}: {got!r} != {want!r}"]
    if isinstance(want, Real) and isinstance(got, Real):
        if math.isnan(want) and math.isnan(got):
            return []
        return [] if math.isclose(got, want, rel_tol=rel, abs_tol=abs_tol) else [f"{where}: {got!r} != {want!r}"]
    if isinstance(want, dict) and isinstance(got, dict):
        if set(got) != set(want):
            return [f"{where}: keys {sorted(got)} != {sorted(want)}"]
        return [m for k in want for m in mismatches(got[k], want[k], rel=rel, abs_tol=abs_tol, where=f"{where}.{k}")]
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        if len(got) != len(want):
            return [f"{where}: length {len(got)} != {len(want)}"]
        return [m for i, (g, w) in enumerate(zip(got, want))
                for m in mismatches(g, w, rel=rel, abs_tol=abs_tol, where=f"{where}[{i}]")]
    return [] if type(got) is type(want) and got == want else [f"{where}: {got!r} != {want!r}"]
