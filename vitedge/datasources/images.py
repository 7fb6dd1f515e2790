"""Calibration / validation images from a folder, optionally one subfolder per class."""

from __future__ import annotations

import io
import os
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from vitedge.datasources.base import (
    CalibrationSource,
    Collected,
    Item,
    SourceRequest,
    _threaded,
    by_count,
    count_into,
    fill_cache,
    keep_subset,
    ordered_map,
    summarize,
)
from vitedge.core.errors import CalibrationError
from vitedge.files.atomic import sha256_bytes
from vitedge.core.limits import MAX_IMAGE_PIXELS, MAX_RESIZED_PIXELS
from vitedge.bundle.preprocess import ImageModeError, ImageTooLarge, preprocess_image, resized_size
from vitedge.files.safefile import MAX_IMAGE_BYTES, FileTooLarge, NotRegularFile, read_bounded
from vitedge.bundle.spec import Preprocess
from vitedge.core.ui import literal

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
ARRAY_EXTENSIONS = (".npy", ".npz")
VIDEO_EXTENSIONS = (".mp4", ".avi", ".mov", ".mkv", ".webm")

# Original Pillow mode -> what `converted` calls it. RGB needs no conversion.
MODE_LABELS = {
    "L": "grayscale",
    "LA": "grayscale+alpha",
    "1": "1-bit",
    "P": "palette",
    "PA": "palette",
    "RGBA": "RGBA",
    "RGBa": "RGBA",
    "CMYK": "CMYK",
    "I;16": "16-bit",
    "I;16B": "16-bit",
    "I;16L": "16-bit",
    "I;16N": "16-bit",
    "I": "32-bit",
    "F": "32-bit float",
}

_INTEGER = re.compile(r"^[0-9]+$")


def mode_label(mode: str) -> str | None:
    return None if mode == "RGB" else MODE_LABELS.get(mode, mode)


class _Skip(Exception):
    """An unusable file, with the reason counted in SourceSummary.skipped."""


def _hidden(name: str) -> bool:
    # .DS_Store, macOS "._x.jpg" AppleDouble files (not images despite the extension), .git
    return name.startswith(".")


OUTSIDE = "a symlink out of the data folder"
LOOP = "a symlink loop (or a folder linked twice)"


def _inside(real: str, top: str) -> bool:
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def scan_images(root: Path, skipped: dict[str, int] | None = None) -> tuple[list[str], Counter[str]]:
    """Relative posix paths of candidate images (sorted), and counts of other extensions.

    Symlinks are followed only while they stay inside ``root`` (resolved): a link to `/` or to a
    folder elsewhere is not walked, and a link back up the tree (a loop) is walked once; each is
    counted in ``skipped`` under OUTSIDE or LOOP, so the summary says what was left out."""
    found: list[str] = []
    other: Counter[str] = Counter()
    skipped = skipped if skipped is not None else {}
    top = os.path.realpath(root)
    seen_dirs: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True, onerror=_unreadable_folder(root)):
        real = os.path.realpath(dirpath)
        if not _inside(real, top):  # the walk never gets here (pruned below); kept as the rule
            dirnames[:] = []
            continue
        if real in seen_dirs:  # a symlink loop or a folder linked twice
            count_into(skipped, [LOOP])
            dirnames[:] = []
            continue
        seen_dirs.add(real)
        keep = []
        for d in sorted(d for d in dirnames if not _hidden(d)):
            if _inside(os.path.realpath(os.path.join(dirpath, d)), top):
                keep.append(d)
            else:
                count_into(skipped, [OUTSIDE])
        dirnames[:] = keep
        rel_dir = Path(dirpath).relative_to(root)
        for name in filenames:
            if _hidden(name):
                continue
            if not _inside(os.path.realpath(os.path.join(dirpath, name)), top):
                count_into(skipped, [OUTSIDE])
                continue
            ext = os.path.splitext(name)[1].lower()
            if ext in IMAGE_EXTENSIONS:
                found.append((rel_dir / name).as_posix())
            else:
                other[ext or "(no extension)"] += 1
    return sorted(found), other


def _unreadable_folder(root: Path):
    """os.walk's onerror: a folder it cannot list (no permission) would leave out its images, or a whole class,
    without a word; it is refused in one line naming the folder."""

    def refuse(err: OSError) -> None:
        where = Path(err.filename) if err.filename else root
        try:
            shown = where.relative_to(root).as_posix() or "."
        except ValueError:
            shown = str(where)
        reason = (err.strerror or type(err).__name__).lower()
        raise CalibrationError(f"folder '{shown}' in {root} cannot be read ({reason}): fix its permissions (chmod u+rx) or "
                               "move it out of the data folder; its images would be left out")

    return refuse


def _label_map(
    rels: list[str], path_text: str, class_names: Sequence[str] | None
) -> tuple[dict[str, int] | None, tuple[str, ...] | None, list[str]]:
    """Folder name -> label, the class names the labels index, and notes for the user."""
    tops = {rel.split("/", 1)[0] if "/" in rel else None for rel in rels}
    if tops == {None}:
        return None, None, []
    if None in tops:
        # one stray file would otherwise switch every label (and the top-1 check) off without a word
        loose = [rel for rel in rels if "/" not in rel]
        shown = ", ".join(loose[:3]) + (", ..." if len(loose) > 3 else "")
        raise CalibrationError(
            f"{len(loose)} image(s) ({shown}) sit directly in {path_text} beside class folders; move them into their class "
            "folder or out of it (labels come from the folder names; a folder of only loose images is unlabeled data)"
        )
    folders = sorted(t for t in tops if t is not None)
    notes: list[str] = []
    if class_names is not None:
        names = list(class_names)
        if all(f in names for f in folders):
            return {f: names.index(f) for f in folders}, tuple(names), []
    if all(_INTEGER.match(f) for f in folders):
        mapping = {f: int(f) for f in folders}
        if class_names is not None:
            bad = [f for f in folders if mapping[f] >= len(class_names)]
            if bad:
                raise CalibrationError(
                    f"class folder '{bad[0]}' in {path_text} is not a class index of this model "
                    f"({len(class_names)} classes, 0..{len(class_names) - 1}): rename the folders "
                    f"to class indices or class names"
                )
            return mapping, tuple(class_names), []
        return mapping, None, []
    if class_names is not None:
        stray = next(f for f in folders if f not in list(class_names))
        notes.append(
            f"folder names are not the model's class names (e.g. '{stray}'); "
            f"labels follow sorted folder order"
        )
    return {f: i for i, f in enumerate(folders)}, tuple(folders), notes


def _decode(data: bytes) -> Image.Image:
    if not data:
        raise _Skip("empty file")
    try:
        image = Image.open(io.BytesIO(data))  # reads the header only
        width, height = image.size
        if width * height > MAX_IMAGE_PIXELS:  # before decoding: a small PNG can claim gigapixels
            raise _Skip(f"over the decompression-bomb limit of {MAX_IMAGE_PIXELS // 2**20} megapixels")
        image.load()
        return image
    except _Skip:
        raise
    except Image.DecompressionBombError:
        raise _Skip(f"over the decompression-bomb limit of {MAX_IMAGE_PIXELS // 2**20} megapixels") from None
    except UnidentifiedImageError:
        raise _Skip("corrupt") from None
    except OSError as e:
        raise _Skip("truncated" if "truncated" in str(e) else "corrupt") from None
    except Exception:  # Pillow raises SyntaxError, ValueError, EOFError... on bad files
        raise _Skip("corrupt") from None


def _preprocess(image: Image.Image, pre: Preprocess) -> np.ndarray:
    try:
        resized_size(*image.size, pre)  # before converting or resizing: a thin strip would resize to gigapixels
    except ImageTooLarge:
        raise _Skip(f"too thin: would resize past {MAX_RESIZED_PIXELS >> 20} megapixels to cover the crop") from None
    try:
        return preprocess_image(image, pre)
    except (ImageModeError, ValueError, TypeError, OSError):  # a mode Pillow cannot convert; never MemoryError
        raise _Skip(f"unsupported colour mode {image.mode}") from None


def _check_one(path: Path, pre: Preprocess) -> tuple[str, str | None, np.ndarray] | _Skip:
    """sha256 of the file, its colour-mode label, the preprocessed array; or why it is unusable."""
    try:
        try:
            data = read_bounded(path, MAX_IMAGE_BYTES)
        except NotRegularFile:
            raise _Skip("not a regular file (FIFO, device or socket)") from None
        except FileTooLarge:
            raise _Skip(f"larger than {MAX_IMAGE_BYTES >> 20} MB") from None
        except OSError:
            raise _Skip("unreadable") from None
        image = _decode(data)
        label = None if image.mode == pre.color_mode else (mode_label(image.mode) or image.mode)
        return sha256_bytes(data), label, _preprocess(image, pre)
    except _Skip as skip:
        return skip


def open_image_folder(root: Path, pre: Preprocess, request: SourceRequest,
                      class_names: Sequence[str] | None) -> CalibrationSource:
    path_text = request.path_text
    skipped: dict[str, int] = {}
    rels, other = scan_images(root, skipped)
    if not rels:
        left_out = "".join(f"; {v} left out: {k}" for k, v in by_count(skipped).items())
        raise CalibrationError(_no_images_message(path_text, other) + left_out)
    labels, names, notes = _label_map(rels, path_text, class_names)

    found = Collected(skipped=skipped)
    results = ordered_map(lambda rel: _check_one(root / rel, pre), rels,
                          progress=request.progress, description=f"Reading {literal(path_text)}")
    for rel, result in zip(rels, results):
        if isinstance(result, _Skip):
            found.skip(str(result))
            continue
        sha, mode, arr = result
        label = labels[rel.split("/", 1)[0]] if labels is not None else None
        found.add(Item(id=rel, sort_key=rel, sha=sha, label=label, ref=rel, mode=mode), arr)

    found.require(request, "images", "add usable images to the folder")
    used = keep_subset(found.items, request.limit, request.seed)
    loader = _make_loader(root, path_text, pre)
    fill_cache(used, loader, found.budget)

    summary = summarize("images", request, len(rels), used, skipped,
                        labeled=labels is not None, class_names=names, notes=notes)
    return CalibrationSource(summary, used, loader)


def _make_loader(root: Path, path_text: str, pre: Preprocess):
    def load_one(item: Item) -> np.ndarray:
        result = _check_one(root / item.ref, pre)
        if isinstance(result, _Skip) or result[0] != item.sha:
            raise CalibrationError(
                f"{path_text}/{item.id} changed or became unreadable while vitedge was using it: "
                f"leave the calibration folder alone during the run and start again"
            )
        return result[2]

    def load(items: list[Item]) -> list[np.ndarray]:
        return list(_threaded(load_one, items))

    return load


def _no_images_message(path_text: str, other: Counter[str]) -> str:
    wanted = " ".join(IMAGE_EXTENSIONS)
    if not other:
        return f"{path_text} is empty: put calibration images ({wanted}) in it, one subfolder per class if labeled"
    exts = ", ".join(e for e, _ in other.most_common(4))
    hint = f"convert them to one of {wanted}"
    if any(e in ARRAY_EXTENSIONS for e in other):
        hint = "pass the .npy/.npz file itself instead of the folder, or add images"
    elif any(e in VIDEO_EXTENSIONS for e in other):
        hint = "pass the video file itself instead of the folder, or add images"
    return (
        f"no images ({wanted}) in {path_text}; found {sum(other.values())} other files "
        f"({exts}): {hint}"
    )
