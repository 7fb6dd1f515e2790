"""The one entry of the TensorRT backend for completing a planned bundle on the device.

`vitedge engine BUNDLE` (vitedge.app.engine_completion) runs the bundle workflow: check the
bundle, write it atomically, validate, write reports and the manifest. What it needs of TensorRT
is here: TensorRT found on this device (``open_device_build``: the library, the device's facts,
the family member and the plan's options), the engines built from the bundle's graphs
(``DeviceBuild.build``, ``DeviceBuild.build_graph_engine``), the Backend that runs them
(``DeviceBuild.backend``), and the facts and file names a bundle of this backend has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from vitedge.backends.tensorrt.backend import BoundTensorRtBackend, TensorRtBackend
from vitedge.backends.tensorrt.bundle import build_on_device
from vitedge.backends.tensorrt.camera_engine import build_graph_engine
from vitedge.backends.tensorrt.device import DeviceFacts, read_device_facts
from vitedge.backends.tensorrt.family import choose_member
from vitedge.backends.tensorrt.plan import ENGINE, REFERENCE_ENGINE, TYPED_GRAPH, TensorRtOptions
from vitedge.core.errors import BundleError

if TYPE_CHECKING:
    from vitedge.bundle.sections import TargetSection

__all__ = ["BACKEND", "ENGINE", "FACTS", "REFERENCE_ENGINE", "TYPED_GRAPH", "DeviceBuild", "DeviceFacts", "built_on",
           "open_device_build"]

BACKEND = TensorRtBackend.name  # what manifest.target.backend says for a bundle of this backend
FACTS = TensorRtBackend.facts


def built_on(backend_info: dict[str, Any] | None) -> str:
    """The device a bundle's engine was built on, in words, from its manifest's backend_info."""
    return DeviceFacts.from_dict((backend_info or {}).get("device") or {}).describe()


@dataclass(frozen=True)
class DeviceBuild:
    """TensorRT on this device and the bundle member it builds."""

    trt: ModuleType
    cudart: ModuleType | None
    facts: DeviceFacts
    profile: dict[str, Any]  # the profile built with (a family bundle: the chosen member's)
    family: dict[str, Any] | None  # the target.family record to write, for a family bundle
    options: TensorRtOptions
    batch_sizes: tuple[int, ...]

    @property
    def tensorrt_version(self) -> str:
        return str(getattr(self.trt, "__version__", "?"))

    def build(self, folder: Path, *, log: Callable[[str], None], previous: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
        """The INT8 and FP32-reference engines built into ``folder``: (backend_info, extra files)."""
        return build_on_device(self.trt, folder, self.options, self.batch_sizes, log=log, cudart=self.cudart, facts=self.facts,
                               previous=previous)

    def build_graph_engine(self, folder: Path, graph: str, engine: str, *, log: Callable[[str], None],
                           version_compatible: bool) -> dict[str, Any]:
        """``engine`` built from ``graph`` (both inside ``folder``) with the bundle's plan; what the manifest records."""
        options = dataclasses.replace(self.options, version_compatible=version_compatible)
        return build_graph_engine(self.trt, folder, graph, engine, options, self.batch_sizes, log=log)

    def backend(self) -> BoundTensorRtBackend:
        """The Backend that runs the engines built here (validation)."""
        return BoundTensorRtBackend(self.trt, self.cudart, self.facts)


def open_device_build(target: TargetSection, bundle: Path, *, profile_name: str | None, log: Callable[[str], None],
                      trt: ModuleType | None = None, cudart: ModuleType | None = None,
                      facts: DeviceFacts | None = None) -> DeviceBuild:
    """TensorRT here (``trt``, ``cudart`` and ``facts`` given by a test, or found), the member of a family bundle
    this device builds (``profile_name`` when the device is not recognised) and its options."""
    if trt is None:
        trt = _device_tensorrt()
    facts = facts if facts is not None else read_device_facts(trt, cudart)
    profile, family = choose_member(target, facts, profile_name, bundle)
    if family is not None:
        log(f"{family['name']} bundle: building with profile {family['selected']} ({family['why']})")
    try:
        options = TensorRtOptions(**(profile.get("backend_options") or {}))
    except TypeError as err:
        raise BundleError(f"{bundle}/manifest.json has backend options this vitedge does not know ({err})") from None
    batch_sizes = tuple(profile.get("batch_sizes") or (1,))
    return DeviceBuild(trt, cudart, facts, profile, family, options, batch_sizes)


def _device_tensorrt() -> Any:
    env = TensorRtBackend().check_environment()
    if not env.can_build:
        raise BundleError(f"cannot build the TensorRT engine here: {env.detail}"
                          + (f"; {env.install_hint}" if env.install_hint else "") + "; the bundle is unchanged")
    import tensorrt

    return tensorrt
