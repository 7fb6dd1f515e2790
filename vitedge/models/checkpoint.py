"""The checkpoint layout vitedge writes and reads back with ``torch.load(weights_only=True)``.

A plain state_dict works everywhere; a vitedge checkpoint adds what a state_dict cannot
say (head count, preprocessing, class names) so ``inspect`` reports it as coming from
the file::

    {"state_dict": {...tensors...},
     "vitedge": {"family": "timm", "model_kwargs": {...}, "preprocess": {...},
                 "class_names": [...]}}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitedge.files.atomic import atomic_write_path

META_KEY = "vitedge"
# Keys under which common training scripts nest the weights (DeiT uses "model").
STATE_DICT_KEYS = ("state_dict", "model", "model_state_dict", "module", "state_dict_ema", "model_ema")


def save_checkpoint(
    path: str | Path,
    state_dict: dict[str, Any],
    *,
    family: str,
    model_kwargs: dict[str, Any],
    preprocess: dict[str, Any] | None = None,
    class_names: list[str] | None = None,
) -> None:
    """Write a weights-only-loadable checkpoint with vitedge metadata (atomically)."""
    import torch


    meta: dict[str, Any] = {"family": family, "model_kwargs": dict(model_kwargs)}
    if preprocess is not None:
        meta["preprocess"] = dict(preprocess)
    if class_names is not None:
        meta["class_names"] = list(class_names)
    payload = {"state_dict": {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}, META_KEY: meta}
    with atomic_write_path(Path(path)) as tmp:
        torch.save(payload, tmp)
