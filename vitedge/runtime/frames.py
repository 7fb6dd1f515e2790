"""Camera frames -> the model input a bundle expects, with the bundle's own preprocessing.

A frame is a uint8 HxWx3 array of any size, RGB or BGR (what OpenCV delivers). A bundle
of a 1-channel (grayscale) model also takes HxW and HxWx1 grey frames, and converts HxWx3
colour frames to grey with ITU-R 601 luma (L = 0.299 R + 0.587 G + 0.114 B), exactly as
Pillow's ``convert("L")`` does; a bundle of a C-channel model (C = 2, 4...) takes HxWxC. Each one
goes through `vitedge.bundle.preprocess` exactly as calibration and validation did: resize
keeping aspect ratio to cover crop/crop_pct, centre crop, then (unless the bundle bakes
it into its graph) scale to [0, 1] and normalise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from vitedge.core.errors import UsageError
from vitedge.bundle.preprocess import ImageTooLarge, crop_channels, image_to_uint8, normalize, resized_size
from vitedge.bundle.spec import Preprocess

COLORS = ("rgb", "bgr")
_UINT8 = np.dtype(np.uint8)


class FrameError(UsageError):
    """A frame predict cannot take: wrong type, dtype or shape."""


def frame_channels(channels: int) -> tuple[int, ...]:
    """The channel counts of HxWxC frames a model with `channels` inputs takes (1 also takes HxW)."""
    return (1, 3) if channels == 1 else (channels,)


def as_frame_list(frames: object, channels: int = 3) -> tuple[list[np.ndarray], bool]:
    """One frame, a list of frames or an (N, H, W, C) array -> (checked frames, was a single frame)."""
    if isinstance(frames, np.ndarray):
        if frames.ndim == 4:
            items, single = list(frames), False
        elif frames.ndim in (2, 3):
            items, single = [frames], True
        else:
            raise FrameError(f"frames must be one HxWx3 uint8 array, a list of them or an NxHxWx3 array; got an array of shape {frames.shape}")
    elif isinstance(frames, Sequence) and not isinstance(frames, (str, bytes)):
        items, single = list(frames), False
    else:
        hint = "; convert a Pillow image with np.asarray(image.convert('RGB'))" if isinstance(frames, Image.Image) else ""
        raise FrameError(f"frames must be a uint8 HxWx3 numpy array or a list of them, got {type(frames).__name__}{hint}")
    for i, frame in enumerate(items):
        # the common case in a few attribute reads; check_frame explains anything else
        if not (type(frame) is np.ndarray and frame.dtype == _UINT8 and frame.ndim == 3 and frame.shape[2] == channels and frame.size):
            check_frame(frame, "frame" if single else f"frame {i}", channels)
    return items, single


def check_frame(frame: object, what: str = "frame", channels: int = 3) -> None:
    """A one-line FrameError unless `frame` is a non-empty uint8 HxWx3 array (for a 1-channel
    model also HxW or HxWx1; for a C-channel model HxWxC)."""
    if not isinstance(frame, np.ndarray):
        raise FrameError(f"{what} is a {type(frame).__name__}, not a numpy array: pass uint8 HxWx{channels} arrays")
    if channels != 3:
        _check_other_channels(frame, what, channels)
        return
    if frame.ndim == 2 or (frame.ndim == 3 and frame.shape[2] == 1):
        raise FrameError(f"{what} is grayscale (shape {frame.shape}); pass 3 channels, e.g. np.repeat(gray[..., None], 3, axis=2) "
                         f"or cv2.cvtColor(gray, cv2.COLOR_GRAY2BGR)")
    if frame.ndim != 3:
        raise FrameError(f"{what} has shape {frame.shape}; expected HxWx3")
    if frame.shape[2] == 4:
        raise FrameError(f"{what} has 4 channels (RGBA/BGRA, shape {frame.shape}); drop alpha first: frame[..., :3]")
    if frame.shape[2] != 3 and frame.shape[0] in (1, 3):
        raise FrameError(f"{what} looks channels-first (shape {frame.shape}); pass HxWx3: frame.transpose(1, 2, 0)")
    if frame.shape[2] != 3:
        raise FrameError(f"{what} has {frame.shape[2]} channels (shape {frame.shape}); expected HxWx3 (channels last)")
    _check_size_and_dtype(frame, what)


def _check_other_channels(frame: np.ndarray, what: str, channels: int) -> None:
    takes = frame_channels(channels)
    shapes = "HxW, HxWx1 or HxWx3 (converted to grey)" if channels == 1 else f"HxWx{channels}"
    grey = channels == 1 and frame.ndim == 2
    if not grey and (frame.ndim != 3 or frame.shape[2] not in takes):
        first = frame.ndim == 3 and frame.shape[0] in takes and frame.shape[2] not in takes
        hint = f"; it looks channels-first: frame.transpose(1, 2, 0)" if first else ""
        raise FrameError(f"{what} has shape {frame.shape}; this {channels}-channel model takes uint8 {shapes} frames{hint}")
    _check_size_and_dtype(frame, what)


def _check_size_and_dtype(frame: np.ndarray, what: str) -> None:
    """The last checks of every frame, whatever its channel count: not empty, and uint8."""
    if frame.shape[0] == 0 or frame.shape[1] == 0:
        raise FrameError(f"{what} is empty (shape {frame.shape})")
    if frame.dtype != np.uint8:
        raise FrameError(f"{what} is {frame.dtype}, not uint8: pass 0-255 camera frames as uint8 "
                         f"(an already preprocessed float tensor goes to model.infer())")


def check_color(color: str) -> bool:
    """'rgb' / 'bgr' -> whether the frames are BGR."""
    if color == "rgb" or color == "bgr":
        return color == "bgr"
    c = str(color).lower()
    if c not in COLORS:
        raise UsageError(f"color must be 'rgb' or 'bgr' (OpenCV frames are BGR), got {color!r}")
    return c == "bgr"


def crop_frame(frame: np.ndarray, pre: Preprocess, *, bgr: bool) -> np.ndarray:
    """A checked frame -> the resized, centre-cropped uint8 HxWx3 RGB frame (vitedge.bundle.preprocess).

    A BGR frame is resized and cropped as it is and its channels are swapped afterwards, on
    the small crop: Pillow resamples each channel on its own, so this is bit-identical to
    swapping first (tests/runtime/test_runtime.py checks it) and skips copying the full frame.
    For a 1-channel model the result is HxWx1 grey, for a C-channel model HxWxC. A frame too thin to resize within
    limits.MAX_RESIZED_PIXELS is a FrameError, before any pixel is touched."""
    try:
        resized_size(int(frame.shape[1]), int(frame.shape[0]), pre)
    except ImageTooLarge as err:
        raise FrameError(f"a frame of {err}; crop it nearer the model's input first") from None
    if pre.channels == 1:
        return _grey_crop(frame, pre, bgr=bgr)
    if pre.channels != 3:
        return crop_channels(frame, pre)
    crop = image_to_uint8(Image.fromarray(np.ascontiguousarray(frame), mode="RGB"), pre)
    return np.ascontiguousarray(crop[..., ::-1]) if bgr else crop


def _grey_crop(frame: np.ndarray, pre: Preprocess, *, bgr: bool) -> np.ndarray:
    if frame.ndim == 2 or frame.shape[2] == 1:
        image = Image.fromarray(np.ascontiguousarray(frame.reshape(frame.shape[:2])), mode="L")
    else:  # colour -> grey (ITU-R 601 luma, Pillow's "L") before resizing, as calibration did
        image = Image.fromarray(np.ascontiguousarray(frame[..., ::-1] if bgr else frame), mode="RGB")
    return image_to_uint8(image, pre)


def prepare_batch(frames: list[np.ndarray], pre: Preprocess, *, bgr: bool, baked: bool) -> np.ndarray:
    """Checked frames -> one model-input batch: uint8 NxHxWx3 RGB when the graph normalises
    (baked), else float32 Nx3xHxW normalised — the same as `vitedge.bundle.preprocess.preprocess_array`."""
    crops = [crop_frame(f, pre, bgr=bgr) for f in frames]
    if baked:
        return np.stack(crops)
    return np.stack([normalize(c, pre) for c in crops])
