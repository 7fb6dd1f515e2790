"""How sharded validation (`vitedge validate --workers N`) scales on this machine.

For two bundles, the bundled example (examples/digits_vit.pt, 397 validation images) and a
random-weight ViT-B/16 (timm vit_base_patch16_224, 224x224) validated on a seeded subset of
the digits images resized to 224x224, it times the accuracy pass (FP32 + INT8 outputs for every
image, the metrics; no latency, no sensitivity):

  * single process: `validate_bundle` as `vitedge validate` runs it (ONNX Runtime's default threads)
  * Ray, 1 / 2 / 4 workers: a local Ray of that many CPUs started for the measurement; each
    shard task runs its ONNX Runtime session with 1 thread (the default --cpus-per-worker)

Every sharded run's accuracy section is checked equal to the single-process one. The 1-worker
anchor is measured in the same run. Ray start-up is timed separately (it is paid once per
command). Results: benchmarks/results/scale.json and scale.md.

    PYTHONPATH=$PWD python benchmarks/scale.py [--vitb-images 128] [--skip-vitb]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "benchmarks"))
WORKERS = (1, 2, 4)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build(model: Path, out: Path, calib: Path, val: Path | None, calib_size: int, arch: str | None, cache: Path) -> Path:
    from vitedge.budget import BudgetSettings
    from vitedge.app.build import BuildRequest, run_build
    from vitedge.validation.reference_cache import ReferenceCacheSettings
    from vitedge.models.intake import IntakeOptions
    from vitedge.core.ui import StageLog

    run_build(BuildRequest(model=model, targets=("onnx",), calib=calib, val=val, out=out, calib_size=calib_size,
                           cache=ReferenceCacheSettings(root=cache), intake=IntakeOptions(arch=arch) if arch else IntakeOptions(), measure_speed=False,
                           # random weights (ViT-B/16): agreement means nothing, so no accuracy budget search
                           budget=BudgetSettings(enabled=False)), StageLog(quiet=True))
    return out


def accuracy_pass(bundle: Path, data: Path, size: int | None, validator=None, threads: int | None = None) -> tuple[float, dict[str, Any]]:
    from vitedge.datasources.sources import open_source
    from vitedge.bundle.manifest import verify_bundle
    from vitedge.validation.bundle import ValidateOptions, validate_bundle

    manifest = verify_bundle(bundle)
    spec = manifest.spec
    source = open_source(data, spec.preprocess, limit=size, seed=0, class_names=spec.class_names)
    options = ValidateOptions(measure_speed=False, sensitivity=False, threads=threads, threshold_overrides=ThresholdOverrides(max_top1_drop=100, min_agreement=0))
    sharded = None if validator is None else validator(bundle, source, size)
    kwargs = {} if sharded is None else {"artifact_validator": sharded}
    t0 = time.perf_counter()
    result = validate_bundle(bundle, manifest, source, options, **kwargs)
    seconds = time.perf_counter() - t0
    if sharded is not None:
        sharded.annotate(result.report)
    return seconds, result.document


def measure(name: str, bundle: Path, data: Path, size: int | None) -> dict[str, Any]:
    import ray

    from vitedge.distributed.cluster import ClusterSettings
    from vitedge.distributed.ray_validate import sharded_validator

    log(f"== {name}: single process")
    single_cold, single_doc = accuracy_pass(bundle, data, size)  # first in this process: imports, first sessions
    single_s, single_doc = accuracy_pass(bundle, data, size)
    items = single_doc["data"]["items"]
    log(f"   cold {single_cold:.1f} s, warm {single_s:.1f} s for {items} images")
    rows: dict[str, Any] = {"single": {"cold_s": single_cold, "seconds": single_s, "images_per_s": items / single_s}}
    one_s, one_doc = accuracy_pass(bundle, data, size, threads=1)
    assert one_doc["accuracy"] == single_doc["accuracy"], "1 thread changed the outputs"
    rows["single_1thread"] = {"seconds": one_s, "images_per_s": items / one_s}
    log(f"   single process, 1 thread: {one_s:.1f} s")
    for w in WORKERS:
        t0 = time.perf_counter()
        ray.init(num_cpus=w, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                 runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}})
        init_s = time.perf_counter() - t0
        try:
            runs = []
            for _ in range(2):  # first: worker processes start and import; second: warm workers
                cluster = ClusterSettings(workers=w)
                seconds, doc = accuracy_pass(bundle, data, size, lambda b, s, n: sharded_validator(cluster, b, s, n, 0))
                if doc["accuracy"] != single_doc["accuracy"]:
                    raise SystemExit(f"{name}, {w} workers: the sharded accuracy differs from the single-process one")
                runs.append(seconds)
        finally:
            ray.shutdown()
        rows[f"ray{w}"] = {"workers": w, "ray_init_s": init_s, "cold_s": runs[0], "warm_s": runs[1],
                           "images_per_s": items / runs[1], "shards": doc["distributed"]["shards"]}
        log(f"   {w} worker(s): ray.init {init_s:.1f} s, cold {runs[0]:.1f} s, warm {runs[1]:.1f} s "
            f"({items / runs[1]:.1f} img/s), accuracy identical to single process")
    anchor = rows["ray1"]["warm_s"]
    for w in WORKERS:
        rows[f"ray{w}"]["speedup_vs_1_worker"] = anchor / rows[f"ray{w}"]["warm_s"]
        rows[f"ray{w}"]["speedup_vs_single"] = single_s / rows[f"ray{w}"]["warm_s"]
    return {"name": name, "items": items, "rows": rows}


def markdown(res: dict[str, Any]) -> str:
    env = res["environment"]
    lines = ["# Sharded validation on Ray: throughput vs workers", "",
             f"Measured {env['date']} on {env['machine']}; CPU ISA {res['cpu']['isa']}; "
             f"os.cpu_count() = {res['cpu_count']}. Ray {res['ray']}. Produced by `benchmarks/scale.py`.", "",
             "Accuracy pass only (FP32 and INT8 outputs of every image, then the metrics; no latency, no sensitivity). "
             "`warm` is a second run in the same process / on the same Ray session (modules imported, worker processes "
             "started); `cold` is the first (for Ray: starting the worker processes and importing vitedge and ONNX Runtime in them). `ray.init` is paid once per command. Every sharded run's accuracy section "
             "was checked identical to the single-process one. The machine is shared with other jobs while this ran.", ""]
    for b in res["benchmarks"]:
        lines += [f"## {b['name']} ({b['items']} images)", "",
                  "| run | ray.init s | cold s | warm s | img/s (warm) | speedup vs 1 worker | vs single process |",
                  "|---|---|---|---|---|---|---|"]
        s = b["rows"]["single"]
        lines.append(f"| single process (ORT default threads) | - | {s['cold_s']:.1f} | {s['seconds']:.1f} | {s['images_per_s']:.1f} | - | 1.00x |")
        if "single_1thread" in b["rows"]:
            t = b["rows"]["single_1thread"]
            lines.append(f"| single process, 1 thread (`--threads 1`) | - | - | {t['seconds']:.1f} | {t['images_per_s']:.1f} | - | "
                         f"{s['seconds'] / t['seconds']:.2f}x |")
        for w in WORKERS:
            r = b["rows"][f"ray{w}"]
            lines.append(f"| Ray, {w} worker(s), {r['shards']} shard(s), 1 thread each | {r['ray_init_s']:.1f} | {r['cold_s']:.1f} | "
                         f"{r['warm_s']:.1f} | {r['images_per_s']:.1f} | {r['speedup_vs_1_worker']:.2f}x | {r['speedup_vs_single']:.2f}x |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vitb-images", type=int, default=128)
    ap.add_argument("--skip-vitb", action="store_true")
    args = ap.parse_args()
    import ray

    from quant_accuracy import environment

    from vitedge.core.cpu import read_cpu

    res: dict[str, Any] = {"environment": environment(), "cpu": read_cpu().to_dict(), "cpu_count": os.cpu_count(),
                           "ray": ray.__version__, "benchmarks": []}
    digits = REPO / "calibration" / "digits"
    with tempfile.TemporaryDirectory(prefix="vitedge-scale-") as tmp:
        work = Path(tmp)
        log("== build: digits example (onnx)")
        small = build(REPO / "examples" / "digits_vit.pt", work / "digits", digits / "calib", digits / "val", 64, None, work / "cache")
        res["benchmarks"].append(measure("bundled example (digits_vit.pt)", small, digits / "val", None))
        if not args.skip_vitb:
            import timm
            import torch

            torch.manual_seed(0)
            pt = work / "vit_base_patch16_224.pt"
            torch.save(timm.create_model("vit_base_patch16_224", pretrained=False).state_dict(), pt)
            log("== build: ViT-B/16, random weights (onnx)")
            t0 = time.perf_counter()
            big = build(pt, work / "vitb", digits / "calib", None, 32, "vit_base_patch16_224", work / "cache")
            res["vitb_build_s"] = time.perf_counter() - t0
            res["benchmarks"].append(measure(f"ViT-B/16 (random weights), {args.vitb_images}-image shard of the digits set at 224x224",
                                             big, digits / "val", args.vitb_images))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "scale.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    md = markdown(res)
    (RESULTS / "scale.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
