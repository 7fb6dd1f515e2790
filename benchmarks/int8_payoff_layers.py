"""Issue 47 item 2: does keeping INT8 layers float, layer by layer, make the onnx target's bundle faster on this CPU?

    python benchmarks/int8_payoff_layers.py --bundles LABEL=DIR [LABEL=DIR ...] [--rounds 20] [--name int8_payoff_layers]

Each DIR is a `vitedge build --target onnx` bundle folder (e.g. the bundle-<model>-state_dict folders
`benchmarks/corpus.py --work WORK` leaves). For each bundle: its shipped graph is turned back into its Q/DQ form
(``unfold_int8_rewrites``), the build's per-layer step (vitedge/backends/onnxruntime/layer_payoff.py) profiles it
and the FP32 reference at batch 1 and 8 and picks the groups of layers to keep float; then these graphs, each made
from that Q/DQ form by the onnx target's rewrites, are timed side by side in one process at batch 1 and 8 (the
build's method: one inference thread, calling thread's CPU time, 10th percentile, a new random order each round),
each over the bundle's FP32 reference:

* ``shipped``: the bundle's model.int8.onnx as built;
* ``per-layer choice``: the groups the step picks (their INT8 time minus their FP32 time, over the graph's FP32 time,
  summed over batch 1 and 8, above 0);
* ``losing at b1 and b8``: only the groups whose INT8 time is above their FP32 time at both batch sizes;
* ``all layers float``: every INT8 layer float (the rewrites kept), what per-layer float could reach at most;
* ``FP32 control``: a second copy of the reference.

Also the wall and CPU seconds the step's profile took (what it adds to a build, with the side-by-side timing's
at most 3 s per batch size). Prints Markdown and writes benchmarks/results/<name>_<isa>.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(1, str(REPO / "benchmarks"))
from timing import bundle_graph, labelled_bundles, machine_line, results_isa, write_results  # noqa: E402


RESULTS = REPO / "benchmarks" / "results"
GRAPHS = ("shipped", "per-layer choice", "losing at b1 and b8", "all layers float", "FP32 control")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def measure(bundle: Path, rounds: int, tmp: Path) -> dict[str, Any]:
    import onnx

    from vitedge.backends.float_layers import return_to_float
    from vitedge.backends.int8_timing import interleaved_percentiles
    from vitedge.backends.onnxruntime.backend import _fuse_file, unfold_int8_rewrites
    from vitedge.backends.onnxruntime.layer_payoff import profile_verdicts
    from vitedge.backends.onnxruntime.payoff import one_thread_run

    onnx_dir = bundle / "onnx" if (bundle / "onnx").is_dir() else bundle
    manifest = json.loads((onnx_dir / "manifest.json").read_text())
    ref, model = onnx_dir / manifest["artifacts"]["reference"], bundle_graph(onnx_dir, "model", "model.int8.onnx")
    graph = onnx.load(str(model))
    unfold_int8_rewrites(graph)
    onnx.save(graph, str(tmp / "qdq.onnx"))
    w0, c0 = time.perf_counter(), time.process_time()
    verdicts = profile_verdicts(model, ref, (1, 8))
    cost = {"wall_s": round(time.perf_counter() - w0, 2), "cpu_s": round(time.process_time() - c0, 2)}
    chosen = {"per-layer choice": {n for v in verdicts if v.to_float for n in v.group.names},
              "losing at b1 and b8": {n for v in verdicts if all(v.int8_us[b] > v.fp32_us[b] for b in (1, 8)) for n in v.group.names},
              "all layers float": {n for v in verdicts for n in v.group.names}}
    paths = {"shipped": model, "FP32 control": ref}
    for key, names in chosen.items():
        q = onnx.load(str(tmp / "qdq.onnx"))
        return_to_float(q, lambda node, dq, names=names: "timed" if node.name in names else None)
        stem = key.replace(" ", "_")
        onnx.save(q, str(tmp / f"{stem}.qdq.onnx"))
        _fuse_file(tmp / f"{stem}.qdq.onnx", tmp / f"{stem}.onnx", None)
        paths[key] = tmp / f"{stem}.onnx"
    ratios: dict[str, dict[str, float]] = {k: {} for k in GRAPHS}
    fp32_ms = {}
    for b in (1, 8):
        runs = {"fp32": one_thread_run(ref, b), **{k: one_thread_run(p, b) for k, p in paths.items()}}
        t = interleaved_percentiles(runs, rounds=rounds, per_round=3, seed=b)
        for k in GRAPHS:
            ratios[k][str(b)] = round(t[k] / t["fp32"], 4)
        fp32_ms[str(b)] = round(t["fp32"] * 1e3, 4)
    return {"groups": len(verdicts), "layers": {k: len(v) for k, v in chosen.items()},
            "chosen": sorted(chosen["per-layer choice"]), "ratios": ratios, "fp32_ms": fp32_ms, "profile_cost": cost,
            "load": round(os.getloadavg()[0], 2)}


def markdown(res: dict[str, Any]) -> str:
    lines = [f"# INT8 layers kept float one by one, onnx target ({res['isa']}: {res['machine']})", "",
             f"Measured {res['date']} by `python benchmarks/int8_payoff_layers.py {' '.join(res['argv'])}` at commit "
             f"{res['commit']} on {res['machine']}; 1-minute load average at each bundle's end in its row (other jobs on "
             "the 2 cores).", "",
             "Each graph's INT8/FP32 time at batch 1 / 8 (one thread, CPU time, p10, side by side in one process; below 1: "
             "faster than the bundle's FP32 reference). Layers: INT8 layers kept float in that graph. Profile: what the "
             "build's per-layer profile took (wall / CPU s; the build adds at most 3 s per batch size of side-by-side "
             "timing when it has a candidate).", "",
             "| bundle | FP32 ms b1 / b8 | " + " | ".join(GRAPHS) + " | layers float (choice / both / all) | profile s | load |",
             "|---|---|" + "---|" * len(GRAPHS) + "---|---|---|"]
    for r in res["rows"]:
        if "error" in r:
            lines.append(f"| {r['bundle']} | {r['error']} |" + " |" * (len(GRAPHS) + 3))
            continue
        cells = [f"{r['ratios'][k]['1']:.2f} / {r['ratios'][k]['8']:.2f}" for k in GRAPHS]
        ly = r["layers"]
        lines.append(f"| {r['bundle']} | {r['fp32_ms']['1']:.2f} / {r['fp32_ms']['8']:.2f} | " + " | ".join(cells)
                     + f" | {ly['per-layer choice']} / {ly['losing at b1 and b8']} / {ly['all layers float']} of {r['groups']} groups"
                     + f" | {r['profile_cost']['wall_s']} / {r['profile_cost']['cpu_s']} | {r['load']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import datetime as _dt

    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundles", nargs="+", required=True, metavar="LABEL=DIR")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--name", default="int8_payoff_layers")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    pairs = labelled_bundles(args.bundles)
    if pairs is None:
        print("each --bundles item is LABEL=DIR with DIR an existing bundle folder", file=sys.stderr)
        return 2
    isa = results_isa()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    res: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "isa": isa, "commit": commit,
                           "machine": machine_line(), "argv": ["--bundles", "LABEL=DIR ...", "--rounds", str(args.rounds)], "rows": []}
    for label, folder in pairs:
        log(f"{label}")
        with tempfile.TemporaryDirectory(prefix="vitedge-layers-") as tmp:
            try:
                row = {"bundle": label, **measure(Path(folder), args.rounds, Path(tmp))}
            except Exception as err:  # noqa: BLE001 - one bundle's failure is its row
                row = {"bundle": label, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"}
        res["rows"].append(row)
        log(json.dumps(row)[:400])
    text = markdown(res)
    write_results(args.out, args.name, isa, res, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
