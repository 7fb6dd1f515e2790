"""Calibration / validation images from a .npy or .npz file."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from vitedge.datasources.base import (
    CalibrationSource,
    Collected,
    Item,
    SourceRequest,
    fill_cache,
    keep_subset,
    ordered_map,
    summarize,
)
from vitedge.core.errors import CalibrationError
from vitedge.core.limits import physical_memory
from vitedge.bundle.preprocess import ImageTooLarge, preprocess_array, resized_size
from vitedge.bundle.spec import Preprocess
from vitedge.core.ui import literal

if TYPE_CHECKING:
    from numpy.lib.npyio import NpzFile

IMAGE_KEYS = ("images", "x")
LABEL_KEYS = ("labels", "y")


_MAGIC = {".npy": (b"\x93NUMPY",), ".npz": (b"PK\x03\x04", b"PK\x05\x06")}


def _load(file: Path, path_text: str) -> tuple[np.ndarray, np.ndarray | None]:
    suffix = file.suffix.lower()
    try:
        with open(file, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise CalibrationError(f"{path_text} cannot be read ({e.strerror or e}): check its permissions") from None
    if not any(head.startswith(m) for m in _MAGIC[suffix]):
        raise CalibrationError(
            f"{path_text} is not a numpy {suffix} file: save the data with "
            f"{'np.save' if suffix == '.npy' else 'np.savez'}"
        )
    try:
        if suffix == ".npy":
            try:
                return np.load(file, allow_pickle=False, mmap_mode="r"), None
            except ValueError:  # object dtype, or a layout numpy cannot map: load it plainly
                return np.load(file, allow_pickle=False), None
        with np.load(file, allow_pickle=False) as z:
            keys = list(z.files)
            image_key = next((k for k in IMAGE_KEYS if k in keys), None)
            if image_key is None:
                raise CalibrationError(
                    f"{path_text} has no 'images' or 'x' array (it has: {', '.join(keys) or 'nothing'}): "
                    f"save it with np.savez(path, images=..., labels=...)"
                )
            label_key = next((k for k in LABEL_KEYS if k in keys), None)
            _check_unpacked_size(z, image_key, path_text)
            return z[image_key], (z[label_key] if label_key is not None else None)
    except CalibrationError:
        raise
    except ValueError as e:
        if "pickle" in str(e).lower() or "object" in str(e).lower():
            raise CalibrationError(
                f"{path_text} holds Python objects, which vitedge does not unpickle: "
                f"save plain numeric arrays (uint8 or float32) with np.save / np.savez"
            ) from None
        raise CalibrationError(f"{path_text} cannot be read as a {suffix} file ({e}): re-save it with numpy") from None
    except Exception as e:
        raise CalibrationError(
            f"{path_text} cannot be read as a {suffix} file ({type(e).__name__}: {e}): re-save it with numpy"
        ) from None


def _check_unpacked_size(npz: NpzFile, key: str, path_text: str) -> None:
    """A .npz member is decompressed whole into memory (a .npy is mapped from disk): refuse one whose header says it
    needs more than half of this machine's RAM, before it is unpacked (a small compressed file can unpack to many GB,
    and Linux lets the allocation through, then kills the process as it fills)."""
    memory = physical_memory()
    if not memory:
        return
    names = npz.zip.namelist()
    try:
        with npz.zip.open(f"{key}.npy" if f"{key}.npy" in names else key) as member:
            version = np.lib.format.read_magic(member)
            # 3.0 is 2.0's layout with a UTF-8 header (numpy writes it only for non-Latin-1 field names): read as 2.0,
            # a header that is not Latin-1 is refused below
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0,
                    (3, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read is None:  # a version this check cannot read would go unchecked into np.load: refused
                raise CalibrationError(f"{path_text}: its '{key}' array has .npy format {version[0]}.{version[1]}, which vitedge "
                                       "does not read; save it again with np.savez")
            shape, _, dtype = read(member)
    except CalibrationError:
        raise
    except (KeyError, ValueError, OSError, EOFError) as err:  # a header that cannot be read is not unpacked unchecked
        raise CalibrationError(f"{path_text}: the header of its '{key}' array cannot be read ({str(err)[:120] or type(err).__name__}); "
                               "save it again with np.savez") from None
    need = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if need > memory // 2:
        raise CalibrationError(f"{path_text}: its '{key}' array {tuple(shape)} unpacks to {need / 2**30:.1f} GiB, more than half of this "
                               f"machine's {memory / 2**30:.1f} GiB (a .npz is decompressed whole): save it with np.save as a .npy, "
                               "which vitedge reads from disk, or as a folder of images")


def _expected(pre: Preprocess) -> str:
    h, w = pre.crop_size
    c = pre.channels
    frames = "uint8 RGB frames of any size shaped (N, H, W, 3)" if c == 3 else (
        "uint8 grayscale frames of any size shaped (N, H, W, 1) or (N, H, W, 3) (converted to grey)" if c == 1 else
        f"uint8 frames of any size shaped (N, H, W, {c})")
    return f"{frames}, or float32 model-ready inputs shaped (N, {c}, {h}, {w})"


def _check_images(images: np.ndarray, path_text: str, pre: Preprocess) -> str:
    """'uint8' (frames to preprocess) or 'float' (used as-is); CalibrationError otherwise."""
    shape, dtype = tuple(images.shape), images.dtype
    found = f"{path_text}: images are {dtype} with shape {shape}; expected {_expected(pre)}"
    if images.ndim != 4:
        hint = ": add a leading batch axis" if images.ndim == 3 else ""
        raise CalibrationError(found + hint)
    c = pre.channels
    frame_channels = (1, 3) if c == 1 else (c,)
    if dtype == np.uint8:
        if shape[-1] in frame_channels and shape[1] > 0 and shape[2] > 0:
            return "uint8"
        if shape[1] in frame_channels:
            raise CalibrationError(found + f": these look channels-first; transpose to (N, H, W, {shape[1]})")
        raise CalibrationError(found + (": convert the frames to 3-channel RGB" if c == 3 else f": the model takes {c} channel(s)"))
    if dtype == np.float32:
        if shape[1] == c and shape[2:] == tuple(pre.crop_size):
            return "float"
        if shape[-1] == c:
            raise CalibrationError(found + ": float inputs must already be preprocessed and channels-first")
        raise CalibrationError(
            found + ": float inputs are used as-is, so they must match the model's input; "
            "save uint8 frames to have vitedge resize and normalise them"
        )
    raise CalibrationError(found + ": convert with .astype(np.uint8) for raw frames or .astype(np.float32) "
                           "for preprocessed inputs")


def _check_labels(labels: np.ndarray | None, n: int, path_text: str,
                  class_names: Sequence[str] | None) -> np.ndarray | None:
    if labels is None:
        return None
    found = f"{path_text}: labels are {labels.dtype} with shape {tuple(labels.shape)}"
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise CalibrationError(f"{found}; expected integer class indices shaped ({n},)")
    if labels.shape[0] != n:
        raise CalibrationError(f"{found} but there are {n} images; expected one label per image")
    labels = np.asarray(labels).astype(np.int64)
    if n and labels.min() < 0:
        raise CalibrationError(f"{found} and include {int(labels.min())}; expected class indices >= 0")
    if n and class_names is not None and labels.max() >= len(class_names):
        raise CalibrationError(
            f"{found} and go up to {int(labels.max())}, but the model has {len(class_names)} classes; "
            f"expected class indices 0..{len(class_names) - 1}"
        )
    return labels


def _row_sha(row: np.ndarray) -> str:
    h = hashlib.sha256(f"{row.dtype.str}{row.shape}".encode())
    h.update(np.ascontiguousarray(row).tobytes())
    return h.hexdigest()


def open_array_file(file: Path, pre: Preprocess, request: SourceRequest,
                    class_names: Sequence[str] | None) -> CalibrationSource:
    path_text = request.path_text
    images, raw_labels = _load(file, path_text)
    form = _check_images(images, path_text, pre)
    if form == "uint8":
        try:
            resized_size(int(images.shape[2]), int(images.shape[1]), pre)
        except ImageTooLarge as err:
            raise CalibrationError(f"{path_text}: its frames of {err}; save frames nearer the model's "
                                   f"{pre.crop_size[0]}x{pre.crop_size[1]} input") from None
    n = int(images.shape[0])
    labels = _check_labels(raw_labels, n, path_text, class_names)

    def preprocess_rows(indices: list[int]) -> list[np.ndarray]:
        if form == "float":
            return [np.asarray(images[i], dtype=np.float32) for i in indices]
        return [preprocess_array(np.asarray(images[i]), pre) for i in indices]

    def check(i: int) -> tuple[str, bool, np.ndarray | None]:
        row = np.asarray(images[i])
        ok = form == "uint8" or bool(np.isfinite(row).all())
        # float rows are used as-is and cost nothing to fetch again, so only frames are cached
        return _row_sha(row), ok, (preprocess_array(row, pre) if form == "uint8" and ok else None)

    found = Collected()
    results = ordered_map(check, list(range(n)), progress=request.progress, description=f"Reading {literal(path_text)}")
    for i, (sha, ok, arr) in zip(range(n), results):
        if not ok:
            found.skip("non-finite values")
            continue
        found.add(Item(id=f"array[{i}]", sort_key=i, sha=sha, label=int(labels[i]) if labels is not None else None,
                       ref=i), arr)

    found.require(request, "images", "add usable images to the array")
    used = keep_subset(found.items, request.limit, request.seed)

    def loader(batch: list[Item]) -> list[np.ndarray]:
        return preprocess_rows([it.ref for it in batch])

    if form == "uint8":
        fill_cache(used, loader, found.budget)

    labeled = labels is not None
    summary = summarize("arrays", request, n, used, found.skipped, labeled=labeled,
                        class_names=tuple(class_names) if labeled and class_names is not None else None)
    return CalibrationSource(summary, used, loader)
