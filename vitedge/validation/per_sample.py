"""Per-image outcomes a validation report keeps, so two reports on the same data can be compared image by image.

``accuracy.per_sample`` of a classifier's validation.json holds, in the data's order, whether INT8's top-1 agreed with
FP32's (``int8_agrees``) and, with labels, whether it was right (``int8_correct``): one bit per image, packed
(``numpy.packbits``, big-endian bit order) and base64-encoded, about 1.4 bytes per 8 images (a 50,000-image set: 8.5 kB
each). `vitedge compare` pairs the old and the new bits of one data set (same ``data.data_hash``): only the images one
report got right and the other wrong carry information, and their exact binomial test tells a real loss from the few
near-tie images any change flips (vitedge.validation.noise).
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

ENCODING = "packbits-base64"
MAX_ITEMS = 2_000_000  # above this the bits are left out (they would be ~330 kB per field)


def pack(mask: np.ndarray) -> str:
    return base64.b64encode(np.packbits(np.asarray(mask, dtype=bool)).tobytes()).decode("ascii")


def unpack(text: str, items: int) -> np.ndarray | None:
    """The bits of ``pack``, or None when ``text`` is not a packing of ``items`` bits (a damaged or edited report)."""
    if not isinstance(text, str) or len(text) != 4 * (((items + 7) // 8 + 2) // 3):
        return None  # checked before decoding: a hostile report cannot make us decode megabytes
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError, AttributeError):
        return None
    if len(raw) != (items + 7) // 8:
        return None
    return np.unpackbits(np.frombuffer(raw, dtype=np.uint8), count=items).astype(bool)


def record(ref: np.ndarray, got: np.ndarray, labels: np.ndarray | None) -> dict[str, Any] | None:
    """``accuracy.per_sample`` for the logits of FP32 (``ref``) and INT8 (``got``), or None when there are more than
    MAX_ITEMS images. Each bit is taken as the report's figure is (``top1_agreement``: argmax against argmax;
    ``int8_top1``: ``topk_accuracy``'s first), so the bits add up to the figures exactly."""
    items = int(len(ref))
    if items > MAX_ITEMS:
        return None
    out: dict[str, Any] = {"encoding": ENCODING, "items": items, "int8_agrees": pack(ref.argmax(1) == got.argmax(1))}
    if labels is not None:
        out["int8_correct"] = pack(np.argsort(-got, axis=1)[:, 0] == labels)
    return out


def bits(section: Any, key: str) -> np.ndarray | None:
    """``key``'s bits from a report's ``accuracy.per_sample`` (None when absent or unreadable)."""
    if not isinstance(section, dict) or section.get("encoding") != ENCODING or not isinstance(section.get(key), str):
        return None
    items = section.get("items")
    if not isinstance(items, int) or items < 0 or items > MAX_ITEMS:
        return None
    return unpack(section[key], items)
