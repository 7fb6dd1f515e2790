"""Calibration and validation data: a folder of images, a .npy/.npz file or a video.

``open_source`` reads and checks every candidate once (so counts are known up front),
picks a deterministic seeded subset when asked, and returns a ``CalibrationSource``
that yields preprocessed, model-ready float32 NCHW batches in the same order every
time. ``summary`` says what was found, skipped, converted and used, and a ``data_hash``
that identifies exactly the items used, wherever the folder lives.

The work is split by kind: ``images.py`` (folders), ``arrays.py`` (.npy/.npz) and
``video.py`` (OpenCV, imported only for videos); shared types are in ``base.py``.
No torch here.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from vitedge.datasources.base import (
    Batch,
    CalibrationSource,
    SourceRequest,
    SourceSummary,
    check_limit,
)
from vitedge.datasources.arrays import open_array_file
from vitedge.datasources.images import (
    ARRAY_EXTENSIONS,
    IMAGE_EXTENSIONS,
    VIDEO_EXTENSIONS,
    open_image_folder,
)
from vitedge.datasources.video import open_video
from vitedge.core.errors import CalibrationError, UsageError
from vitedge.files.safefile import check_regular
from vitedge.bundle.spec import Preprocess

__all__ = [
    "ARRAY_EXTENSIONS",
    "IMAGE_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "Batch",
    "CalibrationSource",
    "SourceSummary",
    "open_source",
]

_WHAT = "a folder of images (.jpg .jpeg .png .bmp .webp), a .npy/.npz file or a video (.mp4 .avi .mov .mkv .webm)"


def check_data_exists(path: str | os.PathLike) -> Path:
    """``path`` (``~`` expanded) when something is there; else the one-line error ``open_source`` gives. `build`
    calls it before loading and exporting the model, so a mistyped --calib costs seconds, not the export."""
    file = Path(os.fspath(path)).expanduser()
    if not file.exists():
        raise CalibrationError(f"{os.fspath(path)} does not exist: pass {_WHAT}")
    return file


def open_source(
    path: str | os.PathLike[str],
    preprocess: Preprocess,
    *,
    limit: int | None = None,
    seed: int = 0,
    min_count: int = 1,
    class_names: Sequence[str] | None = None,
    video_frames: int = 64,
    progress: bool = False,
) -> CalibrationSource:
    """Open calibration or validation data at ``path``.

    ``limit`` is the CLI's --calib-size: a seeded subset of that many items (all of them
    when fewer are usable; for a video, the number of frames to sample instead of
    ``video_frames``). Fewer than ``min_count`` usable items is a CalibrationError.
    ``class_names`` (the model's) map class-folder names to label indices.
    """
    check_limit(limit)
    if int(seed) < 0:
        raise UsageError(f"--seed must be 0 or more, got {seed}")
    seed = int(seed)
    limit = int(limit) if limit is not None else None
    path_text = os.fspath(path)
    file = check_data_exists(path)
    request = SourceRequest(path_text, limit, seed, int(min_count), bool(progress))
    suffix = file.suffix.lower()
    if preprocess.channels not in (1, 3) and (file.is_dir() or suffix in VIDEO_EXTENSIONS):
        c, (h, w) = preprocess.channels, preprocess.crop_size
        raise CalibrationError(
            f"{path_text} holds {'a video' if suffix in VIDEO_EXTENSIONS else 'images'} with at most 3 colour channels, but this model "
            f"takes {c}-channel input: save the data as a .npy/.npz of uint8 frames shaped (N, H, W, {c}) "
            f"or float32 model-ready inputs shaped (N, {c}, {h}, {w})"
        )

    try:
        return _open_kind(file, suffix, preprocess, request, class_names, video_frames)
    except OSError as err:  # data is only read: an OSError here is about reading it, never about an output
        if err.errno is None:
            raise
        what = f"{err.filename}" if getattr(err, "filename", None) else path_text
        raise CalibrationError(f"{path_text}: cannot read {what} ({err.strerror or err}); vitedge only reads data: fix its "
                               "permissions or pass data you can read") from None


def _open_kind(file: Path, suffix: str, preprocess: Preprocess, request: SourceRequest, class_names: Sequence[str] | None,
               video_frames: int) -> CalibrationSource:
    """The opener for ``file``'s kind: a folder of images, an array file, a video."""
    path_text = request.path_text
    if file.is_dir():
        if not os.access(file, os.R_OK | os.X_OK):
            raise CalibrationError(f"{path_text} cannot be read (permission denied): fix its permissions")
        return open_image_folder(file, preprocess, request, class_names)

    try:
        check_regular(file)
    except OSError as err:
        raise CalibrationError(f"{path_text} is not a regular file ({err.strerror or err}): pass {_WHAT}") from None
    if suffix in ARRAY_EXTENSIONS:
        return open_array_file(file, preprocess, request, class_names)
    if suffix in VIDEO_EXTENSIONS:
        return open_video(file, preprocess, request, video_frames)
    if suffix in IMAGE_EXTENSIONS:
        raise CalibrationError(
            f"{path_text} is a single image: pass the folder that holds the calibration images"
        )
    raise CalibrationError(f"{path_text} is not a supported data source ({suffix or 'no extension'}): pass {_WHAT}")
