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

Then, per TensorRT version, the models (``--models``; default ViT-B/16 and the first two corpus models of
benchmarks/corpus/manifest.toml), each through ``vitedge build --target nvidia-gpu`` (``jetson`` on a Jetson)
with the engine built there, and per model:

* the engine's INT8 layer count (of all layers) and, per attention block, whether MHA fused, from the engine
  inspector the build recorded;
* latency at batch 1 of the INT8 engine against an FP16 engine of the FP32 graph built here (TensorRT 11 has
  no weakly typed FP16 flag: the row says so), and the INT8 engine's agreement with its FP32 reference engine
  on the validation images (the build's own validation);
* nvinfer-equivalent preprocessing of a 1280x720 camera frame (the bundle's config_infer.txt: src-crop, aspect-
  preserving scale, net-scale-factor/offsets, tests/helpers/nvinfer_sim.py) through the DeepStream engine,
  against ``vitedge.runtime`` on the same frame;
* a check against what the bundle promised: the validation gate passed, every attention block the plan
  said may fuse (Q/DQ in all three places, allowed head size and tokens) fused, the DeepStream engine's top-1
  is the runtime's where the runtime's top two are more than 0.12 apart. Any mismatch makes the exit code 1.

ViT-B/16 needs ImageNet-style folders (``--imagenet DIR`` with ``calib/`` and ``val/``) and its timm weights
(``--vit-b16 FILE``, else timm's pretrained download); the corpus models need the corpus cache
(benchmarks/corpus/fetch.md). A model whose inputs are missing is a row saying what to bring, and the run
exits 1 as incomplete.

This script has never run on a device: no GPU was available where it was written, and its device part
(everything after the GPU check) is untested. No result file in this repository comes from it.

Without an NVIDIA GPU (this repository's CI), it prints why and exits 0 having run and written nothing:
no file here reports an engine build or a timing that did not happen. A command line it could not carry out
(a TensorRT version with no recorded surface, a missing --imagenet or --vit-b16) is a one-line error and exit 2,
GPU or not. What runs without a GPU (the command line, the default models, what a missing input asks for, the
check of an engine's records against the bundle's promises) is tested in
tests/backends/trt/test_tensorrt_device_script.py.
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


NEVER_RUN = "this device run has never been run on a device before; check its numbers by hand the first time"


def run_models(python: str, args: argparse.Namespace, out: Path) -> dict:
    """The model stage of this script in ``python`` (which holds the TensorRT version under test)."""
    cmd = [python, str(Path(__file__).resolve()), "--stage", "models", "--stage-out", str(out), "--work", str(args.work),
           "--models", *args.models]
    cmd += ["--imagenet", str(args.imagenet)] if args.imagenet else []
    cmd += ["--vit-b16", str(args.vit_b16)] if args.vit_b16 else []
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True)
    return json.loads(out.read_text()) if out.is_file() else {"error": f"the model stage exited {proc.returncode} and wrote nothing"}


def run_tests(python: str, junit: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "tensorrt", "-rs",
                           f"--junitxml={junit}", *TESTS], cwd=ROOT, env=env, capture_output=True, text=True)
    tail = proc.stdout.strip().splitlines()[-15:]
    return {"exit_code": proc.returncode, "seconds": round(time.perf_counter() - t0, 1), "summary": tail}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="TensorRT engine builds, inspection and Triton load on this GPU machine")
    ap.add_argument("--versions", nargs="*", default=None,
                    help="TensorRT minors to test (each from PyPI in its own venv); default: the one installed here")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "vitedge-tensorrt-device")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--models", nargs="*", default=[],
                    help="models to build (default: vit_base_patch16_224 and the first two corpus models)")
    ap.add_argument("--imagenet", type=Path, help="ImageNet-style folder with calib/ and val/ (for ViT-B/16)")
    ap.add_argument("--vit-b16", type=Path, help="timm vit_base_patch16_224 state_dict (else timm's pretrained download)")
    ap.add_argument("--no-models", action="store_true", help="only the tests, no model builds")
    ap.add_argument("--stage", choices=["models"], help=argparse.SUPPRESS)  # run inside the interpreter under test
    ap.add_argument("--stage-out", type=Path, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def input_errors(args: argparse.Namespace) -> list[str]:
    """What is wrong with the command line, found before anything is installed or built (and without a GPU)."""
    errors = []
    unknown = [v for v in args.versions or [] if v not in _supported()]
    if unknown:
        errors.append(f"no recorded TensorRT {', '.join(unknown)}; known: {', '.join(_supported())}")
    for flag, path in (("--imagenet", args.imagenet), ("--vit-b16", args.vit_b16)):
        if path is not None and not path.exists():
            errors.append(f"{flag} {path}: no such file or folder")
    if args.imagenet is not None and args.imagenet.is_dir():
        errors += [f"--imagenet {args.imagenet}: no {sub}/ folder in it" for sub in ("calib", "val") if not (args.imagenet / sub).is_dir()]
    return errors


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.stage == "models":
        from tensorrt_device_models import stage

        return stage(args)
    errors = input_errors(args)
    if errors:
        print(f"error: {errors[0]}", file=sys.stderr)
        return 2
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
        versions = [".".join(have.split(".")[:2])]  # the major present here; --versions adds the others
        if versions[0] not in _supported():
            print(f"error: TensorRT {have} is installed here and no surface of it is recorded; known: {', '.join(_supported())}",
                  file=sys.stderr)
            return 2
    args.work.mkdir(parents=True, exist_ok=True)
    print(NEVER_RUN)
    record = {"gpu": seen, "versions": {}, "note": NEVER_RUN}
    for minor in versions:
        print(f"TensorRT {minor}: preparing ...", flush=True)
        python = interpreter_for(minor, args.work)
        result = run_tests(python, args.work / f"junit-{minor}.xml")
        result["tensorrt"] = installed_tensorrt(python)
        if not args.no_models:
            result["models"] = run_models(python, args, args.work / f"models-{minor}.json")
            bad = not isinstance(result["models"], list) or any(r["mismatches"] or r["missing"] for r in result["models"])
            result["exit_code"] = result["exit_code"] or int(bad)
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
