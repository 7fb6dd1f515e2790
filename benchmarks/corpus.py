"""Issue 30 item 2: every corpus model through the real CLI, in every format a user could save it in.

The corpus (benchmarks/corpus/manifest.toml) is small ViTs that other people trained and published; it
lives in a local cache that ``benchmarks/corpus/cache.py fill`` fills (benchmarks/corpus/fetch.md). This script checks every
sha256 of the manifest first and stops, naming each missing file and how to bring it, when the cache
is incomplete. Then, per model:

* a seeded split of its test set into calibration (``--calib-size``, default 300) and labelled
  validation (``--val-size``, default 1000) image folders, disjoint (benchmarks/corpus/cache.py);
* the model saved in each format (``--formats``): the authors' state_dict with ``--model-class
  benchmarks/corpus/models.py:Class``; TorchScript traced and scripted; ``.pt2`` (torch.export, dynamic
  batch); ONNX (opset 17, dynamic batch). A format a model cannot be saved in (torch.jit.script of a
  class it cannot compile) is a row saying so, not a vitedge failure;
* ``vitedge build FILE --target onnx --target intel-cpu --calib CALIB --val VAL --mean .. --std ..
  --crop-pct 1.0`` (plus ``--input-size`` for the one model whose weights do not fix it) as a
  subprocess: exit code, wall time, and per target FP32 and INT8 top-1, drop, agreement, INT8
  layers and the build's own INT8/FP32 p50 time at batch 1 and 8, read from each bundle's
  report/validation.json (``--no-latency``: builds without timing);
* with ``--anchors``, on the same splits: ONNX Runtime ``quantize_static`` MinMax, Entropy and
  Percentile, NNCF default and ``model_type=TRANSFORMER`` (benchmarks/quant_methods.py's anchors);
* then, side by side in one process (``speed()``, ``--speed-rounds``), FP32, a second FP32 copy (the control),
  vitedge's INT8 bundle and every anchor graph made for the runtime, on ONNX Runtime and OpenVINO, at batch 1
  and 8, by the build's own timing method (one inference thread, the calling thread's CPU time, 10th percentile,
  a new random order each round): INT8/FP32 per graph. The results say the CPU kind (VNNI or not) and the load.

``--fp32-only`` measures each model's FP32 top-1 on its whole test set in PyTorch (the manifest's
``measured_fp32_top1``) and builds nothing. Writes benchmarks/results/corpus_<CPU kind>.md and .json (``--out``,
``--name``), with the CPU's ISA flags; benchmarks/results/corpus.md is the summary over CPU kinds, kept by hand. Builds take minutes each on 2 shared cores: select with
``--models``, ``--formats``, ``--targets``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "benchmarks" / "corpus"
MODELS_PY = CORPUS / "models.py"
RESULTS = REPO / "benchmarks" / "results"
TARGETS = ("onnx", "intel-cpu")


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


cache = _load("vitedge_corpus_cache", CORPUS / "cache.py")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_isa() -> dict[str, Any]:
    text = ""
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text()
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "avx512_bf16")
    return {"model": model, "cores": os.cpu_count(), "flags": [f for f in wanted if f in flags],
            "vnni": any(f in flags for f in ("avx512_vnni", "avx_vnni"))}


# ------------------------------------------------------------------ the model in each format


def torch_module(model):
    import torch

    classes = _load("vitedge_corpus_models", MODELS_PY)
    module = getattr(classes, model.model_class)()
    module.load_state_dict(cache.weights_of(model, torch.load(model.path, map_location="cpu", weights_only=True)), strict=True)
    return module.eval()


@contextlib.contextmanager
def _no_fastpath():
    """Save as a user would, without the fused attention kernels torch picks under no_grad (they have no
    ONNX form: a file holding them is a different matter from the formats measured here)."""
    import torch

    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def _example(model):
    import torch

    return torch.randn(2, model.channels, model.size, model.size, generator=torch.Generator().manual_seed(0))


def save_state_dict(model, work: Path) -> tuple[Path, list[str]]:
    return model.path, ["--model-class", f"{MODELS_PY}:{model.model_class}"]


def save_traced(model, work: Path) -> tuple[Path, list[str]]:
    import torch

    out = work / f"{model.id}.traced.pt"
    with _no_fastpath():
        torch.jit.trace(torch_module(model), _example(model), check_trace=False).save(str(out))
    return out, []


def save_scripted(model, work: Path) -> tuple[Path, list[str]]:
    import torch

    out = work / f"{model.id}.scripted.pt"
    torch.jit.script(torch_module(model)).save(str(out))
    return out, []


def save_pt2(model, work: Path) -> tuple[Path, list[str]]:
    import torch

    out = work / f"{model.id}.pt2"
    with _no_fastpath():
        program = torch.export.export(torch_module(model), (_example(model),),
                                      dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=1024)},))
    torch.export.save(program, str(out))
    return out, []


def save_onnx(model, work: Path) -> tuple[Path, list[str]]:
    import torch

    out = work / f"{model.id}.onnx"
    with _no_fastpath(), contextlib.redirect_stdout(sys.stderr):
        torch.onnx.export(torch_module(model), (_example(model),), str(out), opset_version=17, dynamo=False,
                          input_names=["input"], output_names=["logits"],
                          dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}})
    return out, []


FORMATS: dict[str, Callable[[Any, Path], tuple[Path, list[str]]]] = {
    "state_dict": save_state_dict,
    "torchscript-trace": save_traced,
    "torchscript-script": save_scripted,
    "pt2": save_pt2,
    "onnx": save_onnx,
}


# ------------------------------------------------------------------ one build through the CLI


@dataclass
class BuildRow:
    model: str
    format: str
    target: str
    exit_code: int | None
    seconds: float | None
    fp32_top1: float | None = None
    int8_top1: float | None = None
    drop_points: float | None = None
    agreement: float | None = None
    int8_layers: int | None = None
    layers_total: int | None = None
    float_layers_returned: str | None = None
    passed: bool | None = None
    note: str = ""
    # the shared Q/DQ graph's hash and method select's choice (manifest.json), so that runs on two kinds of CPU can tell
    # a different quantized graph (calibration moved) from the same graph run by other kernels (JSON only)
    qdq_sha256: str | None = None
    calibration_chosen: str | None = None
    # the build's own latency (report/validation.json: FP32 and INT8 interleaved on the bundle's runtime), p50 ms
    fp32_ms_b1: float | None = None
    int8_ms_b1: float | None = None
    fp32_ms_b8: float | None = None
    int8_ms_b8: float | None = None
    # the seconds the build's timed threads waited for a core per second they ran (vitedge.validation.core_wait);
    # past core_wait.BUSY_ABOVE its ratio at that batch size was taken on a busy machine
    core_wait_b1: float | None = None
    core_wait_b8: float | None = None

    def ratio(self, batch: int) -> float | None:
        """INT8/FP32 p50 time at batch 1 or 8 (below 1: INT8 is faster)."""
        f, i = getattr(self, f"fp32_ms_b{batch}"), getattr(self, f"int8_ms_b{batch}")
        return None if not f or i is None else i / f


def build(model, fmt: str, split: Path, work: Path, targets: list[str], extra: list[str], timeout: float,
          latency: bool = True) -> list[BuildRow]:
    try:
        path, flags = FORMATS[fmt](model, work)
    except Exception as err:  # the model cannot be saved so: a fact about the model, not a vitedge result
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        return [BuildRow(model.id, fmt, t, None, None, note=f"not saved in this format: {type(err).__name__}: {first}") for t in targets]
    out = work / f"bundle-{model.id}-{fmt}"
    cmd = [sys.executable, "-m", "vitedge", "build", str(path), *flags]
    for t in targets:
        cmd += ["--target", t]
    cmd += ["--calib", str(split / "calib"), "--val", str(split / "val"), "-o", str(out), "--force",
            "--mean", *map(str, model.mean), "--std", *map(str, model.std), "--crop-pct", "1.0"]
    if not latency:
        cmd.append("--no-latency")
    # --crop-pct 1.0: the authors feed the whole 28x28 / 32x32 image (no resize-and-centre-crop); the state_dict
    # form reads it from the class's pretrained_cfg, the other formats carry no preprocessing and need the flag
    if model.needs_input_size:
        cmd += ["--input-size", str(model.size), str(model.size)]
    cmd += extra
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log(f"   $ vitedge build {path.name} ... ({fmt})")
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(work))
        code, text = proc.returncode, (proc.stderr or "") + (proc.stdout or "")
    except subprocess.TimeoutExpired:
        code, text = None, f"timed out after {timeout:.0f} s"
    secs = time.perf_counter() - start
    rows = []
    for t in targets:
        folder = out / t if len(targets) > 1 else out
        rows.append(_read_bundle(BuildRow(model.id, fmt, t, code, secs), folder, code, text))
    return rows


def export_check(model, fmt: str, work: Path) -> BuildRow:
    """The part of a build where formats differ, in this process: vitedge's intake of the saved file and its
    FP32 ONNX export with the parity check against PyTorch (--export-only)."""
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model

    try:
        path, flags = FORMATS[fmt](model, work)
    except Exception as err:
        first = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        return BuildRow(model.id, fmt, "export", None, None, note=f"not saved in this format: {type(err).__name__}: {first}")
    opts = IntakeOptions(model_class=flags[1] if flags else None, mean=model.mean, std=model.std,
                         input_size=(model.size, model.size) if model.needs_input_size else None)
    start = time.perf_counter()
    try:
        loaded = load_model(path, opts)
        result = export_onnx(loaded, work / f"{model.id}.{fmt}.check.onnx")
    except Exception as err:  # what the CLI would print as its one line (exit 2 or 3)
        text = re.sub(r"\s*\[Caused by .*?\]\s*", " ", f"{type(err).__name__}: {err}", flags=re.S)  # torch's graph dump
        return BuildRow(model.id, fmt, "export", 2, time.perf_counter() - start, note=" ".join(text.split())[:420])
    size = loaded.spec.image_size
    return BuildRow(model.id, fmt, "export", 0, time.perf_counter() - start,
                    note=f"{size[0]}x{size[1]}x{loaded.spec.preprocess.channels} ({loaded.spec.sources.get('image_size')}); "
                         + ("max |PyTorch - ORT| " + (f"{result.max_abs_diff:.1e}" if result.max_abs_diff is not None else "not checked (an ONNX file is taken as it is)")))


def _read_bundle(row: BuildRow, folder: Path, code: int | None, text: str) -> BuildRow:
    report = folder / "report" / "validation.json"
    if not report.is_file():
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        row.note = (lines[-1] if lines else "no output")[:200]
        return row
    v = json.loads(report.read_text())
    acc, q = v.get("accuracy", {}), v.get("quantization", {})
    row.fp32_top1 = _pct(acc.get("fp32_top1"))
    row.int8_top1 = _pct(acc.get("int8_top1"))
    row.drop_points = acc.get("top1_drop_points")
    row.agreement = _pct(acc.get("top1_agreement"))
    row.int8_layers, row.layers_total = q.get("layers_int8"), q.get("layers_total")
    row.float_layers_returned = q.get("summary_line")
    row.passed = bool(v.get("passed"))
    lat = v.get("latency") or {}
    for side in ("fp32", "int8"):
        for batch in (1, 8):
            stats = (lat.get(side) or {}).get(str(batch)) or {}
            setattr(row, f"{side}_ms_b{batch}", stats.get("p50_ms"))
            if side == "int8":
                setattr(row, f"core_wait_b{batch}", stats.get("core_wait"))
    manifest = folder / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        row.qdq_sha256 = (m.get("quantization") or {}).get("qdq_sha256")
        row.calibration_chosen = ((m.get("calibration") or {}).get("selection") or {}).get("chosen")
    if code not in (0, 1):
        row.note = f"exit {code}"
    return row


def _busy(r: dict[str, Any], batch: int) -> str:
    """The build's own INT8/FP32 ratio at ``batch``, marked when its timing window was busy (core_wait past the line:
    other processes held the cores, so the figure is not the graphs' own)."""
    from vitedge.validation.core_wait import busy_note

    wait = r.get(f"core_wait_b{batch}")
    text = _f(r.get(f"ratio_b{batch}"))
    return f"{text} (busy: core wait {wait:.2f})" if text and busy_note(wait) else text


def _pct(v) -> float | None:
    return None if v is None else float(v) * 100.0


# ------------------------------------------------------------------ FP32 on the whole test set, and the anchors


def fp32_top1(model) -> float:
    """PyTorch FP32 top-1 on the model's whole test set, preprocessed as its authors did."""
    import torch

    ds = cache.load_manifest().datasets[model.dataset]
    items, labels = cache.load_images(ds)
    labels = cache.model_labels(model, ds, labels)  # the model's output index of each image's class
    x = np.stack([cache.decode(it, model.channels) for it in items]).astype(np.float32).transpose(0, 3, 1, 2) / 255.0
    x = (x - np.asarray(model.mean, np.float32).reshape(1, -1, 1, 1)) / np.asarray(model.std, np.float32).reshape(1, -1, 1, 1)
    module = torch_module(model)
    with torch.no_grad():
        pred = np.concatenate([module(torch.from_numpy(x[i:i + 500])).argmax(1).numpy() for i in range(0, len(x), 500)])
    return float((pred == labels).mean() * 100)


def anchors(model, split: Path, work: Path, ort_methods: tuple[str, ...] | None = None,
            graphs: dict[tuple[str, str], Path] | None = None,
            nncf_modes: tuple[str, ...] = ("default", "TRANSFORMER")) -> list[dict[str, Any]]:
    """The anchor tools on the same calibration and validation folders: ONNX Runtime quantize_static (QDQ,
    its defaults otherwise) with MinMax, Entropy and Percentile, run in ONNX Runtime and OpenVINO; NNCF
    default and model_type=TRANSFORMER, OpenVINO and ONNX backends. One row per (tool, runtime); a tool or
    runtime that fails is a row with its error (OpenVINO refuses some of these graphs). ``graphs`` receives each
    anchor graph's file per (runtime it is made for, method), for speed()."""
    import io

    sys.path.insert(0, str(REPO / "benchmarks"))
    import quant_methods as qm

    from vitedge.datasources.sources import open_source
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model

    opts = IntakeOptions(model_class=f"{MODELS_PY}:{model.model_class}", mean=model.mean, std=model.std,
                         input_size=(model.size, model.size) if model.needs_input_size else None)
    loaded = load_model(model.path, opts)
    fp32 = work / f"{model.id}.anchor.fp32.onnx"
    export_onnx(loaded, fp32)
    calib = np.concatenate([b.images for b in open_source(split / "calib", loaded.spec.preprocess).batches(64)])
    size = 10 if len(calib) % 10 == 0 else 1  # equal batches: ORT's entropy and percentile calibrators stack them
    calib_batches = [calib[i:i + size] for i in range(0, len(calib), size)]
    val = open_source(split / "val", loaded.spec.preprocess)
    x = np.concatenate([b.images for b in val.batches(128)])
    labels = np.concatenate([b.labels for b in val.batches(128)])
    ref_logits = qm.qa.ort_predict(fp32, x)
    top1 = float((ref_logits.argmax(1) == labels).mean() * 100)
    runners = (("onnxruntime", qm.qa.ort_predict), ("openvino", qm.qa.ov_predict))
    rows: list[dict[str, Any]] = []

    def row(method: str, runtime: str, secs: float, run) -> None:
        try:
            rows.append({"model": model.id, "fp32_top1": top1, "method": method, "runtime": runtime, "seconds": secs,
                         **qm.measure(run(), labels, ref_logits, top1)})
        except Exception as err:
            rows.append({"model": model.id, "method": method, "runtime": runtime, "error": _one_line(err)})

    for method, out, secs, err in qm.ort_static_graphs(fp32, calib_batches, work, prefix=f"{model.id}.",
                                                          methods=ort_methods or qm.ORT_METHODS):
        if err is not None:
            rows.append({"model": model.id, "method": f"ORT quantize_static {method}", "error": _one_line(err)})
            continue
        for runtime, fn in runners:
            row(f"ORT quantize_static {method}", runtime, secs, lambda fn=fn, out=out: fn(out, x))
        if graphs is not None:
            graphs[("onnxruntime", f"ORT quantize_static {method}")] = Path(out)
    from vitedge.backends.openvino import block_vendor_telemetry

    block_vendor_telemetry()  # NNCF telemetry: a forked sender that hangs on a closed network
    import nncf
    import onnx
    import openvino as ov

    items = [c[None] for c in calib]
    modes = (("default", {}), ("TRANSFORMER", {"model_type": nncf.ModelType.TRANSFORMER}))
    for label, kwargs in (m for m in modes if m[0] in nncf_modes):
        for backend in ("OpenVINO", "ONNX"):
            t0 = time.perf_counter()
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    if backend == "OpenVINO":
                        q = nncf.quantize(ov.Core().read_model(str(fp32)), nncf.Dataset(items), **kwargs)
                    else:
                        q = nncf.quantize(onnx.load(str(fp32)), nncf.Dataset([{"input": i} for i in items]), **kwargs)
            except Exception as err:
                rows.append({"model": model.id, "method": f"NNCF {label} ({backend} backend)", "error": _one_line(err)})
                continue
            secs = time.perf_counter() - t0
            if backend == "OpenVINO":
                row(f"NNCF {label} (OpenVINO backend)", "openvino", secs, lambda q=q: qm.qa.ov_predict(q, x))
                saved = work / f"{model.id}.nncf-{label}.xml"
                ov.save_model(q, str(saved), compress_to_fp16=False)
                if graphs is not None:
                    graphs[("openvino", f"NNCF {label} (OpenVINO backend)")] = saved
            else:
                row(f"NNCF {label} (ONNX backend)", "onnxruntime", secs, lambda q=q: qm.qa.ort_predict(q.SerializeToString(), x))
                saved = work / f"{model.id}.nncf-{label}.onnx"
                onnx.save(q, str(saved))
                if graphs is not None:
                    graphs[("onnxruntime", f"NNCF {label} (ONNX backend)")] = saved
    return rows


def speed(model, bundles: Path, graphs: dict[tuple[str, str], Path], rounds: int) -> list[dict[str, Any]]:
    """INT8/FP32 time at batch 1 and 8, side by side in one process, by the build's own method (vitedge.backends.
    int8_timing): per runtime its FP32 graph (the bundle's reference), a second copy of it (the control: its ratio,
    ideally 1, shows this machine's noise), vitedge's INT8 bundle and each anchor graph made for that runtime
    (``graphs``), each opened for one inference thread and timed by the calling thread's CPU time, in ``rounds``
    rounds of a new random order, 3 timed runs per graph and round after one untimed one, at batch 1 and 8 alike;
    a graph's figure is the 10th percentile of its timed runs (a loaded machine stretches runs, never shortens them).
    A graph a runtime refuses is a row with its error."""
    import openvino as ov

    from vitedge.backends.int8_timing import interleaved_percentiles

    core = ov.Core()
    onnx_dir = _target_dir(bundles, "onnx")
    ort_ref = onnx_dir / _onnx_reference(onnx_dir)
    sources = {("onnxruntime", "FP32"): ort_ref,
               ("onnxruntime", "FP32 control"): ort_ref,
               ("onnxruntime", "vitedge INT8"): onnx_dir / _artifact(onnx_dir, "model.int8.onnx"),
               ("openvino", "FP32"): bundles / "intel-cpu" / "reference.fp32.xml",
               ("openvino", "FP32 control"): bundles / "intel-cpu" / "reference.fp32.xml",
               ("openvino", "vitedge INT8"): bundles / "intel-cpu" / _artifact(bundles / "intel-cpu", "model.xml"), **graphs}
    exported = _exported_graph(bundles, onnx_dir)
    if exported != ort_ref:  # the exported graph, where the onnx bundle's reference is its rewrite
        sources[("onnxruntime", "FP32 as exported")] = exported
    sources = {k: v for k, v in sources.items() if v.is_file()}
    ov_used = _bundle_float_precision(bundles)
    rows: list[dict[str, Any]] = []
    for batch in (1, 8):
        x = np.random.default_rng(0).standard_normal((batch, model.channels, model.size, model.size)).astype(np.float32)
        for runtime in ("onnxruntime", "openvino"):
            runs: dict[tuple[str, str], Callable[[], Any]] = {}
            for (rt, name), path in sources.items():
                if rt != runtime:
                    continue
                try:
                    run = (_ort_one_thread(path, x) if runtime == "onnxruntime"
                           else _ov_one_thread(core, path, x, ov_used if name == "vitedge INT8" else "f32"))
                    run()
                    runs[(runtime, name)] = run
                except Exception as err:
                    rows.append({"model": model.id, "batch": batch, "runtime": runtime, "graph": name, "error": _one_line(err)})
            if (runtime, "FP32") not in runs:
                continue
            log(f"   speed at batch {batch} on {runtime}: {len(runs)} graphs, {rounds} rounds, one thread, CPU time")
            p10 = interleaved_percentiles(runs, rounds=rounds, per_round=3, percentile=10.0, seed=batch, max_seconds=240.0)
            base = p10[(runtime, "FP32")]
            for (rt, name), secs in p10.items():
                rows.append({"model": model.id, "batch": batch, "runtime": rt, "graph": name, "rounds": rounds,
                             "method": "one thread, CPU time, p10", "p10_ms": secs * 1e3, "median_ms": secs * 1e3,
                             "ratio": secs / base})
            del runs
    return rows


def _target_dir(bundles: Path, target: str) -> Path:
    """A target's bundle folder: OUT/<target> of a build of several targets, OUT itself of a build of that one."""
    if (bundles / target).is_dir():
        return bundles / target
    try:
        return bundles if json.loads((bundles / "manifest.json").read_text())["target"]["name"] == target else bundles / target
    except (OSError, KeyError, ValueError):
        return bundles / target


def saved_anchor_graphs(model_id: str, work: Path) -> dict[tuple[str, str], Path]:
    """The anchor graphs an earlier run with ``--anchors`` left in ``work`` (``anchors()``' file names), for speed()."""
    graphs: dict[tuple[str, str], Path] = {}
    for f in sorted(work.glob(f"{model_id}.ort_*.onnx")):
        graphs[("onnxruntime", f"ORT quantize_static {f.name[len(model_id) + 5:-5]}")] = f
    for f in sorted(work.glob(f"{model_id}.nncf-*.onnx")):
        graphs[("onnxruntime", f"NNCF {f.name[len(model_id) + 6:-5]} (ONNX backend)")] = f
    for f in sorted(work.glob(f"{model_id}.nncf-*.xml")):
        graphs[("openvino", f"NNCF {f.name[len(model_id) + 6:-4]} (OpenVINO backend)")] = f
    return graphs


def _onnx_reference(bundle: Path) -> str:
    """The FP32 graph the onnx bundle names as its reference (its attention-fused rewrite where one was written)."""
    try:
        return json.loads((bundle / "manifest.json").read_text())["artifacts"]["reference"]
    except (OSError, KeyError, ValueError):
        return "reference.fp32.onnx"


def _artifact(bundle: Path, default: str) -> str:
    """The graph a bundle ships (``default``: model.int8.onnx of the onnx target, model.xml of intel-cpu; its FP32
    reference itself where the build kept the whole model float: the bundle then holds that graph once)."""
    try:
        return json.loads((bundle / "manifest.json").read_text())["artifacts"]["model"]
    except (OSError, KeyError, ValueError):
        return default


def _exported_graph(bundles: Path, onnx_dir: Path) -> Path:
    """The exported FP32 graph: the onnx bundle's (``onnx_dir``) reference.fp32.onnx unless its manifest says it is the
    fused rewrite (artifacts.fp32_graph; bundles of earlier versions shipped the rewrite beside it), then the intel-cpu
    bundle's."""
    try:
        form = json.loads((onnx_dir / "manifest.json").read_text())["artifacts"].get("fp32_graph", {}).get("form")
    except (OSError, KeyError, ValueError, AttributeError):
        form = None
    return (bundles / "intel-cpu" if form == "fused" else onnx_dir) / "reference.fp32.onnx"


def _bundle_float_precision(bundles: Path) -> str:
    """The precision the intel-cpu bundle's float regions run in; its FP32 reference runs f32."""
    manifest = bundles / "intel-cpu" / "manifest.json"
    if not manifest.is_file():
        return "f32"
    used = ((json.loads(manifest.read_text()).get("backend_info") or {}).get("float_precision") or {}).get("used")
    return used or "f32"


def _ort_one_thread(path: Path, x: np.ndarray) -> Callable[[], Any]:
    """ONNX Runtime's CPU provider on ``path`` with one thread, no spinning: the run happens in the calling thread."""
    from vitedge.onnxkit.session import SessionSettings, ort_session

    sess = ort_session(path, SessionSettings(threads=1, spinning=False))
    name = sess.get_inputs()[0].name
    return lambda: sess.run(None, {name: x})


def _ov_one_thread(core, path: Path, x: np.ndarray, precision: str) -> Callable[[], Any]:
    """OpenVINO CPU, LATENCY hint, one inference thread (the calling thread's), float regions in ``precision``."""
    req = core.compile_model(str(path), "CPU", {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": precision,
                                                 "INFERENCE_NUM_THREADS": 1}).create_infer_request()
    return lambda: req.infer({0: x})


def _one_line(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:200]


# ------------------------------------------------------------------ report


def markdown(res: dict[str, Any]) -> str:
    isa = res["cpu"]
    lines = [
        "# The corpus through `vitedge build` (issue 30)",
        "",
        f"Measured {res['date']} by `python benchmarks/corpus.py {' '.join(res['argv'])}` "
        "(runs separated by `;`, combined with --merge) on " f"{isa['model']}, "
        f"{isa['cores']} cores, ISA flags: {', '.join(isa['flags']) or 'none of avx2/avx512/vnni/amx'} "
        f"({'VNNI' if isa['vnni'] else 'no VNNI'}). Calibration: {res['calib_size']} images, validation: {res['val_size']} "
        "other images of each model's test set (seeded split, benchmarks/corpus/cache.py). Command: `vitedge build FILE "
        f"{' '.join('--target ' + t for t in res['targets'])} --calib CALIB --val VAL --mean .. --std .. --crop-pct 1.0"
        f"{' --no-latency' if not res.get('latency', False) else ''}"
        f"{(' ' + ' '.join(res['extra'])) if res['extra'] else ''}`; the gate is each target profile's (top-1 drop <= 0.2 "
        "points, agreement >= 99.5 %). Wall times are on 2 cores shared with other jobs: compare them within a run only.",
    ]
    if res.get("latency") and res.get("builds"):
        loads = res.get("load_average") or []
        lines += ["", f"Times: INT8/FP32 p50 time ratios (below 1: INT8 is faster) on this CPU kind ({'VNNI' if isa['vnni'] else 'AVX2, no VNNI'}), "
                  "from each build's own latency (FP32 and INT8 interleaved on the bundle's runtime) and from the side-by-side "
                  "timing below (vitedge's bundles and the anchors' graphs in one process). The machine was loaded by other jobs "
                  f"(1-minute load average {', '.join(f'{v:.1f}' for v in loads) or 'not recorded'} on 2 cores at each model's start): "
                  "ratios are measured side by side, absolute milliseconds are not comparable across runs."]
    lines += _speed_summary(res)
    lines += _side_by_side(res)
    if res["builds"]:
        lines += ["", "## Every build", "", "| model | format | target | exit | build s | FP32 top-1 % | INT8 top-1 % | drop pts | agreement % | INT8 layers | "
                  "INT8/FP32 time b1 | b8 | gate | note |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["builds"]:
        layers = f"{r['int8_layers']}/{r['layers_total']}" if r["layers_total"] else ""
        lines.append(
            f"| {r['model']} | {r['format']} | {r['target']} | {'' if r['exit_code'] is None else r['exit_code']} | "
            f"{_f(r['seconds'], 0)} | {_f(r['fp32_top1'])} | {_f(r['int8_top1'])} | {_f(r['drop_points'])} | "
            f"{_f(r['agreement'])} | {layers} | {_busy(r, 1)} | {_busy(r, 8)} | "
            f"{'' if r['passed'] is None else ('pass' if r['passed'] else 'FAIL')} | {r['note']} |"
        )
    if res.get("exports"):
        lines += ["", "## Intake and FP32 export of every format (in process: `load_model` + `export_onnx` with its parity check)", "",
                  "| model | format | result | s | input (source); parity |", "|---|---|---|---|---|"]
        for r in res["exports"]:
            status = "not saved" if r["exit_code"] is None else ("ok" if r["exit_code"] == 0 else "FAILED")
            lines.append(f"| {r['model']} | {r['format']} | {status} | {_f(r['seconds'], 1)} | {r['note']} |")
    if res.get("anchors"):
        lines += ["", "## Anchors on the same splits (full INT8, their defaults otherwise)", "",
                  "| model | method | runtime | INT8 top-1 % | drop pts | agreement % | s | error |", "|---|---|---|---|---|---|---|---|"]
        for a in res["anchors"]:
            lines.append(f"| {a['model']} | {a.get('method', '')} | {a.get('runtime', '')} | {_f(a.get('top1'))} | "
                         f"{_f(a.get('drop'))} | {_f(a.get('agreement'))} | {_f(a.get('seconds'), 1)} | {a.get('error', '')} |")
    lines += _speed_table(res)
    if res.get("fp32"):
        lines += ["", "## FP32 top-1 on the whole test set (PyTorch), vs the authors' claim", "",
                  "| model | measured % | claimed % | where claimed |", "|---|---|---|---|"]
        for f in res["fp32"]:
            lines.append(f"| {f['model']} | {f['measured']:.2f} | {_f(f['claimed'])} | {f['where']} |")
    return "\n".join(lines) + "\n"


_RUNTIME = {"onnx": "onnxruntime", "intel-cpu": "openvino"}


def _speed_table(res: dict[str, Any]) -> list[str]:
    """Per model and runtime: FP32, vitedge's INT8 bundle and each anchor's INT8 graph, median ms and INT8/FP32 at
    batch 1 and 8 (speed())."""
    rows = res.get("speed") or []
    if not rows:
        return []
    kind = "VNNI" if res["cpu"]["vnni"] else "AVX2, no VNNI"
    lines = ["", f"## INT8/FP32 time side by side, batch 1 and 8 ({kind}; interleaved rounds in one process)", "",
             "| model | runtime | graph | b1 ms | b1 INT8/FP32 | b8 ms | b8 INT8/FP32 | error |", "|---|---|---|---|---|---|---|---|"]
    if any("p10_ms" in r for r in rows):
        lines[3:3] = ["One inference thread, the calling thread's CPU time, 10th percentile of each graph's runs, graphs in "
                      "a new random order each round; `FP32 control` is a second copy of the FP32 graph (its ratio, "
                      "ideally 1.00, is this machine's noise).", ""]
    keyed: dict[tuple[str, str, str], dict[int, dict]] = {}
    for r in rows:
        keyed.setdefault((r["model"], r.get("runtime", ""), r.get("graph", "")), {})[r.get("batch", 1)] = r
    for (model, runtime, graph), by in keyed.items():
        b1, b8 = by.get(1, {}), by.get(8, {})
        err = b1.get("error") or b8.get("error") or ""
        lines.append(f"| {model} | {runtime} | {'**' + graph + '**' if graph == 'vitedge INT8' else graph} | "
                     f"{_f(b1.get('median_ms'))} | {_f(b1.get('ratio'))} | {_f(b8.get('median_ms'))} | {_f(b8.get('ratio'))} | {err[:80]} |")
    return lines


# the anchor columns of the summary: (column, runtime, graph names of speed(), the first one measured is shown)
_SUMMARY_ANCHORS = (
    ("ORT quantize_static", "onnxruntime", ("ORT quantize_static MinMax", "ORT quantize_static Percentile",
                                            "ORT quantize_static Entropy")),
    ("NNCF default", None, ("NNCF default (ONNX backend)", "NNCF default (OpenVINO backend)")),
    ("NNCF TRANSFORMER", None, ("NNCF TRANSFORMER (ONNX backend)", "NNCF TRANSFORMER (OpenVINO backend)")),
)


def _made_for(runtime: str, only: str | None, names: tuple[str, ...]) -> tuple[str, ...]:
    """The anchor graphs of one column that are timed on ``runtime``: all of them for a tool made for one runtime
    (``only``), else NNCF's graph of the matching backend."""
    if only is not None:
        return names if only == runtime else ()
    return tuple(n for n in names if ("OpenVINO backend" in n) == (runtime == "openvino"))


def _speed_summary(res: dict[str, Any]) -> list[str]:
    """One row per model and runtime: INT8/FP32 time at batch 1 / 8 of vitedge's bundle beside each anchor's INT8
    graph for the same runtime, all from the side-by-side timing (speed()) of one run on one CPU kind. A ratio above
    1 (INT8 slower than FP32) is bold; "-" where the anchor made no graph for that runtime or the runtime refused it."""
    rows = [r for r in res.get("speed") or [] if "ratio" in r]
    if not rows:
        return []
    isa = res["cpu"]
    kind = "AVX-512 VNNI" if "avx512_vnni" in isa["flags"] else ("VNNI" if isa["vnni"] else "AVX2, no VNNI")
    got: dict[tuple[str, str, str], dict[int, float]] = {}
    for r in rows:
        got.setdefault((r["model"], r["runtime"], r["graph"]), {})[r["batch"]] = r["ratio"]

    def cell(model: str, runtime: str, names: tuple[str, ...]) -> str:
        for name in names:
            by = got.get((model, runtime, name))
            if by:
                return " / ".join(("**%.2f**" if v > 1.0 else "%.2f") % v if v == v else "-"
                                  for v in (by.get(1, float("nan")), by.get(8, float("nan"))))
        return "-"

    lines = ["", f"## INT8/FP32 time per model, batch 1 / 8, on this CPU kind: {kind} ({isa['model']})", "",
             "Side by side in one process per model (one thread, CPU time, 10th percentile, random order; older runs: "
             "interleaved rounds, medians of wall time): vitedge's INT8 bundle and each anchor's "
             "full-INT8 graph, each over the FP32 reference on the same runtime. Below 1: INT8 is faster; **bold**: slower. "
             "ORT quantize_static: its MinMax graph (Percentile where MinMax made none); NNCF: its ONNX-backend graph on "
             "ONNX Runtime, its OpenVINO-backend graph on OpenVINO. Other CPU kinds record their own file.", "",
             "The FP32 reference on ONNX Runtime is the onnx bundle's own (attention cores fused like its INT8 graph's, "
             "where they fuse); `FP32 as exported` is the exported graph over that reference.", "",
             "| model | runtime (target) | vitedge INT8 | " + " | ".join(c for c, _, _ in _SUMMARY_ANCHORS) + " | FP32 control | FP32 as exported |",
             "|---|---|---|" + "---|" * len(_SUMMARY_ANCHORS) + "---|---|"]
    for model in dict.fromkeys(r["model"] for r in rows):
        for runtime, target in (("onnxruntime", "onnx"), ("openvino", "intel-cpu")):
            if not any(k[0] == model and k[1] == runtime for k in got):
                continue
            anchors = [cell(model, runtime, _made_for(runtime, only, names)) for _, only, names in _SUMMARY_ANCHORS]
            lines.append(f"| {model} | {runtime} ({target}) | {cell(model, runtime, ('vitedge INT8',))} | "
                         + " | ".join(anchors) + f" | {cell(model, runtime, ('FP32 control',))} | {cell(model, runtime, ('FP32 as exported',))} |")
    return lines


def _side_by_side(res: dict[str, Any]) -> list[str]:
    """Per model: the default command's bundle (state_dict form) on each target beside every anchor's full-INT8
    graph on the same splits. Float layers: vitedge's layers left in float out of those it can quantize (the
    attention matmuls stay float by design on the CPU targets); the anchors quantize every op type they know."""
    builds = [r for r in res["builds"] if r["format"] == "state_dict"]
    if not builds or not res.get("anchors"):
        return []
    lines = ["", "## The default command beside the anchors (state_dict form, full-INT8 anchors)", "",
             "| model | setting | runtime | FP32 top-1 % | INT8 top-1 % | drop pts | agreement % | float layers | s | gate / error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for model in dict.fromkeys(r["model"] for r in builds):
        for r in (b for b in builds if b["model"] == model):
            floats = f"{r['layers_total'] - r['int8_layers']} of {r['layers_total']}" if r["layers_total"] else ""
            gate = "" if r["passed"] is None else ("pass" if r["passed"] else "FAIL")
            lines.append(f"| {model} | **vitedge default** ({r['target']}) | {_RUNTIME.get(r['target'], r['target'])} | "
                         f"{_f(r['fp32_top1'])} | {_f(r['int8_top1'])} | {_f(r['drop_points'])} | {_f(r['agreement'])} | "
                         f"{floats} | {_f(r['seconds'], 0)} | {gate or r['note'][:80]} |")
        for a in (a for a in res["anchors"] if a.get("model") == model):
            lines.append(f"| {model} | {a.get('method', '')} | {a.get('runtime', '')} | {_f(a.get('fp32_top1'))} | "
                         f"{_f(a.get('top1'))} | {_f(a.get('drop'))} | {_f(a.get('agreement'))} | "
                         f"{'' if a.get('error') else 'none (full INT8)'} | {_f(a.get('seconds'), 1)} | {a.get('error', '')[:80]} |")
    return lines


def _f(v, digits: int = 2) -> str:
    return "" if v is None else f"{v:.{digits}f}"


# What a later run's row replaces in an earlier run's, when --merge combines runs: the same model on the same target
# (builds) or runtime (anchors, side-by-side timing)
_MERGE_KEYS = {"builds": ("model", "target"), "anchors": ("model", "runtime"), "speed": ("model", "runtime")}


def merged_rows(key: str, parts: list[list[Any]]) -> list[Any]:
    """The rows of ``parts`` (earlier runs first), where a later run re-ran a model on a target or runtime, only its
    rows of it: a re-run replaces, it is not shown twice. Other keys (and load averages, one per model run) are
    joined as they are."""
    fields = _MERGE_KEYS.get(key)
    if fields is None:
        return [row for p in parts for row in p]
    out: list[Any] = []
    for rows in parts:
        again = {tuple(r.get(f) for f in fields) for r in rows}
        out = [r for r in out if tuple(r.get(f) for f in fields) not in again] + list(rows)
    return out


def recorded_argv(argv: list[str]) -> list[str]:
    """The command as the results file records it: the machine's own folders given to --work and --out are written
    WORK and OUT, so a results file names no local path."""
    out: list[str] = []
    for i, a in enumerate(argv):
        flag, eq, _ = a.partition("=")
        if eq and flag in ("--work", "--out"):
            out.append(f"{flag}={flag[2:].upper()}")
        elif i and argv[i - 1] in ("--work", "--out"):
            out.append(argv[i - 1][2:].upper())
        else:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="", help="comma-separated corpus ids (default: all)")
    ap.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated, of {', '.join(FORMATS)}")
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--calib-size", type=int, default=300)
    ap.add_argument("--val-size", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--anchors", action="store_true", help="also run the anchor tools on the same splits")
    ap.add_argument("--ort-methods", default="", help="comma-separated ONNX Runtime anchor methods (default: all of "
                    "quant_methods.ORT_METHODS; 'Entropy 512 bins' takes minutes per model in ORT's Python KL search)")
    ap.add_argument("--fp32-only", action="store_true", help="measure FP32 top-1 on each whole test set; build nothing")
    ap.add_argument("--export-only", action="store_true",
                    help="per model and format, only vitedge's intake and FP32 ONNX export with its parity check (in this process)")
    ap.add_argument("--build-flag", action="append", default=[], metavar="FLAG",
                    help="extra flag for every vitedge build, e.g. --build-flag=--no-fallback (repeatable)")
    ap.add_argument("--speed-only", action="store_true",
                    help="only the side-by-side timing, of the bundles and anchor graphs an earlier run left in --work")
    ap.add_argument("--no-latency", action="store_true", help="builds without latency (and speed gate); no side-by-side timing")
    ap.add_argument("--speed-rounds", type=int, default=12,
                    help="rounds of the side-by-side timing at batch 1 and at batch 8 (3 timed runs per graph and round); 0: none")
    ap.add_argument("--nncf-modes", default="default,TRANSFORMER",
                    help="comma-separated NNCF anchor modes, of default and TRANSFORMER (default: both)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per build")
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: a fresh temporary one)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--name", default=None, help="results file stem: OUT/NAME.md and .json (default: corpus_<this CPU's kind>)")
    ap.add_argument("--merge", type=Path, nargs="+", default=None, metavar="JSON",
                    help="combine the results of earlier runs (their corpus.json files) into --out; measure nothing")
    args = ap.parse_args(argv)
    if args.name is None:  # each CPU kind its own file; corpus.md is the summary over them
        sys.path.insert(0, str(REPO / "benchmarks"))
        from timing import results_isa

        args.name = f"corpus_{results_isa()}"
    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        res = {**parts[0], "argv": [a for p in parts for a in p["argv"] + [";"]][:-1]}
        for key in ("builds", "exports", "anchors", "fp32", "speed", "load_average"):
            res[key] = merged_rows(key, [p.get(key, []) for p in parts])
        for p in parts[1:]:  # a later run's own build flags go with its rows
            for row in p.get("builds", []):
                if p.get("extra"):
                    row["note"] = " ".join(p["extra"]) + (f"; {row['note']}" if row["note"] else "")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.name}.json").write_text(json.dumps(res, indent=1) + "\n")
        (args.out / f"{args.name}.md").write_text(markdown(res))
        print(markdown(res))
        return 0

    manifest = cache.load_manifest()
    ids = [i for i in args.models.split(",") if i] or [m.id for m in manifest.models]
    try:
        models = [manifest.model(i) for i in ids]
    except KeyError as err:
        print(err.args[0], file=sys.stderr)
        return 2
    formats = [f for f in args.formats.split(",") if f]
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        print(f"unknown format {unknown[0]}: choose from {', '.join(FORMATS)}", file=sys.stderr)
        return 2
    found = cache.find_cache(manifest, ids)
    if found is not None:
        cache.use_cache(found)  # the builds' subprocesses and make_split read the same folder
    missing = cache.problems(manifest, ids)
    if missing:
        for line in missing:
            print(line, file=sys.stderr)
        print(f"the corpus cache ({cache.cache_dir()}) is incomplete: benchmarks/corpus/fetch.md says how to fill it", file=sys.stderr)
        return 2
    targets = [t for t in args.targets.split(",") if t]
    res: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "argv": recorded_argv(argv), "cpu": cpu_isa(),
        "calib_size": args.calib_size, "val_size": args.val_size, "targets": targets, "extra": args.build_flag,
        "builds": [], "exports": [], "anchors": [], "fp32": [], "speed": [], "latency": not args.no_latency,
        "load_average": [],
    }
    import tempfile

    with tempfile.TemporaryDirectory(prefix="vitedge-corpus-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for model in models:
            log(f"== {model.id}")
            if args.fp32_only:
                top1 = fp32_top1(model)
                log(f"   FP32 top-1 {top1:.2f} % (claimed {model.claimed_top1})")
                res["fp32"].append({"model": model.id, "measured": top1, "claimed": model.claimed_top1, "where": model.claimed_where})
                continue
            if args.export_only:
                for fmt in formats:
                    row = export_check(model, fmt, work)
                    log(f"   {row.format:18s} exit {row.exit_code} {_f(row.seconds, 1)} s  {row.note}")
                    res["exports"].append(asdict(row))
                continue
            split = cache.make_split(manifest.datasets[model.dataset], args.calib_size, args.val_size, args.seed,
                                     source_labels=model.source_labels)
            _measure_model(model, split, work, formats, targets, args, res)
            _save(res, args)  # after every model: a run cut short keeps what finished
    print(_save(res, args))
    return 0


def _measure_model(model, split: Path, work: Path, formats: list[str], targets: list[str], args, res: dict[str, Any]) -> None:
    """Builds in each format, then (state_dict form) the anchors and the side-by-side timing."""
    res["load_average"].append(round(os.getloadavg()[0], 2))
    for fmt in ([] if args.speed_only else formats):
        for row in build(model, fmt, split, work, targets, args.build_flag, args.timeout, latency=not args.no_latency):
            log(f"   {row.format:18s} {row.target:9s} exit {row.exit_code} {_f(row.seconds, 0)} s  "
                f"agreement {_f(row.agreement)}  INT8 layers {row.int8_layers}/{row.layers_total}  "
                f"INT8/FP32 time b1 {_f(row.ratio(1))} b8 {_f(row.ratio(8))}  {row.note}")
            res["builds"].append({**asdict(row), "ratio_b1": row.ratio(1), "ratio_b8": row.ratio(8)})
    graphs: dict[tuple[str, str], Path] = {}
    if args.anchors and not args.speed_only:
        try:
            methods = tuple(m for m in args.ort_methods.split(",") if m) or None
            res["anchors"] += anchors(model, split, work, methods, graphs,
                                      nncf_modes=tuple(m for m in args.nncf_modes.split(",") if m))
        except Exception as err:
            res["anchors"].append({"model": model.id, "error": f"{type(err).__name__}: {err}"[:200]})
    bundles = work / f"bundle-{model.id}-state_dict"
    if args.speed_only:
        graphs = saved_anchor_graphs(model.id, work)
    if args.speed_rounds and not args.no_latency and "state_dict" in formats and bundles.is_dir():
        try:
            res["speed"] += speed(model, bundles, graphs, args.speed_rounds)
        except Exception as err:
            res["speed"].append({"model": model.id, "error": _one_line(err)})


def _save(res: dict[str, Any], args) -> str:
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{args.name}_fp32" if args.fp32_only else (f"{args.name}_formats" if args.export_only else args.name)
    (args.out / f"{stem}.json").write_text(json.dumps(res, indent=1) + "\n")
    text = markdown(res)
    (args.out / f"{stem}.md").write_text(text)
    return text


if __name__ == "__main__":
    sys.exit(main())
