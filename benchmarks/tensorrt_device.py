"""Everything to run on a machine with an NVIDIA GPU, in one command:

    python benchmarks/tensorrt_device.py                    # the TensorRT installed here
    python benchmarks/tensorrt_device.py --versions 10.3 10.16 11.4   # each in its own venv from PyPI

For each TensorRT version it runs, with that version's real module:

* tests/backends/trt/test_tensorrt_gpu.py: the installed module against the API surface recorded from its
  wheel, one engine per plan vitedge makes (INT8, FP32 floats, version-compatible, DLA where the device has one),
  each inspected at the opt shape, and Triton loading the plan (where ``tritonserver`` is on PATH);
* tests/backends/trt/test_tensorrt_bundle.py::test_real_engine_builds_runs_and_validates: `vitedge build` of the
  bundled example for desktop-gpu, engine built, run and validated against its FP32 reference engine.

Other versions are installed with ``pip install tensorrt-cu12==X`` (``tensorrt==8.6.1`` for 8.6) into a
venv under the temp folder that sees this environment's packages (--system-site-packages); the exact
builds are those recorded in tools/trt_surface.py. The outcome per version goes to
benchmarks/results/tensorrt_device.json, written only when something ran.

Without an NVIDIA GPU (this repository's CI), it prints why and exits 0 having run and written nothing:
no file here reports an engine build or a timing that did not happen.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "tensorrt_device.json"
TESTS = ["tests/backends/trt/test_tensorrt_gpu.py",
         "tests/backends/trt/test_tensorrt_bundle.py::test_real_engine_builds_runs_and_validates"]


def _supported() -> dict[str, tuple[str, str]]:
    spec = importlib.util.spec_from_file_location("trt_surface_tool", ROOT / "tools" / "trt_surface.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.SUPPORTED


def gpu_status() -> tuple[bool, str]:
    """(a GPU is usable, what was seen) without importing TensorRT or CUDA here."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        if Path("/etc/nv_tegra_release").is_file():  # a Jetson has no nvidia-smi before JetPack 7
            return True, "Jetson (/etc/nv_tegra_release)"
        return False, "no nvidia-smi and not a Jetson"
    proc = subprocess.run([smi, "-L"], capture_output=True, text=True)
    gpus = [line for line in proc.stdout.splitlines() if line.startswith("GPU ")]
    return (bool(gpus), gpus[0] if gpus else f"nvidia-smi lists no GPU ({proc.stderr.strip()[:120]})")


def installed_tensorrt(python: str) -> str | None:
    proc = subprocess.run([python, "-c", "import tensorrt; print(tensorrt.__version__)"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else None


def interpreter_for(minor: str, work: Path) -> str:
    """This interpreter if it has TensorRT ``minor``, else a venv with that version from PyPI."""
    have = installed_tensorrt(sys.executable)
    if have and ".".join(have.split(".")[:2]) == minor:
        return sys.executable
    dist, version = _supported()[minor]
    package = "tensorrt" if dist == "tensorrt-bindings" else dist.replace("-bindings", "")
    version = version.split(".post")[0]  # the meta package has no .postN rebuilds of the bindings
    venv = work / f"trt-{minor}"
    python = str(venv / "bin" / "python")
    if not Path(python).exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    if installed_tensorrt(python) != version:
        subprocess.run([python, "-m", "pip", "install", "-q", f"{package}=={version}"], check=True)
    return python


def run_tests(python: str, junit: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "tensorrt", "-rs",
                           f"--junitxml={junit}", *TESTS], cwd=ROOT, env=env, capture_output=True, text=True)
    tail = proc.stdout.strip().splitlines()[-15:]
    return {"exit_code": proc.returncode, "seconds": round(time.perf_counter() - t0, 1), "summary": tail}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="TensorRT engine builds, inspection and Triton load on this GPU machine")
    ap.add_argument("--versions", nargs="*", default=None,
                    help="TensorRT minors to test (each from PyPI in its own venv); default: the one installed here")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "vitedge-tensorrt-device")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    ok, seen = gpu_status()
    if not ok:
        print(f"skipped: no NVIDIA GPU here ({seen}); nothing was built, run or written")
        return 0
    versions = args.versions
    if not versions:
        have = installed_tensorrt(sys.executable)
        if have is None:
            print("error: TensorRT is not installed here; install it (pip install 'vitedge[tensorrt]' "
                  "--extra-index-url https://pypi.nvidia.com) or pass --versions 10.3 11.4 ...", file=sys.stderr)
            return 2
        versions = [".".join(have.split(".")[:2])]
    unknown = [v for v in versions if v not in _supported()]
    if unknown:
        print(f"error: no recorded TensorRT {', '.join(unknown)}; known: {', '.join(_supported())}", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    record = {"gpu": seen, "versions": {}}
    for minor in versions:
        print(f"TensorRT {minor}: preparing ...", flush=True)
        python = interpreter_for(minor, args.work)
        result = run_tests(python, args.work / f"junit-{minor}.xml")
        result["tensorrt"] = installed_tensorrt(python)
        record["versions"][minor] = result
        print(f"TensorRT {result['tensorrt']}: exit {result['exit_code']} in {result['seconds']} s: {result['summary'][-1:]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"wrote {args.out}")
    return 0 if all(r["exit_code"] == 0 for r in record["versions"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
