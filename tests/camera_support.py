"""Builds the example bundles the family and camera-app tests share (see conftest.example_bundles)."""

from __future__ import annotations

import pytest
from conftest import CALIB_DIR, EXAMPLES


def skip_without_example_bundles() -> None:
    """Skips the test where the example bundles cannot be built as these tests need them."""
    if not ((EXAMPLES / "digits_vit.pt").is_file() and CALIB_DIR.is_dir()):
        pytest.skip("the bundled example is not in this checkout")
    try:
        import tensorrt  # noqa: F401

        pytest.skip("TensorRT is installed here: these tests use the GPU-less jetson bundle")
    except ImportError:
        pass


def build_example_bundles(out):
    from helpers.cli import run_vitedge

    example = EXAMPLES / "digits_vit.pt"
    skip_without_example_bundles()
    code, text = run_vitedge(["build", str(example), "--target", "onnx", "--target", "intel-cpu", "--target", "jetson",
                       "--calib", str(CALIB_DIR), "-o", str(out), "--no-latency", "--min-agreement", "0.9",
                       "--max-top1-drop", "5"])
    assert code == 0, text
    return out, text
