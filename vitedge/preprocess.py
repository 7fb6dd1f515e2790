"""Frame -> model input, with numpy and Pillow only.

The same function serves calibration, validation, the bundled example's training and
the embedding runtime, so what a model sees at deployment is what it was checked on.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from vitedge.spec import Preprocess

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


def resize_and_crop(image: Image.Image, pre: Preprocess) -> Image.Image:
    """Resize keeping aspect ratio to cover crop/crop_pct, then centre-crop to crop_size."""
    crop_h, crop_w = pre.crop_size
    target_h, target_w = pre.resize_size
    w, h = image.size
    scale = max(target_h / h, target_w / w)
    new_w, new_h = max(crop_w, int(round(w * scale))), max(crop_h, int(round(h * scale)))
    if (new_w, new_h) != (w, h):
        image = image.resize((new_w, new_h), _PIL_FILTERS[pre.interpolation])
    left = (new_w - crop_w) // 2
    top = (new_h - crop_h) // 2
    return image.crop((left, top, left + crop_w, top + crop_h))


def normalize(rgb_uint8_hwc: np.ndarray, pre: Preprocess) -> np.ndarray:
    """uint8 HxWx3 RGB -> float32 3xHxW, scaled to [0, 1] and normalised."""
    x = rgb_uint8_hwc.astype(np.float32) * np.float32(1.0 / 255.0)
    x -= np.asarray(pre.mean, dtype=np.float32)
    x /= np.asarray(pre.std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def image_to_uint8(image: Image.Image, pre: Preprocess) -> np.ndarray:
    """A Pillow image -> the resized, cropped uint8 HxWx3 RGB frame the model expects."""
    return np.asarray(resize_and_crop(to_rgb_image(image), pre), dtype=np.uint8)


def preprocess_image(image: Image.Image, pre: Preprocess) -> np.ndarray:
    """A Pillow image -> float32 3xHxW model input."""
    return normalize(image_to_uint8(image, pre), pre)


def preprocess_array(frame: np.ndarray, pre: Preprocess, *, bgr: bool = False) -> np.ndarray:
    """A uint8 HxWx3 frame (RGB, or BGR as OpenCV delivers) -> float32 3xHxW model input."""
    if bgr:
        frame = frame[..., ::-1]
    return preprocess_image(Image.fromarray(np.ascontiguousarray(frame), mode="RGB"), pre)
