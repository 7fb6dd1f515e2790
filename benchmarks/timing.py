"""Interleaved latency rounds shared by the benchmarks.

In each round every callable runs once untimed (the "settle" run: the previous graph's
idle worker threads may still be spinning, which on 2 cores slows the next run) and then
``timed`` times timed; a round's figure is the median of its timed runs. The settle runs'
times are returned too, so the effect they absorb stays visible.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import numpy as np

TIMED_PER_ROUND = 3


def machine_line() -> str:
    """The CPU a figure was measured on, for a results header: model, ISA, cores."""
    from vitedge.core.cpu import read_cpu

    cpu = read_cpu()
    return f"{cpu.model or platform.processor()} (ISA {cpu.isa}), {os.cpu_count()} cores"


def results_isa() -> str:
    """This CPU's kind as a results file's name part (avx2, avx512-vnni, amx): each kind keeps its own record."""
    from vitedge.core.cpu import read_cpu

    return read_cpu().isa.split(",")[0].split(" ")[0]


def bundle_graph(bundle: Path, role: str, default: str) -> Path:
    """The file a bundle's manifest names for ``role`` (artifacts.model, artifacts.reference), else ``default``: an
    onnx bundle that ships its FP32 graph as is names it for both roles and holds no model.int8.onnx."""
    try:
        return bundle / json.loads((bundle / "manifest.json").read_text())["artifacts"][role]
    except (OSError, KeyError, ValueError, TypeError):
        return bundle / default


def labelled_bundles(items: list[str]) -> list[tuple[str, Path]] | None:
    """``--bundles LABEL=DIR ...`` as (label, folder) pairs; None when an item is not LABEL=DIR of an existing folder."""
    pairs = [item.split("=", 1) for item in items]
    if any(len(p) != 2 or not Path(p[1]).is_dir() for p in pairs):
        return None
    return [(label, Path(folder)) for label, folder in pairs]


def write_results(out: Path, name: str, isa: str, res: dict[str, Any], text: str) -> None:
    """``out``/``name``_``isa``.json (``res``) and .md (``text``), the folder made where missing."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}_{isa}.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / f"{name}_{isa}.md").write_text(text)


def interleaved_rounds(runs: dict[Hashable, Callable[[], Any]], rounds: int, *, timed: int = TIMED_PER_ROUND,
                       on_round: Callable[[int], None] | None = None) -> tuple[dict[Hashable, list[float]], dict[Hashable, list[float]]]:
    """(per key: each round's median timed ms, per key: each round's settle-run ms)."""
    times: dict[Hashable, list[float]] = {k: [] for k in runs}
    settle: dict[Hashable, list[float]] = {k: [] for k in runs}
    for r in range(rounds):
        for k, f in runs.items():
            t0 = time.perf_counter()
            f()
            settle[k].append((time.perf_counter() - t0) * 1000)
            samples = []
            for _ in range(timed):
                t0 = time.perf_counter()
                f()
                samples.append((time.perf_counter() - t0) * 1000)
            times[k].append(float(np.median(samples)))
        if on_round:
            on_round(r)
    return times, settle
