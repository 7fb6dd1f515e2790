"""What DeepStream's nvinfer does to a frame and to a classifier's output, written from its
documented behaviour and sources (docs/camera-apps.md cites them), driven only by the values in
an nvinfer config: the upstream crop (nvvideoconvert src-crop), the scale to infer-dims
(maintain-aspect-ratio / symmetric-padding, scaling-filter), the colour format, then
y = net-scale-factor * (x - offsets[c]); and the default classifier parser (the largest output
above classifier-threshold and above 0, reported with that raw value).

Not nvinfer itself: its GPU resize (NvBufSurfTransform) is stood in for by Pillow's filter of
the same name, and its RGB -> GRAY conversion by Pillow's ITU-R 601 luma."""

from __future__ import annotations

import numpy as np
from PIL import Image

# scaling-filter (NvBufSurfTransform_Inter) -> the Pillow filter of that name
PIL_FILTER = {0: Image.Resampling.NEAREST, 1: Image.Resampling.BILINEAR, 2: Image.Resampling.BICUBIC, 4: Image.Resampling.LANCZOS}


def src_crop(frame: np.ndarray, crop: tuple[int, int, int, int]) -> np.ndarray:
    """nvvideoconvert src-crop=left:top:width:height."""
    left, top, width, height = crop
    return frame[top:top + height, left:left + width]


def network_input(props: dict[str, str], frame_rgb: np.ndarray) -> np.ndarray:
    """float32 CxHxW: the frame (uint8 HxWx3 RGB) scaled to infer-dims as the config says, in
    model-color-format, through y = net-scale-factor * (x - offsets[c])."""
    c, h, w = (int(v) for v in props["infer-dims"].split(";"))
    image = Image.fromarray(np.ascontiguousarray(frame_rgb), "RGB")
    fmt = props.get("model-color-format", "0")
    if fmt == "2":
        image = image.convert("L")
    elif fmt == "1":
        image = Image.fromarray(np.ascontiguousarray(np.asarray(image)[..., ::-1]), "RGB")
    resample = PIL_FILTER[int(props.get("scaling-filter", "0"))]
    fw, fh = image.size
    if props.get("maintain-aspect-ratio", "0") == "1":
        scale = min(w / fw, h / fh)
        nw, nh = max(1, int(round(fw * scale))), max(1, int(round(fh * scale)))
        canvas = Image.new(image.mode, (w, h), 0)
        x0, y0 = ((w - nw) // 2, (h - nh) // 2) if props.get("symmetric-padding", "0") == "1" else (0, 0)
        canvas.paste(image.resize((nw, nh), resample), (x0, y0))
        image = canvas
    else:
        image = image.resize((w, h), resample)
    x = np.asarray(image, np.float32)
    x = (x[..., None] if x.ndim == 2 else x).transpose(2, 0, 1)
    assert x.shape[0] == c, (x.shape, c)
    offsets = np.asarray([float(v) for v in props.get("offsets", "0").split(";")], np.float32).reshape(-1, 1, 1)
    return np.float32(float(props.get("net-scale-factor", "1"))) * (x - offsets)


def classify(props: dict[str, str], output: np.ndarray, labels: list[str]) -> tuple[int, float, str] | None:
    """nvinfer's default classifier parser on one output layer: (class, confidence, label) or None."""
    threshold = float(props["classifier-threshold"])  # the config must set it: nvinfer's default is not 0
    best, found = 0.0, None
    for c, p in enumerate(np.asarray(output, np.float32).ravel()):
        if p > threshold and p > best:
            best, found = float(p), c
    return None if found is None else (found, best, labels[found])
