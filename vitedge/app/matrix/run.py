"""`vitedge build-matrix`: every (model, target) row of a matrix.toml as a Ray task, or sequentially.

Order: for each group of rows that share calibration (same model, same calibration data and
subset) the first row runs first, alone in its group: it calibrates and fills the calibration
cache. The group's other rows run after it and read the statistics from the cache (same FP32
graph, same data hash, same settings: the cache's own key), so no two tasks calibrate the same
(model, data) at the same time. Rows whose bundle is already complete are resumed, not rebuilt.

A row whose worker dies is retried by Ray (``ClusterSettings.max_retries``), then reported as
that row's error; the other rows go on. One summary table, one JUnit file and one JSON for the
whole matrix (``MatrixReport``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vitedge.distributed.cluster import ClusterSettings, TaskOutcome, run_tasks
from vitedge.app.matrix.config import Matrix, MatrixRow
from vitedge.app.matrix.rows import ERROR, RowResult, build_row


@dataclass
class MatrixRun:
    matrix: Matrix
    engine: str  # "ray (...)" | "sequential (...)"
    rows: list[RowResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> list[RowResult]:
        return [r for r in self.rows if r.failed]


def phases(rows: tuple[MatrixRow, ...]) -> tuple[list[MatrixRow], list[MatrixRow]]:
    """(the first row of each calibration group, every other row), each in matrix order."""
    first: dict[tuple, MatrixRow] = {}
    for r in rows:
        first.setdefault(r.calibration_key, r)
    leaders = list(first.values())
    return leaders, [r for r in rows if r not in leaders]


def run_sequential(matrix: Matrix, info: Callable[[str], None]) -> list[RowResult]:
    leaders, rest = phases(matrix.rows)
    out = []
    for row in leaders + rest:
        info(f"{row.label}: building ...")
        result = build_row(row)
        info(f"{row.label}: {_line(result)}")
        out.append(result)
    return _in_matrix_order(matrix, out)


def run_on_ray(matrix: Matrix, cluster: ClusterSettings, info: Callable[[str], None]) -> list[RowResult]:
    """Ray must be initialised (``cluster.connected``)."""
    leaders, rest = phases(matrix.rows)
    out: list[RowResult] = []
    for phase, rows in (("calibrating", leaders), ("sharing the cached calibration", rest)):
        if not rows:
            continue
        info(f"{len(rows)} row(s) as Ray tasks ({phase}): {', '.join(r.label for r in rows)}")
        outcomes = run_tasks(build_row, rows, num_cpus=cluster.cpus_per_task, max_retries=cluster.max_retries,
                             on_done=lambda o, rows=rows: info(f"{rows[o.index].label}: "
                                                               + (_line(o.value) if o.ok else "ERROR")))
        out += [_from_outcome(rows[o.index], o) for o in outcomes]
    return _in_matrix_order(matrix, out)


def _from_outcome(row: MatrixRow, o: TaskOutcome) -> RowResult:
    if o.ok:
        result: RowResult = o.value
        result.host = (o.node or {}).get("host", result.host)
        return result
    why = str(o.cause) if o.cause is not None else o.error or "unknown failure"
    return RowResult(row.label, row.model_name, row.target_name, str(row.bundle), ERROR, detail=why)


def _in_matrix_order(matrix: Matrix, results: list[RowResult]) -> list[RowResult]:
    by_label = {r.label: r for r in results}
    return [by_label[r.label] for r in matrix.rows]


def _line(r: RowResult) -> str:
    how = "resumed (bundle complete)" if r.resumed else f"built, calibration {r.calibration}"
    return f"{r.status.upper()}; {how}" + (f"; {r.detail}" if r.detail else "")


def run_matrix(matrix: Matrix, cluster: ClusterSettings | None, info: Callable[[str], None]) -> MatrixRun:
    """Run every row: on Ray when ``cluster`` is given (Ray initialised by the caller), else sequentially."""
    start = time.perf_counter()
    if cluster is not None:
        rows = run_on_ray(matrix, cluster, info)
        engine = f"ray ({cluster.describe()})"
    else:
        rows = run_sequential(matrix, info)
        engine = "sequential (this process)"
    return MatrixRun(matrix, engine, rows, time.perf_counter() - start)
