"""Calibration frames sampled evenly from a video file. OpenCV is imported only here."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import track

from vitedge.datasources.base import (
    CalibrationSource,
    Collected,
    Item,
    Loader,
    SourceRequest,
    fill_cache,
    summarize,
)
from vitedge.core.errors import CalibrationError, MissingDependencyError, UsageError
from vitedge.files.atomic import sha256_file
from vitedge.bundle.preprocess import preprocess_array
from vitedge.bundle.spec import Preprocess
from vitedge.core.ui import literal


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


def _open(cv2: ModuleType, file: Path, path_text: str) -> Any:
    cap = cv2.VideoCapture(str(file))
    if not cap.isOpened():
        cap.release()
        raise CalibrationError(
            f"{path_text} cannot be opened as a video (unreadable, corrupt or a codec OpenCV lacks): "
            f"re-encode it, e.g. ffmpeg -i {path_text} -c:v libx264 out.mp4, or pass a folder of images"
        )
    return cap


def frame_count(cv2: ModuleType, file: Path, path_text: str) -> int:
    """The container's frame count, or 0 when it does not say."""
    cap = _open(cv2, file, path_text)
    try:
        n = cap.get(cv2.CAP_PROP_FRAME_COUNT)
        return int(n) if n and n > 0 else 0
    finally:
        cap.release()


def iter_seek(cv2: ModuleType, file: Path, path_text: str, indices: list[int]) -> Iterator[tuple[int, np.ndarray]]:
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


def iter_sequential(cv2: ModuleType, file: Path, path_text: str, indices: Iterable[int] | None
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

    return iter(track(pairs, total=total, description=f"Reading {literal(path_text)}",
                      console=Console(stderr=True), transient=True))


@dataclass(frozen=True)
class _VideoFile:
    """A video being read: the file as it was when opened, so every later read can check it is still that file."""

    cv2: Any
    file: Path
    path_text: str
    stat: os.stat_result
    sha: str

    def check_unchanged(self) -> None:
        now = self.file.stat()
        if (now.st_size, now.st_mtime_ns) != (self.stat.st_size, self.stat.st_mtime_ns):
            raise CalibrationError(
                f"{self.path_text} changed while vitedge was using it: leave it alone during the run and start again"
            )

    def seek(self, indices: list[int]) -> Iterator[tuple[int, np.ndarray]]:
        return iter_seek(self.cv2, self.file, self.path_text, indices)

    def sequential(self, indices: Iterable[int] | None) -> Iterator[tuple[int, np.ndarray | None]]:
        return iter_sequential(self.cv2, self.file, self.path_text, indices)


def _frames_to_sample(limit: int | None, video_frames: int) -> int:
    n = int(limit) if limit is not None else int(video_frames)
    if n < 1:
        raise UsageError(f"the number of video frames to sample must be at least 1, got {n}")
    return n


def _open_video_file(cv2: ModuleType, file: Path, path_text: str) -> tuple[_VideoFile, int]:
    """The video and the frame count its container states (0 when it does not say)."""
    total = frame_count(cv2, file, path_text)  # a CalibrationError before hashing a non-video
    stat = file.stat()
    return _VideoFile(cv2, file, path_text, stat, sha256_file(file)), total


def _collect(video: _VideoFile, pairs: Iterator[tuple[int, np.ndarray | None]], count: int, pre: Preprocess,
             progress: bool) -> Collected:
    """Preprocess each frame as it arrives: full-size frames are never held together."""
    found = Collected()
    for idx, frame in _track(pairs, count, progress, video.path_text):
        if frame is None:
            found.skip("undecodable frame")
            continue
        found.add(Item(id=f"frame@{idx}", sort_key=idx, sha=video.sha, label=None, ref=idx),
                  preprocess_array(frame, pre, bgr=True))
    return found


def _sample(video: _VideoFile, total: int, n: int, pre: Preprocess, progress: bool) -> tuple[int, Collected]:
    """``n`` evenly spaced frames, and how many frames the video holds. Seek when the container
    knows its length and seeking lands exactly, else count the frames, then read front to back
    keeping the chosen ones."""
    try:
        if total <= 0:
            raise _SeekFailed(None)
        indices = spaced_indices(total, n)
        return total, _collect(video, video.seek(indices), len(indices), pre, progress)
    except _SeekFailed:
        total = sum(1 for _ in video.sequential(None))
        indices = spaced_indices(total, n)
        return total, _collect(video, video.sequential(indices), len(indices), pre, progress)


def _make_loader(video: _VideoFile, pre: Preprocess) -> Loader:
    def loader(batch: list[Item]) -> list[np.ndarray]:
        video.check_unchanged()
        wanted = [it.ref for it in batch]
        got: dict[int, np.ndarray | None]
        try:
            got = dict(video.seek(wanted))
        except _SeekFailed:
            got = dict(video.sequential(wanted))
        out = []
        for idx in wanted:
            frame = got.get(idx)
            if frame is None:
                raise CalibrationError(f"frame {idx} of {video.path_text} can no longer be decoded: start again")
            out.append(preprocess_array(frame, pre, bgr=True))
        return out

    return loader


def open_video(file: Path, pre: Preprocess, request: SourceRequest, video_frames: int) -> CalibrationSource:
    cv2 = import_cv2()
    n = _frames_to_sample(request.limit, video_frames)
    video, total = _open_video_file(cv2, file, request.path_text)
    total, found = _sample(video, total, n, pre, request.progress)
    if total == 0:
        raise CalibrationError(
            f"no frames could be decoded from {request.path_text}: re-encode it or pass a folder of images")
    found.require(request, "frames", "use a longer video or sample more of its frames (--calib-size, or --data-size in validate, sets how many)")
    items = sorted(found.items, key=lambda it: it.sort_key)
    loader = _make_loader(video, pre)
    fill_cache(items, loader, found.budget)
    summary = summarize("video", request, total, items, found.skipped, hash_extra=video.sha)
    return CalibrationSource(summary, items, loader)
