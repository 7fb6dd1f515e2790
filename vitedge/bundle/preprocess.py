"""Frame -> model input, with numpy and Pillow only.

The same function serves calibration, validation, the bundled example's training and
the embedding runtime, so what a model sees at deployment is what it was checked on.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from vitedge.core.limits import MAX_RESIZED_PIXELS
from vitedge.bundle.spec import Preprocess

_PIL_FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}


def to_rgb_image(image: Image.Image) -> Image.Image:
    """Any Pillow image (grayscale, palette, RGBA, CMYK, 16-bit) as 8-bit RGB."""
    if image.mode == "RGB":
        return image
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16/32-bit grayscale: scale the full range down to 8 bits, not clip it.
        arr = np.asarray(image, dtype=np.float64)
        top = 65535.0 if image.mode.startswith("I;16") or arr.max() > 255 else 255.0
        arr = np.clip(arr / top * 255.0 + 0.5, 0, 255).astype(np.uint8)
        image = Image.fromarray(arr, mode="L")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        # Composite on black: what a camera pipeline that drops alpha would show.
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (0, 0, 0, 255))
        image = Image.alpha_composite(background, image)
    return image.convert("RGB")


def to_model_image(image: Image.Image, pre: Preprocess) -> Image.Image:
    """Any Pillow image in the model's colour mode: RGB for 3 channels, 8-bit grey "L" for 1
    (colour converts with ITU-R 601 luma, L = 0.299 R + 0.587 G + 0.114 B, as Pillow does).
    Other channel counts have no image mode: they take arrays (ImageModeError)."""
    rgb = to_rgb_image(image)
    if pre.channels == 3:
        return rgb
    if pre.channels == 1:
        return image if image.mode == "L" else rgb.convert("L")
    raise ImageModeError(
        f"this model takes {pre.channels}-channel input and an image file has at most RGB; "
        f"give it arrays with {pre.channels} channels instead (.npy/.npz, shaped (N, H, W, {pre.channels}))"
    )


class ImageModeError(ValueError):
    """An image cannot be turned into the model's channel count."""


class ImageTooLarge(ValueError):
    """An image whose resize (keeping its aspect ratio) would exceed limits.MAX_RESIZED_PIXELS."""


def resized_size(w: int, h: int, pre: Preprocess) -> tuple[int, int]:
    """(width, height) a w x h image resizes to (keeping its aspect ratio) to cover crop / crop_pct; ImageTooLarge,
    before any pixel is touched, past limits.MAX_RESIZED_PIXELS (a thin strip resizes to gigapixels)."""
    crop_h, crop_w = pre.crop_size
    target_h, target_w = pre.resize_size
    scale = max(target_h / max(h, 1), target_w / max(w, 1))
    new_w, new_h = max(crop_w, int(round(w * scale))), max(crop_h, int(round(h * scale)))
    if new_w * new_h > MAX_RESIZED_PIXELS:
        raise ImageTooLarge(f"{w}x{h} pixels (aspect ratio {max(w, h) / max(min(w, h), 1):.0f}:1) would resize to "
                            f"{new_w}x{new_h} to cover the {crop_w}x{crop_h} crop, over the {MAX_RESIZED_PIXELS >> 20}-megapixel "
                            "bound")
    return new_w, new_h


def resize_and_crop(image: Image.Image, pre: Preprocess) -> Image.Image:
    """Resize keeping aspect ratio to cover crop/crop_pct, then centre-crop to crop_size."""
    crop_h, crop_w = pre.crop_size
    w, h = image.size
    new_w, new_h = resized_size(w, h, pre)
    if (new_w, new_h) != (w, h):
        image = image.resize((new_w, new_h), _PIL_FILTERS[pre.interpolation])
    left = (new_w - crop_w) // 2
    top = (new_h - crop_h) // 2
    return image.crop((left, top, left + crop_w, top + crop_h))


def normalize(rgb_uint8_hwc: np.ndarray, pre: Preprocess) -> np.ndarray:
    """uint8 HxWxC (RGB, grey HxW or HxWx1, or C channels) -> float32 CxHxW, scaled to [0, 1] and normalised."""
    if rgb_uint8_hwc.ndim == 2:
        rgb_uint8_hwc = rgb_uint8_hwc[..., None]
    x = rgb_uint8_hwc.astype(np.float32) * np.float32(1.0 / 255.0)
    x -= np.asarray(pre.mean, dtype=np.float32)
    x /= np.asarray(pre.std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def image_to_uint8(image: Image.Image, pre: Preprocess) -> np.ndarray:
    """A Pillow image -> the resized, cropped uint8 HxWxC frame the model expects
    (HxWx3 RGB, or HxWx1 grey for a 1-channel model)."""
    out = np.asarray(resize_and_crop(to_model_image(image, pre), pre), dtype=np.uint8)
    return out[..., None] if out.ndim == 2 else out


def preprocess_image(image: Image.Image, pre: Preprocess) -> np.ndarray:
    """A Pillow image -> float32 CxHxW model input."""
    return normalize(image_to_uint8(image, pre), pre)


def frame_to_image(frame: np.ndarray, *, bgr: bool = False) -> Image.Image:
    """A uint8 frame -> a Pillow image: HxW / HxWx1 as grey "L", HxWx3 as RGB (BGR swapped)."""
    if frame.ndim == 2 or frame.shape[2] == 1:
        return Image.fromarray(np.ascontiguousarray(frame.reshape(frame.shape[:2])), mode="L")
    if bgr:
        frame = frame[..., ::-1]
    return Image.fromarray(np.ascontiguousarray(frame), mode="RGB")


def crop_channels(frame: np.ndarray, pre: Preprocess) -> np.ndarray:
    """A uint8 HxWxC frame of a model with C channels that are not an image mode (C = 2, 4...)
    -> the resized, cropped uint8 HxWxC: each channel goes through the same resize and
    crop as a grey image (Pillow resamples channels independently)."""
    if frame.ndim != 3 or frame.shape[2] != pre.channels:
        raise ImageModeError(f"the model takes {pre.channels}-channel frames, got shape {frame.shape}")
    planes = [np.asarray(resize_and_crop(Image.fromarray(np.ascontiguousarray(frame[..., i]), mode="L"), pre)) for i in range(pre.channels)]
    return np.stack(planes, axis=-1)


def frame_to_uint8(frame: np.ndarray, pre: Preprocess, *, bgr: bool = False) -> np.ndarray:
    """A uint8 frame -> the resized, cropped uint8 HxWxC the model takes."""
    if pre.channels not in (1, 3):
        return crop_channels(frame, pre)
    return image_to_uint8(frame_to_image(frame, bgr=bgr), pre)


def preprocess_array(frame: np.ndarray, pre: Preprocess, *, bgr: bool = False) -> np.ndarray:
    """A uint8 HxWx3 frame (RGB, or BGR as OpenCV delivers), HxW / HxWx1 grey for a
    1-channel model, or HxWxC for a C-channel model -> float32 CxHxW model input."""
    return normalize(frame_to_uint8(frame, pre, bgr=bgr), pre)
