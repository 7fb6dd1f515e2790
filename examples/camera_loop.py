"""Run a vitedge bundle on every frame of a video file or a camera, the way a camera app would.

Overlays the top-1 label, its probability and the FPS on each frame, outlines the
centre region the model actually sees (the bundle's resize + centre crop), and can
write the annotated video. Headless by default: no window unless --show.

    python examples/make_demo_video.py                       # a demo video from real digit images
    vitedge build examples/digits_vit.pt --target intel-cpu --calib calibration/digits/calib -o build/intel-cpu
    python examples/camera_loop.py build/intel-cpu --source examples/digits_demo.mp4 --out annotated.mp4
    python examples/camera_loop.py build/intel-cpu --source 0 --show          # camera 0

Needs only the runtime: pip install 'vitedge-runtime[openvino,video]' (or the full vitedge).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

CODECS = {".mp4": "mp4v", ".avi": "MJPG"}
DEMO = Path(__file__).resolve().parent / "digits_demo.mp4"


def crop_box(width: int, height: int, model) -> tuple[int, int, int, int]:
    """The frame region (x0, y0, x1, y1) the model sees after the bundle's resize + centre crop."""
    pre = model.preprocessing
    (crop_h, crop_w), (target_h, target_w) = pre.crop_size, pre.resize_size
    scale = max(target_h / height, target_w / width)
    w, h = crop_w / scale, crop_h / scale
    return int(round((width - w) / 2)), int(round((height - h) / 2)), int(round((width + w) / 2)), int(round((height + h) / 2))


def annotate(cv2, frame: np.ndarray, text: str, fps_text: str, box: tuple[int, int, int, int]) -> np.ndarray:
    out = frame.copy()
    cv2.rectangle(out, box[:2], (box[2] - 1, box[3] - 1), (0, 200, 255), 1)
    h, w = out.shape[:2]
    bar = max(22, h // 10)
    out[:bar] = (out[:bar] * 0.35).astype(np.uint8)  # darken a strip for legible text
    scale = bar / 40
    cv2.putText(out, text, (6, int(bar * 0.72)), cv2.FONT_HERSHEY_SIMPLEX, scale, (60, 255, 60), max(1, bar // 20), cv2.LINE_AA)
    (tw, _), _ = cv2.getTextSize(fps_text, cv2.FONT_HERSHEY_SIMPLEX, scale * 0.8, 1)
    cv2.putText(out, fps_text, (w - tw - 6, int(bar * 0.72)), cv2.FONT_HERSHEY_SIMPLEX, scale * 0.8, (255, 255, 255), 1, cv2.LINE_AA)
    return out


def open_source(cv2, source: str):
    cap = cv2.VideoCapture(int(source)) if source.isdigit() else cv2.VideoCapture(source)
    if not cap.isOpened():
        what = f"camera {source}" if source.isdigit() else f"video file {source}"
        raise SystemExit(f"camera_loop: cannot open {what}")
    return cap


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run a vitedge bundle on a video file or camera, with a label + FPS overlay.")
    ap.add_argument("bundle", type=Path, help="a built bundle folder (vitedge build ... -o BUNDLE)")
    ap.add_argument("--source", default=str(DEMO), help="video file, or a camera index such as 0 (default: the demo video)")
    ap.add_argument("--out", type=Path, help="write the annotated video here (.mp4 or .avi)")
    ap.add_argument("--max-frames", type=int, default=0, help="stop after N frames (0: until the source ends)")
    ap.add_argument("--show", action="store_true", help="show a window (needs a display and opencv-python, not -headless)")
    ap.add_argument("--top-k", type=int, default=3)
    ap.add_argument("--snapshot", type=Path, help="save one annotated frame as an image (PNG/JPEG)")
    ap.add_argument("--snapshot-at", type=int, default=0, help="index of the frame --snapshot saves (default 0)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for the backend (default: the bundle's)")
    ap.add_argument("--no-verify", action="store_true", help="skip the bundle's sha256 check on load")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every frame's top-k")
    args = ap.parse_args(argv)

    try:
        import cv2
    except ImportError:
        print("camera_loop: OpenCV is not installed; pip install opencv-python-headless", file=sys.stderr)
        return 2
    from vitedge.core.errors import VitedgeError
    from vitedge.runtime import load

    try:
        model = load(args.bundle, verify=not args.no_verify, threads=args.threads)
    except VitedgeError as err:
        print(f"camera_loop: {err}", file=sys.stderr)
        return 2
    cap = open_source(cv2, args.source)
    writer = None
    fps_in = cap.get(cv2.CAP_PROP_FPS) or 30.0
    labels: list[str] = []
    fps = None
    infer_ms = []
    start = time.perf_counter()
    try:
        while not args.max_frames or len(labels) < args.max_frames:
            ok, frame = cap.read()
            if not ok:
                break
            t0 = time.perf_counter()
            pred = model.predict(frame, top_k=args.top_k, color="bgr")  # OpenCV frames are BGR
            dt = time.perf_counter() - t0
            infer_ms.append(dt * 1e3)
            fps = 1.0 / dt if fps is None else 0.9 * fps + 0.1 / dt  # smoothed predict rate
            labels.append(pred.label)
            if args.verbose:
                print(len(labels) - 1, " ".join(f"{n}:{p:.3f}" for n, p in zip(pred.names or pred.indices, pred.probs)))
            h, w = frame.shape[:2]
            shown = annotate(cv2, frame, f"{pred.label}  {100 * pred.prob:.1f}%", f"{fps:.0f} FPS", crop_box(w, h, model))
            if args.snapshot and len(labels) - 1 == args.snapshot_at:
                cv2.imwrite(str(args.snapshot), shown)
            if args.out is not None:
                if writer is None:
                    codec = CODECS.get(args.out.suffix.lower(), "mp4v")
                    writer = cv2.VideoWriter(str(args.out), cv2.VideoWriter_fourcc(*codec), fps_in, (w, h))
                writer.write(shown)
            if args.show:
                cv2.imshow("vitedge", shown)
                if cv2.waitKey(1) & 0xFF in (27, ord("q")):
                    break
    finally:
        cap.release()
        if writer is not None:
            writer.release()
        if args.show:
            cv2.destroyAllWindows()
        model.close()
    wall = time.perf_counter() - start
    if not labels:
        print("camera_loop: no frames read", file=sys.stderr)
        return 1
    runs = []
    for label in labels:  # run-length summary: what was seen, in order
        if runs and runs[-1][0] == label:
            runs[-1][1] += 1
        else:
            runs.append([label, 1])
    print(f"{len(labels)} frames in {wall:.2f} s ({len(labels) / wall:.1f} FPS end to end); "
          f"predict median {np.median(infer_ms):.2f} ms ({model.backend}, {args.bundle})")
    print("top-1 in order: " + ", ".join(f"{lab} x{n}" for lab, n in runs))
    print("top-1 counts: " + ", ".join(f"{lab}: {n}" for lab, n in sorted(Counter(labels).items())))
    if args.out is not None:
        print(f"annotated video: {args.out}")
    if args.snapshot:
        print(f"snapshot: {args.snapshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
