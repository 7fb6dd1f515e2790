"""Make the short demo video for examples/camera_loop.py from REAL held-out digit images.

Each class's first held-out PNG (calibration/digits/val/<class>/) is shown for a few
frames on a larger 320x240 canvas, drifting and zooming slightly, so the runtime's
resize + centre crop is exercised on frames that are not the model's input size.
Deterministic; no downloads. Needs OpenCV (pip install opencv-python-headless).

    python examples/make_demo_video.py                 # -> examples/digits_demo.mp4
    python examples/make_demo_video.py -o /tmp/demo.avi --frames-per-digit 20
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
VAL = REPO / "calibration" / "digits" / "val"
CODECS = {".mp4": "mp4v", ".avi": "MJPG"}


def digit_images(val_dir: Path) -> list[tuple[str, Image.Image]]:
    """(class, image) for the first held-out image of each class, in class order."""
    out = []
    for folder in sorted((p for p in val_dir.iterdir() if p.is_dir()), key=lambda p: p.name):
        first = sorted(folder.glob("*.png"))[0]
        out.append((folder.name, Image.open(first).convert("RGB")))
    return out


def render(image: Image.Image, width: int, height: int, t: float) -> np.ndarray:
    """One RGB frame: the digit on a dark canvas, scaled and offset by phase t in [0, 1)."""
    side = int(round(height * (1.0 + 0.05 * math.sin(2 * math.pi * t))))  # slight zoom
    dx = int(round(6 * math.sin(2 * math.pi * t + 0.7)))  # slight drift
    dy = int(round(4 * math.cos(2 * math.pi * t)))
    canvas = Image.new("RGB", (width, height), (12, 12, 12))
    digit = image.resize((side, side), Image.Resampling.BICUBIC)
    canvas.paste(digit, ((width - side) // 2 + dx, (height - side) // 2 + dy))
    return np.asarray(canvas)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", type=Path, default=REPO / "examples" / "digits_demo.mp4", help=".mp4 (mp4v) or .avi (MJPG)")
    ap.add_argument("--val", type=Path, default=VAL, help="held-out digits folder, one subfolder per class")
    ap.add_argument("--frames-per-digit", type=int, default=12)
    ap.add_argument("--fps", type=float, default=12.0)
    ap.add_argument("--size", type=int, nargs=2, default=(320, 240), metavar=("W", "H"))
    args = ap.parse_args(argv)
    try:
        import cv2
    except ImportError:
        print("make_demo_video: OpenCV is not installed; pip install opencv-python-headless", file=sys.stderr)
        return 2
    codec = CODECS.get(args.out.suffix.lower())
    if codec is None:
        print(f"make_demo_video: use a .mp4 or .avi output, not {args.out.suffix!r}", file=sys.stderr)
        return 2
    width, height = args.size
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(f".{args.out.stem}.partial{args.out.suffix}")  # never leave a half-written video
    writer = cv2.VideoWriter(str(tmp), cv2.VideoWriter_fourcc(*codec), args.fps, (width, height))
    if not writer.isOpened():
        print(f"make_demo_video: OpenCV cannot write {codec} video here", file=sys.stderr)
        return 2
    digits = digit_images(args.val)
    try:
        for _, image in digits:
            for i in range(args.frames_per_digit):
                frame = render(image, width, height, i / args.frames_per_digit)
                writer.write(np.ascontiguousarray(frame[..., ::-1]))  # OpenCV writes BGR
    finally:
        writer.release()
    tmp.replace(args.out)
    n = len(digits) * args.frames_per_digit
    print(f"{args.out}: {n} frames, {width}x{height} at {args.fps:g} fps, classes {' '.join(c for c, _ in digits)}, "
          f"{args.out.stat().st_size / 1e3:.0f} kB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
