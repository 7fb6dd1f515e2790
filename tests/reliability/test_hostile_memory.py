"""Memory bounded before it is spent (docs/reliability.md, "Hostile inputs, third round"): an image's resized size is
checked from its header before it is converted or resized (a 1x1,000,000-pixel PNG of 4 KB resized to 36x36,000,000
pixels, 5.3 GB, to cover a 32-pixel crop), the centre-crop fraction has a floor (the resize side is crop / crop_pct),
and a .npz member's header is read whatever its .npy format version before it is unpacked."""

from __future__ import annotations

import io
import json
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import CALIB_DIR, EXAMPLES
from PIL import Image
from rel_cli import assert_one_line, cli, snapshot

from vitedge.core import limits
from vitedge.core.errors import BundleError
from vitedge.runtime import FrameError, load

MODEL = EXAMPLES / "digits_vit.pt"

THIN = [(1, 1_000_000), (1_000_000, 1), (2, 600_000), (40_000, 1)]


def _calibrate(tmp_path: Path, calib: Path, *extra) -> list:
    return ["calibrate", MODEL, "--calib", calib, "-o", tmp_path / "m.onnx", "--cache-dir", tmp_path / "cache", *extra]


@pytest.mark.parametrize("size", THIN, ids=[f"{w}x{h}" for w, h in THIN])
def test_a_folder_of_thin_images_is_refused_before_resizing(tmp_path, size):
    data = tmp_path / "calib"
    (data / "0").mkdir(parents=True)
    for i in range(3):
        Image.new("L", size, i * 40).save(data / "0" / f"{i}.png")
    before = snapshot(data)
    run = cli(*_calibrate(tmp_path, data))
    assert_one_line(run, 2, "too thin", f"{limits.MAX_RESIZED_PIXELS >> 20} megapixels")
    assert snapshot(data) == before and sorted(p.name for p in tmp_path.iterdir()) == ["calib"]


def test_one_thin_image_among_good_ones_is_left_out_and_counted(tmp_path):
    """The datasource skips it with its reason (as it does a corrupt file) and reads the others."""
    from vitedge.datasources.base import SourceRequest
    from vitedge.datasources.images import open_image_folder
    from vitedge.bundle.spec import Preprocess

    root = tmp_path / "calib"
    shutil.copytree(CALIB_DIR / "0", root / "0")
    Image.new("RGB", (1, 1_000_000)).save(root / "0" / "zz_strip.png")
    pre = Preprocess(crop_size=(32, 32), crop_pct=1.0, interpolation="bilinear", mean=(0.5,) * 3, std=(0.5,) * 3)
    source = open_image_folder(root, pre, SourceRequest(path_text=str(root), limit=None, seed=0, min_count=1, progress=False), None)
    assert any("too thin" in reason for reason in source.summary.skipped), source.summary.skipped
    assert source.summary.found == len(list((CALIB_DIR / "0").glob("*.png"))) + 1


@pytest.mark.parametrize("shape", [(2, 1, 400_000, 3), (2, 300_000, 2, 3)], ids=["wide", "tall"])
def test_thin_array_frames_are_refused(tmp_path, shape):
    path = tmp_path / "frames.npy"
    np.save(path, np.zeros(shape, np.uint8))
    run = cli(*_calibrate(tmp_path, path))
    assert_one_line(run, 2, "frames.npy", "would resize", "megapixel bound")
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("shape", [(1, 1, 1_000_000, 3), (3, 500_000, 1, 3)], ids=["wide", "tall"])
def test_the_runtime_refuses_a_thin_frame(runtime_bundles, shape):
    with load(runtime_bundles["plain"]["onnx"], warmup=0) as model:
        with pytest.raises(FrameError, match="would resize to .* over the 16-megapixel bound"):
            model.predict(np.zeros(shape, np.uint8) if shape[0] > 1 else np.zeros(shape[1:], np.uint8))


# ---- the centre-crop fraction ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("pct", ["0.01", "0.1", "0.2499", "1e-9"])
def test_a_tiny_crop_pct_flag_is_refused(tmp_path, pct):
    run = cli(*_calibrate(tmp_path, CALIB_DIR, "--crop-pct", pct))
    assert_one_line(run, 2, "--crop-pct", f"[{limits.MIN_CROP_PCT:g}, 1]")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("pct", [0.01, 0.2, 0.0])
def test_a_tiny_crop_pct_in_the_checkpoint_is_refused(tmp_path, pct):
    import torch

    obj = torch.load(MODEL, weights_only=True)
    obj["vitedge"]["preprocess"]["crop_pct"] = pct
    model = tmp_path / "m.pt"
    torch.save(obj, model)
    run = cli("inspect", model)
    assert_one_line(run, 2, f"crop_pct {pct!r} is not in [0.25, 1]", "--crop-pct")


def test_a_tiny_crop_pct_in_a_manifest_is_refused(runtime_bundles, tmp_path):
    bundle = tmp_path / "b"
    shutil.copytree(runtime_bundles["plain"]["onnx"], bundle)
    data = json.loads((bundle / "manifest.json").read_text())
    data["model"]["spec"]["preprocess"]["crop_pct"] = 0.05
    (bundle / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(BundleError, match=r"manifest.json.*crop_pct 0.05 is not in"):
        load(bundle)


# ---- .npz headers of every format version ---------------------------------------------------------------------------

def _npz_member(version: tuple[int, int], shape: tuple[int, ...], payload: bytes = b"") -> bytes:
    header = repr({"descr": "|u1", "fortran_order": False, "shape": shape}).encode("latin1")
    prefix = b"\x93NUMPY" + bytes(version)
    pad = (64 - (len(prefix) + 4 + len(header) + 1) % 64) % 64
    header += b" " * pad + b"\n"
    return prefix + struct.pack("<I", len(header)) + header + payload


def _npz(path: Path, member: bytes) -> Path:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("images.npy", member)
    path.write_bytes(buf.getvalue())
    return path


@pytest.mark.parametrize("version", [(2, 0), (3, 0)])
def test_npz_header_claiming_terabytes_is_refused_in_every_version(tmp_path, version):
    """Format 3.0 skipped the check: np.load would then allocate what the header claims."""
    path = _npz(tmp_path / "bomb.npz", _npz_member(version, (1_000_000, 1000, 1000, 3)))
    run = cli(*_calibrate(tmp_path, path))
    assert_one_line(run, 2, "bomb.npz", "unpacks to", "GiB")
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("version", [(4, 0), (9, 9)])
def test_npz_of_an_unknown_format_version_is_refused(tmp_path, version):
    path = _npz(tmp_path / "future.npz", _npz_member(version, (2, 32, 32, 3), bytes(2 * 32 * 32 * 3)))
    run = cli(*_calibrate(tmp_path, path))
    assert_one_line(run, 2, "future.npz", "format")
    assert not (tmp_path / "m.onnx").exists()


def test_npz_of_format_3_with_frames_still_reads(tmp_path):
    """A 3.0 member of a sane size is read as before."""
    from vitedge.datasources.arrays import _load

    frames = np.random.default_rng(0).integers(0, 255, (4, 32, 32, 3), dtype=np.uint8)
    path = _npz(tmp_path / "v3.npz", _npz_member((3, 0), frames.shape, frames.tobytes()))
    images, labels = _load(path, str(path))
    assert np.array_equal(images, frames) and labels is None


@pytest.mark.parametrize("shortest_edge", [10000, 0, "x"])
def test_a_hugging_face_crop_ratio_past_the_floor_is_one_line(tmp_path, shortest_edge):
    from vitedge.core.errors import ModelLoadError
    from vitedge.models.hf import read_preprocess

    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"do_center_crop": True, "size": {"shortest_edge": shortest_edge},
                                                                   "crop_size": {"height": 224}}))
    with pytest.raises(ModelLoadError, match="its preprocessing does not fit") as err:
        read_preprocess(tmp_path, (224, 224))
    assert "\n" not in str(err.value)
