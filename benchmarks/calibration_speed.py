"""Issue 19 items 1 and 2: how fast vitedge calibrates beside ONNX Runtime's
``quantize_static``, and whether its peak memory stays flat in the number of images.

Run by hand from the repository root (about 15-30 minutes on 2 cores):

    python benchmarks/calibration_speed.py [--arch vit_base_patch16_224] [--images 64] [--rounds 2]

Speed: one random-weight timm ViT exported by vitedge, the same images (the first
``--images`` of calibration/digits, seeded subset), in one run, rounds interleaved
(the order rotates every round) so machine load hits every contender alike. Each run is a
fresh child process (nothing warm, nothing shared), timed from the call to its return:

* vitedge: ``calibrate()`` with an empty cache and the default QuantConfig (method select,
  SmoothQuant 0.5, bias correction): the build's "calibrate" stage, method select's scoring of
  its candidates included. It decodes the images inside the timing. Also reported:
  ``calibrate() + build_qdq() + save``, the whole analogue of ``quantize_static``.
* vitedge_before (with ``--before-src DIR``): the same, with the vitedge package of another
  checkout (e.g. the main branch before a change), side by side in the same rounds.
* ``quantize_static`` (QDQ, defaults otherwise) with ``CalibrationMethod.MinMax``, and, on
  the smaller model of ``--entropy-arch``, with ``Entropy`` (ONNX Runtime keeps every
  calibrated tensor of every image in memory for it, so it runs on fewer images:
  ``--entropy-images``). Its data reader hands over preprocessed batches of 8 decoded
  before the timing starts.

The ratio is vitedge's median over the anchor's median, and the median of per-round ratios.

Memory: peak RSS (``ru_maxrss`` of the child process: graph, ONNX Runtime session,
statistics, everything) of vitedge's ``calibrate()`` on ``--memory-arch`` at each of
``--memory-images`` synthetic JPEGs (smooth random patterns, written once).

Caveats: a shared, noisy 2-core machine (other jobs run beside; the load average is
recorded with every row): read ratios measured side by side, not absolute seconds. The
CPU's ISA is recorded (vitedge.core.cpu). Writes benchmarks/results/calibration_speed_<isa>.json and adds the run as a
section at the top of benchmarks/results/calibration_speed.md (earlier runs and notes there stay).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
RESULTS = REPO / "benchmarks" / "results"
DIGITS = REPO / "calibration" / "digits"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- inputs


def export_random(arch: str, work: Path) -> Path:
    import timm
    import torch

    from vitedge.models.export import export_onnx
    from vitedge.models.intake import IntakeOptions, load_model

    out = work / f"{arch}.fp32.onnx"
    if out.exists():
        return out
    torch.manual_seed(0)
    pt = work / f"{arch}.pt"
    torch.save(timm.create_model(arch, pretrained=False).state_dict(), pt)
    export_onnx(load_model(pt, IntakeOptions(arch=arch)), out)
    return out


def synthetic_images(folder: Path, count: int, size: int = 224) -> Path:
    """``count`` JPEGs of smooth random colour patterns (deterministic)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    have = len(list(folder.glob("*.jpg")))
    rng = np.random.default_rng(0)
    for k in range(count):
        coarse = rng.random((8, 8, 3)) * 255
        img = Image.fromarray(coarse.astype(np.uint8)).resize((size, size), Image.BICUBIC)
        noise = rng.normal(0, 12, (size, size, 3))
        if k < have:
            continue
        arr = np.clip(np.asarray(img, dtype=np.float64) + noise, 0, 255).astype(np.uint8)
        Image.fromarray(arr).save(folder / f"img_{k:05d}.jpg", quality=90)
    return folder


def _spec(fp32: Path):
    import onnx

    from vitedge.onnxkit.metadata import SPEC_KEY, get_metadata
    from vitedge.bundle.spec import ModelSpec

    return ModelSpec.from_json(get_metadata(onnx.load(str(fp32), load_external_data=False))[SPEC_KEY])


# --------------------------------------------------------------------------- one job (in a child process)


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    import resource

    if job.get("src"):  # another checkout's vitedge (the "before" contender)
        sys.path.insert(0, job["src"])

    from vitedge.datasources.sources import open_source

    fp32 = Path(job["fp32"])
    spec = _spec(fp32)
    src = open_source(job["images"], spec.preprocess, limit=job["count"], seed=0)
    out: dict[str, Any] = {"kind": job["kind"], "images": len(src)}
    if job["kind"] in ("vitedge", "vitedge_before"):
        from vitedge.quantize import QuantConfig, build_qdq, calibrate

        with tempfile.TemporaryDirectory(prefix="vitedge-calcache-") as cache:
            t0 = time.perf_counter()
            cal = calibrate(fp32, src, QuantConfig(), cache_dir=cache)
            out["seconds"] = time.perf_counter() - t0
            out["forward_runs"] = cal.forward_passes
            out["timings"] = {k: round(v, 3) for k, v in cal.timings.items()}
            if job.get("quantize", True):
                t1 = time.perf_counter()
                build_qdq(cal).save(Path(cache) / "model.int8.onnx")
                out["with_qdq_seconds"] = out["seconds"] + time.perf_counter() - t1
    else:
        import contextlib
        import io

        from onnxruntime.quantization import (
            CalibrationDataReader,
            CalibrationMethod,
            quantize_static,
        )

        name = _input_name(fp32)
        batches = [b.images for b in src.batches(8)]

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.it = iter({name: b} for b in batches)

            def get_next(self):
                return next(self.it, None)

        method = {"ort_minmax": CalibrationMethod.MinMax, "ort_entropy": CalibrationMethod.Entropy}[job["kind"]]
        with tempfile.TemporaryDirectory(prefix="vitedge-ortq-") as tmp:
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                quantize_static(str(fp32), str(Path(tmp) / "q.onnx"), Reader(), calibrate_method=method)
            out["seconds"] = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out["maxrss_mib"] = usage.ru_maxrss / 1024.0
    out["cpu_seconds"] = usage.ru_utime + usage.ru_stime  # the whole child, imports and decoding included
    import vitedge

    out["vitedge_from"] = str(Path(vitedge.__file__).resolve().parents[1])
    return out


def _input_name(fp32: Path) -> str:
    import onnx

    return onnx.load(str(fp32), load_external_data=False).graph.input[0].name


def child(job: dict[str, Any], memory_limit_gib: float | None = None) -> dict[str, Any]:
    """Run one job in a fresh Python process; its result, or the error it ended with."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--job", json.dumps(job)]
    if memory_limit_gib:
        cmd += ["--memory-limit-gib", str(memory_limit_gib)]
    load_before = os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"kind": job["kind"], "error": f"exit {proc.returncode}: {tail[:200]}", "load_average_1min": load_before}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["load_average_1min"] = load_before
    return res


# --------------------------------------------------------------------------- the run


def speed(fp32: Path, images: Path, count: int, kinds: list[str], rounds: int, limit: float | None,
          before_src: Path | None = None) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for r in range(rounds):
        order = kinds[r % len(kinds):] + kinds[: r % len(kinds)]
        for kind in order:
            log(f"   round {r + 1}/{rounds}: {kind}")
            job = {"kind": kind, "fp32": str(fp32), "images": str(images), "count": count}
            if kind == "vitedge_before" and before_src is not None:
                job["src"] = str(before_src)
            res = child(job, limit)
            log(f"      {json.dumps(res)}")
            runs[kind].append(res)
    summary: dict[str, Any] = {"graph": fp32.name, "images": count, "rounds": rounds, "runs": runs, "medians_s": {}, "ratios": {}}
    ok = {k: [x for x in v if "seconds" in x] for k, v in runs.items()}
    summary["min_s"] = {}
    for k, v in ok.items():
        if v:
            summary["medians_s"][k] = float(np.median([x["seconds"] for x in v]))
            summary["min_s"][k] = float(np.min([x["seconds"] for x in v]))
    vq = [x.get("with_qdq_seconds") for x in ok.get("vitedge", [])]
    if vq and all(v is not None for v in vq):
        summary["medians_s"]["vitedge+qdq"] = float(np.median(vq))
    for ours in [k for k in kinds if k.startswith("vitedge")]:
        for anchor in [k for k in kinds if not k.startswith("vitedge")] + (["vitedge_before"] if ours == "vitedge" else []):
            if anchor not in summary["medians_s"] or ours not in summary["medians_s"]:
                continue
            pairs = [(a, b) for a, b in zip(runs[ours], runs[anchor]) if "seconds" in a and "seconds" in b]
            per_round = [a["seconds"] / b["seconds"] for a, b in pairs]
            cpu = [a["cpu_seconds"] / b["cpu_seconds"] for a, b in pairs if "cpu_seconds" in a and "cpu_seconds" in b]
            summary["ratios"][f"{ours} / {anchor}"] = {
                "ratio_of_medians": summary["medians_s"][ours] / summary["medians_s"][anchor],
                "ratio_of_mins": summary["min_s"][ours] / summary["min_s"][anchor],
                "median_per_round": float(np.median(per_round)) if per_round else None,
                "per_round": [round(x, 3) for x in per_round],
                "cpu_per_round": [round(x, 3) for x in cpu],
            }
        if "vitedge+qdq" in summary["medians_s"]:
            summary["ratios"][f"vitedge+qdq / {anchor}"] = {"ratio_of_medians": summary["medians_s"]["vitedge+qdq"] / summary["medians_s"][anchor]}
    return summary


def memory(fp32: Path, images: Path, counts: list[int]) -> dict[str, Any]:
    rows = []
    for n in counts:
        log(f"   memory: vitedge calibrate on {n} images")
        res = child({"kind": "vitedge", "fp32": str(fp32), "images": str(images), "count": n, "quantize": False})
        log(f"      {json.dumps(res)}")
        rows.append(res)
    out: dict[str, Any] = {"graph": fp32.name, "rows": rows}
    good = [r for r in rows if "maxrss_mib" in r]
    if len(good) >= 2:
        out["ratio_last_over_first"] = good[-1]["maxrss_mib"] / good[0]["maxrss_mib"]
    return out


def environment() -> dict[str, Any]:
    import onnx
    import onnxruntime

    from vitedge.core.cpu import read_cpu

    cpu = read_cpu()
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": platform.python_version(), "numpy": np.__version__,
            "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__, "cpu_model": cpu.model, "cpu_isa": cpu.isa,
            "int8_dot_product": cpu.int8_dot_product, "cores": os.cpu_count(), "load_average_start": os.getloadavg()}


def markdown(res: dict[str, Any]) -> str:
    env = res["environment"]
    lines = ["# Calibration speed and memory (issue 19 items 1-2)", "",
             (f"Measured {env['date']} by `python benchmarks/calibration_speed.py {res['argv']}` on {env['cpu_model']} "
              f"(ISA {env['cpu_isa']}, INT8 dot product: {env['int8_dot_product']}), {env['cores']} cores; "
              f"ONNX Runtime {env['onnxruntime']}, onnx {env['onnx']}, numpy {env['numpy']}, Python {env['python']}."), "",
             ("Method: the same exported FP32 graph (random timm weights) and the same images for every contender, each run a "
              "fresh child process, rounds interleaved with the order rotating. vitedge = `calibrate()` with an empty cache and "
              "the default settings (method select, SmoothQuant 0.5, bias correction), the build's calibrate stage, image "
              "decoding and select's scoring of its candidates included; vitedge_before = the same with the vitedge package of "
              "`--before-src`; `+qdq` adds `build_qdq()` and saving the graph. ONNX Runtime = `quantize_static` (QDQ), its reader "
              "handing over batches of 8 decoded beforehand. CPU s: user + system time of the whole child process."), "",
             ("Caveats: a shared 2-core machine with other jobs running (load average beside every row): the ratios, measured "
              "side by side, are the result, not the seconds. The CPU's ISA is above: figures from one kind of CPU do not "
              "carry over to the other (AVX2 vs VNNI)."), ""]
    for sec in res["speed"]:
        lines += [f"## Speed: {sec['graph']}, {sec['images']} images, {sec['rounds']} rounds", "",
                  "| contender | median s | min s | runs (s) | CPU s (user+sys) | peak RSS MiB | load avg (1 min) at start |", "|---|---:|---:|---|---|---|---|"]
        for kind, runs in sec["runs"].items():
            secs = ", ".join(f"{r['seconds']:.1f}" if "seconds" in r else r.get("error", "?") for r in runs)
            rss = ", ".join(f"{r['maxrss_mib']:,.0f}" for r in runs if "maxrss_mib" in r)
            loads = ", ".join(f"{r['load_average_1min']:.2f}" for r in runs)
            cpu = ", ".join(f"{r['cpu_seconds']:.1f}" for r in runs if "cpu_seconds" in r)
            med, low = sec["medians_s"].get(kind), sec.get("min_s", {}).get(kind)
            lines.append(f"| {kind} | {med:.1f} | {low:.1f} | {secs} | {cpu} | {rss} | {loads} |" if med is not None
                         else f"| {kind} | - | - | {secs} | {cpu} | {rss} | {loads} |")
        if "vitedge+qdq" in sec["medians_s"]:
            lines.append(f"| vitedge + build_qdq + save | {sec['medians_s']['vitedge+qdq']:.1f} | | | | | |")
        lines += ["", "| ratio | ratio of medians | ratio of minimums | per round (wall) | per round (CPU s) |", "|---|---:|---:|---|---|"]
        for name, r in sec["ratios"].items():
            if "ratio_of_mins" not in r:
                lines.append(f"| {name} | {r['ratio_of_medians']:.3f} | | | |")
                continue
            rounds = ", ".join(f"{x:.3f}" for x in r["per_round"])
            cpu = ", ".join(f"{x:.3f}" for x in r.get("cpu_per_round", []))
            lines.append(f"| {name} | {r['ratio_of_medians']:.3f} | {r['ratio_of_mins']:.3f} | {rounds} | {cpu} |")
        for kind in [k for k in sec["runs"] if k.startswith("vitedge")]:
            for k, r in enumerate(x for x in sec["runs"][kind] if "timings" in x):
                lines += ["", f"{kind}'s own split (round {k + 1}): " + ", ".join(f"{n} {t:.1f} s" for n, t in r["timings"].items())
                          + f"; ONNX Runtime runs (batches of 8): {r['forward_runs']}"]
        lines.append("")
    mem = res.get("memory")
    if mem:
        lines += [f"## Peak memory of calibration: {mem['graph']}", "", "| images | peak RSS MiB | calibrate s | load avg |", "|---:|---:|---:|---|"]
        for r in mem["rows"]:
            if "maxrss_mib" in r:
                lines.append(f"| {r['images']} | {r['maxrss_mib']:,.0f} | {r['seconds']:.1f} | {r['load_average_1min']:.2f} |")
            else:
                lines.append(f"| ? | {r.get('error')} | | |")
        if "ratio_last_over_first" in mem:
            lines += ["", f"Peak RSS ratio, most over fewest images: **{mem['ratio_last_over_first']:.3f}x** (target <= 1.15x)."]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="vit_base_patch16_224", help="'' skips the MinMax speed rows")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--entropy-arch", default="vit_small_patch16_224", help="'' skips the Entropy anchor")
    ap.add_argument("--entropy-images", type=int, default=32)
    ap.add_argument("--entropy-rounds", type=int, default=1)
    ap.add_argument("--memory-arch", default="vit_small_patch16_224", help="'' skips the memory rows")
    ap.add_argument("--memory-images", default="128,1024")
    ap.add_argument("--memory-limit-gib", type=float, default=None, help="(jobs) address-space cap of a child process")
    ap.add_argument("--work", type=Path, default=None, help="keep graphs and images here (default: a temporary folder)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--memory-from", type=Path, default=None,
                    help="take the memory rows from this earlier run's calibration_speed.json (run beside this one) instead of measuring them")
    ap.add_argument("--before-src", type=Path, default=None,
                    help="also time the vitedge package of this checkout (e.g. the main branch before a change) in the same rounds")
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        if args.memory_limit_gib:
            import resource

            cap = int(args.memory_limit_gib * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        print(json.dumps(run_job(json.loads(args.job))))
        return
    argv = " ".join(sys.argv[1:])
    start = time.perf_counter()
    res: dict[str, Any] = {"environment": environment(), "argv": argv, "speed": []}
    with tempfile.TemporaryDirectory(prefix="vitedge-calspeed-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.arch:
            log(f"== speed: {args.arch}, {args.images} images")
            fp32 = export_random(args.arch, work)
            kinds = ["vitedge", "ort_minmax"] + (["vitedge_before"] if args.before_src else [])
            res["speed"].append(speed(fp32, DIGITS, args.images, kinds, args.rounds, None, args.before_src))
            save(res, start, args.out)
        if args.entropy_arch:
            log(f"== speed with the Entropy anchor: {args.entropy_arch}, {args.entropy_images} images")
            small = export_random(args.entropy_arch, work)
            res["speed"].append(speed(small, DIGITS, args.entropy_images, ["vitedge", "ort_minmax", "ort_entropy"],
                                      args.entropy_rounds, None))
            save(res, start, args.out)
        if args.memory_from:
            res["memory"] = json.loads(args.memory_from.read_text())["memory"]
            res["memory"]["from"] = f"{args.memory_from.name} of a run beside this one: {res['memory'].get('argv', '')}"
        elif args.memory_arch:
            counts = [int(c) for c in args.memory_images.split(",") if c]
            log(f"== memory: {args.memory_arch} at {counts} images")
            images = synthetic_images(work / "synthetic", max(counts))
            res["memory"] = dict(memory(export_random(args.memory_arch, work), images, counts), argv=argv)
    print(save(res, start, args.out))


def save(res: dict[str, Any], start: float, out: Path) -> str:
    """This run as ``calibration_speed_<isa>.json`` and as a section at the top of ``calibration_speed.md``, a
    hand-kept history (notes and earlier runs below stay; saving again during the same run replaces its section)."""
    res["seconds"] = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    env = res["environment"]
    (out / f"calibration_speed_{env['cpu_isa']}.json").write_text(json.dumps(res, indent=1, default=str))
    md = markdown(res)
    merge_section(out / "calibration_speed.md", md, f"{env['date']}, {env['cpu_isa']}")
    return md


RUN_START = "<!-- calibration_speed.py run {} -->"
RUN_END = "<!-- end of calibration_speed.py run -->"


def merge_section(path: Path, md: str, run: str) -> None:
    """``md`` (a whole report: a title, then ``##`` sections) as one section of ``path`` right under its title."""
    title, _, body = md.partition("\n")
    body = "\n".join("#" + line if line.startswith("## ") else line for line in body.strip("\n").splitlines())
    block = f"{RUN_START.format(run)}\n## Run of {run}\n\n{body}\n{RUN_END}\n"
    old = path.read_text() if path.exists() else f"{title}\n"
    start = old.find(RUN_START.format(run))
    if start >= 0:  # this run saved before: replace its section
        end = old.index(RUN_END, start) + len(RUN_END) + 1
        new = old[:start] + block + old[end:]
    else:
        head, _, rest = old.partition("\n")
        new = f"{head}\n\n{block}\n{rest.lstrip(chr(10))}"
    path.write_text(new)


if __name__ == "__main__":
    main()
