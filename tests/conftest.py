"""Shared fixtures: small real models (random weights), saved in the formats users bring."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
CALIB_DIR = REPO / "calibration" / "digits" / "calib"
VAL_DIR = REPO / "calibration" / "digits" / "val"

os.environ.setdefault("VITEDGE_CACHE_DIR", str(Path(os.environ.get("TMPDIR", "/tmp")) / "vitedge-test-cache"))
warnings.filterwarnings("ignore", category=DeprecationWarning)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


def _seeded():
    import torch

    torch.manual_seed(0)
    return torch


@pytest.fixture(scope="session")
def timm_vit(model_dir):
    """A 2-block timm ViT at 32x32 with patch 8, as (module, state_dict path)."""
    torch = _seeded()
    import timm

    m = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2, num_classes=10).eval()
    path = model_dir / "timm_vit.pt"
    torch.save(m.state_dict(), path)
    return m, path


@pytest.fixture(scope="session")
def torchvision_vit(model_dir):
    torch = _seeded()
    from torchvision.models.vision_transformer import VisionTransformer

    m = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=5).eval()
    torch.nn.init.normal_(m.heads.head.weight, std=0.5)  # torchvision zero-initialises the head
    path = model_dir / "tv_vit.pt"
    torch.save(m.state_dict(), path)
    return m, path


@pytest.fixture(scope="session")
def deit_distilled(model_dir):
    torch = _seeded()
    import timm

    m = timm.create_model("deit_tiny_distilled_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2, num_classes=7).eval()
    path = model_dir / "deit_distilled.pt"
    torch.save(m.state_dict(), path)
    return m, path
