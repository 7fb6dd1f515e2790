"""Special files never hang or exhaust a run: FIFOs and device symlinks in calibration folders, as
--calib, or as the model are refused or skipped at once (each test would block forever before)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vitedge.datasources.sources import open_source
from vitedge.core.errors import CalibrationError, ModelLoadError
from vitedge.models.formats import read_model_file
from vitedge.files.safefile import FileTooLarge, read_bounded
from vitedge.bundle.spec import Preprocess

REPO = Path(__file__).resolve().parents[2]
CALIB = REPO / "calibration" / "digits" / "calib"
PRE = Preprocess(crop_size=(32, 32), crop_pct=1.0, interpolation="bilinear", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


@pytest.fixture
def images(tmp_path) -> Path:
    folder = tmp_path / "cal"
    folder.mkdir()
    for src in sorted(p for p in CALIB.rglob("*") if p.is_file())[:20]:
        shutil.copyfile(src, folder / src.name)
    return folder


def test_fifo_and_dev_zero_in_an_image_folder_are_skipped(images):
    os.mkfifo(images / "zz.jpg")
    (images / "zz.png").symlink_to("/dev/zero")
    source = open_source(images, PRE, min_count=16)
    assert len(source) == 20
    # the link to /dev/zero leaves the data folder, so it is not even opened (vitedge.datasources.images.scan_images)
    assert source.summary.skipped == {"not a regular file (FIFO, device or socket)": 1, "a symlink out of the data folder": 1}
    assert next(iter(source.batches(4))).images.shape == (4, 3, 32, 32)


@pytest.mark.parametrize("name", ["x.npy", "clip.mp4", "x.npz"])
def test_fifo_given_as_calib_is_refused(tmp_path, name):
    fifo = tmp_path / name
    os.mkfifo(fifo)
    with pytest.raises(CalibrationError, match="not a regular file"):
        open_source(fifo, PRE)
    dev = tmp_path / ("dev-" + name)
    dev.symlink_to("/dev/zero")
    with pytest.raises(CalibrationError, match="character device"):
        open_source(dev, PRE)


def test_model_fifo_or_device_is_refused(tmp_path):
    fifo = tmp_path / "model.pt"
    os.mkfifo(fifo)
    with pytest.raises(ModelLoadError, match="FIFO"):
        read_model_file(fifo)
    dev = tmp_path / "model.pt2"
    dev.symlink_to("/dev/zero")
    with pytest.raises(ModelLoadError, match="character device"):
        read_model_file(dev)


def test_size_bound(tmp_path):
    big = tmp_path / "big.jpg"
    big.write_bytes(b"\xff" * 2048)
    with pytest.raises(FileTooLarge):
        read_bounded(big, 1024)
    assert read_bounded(big, 4096) == b"\xff" * 2048


def test_cli_build_with_fifo_calib_exits_2_at_once(tmp_path):
    fifo = tmp_path / "x.npy"
    os.mkfifo(fifo)
    r = subprocess.run([sys.executable, "-m", "vitedge", "build", str(REPO / "examples" / "digits_vit.pt"), "--target", "onnx",
                        "--calib", str(fifo), "-o", str(tmp_path / "b")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "not a regular file" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "b").exists()
