"""Accuracy budget (issue 8): vitedge's mixed-precision fallback vs NNCF's
``quantize_with_accuracy_control`` on a ViT that plain INT8 damages, side by side in one run.

Run by hand from the repository root (about 10-20 minutes on 2 cores):

    flock /tmp/vitedge-bench.lock python benchmarks/accuracy_budget.py

The model: the bundled digits ViT with activation outliers planted by a function-preserving
rewrite (examples/make_outlier_vit.py, k = 300 by default: two channels at each of four sites
become ~300x the median channel; FP32 logits unchanged, checked here). Data: calibration on
calibration/digits/calib (200 images), every budget and every accuracy figure on
calibration/digits/val (397 held-out labelled images), the same for both tools.

For each SmoothQuant setting (off: the damage; on: SmoothQuant undoes the LayerNorm sites
exactly, not the V->proj one) and each vitedge calibration method (entropy: vitedge's
default; percentile 99.99: the previous default, which keeps the outliers' full range):

* vitedge full INT8 graph, then ``vitedge.budget.meet_budget`` with the build defaults
  (top-1 drop <= 0.2 points AND agreement >= 99%), and again with the drop alone (NNCF's
  criterion);
* NNCF ``quantize_with_accuracy_control(ov_model, calib, val, validation_fn, max_drop=0.002,
  drop_type=ABSOLUTE, model_type=TRANSFORMER)`` (SmoothQuant off: matmul alpha -1), and plain
  ``nncf.quantize`` with the same settings for reference;
* accuracy of every model on OpenVINO (and vitedge's graphs on ONNX Runtime too), agreement
  against FP32 on the same runtime;
* batch-1 latency, all models of a runtime timed interleaved in one loop.

Also: the search schedule (doubling + refinement, doubling alone, one layer at a time,
groups of 4) on the most damaged setting, with and without early stopping.

Writes benchmarks/results/accuracy_budget.md and .json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import io
import json
import logging
import os
import platform
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "examples"))
CALIB = REPO / "calibration" / "digits" / "calib"
VAL = REPO / "calibration" / "digits" / "val"
RESULTS = REPO / "benchmarks" / "results"
WORK: Path = Path(tempfile.gettempdir())

warnings.filterwarnings("ignore")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def environment() -> dict[str, Any]:
    from vitedge.backends.openvino import block_vendor_telemetry

    block_vendor_telemetry()  # NNCF telemetry: a forked sender that hangs on a closed network
    import nncf
    import onnx
    import onnxruntime
    import openvino
    import torch

    import vitedge

    cpu, flags = platform.processor() or "", ""
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
        cpu = next((l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("model name")), cpu)
        flags = " ".join(f for f in ("avx512_vnni", "avx512_bf16", "amx_int8", "avx2") if f in text)
    versions = {"python": platform.python_version(), "vitedge": vitedge.__version__, "torch": torch.__version__, "onnx": onnx.__version__,
                "onnxruntime": onnxruntime.__version__, "openvino": openvino.__version__, "nncf": nncf.__version__}
    return {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"{cpu}, {os.cpu_count()} cores ({flags})", "platform": platform.platform(), "versions": versions,
            "load_average_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None}


# --------------------------------------------------------------------------- runtimes


def ort_logits(model: Any, x: np.ndarray) -> np.ndarray:
    from vitedge.onnxkit.session import ort_session

    src = model.SerializeToString() if hasattr(model, "SerializeToString") else Path(model)
    sess = ort_session(src)
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + 64]})[0] for i in range(0, len(x), 64)])


def ov_compile(model: Any):
    import openvino as ov

    core = ov.Core()
    if hasattr(model, "SerializeToString"):
        model = core.read_model(model.SerializeToString(), b"")  # an in-memory ONNX graph
    elif isinstance(model, (str, Path)):
        model = core.read_model(str(model))
    return core.compile_model(model, "CPU", {"PERFORMANCE_HINT": "LATENCY"})


def ov_logits(compiled, x: np.ndarray) -> np.ndarray:
    req = compiled.create_infer_request()
    return np.concatenate([np.array(req.infer({0: x[i:i + 1]})[0]) for i in range(len(x))])


def score(logits: np.ndarray, y: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    pred = logits.argmax(1)
    return {"top1": float(np.mean(pred == y) * 100), "agreement": float(np.mean(pred == ref.argmax(1)) * 100),
            "drop": float((np.mean(ref.argmax(1) == y) - np.mean(pred == y)) * 100)}


def quantized_ops_ov(model) -> int:
    """MatMul/Conv ops of an OpenVINO model fed (directly or through a Convert/Reshape) by a FakeQuantize."""
    count = 0
    for op in model.get_ops():
        if op.get_type_name() not in ("MatMul", "Convolution"):
            continue
        for inp in op.inputs():
            src = inp.get_source_output().get_node()
            while src.get_type_name() in ("Convert", "Reshape", "Transpose", "Multiply", "Subtract") and src.inputs():
                src = src.input(0).get_source_output().get_node()
            if src.get_type_name() == "FakeQuantize":
                count += 1
                break
    return count


# --------------------------------------------------------------------------- NNCF


def nncf_runs(fp32_onnx: Path, calib_x: np.ndarray, val_x: np.ndarray, val_y: np.ndarray, smoothquant: bool) -> dict[str, Any]:
    from vitedge.backends.openvino import block_vendor_telemetry

    block_vendor_telemetry()  # NNCF telemetry: a forked sender that hangs on a closed network
    import nncf
    import openvino as ov
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
    )

    ov_model = ov.convert_model(str(fp32_onnx))
    calib_ds = nncf.Dataset([calib_x[i:i + 1] for i in range(len(calib_x))])
    val_ds = nncf.Dataset([(val_x[i:i + 1], int(val_y[i])) for i in range(len(val_x))])
    adv = None if smoothquant else AdvancedQuantizationParameters(smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=-1))

    def validation_fn(compiled_model, data) -> float:
        out = compiled_model.outputs[0]
        hits = [int(np.argmax(compiled_model(x)[out], axis=1)[0] == y) for x, y in data]
        return float(np.mean(hits))

    t0 = time.perf_counter()
    plain = nncf.quantize(ov_model, calib_ds, model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calib_x),
                          advanced_parameters=adv)
    t_plain = time.perf_counter() - t0
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    nlog = logging.getLogger("nncf")
    nlog.addHandler(handler)
    old_level = nlog.level
    nlog.setLevel(logging.INFO)
    try:
        t0 = time.perf_counter()
        ac = nncf.quantize_with_accuracy_control(
            ov_model, calib_ds, val_ds, validation_fn, max_drop=0.002, drop_type=nncf.DropType.ABSOLUTE,
            model_type=nncf.ModelType.TRANSFORMER, subset_size=len(calib_x), advanced_quantization_parameters=adv)
        t_ac = time.perf_counter() - t0
    finally:
        nlog.removeHandler(handler)
        nlog.setLevel(old_level)
    text = stream.getvalue()
    m = re.search(r"(\d+) out of (\d+) were reverted", text)
    total = re.search(r"Total number of quantized operations in the model: (\d+)", text)
    reverted = int(m.group(1)) if m else (0 if "Algorithm completed" in text or total is None else None)
    names = []
    if m:
        tail = text[m.end():].split("\n")[1:]
        names = [l.strip() for l in tail if l.strip() and not l.startswith(("INFO", "nncf"))][: int(m.group(1))]
    return {"plain": plain, "ac": ac, "seconds_plain": t_plain, "seconds_ac": t_ac, "reverted": reverted,
            "quantized_ops_reported": int(total.group(1)) if total else None, "reverted_names": names,
            "plain_quantized_ops": quantized_ops_ov(plain), "ac_quantized_ops": quantized_ops_ov(ac),
            "log_tail": "\n".join(l for l in text.splitlines() if "revert" in l.lower() or "drop" in l.lower() or "completed" in l.lower())[-2000:]}


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", type=float, default=300.0, help="outlier factor of the rewrite")
    ap.add_argument("--methods", default="entropy,percentile")
    ap.add_argument("--latency-seconds", type=float, default=3.0, help="timed seconds per model, at least")
    ap.add_argument("--skip-nncf", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS / "accuracy_budget")
    ap.add_argument("--time", type=Path, default=None, help=argparse.SUPPRESS)  # internal: the timing subprocess
    args = ap.parse_args()
    if args.time is not None:
        timing_main(args.time)
        return

    import make_outlier_vit as mo

    from vitedge.budget import BudgetSearch, BudgetSettings, measure_costs, meet_budget
    from vitedge.validation.reference_cache import ReferenceCacheSettings
    from vitedge.datasources.sources import open_source
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model
    from vitedge.targets.profiles import Thresholds
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    env = environment()
    log(f"{env['machine']}; {env['versions']}")
    global WORK
    work = WORK = Path(tempfile.mkdtemp(prefix="vitedge-budget-bench-"))
    cache = work / "cache"
    ckpt = work / "digits_vit_outliers.pt"
    val_images = mo.val_images()
    made = mo.make_checkpoint(ckpt, k=args.k, verify_on=val_images)
    log(f"outlier model: {made['verification']}")
    loaded = load_model(ckpt, IntakeOptions())
    fp32 = work / "fp32.onnx"
    export_onnx(loaded, fp32)
    pre = loaded.spec.preprocess
    calib = open_source(CALIB, pre)
    val = open_source(VAL, pre, class_names=loaded.spec.class_names)
    calib_x = np.concatenate([b.images for b in calib.batches(64)]).astype(np.float32)
    vb = list(val.batches(64))
    val_x = np.concatenate([b.images for b in vb]).astype(np.float32)
    val_y = np.concatenate([b.labels for b in vb])
    ref_ort = ort_logits(fp32, val_x)
    ov_fp32 = ov_compile(fp32)
    ref_ov = ov_logits(ov_fp32, val_x)
    outliers = channel_ratios(mo, ckpt, val_x[:64])
    doc: dict[str, Any] = {"environment": env, "model": {"rewrite": made["rewrite"], "verification": made["verification"],
                                                         "channel_max_over_median": outliers, "k": args.k},
                           "data": {"calibration": calib.summary.to_dict(), "validation": val.summary.to_dict()},
                           "fp32": {"ort": score(ref_ort, val_y, ref_ort), "openvino": score(ref_ov, val_y, ref_ov)},
                           "settings": [], "schedules": []}
    budget = Thresholds(max_top1_drop=0.2, min_agreement=0.99)
    drop_only = Thresholds(max_top1_drop=0.2, min_agreement=0.0)
    for sq in (False, True):
        models_ov: dict[str, Any] = {"FP32": fp32}  # name -> model file (ONNX or OpenVINO IR) for the timing process
        models_ort: dict[str, Any] = {"FP32": fp32}
        rows: list[dict[str, Any]] = []
        for method in args.methods.split(","):
            cfg = QuantConfig(method=method, smoothquant_alpha=0.5 if sq else None)
            t0 = time.perf_counter()
            cal = calibrate(fp32, calib, cfg, cache_dir=cache)
            t_cal = time.perf_counter() - t0
            full = build_qdq(cal)
            tag = f"vitedge {method}"
            rows.append(row_for(f"{tag}, full INT8", full.model, None, val_x, val_y, ref_ort, ref_ov, models_ov, models_ort,
                                {"float_layers": 0, "int8_layers": len(full.quantized), "calibration_seconds": t_cal}))
            for label, th in (("budget (drop + agreement)", budget), ("budget (drop only)", drop_only)):
                log(f"SmoothQuant {'on' if sq else 'off'}, {method}: {label}")
                r = meet_budget(BudgetSearch(calibration=cal, source=val, thresholds=th, fp32=fp32, full=full,
                                             cache=ReferenceCacheSettings(root=cache), settings=BudgetSettings(),
                                             output_kind="logits", preprocess=pre), log)
                if r.status == "fallback":
                    measure_costs(r, fp32, val_x[:1], latency_seconds=1.0)
                extra = {"status": r.status, "float_layers": len(r.returned), "returned": list(r.returned),
                         "int8_layers": len(r.graph.quantized), "evaluations": r.evaluations_used,
                         "sensitivity": r.sensitivity_cache, "sensitivity_evaluations": r.sensitivity_evaluations,
                         "search_seconds": r.seconds, "calibration_seconds": t_cal,
                         "layer_costs": [c.to_dict() for c in r.costs if c.why == "budget"], "ort_cost_latency": r.latency}
                if r.status == "int8":
                    extra["note"] = "met by the full INT8 graph"
                rows.append(row_for(f"{tag}, {label}", r.graph.model if r.met else None, None, val_x, val_y, ref_ort, ref_ov,
                                    models_ov, models_ort, extra))
        if not args.skip_nncf:
            log(f"NNCF, SmoothQuant {'on' if sq else 'off'} ...")
            n = nncf_runs(fp32, calib_x, val_x, val_y, sq)
            rows.append(row_for("NNCF quantize (TRANSFORMER)", None, n["plain"], val_x, val_y, ref_ort, ref_ov, models_ov, models_ort,
                                {"int8_layers": n["plain_quantized_ops"], "float_layers": 0, "search_seconds": n["seconds_plain"]}))
            rows.append(row_for("NNCF quantize_with_accuracy_control", None, n["ac"], val_x, val_y, ref_ort, ref_ov, models_ov,
                                models_ort, {"int8_layers": n["ac_quantized_ops"], "float_layers": n["reverted"],
                                             "reverted_names": n["reverted_names"], "quantized_ops_reported": n["quantized_ops_reported"],
                                             "search_seconds": n["seconds_ac"], "log": n["log_tail"]}))
        log("latency ...")
        np.save(work / "x1.npy", val_x[:1])
        ov_stats = time_in_subprocess("openvino", models_ov, work, args.latency_seconds)
        ort_stats = time_in_subprocess("onnxruntime", models_ort, work, args.latency_seconds)
        for row in rows:
            key = row["name"]
            if key in ov_stats:
                row["ov_ms"] = ov_stats[key]["p50_ms"]
                row["ov_speedup"] = ov_stats["FP32"]["p50_ms"] / ov_stats[key]["p50_ms"]
            if key in ort_stats:
                row["ort_ms"] = ort_stats[key]["p50_ms"]
                row["ort_speedup"] = ort_stats["FP32"]["p50_ms"] / ort_stats[key]["p50_ms"]
        doc["settings"].append({"smoothquant": sq, "rows": rows,
                                "fp32_ms": {"openvino": ov_stats["FP32"]["p50_ms"], "onnxruntime": ort_stats["FP32"]["p50_ms"]},
                                "latency_stable": all(s["stable"] for s in list(ov_stats.values()) + list(ort_stats.values()))})
        log(json.dumps([{k: v for k, v in r.items() if k in ("name", "float_layers", "ov", "ov_ms", "ov_speedup")} for r in rows], default=str))

    # search schedules on the most damaged setting (sensitivities cached: only evaluations differ)
    method = "percentile" if "percentile" in args.methods else args.methods.split(",")[0]
    cal = calibrate(fp32, calib, QuantConfig(method=method, smoothquant_alpha=None), cache_dir=cache)
    full = build_qdq(cal)
    variants = [("doubling + refinement (default)", BudgetSettings(max_evals=50)),
                ("doubling + refinement, no early stop", BudgetSettings(max_evals=50, early_stop=False)),
                ("doubling, no refinement", BudgetSettings(max_evals=50, refine=False)),
                ("one at a time (groups of 1)", BudgetSettings(max_evals=50, schedule="fixed", group=1, refine=False)),
                ("groups of 4 + refinement", BudgetSettings(max_evals=50, schedule="fixed", group=4))]
    for label, s in variants:
        for name, th in (("drop + agreement", budget), ("drop only", drop_only)):
            r = meet_budget(BudgetSearch(calibration=cal, source=val, thresholds=th, fp32=fp32, full=full,
                                         cache=ReferenceCacheSettings(root=cache), settings=s))
            items = sum(e.accuracy.get("samples", 0) for e in r.evaluations)
            doc["schedules"].append({"schedule": label, "budget": name, "status": r.status, "float_layers": len(r.returned),
                                     "evaluations": r.evaluations_used, "items_run": items, "seconds": r.seconds,
                                     "returned": list(r.returned)})
            log(f"{label} / {name}: {r.status}, {len(r.returned)} float, {r.evaluations_used} evaluations, {items} items, {r.seconds:.1f} s")
    doc["schedule_method"] = method
    doc["environment"]["load_average_end"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=2, default=_json) + "\n")
    args.out.with_suffix(".md").write_text(markdown(doc) + "\n")
    print(markdown(doc))


def _json(v: Any) -> Any:
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    return str(v)


def channel_ratios(mo, ckpt: Path, x: np.ndarray) -> dict[str, float]:
    import torch

    m = mo.build_model(torch.load(ckpt, map_location="cpu", weights_only=True))
    acts: dict[str, np.ndarray] = {}
    for name, mod in m.named_modules():
        if isinstance(mod, torch.nn.Linear):
            mod.register_forward_hook(lambda mod, i, o, name=name: acts.__setitem__(name, i[0].detach().abs().flatten(0, -2).max(0).values.numpy()))
    with torch.no_grad():
        m(torch.from_numpy(x))
    return {n: round(float(a.max() / np.median(a)), 1) for n, a in acts.items()}


def row_for(name: str, onnx_model: Any, ov_model: Any, x, y, ref_ort, ref_ov, models_ov, models_ort, extra: dict) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name, **extra}
    folder = Path(tempfile.mkdtemp(prefix="model-", dir=WORK))
    if onnx_model is not None:
        path = folder / "model.onnx"
        path.write_bytes(onnx_model.SerializeToString())
        row["ort"] = score(ort_logits(onnx_model, x), y, ref_ort)
        row["ov"] = score(ov_logits(ov_compile(path), x), y, ref_ov)
        models_ort[name] = models_ov[name] = path
    elif ov_model is not None:
        import openvino as ov

        path = folder / "model.xml"
        ov.save_model(ov_model, str(path), compress_to_fp16=False)
        row["ov"] = score(ov_logits(ov_compile(ov_model), x), y, ref_ov)
        models_ov[name] = path
    return row


def time_in_subprocess(runtime: str, models: dict[str, Path], work: Path, seconds: float) -> dict[str, dict[str, Any]]:
    """Batch-1 latency of every model, interleaved, in a fresh process (no torch, no other runtime
    and no other session's threads in it: in-process loops showed FP32 ONNX Runtime outliers)."""
    import subprocess

    spec = work / f"timing-{runtime}.json"
    spec.write_text(json.dumps({"runtime": runtime, "models": {k: str(v) for k, v in models.items()},
                                "input": str(work / "x1.npy"), "seconds": seconds}))
    out = subprocess.run([sys.executable, __file__, "--time", str(spec)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def timing_main(spec_path: Path) -> None:
    from vitedge.validation.latency import LatencySettings, measure_interleaved

    spec = json.loads(spec_path.read_text())
    x1 = np.load(spec["input"])
    settings = LatencySettings(min_seconds=spec["seconds"], max_seconds=max(30.0, 12 * spec["seconds"]), rel_tol=0.03)
    runs = {}
    if spec["runtime"] == "openvino":
        for k, path in spec["models"].items():
            req = ov_compile(Path(path)).create_infer_request()
            runs[k] = lambda req=req: req.infer({0: x1})
    else:
        from vitedge.budget import timing_session

        for k, path in spec["models"].items():
            sess = timing_session(Path(path))
            name = sess.get_inputs()[0].name
            runs[k] = lambda sess=sess, name=name: sess.run(None, {name: x1})
    stats = measure_interleaved(runs, 1, settings)
    print(json.dumps({k: {"p50_ms": v.p50_ms, "p90_ms": v.p90_ms, "iterations": v.iterations, "stable": v.stable} for k, v in stats.items()}))


def _f(v: Any, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def markdown(doc: dict[str, Any]) -> str:
    env, model = doc["environment"], doc["model"]
    v = model["verification"]
    lines = ["# Accuracy budget: vitedge fallback vs NNCF accuracy control", "",
             f"- date: {env['date']}; machine: {env['machine']}; load average {_f(env.get('load_average_start'), '.1f')} at start, "
             f"{_f(env.get('load_average_end'), '.1f')} at end (shared machine: only ratios measured in the same loop carry over)",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
             "- command: `flock /tmp/vitedge-bench.lock python benchmarks/accuracy_budget.py`", "",
             "## The model", "",
             f"The bundled digits ViT (FP32 top-1 {doc['fp32']['ort']['top1']:.2f}% on 397 held-out images) with activation outliers "
             f"planted by a function-preserving rewrite (`examples/make_outlier_vit.py`, k = {model['k']:g}):", ""]
    for r in model["rewrite"]:
        lines.append(f"- {r['site']}: channels {r['channels']} x {r['k']:g}")
    ratios = model["channel_max_over_median"]
    planted = {k: v for k, v in ratios.items() if v > 10}
    lines += ["", f"FP32 logits after the rewrite: largest difference {v['max_abs_logit_diff']:.1e} (logits up to {v['max_abs_logit']:.1f}), "
              f"top-1 agreement {100 * v['top1_agreement']:.1f}% on {v['images']} images. Largest input channel / median channel of "
              "the Linear layers fed by a planted site: " + ", ".join(f"{k} {r:g}x" for k, r in planted.items())
              + f" (all other Linear inputs at most {max([r for k, r in ratios.items() if k not in planted] or [0]):g}x).", "",
              "Budget for both tools: top-1 drop at most 0.2 points on the 397 validation images (NNCF: `max_drop=0.002`, "
              "`DropType.ABSOLUTE`); vitedge's build default adds top-1 agreement with FP32 >= 99%, shown separately. "
              "Accuracy on OpenVINO (CPU) unless marked ORT; agreement against FP32 on the same runtime. Latency: batch 1, "
              "p50, on the first validation image, every model of a runtime timed interleaved in one loop, in a fresh "
              "process per runtime. \"search s\" is the "
              "wall time of vitedge's search (sensitivity ranking included, calibration not) and of NNCF's whole call "
              "(its own quantization included; plain `nncf.quantize` alone is the row above it).", ""]
    for s in doc["settings"]:
        lines += [f"## SmoothQuant {'on (alpha 0.5 vitedge; NNCF TRANSFORMER default)' if s['smoothquant'] else 'off'}", "",
                  "| model | float layers | INT8 layers | top-1 OV | drop OV (pt) | agree OV | top-1 ORT | agree ORT | "
                  "OV ms | OV speedup | ORT ms | ORT speedup | search s | evaluations |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        lines.append(f"| FP32 | - | - | {doc['fp32']['openvino']['top1']:.2f} | - | - | {doc['fp32']['ort']['top1']:.2f} | - | "
                     f"{s['fp32_ms']['openvino']:.3f} | 1.00x | {s['fp32_ms']['onnxruntime']:.3f} | 1.00x | - | - |")
        for r in s["rows"]:
            ov, ort = r.get("ov") or {}, r.get("ort") or {}
            fl = r.get("float_layers")
            lines.append(
                f"| {r['name']}{' (not met)' if r.get('status') == 'not-met' else ''} | {'-' if fl is None else fl} | {_f(r.get('int8_layers'), 'd')} | "
                f"{_f(ov.get('top1'))} | {_f(ov.get('drop'))} | {_f(ov.get('agreement'))} | {_f(ort.get('top1'))} | {_f(ort.get('agreement'))} | "
                f"{_f(r.get('ov_ms'), '.3f')} | {_f(r.get('ov_speedup'))}x | {_f(r.get('ort_ms'), '.3f')} | {_f(r.get('ort_speedup'))}x | "
                f"{_f(r.get('search_seconds'), '.1f')} | {_f(r.get('evaluations'), 'd')} |")
        lines.append("")
        if not s["latency_stable"]:
            lines += ["(Some medians did not settle within the time cap: the machine was busy; ratios are from one interleaved loop.)", ""]
        for r in s["rows"]:
            if r.get("returned"):
                lines.append(f"- {r['name']}: returned " + ", ".join(f"`{n}`" for n in r["returned"]))
            if r.get("reverted_names"):
                lines.append(f"- {r['name']}: reverted " + ", ".join(f"`{n}`" for n in r["reverted_names"]))
        lines.append("")
        ratios_text = _ratios(s)
        if ratios_text:
            lines += ratios_text + [""]
    if doc["schedules"]:
        lines += [f"## Search schedule ({doc['schedule_method']}, SmoothQuant off; sensitivities cached, so only evaluations differ)", "",
                  "| schedule | budget | result | float layers | evaluations | validation items run | seconds |", "|---|---|---|---|---|---|---|"]
        for r in doc["schedules"]:
            lines.append(f"| {r['schedule']} | {r['budget']} | {r['status']} | {r['float_layers']} | {r['evaluations']} | {r['items_run']} | {r['seconds']:.1f} |")
        lines.append("")
    return "\n".join(lines)


def _ratios(s: dict[str, Any]) -> list[str]:
    rows = {r["name"]: r for r in s["rows"]}
    ac = rows.get("NNCF quantize_with_accuracy_control")
    out = []
    for name, r in rows.items():
        if not name.startswith("vitedge") or "budget" not in name or ac is None or r.get("ov_ms") is None or ac.get("ov_ms") is None:
            continue
        out.append(f"- {name} vs NNCF AC: {r.get('float_layers')} vs {ac.get('float_layers')} float layers; OpenVINO latency ratio "
                   f"{r['ov_ms'] / ac['ov_ms']:.2f} (ours / NNCF AC); top-1 {_f((r.get('ov') or {}).get('top1'))} vs "
                   f"{_f((ac.get('ov') or {}).get('top1'))}; search {_f(r.get('search_seconds'), '.1f')} s vs {_f(ac.get('search_seconds'), '.1f')} s")
    return out


if __name__ == "__main__":
    main()
