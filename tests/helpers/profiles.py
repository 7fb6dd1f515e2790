"""Target profiles written for one test from the shipped ones."""

from __future__ import annotations

from pathlib import Path

TARGETS = Path(__file__).resolve().parents[2] / "targets"


def untimed_onnx_profile(folder: Path) -> Path:
    """targets/onnx.toml without the build's INT8-vs-FP32 timing (``int8_payoff = false``): on a tiny graph that timing
    may ship the whole model float, and a test that reads the calibrated INT8 graph needs it to stay INT8."""
    shipped = (TARGETS / "onnx.toml").read_text()
    assert "[backend_options]\n" in shipped
    profile = folder / "onnx-untimed.toml"
    profile.write_text(shipped.replace("[backend_options]\n", "[backend_options]\nint8_payoff = false\n", 1))
    return profile
