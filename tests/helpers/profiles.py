"""Target profiles written for one test from the shipped ones."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

TARGETS = Path(__file__).resolve().parents[2] / "targets"

# the shipped profiles whose [backend_options] take ``int8_payoff`` (the CPU targets that time INT8 against FP32)
TIMED_TARGETS = ("onnx", "intel-cpu", "intel-cpu-vnni")


def _untimed(shipped: Path, dst: Path) -> Path:
    text = shipped.read_text()
    assert "[backend_options]\n" in text and "int8_payoff" not in text, shipped
    dst.write_text(text.replace("[backend_options]\n", "[backend_options]\nint8_payoff = false\n", 1))
    return dst


def untimed_onnx_profile(folder: Path) -> Path:
    """targets/onnx.toml without the build's INT8-vs-FP32 timing (``int8_payoff = false``): on a tiny graph that timing
    may ship the whole model float, and a test that reads the calibrated INT8 graph needs it to stay INT8."""
    return _untimed(TARGETS / "onnx.toml", folder / "onnx-untimed.toml")


def write_untimed_targets(folder: Path) -> Path:
    """``folder`` holding onnx.toml, intel-cpu.toml and intel-cpu-vnni.toml as shipped but with ``int8_payoff = false``:
    on VITEDGE_TARGETS_PATH they hide the shipped ones of the same name (vitedge.core.paths), so a build by target
    name, in this process or a child, skips the INT8-vs-FP32 timing and nothing else changes."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in TIMED_TARGETS:
        _untimed(TARGETS / f"{name}.toml", folder / f"{name}.toml")
    return folder


def untimed_targets_env(folder: Path) -> dict[str, str]:
    """The environment variable that puts ``folder`` (``write_untimed_targets``) first on VITEDGE_TARGETS_PATH."""
    rest = os.environ.get("VITEDGE_TARGETS_PATH", "")
    return {"VITEDGE_TARGETS_PATH": os.pathsep.join(p for p in (str(folder), rest) if p)}


@contextlib.contextmanager
def untimed_targets(folder: Path) -> Iterator[None]:
    """Builds by target name inside this block (and in children started here) do not time INT8 against FP32."""
    import pytest

    with pytest.MonkeyPatch.context() as mp:
        for key, value in untimed_targets_env(folder).items():
            mp.setenv(key, value)
        yield
