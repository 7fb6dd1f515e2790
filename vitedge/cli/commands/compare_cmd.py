"""`vitedge compare OLD.json NEW.json`: fail CI when a change costs accuracy or latency over time."""

from __future__ import annotations

from pathlib import Path

import click

from vitedge.cli.options import CheckedPath, bounded_float
from vitedge.app.compare import CompareRequest, run_compare
from vitedge.core.errors import GateFailure
from vitedge.validation.compare import parse_fraction
from vitedge.validation.defaults import (
    DEFAULT_MAX_ACCURACY_REGRESSION,
    DEFAULT_MAX_LATENCY_REGRESSION,
)


@click.command("compare")
@click.argument("old", type=CheckedPath(path_type=Path))
@click.argument("new", type=CheckedPath(path_type=Path))
@click.option("--max-latency-regression", default=f"{100 * DEFAULT_MAX_LATENCY_REGRESSION:g}%", show_default=True, metavar="PCT",
              help="Most INT8 median latency growth per batch size: 10% or 0.1. Reports timed on different devices "
                   "compare INT8/FP32 time ratios instead of milliseconds.")
@click.option("--max-accuracy-regression", type=bounded_float(0.0, 100.0), default=DEFAULT_MAX_ACCURACY_REGRESSION, show_default=True, metavar="POINTS",
              help="Most INT8 top-1 (and agreement with FP32) lost, in percentage points. On one data set the images are "
                   "paired: a loss over it fails only when its confidence interval lies above it (docs/reports.md).")
@click.option("--allow-mismatch", is_flag=True, help="Compare reports of different models or targets anyway (a warning instead of exit 2).")
@click.option("--report-dir", type=CheckedPath(path_type=Path), default=None,
              help="Write compare.json, compare.md and compare-junit.xml there.")
@click.option("-q", "--quiet", is_flag=True, help="Only the verdict.")
def command(old, new, max_latency_regression, max_accuracy_regression, allow_mismatch, report_dir, quiet) -> None:
    """Gate a regression between two validation reports (validation.json) of one model and target.

    OLD is the accepted baseline (e.g. from the main branch), NEW the candidate; a bundle folder
    stands for its build's report (BUNDLE/report/validation.json).
    Exit code 0 when nothing regressed past the limits, 1 when something did, 2 for bad input."""

    outcome = run_compare(CompareRequest(old, new, parse_fraction(max_latency_regression), max_accuracy_regression,
                                         allow_mismatch, report_dir))
    result, written = outcome.comparison, outcome.written
    for w in result.warnings:
        click.echo(f"vitedge: warning: {w}", err=True)
    if outcome.summary_warning:
        click.echo(f"vitedge: warning: {outcome.summary_warning}", err=True)
    if not quiet:
        for row in result.rows:
            click.echo(f"{row.status.upper():<5} {row.name:<30} {row.detail}")
    where = f"; reports in {written[0].parent}/ ({', '.join(p.name for p in written)})" if written else ""
    click.echo(f"{'PASS' if result.passed else 'FAIL'}: {result.target_name}{where}")
    if not result.passed:
        raise GateFailure(result.failure_line())
