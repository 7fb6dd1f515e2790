"""The speed gate's second look on a CPU target (issue 47 item 2): a batch-1 speedup short of the floor in wall time
is timed again the way the build decides whether INT8 pays, before it fails.

The validation's latency runs FP32 and INT8 interleaved at the profile's threads (all cores) in wall time, which
counts the other processes of a shared machine: on 2 busy cores a bundle identical to its FP32 reference (a model
the build kept float) measured anywhere around 1x and could fail ``min_speedup = 1``. So when the wall-time speedup
misses the floor, both graphs, and a second copy of the FP32 one (the control), are opened for one inference thread
and timed by that thread's CPU time, in random order, taking the 10th percentile (``vitedge.backends.int8_timing``).
The row then says which figure decided:

* the CPU-time speedup meets the floor: **pass** (the wall-time miss was the machine's load);
* it misses by no more than the control moved from 1 (this machine's noise right now): **skip, not settled**, with
  both figures: re-run `vitedge validate` on a quieter machine to settle it;
* it misses by more: **fail**, with both figures.

GPU targets keep the wall-time verdict (CPU time says nothing of a GPU's work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from vitedge.backends.int8_timing import PayoffTiming, interleaved_ratio


@dataclass(frozen=True)
class SpeedCheck:
    """The second look at batch 1: FP32/INT8 by one-thread CPU time, and how far the FP32-vs-FP32 control moved."""

    speedup: float  # FP32 CPU time / INT8 CPU time (above 1: INT8 is faster)
    noise: float  # |control/FP32 - 1|

    def to_dict(self) -> dict[str, Any]:
        return {"method": "one thread, calling thread's CPU time, p10, random order", "speedup": round(self.speedup, 4),
                "control_noise": round(self.noise, 4)}


# A verdict, not a build step: at least 15 rounds and 5 s, no early stop on a ratio that looks clear (on a 0.15 ms
# model, 6 rounds of one look said 0.88x where three other looks at the same bundle said 1.03-1.28x)
GATE_TIMING = PayoffTiming(min_rounds=15, max_rounds=60, seconds=5.0, clear_margin=0.0, settle_floor=float("inf"))


def second_look(fp32: Callable[[], Any], control: Callable[[], Any], int8: Callable[[], Any],
                timing: PayoffTiming = GATE_TIMING) -> SpeedCheck:
    """Time the three calls (each a one-thread run of its graph on one fixed input) side by side."""
    ratio, control_ratio = interleaved_ratio(fp32, control, int8, timing, seed=1)
    return SpeedCheck(speedup=1.0 / ratio if ratio > 0 else float("inf"), noise=abs(control_ratio - 1.0))


def verdict(wall: float, floor: float, check: SpeedCheck | None) -> tuple[str, str]:
    """(pass | fail | skip, the detail's tail after the wall-time figure) for a wall-time speedup ``wall`` that
    missed ``floor``; without a second look, the wall time fails it."""
    short = floor - wall
    if check is None:
        return "fail", f", short by {short:.2f}x"
    seen = (f"; timed again at one thread by CPU time (the build's method): {check.speedup:.2f}x, the FP32-vs-FP32 "
            f"control moved by {check.noise:.0%}")
    if check.speedup >= floor:
        return "pass", seen + ": passes (the wall-time figure counted this machine's load)"
    if floor - check.speedup <= check.noise:
        return "skip", (seen + f": not settled (short by {floor - check.speedup:.2f}x, within the noise); re-run "
                        "`vitedge validate` on a quieter machine")
    return "fail", seen + f", short by {floor - check.speedup:.2f}x"
