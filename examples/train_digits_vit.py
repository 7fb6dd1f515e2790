"""Train the bundled example: a small timm ViT on scikit-learn's digits.

Run from the repository root::

    python examples/train_digits_vit.py

Writes
  examples/digits_vit.pt              vitedge checkpoint (family "timm", weights_only-loadable)
  examples/digits_vit.json            what was trained and its FP32 top-1 on the val PNGs
  calibration/digits/calib/<class>/<index>.png   200 held-out calibration images
  calibration/digits/val/<class>/<index>.png     397 held-out validation images

Inputs go through vitedge's own preprocessing (``vitedge.bundle.preprocess.preprocess_image``),
so the model sees at training time exactly what vitedge feeds it at calibration,
validation and deployment time. The reported top-1 is measured by reloading the saved
checkpoint and running it on the PNGs as read back from disk.

The helpers here are reused by ``train_postnorm_vit.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import sys
import time
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning: on a shared 2-core box spinning
# threads slowed training 2-3x. Scheduling only; the numbers do not change.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
for _p in (str(REPO), str(EXAMPLES)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import digits_data  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from PIL import Image  # noqa: E402

from vitedge.bundle.preprocess import image_to_uint8, preprocess_image  # noqa: E402
from vitedge.bundle.spec import Preprocess  # noqa: E402

SEED = 0
NUM_THREADS = 2  # fixed: float reductions may split differently with another count
CALIB_DIR = REPO / "calibration" / "digits" / "calib"
VAL_DIR = REPO / "calibration" / "digits" / "val"

MODEL_KWARGS = {
    "img_size": 32,
    "patch_size": 4,
    "embed_dim": 96,
    "depth": 6,
    "num_heads": 3,
    "mlp_ratio": 4.0,
    "num_classes": 10,
}
CKPT = EXAMPLES / "digits_vit.pt"
REPORT = EXAMPLES / "digits_vit.json"

# Training hyper-parameters (chosen on the 200 calibration images, never on val).
EPOCHS = 40
BATCH = 64
LR = 1.5e-3
WEIGHT_DECAY = 0.05
WARMUP_EPOCHS = 3
LABEL_SMOOTHING = 0.1
DROP_PATH = 0.1  # training-only regulariser; not part of the saved architecture kwargs


# ---------------------------------------------------------------------- shared helpers
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(NUM_THREADS)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))


def dataset_preprocess(train_images: list[Image.Image]) -> Preprocess:
    """Preprocess at 32x32 with the per-channel mean/std of the training images at 32x32."""
    base = Preprocess(crop_size=(32, 32), crop_pct=1.0, interpolation="bilinear", mean=(0.0,) * 3, std=(1.0,) * 3)
    pix = np.stack([image_to_uint8(im, base) for im in train_images]).astype(np.float64) / 255.0
    mean = tuple(round(float(v), 3) for v in pix.mean(axis=(0, 1, 2)))
    std = tuple(round(float(v), 3) for v in pix.std(axis=(0, 1, 2)))
    return Preprocess(crop_size=(32, 32), crop_pct=1.0, interpolation="bilinear", mean=mean, std=std)


def augment(img: Image.Image, rng: np.random.Generator) -> Image.Image:
    """A modest random affine on the 64x64 image: shift <= 3 px (1.5 px at 32x32),
    rotation <= 10 degrees, scale 0.9..1.1. Black fill, like the digits' background."""
    w, h = img.size
    angle = math.radians(rng.uniform(-10.0, 10.0))
    scale = rng.uniform(0.9, 1.1)
    tx, ty = rng.uniform(-3.0, 3.0, size=2)
    # Inverse map (output -> input) about the centre, as Image.transform expects.
    cx, cy = w / 2.0, h / 2.0
    cos, sin = math.cos(angle) / scale, math.sin(angle) / scale
    a, b = cos, sin
    d, e = -sin, cos
    c = cx - a * (cx + tx) - b * (cy + ty)
    f = cy - d * (cx + tx) - e * (cy + ty)
    return img.transform((w, h), Image.Transform.AFFINE, (a, b, c, d, e, f), resample=Image.Resampling.BILINEAR)


def batch_inputs(images: list[Image.Image], pre: Preprocess) -> torch.Tensor:
    return torch.from_numpy(np.stack([preprocess_image(im, pre) for im in images]))


def train(
    model: torch.nn.Module,
    images: list[Image.Image],
    labels: np.ndarray,
    pre: Preprocess,
    *,
    epochs: int,
    seed: int,
    lr: float = LR,
    weight_decay: float = WEIGHT_DECAY,
    batch: int = BATCH,
    warmup_epochs: int = WARMUP_EPOCHS,
    label_smoothing: float = LABEL_SMOOTHING,
    monitor: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> float:
    """AdamW, linear warm-up then cosine decay (per step), label smoothing. Returns seconds."""
    rng = np.random.default_rng(seed)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim <= 1 or name.endswith(("pos_embed", "cls_token", "pos", "cls")) else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=lr
    )
    n = len(images)
    steps_per_epoch = math.ceil(n / batch)
    total, warm = epochs * steps_per_epoch, warmup_epochs * steps_per_epoch

    def lr_at(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, total - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    y_all = torch.from_numpy(labels.astype(np.int64))
    t0 = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        x_all = batch_inputs([augment(im, rng) for im in images], pre)
        order = torch.from_numpy(rng.permutation(n))
        loss_sum = 0.0
        for i in range(0, n, batch):
            idx = order[i : i + batch]
            loss = F.cross_entropy(model(x_all[idx]), y_all[idx], label_smoothing=label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            loss_sum += loss.item() * len(idx)
        msg = f"epoch {epoch + 1:3d}/{epochs}  loss {loss_sum / n:.4f}  {time.perf_counter() - t0:6.1f}s"
        if monitor is not None and ((epoch + 1) % 5 == 0 or epoch + 1 == epochs):
            msg += f"  calib top-1 {top1(model, *monitor):.4f}"
        print(msg, flush=True)
    return time.perf_counter() - t0


@torch.no_grad()
def top1(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    pred = torch.cat([model(x[i : i + 256]).argmax(1) for i in range(0, len(x), 256)])
    return float((pred == y).float().mean())


def write_pngs(images: list[Image.Image], labels: np.ndarray, indices: np.ndarray, folder: Path) -> None:
    """<folder>/<class>/<sklearn index, 4 digits>.png, replacing whatever was there."""
    if folder.exists():
        shutil.rmtree(folder)
    for i in indices:
        out = folder / digits_data.CLASS_NAMES[int(labels[i])] / f"{int(i):04d}.png"
        out.parent.mkdir(parents=True, exist_ok=True)
        images[int(i)].save(out)


def load_png_folder(folder: Path, pre: Preprocess, class_names: list[str]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The PNGs under <folder>/<class>/ through vitedge preprocessing, with labels."""
    xs, ys = [], []
    for ci, cname in enumerate(class_names):
        for png in sorted((folder / cname).glob("*.png")):
            with Image.open(png) as im:
                xs.append(preprocess_image(im, pre))
            ys.append(ci)
    return torch.from_numpy(np.stack(xs)), torch.tensor(ys), len(ys)


def versions() -> dict[str, str]:
    import timm

    return {"torch": torch.__version__, "timm": timm.__version__, "numpy": np.__version__, "python": platform.python_version()}


def write_json(path: Path, facts: dict) -> None:
    path.write_text(json.dumps(facts, indent=2) + "\n")


def rel(p: Path) -> str:
    return str(p.resolve().relative_to(REPO))


# ----------------------------------------------------------------------------- main
def build_model(**extra):
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(**MODEL_KWARGS, **extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()

    seed_everything(args.seed)
    images, labels, split = digits_data.load()
    train_imgs = [images[i] for i in split.train]
    pre = dataset_preprocess(train_imgs)
    print("preprocess:", pre.to_dict())

    # Held-out images as PNGs: the calibration set and the validation set vitedge uses.
    write_pngs(images, labels, split.calib, CALIB_DIR)
    write_pngs(images, labels, split.val, VAL_DIR)

    model = build_model(drop_path_rate=DROP_PATH)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"timm VisionTransformer {MODEL_KWARGS}: {num_params} parameters")
    calib_x, calib_y, _ = load_png_folder(CALIB_DIR, pre, digits_data.CLASS_NAMES)
    wall = train(model, train_imgs, labels[split.train], pre, epochs=args.epochs, seed=args.seed, monitor=(calib_x, calib_y))

    from vitedge.models.checkpoint import save_checkpoint

    save_checkpoint(
        CKPT,
        model.state_dict(),
        family="timm",
        model_kwargs=MODEL_KWARGS,
        preprocess=pre.to_dict(),
        class_names=digits_data.CLASS_NAMES,
    )

    # Reload what was written and measure it on the PNGs as read back from disk.
    ckpt = torch.load(CKPT, map_location="cpu", weights_only=True)
    meta = ckpt["vitedge"]
    reloaded = build_model()
    reloaded.load_state_dict(ckpt["state_dict"])
    pre_file = Preprocess.from_dict(meta["preprocess"])
    val_x, val_y, n_val = load_png_folder(VAL_DIR, pre_file, meta["class_names"])
    cal_x, cal_y, n_cal = load_png_folder(CALIB_DIR, pre_file, meta["class_names"])
    val_top1, cal_top1 = top1(reloaded, val_x, val_y), top1(reloaded, cal_x, cal_y)
    print(f"FP32 top-1: val {val_top1:.4f} ({n_val} images), calib {cal_top1:.4f} ({n_cal} images)")

    write_json(
        REPORT,
        {
            "model": "timm.models.vision_transformer.VisionTransformer",
            "checkpoint": rel(CKPT),
            "checkpoint_bytes": CKPT.stat().st_size,
            "model_kwargs": MODEL_KWARGS,
            "num_params": num_params,
            "preprocess": pre_file.to_dict(),
            "class_names": meta["class_names"],
            "fp32_top1_val": round(val_top1, 4),
            "val_images": n_val,
            "val_dir": rel(VAL_DIR),
            "fp32_top1_calib": round(cal_top1, 4),
            "calib_images": n_cal,
            "calib_dir": rel(CALIB_DIR),
            "train_images": len(train_imgs),
            "split_seed": digits_data.SEED,
            "seed": args.seed,
            "epochs": args.epochs,
            "training": {
                "optimizer": "AdamW",
                "lr": LR,
                "weight_decay": WEIGHT_DECAY,
                "batch_size": BATCH,
                "schedule": f"linear warm-up {WARMUP_EPOCHS} epochs, then cosine to 0",
                "label_smoothing": LABEL_SMOOTHING,
                "drop_path_rate": DROP_PATH,
                "augmentation": "random affine on the 64x64 image: shift <=3 px, rotate <=10 deg, scale 0.9-1.1",
                "torch_threads": NUM_THREADS,
            },
            "train_wall_time_s": round(wall, 1),
            "versions": versions(),
            "script": "examples/train_digits_vit.py",
        },
    )
    print(f"wrote {rel(CKPT)} ({CKPT.stat().st_size} bytes), {rel(REPORT)}")


if __name__ == "__main__":
    main()
