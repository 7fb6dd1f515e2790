"""The bundles vitedge.runtime is tested on (tests/conftest.py: runtime_bundles) and the modules
its light import must not load."""

from __future__ import annotations

from pathlib import Path

TARGETS = ("onnx", "intel-cpu")
KINDS = ("plain", "baked")  # plain: float NCHW input; baked: uint8 NHWC frames, preprocessing in the graph
HEAVY = ("torch", "onnx", "click", "rich", "nncf", "timm", "torchvision", "transformers")


def build_runtime_bundles(root: Path, model: Path, calib: Path, val: Path) -> None:
    from vitedge.app.build import BuildRequest, run_build
    from vitedge.core.ui import StageLog

    for kind in KINDS:
        req = BuildRequest(model=model, targets=TARGETS, calib=calib, val=val,
                           out=root / kind, force=True, bake_preprocess=kind == "baked", measure_speed=False)
        run_build(req, StageLog(quiet=True))  # a missed parity gate still writes a usable bundle
