"""A ViT that plain INT8 damages, made honestly from the bundled digits ViT.

Large pretrained ViTs carry a few activation channels that are 10-100x larger than the
rest (LayerNorm outputs with outlier gamma, "massive activations"): a per-tensor INT8
scale sized for the outliers leaves the other channels a handful of levels, and
accuracy collapses. The small digits ViT trained here has no such channels, so this
script plants them with a **function-preserving rewrite** of its trained weights:

* LayerNorm -> Linear (``norm1 -> attn.qkv`` and ``norm2 -> mlp.fc1``): multiply the
  LayerNorm's gamma and beta of a few channels by ``k`` and divide the matching input
  columns of the Linear's weight by ``k``. The Linear's output is unchanged; its input
  now has outlier channels.
* value -> projection (``attn.qkv``'s V rows -> ``attn.proj``): multiply a few V output
  rows (weight and bias) by ``k`` and divide the matching input columns of ``attn.proj``
  by ``k``. Attention is linear in V, so the output is unchanged; ``proj``'s input now has
  outlier channels. No LayerNorm feeds ``proj``, so SmoothQuant cannot undo these.

SmoothQuant (``s_j = max|X_j|^a / max|W_j|^(1-a)``) undoes the LayerNorm ones exactly for any
``a`` (``X_j -> k X_j`` and ``W_j -> W_j / k`` give ``s_j -> k s_j``); so the model is evaluated
with SmoothQuant off (and, in benchmarks/accuracy_budget.py, with it on too).

The FP32 outputs of the rewritten model are checked against the original on the bundled
validation images (largest absolute logit difference and top-1 agreement are printed and
stored in the checkpoint's metadata).

    python examples/make_outlier_vit.py -o /tmp/digits_vit_outliers.pt

``make_outlier_state_dict`` is what the tests and the benchmark call.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "examples" / "digits_vit.pt"

# Where the outliers go, chosen before looking at any INT8 result: three of the six blocks,
# each site type at least once, two channels per site.
DEFAULT_SITES = (
    ("norm1", 1), ("norm2", 1),  # block 1: LayerNorm -> qkv, LayerNorm -> fc1
    ("norm2", 3),                # block 3: LayerNorm -> fc1
    ("value", 4),                # block 4: V -> proj
)
DEFAULT_CHANNELS = 2
DEFAULT_K = 40.0


def make_outlier_state_dict(state: dict[str, torch.Tensor], *, k: float = DEFAULT_K, sites=DEFAULT_SITES,
                            channels: int = DEFAULT_CHANNELS, seed: int = 0) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """The rewritten state dict and a record of what was planted where."""
    out = {n: t.clone() for n, t in state.items()}
    rng = np.random.default_rng(seed)
    dim = out["blocks.0.norm1.weight"].shape[0]
    record = []
    for site, block in sites:
        chan = sorted(int(c) for c in rng.choice(dim, size=channels, replace=False))
        p = f"blocks.{block}."
        if site in ("norm1", "norm2"):
            linear = p + ("attn.qkv" if site == "norm1" else "mlp.fc1")
            for c in chan:
                out[p + site + ".weight"][c] *= k
                out[p + site + ".bias"][c] *= k
                out[linear + ".weight"][:, c] /= k
            record.append({"site": f"{p}{site} -> {linear}", "channels": chan, "k": k})
        elif site == "value":
            rows = [2 * dim + c for c in chan]  # qkv rows: [q | k | v]
            for c, r in zip(chan, rows):
                out[p + "attn.qkv.weight"][r] *= k
                out[p + "attn.qkv.bias"][r] *= k
                out[p + "attn.proj.weight"][:, c] /= k
            record.append({"site": f"{p}attn.qkv (V) -> {p}attn.proj", "channels": chan, "k": k})
        else:
            raise ValueError(f"unknown site {site!r}")
    return out, record


def load_source(path: Path = SOURCE) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def build_model(ckpt: dict) -> torch.nn.Module:
    import timm  # noqa: F401
    from timm.models.vision_transformer import VisionTransformer

    m = VisionTransformer(**ckpt["vitedge"]["model_kwargs"]).eval()
    m.load_state_dict(ckpt["state_dict"])
    return m


def verify(original: dict, rewritten: dict, images: np.ndarray) -> dict:
    """FP32 outputs of both models on the same images: the rewrite must not change them."""
    a, b = build_model(original), build_model(rewritten)
    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
    with torch.no_grad():
        ya, yb = a(x).numpy(), b(x).numpy()
    return {"images": int(len(x)), "max_abs_logit_diff": float(np.max(np.abs(ya - yb))),
            "max_abs_logit": float(np.max(np.abs(ya))), "top1_agreement": float(np.mean(ya.argmax(1) == yb.argmax(1)))}


def make_checkpoint(out_path: Path, *, k: float = DEFAULT_K, source: Path = SOURCE, verify_on: np.ndarray | None = None) -> dict:
    original = load_source(source)
    state, record = make_outlier_state_dict(original["state_dict"], k=k)
    ckpt = {"state_dict": state, "vitedge": copy.deepcopy(original["vitedge"])}
    info = {"rewrite": record, "source": source.name}
    if verify_on is not None:
        info["verification"] = verify(original, ckpt, verify_on)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, out_path)
    return info


def val_images(limit: int | None = None) -> np.ndarray:
    sys.path.insert(0, str(REPO))
    from vitedge.datasources.sources import open_source
    from vitedge.bundle.spec import Preprocess

    meta = load_source()["vitedge"]
    pre = Preprocess.from_dict(meta["preprocess"])
    src = open_source(REPO / "calibration" / "digits" / "val", pre, limit=limit, progress=False)
    return np.concatenate([b.images for b in src.batches(64)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", type=Path, default=Path("digits_vit_outliers.pt"))
    ap.add_argument("-k", type=float, default=DEFAULT_K, help="outlier factor")
    args = ap.parse_args()
    info = make_checkpoint(args.out, k=args.k, verify_on=val_images())
    v = info["verification"]
    print(json.dumps(info, indent=2))
    if v["top1_agreement"] < 1.0 or v["max_abs_logit_diff"] > 1e-3 * max(1.0, v["max_abs_logit"]):
        raise SystemExit("the rewrite changed the FP32 outputs: it is not function-preserving")
    print(f"wrote {args.out}: FP32 logits within {v['max_abs_logit_diff']:.2e} of the original on {v['images']} images")


if __name__ == "__main__":
    main()
