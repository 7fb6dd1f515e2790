"""Issue 28 item 4: an OpenVINO validation pass with two batches in flight against one batch at a time.

``OpenVinoRunner.infer_all`` (what validation's and the probe's passes call) compiles the graph for
``PASS_STREAMS`` streams (THROUGHPUT) and feeds it through an ``AsyncInferQueue``; ``infer`` (what the
latency measurement calls) runs one batch at a time on the LATENCY compile. This script times both (float
regions in f32) on the graphs of an intel-cpu bundle, over the same random batches, rounds interleaved with the
order swapped every round, each timing including its own compile (what a pass pays), and checks that the
outputs are identical::

    python benchmarks/pass_streams.py --bundle OUT/intel-cpu [--images 96] [--batch 8] [--rounds 3]

Prints Markdown with the CPU's ISA; the figures are recorded in results/pass_streams_<isa>.md by hand.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def one_at_a_time(runner, batches: list[np.ndarray]) -> tuple[float, np.ndarray]:
    t = time.perf_counter()
    runner.open()
    out = np.concatenate([runner.infer(b) for b in batches])
    runner.close()
    return time.perf_counter() - t, out


def in_flight(runner, batches: list[np.ndarray]) -> tuple[float, np.ndarray]:
    t = time.perf_counter()
    out = np.concatenate(list(runner.infer_all(iter(batches))))
    runner.close()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", type=Path, required=True, help="an intel-cpu bundle (model.xml, reference.fp32.xml)")
    ap.add_argument("--images", type=int, default=96)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import openvino as ov

    from timing import machine_line

    from vitedge.backends.openvino import PASS_STREAMS, OpenVinoOptions, OpenVinoRunner

    print(f"`python benchmarks/pass_streams.py --bundle {args.bundle} --images {args.images} --batch {args.batch} "
          f"--rounds {args.rounds}` on {machine_line()}, "
          f"OpenVINO {ov.__version__}, {PASS_STREAMS} streams in flight; load average {os.getloadavg()[0]:.2f} at the start.\n")
    print("| graph | round | one batch at a time s | infer_all s | ratio | outputs identical | max difference / output scale |")
    print("|---|---:|---:|---:|---:|---|---:|")
    rng = np.random.default_rng(0)
    for name in ("model.xml", "reference.fp32.xml"):
        path = args.bundle / name
        runner = OpenVinoRunner(path, OpenVinoOptions(float_precision="f32"))
        runner.open()
        shape = (args.images, runner.input_channels, *(runner.input_hw or (224, 224)))
        runner.close()
        x = rng.standard_normal(shape, dtype=np.float32)
        batches = [x[i:i + args.batch] for i in range(0, args.images, args.batch)]
        ratios = []
        for r in range(args.rounds):
            order = (one_at_a_time, in_flight) if r % 2 == 0 else (in_flight, one_at_a_time)
            got = {f.__name__: f(runner, batches) for f in order}
            (t_one, a), (t_all, b) = got["one_at_a_time"], got["in_flight"]
            ratios.append(t_all / t_one)
            relative = float(np.max(np.abs(a - b)) / max(float(np.max(np.abs(a))), 1e-30))
            print(f"| {name} | {r + 1} | {t_one:.1f} | {t_all:.1f} | {t_all / t_one:.3f} | {np.array_equal(a, b)} | {relative:.1e} |",
                  flush=True)
        print(f"| {name} | median | | | **{statistics.median(ratios):.3f}** | | |")
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end.")


if __name__ == "__main__":
    main()
