"""`vitedge build --target NAME MODEL --calib DATA -o OUT`: the command our users type.
Every flag can come from the project config (vitedge.toml); flags override it."""

from __future__ import annotations

from pathlib import Path

import click

from vitedge.core import limits
from vitedge.app.build import TargetResult, run_build
from vitedge.app.build_flags import BuildFlags
from vitedge.app.summary import print_build_summary
from vitedge.cli.options import (
    CheckedPath,
    bounded_int,
    cache_dir_option,
    calib_size_option,
    calibration_method_option,
    int8_cache_option,
    keep_float_option,
    percentile_option,
    quantize_attention_option,
    small_gemms_option,
    reference_cache_option,
    seed_option,
    smoothquant_options,
    threshold_options,
    weight_range_option,
    with_intake,
)
from vitedge.cli.commands.embedding_flags import embedding_gate_flags, noise_gate_flags
from vitedge.core.errors import GateFailure
from vitedge.cli.project_config import require_build, with_project_config
from vitedge.core.ui import StageLog


@click.command("build")
@with_project_config(require_build, dry_run=True)
@click.argument("model", type=CheckedPath(path_type=Path), required=False)
@click.option("-t", "--target", "targets", multiple=True, metavar="NAME|FILE.toml",
              help="Target profile (see `vitedge targets`) or your own profile file. Repeat for several targets: they share one calibration.")
@click.option("--calib", type=CheckedPath(path_type=Path), help="Calibration data: image folder, .npy/.npz, or a video file; "
              "a folder holding calib/ + val/ (or train/ + val/) is a split.")
@click.option("--val", type=CheckedPath(path_type=Path), default=None, help="Labelled validation data for the parity check (default: the calibration data).")
@click.option("-o", "--out", type=CheckedPath(path_type=Path), default=None,
              help="Bundle folder (one target) or parent of one folder per target. Default: MODEL-TARGET.")
@click.option("--force", is_flag=True, help="Replace an existing bundle folder.")
@with_intake
@calib_size_option("Use a seeded subset of N calibration items.")
@seed_option()
@calibration_method_option("Calibration method (default: the profile's, else vitedge's measured default).")
@percentile_option("Percentile of |x| kept; implies --method percentile (default: the profile's, else {percentile}).")
@smoothquant_options("SmoothQuant migration strength in [0, 1] (default: the profile's, else {smoothquant_alpha}).")
@quantize_attention_option("Quantize the Q.K^T and P.V matmuls (default: the profile's, else {quantize_attention}).")
@weight_range_option("INT8 weight range (default: the profile's, else {weight_range}: correct on every x86 CPU; full: VNNI/AMX CPUs and GPUs only).")
@small_gemms_option
@keep_float_option
@click.option("--bake-preprocess", is_flag=True, help="Artifacts take uint8 NHWC RGB frames and normalise them in the graph.")
@click.option("--cpu-kind", default=None, metavar="KIND",
              help="The CPU kind the bundles are for: avx2, avx512, avx-vnni, avx512-vnni or amx (default: this CPU's). The onnx "
                   "target's INT8 payoff is timed when this CPU is of that kind, else read from figures recorded on it; "
                   "with none recorded its layers stay INT8.")
@threshold_options
@click.option("--no-latency", is_flag=True, help="Skip latency measurement (and the speed gate).")
@click.option("--no-fallback", is_flag=True,
              help="Accuracy budget off: ship the full INT8 graph even when it misses --max-top1-drop/--min-agreement (its gate then fails).")
@click.option("--fallback-max-evals", type=bounded_int(1, limits.MAX_FALLBACK_EVALS), default=12, show_default=True,
              help="Accuracy budget: most candidate graphs evaluated (the full INT8 one included) while returning the most harmful layers to float.")
@cache_dir_option
@reference_cache_option()
@int8_cache_option()
@embedding_gate_flags
@noise_gate_flags
@click.option("-q", "--quiet", is_flag=True, help="Only the summary.")
def command(**flags: object) -> None:
    """Quantize MODEL to INT8 once and build it for each --target, validated against FP32.

    When the INT8 graph misses the accuracy thresholds on the validation data, the layers that
    harm it most go back to float (a few at a time, ranked by per-layer sensitivity) until it
    meets them; every target is built from that one graph (--no-fallback: off).

    MODEL, --target, --calib and every other flag can come from the project config
    (vitedge.toml or [tool.vitedge], from the working directory upward); flags override it,
    --dry-run shows each setting and where it came from.

    Exit code 0 when every target's gate holds, 1 when a gate fails (or the accuracy budget
    cannot be met with any layer left in INT8), 2 for bad input."""

    typed = BuildFlags.from_click(flags)  # click hands every flag over, named as the command's parameter
    req = typed.request(config_record=click.get_current_context().meta.get("vitedge.config_record"))
    log = StageLog(quiet=typed.quiet)
    results = run_build(req, log)
    print_build_summary(results, log.timings)
    _print_budget_and_warnings(results)
    failed = [r for r in results if r.passed is False]
    if failed:
        raise GateFailure(f"{len(failed)} of {len(results)} target(s) failed the parity gate: "
                          + "; ".join(f"{r.profile.name}: {', '.join(r.summary.failures)}" for r in failed))


def _print_budget_and_warnings(results: list[TargetResult]) -> None:
    """Each accuracy-budget line once (with the layers it kept in float), then each warning once."""
    for line, names in dict.fromkeys((r.summary.budget, tuple(r.summary.budget_float)) for r in results if r.summary.budget):
        click.echo("  " + line + ("".join(f"\n    float: {n}" for n in names)))
    for w in dict.fromkeys(w for r in results for w in r.summary.warnings):
        click.echo(f"vitedge: WARNING: {w}", err=True)
