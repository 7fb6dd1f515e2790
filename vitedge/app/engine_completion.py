"""`vitedge engine BUNDLE`: complete a planned TensorRT bundle on the device.

The application workflow around the backend's on-device build (vitedge.backends.tensorrt.completion,
the one entry of the backend it uses):
check the bundle, pick the family member for this device, build the engines, validate them
when labelled data is given, and write the bundle through the same report and manifest code
`vitedge build` uses (vitedge.app.reporting), so both write one bundle schema.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace

from vitedge.backends.tensorrt.completion import (
    BACKEND,
    ENGINE,
    FACTS,
    REFERENCE_ENGINE,
    TYPED_GRAPH,
    DeviceBuild,
    DeviceFacts,
    built_on,
    open_device_build,
)
from vitedge.app.reporting import write_bundle_reports
from vitedge.datasources.sources import open_source
from vitedge.camera_apps.deepstream import BAKED_GRAPH as DEEPSTREAM_GRAPH
from vitedge.camera_apps.deepstream import CONFIG_FILE as DEEPSTREAM_CONFIG
from vitedge.camera_apps.deepstream import ENGINE_FILE as DEEPSTREAM_ENGINE
from vitedge.camera_apps.exports import CAMERA_DIR, write_bundle_exports
from vitedge.core.errors import UsageError
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


def _complete(req: EngineRequest, say: Callable[[str], None], trt: ModuleType | None, cudart: ModuleType | None,
              facts: DeviceFacts | None) -> EngineResult:
    bundle = req.bundle
    manifest = verify_bundle(bundle)
    if manifest.target.backend != BACKEND:
        raise UsageError(f"{bundle} is a {manifest.target.backend} bundle; `vitedge engine` builds TensorRT engines")
    if manifest.artifacts.built and not req.force:
        raise UsageError(f"{bundle} already holds an engine built on {built_on(manifest.backend_info)}; pass --force to rebuild it here")
    device = open_device_build(manifest.target, bundle, profile_name=req.profile_name, log=say, trt=trt, cudart=cudart, facts=facts)

    passed = None
    with atomic_output_dir(bundle, force=True) as tmp:
        shutil.copytree(bundle, tmp, dirs_exist_ok=True)
        (tmp / "report.md").unlink(missing_ok=True)
        for name in VALIDATION_FILES:  # a previous validation was of another engine (or none)
            (tmp / "report" / name).unlink(missing_ok=True)
        info, extra = device.build(tmp, log=say, previous=manifest.backend_info)
        if TYPED_GRAPH not in extra:
            (tmp / TYPED_GRAPH).unlink(missing_ok=True)  # planned for another TensorRT than the one found here
        artifacts = manifest.artifacts
        artifacts.extra = [f for f in artifacts.extra or [] if (tmp / f).exists()]
        manifest.artifacts = artifacts.completed(ENGINE, REFERENCE_ENGINE, extra)
        manifest.backend_info = info
        if device.family is not None:  # the chosen member is the bundle's profile now; the family stays for rebuilds
            manifest.target = manifest.target.with_member(device.profile, device.family)
        manifest.validation = None
        manifest.toolchain = dict(manifest.toolchain, tensorrt=device.tensorrt_version)
        _build_deepstream_engine(tmp, manifest, device, say)
        checked = None
        if req.val is not None:
            checked = _validate(tmp, manifest, req, device, say)
            manifest.validation = checked.report.to_json()  # the manifest holds the JSON document
            passed = checked.passed

        write_bundle_exports(tmp, manifest, FACTS)  # camera/triton/ now that the engine exists
        manifest.hash_files(tmp)
        write_bundle_reports(tmp, manifest, checked, budget_note=BUDGET_AT_BUILD)
        manifest.write(tmp)
    return EngineResult(bundle, manifest, passed)


def _build_deepstream_engine(tmp: Path, manifest: Manifest, device: DeviceBuild, say: Callable[[str], None]) -> None:
    """The engine of the graph the bundle's nvinfer config runs, when that is not the bundle's own
    (normalisation baked in front, a Softmax behind) or when the bundle's own is version-compatible:
    built here with the same plan, so nvinfer loads an INT8 engine instead of building its own.
    nvinfer never allows engine host code (vitedge.camera_apps.nvinfer_rules), so it cannot load a
    version-compatible engine: DeepStream's is built without VERSION_COMPATIBLE, for this TensorRT only."""
    written = write_bundle_exports(tmp, manifest, FACTS)  # camera/deepstream/ holds that graph now
    graph = f"{CAMERA_DIR}/deepstream/{DEEPSTREAM_GRAPH}"
    if f"{CAMERA_DIR}/deepstream/{DEEPSTREAM_CONFIG}" not in written:
        return
    if graph not in written:
        if not device.options.version_compatible:
            say(f"DeepStream: {CAMERA_DIR}/deepstream/{DEEPSTREAM_CONFIG} runs the bundle's graph and {ENGINE}")
            return
        graph = manifest.artifacts.qdq  # the bundle's own graph, its engine again without VERSION_COMPATIBLE
    ds = device.build_graph_engine(tmp, graph, DEEPSTREAM_ENGINE, log=say, version_compatible=False)
    manifest.backend_info = dict(manifest.backend_info or {}, deepstream_engine=ds)
    manifest.artifacts = manifest.artifacts.with_extra({DEEPSTREAM_ENGINE})
    compat = (" It is not version-compatible (nvinfer cannot load such an engine): it loads with this TensorRT only."
              if device.options.version_compatible else "")
    say(f"DeepStream: {CAMERA_DIR}/deepstream/{DEEPSTREAM_CONFIG} points at {DEEPSTREAM_ENGINE} ({ds['precision']}; "
        f"TensorRT {ds['tensorrt']}).{compat} nvinfer builds its own from the config's onnx-file only if it cannot load "
        f"that engine (another TensorRT or GPU): INT8 then too, through the empty int8-calib-file the config names")


def _validate(tmp: Path, manifest: Manifest, req: EngineRequest, device: DeviceBuild, say: Callable[[str], None]):
    """The engines against each other on the --val data: the validation `vitedge build` and `vitedge validate` run."""

    spec = manifest.spec
    source = open_source(req.val, spec.preprocess, class_names=spec.class_names)
    checked = validate_bundle(tmp, manifest, source, ValidateOptions(measure_speed=req.measure_speed, producer="vitedge engine",
                                                                     data_role="validation"),
                              log=SimpleNamespace(info=say), bundle_label=str(req.bundle), backend=device.backend())
    for row in checked.result.gate:
        say(("PASS " if row.passed else "FAIL ") + row.detail)
    return checked
