"""Issue 47 item 2: is each bundle's INT8 at least as fast as its FP32 reference, on both CPU targets, at batch 1 and 8?

    python benchmarks/int8_payoff_speed.py --bundles LABEL=DIR [LABEL=DIR ...] [--name int8_payoff] [--profile]

Each DIR is a `vitedge build --target onnx --target intel-cpu` output folder (DIR/onnx, DIR/intel-cpu), e.g. the
bundle-<model>-state_dict folders `benchmarks/corpus.py --work WORK` leaves. For every bundle, on ONNX Runtime (onnx:
the bundle's reference, attention fused like its INT8 graph where it fuses, vs model.int8.onnx) and OpenVINO (intel-cpu: reference.fp32.xml vs model.xml, the INT8 IR's
float regions as its manifest records), at batch 1 and 8, three timings of the same pair:

* **cpu1**: one inference thread, the calling thread's CPU time, 10th percentile, graphs in random order per round,
  with a second FP32 copy as control (vitedge/backends/int8_timing.py: what the build decides with);
* **wall**: all cores, wall time, interleaved rounds (benchmarks/timing.py), median of per-round medians (what a user
  sees; on a loaded machine this moves with the load: evidence the build's decision does not use);
* **corpus schedule** (ONNX Runtime, batch 8 only): benchmarks/corpus.py's side-by-side schedule (both runtimes'
  graphs in one process, 2 rounds of 2 timed runs at batch 8), repeated 5 times: the spread of its ratio.

``--profile``: OpenVINO's per-node counters (one thread, batch 1; each node's shortest time over 50 runs, summed by
node type and kernel) of each INT8 IR against its FP32 IR. Prints Markdown and writes benchmarks/results/<name>_<isa>.md and .json, with the CPU and the load.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "benchmarks"))
from timing import bundle_graph, interleaved_rounds, machine_line  # noqa: E402

from vitedge.backends.int8_timing import PayoffTiming, interleaved_ratio  # noqa: E402
from vitedge.core.cpu import read_cpu  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"


def onnx_reference(bundle: Path) -> str:
    """The FP32 graph an onnx bundle names as its reference (reference.fp32.onnx; in bundles of earlier versions
    reference.fp32.fused.onnx where attention fused)."""
    try:
        return json.loads((bundle / "manifest.json").read_text())["artifacts"]["reference"]
    except (OSError, KeyError, ValueError):
        return "reference.fp32.onnx"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _input(shape: list[Any], batch: int, integral: bool) -> np.ndarray:
    dims = [batch] + [d if isinstance(d, int) and d > 0 else 1 for d in shape[1:]]
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, dims).astype(np.uint8) if integral else rng.standard_normal(dims).astype(np.float32)


def ort_call(path: Path, batch: int, threads: int, spinning: bool = True) -> Callable[[], Any]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = threads
    if not spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    x = _input(inp.shape, batch, "uint8" in inp.type)
    return lambda: sess.run(None, {inp.name: x})


def ov_call(core, path: Path, batch: int, threads: int, precision: str, perf: bool = False):
    model = core.read_model(str(path))
    dims = [d.get_length() if d.is_static else 1 for d in model.inputs[0].get_partial_shape()]
    dims[0] = batch
    model.reshape({model.inputs[0]: dims})
    cfg: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": precision}
    if threads:
        cfg["INFERENCE_NUM_THREADS"] = threads
    if perf:
        cfg["PERF_COUNT"] = "YES"
    req = core.compile_model(model, "CPU", cfg).create_infer_request()
    x = _input(dims, batch, model.inputs[0].get_element_type().is_integral())
    return (lambda: req.infer({0: x})), req


def int8_precision(bundle: Path) -> str:
    """The float regions' precision the intel-cpu INT8 IR runs in: the IR's own choice (rt_info), else the manifest's."""
    import openvino as ov

    model = ov.Core().read_model(str(bundle / "intel-cpu" / "model.xml"))
    if model.has_rt_info(["vitedge.float_precision"]):
        return str(model.get_rt_info(["vitedge.float_precision"]).astype(str))
    info = json.loads((bundle / "intel-cpu" / "manifest.json").read_text()).get("backend_info", {})
    return str((info.get("float_precision") or {}).get("used", "f32"))


def measure(label: str, bundle: Path, rounds: int) -> list[dict[str, Any]]:
    import openvino as ov

    core, threads = ov.Core(), os.cpu_count() or 1
    prec = int8_precision(bundle)
    rows = []
    for batch in (1, 8):
        pairs = {
            "onnxruntime": (lambda t: ort_call(bundle / "onnx" / onnx_reference(bundle / "onnx"), batch, t),
                            lambda t: ort_call(bundle_graph(bundle / "onnx", "model", "model.int8.onnx"), batch, t)),
            "openvino": (lambda t: ov_call(core, bundle / "intel-cpu" / "reference.fp32.xml", batch, t, "f32")[0],
                         lambda t: ov_call(core, bundle / "intel-cpu" / "model.xml", batch, t, prec)[0]),
        }
        for runtime, (fp32, int8) in pairs.items():
            cpu1, control = interleaved_ratio(fp32(1), fp32(1), int8(1), PayoffTiming(min_rounds=10, max_rounds=40, seconds=4.0,
                                                                                       clear_margin=0.0), seed=batch)
            runs = {"fp32": fp32(threads), "int8": int8(threads)}
            times, _ = interleaved_rounds(runs, rounds)
            f, i = np.asarray(times["fp32"]), np.asarray(times["int8"])
            row = {"bundle": label, "runtime": runtime, "batch": batch, "cpu1_ratio": round(cpu1, 3), "cpu1_control": round(control, 3),
                   "wall_ratio": round(float(np.median(i / f)), 3), "wall_fp32_ms": round(float(np.median(f)), 3),
                   "wall_int8_ms": round(float(np.median(i)), 3), "load": round(os.getloadavg()[0], 1)}
            if runtime == "onnxruntime" and batch == 8:
                row["corpus_schedule"] = corpus_schedule(bundle, core, threads)
            rows.append(row)
            log(f"   {label} {runtime} b{batch}: {row}")
    return rows


def corpus_schedule(bundle: Path, core, threads: int) -> list[float]:
    """benchmarks/corpus.py speed() at batch 8 (4 graphs in one process, 2 rounds of 2 timed runs), 5 times:
    the ONNX Runtime INT8/FP32 ratio of each repeat."""
    prec = int8_precision(bundle)
    out = []
    for _ in range(5):
        runs = {"ort fp32": ort_call(bundle / "onnx" / onnx_reference(bundle / "onnx"), 8, threads),
                "ort int8": ort_call(bundle_graph(bundle / "onnx", "model", "model.int8.onnx"), 8, threads),
                "ov fp32": ov_call(core, bundle / "intel-cpu" / "reference.fp32.xml", 8, 0, "f32")[0],
                "ov int8": ov_call(core, bundle / "intel-cpu" / "model.xml", 8, 0, prec)[0]}
        for f in runs.values():
            f()
        times, _ = interleaved_rounds(runs, 2, timed=2)
        out.append(round(float(np.median(times["ort int8"]) / np.median(times["ort fp32"])), 3))
    return out


def profile(label: str, bundle: Path, runs: int = 50) -> dict[str, dict[str, float]]:
    """OpenVINO per-node counters at one thread, batch 1: ms per run by 'node type kernel', FP32 IR and INT8 IR."""
    import openvino as ov

    core = ov.Core()
    out = {}
    for name, xml, prec in (("FP32", "reference.fp32.xml", "f32"), ("INT8", "model.xml", int8_precision(bundle))):
        call, req = ov_call(core, bundle / "intel-cpu" / xml, 1, 1, prec, perf=True)
        for _ in range(5):
            call()
        fastest: dict[tuple[str, str], float] = {}  # per node, its shortest time over the runs (load only stretches)
        for _ in range(runs):
            call()
            for info in req.profiling_info:
                ms = info.real_time.total_seconds() * 1e3
                key = (info.node_name, f"{info.node_type} {info.exec_type}")
                fastest[key] = min(fastest.get(key, ms), ms)
        sums: collections.Counter = collections.Counter()
        for (_node, kind), ms in fastest.items():
            if ms > 0:
                sums[kind] += ms
        out[name] = {k: round(v, 4) for k, v in sums.most_common()}
    return out


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# INT8 over FP32 time of vitedge's bundles, both CPU targets (issue 47 item 2)", "",
             f"Measured {res['date']} by `python benchmarks/int8_payoff_speed.py {' '.join(res['argv'])}` on {res['machine']}, "
             f"shared with other jobs (1-minute load average {res['load_start']} at the start, {res['load_end']} at the end, "
             "on 2 cores). Only this CPU kind could be measured. Ratios are INT8 time / FP32 time of the same bundle (below 1: "
             "INT8 is faster). cpu1: one inference thread, the calling thread's CPU time, 10th percentile, with the ratio of "
             "a second FP32 copy (control, ideally 1.00) beside it. wall: all cores, wall time, median of per-round ratios "
             f"({res['rounds']} interleaved rounds): it moves with the machine's load.", "",
             "| bundle | runtime | b1 cpu1 (control) | b1 wall | b8 cpu1 (control) | b8 wall | b8 corpus.py schedule, 5 repeats |",
             "|---|---|---|---|---|---|---|"]
    by = collections.defaultdict(dict)
    for r in res["rows"]:
        by[(r["bundle"], r["runtime"])][r["batch"]] = r
    for (bundle, runtime), b in by.items():
        one, eight = b.get(1, {}), b.get(8, {})
        sched = eight.get("corpus_schedule")
        lines.append(f"| {bundle} | {runtime} | {one.get('cpu1_ratio', '')} ({one.get('cpu1_control', '')}) | {one.get('wall_ratio', '')} | "
                     f"{eight.get('cpu1_ratio', '')} ({eight.get('cpu1_control', '')}) | {eight.get('wall_ratio', '')} | "
                     f"{', '.join(f'{v:.2f}' for v in sched) if sched else ''} |")
    for label, prof in res.get("profiles", {}).items():
        lines += ["", f"## OpenVINO per-node counters, {label}, one thread, batch 1 (each node's shortest ms of 50 runs, summed)", "",
                  "| node type and kernel | FP32 IR | INT8 IR |", "|---|---:|---:|"]
        keys = sorted(set(prof["FP32"]) | set(prof["INT8"]), key=lambda k: -(prof["FP32"].get(k, 0) + prof["INT8"].get(k, 0)))
        for k in keys[:12]:
            lines.append(f"| {k} | {prof['FP32'].get(k, 0):.3f} | {prof['INT8'].get(k, 0):.3f} |")
        lines.append(f"| **sum** | {sum(prof['FP32'].values()):.3f} | {sum(prof['INT8'].values()):.3f} |")
    return "\n".join(lines) + "\n"


def _shown_argv(argv: list[str]) -> list[str]:
    """The command line as the results file shows it: folders as DIR (they are this machine's)."""
    shown, hide = [], False
    for a in argv:
        shown.append("DIR" if hide else a.split("=", 1)[0] + "=DIR" if "=" in a else a)
        hide = a == "--out"
    return shown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundles", nargs="+", required=True, metavar="LABEL=DIR")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--name", default="int8_payoff")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    res: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine_line(),
                           "argv": _shown_argv(sys.argv[1:]),
                           "rounds": args.rounds, "load_start": round(os.getloadavg()[0], 1), "rows": [], "profiles": {}}
    for spec in args.bundles:
        label, folder = spec.split("=", 1)
        log(f"== {label}")
        res["rows"] += measure(label, Path(folder), args.rounds)
        if args.profile:
            res["profiles"][label] = profile(label, Path(folder))
    res["load_end"] = round(os.getloadavg()[0], 1)
    text = markdown(res)
    print(text)
    isa = read_cpu().isa.split(",")[0].replace(" ", "-")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}_{isa}.md").write_text(text)
    (args.out / f"{args.name}_{isa}.json").write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
