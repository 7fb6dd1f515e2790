"""Where camera-app configs go: `camera/` inside each NVIDIA bundle, or a folder of the user's
choice (`vitedge export-config --for deepstream|triton BUNDLE -o OUT`) for any bundle."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vitedge.camera_apps.deepstream import nvinfer_can_feed, write_deepstream
from vitedge.camera_apps.serving import ServedBy, tensorrt_engine
from vitedge.camera_apps.triton import config_text, model_name, triton_backend, write_labels, write_triton
from vitedge.core.errors import UsageError
from vitedge.files.atomic import atomic_output_dir
from vitedge.bundle.manifest import Manifest, verify_bundle
from vitedge.files.outputs import check_output

CAMERA_DIR = "camera"

# --for NAME -> writer(bundle, manifest, folder being written, its final place, its backend's facts) -> files written
WRITERS: dict[str, Callable[[Path, Any, Path, Path, ServedBy], list[str]]] = {
    "deepstream": lambda bundle, manifest, tmp, final, served: write_deepstream(
        bundle, manifest, tmp, rel=os.path.relpath(bundle, final), served=served),
    "triton": lambda bundle, manifest, tmp, final, served: write_triton(bundle, manifest, tmp, served),
}


def export_config(kind: str, bundle: Path, out: Path, *, facts_of: Callable[[str], ServedBy], force: bool = False) -> list[str]:
    """Write the ``kind`` config for ``bundle`` into a new folder ``out`` (atomically). ``facts_of``:
    backend name -> its facts (vitedge.backends.backend_facts; this layer cannot import backends)."""

    if kind not in WRITERS:
        raise UsageError(f"unknown camera app '{kind}'; known: {', '.join(WRITERS)}")
    manifest = verify_bundle(bundle)
    served = facts_of(str(manifest.target.backend))
    # the one replace rule: never the bundle, a folder holding it or one inside it; --force replaces only a folder
    # export-config wrote (recognised by the first line of its config), checked before anything is written
    check_output(out, "camera", force=force, reads=(bundle,))
    bundle, final = bundle.resolve(), out.resolve()
    with atomic_output_dir(final, force=force) as tmp:
        return WRITERS[kind](bundle, manifest, tmp, final, served)


def _same_bytes(src: Path, dst: Path) -> None:
    """``dst`` holds ``src``'s bytes on its own: a hard link where both sit on one file system, else a copy.
    Never a symbolic link: a Triton container that mounts only camera/triton would see it dangle."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def write_bundle_exports(bundle: Path, manifest: Manifest, served: ServedBy) -> list[str]:
    """camera/deepstream/ and camera/triton/<name>/ in an NVIDIA bundle (one whose artifact is a TensorRT
    engine: ``served``, its backend's facts, say so); once its engine exists the repository's
    1/model.plan is that engine (a hard link or a copy, hashed in the manifest with the rest), so
    camera/triton is a whole model repository on its own. Paths relative to the bundle."""
    if not tensorrt_engine(served):
        return []
    root = bundle / CAMERA_DIR
    shutil.rmtree(root, ignore_errors=True)
    written: list[str] = []
    if nvinfer_can_feed(manifest):  # not a uint8-frame graph (--bake-preprocess), nor 2 or 4+ channels
        ds = root / "deepstream"
        ds.mkdir(parents=True)
        written += [f"{CAMERA_DIR}/deepstream/{f}" for f in write_deepstream(bundle, manifest, ds, rel="../..", served=served)]
    # The Triton repository from the build on; the engine joins it once `vitedge engine` built it.
    name = model_name(manifest)
    folder = root / "triton" / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config_text(manifest, bundle, name, served))
    written.append(f"{CAMERA_DIR}/triton/{name}/config.pbtxt")
    if manifest.artifacts.built:
        plan = folder / "1" / triton_backend(served, str(manifest.target.backend)).files[0][1]
        _same_bytes(bundle / manifest.artifacts.model, plan)
        written.append(f"{CAMERA_DIR}/triton/{name}/1/{plan.name}")
    if write_labels(bundle, manifest, folder):  # config.pbtxt names it: Triton fails the load without it
        written.append(f"{CAMERA_DIR}/triton/{name}/labels.txt")
    return written
