"""The ViT-B/16 cold and warm build of an older vitedge, for `build_speed.py --build-only --baseline FILE`.

Issue 19 item 4 asks for a cold build at <= 0.5x of "today's" build. To quote that ratio on the CPU at
hand (not against a figure measured on another machine), run the code of that day on this CPU:

    git worktree add --detach /tmp/vitedge-22e595c 22e595c
    PYTHONPATH=/tmp/vitedge-22e595c python benchmarks/baseline_build.py /tmp/vitedge-22e595c \\
        > benchmarks/results/build_wall_baseline_<isa>.json

It imports ``build_vitb`` from that checkout's own benchmarks/build_speed.py (same model, seed, targets,
calibration images and settings as today's script) and prints its per-stage times as JSON, with the
commit, the CPU, the load average and the process's CPU seconds (user + system: ONNX Runtime's and
OpenVINO's threads run in this process). Run it on a quiet machine right before or after
`build_speed.py --build-only`, and read only the ratio between the two.

On a shared machine the speed drifts by 20 % between half-hour windows (results/build_wall_avx2.md, 2026-11-26),
so a ratio of two runs half an hour apart can carry the drift. ``--cold-only`` runs only the cold row, and the
same script runs this checkout too, so old and new cold builds can alternate (new, old, old, new, ...)::

    PYTHONPATH=$PWD python benchmarks/baseline_build.py $PWD --cold-only > main_1.json
    PYTHONPATH=/tmp/vitedge-22e595c python benchmarks/baseline_build.py /tmp/vitedge-22e595c --cold-only > base_1.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--cold-only"]
    if not 1 <= len(args) <= 2:
        sys.exit("usage: baseline_build.py CHECKOUT [CALIB_SIZE] [--cold-only]  (CHECKOUT: a worktree of the older commit, also on PYTHONPATH)")
    checkout = Path(args[0]).resolve()
    calib = int(args[1]) if len(args) > 1 else 256
    rows = {"cold cache": {}} if "--cold-only" in sys.argv else None  # None: the checkout's own BUILD_ROWS
    sys.path[:0] = [str(checkout), str(checkout / "benchmarks")]
    import build_speed  # the checkout's own script
    import vitedge

    if Path(vitedge.__file__).resolve().parents[1] != checkout:
        sys.exit(f"vitedge was imported from {vitedge.__file__}, not from {checkout}: put the checkout first on PYTHONPATH")
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    # /proc/cpuinfo read here, not vitedge.core.cpu: the vitedge imported is the older checkout's, which may lack it
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    load = [os.getloadavg()[0]]
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    before = os.times()
    with tempfile.TemporaryDirectory(prefix="vitedge-baseline-") as tmp:
        _, _, times = build_speed.build_vitb(Path(tmp), calib, rows)
    after = os.times()
    load.append(os.getloadavg()[0])
    isa = [f for f in ("avx512_vnni", "avx_vnni", "amx_int8", "avx512f", "avx2") if f in flags]
    print(json.dumps({"commit": commit, "calib_size": calib, "cpu_isa_flags": isa, "load_average_1min": load, "start_utc": start,
                      "cpu_s": (after.user - before.user) + (after.system - before.system), "build": times}, indent=1, default=str))


if __name__ == "__main__":
    main()
