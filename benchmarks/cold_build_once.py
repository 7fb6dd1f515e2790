"""One cold ViT-B/16 build with the vitedge of a given checkout, for alternating old and new code (issue 28 item 4).

`baseline_build.py` runs an older commit's cold and warm builds (about 26 minutes on 2 AVX2 cores) and
`build_speed.py --build-only` this checkout's cold, warm and anchor rows after it. On a shared machine the
speed drifts by 20 % between such half-hour windows, so a ratio of two runs half an hour apart can carry
the drift. This script runs only the cold row (the same `build_vitb` of the checkout's own
build_speed.py: random-weight ViT-B/16, onnx + intel-cpu, 256 calibration images, 397 validation images),
so old and new builds can alternate (new, old, old, new, ...) and the drift is seen::

    git worktree add --detach /tmp/vitedge-2223f9a 2223f9a
    PYTHONPATH=$PWD python benchmarks/cold_build_once.py $PWD > main_1.json
    PYTHONPATH=/tmp/vitedge-2223f9a python benchmarks/cold_build_once.py /tmp/vitedge-2223f9a > base_1.json

Prints JSON: the commit, the start time, the load average before and after, the process's CPU seconds
(user + system: ONNX Runtime's and OpenVINO's threads run in this process) and the stage times.
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
    if len(sys.argv) != 2:
        sys.exit("usage: cold_build_once.py CHECKOUT  (CHECKOUT also first on PYTHONPATH)")
    checkout = Path(sys.argv[1]).resolve()
    sys.path[:0] = [str(checkout), str(checkout / "benchmarks")]
    import build_speed  # the checkout's own script
    import vitedge

    if Path(vitedge.__file__).resolve().parents[1] != checkout:
        sys.exit(f"vitedge was imported from {vitedge.__file__}, not from {checkout}: put the checkout first on PYTHONPATH")
    commit = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    load = [os.getloadavg()[0]]
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    before = os.times()
    with tempfile.TemporaryDirectory(prefix="vitedge-cold-once-") as tmp:
        _, _, times = build_speed.build_vitb(Path(tmp), 256, {"cold cache": {}})
    after = os.times()
    load.append(os.getloadavg()[0])
    cpu_s = (after.user - before.user) + (after.system - before.system)
    print(json.dumps({"commit": commit, "start_utc": start, "load": load, "cpu_s": cpu_s, "build": times}, indent=1, default=str))


if __name__ == "__main__":
    main()
