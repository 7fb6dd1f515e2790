"""A small nn.TransformerEncoder ViT (tests/helpers/vit_layouts.py:EncoderViT) saved as a state_dict, with the intake
options that load it: the narrow layout (width 32) whose INT8 does not pay on every CPU kind."""

from __future__ import annotations

import importlib.util
from pathlib import Path

LAYOUTS_PY = Path(__file__).resolve().parent / "vit_layouts.py"


def encoder_vit_checkpoint(folder: Path, depth: int = 1):
    """(state_dict path, IntakeOptions): EncoderViT of width 32, ``depth`` blocks, 2 heads, one channel, seed 0."""
    import torch

    from vitedge.models.intake import IntakeOptions

    spec = importlib.util.spec_from_file_location("vit_layouts", LAYOUTS_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    kwargs = {"dim": 32, "depth": depth, "heads": 2, "channels": 1}
    path = Path(folder) / "enc.pt"
    torch.save(mod.EncoderViT(**kwargs).eval().state_dict(), path)
    return path, IntakeOptions(model_class=f"{LAYOUTS_PY}:EncoderViT", model_kwargs=kwargs)
