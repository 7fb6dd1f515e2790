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
* it misses by more: **fail**, with both figures;
* it misses, but by less time per call than this timing can tell (INT8's call is longer than the floor allows by
  under ``PayoffTiming.min_seconds``, 0.02 ms: little more than a session call's own overhead, the same limit under
  which the build's INT8 payoff decides nothing): **skip, too short to tell**, with the FP32 call's time. On a
  0.19 ms graph (kavishka-shallow, AVX2) a 0.95x speedup is INT8 taking 0.01 ms longer per call, a gap that two
  copies of one FP32 graph also showed between them in other runs (1.06x); it failed the build on that.

The same look decides a wall-time speedup that *met* the floor when its timing window was busy (the timed threads
waited for a core past ``core_wait.BUSY_ABOVE``): a loaded machine does not only make INT8 look slow. Two corpus builds
run while two benchmarks shared 2 cores read 4.6x and 5.0x at batch 1 where one thread's CPU time on the same graphs
said 1.1x and 1.2x (the FP32 reference's calls stretched to 9.8 ms); a graph slower than FP32 could pass so. The row
then says the window was busy and which figure decided. It costs the look's timing (5 s at least) on busy machines only.

GPU targets keep the wall-time verdict (CPU time says nothing of a GPU's work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from vitedge.backends.int8_timing import PayoffTiming, interleaved_times


@dataclass(frozen=True)
class SpeedCheck:
    """The second look at batch 1: FP32/INT8 by one-thread CPU time, and how far the FP32-vs-FP32 control moved."""

    speedup: float  # FP32 CPU time / INT8 CPU time (above 1: INT8 is faster)
    noise: float  # |control/FP32 - 1|
    fp32_seconds: float | None = None  # FP32's one-thread CPU time of one call (p10); None: not known
    # the wall-time timing's core_wait at batch 1 when a busy window (not a miss) asked for this look; None: a miss did
    busy_wait: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"method": "one thread, calling thread's CPU time, p10, random order", "speedup": round(self.speedup, 4),
               "control_noise": round(self.noise, 4)}
        if self.fp32_seconds is not None:
            out["fp32_ms"] = round(self.fp32_seconds * 1e3, 4)
        if self.busy_wait is not None:
            out["asked_by"] = f"a busy timing window (core_wait {self.busy_wait:.2f})"
        return out

    def gap_seconds(self, floor: float) -> float | None:
        """How much longer INT8's call is than the floor allows (FP32's time / floor), in seconds."""
        if self.fp32_seconds is None or self.speedup <= 0:
            return None
        return self.fp32_seconds / self.speedup - self.fp32_seconds / floor


# A verdict, not a build step: at least 15 rounds and 5 s, no early stop on a ratio that looks clear (on a 0.15 ms
# model, 6 rounds of one look said 0.88x where three other looks at the same bundle said 1.03-1.28x)
GATE_TIMING = PayoffTiming(min_rounds=15, max_rounds=60, seconds=5.0, clear_margin=0.0, settle_floor=float("inf"))


# The least time per call the build's timing tells apart (``PayoffTiming.min_seconds``): the same limit here
TELLABLE = PayoffTiming()


def second_look(fp32: Callable[[], Any], control: Callable[[], Any], int8: Callable[[], Any],
                timing: PayoffTiming = GATE_TIMING) -> SpeedCheck:
    """Time the three calls (each a one-thread run of its graph on one fixed input) side by side."""
    t = interleaved_times(fp32, control, int8, timing, seed=1)
    return SpeedCheck(speedup=1.0 / t.int8 if t.int8 > 0 else float("inf"), noise=abs(t.control - 1.0), fp32_seconds=t.fp32_seconds)


def verdict(wall: float, floor: float, check: SpeedCheck | None) -> tuple[str, str]:
    """(pass | fail | skip, the detail's tail after the wall-time figure) for a wall-time speedup ``wall`` that
    missed ``floor``, or met it in a busy timing window (``check.busy_wait``); without a second look, the wall time
    decides."""
    short = floor - wall
    if short <= 0 and (check is None or check.busy_wait is None):  # met in a quiet window: the wall time stands
        return "pass", ""
    if check is None:
        return "fail", f", short by {short:.2f}x"
    busy = (f"; timed while other processes held the cores (the timed threads waited {check.busy_wait:.2f} s for a "
            "core per second they ran)" if check.busy_wait is not None else "")
    seen = busy + (f"; timed again at one thread by CPU time (the build's method): {check.speedup:.2f}x, the FP32-vs-FP32 "
                   f"control moved by {check.noise:.0%}")
    if check.speedup >= floor:
        return "pass", seen + (": passes (the wall-time figure counted this machine's load)" if short > 0 else ": passes")
    gap = check.gap_seconds(floor)
    if gap is not None and gap < TELLABLE.min_seconds:
        return "skip", (seen + f": too short to tell (FP32 takes {check.fp32_seconds * 1e3:.3f} ms a call; INT8 misses the "
                        f"floor by {gap * 1e3:.3f} ms a call, under the {TELLABLE.min_seconds * 1e3:.3f} ms this timing can tell)")
    if floor - check.speedup <= check.noise:
        return "skip", (seen + f": not settled (short by {floor - check.speedup:.2f}x, within the noise); re-run "
                        "`vitedge validate` on a quieter machine")
    return "fail", seen + f", short by {floor - check.speedup:.2f}x"
