"""Train the ``--model-class`` example: ``examples/postnorm_vit.py:PostNormViT`` on digits.

Run from the repository root, after ``examples/train_digits_vit.py`` has written the
PNGs under ``calibration/digits/`` (this script reads them, never writes them)::

    python examples/train_postnorm_vit.py

Same split, same vitedge preprocessing (same mean/std) and same determinism as the
timm example. Writes a PLAIN state_dict, ``examples/postnorm_vit.pt`` (no vitedge
metadata: the class and its ``pretrained_cfg`` are what vitedge has to go on), and
``examples/postnorm_vit.json`` with the FP32 top-1 of the reloaded weights on the val
PNGs as read back from disk.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning: on a shared 2-core box spinning
# threads slowed training 2-3x. Scheduling only; the numbers do not change.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
_EXAMPLES = Path(__file__).resolve().parent
for _p in (str(_EXAMPLES.parent), str(_EXAMPLES)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import digits_data  # noqa: E402
import torch  # noqa: E402
import train_digits_vit as common  # noqa: E402
from postnorm_vit import PostNormViT  # noqa: E402

from vitedge.bundle.spec import Preprocess  # noqa: E402

MODEL_KWARGS = {
    "image_size": 32,
    "patch_size": 4,
    "dim": 128,
    "depth": 4,
    "heads": 4,
    "mlp_dim": 256,
    "num_classes": 10,
}
WEIGHTS = common.EXAMPLES / "postnorm_vit.pt"
REPORT = common.EXAMPLES / "postnorm_vit.json"

# Chosen on the 200 calibration images, never on val.
EPOCHS = 35
BATCH = 64
LR = 1e-3
WEIGHT_DECAY = 0.05
WARMUP_EPOCHS = 5
LABEL_SMOOTHING = 0.1
DROPOUT = 0.1  # training-only; the class default (0.0) is what vitedge instantiates


def preprocess_from_class() -> Preprocess:
    cfg = PostNormViT.pretrained_cfg
    _, h, w = cfg["input_size"]
    return Preprocess(
        crop_size=(h, w),
        crop_pct=float(cfg["crop_pct"]),
        interpolation=cfg["interpolation"],
        mean=tuple(cfg["mean"]),
        std=tuple(cfg["std"]),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--seed", type=int, default=common.SEED)
    args = ap.parse_args()

    common.seed_everything(args.seed)
    images, labels, split = digits_data.load()
    train_imgs = [images[i] for i in split.train]

    # One preprocessing for both examples: the class's pretrained_cfg must equal the
    # training-set statistics, and the timm example's checkpoint if it is there.
    pre = preprocess_from_class()
    measured = common.dataset_preprocess(train_imgs)
    if pre != measured:
        raise SystemExit(f"PostNormViT.pretrained_cfg {pre} != training-set statistics {measured}")
    if common.CKPT.exists():
        other = torch.load(common.CKPT, map_location="cpu", weights_only=True)["vitedge"]["preprocess"]
        if Preprocess.from_dict(other) != pre:
            raise SystemExit(f"preprocess differs from {common.rel(common.CKPT)}: {other} vs {pre.to_dict()}")
    print("preprocess:", pre.to_dict())

    for folder, n in ((common.CALIB_DIR, digits_data.NUM_CALIB), (common.VAL_DIR, digits_data.NUM_VAL)):
        found = len(list(folder.glob("*/*.png")))
        if found != n:
            raise SystemExit(f"{common.rel(folder)} has {found} PNGs, expected {n}: run examples/train_digits_vit.py first")

    model = PostNormViT(**MODEL_KWARGS, dropout=DROPOUT)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"PostNormViT {MODEL_KWARGS}: {num_params} parameters")
    calib_x, calib_y, _ = common.load_png_folder(common.CALIB_DIR, pre, digits_data.CLASS_NAMES)
    wall = common.train(
        model,
        train_imgs,
        labels[split.train],
        pre,
        epochs=args.epochs,
        seed=args.seed,
        lr=LR,
        weight_decay=WEIGHT_DECAY,
        batch=BATCH,
        warmup_epochs=WARMUP_EPOCHS,
        label_smoothing=LABEL_SMOOTHING,
        monitor=(calib_x, calib_y),
    )

    from vitedge.files.atomic import atomic_write_path

    with atomic_write_path(WEIGHTS) as tmp:
        torch.save({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, tmp)

    # Reload the plain state_dict into a default-constructed class, as --model-class would.
    reloaded = PostNormViT()
    reloaded.load_state_dict(torch.load(WEIGHTS, map_location="cpu", weights_only=True))
    val_x, val_y, n_val = common.load_png_folder(common.VAL_DIR, pre, digits_data.CLASS_NAMES)
    cal_x, cal_y, n_cal = common.load_png_folder(common.CALIB_DIR, pre, digits_data.CLASS_NAMES)
    val_top1, cal_top1 = common.top1(reloaded, val_x, val_y), common.top1(reloaded, cal_x, cal_y)
    print(f"FP32 top-1: val {val_top1:.4f} ({n_val} images), calib {cal_top1:.4f} ({n_cal} images)")

    common.write_json(
        REPORT,
        {
            "model": "examples/postnorm_vit.py:PostNormViT",
            "checkpoint": common.rel(WEIGHTS),
            "checkpoint_format": "plain state_dict",
            "checkpoint_bytes": WEIGHTS.stat().st_size,
            "model_kwargs": MODEL_KWARGS,
            "num_params": num_params,
            "preprocess": pre.to_dict(),
            "class_names": digits_data.CLASS_NAMES,
            "fp32_top1_val": round(val_top1, 4),
            "val_images": n_val,
            "val_dir": common.rel(common.VAL_DIR),
            "fp32_top1_calib": round(cal_top1, 4),
            "calib_images": n_cal,
            "calib_dir": common.rel(common.CALIB_DIR),
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
                "dropout": DROPOUT,
                "augmentation": "random affine on the 64x64 image: shift <=3 px, rotate <=10 deg, scale 0.9-1.1",
                "torch_threads": common.NUM_THREADS,
            },
            "train_wall_time_s": round(wall, 1),
            "versions": common.versions(),
            "script": "examples/train_postnorm_vit.py",
        },
    )
    print(f"wrote {common.rel(WEIGHTS)} ({WEIGHTS.stat().st_size} bytes), {common.rel(REPORT)}")


if __name__ == "__main__":
    main()
