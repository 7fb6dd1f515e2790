"""`vitedge build-matrix matrix.toml`: models x targets, each row a Ray task (or sequentially without Ray)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from vitedge.core import limits
from vitedge.cli.options import CheckedPath, bounded_int
from vitedge.distributed.cluster import (
    INSTALL,
    ClusterSettings,
    WorkerFailure,
    connected,
    ray_available,
)
from vitedge.app.matrix.run import run_matrix
from vitedge.app.matrix.config import load_matrix
from vitedge.app.matrix.report import print_table, write_reports
from vitedge.app.matrix.rows import ERROR
from vitedge.core.errors import GateFailure, UsageError
from vitedge.files.lock import output_locks
from vitedge.files.outputs import check_output


@click.command("build-matrix")
@click.argument("matrix", type=CheckedPath(path_type=Path))
@click.option("-o", "--out", type=CheckedPath(path_type=Path), default=None,
              help="Parent folder of the bundles (OUT/<model>/<target>/) and the matrix reports. Default: the file's 'out'.")
@click.option("--workers", type=bounded_int(1, limits.MAX_WORKERS), default=None,
              help="Rows at a time on a local Ray started for the run. Default: this machine's CPU count.")
@click.option("--ray-address", default=None, metavar="ADDR", help="Run the rows on an existing Ray cluster (see docs/scale.md).")
@click.option("--sequential", is_flag=True, help="Build the rows one after another in this process, without Ray.")
@click.option("-q", "--quiet", is_flag=True, help="Only the table and the verdict.")
def command(matrix, out, workers, ray_address, sequential, quiet) -> None:
    """Build every (model, target) row of MATRIX (a matrix.toml, see docs/scale.md).

    Each row is one `vitedge build` of one model for one target, run as a Ray task; rows that
    share a model and its calibration data share one calibration (the first calibrates, the
    others read the cache). Rows whose bundle is complete from an earlier run are resumed.
    Without Ray installed the same matrix runs sequentially.

    Writes OUT/matrix.md, OUT/matrix-junit.xml and OUT/matrix.json. Exit code 0 when every
    row passes its gate, 1 when a gate fails (the failing rows named), 2 for bad input or a
    row that could not be built."""

    if sequential and (workers or ray_address):
        raise UsageError("--sequential runs without Ray; drop --workers / --ray-address")
    spec = load_matrix(matrix, out)
    click.get_current_context().with_resource(output_locks([spec.out]))  # two matrices into one -o: the second is refused now
    # the one replace rule: the reports OUT already holds are a matrix's (each row's bundle is checked as a bundle)
    check_output(spec.out, "matrix", force=True)
    info = (lambda _m: None) if quiet else (lambda m: click.echo(f"  {m}"))
    click.echo(f"build-matrix: {len(spec.rows)} rows ({len({r.model_name for r in spec.rows})} models) -> {spec.out}/")
    if not sequential and not (workers or ray_address) and not ray_available():
        click.echo(f"build-matrix: Ray is not installed ({INSTALL}): building the {len(spec.rows)} rows sequentially in this process")
        sequential = True
    if sequential:
        run = run_matrix(spec, None, info)
    else:
        cluster = ClusterSettings(workers=workers or (None if ray_address else os.cpu_count() or 1), address=ray_address)
        with connected(cluster):
            run = run_matrix(spec, cluster, info)
    print_table(run)
    written = write_reports(run)
    click.echo(f"{'PASS' if not run.failed else 'FAIL'}: {len(run.rows) - len(run.failed)} of {len(run.rows)} rows passed "
               f"({run.seconds:.1f} s, {run.engine}); reports: {', '.join(str(p) for p in written)}")
    errors = [r for r in run.failed if r.status == ERROR]
    if errors:
        raise WorkerFailure(f"{len(errors)} row(s) could not be built: " + "; ".join(f"{r.label}: {r.detail}" for r in errors))
    if run.failed:
        raise GateFailure(f"{len(run.failed)} of {len(run.rows)} row(s) failed the gate: "
                          + "; ".join(f"{r.label}: {r.detail}" for r in run.failed))
