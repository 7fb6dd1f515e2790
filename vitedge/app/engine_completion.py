"""`vitedge engine BUNDLE`: complete a planned TensorRT bundle on the device.

The application workflow around the backend's on-device build (vitedge.backends.tensorrt.bundle):
check the bundle, pick the family member for this device, build the engines, validate them
when labelled data is given, and write the bundle through the same report and manifest code
`vitedge build` uses (vitedge.app.reporting), so both write one bundle schema.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from types import ModuleType
from typing import Any

from vitedge.backends.tensorrt.backend import BoundTensorRtBackend, TensorRtBackend
from vitedge.backends.tensorrt.bundle import build_on_device
from vitedge.backends.tensorrt.camera_engine import build_graph_engine
from vitedge.backends.tensorrt.device import DeviceFacts, read_device_facts
from vitedge.backends.tensorrt.family import choose_member
from vitedge.backends.tensorrt.plan import (
    ENGINE,
    REFERENCE_ENGINE,
    TYPED_GRAPH,
    TensorRtOptions,
)
from vitedge.app.reporting import write_bundle_reports
from vitedge.datasources.sources import open_source
from vitedge.camera_apps.deepstream import BAKED_GRAPH as DEEPSTREAM_GRAPH
from vitedge.camera_apps.deepstream import CONFIG_FILE as DEEPSTREAM_CONFIG
from vitedge.camera_apps.deepstream import ENGINE_FILE as DEEPSTREAM_ENGINE
from vitedge.camera_apps.exports import CAMERA_DIR, write_bundle_exports
from vitedge.core.errors import BundleError, UsageError
from vitedge.files.atomic import atomic_output_dir
from vitedge.bundle.manifest import Manifest, verify_bundle
from vitedge.validation.bundle import ValidateOptions, validate_bundle
from vitedge.validation.report import VALIDATION_FILES

BUDGET_AT_BUILD = ("`vitedge engine` did not run the accuracy budget again: it ran at build time (`vitedge build`) "
                   "on the Q/DQ graph this engine was built from.")


@dataclass
class EngineResult:
    bundle: Path
    manifest: Manifest
    passed: bool | None  # None when no --val data was given


@dataclass(frozen=True)
class EngineRequest:
    """What `vitedge engine BUNDLE` was asked for."""

    bundle: Path
    val: Path | None = None
    force: bool = False
    measure_speed: bool = True
    profile_name: str | None = None  # a family bundle's member, when the device is not recognised


def complete_bundle(bundle: Path, *, val: Path | None = None, force: bool = False, measure_speed: bool = True,
                    log: Callable[[str], None] | None = None, trt: ModuleType | None = None, cudart: ModuleType | None = None,
                    facts: DeviceFacts | None = None, profile_name: str | None = None) -> EngineResult:
    """Build the bundle's engines on this device, validate them when ``val`` is given, and
    replace the bundle atomically with the completed one (manifest rewritten with hashes)."""
    request = EngineRequest(Path(bundle), val, force, measure_speed, profile_name)
    return _complete(request, log or (lambda _m: None), trt, cudart, facts)


def _complete(req: EngineRequest, say: Callable[[str], None], trt: ModuleType, cudart: ModuleType, facts: DeviceFacts | None) -> EngineResult:
    bundle = req.bundle
    manifest = verify_bundle(bundle)
    if manifest.target.backend != TensorRtBackend.name:
        raise UsageError(f"{bundle} is a {manifest.target.backend} bundle; `vitedge engine` builds TensorRT engines")
    if manifest.artifacts.built and not req.force:
        device = DeviceFacts.from_dict((manifest.backend_info or {}).get("device") or {})
        raise UsageError(f"{bundle} already holds an engine built on {device.describe()}; pass --force to rebuild it here")
    if trt is None:
        trt = _device_tensorrt()
    facts = facts if facts is not None else read_device_facts(trt, cudart)
    profile, family = choose_member(manifest.target, facts, req.profile_name, bundle)
    if family is not None:
        say(f"{family['name']} bundle: building with profile {family['selected']} ({family['why']})")
    try:
        options = TensorRtOptions(**(profile.get("backend_options") or {}))
    except TypeError as err:
        raise BundleError(f"{bundle}/manifest.json has backend options this vitedge does not know ({err})") from None
    batch_sizes = tuple(profile.get("batch_sizes") or (1,))

    passed = None
    with atomic_output_dir(bundle, force=True) as tmp:
        shutil.copytree(bundle, tmp, dirs_exist_ok=True)
        (tmp / "report.md").unlink(missing_ok=True)
        for name in VALIDATION_FILES:  # a previous validation was of another engine (or none)
            (tmp / "report" / name).unlink(missing_ok=True)
        info, extra = build_on_device(trt, tmp, options, batch_sizes, log=say, cudart=cudart, facts=facts,
                                      previous=manifest.backend_info)
        if TYPED_GRAPH not in extra:
            (tmp / TYPED_GRAPH).unlink(missing_ok=True)  # planned for another TensorRT than the one found here
        artifacts = manifest.artifacts
        artifacts.extra = [f for f in artifacts.extra or [] if (tmp / f).exists()]
        manifest.artifacts = artifacts.completed(ENGINE, REFERENCE_ENGINE, extra)
        manifest.backend_info = info
        if family is not None:  # the chosen member is the bundle's profile now; the family stays for rebuilds
            manifest.target = manifest.target.with_member(profile, family)
        manifest.validation = None
        manifest.toolchain = dict(manifest.toolchain, tensorrt=str(getattr(trt, "__version__", "?")))
        _build_deepstream_engine(tmp, manifest, trt, options, batch_sizes, say)
        checked = None
        if req.val is not None:
            checked = _validate(tmp, manifest, req, BoundTensorRtBackend(trt, cudart, facts), say)
            manifest.validation = checked.report.to_json()  # the manifest holds the JSON document
            passed = checked.passed

        write_bundle_exports(tmp, manifest, TensorRtBackend.facts)  # camera/triton/ now that the engine exists
        manifest.hash_files(tmp)
        write_bundle_reports(tmp, manifest, checked, budget_note=BUDGET_AT_BUILD)
        manifest.write(tmp)
    return EngineResult(bundle, manifest, passed)


def _build_deepstream_engine(tmp: Path, manifest: Manifest, trt: ModuleType, options: TensorRtOptions,
                             batch_sizes: tuple[int, ...], say: Callable[[str], None]) -> None:
    """The engine of the graph the bundle's nvinfer config runs, when that is not the bundle's own
    (normalisation baked in front, a Softmax behind) or when the bundle's own is version-compatible:
    built here with the same plan, so nvinfer loads an INT8 engine instead of building its own.
    nvinfer never allows engine host code (vitedge.camera_apps.nvinfer_rules), so it cannot load a
    version-compatible engine: DeepStream's is built without VERSION_COMPATIBLE, for this TensorRT only."""
    written = write_bundle_exports(tmp, manifest, TensorRtBackend.facts)  # camera/deepstream/ holds that graph now
    graph = f"{CAMERA_DIR}/deepstream/{DEEPSTREAM_GRAPH}"
    if f"{CAMERA_DIR}/deepstream/{DEEPSTREAM_CONFIG}" not in written:
        return
    if graph not in written:
        if not options.version_compatible:
            say(f"DeepStream: {CAMERA_DIR}/deepstream/{DEEPSTREAM_CONFIG} runs the bundle's graph and {ENGINE}")
            return
        graph = manifest.artifacts.qdq  # the bundle's own graph, its engine again without VERSION_COMPATIBLE
    ds_options = dataclasses.replace(options, version_compatible=False)
    ds = build_graph_engine(trt, tmp, graph, DEEPSTREAM_ENGINE, ds_options, batch_sizes, log=say)
    manifest.backend_info = dict(manifest.backend_info or {}, deepstream_engine=ds)
    manifest.artifacts = manifest.artifacts.with_extra({DEEPSTREAM_ENGINE})
    compat = (" It is not version-compatible (nvinfer cannot load such an engine): it loads with this TensorRT only."
              if options.version_compatible else "")
    say(f"DeepStream: {CAMERA_DIR}/deepstream/{DEEPSTREAM_CONFIG} points at {DEEPSTREAM_ENGINE} ({ds['precision']}; "
        f"TensorRT {ds['tensorrt']}).{compat} nvinfer builds its own from the config's onnx-file only if it cannot load "
        f"that engine (another TensorRT or GPU): INT8 then too, through the empty int8-calib-file the config names")


def _device_tensorrt() -> Any:
    env = TensorRtBackend().check_environment()
    if not env.can_build:
        raise BundleError(f"cannot build the TensorRT engine here: {env.detail}"
                          + (f"; {env.install_hint}" if env.install_hint else "") + "; the bundle is unchanged")
    import tensorrt

    return tensorrt


def _validate(tmp: Path, manifest: Manifest, req: EngineRequest, backend: BoundTensorRtBackend, say: Callable[[str], None]):
    """The engines against each other on the --val data: the validation `vitedge build` and `vitedge validate` run."""

    spec = manifest.spec
    source = open_source(req.val, spec.preprocess, class_names=spec.class_names)
    checked = validate_bundle(tmp, manifest, source, ValidateOptions(measure_speed=req.measure_speed, producer="vitedge engine",
                                                                     data_role="validation"),
                              log=SimpleNamespace(info=say), bundle_label=str(req.bundle), backend=backend)
    for row in checked.result.gate:
        say(("PASS " if row.passed else "FAIL ") + row.detail)
    return checked
