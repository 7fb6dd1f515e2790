"""The runtime-only distribution (packaging/runtime): it holds every module the runtime
imports, none of those imports torch/onnx/click/rich, and it installs and runs a real
bundle in a fresh venv with nothing but numpy, Pillow and ONNX Runtime."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import tomllib
from conftest import REPO, VAL_DIR
from helpers.runtime_bundles import HEAVY

RUNTIME_PYPROJECT = REPO / "packaging" / "runtime" / "pyproject.toml"


def packaged_modules() -> set[str]:
    """Module names the vitedge-runtime wheel contains, from its pyproject."""
    cfg = tomllib.loads(RUNTIME_PYPROJECT.read_text())["tool"]["setuptools"]
    names = {"vitedge"} | set(cfg["py-modules"])
    # setuptools ships a listed module's package __init__ with it (build_py adds it for every py-module's package)
    names |= {m.rsplit(".", 1)[0] for m in cfg["py-modules"] if m.count(".") > 1}
    for package in cfg["packages"]:
        folder = REPO.joinpath(*package.split("."))
        names.add(package)
        names |= {f"{package}.{p.stem}" for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__")}
    return names


def _run(code: str, python: str = sys.executable, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600, **kw)


def test_every_module_the_runtime_imports_is_packaged(runtime_bundles):  # noqa: F811
    paths = [str(p) for kind in ("plain", "baked") for p in runtime_bundles[kind].values()]
    code = (
        "import json, sys, numpy as np\nfrom vitedge.runtime import load\n"
        f"for p in {paths!r}:\n"
        "    load(p).predict(np.zeros((40, 30, 3), np.uint8))\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'vitedge' or m.startswith('vitedge.'))))\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    used = set(json.loads(out.stdout.splitlines()[-1]))
    missing = used - packaged_modules()
    assert not missing, f"add to packaging/runtime/pyproject.toml: {sorted(missing)}"


def test_no_packaged_module_imports_build_tools_at_top_level():
    modules = sorted(packaged_modules())
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))\n"
    )
    out = _run(code)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == []


@pytest.mark.slow
def test_runtime_wheel_runs_a_bundle_in_a_venv_with_only_numpy_pillow_onnxruntime(runtime_bundles, tmp_path):  # noqa: F811
    # The source tree as a fresh checkout has it, so the build leaves nothing in the repo.
    src = tmp_path / "src"
    shutil.copytree(REPO / "vitedge", src / "vitedge", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (src / "packaging" / "runtime").mkdir(parents=True)
    shutil.copy(RUNTIME_PYPROJECT, src / "packaging" / "runtime" / "pyproject.toml")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    def pip(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([python, "-m", "pip", "install", "-q", *args], capture_output=True, text=True, env=env, timeout=900)

    deps = pip("numpy", "pillow", "onnxruntime")
    if deps.returncode != 0:
        tail = (deps.stderr or deps.stdout).strip().splitlines()[-1:] or ["?"]
        pytest.skip(f"pip cannot install numpy/pillow/onnxruntime here (no package index?): {tail[0][:200]}")
    wheel = pip(str(src / "packaging" / "runtime"))
    assert wheel.returncode == 0, wheel.stderr[-3000:]

    listed = subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True, env=env, check=True)
    dists = {d["name"].lower() for d in json.loads(listed.stdout)}
    assert "vitedge-runtime" in dists
    assert not dists & {"torch", "onnx", "click", "rich", "nncf", "timm", "openvino", "vitedge"}, sorted(dists)

    bundles = {kind: str(runtime_bundles[kind]["onnx"]) for kind in ("plain", "baked")}
    code = f"""
import importlib.util, json, sys
from pathlib import Path
import numpy as np
from PIL import Image
import vitedge
from vitedge.runtime import load
files = sorted(Path({str(VAL_DIR)!r}).glob("*/*.png"))
frames = [np.asarray(Image.open(f).convert("RGB")) for f in files]
labels = np.array([int(f.parent.name) for f in files])
out = {{"vitedge_file": vitedge.__file__, "torch_installed": importlib.util.find_spec("torch") is not None}}
for kind, path in {bundles!r}.items():
    with load(path) as model:
        preds = model.predict([f[..., ::-1].copy() for f in frames], color="bgr")
        out[kind] = {{"top1": float(np.mean(preds.top1 == labels)),
                     "expected": model.manifest.validation["accuracy"]["int8_top1"], "first": preds[0].label}}
out["heavy"] = [m for m in {list(HEAVY)!r} if m in sys.modules]
print(json.dumps(out))
"""
    run = _run(code, python, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.splitlines()[-1])
    assert str(venv) in result["vitedge_file"], result  # the wheel's copy, not the checkout
    assert result["torch_installed"] is False and result["heavy"] == []
    for kind in ("plain", "baked"):
        assert result[kind]["top1"] == pytest.approx(result[kind]["expected"], abs=1e-12), result
