"""Issue 47 item 2: INT8 over FP32 time on ViT layouts other than timm's, on both CPU targets.

Run by hand from the repository root (about 15-30 minutes on 2 cores):

    python benchmarks/layout_speed.py [--before DIR] [--rounds 10] [--calib-size 32]

Three layouts others publish, as our own models of them (tests/helpers/vit_layouts.py, random weights: only speed
is measured here), at realistic sizes:

* ``deit-tiny per-head``: DeiT-tiny-like (width 192, 12 layers, 3 heads, 224x224, patch 16) with a distillation
  token and its own query/key/value ``nn.Linear(192, 64)`` per head;
* ``encoder 64x64x1``: a pre-norm ``nn.TransformerEncoder`` ViT, width 256, 6 layers, 8 heads, 64x64 one-channel
  input, patch 8;
* ``cct-7``: CCT-7/3x1-like (width 256, 7 layers, 4 heads, one 3x3 conv + max-pool tokenizer, sequence pooling) on
  32x32.

Each is built with `vitedge build --target onnx --target intel-cpu` (accuracy budget off: random weights) by the
code in this checkout and, with ``--before DIR``, by the vitedge checkout in DIR too (its bundles in a separate
process). Beside them, on the same FP32 graph and calibration images: ONNX Runtime ``quantize_static`` with its
default arguments (run in ONNX Runtime) and NNCF ``quantize(model_type=TRANSFORMER)`` (run in OpenVINO). Every graph
of a layout is timed side by side in interleaved rounds at batch 1 and batch 8 (benchmarks/timing.py), all cores;
ratios are each graph's median over its runtime's FP32 median, and the median of per-round ratios.

The machine these figures come from is shared and loaded: rounds are interleaved so load hits every graph alike,
but absolute milliseconds move between runs. Writes benchmarks/results/layout_speed_<isa>.md and .json.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CODE = Path(os.environ.get("LAYOUT_SPEED_CODE", str(REPO)))  # the vitedge checkout that builds (a --before one too)
sys.path.insert(0, str(CODE))
sys.path.insert(1, str(REPO / "benchmarks"))
from timing import TIMED_PER_ROUND, bundle_graph, interleaved_rounds  # noqa: E402 - the benchmarks folder is on the path now

RESULTS = REPO / "benchmarks" / "results"
LAYOUTS_PY = REPO / "tests" / "helpers" / "vit_layouts.py"
warnings.filterwarnings("ignore")

# name -> (class, kwargs)
LAYOUTS: dict[str, tuple[str, dict[str, Any]]] = {
    "deit-tiny per-head": ("PerHeadViT", {"dim": 192, "depth": 12, "heads": 3, "classes": 10, "image": 224, "patch": 16,
                                          "mlp_ratio": 4, "distilled": True}),
    "encoder 64x64x1": ("EncoderViT", {"dim": 256, "depth": 6, "heads": 8, "classes": 10, "image": 64, "patch": 8,
                                       "channels": 1, "mlp_ratio": 2}),
    "cct-7": ("CCT", {"dim": 256, "depth": 7, "heads": 4, "classes": 10, "image": 32, "stages": 1, "mlp_ratio": 2}),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def checkpoint(layout: str, work: Path) -> Path:
    import importlib.util

    import torch

    cls, kwargs = LAYOUTS[layout]
    spec = importlib.util.spec_from_file_location("vit_layouts", LAYOUTS_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    path = work / f"{layout.replace(' ', '_')}.pt"
    torch.save(getattr(mod, cls)(**kwargs).eval().state_dict(), path)
    return path


def build(layout: str, pt: Path, out: Path, calib_size: int) -> dict[str, Any]:
    """`vitedge build` of both CPU targets with the code on sys.path; returns each bundle's build facts."""
    from vitedge.app.build import BuildRequest, run_build
    from vitedge.budget import BudgetSettings
    from vitedge.models.intake import IntakeOptions
    from vitedge.core.ui import StageLog
    from vitedge.validation.reference_cache import ReferenceCacheSettings

    cls, kwargs = LAYOUTS[layout]
    run_build(BuildRequest(model=pt, targets=("onnx", "intel-cpu"), calib=REPO / "calibration" / "digits", calib_size=calib_size,
                           out=out, cache=ReferenceCacheSettings(root=out.parent / "cache"), measure_speed=False,
                           intake=IntakeOptions(model_class=f"{LAYOUTS_PY}:{cls}", model_kwargs=kwargs),
                           budget=BudgetSettings(enabled=False)), StageLog(quiet=True))
    facts = {}
    for target in ("onnx", "intel-cpu"):
        m = json.loads((out / target / "manifest.json").read_text())
        info = m.get("backend_info", {})
        facts[target] = {k: info.get(k) for k in ("attention_fusion", "gemm_bias_fusion", "int8_layers") if k in info}
        facts[target]["layers_int8"] = m["quantization"].get("layers_int8")
        facts[target]["int8_payoff"] = m["quantization"].get("int8_payoff")
    return facts


def build_elsewhere(code: Path, layout: str, pt: Path, out: Path, calib_size: int) -> dict[str, Any]:
    """The same build by the vitedge checkout in ``code``, in its own process."""
    env = dict(os.environ, LAYOUT_SPEED_CODE=str(code), PYTHONPATH=str(code))
    done = subprocess.run([sys.executable, __file__, "--build-one", layout, str(pt), str(out), str(calib_size)], env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the build by {code} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def anchors(fp32: Path, calib: list[np.ndarray], work: Path) -> dict[str, Path]:
    from build_speed import anchor_graphs

    got = anchor_graphs(work, fp32, calib)
    return {"ort_static": got["ort_static"][0], "nncf": got["nncf"][0]}


def calib_batches(pt: Path, layout: str, calib_size: int) -> tuple[list[np.ndarray], tuple[int, ...]]:
    from vitedge.datasources.sources import open_source
    from vitedge.models.intake import IntakeOptions, load_model

    cls, kwargs = LAYOUTS[layout]
    spec = load_model(pt, IntakeOptions(model_class=f"{LAYOUTS_PY}:{cls}", model_kwargs=kwargs)).spec
    src = open_source(REPO / "calibration" / "digits", spec.preprocess, limit=calib_size, seed=0)
    batches = [b.images for b in src.batches(8)]
    return batches, tuple(batches[0].shape[1:])


def graphs(after: Path, before: Path | None, anchor: dict[str, Path]) -> dict[tuple[str, str], tuple[str, Path, str]]:
    """(runtime, label) -> (runtime, file, OpenVINO float precision)."""
    ov_used = json.loads((after / "intel-cpu" / "manifest.json").read_text())["backend_info"]["float_precision"]["used"]
    g = {("onnxruntime", "FP32"): ("ort", after / "intel-cpu" / "reference.fp32.onnx", ""),
         ("onnxruntime", "vitedge INT8"): ("ort", bundle_graph(after / "onnx", "model", "model.int8.onnx"), ""),
         ("onnxruntime", "quantize_static defaults"): ("ort", anchor["ort_static"], ""),
         ("openvino", "FP32"): ("ov", after / "intel-cpu" / "reference.fp32.xml", "f32"),
         ("openvino", "vitedge INT8"): ("ov", after / "intel-cpu" / "model.xml", ov_used),
         ("openvino", "NNCF TRANSFORMER"): ("ov", anchor["nncf"], "f32")}
    if before is not None:
        g[("onnxruntime", "vitedge INT8 before")] = ("ort", bundle_graph(before / "onnx", "model", "model.int8.onnx"), "")
        before_used = json.loads((before / "intel-cpu" / "manifest.json").read_text())["backend_info"]["float_precision"]["used"]
        g[("openvino", "vitedge INT8 before")] = ("ov", before / "intel-cpu" / "model.xml", before_used)
    return g


def time_layout(table: dict, shape: tuple[int, ...], rounds: int) -> list[dict]:
    import openvino as ov
    from build_speed import ort_runner, ov_runner

    threads = os.cpu_count() or 1
    core = ov.Core()
    rows = []
    for batch, n, timed in ((1, rounds, TIMED_PER_ROUND), (8, max(3, rounds // 2), 2)):
        x = np.random.default_rng(0).standard_normal((batch, *shape)).astype(np.float32)
        runs = {k: (ort_runner(p, x, threads) if rt == "ort" else ov_runner(core, p, x, prec)) for k, (rt, p, prec) in table.items()}
        for f in runs.values():
            f()
        load = os.getloadavg()[0]
        log(f"   batch {batch}: {n} interleaved rounds of {len(runs)} graphs (load average {load:.1f})")
        times, _ = interleaved_rounds(runs, n, timed=timed)
        for (runtime, label), ts in times.items():
            base, arr = np.asarray(times[(runtime, "FP32")]), np.asarray(ts)
            rows.append({"batch": batch, "runtime": runtime, "graph": label, "rounds": n, "median_ms": float(np.median(arr)),
                         "ratio_of_medians": float(np.median(arr) / np.median(base)),
                         "round_ratio_median": float(np.median(arr / base)),
                         "round_ratio_q25": float(np.percentile(arr / base, 25)), "round_ratio_q75": float(np.percentile(arr / base, 75)),
                         "load_average": load})
        del runs
    return rows


def git_commit(code: Path) -> str:
    done = subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "unknown"


def run_layout(layout: str, work: Path, args) -> dict[str, Any]:
    log(f"== {layout}")
    pt = checkpoint(layout, work)
    after = work / "after"
    facts = {"after": build(layout, pt, after, args.calib_size)}
    before = None
    if args.before:
        before = work / "before"
        facts["before"] = build_elsewhere(Path(args.before), layout, pt, before, args.calib_size)
    calib, shape = calib_batches(pt, layout, args.calib_size)
    with contextlib.redirect_stdout(io.StringIO()):
        anchor = anchors(after / "intel-cpu" / "reference.fp32.onnx", calib, work)
    rows = time_layout(graphs(after, before, anchor), shape, args.rounds)
    return {"layout": layout, "model": dict(zip(("class", "kwargs"), LAYOUTS[layout])), "input": list(shape),
            "builds": facts, "latency": rows}


def markdown(res: dict[str, Any]) -> str:
    env = res["environment"]
    lines = ["# INT8 over FP32 time on other ViT layouts (issue 47)", "",
             f"Measured {env['date']} on {env['machine']} (ISA {res['isa']}); a shared machine under load from other jobs: "
             "rounds interleaved so load hits every graph alike, absolute ms not comparable across runs.",
             "Versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()) + ".",
             f"Built by this checkout ({res['after_commit']})" + (f" and, as 'before', by {res['before_commit']}" if res.get("before_commit") else "")
             + f"; {res['calib_size']} calibration images, accuracy budget off (random weights); `python benchmarks/layout_speed.py"
             + (" --before DIR" if res.get("before_commit") else "") + "`.", "",
             "Ratio = graph median / FP32 median on the same runtime (below 1: faster than FP32); "
             "per-round = median of each round's ratio [IQR].", ""]
    for lay in res["layouts"]:
        lines += [f"## {lay['layout']} ({lay['model']['class']}, input {'x'.join(map(str, lay['input']))})", "",
                  "| runtime | graph | b1 ms | b1 ratio | b1 per-round | b8 ms | b8 ratio | b8 per-round |", "|---|---|---|---|---|---|---|---|"]
        by = {(r["runtime"], r["graph"], r["batch"]): r for r in lay["latency"]}
        for runtime, graph in dict.fromkeys((r["runtime"], r["graph"]) for r in lay["latency"]):
            cells = []
            for b in (1, 8):
                r = by.get((runtime, graph, b))
                cells += ["-"] * 3 if r is None else [f"{r['median_ms']:.2f}", f"{r['ratio_of_medians']:.2f}",
                                                       f"{r['round_ratio_median']:.2f} [{r['round_ratio_q25']:.2f}-{r['round_ratio_q75']:.2f}]"]
            lines.append(f"| {runtime} | {graph} | " + " | ".join(cells) + " |")
        lines.append("")
        for side, facts in lay["builds"].items():
            onnx = facts.get("onnx", {})
            att, gb = onnx.get("attention_fusion") or {}, onnx.get("gemm_bias_fusion")
            kept = (onnx.get("int8_payoff") or {}).get("kept_float") or []
            lines.append(f"- {side}: onnx attention fusion {att.get('fused')} of {att.get('candidates')}"
                         + (f", GEMM bias folded {gb['folded']} of {gb['gemms']}" if gb else "")
                         + f", INT8 layers executed {((onnx.get('int8_layers') or {}).get('by_type'))}"
                         + (f", kept float where INT8 does not pay: {', '.join(k['name'] for k in kept)}" if kept else ""))
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--build-one":  # a --before checkout's build, in its own process
        layout, pt, out, calib_size = sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5])
        with contextlib.redirect_stdout(io.StringIO()):
            facts = build(layout, pt, out, calib_size)
        print(json.dumps(facts))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", help="a vitedge checkout (e.g. the main branch) whose bundles are timed beside this one's")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calib-size", type=int, default=32)
    ap.add_argument("--layout", action="append", choices=list(LAYOUTS), help="only these layouts (default: all)")
    args = ap.parse_args()
    from build_speed import isa_slug
    from quant_accuracy import environment

    from vitedge.core.cpu import read_cpu

    cpu = read_cpu()
    res = {"environment": environment(), "isa": cpu.isa, "int8_dot_product": cpu.int8_dot_product, "calib_size": args.calib_size,
           "rounds": args.rounds, "timed_per_round": TIMED_PER_ROUND, "after_commit": git_commit(REPO),
           "before_commit": git_commit(Path(args.before)) if args.before else None, "layouts": []}
    with tempfile.TemporaryDirectory(prefix="vitedge-layout-speed-") as tmp:
        for layout in args.layout or list(LAYOUTS):
            work = Path(tmp) / layout.replace(" ", "_")
            work.mkdir()
            res["layouts"].append(run_layout(layout, work, args))
    stem = f"layout_speed_{isa_slug(cpu)}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(res, indent=1))
    (RESULTS / f"{stem}.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
