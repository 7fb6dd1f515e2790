"""OpenVINO INT8 vs FP32 on this CPU, one option at a time (issue 19 item 5).

For each option: the FP32 reference IR and the INT8 IR of a vitedge intel-cpu bundle, compiled with
the same OpenVINO settings, timed in interleaved rounds (FP32, INT8, FP32, ...) at batch 1 and 8 on
``--threads`` threads; medians. Agreement: top-1 of INT8 vs FP32 on the digits validation set.
Options that change the artifact (layers kept in float) are other bundles, given as
``--variant NAME=BUNDLE`` (built with `vitedge build --keep-float PATTERN`).

    python benchmarks/openvino_int8.py --bundle /tmp/ovb/intel-cpu \\
        --variant "MLP FCs float=/tmp/ovkf_mlp/intel-cpu" --variant "attention FCs float=/tmp/ovkf_attn/intel-cpu"

Prints a Markdown table; --json writes the records. ``--counters N`` prints instead what OpenVINO
itself says: the INT8 IR's executed matrix kernels and per-(layer type, kernel) time of both IRs.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vitedge.core.cpu import read_cpu

# OpenVINO compile settings, one option per row (added to the baseline: LATENCY hint, f32 float regions).
OPTIONS: dict[str, dict[str, object]] = {
    "baseline (LATENCY, f32)": {},
    "THROUGHPUT hint, 1 stream": {"PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": "1"},
    "CPU pinning on": {"ENABLE_CPU_PINNING": True},
    "denormals flushed": {"CPU_DENORMALS_OPTIMIZATION": True},
    "dynamic quantization off": {"DYNAMIC_QUANTIZATION_GROUP_SIZE": 0},
}


def compile_pair(core, bundle: Path, extra: dict[str, object], threads: int, batch: int):
    config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": threads, **extra}
    out = []
    for name in ("reference.fp32.xml", "model.xml"):
        model = core.read_model(str(bundle / name))
        dims = [d.get_length() if d.is_static else 1 for d in model.inputs[0].get_partial_shape()]
        dims[0] = batch
        model.reshape({model.inputs[0]: dims})
        out.append(core.compile_model(model, "CPU", config).create_infer_request())
    return out, dims


def interleaved(requests, dims, rounds: int, per_round: int) -> list[float]:
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    times = [[] for _ in requests]
    for r in requests:
        for _ in range(5):
            r.infer({0: x})
    for _ in range(rounds):
        for i, r in enumerate(requests):
            r.infer({0: x})
            for _ in range(per_round):
                t0 = time.perf_counter()
                r.infer({0: x})
                times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]


def val_set(bundle: Path) -> np.ndarray:
    pre = json.loads((bundle / "manifest.json").read_text())["model"]["spec"]["preprocess"]
    h, w = pre["crop_size"]
    mean, std = np.array(pre["mean"], np.float32), np.array(pre["std"], np.float32)
    files = sorted(p for p in (REPO / "calibration" / "digits" / "val").rglob("*") if p.suffix.lower() in (".png", ".jpg"))
    imgs = [(np.asarray(Image.open(f).convert("RGB").resize((w, h), Image.BILINEAR), np.float32) / 255 - mean) / std for f in files]
    return np.stack(imgs).transpose(0, 3, 1, 2).copy()


def agreement(core, bundle: Path, extra: dict[str, object], threads: int, images: np.ndarray) -> float:
    (fp32, int8), _ = compile_pair(core, bundle, extra, threads, 1)
    same = [np.argmax(next(iter(fp32.infer({0: x[None]}).values()))) == np.argmax(next(iter(int8.infer({0: x[None]}).values())))
            for x in images]
    return float(np.mean(same))


def runtime_layers(core, bundle: Path, threads: int) -> dict[str, int]:
    """What the CPU plugin executes for the INT8 IR: (layer type, precision, kernel) counts. The kernels
    are chosen at the first inference (before it the runtime model says undef)."""
    (_, int8), dims = compile_pair(core, bundle, {}, threads, 1)
    int8.infer({0: np.zeros(dims, np.float32)})
    compiled = int8.get_compiled_model()
    counts: collections.Counter[str] = collections.Counter()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        layer, prec, kernel = (str(info[k].astype(str)) if k in info else "?" for k in ("layerType", "runtimePrecision", "primitiveType"))
        if layer in ("FullyConnected", "MatMul", "Convolution"):
            counts[f"{layer} {prec} {kernel}"] += 1
    return dict(counts)


def counters(core, bundle: Path, threads: int, iterations: int) -> None:
    """OpenVINO's performance counters for both IRs at batch 1 and 8, summed by (layer type, kernel)."""
    for batch in (1, 8):
        reqs, dims = compile_pair(core, bundle, {"PERF_COUNT": "YES"}, threads, batch)
        x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
        for label, req in zip(("FP32", "INT8"), reqs):
            sums: collections.Counter[str] = collections.Counter()
            for _ in range(iterations):
                req.infer({0: x})
                for info in req.profiling_info:
                    sums[f"{info.node_type} {info.exec_type}"] += info.real_time.total_seconds() * 1e3 / iterations
            total = sum(sums.values())
            print(f"\n{label} batch {batch}: counters sum {total:.3f} ms")
            for key, ms in sums.most_common(8):
                print(f"  {ms:9.3f} ms {100 * ms / total:5.1f}%  {key}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, required=True, help="an intel-cpu bundle folder (model.xml, reference.fp32.xml)")
    ap.add_argument("--variant", action="append", default=[], help="NAME=BUNDLE: another intel-cpu bundle, timed with the baseline settings")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--per-round", type=int, default=5)
    ap.add_argument("--only", action="append", default=[], help="time only these options (names as in the table)")
    ap.add_argument("--agreement-images", type=int, default=0, help="at most this many validation images (0: all)")
    ap.add_argument("--counters", type=int, default=0, metavar="N",
                    help="print OpenVINO's performance counters over N inferences per IR and batch, then exit")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import openvino as ov

    core = ov.Core()
    supported = set(core.get_property("CPU", "SUPPORTED_PROPERTIES"))
    cpu = read_cpu()
    if args.counters:
        print(f"CPU: {cpu.model} ({cpu.isa}); OpenVINO {ov.__version__}; {args.threads} threads")
        print("INT8 IR executes:", runtime_layers(core, args.bundle, args.threads))
        counters(core, args.bundle, args.threads, args.counters)
        return
    images = val_set(args.bundle)[: args.agreement_images or None]
    rows = [(name, args.bundle, extra) for name, extra in OPTIONS.items() if not args.only or name in args.only]
    rows += [(v.split("=", 1)[0], Path(v.split("=", 1)[1]), {}) for v in args.variant]
    print(f"CPU: {cpu.model} ({cpu.isa}); OpenVINO {ov.__version__}; {args.threads} threads; "
          f"{args.rounds} interleaved rounds of {args.per_round}; {len(images)} validation images\n")
    print("| option | FP32 ms b1 | INT8 ms b1 | INT8/FP32 b1 | FP32 ms b8 | INT8 ms b8 | b8 throughput INT8/FP32 | agreement |")
    print("|---|---|---|---|---|---|---|---|")
    records = []
    for name, bundle, extra in rows:
        missing = [k for k in extra if k not in supported]
        if missing:
            print(f"| {name} | not in this OpenVINO: {', '.join(missing)} | | | | | | |")
            records.append({"option": name, "skipped": f"unsupported: {missing}"})
            continue
        rec = {"option": name, "bundle": str(bundle), "config": {k: str(v) for k, v in extra.items()}}
        for batch in (1, 8):
            reqs, dims = compile_pair(core, bundle, extra, args.threads, batch)
            fp32, int8 = interleaved(reqs, dims, args.rounds if batch == 1 else max(8, args.rounds // 4), args.per_round)
            rec[f"b{batch}"] = {"fp32_ms": fp32, "int8_ms": int8}
        rec["agreement"] = agreement(core, bundle, extra, args.threads, images)
        rec["int8_layers"] = runtime_layers(core, bundle, args.threads)
        b1, b8 = rec["b1"], rec["b8"]
        print(f"| {name} | {b1['fp32_ms']:.3f} | {b1['int8_ms']:.3f} | {b1['int8_ms'] / b1['fp32_ms']:.2f}x | {b8['fp32_ms']:.2f} | "
              f"{b8['int8_ms']:.2f} | {b8['fp32_ms'] / b8['int8_ms']:.2f}x | {100 * rec['agreement']:.2f}% |", flush=True)
        records.append(rec)
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu.to_dict(), "openvino": ov.__version__, "threads": args.threads,
                                         "rows": records}, indent=1))


if __name__ == "__main__":
    main()
