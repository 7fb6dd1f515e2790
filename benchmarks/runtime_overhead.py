"""What the embedding runtime costs on top of the backend runner, and what loading it costs.

Run by hand (one timing run at a time on a shared machine):

    flock /tmp/vitedge-bench.lock python benchmarks/runtime_overhead.py [--venv]

For each bundle (the bundled digits ViT and a random-weight timm ViT-B/16, each built for
`onnx` and `intel-cpu`; built with the vitedge CLI into --work when missing):

1. Overhead, measured side by side in one process, interleaved per iteration:
     A  model.predict(frame, top_k=5, color="bgr")        on a 640x480 camera-like BGR frame
     P  model.preprocess(frame, color="bgr")               the preprocessing alone, then right after it
     B  runner.infer(tensor)                               the same backend runner on that tensor
   ratio = median(A - the preprocessing inside that same A) / median(B): what predict costs
   beyond preprocessing, relative to calling the runner directly (target <= 1.05). P is
   reported on its own.
2. Start-up, each in a fresh subprocess: import time of vitedge.runtime, of the backend,
   load (verify + open + warm-up), the sha256 verification alone, first predict, and the
   resident memory (VmRSS / VmHWM) of the loaded runtime. With --venv also in a fresh venv
   holding only the vitedge-runtime wheel, numpy, Pillow and the backend.
3. Threads: predict throughput with 4 threads on one runner (the default lock) vs a pool
   of 2 runners, to back the default.

Writes benchmarks/results/runtime_overhead.{md,json}.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CALIB = REPO / "calibration" / "digits" / "calib"
VAL = REPO / "calibration" / "digits" / "val"
TARGETS = ("onnx", "intel-cpu")
BACKEND_MODULE = {"onnxruntime": "onnxruntime", "openvino": "openvino"}


# -- bundles --------------------------------------------------------------------------------------


def _vitedge_cli(*args: str, cwd: Path) -> None:
    cmd = [sys.executable, "-m", "vitedge", "build", *args]
    print("  $ vitedge build " + " ".join(args), flush=True)
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode not in (0, 1):  # 1: a parity gate missed; the bundles are written and usable
        sys.exit(f"build failed ({r.returncode}): {r.stderr.strip().splitlines()[-1:]}")


def ensure_bundles(work: Path, with_vitb: bool) -> dict[str, Path]:
    work.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    digits = work / "digits"
    if not all((digits / t / "manifest.json").exists() for t in TARGETS):
        _vitedge_cli(str(REPO / "examples" / "digits_vit.pt"), *sum((["--target", t] for t in TARGETS), []),
                     "--calib", str(CALIB), "--val", str(VAL), "--no-latency", "-o", str(digits), "--force", cwd=work)
    out.update({f"digits/{t}": digits / t for t in TARGETS})
    if with_vitb:
        vitb = work / "vitb"
        if not all((vitb / t / "manifest.json").exists() for t in TARGETS):
            weights, calib = make_vitb_inputs(work)
            _vitedge_cli(str(weights), "--arch", "vit_base_patch16_224", *sum((["--target", t] for t in TARGETS), []),
                         "--calib", str(calib), "--no-latency", "-o", str(vitb), "--force", cwd=work)
        out.update({f"vit_b16/{t}": vitb / t for t in TARGETS})
    return out


def make_vitb_inputs(work: Path) -> tuple[Path, Path]:
    """Random-weight timm ViT-B/16 (seeded) and 32 calibration images: digit PNGs resized to 224."""
    weights, calib = work / "vit_base_patch16_224.pt", work / "calib32"
    if not weights.exists():
        import timm
        import torch

        torch.manual_seed(0)
        torch.save(timm.create_model("vit_base_patch16_224", pretrained=False).eval().state_dict(), weights)
    if not calib.is_dir() or len(list(calib.glob("*.png"))) < 32:
        from PIL import Image

        calib.mkdir(exist_ok=True)
        src = sorted(CALIB.rglob("*.png"))
        for i, p in enumerate(src[:: max(1, len(src) // 32)][:32]):
            Image.open(p).convert("RGB").resize((224, 224), Image.Resampling.BICUBIC).save(calib / f"{i:02d}.png")
    return weights, calib


def camera_frame(h: int = 480, w: int = 640) -> np.ndarray:
    """A BGR camera-sized frame: a real held-out digit on a dark canvas."""
    from PIL import Image

    digit = Image.open(sorted(VAL.glob("3/*.png"))[0]).convert("RGB").resize((h, h), Image.Resampling.BICUBIC)
    canvas = Image.new("RGB", (w, h), (12, 12, 12))
    canvas.paste(digit, ((w - h) // 2, 0))
    return np.ascontiguousarray(np.asarray(canvas)[..., ::-1])


# -- 1. overhead ----------------------------------------------------------------------------------


def measure_overhead(bundle: Path, iters: int, warm: int, threads: int | None = None) -> dict:
    from vitedge.runtime import load

    model = load(bundle, warmup=3, threads=threads)
    runner = model._pool.runners[0]  # the very runner predict uses: same session, same threads
    frame = camera_frame()
    clock = time.perf_counter
    rows: list[tuple[float, float, float, float]] = []  # (A, P inside A, P by hand, B)
    inner: list[float] = []
    prepare = model._prepare

    def timed_prepare(items, bgr):  # times predict's own preprocessing, inside the same call
        t0 = clock()
        out = prepare(items, bgr)
        inner.append(clock() - t0)
        return out

    model._prepare = timed_prepare

    def predict() -> tuple[float, float]:
        t0 = clock()
        model.predict(frame, top_k=5, color="bgr")
        return clock() - t0, inner.pop()

    def by_hand() -> tuple[float, float]:  # what a user would write: preprocess, then the runner
        t0 = clock()
        tensor = model.preprocess(frame, color="bgr")
        t1 = clock()
        runner.infer(tensor)
        return t1 - t0, clock() - t1

    for i in range(warm + iters):  # interleaved: A, (P, B), (P, B), A, A, (P, B), ...
        if i % 2 == 0:
            (ta, tpa), (tp, tb) = predict(), by_hand()
        else:
            (tp, tb), (ta, tpa) = by_hand(), predict()
        if i >= warm:
            rows.append((ta, tpa, tp, tb))
    own_us = runtime_own_cost(model, frame)
    model.close()
    a, pa, p, b = (np.array(col) for col in zip(*rows))
    med = lambda x: float(np.median(x))  # noqa: E731
    blocks = [med(a[i::5] - pa[i::5]) / med(b[i::5]) for i in range(5)]  # 5 interleaved sub-samples: the spread
    return {
        "ratio_blocks_min": min(blocks), "ratio_blocks_max": max(blocks),
        "runtime_own_cost_us": own_us,
        "iterations": iters, "frame": list(frame.shape), "backend": model.backend,
        "threads": "profile default" if threads is None else threads,
        "predict_ms": 1e3 * med(a), "predict_minus_its_preprocess_ms": 1e3 * med(a - pa),
        "preprocess_in_predict_ms": 1e3 * med(pa), "preprocess_ms": 1e3 * med(p), "runner_ms": 1e3 * med(b),
        "ratio": med(a - pa) / med(b),
        "ratio_of_medians": (med(a) - med(p)) / med(b),
        "ratio_vs_by_hand": med(a) / med(p + b),
        "predict_p90_ms": 1e3 * float(np.percentile(a, 90)), "runner_p90_ms": 1e3 * float(np.percentile(b, 90)),
    }


def runtime_own_cost(model, frame: np.ndarray, n: int = 3000) -> float:
    """predict's own Python cost in microseconds, without noise from the machine: the runner
    and the preprocessing replaced by stubs that return their saved results (a hot loop)."""
    runner = model._pool.runners[0]
    tensor = model.preprocess(frame, color="bgr")
    out = runner.infer(tensor)
    saved_infer, saved_prepare = runner.infer, model._prepare
    runner.infer, model._prepare = (lambda batch: out), (lambda items, bgr: tensor)
    try:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            model.predict(frame, top_k=5, color="bgr")
            times.append(time.perf_counter() - t0)
    finally:
        runner.infer, model._prepare = saved_infer, saved_prepare
    return 1e6 * float(np.median(times))


# -- 2. start-up: import time, load time, memory -------------------------------------------------

STARTUP_CODE = r"""
import json, sys, time
def rss():
    vals = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                vals[line.split(":")[0]] = int(line.split()[1]) / 1024
    return vals
out = {"rss_start_mb": rss()["VmRSS"]}
t = time.perf_counter(); import numpy, PIL.Image; out["import_numpy_pillow_ms"] = 1e3 * (time.perf_counter() - t)
t = time.perf_counter(); import vitedge.runtime; out["import_runtime_ms"] = 1e3 * (time.perf_counter() - t)
out["rss_after_import_mb"] = rss()["VmRSS"]
bundle, module = sys.argv[1], sys.argv[2]
t = time.perf_counter(); __import__(module); out["import_backend_ms"] = 1e3 * (time.perf_counter() - t)
out["rss_after_backend_import_mb"] = rss()["VmRSS"]
from vitedge.bundle.manifest import verify_bundle
t = time.perf_counter(); verify_bundle(bundle); out["verify_ms"] = 1e3 * (time.perf_counter() - t)
t = time.perf_counter(); model = vitedge.runtime.load(bundle); out["load_ms"] = 1e3 * (time.perf_counter() - t)
frame = numpy.zeros((480, 640, 3), numpy.uint8)
t = time.perf_counter(); model.predict(frame, color="bgr"); out["first_predict_ms"] = 1e3 * (time.perf_counter() - t)
m = rss(); out["rss_loaded_mb"], out["rss_peak_mb"] = m["VmRSS"], m["VmHWM"]
heavy = ("torch", "onnx", "click", "rich", "nncf", "timm")
out["heavy_modules"] = [h for h in heavy if h in sys.modules]
out["vitedge_from"] = vitedge.__file__
print(json.dumps(out))
"""


def measure_startup(bundle: Path, backend: str, python: str = sys.executable, repeats: int = 3, env=None) -> dict:
    runs = []
    for _ in range(repeats):
        r = subprocess.run([python, "-c", STARTUP_CODE, str(bundle), BACKEND_MODULE[backend]], capture_output=True,
                           text=True, cwd=tempfile.gettempdir(), env=env)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        runs.append(json.loads(r.stdout.strip().splitlines()[-1]))
    out = {k: statistics.median(run[k] for run in runs) for k, v in runs[0].items() if isinstance(v, (int, float))}
    out["heavy_modules"] = runs[0]["heavy_modules"]
    out["vitedge_from"] = runs[0]["vitedge_from"]
    out["repeats"] = repeats
    return out


def runtime_venv(work: Path) -> tuple[str, dict]:
    """A fresh venv with only the vitedge-runtime wheel, numpy, Pillow and both CPU backends."""
    venv = work / "venv-runtime"
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if not Path(python).exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        src = Path(tempfile.mkdtemp(prefix="vitedge-runtime-src-"))
        shutil.copytree(REPO / "vitedge", src / "vitedge", ignore=shutil.ignore_patterns("__pycache__"))
        (src / "packaging" / "runtime").mkdir(parents=True)
        shutil.copy(REPO / "packaging" / "runtime" / "pyproject.toml", src / "packaging" / "runtime")
        subprocess.run([python, "-m", "pip", "install", "-q", f"{src / 'packaging' / 'runtime'}[onnxruntime,openvino]"],
                       check=True, env=env)
        shutil.rmtree(src, ignore_errors=True)
    freeze = subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, env=env, check=True)
    return python, {"python": python, "packages": {d["name"]: d["version"] for d in json.loads(freeze.stdout)}}


# -- 3. threads -----------------------------------------------------------------------------------


def measure_threads(bundle: Path, per_thread: int, n_threads: int = 4) -> dict:
    from vitedge.runtime import load

    frame = camera_frame()
    out = {}
    for name, kw in (("1 runner (lock)", {"runners": 1}), ("2 runners (pool)", {"runners": 2}),
                     ("2 runners x 1 thread", {"runners": 2, "threads": 1})):
        with load(bundle, warmup=2, **kw) as model:
            def work() -> None:
                for _ in range(per_thread):
                    model.predict(frame, color="bgr")

            threads = [threading.Thread(target=work) for _ in range(n_threads)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            out[name] = n_threads * per_thread / (time.perf_counter() - t0)
    return {"threads": n_threads, "frames_per_s": out}


# -- report ---------------------------------------------------------------------------------------


def machine() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {"python": sys.version.split()[0]}
    for name in ("numpy", "PIL", "onnxruntime", "openvino", "vitedge"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001
            pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "versions": versions, "commit": commit,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}


def render_md(res: dict) -> str:
    m = res["machine"]
    lines = [
        "# Runtime overhead: `vitedge.runtime` vs calling the backend runner directly",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['platform']}; load average at start "
        f"{', '.join(f'{x:.1f}' for x in m['load_average'] or [])}, at the end "
        f"{', '.join(f'{x:.1f}' for x in m.get('load_average_end') or [])} (a shared machine: other engineers' builds ran meanwhile). Date {m['date']}, commit {m['commit']}.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
        "Produced by `flock /tmp/vitedge-bench.lock python benchmarks/runtime_overhead.py" + (" --venv" if res.get("venv") else "") + "`.",
        "",
        "## 1. predict on one frame vs the runner on a preprocessed tensor",
        "",
        "Same process, same runner object; per iteration A = `model.predict(frame, top_k=5, color=\"bgr\")` and, by hand,",
        "P = `model.preprocess(frame, color=\"bgr\")` then B = `runner.infer(tensor)`; the next iteration in the other",
        "order (A, P+B, P+B, A, ...). Frame: 640x480 BGR uint8 (a held-out digit on a canvas). Medians.",
        "",
        "- **ratio** = median(A - A's own preprocessing) / median(B): predict's cost apart from preprocessing (its",
        "  preprocessing is timed inside the same call), relative to the runner called directly on a preprocessed",
        "  tensor. Target <= 1.05. Preprocessing is its own column (P, by hand).",
        "- `spread` = the ratio on 5 interleaved sub-samples (every 5th iteration): min-max.",
        "- `own us` = predict's own Python cost with the runner and the preprocessing stubbed out (a hot loop, no",
        "  machine noise): the floor of what the runtime adds per frame.",
        "- `(A-P)/B` = (median A - median P) / median B, the same from separate calls: noisier, because on a shared",
        "  2-core machine the medians of separate calls do not add up (bursts of contention land on some calls).",
        "- `A / (P+B)` = predict against preprocess + runner by hand, per-iteration sums: the end-to-end view.",
        "",
        "| bundle | backend threads | iterations | runner ms (B) | predict ms (A) | A minus its preprocessing ms | preprocess ms (P) | **ratio** | spread | own us | (A-P)/B | A / (P+B) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for name, r in res["overhead"].items():
        lines.append(f"| {name} ({r['backend']}) | {r['threads']} | {r['iterations']} | {r['runner_ms']:.3f} | {r['predict_ms']:.3f} | "
                     f"{r['predict_minus_its_preprocess_ms']:.3f} | {r['preprocess_ms']:.3f} | **{r['ratio']:.3f}** | "
                     f"{r['ratio_blocks_min']:.3f}-{r['ratio_blocks_max']:.3f} | {r['runtime_own_cost_us']:.0f} | "
                     f"{r['ratio_of_medians']:.3f} | {r['ratio_vs_by_hand']:.3f} |")
    lines += ["", "## 2. Start-up and memory of a loaded runtime", "",
              "Fresh subprocess per row, median of 3. `import` = `import vitedge.runtime` (numpy and Pillow already imported);",
              "`backend` = importing onnxruntime / openvino; `load` = `load(bundle)`: sha256 verification of every bundle file +",
              "opening the runner + one warm-up run (`verify` is the verification alone, included in `load`); RSS after load and",
              "one predict on a 640x480 frame; peak = VmHWM. RSS \"after import\" is after numpy, Pillow and vitedge.runtime.",
              "`heavy` lists torch/onnx/click/rich/nncf/timm found in sys.modules after load + predict.", "",
              "| where | bundle | import ms | backend import ms | load ms | verify ms | first predict ms | RSS MB start / after import / loaded | peak MB | heavy |",
              "|---|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for where, rows in res["startup"].items():
        for name, s in rows.items():
            lines.append(f"| {where} | {name} | {s['import_runtime_ms']:.0f} | {s['import_backend_ms']:.0f} | {s['load_ms']:.0f} | "
                         f"{s['verify_ms']:.0f} | {s['first_predict_ms']:.1f} | {s['rss_start_mb']:.0f} / {s['rss_after_import_mb']:.0f} / "
                         f"{s['rss_loaded_mb']:.0f} | {s['rss_peak_mb']:.0f} | {', '.join(s['heavy_modules']) or 'none'} |")
    if res.get("venv"):
        pk = res["venv"]["packages"]
        lines += ["", "The `venv` rows run in a fresh venv holding only: " + ", ".join(f"{k} {v}" for k, v in sorted(pk.items())) + "."]
    lines += ["", "## 3. Concurrent predict: one runner behind a lock vs a pool of runners", "",
              f"{next(iter(res['threads'].values()))['threads']} Python threads calling `predict` on the 640x480 frame; frames per second.", "",
              "| bundle | " + " | ".join(next(iter(res["threads"].values()))["frames_per_s"]) + " |",
              "|---|" + "---:|" * len(next(iter(res["threads"].values()))["frames_per_s"])]
    for name, t in res["threads"].items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.1f}" for v in t["frames_per_s"].values()) + " |")
    worst = max(res["overhead"].items(), key=lambda kv: kv[1]["ratio"])
    lines += ["", "## Summary", "",
              f"- Largest ratio: {worst[1]['ratio']:.3f} ({worst[0]}); every row <= 1.05: "
              f"{'yes' if all(r['ratio'] <= 1.05 for r in res['overhead'].values()) else 'no'}. The runtime's own per-frame cost "
              f"in a hot loop is {min(r['runtime_own_cost_us'] for r in res['overhead'].values()):.0f}-"
              f"{max(r['runtime_own_cost_us'] for r in res['overhead'].values()):.0f} us; beside a real inference, with caches",
              "  cold, it is a few tens of us, which is what the digits rows (1.5-3.5 ms inferences) show.",
              "- No row imported torch, onnx, click, rich, nncf or timm." if not any(
                  s["heavy_modules"] for rows in res["startup"].values() for s in rows.values()) else
              "- Some rows imported heavy modules: see the table.",
              "- Threads: one runner behind a lock is the default (correct for every backend, one copy of the model);",
              "  `runners=2, threads=1` is the setup to try when several threads call predict on a small CPU (section 3).",
              ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "vitedge-bench", help="bundles and venv live here")
    ap.add_argument("--no-vitb", action="store_true", help="only the digits bundles (no ViT-B/16 build)")
    ap.add_argument("--venv", action="store_true", help="also measure start-up in a fresh venv with only the runtime wheel")
    ap.add_argument("--iters", type=int, default=1000, help="overhead iterations for the digits bundles")
    ap.add_argument("--iters-vitb", type=int, default=60, help="overhead iterations for ViT-B/16")
    ap.add_argument("--no-write", action="store_true", help="print only; do not write benchmarks/results")
    ap.add_argument("--render", action="store_true", help="only rewrite the .md from the saved .json")
    args = ap.parse_args(argv)
    if args.render:
        (RESULTS / "runtime_overhead.md").write_text(render_md(json.loads((RESULTS / "runtime_overhead.json").read_text())))
        return 0

    res: dict = {"machine": machine()}
    bundles = ensure_bundles(args.work, not args.no_vitb)
    print(f"bundles: {', '.join(bundles)}", flush=True)

    res["overhead"] = {}
    for threads in (None, 1):
        for bundle_name, path in bundles.items():
            big = bundle_name.startswith("vit_b16")
            name = bundle_name + ("" if threads is None else f", {threads} thread")
            r = measure_overhead(path, args.iters_vitb if big else args.iters, 5 if big else 50, threads)
            res["overhead"][name] = r
            print(f"  overhead {name:28s} runner {r['runner_ms']:8.3f} ms  predict {r['predict_ms']:8.3f} ms  "
                  f"preprocess {r['preprocess_ms']:.3f} ms  ratio {r['ratio']:.3f} ({r['ratio_blocks_min']:.3f}-{r['ratio_blocks_max']:.3f}), "
                  f"own {r['runtime_own_cost_us']:.0f} us  (A-P)/B {r['ratio_of_medians']:.3f}  "
                  f"A/(P+B) {r['ratio_vs_by_hand']:.3f}", flush=True)

    res["startup"] = {"dev env": {}}
    for name, path in bundles.items():
        backend = json.loads((path / "manifest.json").read_text())["target"]["backend"]
        res["startup"]["dev env"][name] = s = measure_startup(path, backend)
        print(f"  startup  {name:18s} import {s['import_runtime_ms']:.0f} ms, load {s['load_ms']:.0f} ms, "
              f"RSS {s['rss_loaded_mb']:.0f} MB, heavy {s['heavy_modules']}", flush=True)
    if args.venv:
        python, info = runtime_venv(args.work)
        res["venv"] = info
        res["startup"]["venv (runtime wheel only)"] = {}
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        for name, path in bundles.items():
            backend = json.loads((path / "manifest.json").read_text())["target"]["backend"]
            res["startup"]["venv (runtime wheel only)"][name] = s = measure_startup(path, backend, python, env=env)
            print(f"  venv     {name:18s} import {s['import_runtime_ms']:.0f} ms, load {s['load_ms']:.0f} ms, "
                  f"RSS {s['rss_loaded_mb']:.0f} MB", flush=True)

    res["threads"] = {}
    for name, path in bundles.items():
        big = name.startswith("vit_b16")
        res["threads"][name] = t = measure_threads(path, 6 if big else 150)
        print(f"  threads  {name:18s} " + ", ".join(f"{k}: {v:.1f}/s" for k, v in t["frames_per_s"].items()), flush=True)

    res["machine"]["load_average_end"] = os.getloadavg()
    md = render_md(res)
    print("\n" + md)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "runtime_overhead.json").write_text(json.dumps(res, indent=2) + "\n")
        (RESULTS / "runtime_overhead.md").write_text(md)
        print(f"wrote {RESULTS / 'runtime_overhead.md'} and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
