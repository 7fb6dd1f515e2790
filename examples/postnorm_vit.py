"""A user's own ViT, deliberately not timm-shaped: the ``--model-class`` example.

``PostNormViT`` embeds patches with an ``nn.Linear`` on unfolded 4x4 patches, prepends
a class token, adds learned positions and runs PyTorch's own post-norm
``nn.TransformerEncoder`` (``norm_first=False``), then classifies the class token.
Its trained weights ship as a plain state_dict (``examples/postnorm_vit.pt``), so
vitedge has to be told the class; the preprocessing it was trained with is on the
class as a timm-style ``pretrained_cfg``.

``enable_nested_tensor=False`` keeps nested tensors out of the encoder. The layer's
fused inference fast path (``aten::_transformer_encoder_layer_fwd``, which has no ONNX
export) is still taken whenever the model is in eval mode, grad is off (``torch.no_grad()``
or parameters with ``requires_grad=False``) and the head count is even, as here. So
export it with grad enabled, as ``torch.onnx.export(model.eval(), ...)`` does by
default, or inside ``torch.backends.mha.set_fastpath_enabled(False)``; either way the
graph is the plain layer maths and ONNX Runtime matches PyTorch to ~1e-6. The model is
left as a user would write it, so vitedge's exporter meets this case for real.
``python examples/postnorm_vit.py`` checks both ways.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

# Per-channel statistics of the digits training images at 32x32 (the same values the
# bundled timm example, examples/digits_vit.pt, was trained with).
DIGITS_MEAN = (0.306, 0.306, 0.306)
DIGITS_STD = (0.322, 0.322, 0.322)


class PostNormViT(nn.Module):
    pretrained_cfg = {
        "mean": DIGITS_MEAN,
        "std": DIGITS_STD,
        "crop_pct": 1.0,
        "interpolation": "bilinear",
        "input_size": (3, 32, 32),
    }

    def __init__(
        self,
        image_size: int = 32,
        patch_size: int = 4,
        dim: int = 128,
        depth: int = 4,
        heads: int = 4,
        mlp_dim: int = 256,
        num_classes: int = 10,
        channels: int = 3,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if image_size % patch_size:
            raise ValueError(f"image_size {image_size} is not a multiple of patch_size {patch_size}")
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_patches = (image_size // patch_size) ** 2
        self.channels = channels
        self.to_patch_embedding = nn.Linear(channels * patch_size * patch_size, dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.zeros(1, self.num_patches + 1, dim))
        layer = nn.TransformerEncoderLayer(
            d_model=dim,
            nhead=heads,
            dim_feedforward=mlp_dim,
            dropout=dropout,
            activation="gelu",
            batch_first=True,
            norm_first=False,
        )
        self.transformer = nn.TransformerEncoder(layer, num_layers=depth, enable_nested_tensor=False)
        self.head = nn.Linear(dim, num_classes)
        nn.init.trunc_normal_(self.pos_embedding, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Unfold into non-overlapping patches with reshape/permute (nn.Unfold exports to
        # a Pad/Range/Gather im2col graph; this stays Reshape + Transpose in ONNX).
        p, g, c = self.patch_size, self.image_size // self.patch_size, self.channels
        patches = x.reshape(-1, c, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(-1, g * g, c * p * p)
        tokens = self.to_patch_embedding(patches)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        tokens = torch.cat([cls, tokens], dim=1) + self.pos_embedding
        tokens = self.transformer(tokens)
        return self.head(tokens[:, 0])


@contextlib.contextmanager
def _fastpath_disabled():
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(before)


def check_onnx_export(model: nn.Module | None = None, path: str = "tmp.onnx", atol: float = 1e-4) -> dict[str, float]:
    """Export with a dynamic batch, run ONNX Runtime on batch 1 and 4, compare to PyTorch.

    Exports twice: with grad enabled (plain ``torch.onnx.export(model.eval(), ...)``) and
    under ``torch.no_grad()`` with the MHA fast path switched off.

    Returns the max abs difference per batch size; raises if any exceeds ``atol``.
    The temporary file is always deleted.
    """
    import os

    import numpy as np
    import onnxruntime as ort

    model = model or PostNormViT()
    size = getattr(model, "image_size", 32)
    diffs: dict[str, float] = {}

    def export(**kw) -> None:
        torch.onnx.export(
            model.eval(),
            (torch.randn(1, 3, size, size),),
            path,
            opset_version=17,
            dynamo=False,
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            input_names=["input"],
            output_names=["logits"],
            **kw,
        )

    def compare(tag: str) -> None:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        gen = torch.Generator().manual_seed(0)
        for b in (1, 4):
            x = torch.randn(b, 3, size, size, generator=gen)
            with torch.no_grad():
                ref = model(x).numpy()
            out = sess.run(["logits"], {"input": x.numpy()})[0]
            if out.shape != ref.shape:
                raise AssertionError(f"{tag} batch {b}: ONNX output shape {out.shape} != PyTorch {ref.shape}")
            diffs[f"{tag}/batch{b}"] = float(np.abs(out - ref).max())

    try:
        export()  # grad enabled: the fast path is not taken
        compare("grad")
        with torch.no_grad(), _fastpath_disabled():
            export()
        compare("no_grad+fastpath_off")
    finally:
        if os.path.exists(path):
            os.remove(path)
    bad = {k: v for k, v in diffs.items() if not v < atol}
    if bad:
        raise AssertionError(f"ONNX Runtime differs from PyTorch by more than {atol}: {bad}")
    return diffs


if __name__ == "__main__":
    import sys
    from pathlib import Path

    m = PostNormViT()
    weights = Path(__file__).with_name("postnorm_vit.pt")
    if weights.exists() and "--random" not in sys.argv:
        m.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        print(f"loaded {weights.name}")
    print(f"{sum(p.numel() for p in m.parameters())} parameters")
    print("ONNX Runtime vs PyTorch max abs diff:", check_onnx_export(m))
