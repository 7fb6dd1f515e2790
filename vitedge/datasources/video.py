"""Calibration frames sampled evenly from a video file. OpenCV is imported only here."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import track

from vitedge.datasources import _common
from vitedge.datasources._common import (
    CalibrationSource,
    Item,
    SourceSummary,
    by_count,
    data_hash,
    fill_cache,
    too_few,
)
from vitedge.errors import CalibrationError, MissingDependencyError, UsageError
from vitedge.fsutil import sha256_file
from vitedge.preprocess import preprocess_array
from vitedge.spec import Preprocess


def import_cv2() -> Any:
    try:
        import cv2
    except ImportError:
        raise MissingDependencyError("OpenCV (for video calibration)", "pip install 'vitedge[video]'") from None
    return cv2


def spaced_indices(total: int, n: int) -> list[int]:
    """``n`` frame indices evenly spread over ``total`` frames: the middle of ``n`` equal spans."""
    if n >= total:
        return list(range(total))
    return [((2 * k + 1) * total) // (2 * n) for k in range(n)]


class _SeekFailed(Exception):
    pass


def _open(cv2: Any, file: Path, path_text: str) -> Any:
    cap = cv2.VideoCapture(str(file))
    if not cap.isOpened():
        cap.release()
        raise CalibrationError(
            f"{path_text} cannot be opened as a video (unreadable, corrupt or a codec OpenCV lacks): "
            f"re-encode it, e.g. ffmpeg -i {path_text} -c:v libx264 out.mp4, or pass a folder of images"
        )
    return cap


def frame_count(cv2: Any, file: Path, path_text: str) -> int:
    """The container's frame count, or 0 when it does not say."""
    cap = _open(cv2, file, path_text)
    try:
        n = cap.get(cv2.CAP_PROP_FRAME_COUNT)
        return int(n) if n and n > 0 else 0
    finally:
        cap.release()


def iter_seek(cv2: Any, file: Path, path_text: str, indices: list[int]) -> Iterator[tuple[int, np.ndarray]]:
    """(index, BGR frame) for each index, by seeking; raises _SeekFailed if any seek misses."""
    cap = _open(cv2, file, path_text)
    try:
        pos = 0
        for idx in indices:
            if idx != pos and not cap.set(cv2.CAP_PROP_POS_FRAMES, idx):
                raise _SeekFailed(idx)
            ok, frame = cap.read()
            if not ok or frame is None:
                raise _SeekFailed(idx)
            pos = int(round(cap.get(cv2.CAP_PROP_POS_FRAMES)))
            if pos != idx + 1:  # landed on a nearby key frame instead
                raise _SeekFailed(idx)
            yield idx, frame
    finally:
        cap.release()


def iter_sequential(cv2: Any, file: Path, path_text: str, indices: Iterable[int] | None
                    ) -> Iterator[tuple[int, np.ndarray | None]]:
    """Read front to back. With ``indices``: (index, BGR frame or None if undecodable) for
    each wanted index. Without: (index, None) for every frame, to count them cheaply."""
    wanted = set(indices) if indices is not None else None
    last = max(wanted) if wanted else -1
    cap = _open(cv2, file, path_text)
    try:
        i = 0
        while (wanted is None or i <= last) and cap.grab():
            if wanted is None:
                yield i, None
            elif i in wanted:
                ok, frame = cap.retrieve()
                yield i, (frame if ok and frame is not None else None)
            i += 1
    finally:
        cap.release()


def _track(pairs: Iterator[Any], total: int, progress: bool, path_text: str) -> Iterator[Any]:
    if not progress:
        return pairs

    return iter(track(pairs, total=total, description=f"Reading {path_text}",
                      console=Console(stderr=True), transient=True))


def open_video(
    file: Path,
    path_text: str,
    pre: Preprocess,
    *,
    limit: int | None,
    seed: int,
    min_count: int,
    video_frames: int,
    progress: bool,
) -> CalibrationSource:
    cv2 = import_cv2()
    n = int(limit) if limit is not None else int(video_frames)
    if n < 1:
        raise UsageError(f"the number of video frames to sample must be at least 1, got {n}")
    total = frame_count(cv2, file, path_text)  # a CalibrationError before hashing a non-video
    stat = file.stat()
    video_sha = sha256_file(file)

    budget = _common.CACHE_BYTES
    cached = 0
    skipped: dict[str, int] = {}
    items: list[Item] = []

    def collect(pairs: Iterable[tuple[int, np.ndarray | None]], count: int) -> None:
        # Preprocess each frame as it arrives: full-size frames are never held together.
        nonlocal cached
        for idx, frame in _track(iter(pairs), count, progress, path_text):
            if frame is None:
                skipped["undecodable frame"] = skipped.get("undecodable frame", 0) + 1
                continue
            arr = preprocess_array(frame, pre, bgr=True)
            item = Item(id=f"frame@{idx}", sort_key=idx, sha=video_sha, label=None, ref=idx)
            if cached + arr.nbytes <= budget:
                item.data = arr
                cached += arr.nbytes
            items.append(item)

    try:
        # Seek when the container knows its length and seeking lands exactly ...
        if total <= 0:
            raise _SeekFailed(None)
        indices = spaced_indices(total, n)
        collect(iter_seek(cv2, file, path_text, indices), len(indices))
    except _SeekFailed:
        # ... else count the frames, then read front to back keeping the chosen ones.
        items.clear()
        skipped.clear()
        cached = 0
        total = sum(1 for _ in iter_sequential(cv2, file, path_text, None))
        indices = spaced_indices(total, n)
        collect(iter_sequential(cv2, file, path_text, indices), len(indices))
    if total == 0:
        raise CalibrationError(f"no frames could be decoded from {path_text}: re-encode it or pass a folder of images")
    too_few(len(items), "frames", path_text, min_count, skipped,
            "use a longer video, raise the number of sampled frames or lower --calib-size")
    items.sort(key=lambda it: it.sort_key)

    def loader(batch: list[Item]) -> list[np.ndarray]:
        now = file.stat()
        if (now.st_size, now.st_mtime_ns) != (stat.st_size, stat.st_mtime_ns):
            raise CalibrationError(
                f"{path_text} changed while vitedge was using it: leave it alone during the run and start again"
            )
        wanted = [it.ref for it in batch]
        got: dict[int, np.ndarray | None]
        try:
            got = dict(iter_seek(cv2, file, path_text, wanted))
        except _SeekFailed:
            got = dict(iter_sequential(cv2, file, path_text, wanted))
        out = []
        for idx in wanted:
            frame = got.get(idx)
            if frame is None:
                raise CalibrationError(f"frame {idx} of {path_text} can no longer be decoded: start again")
            out.append(preprocess_array(frame, pre, bgr=True))
        return out

    fill_cache(items, loader, budget)
    summary = SourceSummary(
        path=path_text,
        kind="video",
        found=total,
        used=len(items),
        skipped=by_count(skipped),
        converted={},
        subset_size=limit,
        seed=seed,
        data_hash=data_hash("video", items, extra=video_sha),
        labeled=False,
        class_names=None,
    )
    return CalibrationSource(summary, items, loader)
