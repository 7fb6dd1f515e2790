"""The whole matrix in one table, one JUnit file and one JSON: OUT/matrix.md, matrix-junit.xml, matrix.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from vitedge.app.matrix.run import MatrixRun
from vitedge.app.matrix.rows import ERROR, FAIL, NOT_VALIDATED, PASS, RowResult
from vitedge.files.atomic import atomic_write_path
from vitedge.core.ui import literal
from vitedge.validation.report import junit_xml

SCHEMA = "vitedge.matrix/1"
FILES = ("matrix.md", "matrix-junit.xml", "matrix.json")
COLUMNS = ("model", "target", "gate", "top-1 FP32 -> INT8", "agreement", "speedup", "calibration", "run", "node")


def _pct(v: object) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def table_rows(run: MatrixRun) -> list[tuple[str, ...]]:
    out = []
    for r in run.rows:
        m = r.metrics
        top1 = f"{_pct(m.get('top1_fp32'))} -> {_pct(m.get('top1_int8'))}" if m.get("top1_fp32") is not None else "-"
        speed = f"{m['speedup']:.2f}x" if m.get("speedup") else "-"
        out.append((r.model, r.target, r.status.upper(), top1, _pct(m.get("agreement")), speed, r.calibration,
                    "resumed" if r.resumed else "built", r.host or "-"))
    return out


def document(run: MatrixRun) -> dict[str, Any]:
    return {"schema": SCHEMA, "matrix": str(run.matrix.path), "out": str(run.matrix.out), "engine": run.engine,
            "seconds": run.seconds, "passed": not run.failed,
            "failed": [r.label for r in run.failed],
            "rows": [dict(vars(r)) for r in run.rows]}


def markdown(run: MatrixRun) -> str:
    verdict = "✅ PASS" if not run.failed else "❌ FAIL"
    lines = [f"## {verdict}: vitedge build-matrix `{run.matrix.path.name}`", "",
             f"{len(run.rows)} rows, {run.engine}, {run.seconds:.1f} s.", ""]
    if run.failed:
        lines += ["**Failed:** " + "; ".join(f"{r.label}: {r.detail or r.status}" for r in run.failed), ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(run)]
    return "\n".join(lines) + "\n"


def junit(run: MatrixRun) -> str:

    status = {PASS: "pass", FAIL: "fail", ERROR: "fail", NOT_VALIDATED: "skip"}
    cases = [{"name": r.label, "status": status[r.status], "detail": _detail(r), "value": None, "limit": None} for r in run.rows]
    return junit_xml("vitedge.matrix", "vitedge.matrix", cases, {"schema": SCHEMA, "matrix": str(run.matrix.path),
                                                                  "engine": run.engine}, run.seconds)


def _detail(r: RowResult) -> str:
    head = f"{r.status.upper()} {r.label} ({'resumed' if r.resumed else 'built'}; bundle {r.bundle})"
    return head + (f": {r.detail}" if r.detail else "")


def write_reports(run: MatrixRun) -> list[Path]:

    run.matrix.out.mkdir(parents=True, exist_ok=True)
    contents = {"matrix.md": markdown(run), "matrix-junit.xml": junit(run),
                "matrix.json": json.dumps(document(run), indent=2) + "\n"}
    written = []
    for name in FILES:
        path = run.matrix.out / name
        with atomic_write_path(path) as tmp:
            Path(tmp).write_text(contents[name], encoding="utf-8")
        written.append(path)
    return written


def print_table(run: MatrixRun) -> None:

    table = Table(title=f"vitedge build-matrix ({run.engine})", header_style="bold", padding=(0, 1))
    for col in COLUMNS:
        table.add_column(col, no_wrap=True)
    colour = {"PASS": "green", "FAIL": "red", "ERROR": "red"}
    for row in table_rows(run):
        table.add_row(*(literal(c) for c in row[:2]), f"[{colour.get(row[2], 'yellow')}]{literal(row[2])}[/]", *(literal(c) for c in row[3:]))
    Console(width=140).print(table)
