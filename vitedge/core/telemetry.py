"""Every library vitedge loads keeps its usage reporting off in vitedge's processes, unless the user opts in.

vitedge sends nothing itself. Some of the libraries it loads report on their own:

- ONNX Runtime (1.2x and later on Linux) writes a device id and queues events under
  ``~/.cache/Microsoft/DeveloperTools/.onnxruntime/`` from the moment it is imported, unless
  ``ORT_DISABLE_TELEMETRY=1`` is set before the import; after it, ``disable_telemetry_events()``
  turns its event sink off;
- OpenVINO's converter (ovc) and NNCF send events to Google Analytics through the
  ``openvino_telemetry`` package: its import is made to fail, so both use their own no-op stubs;
- Ray's cluster sends usage statistics unless ``RAY_USAGE_STATS_ENABLED=0`` is set before the cluster
  starts (workers of a local cluster inherit the setting);
- Hugging Face Hub (read by transformers and timm) reports on downloads unless
  ``HF_HUB_DISABLE_TELEMETRY=1`` is set before it is imported.

matplotlib, torch, timm, onnx and numpy send nothing. :func:`silence` does all of it, once per process;
it runs when the CLI starts, when ``vitedge.runtime.load`` opens a bundle, and at each place vitedge
imports one of those libraries. ``VITEDGE_ALLOW_VENDOR_TELEMETRY=1`` leaves every library as it
configures itself. docs/reliability.md ("Nothing leaves the machine") lists the same.
"""

from __future__ import annotations

import os
import sys

ALLOW_TELEMETRY_ENV = "VITEDGE_ALLOW_VENDOR_TELEMETRY"

# environment variable -> the value that turns a library's reporting off; read by the library when it is
# imported (ONNX Runtime, Hugging Face Hub) or when it starts its cluster (Ray)
OFF_SWITCHES = {
    "ORT_DISABLE_TELEMETRY": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}

# the packages whose import is blocked (they report through it; their users fall back to no-op stubs)
BLOCKED_MODULES = ("openvino_telemetry",)


def allowed() -> bool:
    """True when the user opted in (VITEDGE_ALLOW_VENDOR_TELEMETRY=1): every library is left as it is."""
    return os.environ.get(ALLOW_TELEMETRY_ENV, "").strip().lower() in ("1", "true", "yes")


def silence() -> bool:
    """Turn every library's reporting off in this process (idempotent, cheap). False when the user opted in."""
    if allowed():
        return False
    os.environ.update(OFF_SWITCHES)
    block_openvino_telemetry()
    ort = sys.modules.get("onnxruntime")
    if ort is not None:  # imported already (by vitedge or before it): switch its event sink off
        _disable_ort_events(ort)
    return True


def block_openvino_telemetry() -> bool:
    """Make `import openvino_telemetry` fail in this process, so ovc and NNCF use their no-op stubs.
    True when blocked; False when the user opted in or it was already imported by someone else before
    vitedge (then it is left as it is)."""
    if allowed():
        return False
    for name in BLOCKED_MODULES:
        if sys.modules.get(name, None) is not None:
            return False
        sys.modules[name] = None  # type: ignore[assignment]  # the documented way to block an import
    return True


def _disable_ort_events(ort: object) -> None:
    disable = getattr(ort, "disable_telemetry_events", None)
    if callable(disable):
        try:
            disable()
        except Exception:  # noqa: BLE001 - a build without a telemetry provider: nothing to switch off
            pass


def onnxruntime():
    """``import onnxruntime``, with its telemetry off unless the user opted in (ImportError when missing)."""
    silence()
    import onnxruntime as ort

    if not allowed():
        _disable_ort_events(ort)
    return ort
