"""Train the 1-channel example: ``examples/gray_vit.py:GrayViT`` on digits as grayscale.

Run from the repository root, after ``examples/train_digits_vit.py`` has written the
PNGs under ``calibration/digits/`` (this script reads them, never writes them)::

    python examples/train_gray_digits_vit.py

Same split and determinism as the RGB examples, but the model takes ONE channel: the
preprocessing has ``channels=1``, so vitedge (and this script, through
``vitedge.bundle.preprocess``) converts every image to Pillow "L" before resizing. Writes
``examples/gray_digits_vit.pt`` (a vitedge checkpoint: state_dict, the class's kwargs
and the 1-channel preprocessing; load it with ``--model-class examples/gray_vit.py:GrayViT``)
and ``examples/gray_digits_vit.json`` with the FP32 top-1 of the reloaded weights on the
val PNGs as read back from disk.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
_EXAMPLES = Path(__file__).resolve().parent
for _p in (str(_EXAMPLES.parent), str(_EXAMPLES)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import digits_data  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import train_digits_vit as common  # noqa: E402
from gray_vit import GrayViT  # noqa: E402

from vitedge.bundle.preprocess import image_to_uint8  # noqa: E402
from vitedge.bundle.spec import Preprocess  # noqa: E402

MODEL_KWARGS = {
    "image_size": 32,
    "patch_size": 4,
    "dim": 64,
    "depth": 4,
    "heads": 4,
    "mlp_dim": 128,
    "num_classes": 10,
    "channels": 1,
}
CKPT = common.EXAMPLES / "gray_digits_vit.pt"
REPORT = common.EXAMPLES / "gray_digits_vit.json"

# Chosen on the 200 calibration images, never on val.
EPOCHS = 30
LR = 2e-3
DROPOUT = 0.1  # training-only; the class default (0.0) is what vitedge instantiates


def gray_preprocess(train_images) -> Preprocess:
    """32x32, bilinear, no crop; mean/std of the training images as grey ("L") at 32x32."""
    base = Preprocess(crop_size=(32, 32), crop_pct=1.0, interpolation="bilinear", mean=(0.0,), std=(1.0,), channels=1)
    pix = np.stack([image_to_uint8(im, base) for im in train_images]).astype(np.float64) / 255.0
    return Preprocess(crop_size=(32, 32), crop_pct=1.0, interpolation="bilinear",
                      mean=(round(float(pix.mean()), 3),), std=(round(float(pix.std()), 3),), channels=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    ap.add_argument("--seed", type=int, default=common.SEED)
    args = ap.parse_args()

    common.seed_everything(args.seed)
    images, labels, split = digits_data.load()
    train_imgs = [images[i] for i in split.train]
    pre = gray_preprocess(train_imgs)
    print("preprocess:", pre.to_dict())
    for folder, n in ((common.CALIB_DIR, digits_data.NUM_CALIB), (common.VAL_DIR, digits_data.NUM_VAL)):
        found = len(list(folder.glob("*/*.png")))
        if found != n:
            raise SystemExit(f"{common.rel(folder)} has {found} PNGs, expected {n}: run examples/train_digits_vit.py first")

    model = GrayViT(**MODEL_KWARGS, dropout=DROPOUT)
    num_params = sum(p.numel() for p in model.parameters())
    print(f"GrayViT {MODEL_KWARGS}: {num_params} parameters")
    calib_x, calib_y, _ = common.load_png_folder(common.CALIB_DIR, pre, digits_data.CLASS_NAMES)
    assert calib_x.shape[1] == 1, calib_x.shape
    wall = common.train(model, train_imgs, labels[split.train], pre, epochs=args.epochs, seed=args.seed, lr=LR,
                        monitor=(calib_x, calib_y))

    from vitedge.models.checkpoint import save_checkpoint

    save_checkpoint(CKPT, model.state_dict(), family="custom", model_kwargs=MODEL_KWARGS,
                    preprocess=pre.to_dict(), class_names=digits_data.CLASS_NAMES)

    ckpt = torch.load(CKPT, map_location="cpu", weights_only=True)
    meta = ckpt["vitedge"]
    reloaded = GrayViT(**meta["model_kwargs"])
    reloaded.load_state_dict(ckpt["state_dict"])
    pre_file = Preprocess.from_dict(meta["preprocess"])
    val_x, val_y, n_val = common.load_png_folder(common.VAL_DIR, pre_file, meta["class_names"])
    cal_x, cal_y, n_cal = common.load_png_folder(common.CALIB_DIR, pre_file, meta["class_names"])
    val_top1, cal_top1 = common.top1(reloaded, val_x, val_y), common.top1(reloaded, cal_x, cal_y)
    print(f"FP32 top-1: val {val_top1:.4f} ({n_val} images), calib {cal_top1:.4f} ({n_cal} images)")

    common.write_json(REPORT, {
        "model": "examples/gray_vit.py:GrayViT",
        "checkpoint": common.rel(CKPT),
        "checkpoint_bytes": CKPT.stat().st_size,
        "model_kwargs": MODEL_KWARGS,
        "num_params": num_params,
        "preprocess": pre_file.to_dict(),
        "class_names": meta["class_names"],
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
            "optimizer": "AdamW", "lr": LR, "weight_decay": common.WEIGHT_DECAY, "batch_size": common.BATCH,
            "schedule": f"linear warm-up {common.WARMUP_EPOCHS} epochs, then cosine to 0",
            "label_smoothing": common.LABEL_SMOOTHING, "dropout": DROPOUT,
            "augmentation": "random affine on the 64x64 image: shift <=3 px, rotate <=10 deg, scale 0.9-1.1",
            "input": "digits converted to Pillow 'L' (ITU-R 601 luma) by vitedge.bundle.preprocess",
            "torch_threads": common.NUM_THREADS,
        },
        "train_wall_time_s": round(wall, 1),
        "versions": common.versions(),
        "script": "examples/train_gray_digits_vit.py",
    })
    print(f"wrote {common.rel(CKPT)} ({CKPT.stat().st_size} bytes), {common.rel(REPORT)}")


if __name__ == "__main__":
    main()
