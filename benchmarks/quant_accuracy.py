"""INT8 accuracy of vitedge's quantizer against FP32 and against the anchor tools, and
ViT-B/16 latency with and without attention-matmul quantization.

Run by hand from the repository root (about 15-25 minutes on 2 cores):

    python benchmarks/quant_accuracy.py

Everything is measured side by side in one run on the same data:

* the bundled digits ViT (timm, pre-norm) and the bundled post-norm ViT
  (nn.TransformerEncoder), each calibrated on calibration/digits/calib (200 images) and
  evaluated on calibration/digits/val (397 held-out images);
* FP32 (ONNX Runtime: the reference every agreement figure is against);
* vitedge INT8 for every calibration method x SmoothQuant on/off x attention matmuls
  on/off, each run in ONNX Runtime and in OpenVINO (``compile_model(qdq.onnx, "CPU")``);
  plus a percentile sweep and a SmoothQuant alpha sweep;
* the anchors' defaults: ONNX Runtime ``quantize_static(model, out, reader)`` (QDQ)
  and NNCF ``nncf.quantize(ov_model, nncf.Dataset(...), model_type=TRANSFORMER)``
  on OpenVINO (and NNCF's ONNX backend with the same call, run in ONNX Runtime);
* ViT-B/16 (timm, random weights) latency at batch 1, FP32 vs INT8 with and without
  the attention matmuls quantized, ONNX Runtime and OpenVINO on all cores; rounds
  interleave the graphs so machine load hits them alike, with an untimed settle run per
  graph per round (benchmarks/timing.py).

Writes benchmarks/results/quant_accuracy.md and .json and prints the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import io
import json
import os
import platform
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
from timing import TIMED_PER_ROUND, interleaved_rounds  # noqa: E402 - the benchmarks folder is on the path now

CALIB = REPO / "calibration" / "digits" / "calib"
VAL = REPO / "calibration" / "digits" / "val"
RESULTS = REPO / "benchmarks" / "results"

METHODS = ("minmax", "percentile", "entropy", "mse")
PERCENTILES = (99.9, 99.99, 99.999)
ALPHAS = (0.25, 0.5, 0.75, 0.9)

warnings.filterwarnings("ignore")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- environment


def environment() -> dict[str, Any]:
    import onnx
    import onnxruntime
    import openvino
    import torch

    import vitedge

    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    flags = ""
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
        flags = " ".join(f for f in ("avx512_vnni", "avx512_bf16", "amx_int8", "avx2") if f in text)
    versions = {"python": platform.python_version(), "vitedge": vitedge.__version__, "torch": torch.__version__,
                "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__, "openvino": openvino.__version__}
    for name in ("nncf", "timm", "numpy"):
        with contextlib.suppress(Exception):
            versions[name] = __import__(name).__version__
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{cpu}, {os.cpu_count()} cores ({flags})",
        "platform": platform.platform(),
        "versions": versions,
        "load_average_start": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


# --------------------------------------------------------------------------- runners


def ort_predict(path_or_bytes, x: np.ndarray, threads: int = 2) -> np.ndarray:
    from vitedge.onnxkit.session import ort_session

    src = Path(path_or_bytes) if isinstance(path_or_bytes, (str, Path)) else path_or_bytes
    sess = ort_session(src, threads=threads)
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: x[i:i + 100]})[0] for i in range(0, len(x), 100)])


def ov_predict(model, x: np.ndarray, config: dict | None = None) -> np.ndarray:
    import openvino as ov

    compiled = ov.Core().compile_model(str(model) if isinstance(model, Path) else model, "CPU", config or {})
    req = compiled.create_infer_request()
    return np.concatenate([np.array(req.infer({0: x[i:i + 100]})[0]) for i in range(0, len(x), 100)])


def score(logits: np.ndarray, labels: np.ndarray, ref_pred: np.ndarray, ref_logits: np.ndarray | None = None) -> dict[str, float]:
    pred = logits.argmax(1)
    out = {"top1": float((pred == labels).mean() * 100), "agreement": float((pred == ref_pred).mean() * 100)}
    if ref_logits is not None:
        out["kl_1e4"] = kl(ref_logits, logits) * 1e4
    return out


def kl(ref: np.ndarray, got: np.ndarray) -> float:
    """Mean KL(softmax(FP32) || softmax(INT8)): finer than agreement on a few hundred images."""
    def log_softmax(z):
        z = z.astype(np.float64) - z.max(1, keepdims=True)
        return z - np.log(np.exp(z).sum(1, keepdims=True))

    lp, lq = log_softmax(ref), log_softmax(got)
    return float(np.mean((np.exp(lp) * (lp - lq)).sum(1)))


# --------------------------------------------------------------------------- accuracy


def load_bundled(which: str, work: Path):
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model

    if which == "digits":
        pt, opts = REPO / "examples" / "digits_vit.pt", IntakeOptions()
    elif which == "outliers":
        maker = REPO / "examples" / "make_outlier_vit.py"
        if not maker.exists():
            raise FileNotFoundError(maker)
        sys.path.insert(0, str(maker.parent))
        import make_outlier_vit

        pt, opts = work / "digits_vit_outliers.pt", IntakeOptions()
        make_outlier_vit.make_checkpoint(pt)
    else:
        pt, opts = REPO / "examples" / "postnorm_vit.pt", IntakeOptions(model_class=str(REPO / "examples" / "postnorm_vit.py") + ":PostNormViT")
    if not pt.exists():
        raise FileNotFoundError(pt)
    loaded = load_model(pt, opts)
    out = work / f"{which}.fp32.onnx"
    export_onnx(loaded, out)
    return out, loaded.spec


def anchors(fp32: Path, calib_batches: list[np.ndarray], x: np.ndarray, labels: np.ndarray, ref: np.ndarray, ref_logits: np.ndarray,
            work: Path) -> list[dict]:
    import onnx

    from vitedge.quantize import check_qdq_graph

    rows = []
    # ONNX Runtime quantize_static, default arguments (QDQ format)
    from onnxruntime.quantization import CalibrationDataReader, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter({"input": b} for b in calib_batches)

        def get_next(self):
            return next(self.it, None)

    ortq = work / "ort_quantize_static.onnx"
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        quantize_static(str(fp32), str(ortq), Reader())
    secs = time.perf_counter() - t0
    violations = check_qdq_graph(onnx.load(str(ortq)))
    rows.append({"tool": "ONNX Runtime quantize_static (defaults, QDQ)", "runtime": "onnxruntime", **score(ort_predict(ortq, x), labels, ref, ref_logits),
                 "seconds": secs, "trt_rule_violations": len(violations)})
    rows.append({"tool": "ONNX Runtime quantize_static (defaults, QDQ)", "runtime": "openvino", **score(ov_predict(ortq, x), labels, ref, ref_logits),
                 "seconds": secs, "trt_rule_violations": len(violations)})
    # NNCF, model_type=TRANSFORMER: OpenVINO backend, and the ONNX backend run in ONNX Runtime
    from vitedge.backends.openvino import block_vendor_telemetry

    block_vendor_telemetry()  # NNCF telemetry: a forked sender that hangs on a closed network
    import nncf
    import openvino as ov

    items = [b[i:i + 1] for b in calib_batches for i in range(len(b))]
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        q_ov = nncf.quantize(ov.Core().read_model(str(fp32)), nncf.Dataset(items), model_type=nncf.ModelType.TRANSFORMER)
    secs = time.perf_counter() - t0
    rows.append({"tool": "NNCF quantize(model_type=TRANSFORMER)", "runtime": "openvino", **score(ov_predict(q_ov, x), labels, ref, ref_logits),
                 "seconds": secs, "trt_rule_violations": None})
    try:
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            q_onnx = nncf.quantize(onnx.load(str(fp32)), nncf.Dataset([{"input": i} for i in items]), model_type=nncf.ModelType.TRANSFORMER)
        secs = time.perf_counter() - t0
        violations = check_qdq_graph(q_onnx)
        rows.append({"tool": "NNCF quantize(model_type=TRANSFORMER), ONNX backend", "runtime": "onnxruntime",
                     **score(ort_predict(q_onnx.SerializeToString(), x), labels, ref, ref_logits), "seconds": secs, "trt_rule_violations": len(violations)})
    except Exception as err:  # report, do not hide
        rows.append({"tool": "NNCF quantize(model_type=TRANSFORMER), ONNX backend", "runtime": "onnxruntime", "error": f"{type(err).__name__}: {err}"[:200]})
    return rows


def accuracy(which: str, work: Path) -> dict[str, Any]:
    from vitedge.datasources.sources import open_source
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    log(f"== {which}: export")
    fp32, spec = load_bundled(which, work)
    calib = open_source(CALIB, spec.preprocess, class_names=spec.class_names)
    val = open_source(VAL, spec.preprocess, class_names=spec.class_names)
    x = np.concatenate([b.images for b in val.batches(128)])
    labels = np.concatenate([b.labels for b in val.batches(128)])
    ref_logits = ort_predict(fp32, x)
    ref = ref_logits.argmax(1)
    fp32_rows = [
        {"runtime": "onnxruntime", **score(ref_logits, labels, ref, ref_logits)},
        {"runtime": "openvino (default: bf16 where the CPU has it)", **score(ov_predict(fp32, x), labels, ref, ref_logits)},
        {"runtime": "openvino (INFERENCE_PRECISION_HINT=f32)", **score(ov_predict(fp32, x, {"INFERENCE_PRECISION_HINT": "f32"}), labels, ref, ref_logits)},
    ]
    cache = work / f"cache-{which}"
    calibrations: dict[tuple, Any] = {}

    def cal_for(cfg: QuantConfig):
        key = (cfg.method, cfg.percentile, cfg.smoothquant_alpha, cfg.smoothquant_shared)
        if key not in calibrations:
            calibrations[key] = calibrate(fp32, calib, cfg, cache_dir=cache)
        return calibrations[key]

    def evaluate(cfg: QuantConfig, tag: str, group: str) -> list[dict]:
        t0 = time.perf_counter()
        cal = cal_for(cfg)
        q = build_qdq(cal, quantize_attention=cfg.quantize_attention)
        path = work / f"{which}.int8.onnx"
        q.save(path)
        out = []
        for runtime, fn in (("onnxruntime", ort_predict), ("openvino", ov_predict)):
            out.append({"model": which, "group": group, "setting": tag, "runtime": runtime, "config": cfg.to_dict(),
                        **score(fn(path, x), labels, ref, ref_logits), "layers_int8": len(q.quantized), "layers": len(q.layers),
                        "calibration_seconds": cal.timings.get("total", 0.0), "seconds": time.perf_counter() - t0})
        return out

    rows: list[dict] = []
    default = QuantConfig()
    log(f"== {which}: grid")
    for method in METHODS:
        for alpha in (default.smoothquant_alpha, None):
            for attn in (False, True):
                cfg = QuantConfig(method=method, smoothquant_alpha=alpha, quantize_attention=attn)
                tag = f"{method}{' ' + format(cfg.percentile, 'g') if method == 'percentile' else ''}, SQ {'off' if alpha is None else alpha}, attn {'INT8' if attn else 'float'}"
                rows += evaluate(cfg, tag, "grid")
    log(f"== {which}: sweeps")
    for p in PERCENTILES:
        rows += evaluate(QuantConfig(method="percentile", percentile=p), f"percentile {p:g}", "percentile sweep")
    for alpha in ALPHAS:
        rows += evaluate(QuantConfig(method=default.method, smoothquant_alpha=alpha), f"{default.method}, alpha {alpha:g}", "alpha sweep")
    rows += evaluate(QuantConfig(method=default.method, smoothquant_alpha=None), f"{default.method}, SmoothQuant off", "alpha sweep")
    rows += evaluate(QuantConfig(method=default.method, smoothquant_alpha=default.smoothquant_alpha, smoothquant_shared=True),
                     f"{default.method}, alpha {default.smoothquant_alpha:g} + explicit Mul at shared (post-norm) LayerNorms", "alpha sweep")
    rows += evaluate(default, f"vitedge default ({default.describe()})", "default")
    log(f"== {which}: anchors")
    calib_batches = [b.images for b in calib.batches(1)]
    anchor_rows = anchors(fp32, calib_batches, x, labels, ref, ref_logits, work)
    return {"model": which, "val_images": int(len(x)), "calib_images": len(calib), "fp32": fp32_rows, "vitedge": rows, "anchors": anchor_rows,
            "default_config": default.to_dict()}


# --------------------------------------------------------------------------- latency


def latency(work: Path, rounds: int) -> dict[str, Any]:
    import onnxruntime as ort
    import openvino as ov
    import timm
    import torch

    from vitedge.datasources.sources import open_source
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    log("== ViT-B/16: export")
    torch.manual_seed(0)
    pt = work / "vit_base_patch16_224.pt"
    torch.save(timm.create_model("vit_base_patch16_224", pretrained=False).state_dict(), pt)
    loaded = load_model(pt, IntakeOptions(arch="vit_base_patch16_224"))
    fp32 = work / "vitb.fp32.onnx"
    export_onnx(loaded, fp32)
    spec = loaded.spec
    del loaded
    log("== ViT-B/16: calibrate (32 images)")
    src = open_source(CALIB, spec.preprocess, limit=32, seed=0)
    cal = calibrate(fp32, src, QuantConfig(), cache_dir=work / "cache-vitb")
    graphs = {"FP32": fp32}
    for attn in (False, True):
        p = work / f"vitb.int8.attn-{attn}.onnx"
        build_qdq(cal, keep_float=() if attn else ("attention_matmul",)).save(p)
        graphs[f"INT8, attention {'INT8' if attn else 'float'}"] = p
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    runs: dict[tuple[str, str], Any] = {}
    core = ov.Core()
    threads = os.cpu_count() or 1
    for name, path in graphs.items():
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.log_severity_level = 3
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        runs[("onnxruntime", name)] = lambda s=sess: s.run(None, {"input": x})
        req = core.compile_model(str(path), "CPU").create_infer_request()
        runs[("openvino", name)] = lambda r=req: r.infer({0: x})
        if name == "FP32":
            req32 = core.compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
            runs[("openvino", "FP32 (f32 hint)")] = lambda r=req32: r.infer({0: x})
    log(f"== ViT-B/16: {rounds} interleaved rounds")
    for f in runs.values():
        for _ in range(3):
            f()
    load = [os.getloadavg()[0]]
    times, _ = interleaved_rounds(runs, rounds)  # per round: median of its timed runs, after a settle run
    load.append(os.getloadavg()[0])
    rows = []
    for (runtime, name), ts in times.items():
        base = np.median(times[(runtime, "FP32")])
        f32 = np.median(times[("openvino", "FP32 (f32 hint)")]) if runtime == "openvino" else None
        rows.append({"runtime": runtime, "graph": name, "median_ms": float(np.median(ts)), "min_ms": float(np.min(ts)),
                     "p90_ms": float(np.percentile(ts, 90)), "ratio_to_fp32": float(np.median(ts) / base),
                     "ratio_to_fp32_f32": float(np.median(ts) / f32) if f32 else None, "runs": len(ts)})
    return {"model": "timm vit_base_patch16_224 (random weights)", "batch": 1, "threads": threads, "rounds": rounds, "warmup": 3, "timed_per_round": TIMED_PER_ROUND,
            "load_average": load, "calibration_images": len(src), "rows": rows}


# --------------------------------------------------------------------------- report


def markdown(res: dict[str, Any]) -> str:
    env = res["environment"]
    out = ["# INT8 accuracy and ViT-B/16 latency: vitedge vs FP32 and the anchor tools", "",
           f"Generated by `python benchmarks/quant_accuracy.py` on {env['date']}.", "",
           f"- Machine: {env['machine']}; {env['platform']}",
           "- Versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()),
           f"- Load average at start: {env.get('load_average_start')} (other jobs shared this machine; latency rounds are interleaved)",
           f"- Wall time: {res.get('seconds', 0):.0f} s", ""]
    out += ["Every agreement figure is top-1 agreement with the FP32 graph run in ONNX Runtime (the PyTorch-exact reference) "
            "on the same held-out images. OpenVINO runs the Q/DQ ONNX file directly (`compile_model(path, \"CPU\")`), with "
            "its defaults: on a CPU with AVX512-BF16 that executes the float parts in bf16.", ""]
    for acc in res["accuracy"]:
        if "error" in acc:
            out += [f"## {acc['model']}", "", f"not measured: {acc['error']}", ""]
            continue
        n = acc["val_images"]
        out += [f"## {acc['model']} ViT: {n} held-out images, calibrated on {acc['calib_images']}", "",
                f"One image is {100 / n:.2f} points; an agreement shown as {100 * (n - 2) / n:.2f} is {n - 2}/{n} = "
                f"{100 * (n - 2) / n:.3f} %, under the 99.5 % bar.", ""]
        out += ["| FP32 runtime | top-1 % | agreement % |", "|---|---:|---:|"]
        for r in acc["fp32"]:
            out.append(f"| {r['runtime']} | {r['top1']:.2f} | {r['agreement']:.2f} |")
        out.append("")
        by = {}
        for r in acc["vitedge"]:
            by.setdefault((r["group"], r["setting"]), {})[r["runtime"]] = r
        for group in ("default", "grid", "percentile sweep", "alpha sweep"):
            keys = [k for k in by if k[0] == group]
            if not keys:
                continue
            out += [f"### vitedge: {group}", "",
                    "| setting | ORT top-1 | ORT agree | ORT KL x1e4 | OV top-1 | OV agree | OV KL x1e4 | INT8 layers |",
                    "|---|---:|---:|---:|---:|---:|---:|---:|"]
            for k in keys:
                o, v = by[k]["onnxruntime"], by[k]["openvino"]
                out.append(f"| {k[1]} | {o['top1']:.2f} | {o['agreement']:.2f} | {o['kl_1e4']:.2f} | {v['top1']:.2f} | {v['agreement']:.2f} | "
                           f"{v['kl_1e4']:.2f} | {o['layers_int8']}/{o['layers']} |")
            out.append("")
        out += ["### anchors (their defaults, same data)", "",
                "| tool | runtime | top-1 % | agreement % | KL x1e4 | TensorRT-rule violations |", "|---|---|---:|---:|---:|---:|"]
        for r in acc["anchors"]:
            if "error" in r:
                out.append(f"| {r['tool']} | {r['runtime']} | error: {r['error']} | | | |")
            else:
                viol = "n/a (OpenVINO IR)" if r.get("trt_rule_violations") is None else str(r["trt_rule_violations"])
                out.append(f"| {r['tool']} | {r['runtime']} | {r['top1']:.2f} | {r['agreement']:.2f} | {r['kl_1e4']:.2f} | {viol} |")
        out.append("")
        bar = res.get("bar", {}).get(acc["model"])
        if bar:
            out += [f"**Bar** (default within 0.2 pt of FP32 top-1 and >= 99.5 % agreement, ORT and OV): "
                    f"{'met' if bar['met'] else 'NOT met'} ({bar['detail']})", ""]
    sel = res.get("selection")
    if sel:
        out += ["## Choosing the defaults", "",
                f"Every setting measured on all of {', '.join(sel['models'])}, in ONNX Runtime and OpenVINO, ranked by the worst "
                "top-1 agreement with FP32 (higher is better), then by mean KL(FP32 || INT8) (lower is better). "
                "`*` marks vitedge's default.", "",
                "| rank | setting | worst agreement % | mean KL x1e4 | worst top-1 change (pt) |", "|---:|---|---:|---:|---:|"]
        for k, r in enumerate(sel["ranking"], 1):
            star = " *" if r["is_default"] else ""
            out.append(f"| {k} | {r['setting']}{star} | {r['worst_agreement']:.2f} | {r['mean_kl_1e4']:.2f} | {r['worst_top1_change']:+.2f} |")
        out.append("")
    lat = res.get("latency")
    if lat and "rows" in lat:
        out += [f"## Latency: {lat['model']}, batch {lat['batch']}, {lat['threads']} threads", "",
                f"Median of {lat['rounds']} interleaved rounds after {lat['warmup']} warm-up runs (each round: one untimed "
                f"settle run per graph, then the median of {lat.get('timed_per_round', 1)} timed runs; benchmarks/timing.py); load average "
                f"{lat['load_average'][0]:.1f} -> {lat['load_average'][1]:.1f}. Calibrated on {lat['calibration_images']} images.", "",
                "| runtime | graph | median ms | min ms | p90 ms | median / FP32 | median / FP32 (f32) |", "|---|---|---:|---:|---:|---:|---:|"]
        for r in lat["rows"]:
            f32 = f"{r['ratio_to_fp32_f32']:.2f}" if r.get("ratio_to_fp32_f32") is not None else ""
            out.append(f"| {r['runtime']} | {r['graph']} | {r['median_ms']:.1f} | {r['min_ms']:.1f} | {r['p90_ms']:.1f} | {r['ratio_to_fp32']:.2f} | {f32} |")
        out.append("")
    elif lat:
        out += ["## Latency", "", f"not measured: {lat.get('error')}", ""]
    return "\n".join(out) + "\n"


def selection(accs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Rank every measured setting over all models and both runtimes."""
    from vitedge.quantize import QuantConfig

    accs = [a for a in accs if "error" not in a]
    if not accs:
        return None
    default = json.dumps(QuantConfig().to_dict(), sort_keys=True)
    fp32 = {a["model"]: a["fp32"][0]["top1"] for a in accs}
    groups: dict[str, list[dict]] = {}
    for a in accs:
        for r in a["vitedge"]:
            groups.setdefault(json.dumps(r["config"], sort_keys=True), []).append(r)
    want = len(accs) * 2
    ranking = []
    for key, rows in groups.items():
        seen = {(r["model"], r["runtime"]) for r in rows}
        if len(seen) < want:
            continue
        uniq = {(r["model"], r["runtime"]): r for r in rows}.values()
        ranking.append({"setting": QuantConfig(**json.loads(key)).describe(), "config": json.loads(key), "is_default": key == default,
                        "worst_agreement": min(r["agreement"] for r in uniq), "mean_kl_1e4": float(np.mean([r["kl_1e4"] for r in uniq])),
                        "worst_top1_change": min(r["top1"] - fp32[r["model"]] for r in uniq)})
    ranking.sort(key=lambda r: (-r["worst_agreement"], r["mean_kl_1e4"]))
    return {"models": [a["model"] for a in accs], "ranking": ranking}


def check_bar(acc: dict[str, Any]) -> dict[str, Any]:
    fp32 = acc["fp32"][0]["top1"]
    rows = [r for r in acc["vitedge"] if r["group"] == "default"]
    ok = all(fp32 - r["top1"] <= 0.2 + 1e-9 and r["agreement"] >= 99.5 for r in rows)
    detail = "; ".join(f"{r['runtime']} {r['top1']:.2f} vs FP32 {fp32:.2f}, agreement {r['agreement']:.2f}" for r in rows)
    return {"met": ok, "detail": detail}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="digits,postnorm,outliers",
                    help="comma-separated: digits, postnorm, outliers (the digits ViT with planted outlier channels, examples/make_outlier_vit.py)")
    ap.add_argument("--rounds", type=int, default=25, help="latency rounds (>= 20)")
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--from-json", type=Path, default=None, help="re-render the markdown from a saved results JSON (no measuring)")
    args = ap.parse_args()
    if args.from_json is not None:
        res = json.loads(args.from_json.read_text())
        md = markdown(res)
        (args.out / "quant_accuracy.md").write_text(md)
        print(md)
        return
    start = time.perf_counter()
    res: dict[str, Any] = {"environment": environment(), "accuracy": [], "bar": {}}
    with tempfile.TemporaryDirectory(prefix="vitedge-bench-") as tmp:
        work = Path(tmp)
        for which in [m for m in args.models.split(",") if m]:
            try:
                acc = accuracy(which, work)
            except FileNotFoundError as err:
                acc = {"model": which, "error": f"{err} is missing"}
            res["accuracy"].append(acc)
            if "error" not in acc:
                res["bar"][which] = check_bar(acc)
        res["selection"] = selection(res["accuracy"])
        if not args.skip_latency:
            res["latency"] = latency(work, max(20, args.rounds))
    res["seconds"] = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    md = markdown(res)
    from vitedge.files.atomic import atomic_write_path

    with atomic_write_path(args.out / "quant_accuracy.json") as tmp_json:
        tmp_json.write_text(json.dumps(res, indent=1, default=str))
    with atomic_write_path(args.out / "quant_accuracy.md") as tmp_md:
        tmp_md.write_text(md)
    print(md)


if __name__ == "__main__":
    main()
