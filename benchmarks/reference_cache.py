"""Issue 19 items 3-4: validation and the accuracy budget reuse the outputs they already computed.

Builds the bundled digits example for both CPU targets (`onnx`: ONNX Runtime, `intel-cpu`:
OpenVINO) four times in one run, with the default accuracy budget, into a fresh cache folder:

1. cold: empty cache (calibration, FP32 and INT8 outputs computed);
2. warm, reference cache off (`--no-reference-cache`): calibration read from its cache, every output recomputed;
3. warm, `--no-int8-cache`: calibration and FP32 outputs read back, the INT8 graphs run again;
4. warm: calibration, FP32 and (the artifacts and budget candidates being byte-identical) INT8 outputs read back.

Latency is not measured (`--no-latency`): it is time-boxed per model and the same whatever the cache.
Then, per bundle, the accuracy figures at inference batch 1, 8 and 32 (is the batch a choice that
changes any verdict?).

    python benchmarks/reference_cache.py

Writes benchmarks/results/reference_cache.md and .json. The machine is shared: seconds are
wall time under whatever else runs.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
MODEL = REPO / "examples" / "digits_vit.pt"
CALIB = REPO / "calibration" / "digits" / "calib"
VAL = REPO / "calibration" / "digits" / "val"
TARGETS = ("onnx", "intel-cpu")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build(out: Path, cache: Path, *, reference_cache: bool, force: bool, int8_cache: bool = True) -> dict:
    from vitedge.app.build import BuildRequest, run_build
    from vitedge.validation.reference_cache import ReferenceCacheSettings
    from vitedge.core.ui import StageLog

    stage_log = StageLog(quiet=True)
    t0 = time.perf_counter()
    results = run_build(BuildRequest(model=MODEL, targets=TARGETS, calib=CALIB, val=VAL, out=out, force=force, measure_speed=False,
                                     cache=ReferenceCacheSettings(enabled=reference_cache, root=cache, int8_outputs=int8_cache)), stage_log)
    total = time.perf_counter() - t0
    refs = {}
    for r in results:
        doc = json.loads((r.bundle / "report" / "validation.json").read_text())
        refs[r.profile.name] = {"reference": doc["data"]["reference"]["cache"], "batch": doc["data"]["reference"]["batch"],
                                "int8": doc["data"].get("int8_outputs", {}).get("cache"),
                                "items": doc["data"]["items"], "validate_seconds": doc["seconds"],
                                "top1_fp32": doc["accuracy"].get("fp32_top1"), "top1_int8": doc["accuracy"].get("int8_top1"),
                                "agreement": doc["accuracy"].get("top1_agreement")}
    return {"total_seconds": total, "validate_seconds": stage_log.timings.get("validate", 0.0),
            "calibrate_seconds": stage_log.timings.get("calibrate", 0.0), "budget_seconds": stage_log.timings.get("budget", 0.0),
            "targets": refs}


def batch_check(bundle: Path) -> dict:
    """FP32 and INT8 outputs of the bundle at batch 1, 8 and 32: accuracy figures and the largest output difference."""
    from vitedge.backends import get_backend
    from vitedge.datasources.sources import open_source
    from vitedge.bundle.manifest import read_manifest
    from vitedge.validation.accuracy import collect_outputs, compare_logits
    from vitedge.validation.bundle import bundle_profile

    manifest = read_manifest(bundle)
    profile = bundle_profile(manifest, bundle)
    backend = get_backend(profile.backend)
    spec = manifest.spec
    source = open_source(VAL, spec.preprocess, class_names=spec.class_names)
    outs = {}
    for role in ("reference", "model"):
        with backend.open_runner(bundle / getattr(manifest.artifacts, role), profile.backend_options) as runner:
            outs[role] = {b: collect_outputs(runner, source, spec.preprocess, batch_size=b) for b in (1, 8, 32)}
    rows = {}
    for b in (1, 8, 32):
        acc = compare_logits(outs["reference"][b].values, outs["model"][b].values, outs["reference"][b].labels)
        rows[str(b)] = {k: acc[k] for k in ("fp32_top1", "int8_top1", "top1_agreement", "logit_abs_error_mean")}
        rows[str(b)]["fp32_max_abs_diff_vs_batch1"] = float(np.abs(outs["reference"][b].values - outs["reference"][1].values).max())
        rows[str(b)]["int8_max_abs_diff_vs_batch1"] = float(np.abs(outs["model"][b].values - outs["model"][1].values).max())
    return rows


def main() -> None:
    from vitedge.core.cpu import read_cpu

    cpu = read_cpu()
    record: dict = {"cpu": cpu.to_dict(), "targets": list(TARGETS), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="vitedge-refcache-bench-") as tmp:
        work = Path(tmp)
        cache, out = work / "cache", work / "bundles"
        for name, ref_cache, int8_cache, force in (("cold", True, True, False), ("warm, reference cache off", False, True, True),
                                                   ("warm, --no-int8-cache", True, False, True), ("warm", True, True, True)):
            log(f"build: {name} ...")
            record["runs"][name] = build(out, cache, reference_cache=ref_cache, force=force, int8_cache=int8_cache)
            log(f"  validate {record['runs'][name]['validate_seconds']:.1f} s, total {record['runs'][name]['total_seconds']:.1f} s")
        record["batches"] = {t: batch_check(out / t) for t in TARGETS}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "reference_cache.json").write_text(json.dumps(record, indent=2) + "\n")
    (RESULTS / "reference_cache.md").write_text(render(record))
    print(render(record))


def render(record: dict) -> str:
    cpu = record["cpu"]
    lines = [
        "# Validation cache: cold vs warm validation and accuracy budget (issue 19 items 3-4)",
        "",
        f"CPU: {cpu['model']} ({cpu['isa']}), machine {cpu['machine']}. Shared machine: 2 cores used by several jobs at",
        "once, so seconds are wall time under load and vary between runs; compare rows of this one run only.",
        "",
        "`python benchmarks/reference_cache.py`: the digits example (examples/digits_vit.pt, validation set",
        "calibration/digits/val) built for `onnx` and `intel-cpu` in one `vitedge build` (default accuracy budget), four",
        "times, into one fresh cache folder. Latency not measured (`--no-latency`: it is time-boxed and the same with or",
        "without the cache). `validate` is the validate stage of both targets together; `budget` the accuracy budget's.",
        "",
        "| run | validate (s) | budget (s) | calibrate (s) | build total (s) | FP32 reference (onnx / intel-cpu) | INT8 outputs (onnx / intel-cpu) |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for name, run in record["runs"].items():
        refs = " / ".join(f"{t['reference']} (batch {t['batch']}, {t['items']} items)" for t in run["targets"].values())
        int8 = " / ".join(str(t.get("int8")) for t in run["targets"].values())
        lines.append(f"| {name} | {run['validate_seconds']:.1f} | {run.get('budget_seconds', 0.0):.1f} | {run['calibrate_seconds']:.1f} "
                     f"| {run['total_seconds']:.1f} | {refs} | {int8} |")
    lines += ["", "Accuracy figures by inference batch (the same outputs, batched differently):", "",
              "| target | batch | FP32 top-1 | INT8 top-1 | agreement | FP32 max abs diff vs batch 1 | INT8 max abs diff vs batch 1 |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for target, rows in record["batches"].items():
        for b, r in rows.items():
            lines.append(f"| {target} | {b} | {100 * r['fp32_top1']:.2f}% | {100 * r['int8_top1']:.2f}% | {100 * r['top1_agreement']:.2f}% "
                         f"| {r['fp32_max_abs_diff_vs_batch1']:.2e} | {r['int8_max_abs_diff_vs_batch1']:.2e} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
