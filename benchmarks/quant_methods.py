"""Issue 13 item 4: vitedge's INT8 refinements measured one by one, beside the anchors.

Run by hand from the repository root (a few minutes per model on 2 cores)::

    python benchmarks/quant_methods.py [--models digits,postnorm,lowconf]

For each bundled model (the digits ViT, the post-norm ViT and the low-confidence digits ViT
of examples/train_lowconf_digits_vit.py), calibrated on calibration/digits/calib (200
images) and evaluated on calibration/digits/val (397 held-out images):

* vitedge's INT8 graph for each method variant (``VARIANTS``), each built from an empty
  calibration cache so its build time is the real one, run in ONNX Runtime and in OpenVINO;
* the anchors' defaults on the same images: ONNX Runtime ``quantize_static`` (QDQ) with
  CalibrationMethod MinMax, Entropy and Percentile; NNCF ``nncf.quantize`` default and
  ``model_type=TRANSFORMER`` (OpenVINO backend, run in OpenVINO; ONNX backend, run in ONNX
  Runtime). NNCF is optional (``pip install nncf``); rows say so when it is missing.

Reported per (model, method, runtime): top-1 agreement with FP32 (ONNX Runtime), top-1
drop in points, mean per-image cosine between FP32 and INT8 logits, and build seconds
(calibration + Q/DQ graph). Writes the section between the ``quant-methods`` markers of
benchmarks/results/quant_accuracy.md (the rest of that file is left as it is) and
benchmarks/results/quant_methods.json, and prints the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
import quant_accuracy as qa  # noqa: E402 - the benchmarks folder is on the path now

RESULTS = REPO / "benchmarks" / "results"
BEGIN, END = "<!-- quant-methods:begin -->", "<!-- quant-methods:end -->"
warnings.filterwarnings("ignore")

# (label, QuantConfig keyword arguments); the first is the baseline the others add to.
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("baseline: entropy, SmoothQuant 0.5, round-to-nearest", {"weight_rounding": "nearest", "bias_correction": False}),
    ("+ bias correction", {"weight_rounding": "nearest", "bias_correction": True}),
    ("+ GPTQ rounding", {"weight_rounding": "gptq", "bias_correction": False}),
    ("+ GPTQ rounding + bias correction", {"weight_rounding": "gptq", "bias_correction": True}),
    ("per-tensor threshold choice (method auto)", {"method": "auto", "bias_correction": False}),
    ("method auto + bias correction", {"method": "auto", "bias_correction": True}),
    ("per-layer SmoothQuant alpha", {"smoothquant_search": True, "bias_correction": False}),
    ("method auto + GPTQ + bias correction", {"method": "auto", "weight_rounding": "gptq", "bias_correction": True}),
]


def load_model(which: str, work: Path):
    if which != "lowconf":
        return qa.load_bundled(which, work)
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model as intake

    pt = REPO / "examples" / "lowconf_digits_vit.pt"
    loaded = intake(pt, IntakeOptions())
    out = work / "lowconf.fp32.onnx"
    export_onnx(loaded, out)
    return out, loaded.spec


def cosine(ref: np.ndarray, got: np.ndarray) -> float:
    a, b = ref.astype(np.float64), got.astype(np.float64)
    num = (a * b).sum(1)
    den = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return float(np.mean(num / np.maximum(den, 1e-30)))


def measure(logits: np.ndarray, labels: np.ndarray, ref_logits: np.ndarray, fp32_top1: float) -> dict[str, float]:
    pred = logits.argmax(1)
    top1 = float((pred == labels).mean() * 100)
    return {"top1": top1, "drop": fp32_top1 - top1, "agreement": float((pred == ref_logits.argmax(1)).mean() * 100),
            "cosine": cosine(ref_logits, logits)}


# ONNX Runtime's Entropy with its quantize_static defaults (128 histogram bins = 128 quantized bins) has a
# single candidate threshold, the full range, so it gives MinMax's ranges exactly (checked: all 158 scales of
# ashu-mha equal) and quantize_static passes no num_bins through. "Entropy 512 bins" is the KL search it is
# meant to be (512 histogram bins, 128 quantized: 193 candidate thresholds per tensor; TensorRT's 2048 bins
# took over 10 minutes per model in ORT's Python search on this machine): ranges from ORT's own
# EntropyCalibrater, fed to quantize_static through its calibration cache file.
ORT_METHODS = ("MinMax", "Entropy", "Entropy 512 bins", "Percentile")


def _ort_entropy_cache(fp32: Path, reader, cache: Path) -> None:
    from onnxruntime.quantization.calibrate import CalibrationMethod, create_calibrator, save_tensors_data
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    ops = sorted(set(QLinearOpsRegistry) | set(QDQRegistry))
    with tempfile.TemporaryDirectory(prefix="ort-entropy-") as tmp:
        cal = create_calibrator(fp32, ops, augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                calibrate_method=CalibrationMethod.Entropy,
                                extra_options={"num_bins": 512, "num_quantized_bins": 128})
        cal.collect_data(reader)
        save_tensors_data(cal.compute_data(), cache)


def ort_static_graphs(fp32: Path, calib_batches: list[np.ndarray], work: Path, prefix: str = "",
                      methods: tuple[str, ...] = ORT_METHODS):
    """ONNX Runtime's quantize_static (QDQ, its defaults otherwise) with each calibration method on the same
    batches: yields (method, graph path, seconds, None), or (method, None, 0.0, error) when it fails."""
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"input": b} for b in calib_batches)

        def get_next(self):
            return next(self.it, None)

    for method in methods:
        out = work / f"{prefix}ort_{method.replace(' ', '_')}.onnx"
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                kwargs: dict[str, Any] = {"calibrate_method": getattr(CalibrationMethod, method.split()[0])}
                if method == "Entropy 512 bins":
                    cache = out.with_suffix(".ranges.json")
                    cache.unlink(missing_ok=True)
                    _ort_entropy_cache(fp32, Reader(), cache)
                    kwargs["calibration_cache_path"] = str(cache)
                quantize_static(str(fp32), str(out), Reader(), **kwargs)
        except Exception as err:
            yield method, None, 0.0, err
            continue
        yield method, out, time.perf_counter() - t0, None


def anchors(fp32: Path, calib_batches: list[np.ndarray], x: np.ndarray, labels: np.ndarray, ref_logits: np.ndarray, fp32_top1: float,
            work: Path) -> list[dict]:
    import onnx

    rows = []
    for method, out, secs, err in ort_static_graphs(fp32, calib_batches, work):
        if err is not None:
            rows.append({"method": f"ORT quantize_static {method}", "error": f"{type(err).__name__}: {err}"[:160]})
            continue
        for runtime, fn in (("onnxruntime", qa.ort_predict), ("openvino", qa.ov_predict)):
            rows.append({"method": f"ORT quantize_static {method} (defaults, QDQ)", "runtime": runtime, "seconds": secs,
                         **measure(fn(out, x), labels, ref_logits, fp32_top1)})
    try:
        from vitedge.backends.openvino import block_vendor_telemetry

        block_vendor_telemetry()  # NNCF telemetry: a forked sender that hangs on a closed network
        import nncf
        import openvino as ov
    except ImportError:
        rows.append({"method": "NNCF", "error": "nncf is not installed (pip install nncf)"})
        return rows
    items = [b[i:i + 1] for b in calib_batches for i in range(len(b))]
    for label, kwargs in (("default", {}), ("TRANSFORMER", {"model_type": nncf.ModelType.TRANSFORMER})):
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                q_ov = nncf.quantize(ov.Core().read_model(str(fp32)), nncf.Dataset(items), **kwargs)
            rows.append({"method": f"NNCF {label} (OpenVINO backend)", "runtime": "openvino", "seconds": time.perf_counter() - t0,
                         **measure(qa.ov_predict(q_ov, x), labels, ref_logits, fp32_top1)})
        except Exception as err:
            rows.append({"method": f"NNCF {label} (OpenVINO backend)", "runtime": "openvino", "error": f"{type(err).__name__}: {err}"[:160]})
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                q_onnx = nncf.quantize(onnx.load(str(fp32)), nncf.Dataset([{"input": i} for i in items]), **kwargs)
            rows.append({"method": f"NNCF {label} (ONNX backend)", "runtime": "onnxruntime", "seconds": time.perf_counter() - t0,
                         **measure(qa.ort_predict(q_onnx.SerializeToString(), x), labels, ref_logits, fp32_top1)})
        except Exception as err:
            rows.append({"method": f"NNCF {label} (ONNX backend)", "runtime": "onnxruntime", "error": f"{type(err).__name__}: {err}"[:160]})
    return rows


def run_model(which: str, work: Path, variants: list[tuple[str, dict[str, Any]]], with_anchors: bool) -> dict[str, Any]:
    from vitedge.datasources.sources import open_source
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    qa.log(f"== {which}: export")
    fp32, spec = load_model(which, work)
    calib = open_source(qa.CALIB, spec.preprocess, class_names=spec.class_names)
    val = open_source(qa.VAL, spec.preprocess, class_names=spec.class_names)
    x = np.concatenate([b.images for b in val.batches(128)])
    labels = np.concatenate([b.labels for b in val.batches(128)])
    ref_logits = qa.ort_predict(fp32, x)
    fp32_top1 = float((ref_logits.argmax(1) == labels).mean() * 100)
    ov32 = qa.ov_predict(fp32, x)
    margins = np.sort(ref_logits, axis=1)
    rows = []
    for k, (label, kwargs) in enumerate(variants):
        qa.log(f"== {which}: {label}")
        cfg = QuantConfig(**kwargs)
        t0 = time.perf_counter()
        cal = calibrate(fp32, calib, cfg, cache_dir=work / f"cache-{which}-{k}")
        q = build_qdq(cal)
        secs = time.perf_counter() - t0
        path = work / f"{which}.{k}.int8.onnx"
        q.save(path)
        for runtime, fn in (("onnxruntime", qa.ort_predict), ("openvino", qa.ov_predict)):
            rows.append({"method": label, "runtime": runtime, "config": cfg.to_dict(), "seconds": secs,
                         "refinement_seconds": cal.timings.get("refinement", 0.0), **measure(fn(path, x), labels, ref_logits, fp32_top1)})
    anchor_rows = anchors(fp32, [b.images for b in calib.batches(1)], x, labels, ref_logits, fp32_top1, work) if with_anchors else []
    return {"model": which, "val_images": int(len(x)), "calib_images": len(calib), "fp32_top1": fp32_top1,
            "fp32_openvino": measure(ov32, labels, ref_logits, fp32_top1),
            "fp32_median_top2_margin": float(np.median(margins[:, -1] - margins[:, -2])), "vitedge": rows, "anchors": anchor_rows}


def markdown(res: dict[str, Any]) -> str:
    env = res["environment"]
    out = [BEGIN, "", "# Issue 13 item 4: INT8 refinements one by one, and the anchors", "",
           f"Generated by `python benchmarks/quant_methods.py` on {env['date']}.", "",
           f"- CPU: {res['cpu']}", f"- Machine: {env['machine']}; {env['platform']}",
           "- Versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
           *[f"- Rows added by a later run (`--merge`) on {r['date']}: {', '.join(r['methods'])}" for r in res.get("merged_runs", [])], "",
           "Agreement is top-1 agreement with the FP32 graph in ONNX Runtime on the 397 held-out digits (one image = 0.25 pt); "
           "drop is FP32 top-1 minus INT8 top-1 in points (negative: INT8 is right more often); cosine is the mean per-image "
           "cosine of the FP32 and INT8 logits. Build s is calibration + Q/DQ graph from an empty cache, on this shared machine.", ""]
    for m in res["models"]:
        if "error" in m:
            out += [f"## {m['model']}", "", f"not measured: {m['error']}", ""]
            continue
        ov = m["fp32_openvino"]
        out += [f"## {m['model']}: FP32 top-1 {m['fp32_top1']:.2f} %, median top-2 logit margin {m['fp32_median_top2_margin']:.2f}", "",
                f"FP32 in OpenVINO (its defaults): agreement {ov['agreement']:.2f} %, cosine {ov['cosine']:.6f}.", "",
                "| method | runtime | agreement % | top-1 drop (pt) | logit cosine | build s | of which refinement s |", "|---|---|---:|---:|---:|---:|---:|"]
        for r in m["vitedge"] + m["anchors"]:
            if "error" in r:
                out.append(f"| {r['method']} | {r.get('runtime', '')} | error: {r['error']} | | | | |")
            else:
                out.append(f"| {r['method']} | {r['runtime']} | {r['agreement']:.2f} | {r['drop']:+.2f} | {r['cosine']:.6f} | {r['seconds']:.1f} | {r['refinement_seconds']:.1f} |" if 'refinement_seconds' in r else
                           f"| {r['method']} | {r['runtime']} | {r['agreement']:.2f} | {r['drop']:+.2f} | {r['cosine']:.6f} | {r['seconds']:.1f} | |")
        out.append("")
    for note in res.get("notes", []):
        out += [note, ""]
    out += [END]
    return "\n".join(out) + "\n"


def write_section(md: str, path: Path) -> None:
    from vitedge.files.atomic import atomic_write_path

    old = path.read_text() if path.exists() else ""
    if BEGIN in old and END in old:
        new = old[:old.index(BEGIN)] + md.rstrip("\n") + old[old.index(END) + len(END):]
    else:
        new = md + ("\n" + old if old else "")
    with atomic_write_path(path) as tmp:
        tmp.write_text(new)


def _cpu(info) -> str:
    return f"{info.model or 'unknown'} ({info.machine}), ISA {info.isa}, INT8 dot product (VNNI): {info.int8_dot_product}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="digits,postnorm,lowconf")
    ap.add_argument("--variants", default="", help="comma-separated indices into VARIANTS (default: all)")
    ap.add_argument("--no-anchors", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--merge", action="store_true",
                    help="add this run's vitedge rows to the saved quant_methods.json (same models; anchors and FP32 kept from it)")
    args = ap.parse_args()
    from vitedge.core.cpu import read_cpu

    variants = [VARIANTS[int(i)] for i in args.variants.split(",")] if args.variants else VARIANTS
    saved = args.out / "quant_methods.json"
    old = json.loads(saved.read_text()) if args.merge and saved.exists() else None
    start = time.perf_counter()
    res: dict[str, Any] = {"environment": qa.environment(), "cpu": _cpu(read_cpu()), "models": []}
    with tempfile.TemporaryDirectory(prefix="vitedge-methods-") as tmp:
        for which in [m for m in args.models.split(",") if m]:
            try:
                res["models"].append(run_model(which, Path(tmp), variants, not args.no_anchors))
            except FileNotFoundError as err:
                res["models"].append({"model": which, "error": f"{err} is missing"})
            md = save(merged(old, res), start, args.out)  # after every model: a partial run still leaves its figures
    print(md)


def merged(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``old`` (a saved run) with ``new``'s vitedge rows added (a row of the same method and runtime replaced)."""
    if old is None:
        return new
    out = json.loads(json.dumps(old))
    by_model = {m["model"]: m for m in out["models"]}
    for m in new["models"]:
        if "error" in m or m["model"] not in by_model:
            by_model[m["model"]] = m
            continue
        fresh = {(n["method"], n["runtime"]) for n in m["vitedge"]}
        by_model[m["model"]]["vitedge"] = [r for r in by_model[m["model"]]["vitedge"] if (r["method"], r["runtime"]) not in fresh] + m["vitedge"]
    out["models"] = list(by_model.values())
    out["merged_runs"] = out.get("merged_runs", []) + [{"date": new["environment"]["date"], "models": [m["model"] for m in new["models"]],
                                                         "methods": sorted({r["method"] for m in new["models"] for r in m.get("vitedge", [])})}]
    return out


def save(res: dict[str, Any], start: float, out: Path) -> str:
    res["seconds"] = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    (out / "quant_methods.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res)
    write_section(md, out / "quant_accuracy.md")
    return md


if __name__ == "__main__":
    main()
