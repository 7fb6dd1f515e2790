"""The ViT-B/16 cold and warm build of an older vitedge, for `build_speed.py --build-only --baseline FILE`.

Issue 19 item 4 asks for a cold build at <= 0.5x of "today's" build. To quote that ratio on the CPU at
hand (not against a figure measured on another machine), run the code of that day on this CPU:

    git worktree add --detach /tmp/vitedge-22e595c 22e595c
    PYTHONPATH=/tmp/vitedge-22e595c python benchmarks/baseline_build.py /tmp/vitedge-22e595c \\
        > benchmarks/results/build_wall_baseline_<isa>.json

It imports ``build_vitb`` from that checkout's own benchmarks/build_speed.py (same model, seed, targets,
calibration images and settings as today's script) and prints its per-stage times as JSON, with the
commit, the CPU and the load average. Run it on a quiet machine right before or after
`build_speed.py --build-only`, and read only the ratio between the two.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: baseline_build.py CHECKOUT [CALIB_SIZE]  (CHECKOUT: a worktree of the older commit, also on PYTHONPATH)")
    checkout = Path(sys.argv[1]).resolve()
    calib = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    sys.path[:0] = [str(checkout), str(checkout / "benchmarks")]
    import build_speed  # the checkout's own script
    import vitedge

    if Path(vitedge.__file__).resolve().parents[1] != checkout:
        sys.exit(f"vitedge was imported from {vitedge.__file__}, not from {checkout}: put the checkout first on PYTHONPATH")
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    # /proc/cpuinfo read here, not vitedge.cpu: the vitedge imported is the older checkout's, which may lack it
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    load = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="vitedge-baseline-") as tmp:
        _, _, times = build_speed.build_vitb(Path(tmp), calib)
    load.append(os.getloadavg()[0])
    isa = [f for f in ("avx512_vnni", "avx_vnni", "amx_int8", "avx512f", "avx2") if f in flags]
    print(json.dumps({"commit": commit, "calib_size": calib, "cpu_isa_flags": isa, "load_average_1min": load,
                      "build": times}, indent=1, default=str))


if __name__ == "__main__":
    main()
