"""Calibration / validation data sources, on real files written to tmp_path."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitedge.datasources import base as _common
from vitedge.datasources.sources import (
    Batch,
    CalibrationSource,
    SourceSummary,
    open_source,
)
from vitedge.core.errors import CalibrationError, MissingDependencyError, UsageError
from vitedge.bundle.preprocess import preprocess_array, preprocess_image
from vitedge.bundle.spec import Preprocess

PRE = Preprocess(crop_size=(32, 32), crop_pct=0.875, interpolation="bilinear")


def _noise(rng: np.random.Generator, h: int = 40, w: int = 52, c: int | None = 3) -> np.ndarray:
    shape = (h, w, c) if c else (h, w)
    return rng.integers(0, 256, shape, dtype=np.uint8)


def _write_rgb(path: Path, seed: int, fmt: str | None = None, size: tuple[int, int] = (40, 52)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(_noise(np.random.default_rng(seed), *size)).save(path, fmt)
    return path


def _folder(root: Path, layout: dict[str, int]) -> Path:
    """layout: subfolder ('' for the root) -> number of PNGs to write in it."""
    seed = 0
    for sub, n in layout.items():
        for i in range(n):
            _write_rgb(root / sub / f"img{i:02d}.png", seed)
            seed += 1
    return root


def _all(source: CalibrationSource, batch_size: int = 4) -> Batch:
    parts = list(source.batches(batch_size))
    labels = None if parts[0].labels is None else np.concatenate([b.labels for b in parts])
    return Batch(np.concatenate([b.images for b in parts]), labels, [i for b in parts for i in b.ids])


# ---------------------------------------------------------------- image folders: labels


def test_integer_class_folders_label_by_folder_number(tmp_path):
    root = _folder(tmp_path / "calib", {"0": 2, "1": 2, "7": 1})
    src = open_source(root, PRE)
    out = _all(src)
    assert out.ids == ["0/img00.png", "0/img01.png", "1/img00.png", "1/img01.png", "7/img00.png"]
    assert out.labels.dtype == np.int64
    assert out.labels.tolist() == [0, 0, 1, 1, 7]
    s = src.summary
    assert s.labeled and s.class_names is None and s.classes_present == 3
    assert s.kind == "images" and s.found == s.used == len(src) == 5
    assert s.one_line() == f"5 images from {root} (3 classes)"


def test_named_class_folders_without_class_names_use_sorted_order(tmp_path):
    root = _folder(tmp_path / "calib", {"zebra": 1, "cat": 2, "dog": 1})
    src = open_source(root, PRE)
    out = _all(src)
    assert out.ids == ["cat/img00.png", "cat/img01.png", "dog/img00.png", "zebra/img00.png"]
    assert out.labels.tolist() == [0, 0, 1, 2]
    assert src.summary.class_names == ("cat", "dog", "zebra")


def test_named_class_folders_follow_the_models_class_names(tmp_path):
    root = _folder(tmp_path / "calib", {"cat": 1, "dog": 2})
    src = open_source(root, PRE, class_names=["dog", "bird", "cat"])
    out = _all(src)
    assert out.labels.tolist() == [2, 0, 0]
    assert src.summary.class_names == ("dog", "bird", "cat")
    assert "(2 of 3 classes)" in src.summary.one_line()
    assert src.summary.notes == ()


def test_folders_not_in_class_names_fall_back_to_sorted_order_with_a_note(tmp_path):
    root = _folder(tmp_path / "calib", {"cat": 1, "kat": 1})
    src = open_source(root, PRE, class_names=["dog", "cat"])
    assert _all(src).labels.tolist() == [0, 1]
    assert src.summary.class_names == ("cat", "kat")
    assert "'kat'" in src.summary.one_line()


def test_integer_folders_beyond_the_models_classes_are_an_error(tmp_path):
    root = _folder(tmp_path / "calib", {"0": 1, "12": 1})
    with pytest.raises(CalibrationError, match=r"'12'.*10 classes"):
        open_source(root, PRE, class_names=[str(i * 100) for i in range(10)])


def test_images_in_the_root_are_unlabeled(tmp_path):
    root = _folder(tmp_path / "calib", {"": 3})
    src = open_source(root, PRE)
    out = _all(src)
    assert out.labels is None and not src.summary.labeled
    assert src.summary.class_names is None and src.summary.classes_present is None
    assert out.ids == ["img00.png", "img01.png", "img02.png"]


def test_images_both_in_root_and_subfolders_are_refused(tmp_path):
    """One stray image beside class folders used to switch the labels (and the top-1 check) off silently."""
    root = _folder(tmp_path / "calib", {"": 1, "a": 2})
    with pytest.raises(CalibrationError, match=r"img00.png.*beside class folders"):
        open_source(root, PRE)


def test_nested_folders_take_the_top_level_class(tmp_path):
    root = tmp_path / "calib"
    _write_rgb(root / "a" / "x" / "deep.png", 1)
    _write_rgb(root / "b" / "flat.png", 2)
    out = _all(open_source(root, PRE))
    assert out.ids == ["a/x/deep.png", "b/flat.png"] and out.labels.tolist() == [0, 1]


# ---------------------------------------------------------------- image folders: odd files


@pytest.fixture
def odd_folder(tmp_path):
    root = tmp_path / "odd"
    root.mkdir()
    rng = np.random.default_rng(3)
    _write_rgb(root / "plain.jpg", 1)
    _write_rgb(root / "UPPER.JPEG", 2)
    _write_rgb(root / "photo.webp", 3, "WEBP")
    _write_rgb(root / "bitmap.BMP", 4, "BMP")
    Image.fromarray(_noise(rng, c=None), mode="L").save(root / "gray.png")
    Image.new("CMYK", (48, 36), (200, 30, 90, 10)).save(root / "print.jpg", "JPEG")
    Image.fromarray((rng.integers(0, 65536, (40, 52))).astype(np.uint16)).save(root / "depth16.png")
    Image.fromarray(_noise(rng, c=4), mode="RGBA").save(root / "alpha.png")
    Image.fromarray(_noise(rng)).convert("P").save(root / "palette.png")
    (root / "random.jpg").write_bytes(rng.integers(0, 256, 3000, dtype=np.uint8).tobytes())
    (root / "notes.png").write_text("this is not a PNG at all\n")
    (root / "empty.jpg").write_bytes(b"")
    good = _write_rgb(tmp_path / "whole.png", 5).read_bytes()
    (root / "truncated.png").write_bytes(good[: len(good) // 2])
    # ignored: other extensions, hidden files (macOS ._ files are not images)
    (root / "readme.txt").write_text("hello")
    Image.new("RGB", (8, 8)).save(root / "anim.gif")
    (root / "._plain.jpg").write_bytes(b"\x00\x05\x16\x07 AppleDouble")
    return root


def test_odd_files_are_converted_or_skipped_and_counted(odd_folder):
    src = open_source(odd_folder, PRE)
    s = src.summary
    assert s.found == 13
    assert s.skipped == {"corrupt": 2, "empty file": 1, "truncated": 1}
    assert s.converted == {"grayscale": 1, "CMYK": 1, "16-bit": 1, "RGBA": 1, "palette": 1}
    assert s.used == len(src) == 9
    assert sorted(src.ids) == src.ids
    assert set(src.ids) == {
        "UPPER.JPEG", "alpha.png", "bitmap.BMP", "depth16.png", "gray.png",
        "palette.png", "photo.webp", "plain.jpg", "print.jpg",
    }
    line = s.one_line()
    assert "skipped 2 corrupt, 1 empty file, 1 truncated; converted 1 16-bit, 1 CMYK, 1 RGBA, 1 grayscale, 1 palette" in line
    assert json.loads(json.dumps(s.to_dict()))["skipped"] == s.skipped


def test_preprocessed_output_equals_preprocess_image_on_the_same_file(odd_folder):
    assert Image.open(odd_folder / "depth16.png").mode.startswith("I")  # really a 16-bit file
    src = open_source(odd_folder, PRE)
    for batch in src.batches(4):
        assert batch.images.dtype == np.float32 and batch.images.shape[1:] == (3, 32, 32)
        assert batch.images.flags.c_contiguous
        for img_id, got in zip(batch.ids, batch.images):
            with Image.open(odd_folder / img_id) as image:
                np.testing.assert_array_equal(got, preprocess_image(image, PRE))


def test_batches_are_re_iterable_in_the_same_order(tmp_path):
    src = open_source(_folder(tmp_path / "c", {"a": 3, "b": 4}), PRE)
    first, second = _all(src, 3), _all(src, 5)
    assert first.ids == second.ids
    np.testing.assert_array_equal(first.images, second.images)
    assert [len(b.ids) for b in src.batches(3)] == [3, 3, 1]
    with pytest.raises(UsageError):
        next(src.batches(0))


def test_items_beyond_the_memory_budget_are_decoded_again_per_batch(tmp_path, monkeypatch):
    root = _folder(tmp_path / "c", {"a": 3, "b": 3})
    cached = _all(open_source(root, PRE))
    one = 3 * 32 * 32 * 4
    monkeypatch.setattr(_common, "CACHE_BYTES", 2 * one)
    lazy_src = open_source(root, PRE)
    assert sum(it.data is not None for it in lazy_src._items) == 2
    for _ in range(2):
        lazy = _all(lazy_src, 4)
        assert lazy.ids == cached.ids and lazy.labels.tolist() == cached.labels.tolist()
        np.testing.assert_array_equal(lazy.images, cached.images)
    # a file that changes under a lazy source is reported, not silently used
    _write_rgb(root / "b" / "img02.png", 999)
    with pytest.raises(CalibrationError, match="changed"):
        _all(lazy_src)


def test_progress_bar_does_not_change_the_result(tmp_path):
    root = _folder(tmp_path / "c", {"": 5})
    a, b = open_source(root, PRE, progress=True), open_source(root, PRE)
    assert a.summary == b.summary


# ---------------------------------------------------------------- subsets and hashes


def test_subset_is_deterministic_seeded_and_kept_in_sorted_order(tmp_path):
    root = _folder(tmp_path / "c", {"a": 10, "b": 10})
    every = open_source(root, PRE).ids
    a1, a2 = open_source(root, PRE, limit=6, seed=0), open_source(root, PRE, limit=6, seed=0)
    b = open_source(root, PRE, limit=6, seed=1)
    assert a1.ids == a2.ids and a1.summary.data_hash == a2.summary.data_hash
    picked = sorted(np.random.default_rng(0).choice(20, 6, replace=False))
    assert a1.ids == [every[i] for i in picked] == sorted(a1.ids)
    assert b.ids != a1.ids and b.summary.data_hash != a1.summary.data_hash
    s = a1.summary
    assert (s.used, s.subset_size, s.seed, s.found) == (6, 6, 0, 20)
    assert s.one_line().startswith(f"6 of 20 images (seed 0) from {root}")


def test_limit_larger_than_available_uses_all_and_says_so(tmp_path):
    root = _folder(tmp_path / "c", {"": 4})
    src = open_source(root, PRE, limit=50)
    assert len(src) == 4 and src.summary.subset_size == 50
    assert src.summary.data_hash == open_source(root, PRE).summary.data_hash
    assert "asked for 50 but only 4 usable, using all" in src.summary.one_line()
    with pytest.raises(UsageError):
        open_source(root, PRE, limit=0)


def test_data_hash_survives_moving_the_folder_and_sees_one_changed_pixel(tmp_path):
    root = _folder(tmp_path / "here" / "calib", {"a": 2, "b": 2})
    before = open_source(root, PRE).summary.data_hash
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.move(str(root), str(moved))
    (moved / "a" / "unrelated.txt").write_text("ignored")
    assert open_source(moved, PRE).summary.data_hash == before

    target = moved / "b" / "img01.png"
    pixels = np.asarray(Image.open(target)).copy()
    pixels[0, 0, 0] ^= 1
    Image.fromarray(pixels).save(target)
    assert open_source(moved, PRE).summary.data_hash != before


# ---------------------------------------------------------------- arrays


def test_npy_uint8_nhwc_frames_are_preprocessed(tmp_path):
    frames = np.random.default_rng(1).integers(0, 256, (5, 30, 44, 3), dtype=np.uint8)
    np.save(tmp_path / "frames.npy", frames)
    src = open_source(tmp_path / "frames.npy", PRE)
    out = _all(src, 2)
    assert out.ids == [f"array[{i}]" for i in range(5)] and out.labels is None
    assert out.images.shape == (5, 3, 32, 32) and out.images.dtype == np.float32
    for i in range(5):
        np.testing.assert_array_equal(out.images[i], preprocess_array(frames[i], PRE))
    assert src.summary.kind == "arrays" and not src.summary.labeled and src.summary.found == 5


def test_npz_float_nchw_with_labels_is_used_as_is(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((12, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, 12)
    np.savez(tmp_path / "val.npz", images=x, labels=y)
    src = open_source(tmp_path / "val.npz", PRE, class_names=[str(i) for i in range(10)])
    out = _all(src, 5)
    np.testing.assert_array_equal(out.images, x)
    assert out.labels.dtype == np.int64 and out.labels.tolist() == y.tolist()
    assert src.summary.labeled and src.summary.class_names == tuple(str(i) for i in range(10))

    np.savez(tmp_path / "xy.npz", x=x, y=y.astype(np.int32))
    other = open_source(tmp_path / "xy.npz", PRE, limit=4, seed=3)
    picked = sorted(np.random.default_rng(3).choice(12, 4, replace=False))
    assert other.ids == [f"array[{i}]" for i in picked]
    np.testing.assert_array_equal(_all(other).images, x[picked])
    assert other.summary.data_hash == open_source(tmp_path / "xy.npz", PRE, limit=4, seed=3).summary.data_hash

    y2 = y.copy()
    y2[picked[0]] = (y2[picked[0]] + 1) % 10
    np.savez(tmp_path / "xy.npz", x=x, y=y2)
    assert open_source(tmp_path / "xy.npz", PRE, limit=4, seed=3).summary.data_hash != other.summary.data_hash


def test_an_npz_that_would_unpack_past_half_the_memory_is_refused_before_unpacking(tmp_path):
    """A .npz member is decompressed whole: a few KB that say (1e6, 224, 224, 3) uint8 (140 GiB) are refused from the
    header, naming the size and .npy, instead of an allocation the kernel lets through and then kills."""
    import zipfile

    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as z, z.open("images.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "|u1", "fortran_order": False, "shape": (10**6, 224, 224, 3)})
        f.write(b"\0" * 4096)
    with pytest.raises(CalibrationError, match=r"'images' array \(1000000, 224, 224, 3\) unpacks to 140.2 GiB.*np.save as a .npy"):
        open_source(bomb, PRE)


def test_non_finite_float_rows_are_skipped(tmp_path):
    x = np.zeros((4, 3, 32, 32), np.float32)
    x[1, 0, 0, 0] = np.nan
    np.save(tmp_path / "x.npy", x)
    src = open_source(tmp_path / "x.npy", PRE)
    assert src.ids == ["array[0]", "array[2]", "array[3]"]
    assert src.summary.skipped == {"non-finite values": 1}


U8 = np.zeros((2, 20, 20, 3), np.uint8)
F32 = np.zeros((2, 3, 32, 32), np.float32)


@pytest.mark.parametrize(
    "name, arrays, needle",
    [
        ("rank3.npy", {"": np.zeros((20, 20, 3), np.uint8)}, r"shape \(20, 20, 3\)"),
        ("nchw_u8.npy", {"": np.zeros((2, 3, 20, 20), np.uint8)}, r"uint8 with shape \(2, 3, 20, 20\).*channels-first"),
        ("gray.npy", {"": np.zeros((2, 20, 20, 1), np.uint8)}, r"uint8 with shape \(2, 20, 20, 1\)"),
        ("wrong_hw.npy", {"": np.zeros((2, 3, 64, 64), np.float32)}, r"float32 with shape \(2, 3, 64, 64\).*\(N, 3, 32, 32\)"),
        ("f64.npy", {"": np.zeros((2, 3, 32, 32), np.float64)}, r"float64 with shape"),
        ("count.npz", {"images": U8, "labels": np.array([0, 1, 2])}, r"labels are int64 with shape \(3,\).*2 images"),
        ("neg.npz", {"x": F32, "y": np.array([0, -1])}, r"include -1"),
        ("flt.npz", {"images": F32, "labels": np.array([0.0, 1.0])}, r"labels are float64.*integer"),
        ("nokey.npz", {"data": U8}, r"no 'images' or 'x' array \(it has: data\)"),
    ],
)
def test_bad_arrays_are_explained(tmp_path, name, arrays, needle):
    path = tmp_path / name
    if "" in arrays:
        np.save(path, arrays[""])
    else:
        np.savez(path, **arrays)
    with pytest.raises(CalibrationError, match=needle) as err:
        open_source(path, PRE)
    assert name in str(err.value)


def test_pickled_and_corrupt_array_files_are_explained(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(CalibrationError, match="obj.npy holds Python objects"):
        open_source(tmp_path / "obj.npy", PRE)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file at all")
    with pytest.raises(CalibrationError, match=r"junk.npz is not a numpy .npz file"):
        open_source(tmp_path / "junk.npz", PRE)
    np.save(tmp_path / "whole.npy", U8)
    (tmp_path / "cut.npy").write_bytes((tmp_path / "whole.npy").read_bytes()[:200])
    with pytest.raises(CalibrationError, match=r"cut.npy cannot be read as a .npy file"):
        open_source(tmp_path / "cut.npy", PRE)
    np.savez(tmp_path / "whole.npz", images=U8)
    (tmp_path / "cut.npz").write_bytes((tmp_path / "whole.npz").read_bytes()[:300])
    with pytest.raises(CalibrationError, match=r"cut.npz cannot be read as a .npz file"):
        open_source(tmp_path / "cut.npz", PRE)


# ---------------------------------------------------------------- video

VIDEO_FRAMES = 40


def _colour(k: int) -> tuple[int, int, int]:
    """RGB colour of frame k: red rises and blue falls with k, 6 levels a step."""
    return (6 * k + 5, 128, 255 - 6 * k)


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    cv2 = pytest.importorskip("cv2")
    path = tmp_path_factory.mktemp("video") / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    assert writer.isOpened()
    for k in range(VIDEO_FRAMES):
        r, g, b = _colour(k)
        writer.write(np.full((48, 64, 3), (b, g, r), np.uint8))  # OpenCV writes BGR
    writer.release()
    return path


def _frame_number(chw: np.ndarray) -> int:
    rgb = (chw.mean(axis=(1, 2)) * np.asarray(PRE.std) + np.asarray(PRE.mean)) * 255.0
    k = int(round((rgb[0] - 5) / 6))
    assert np.abs(rgb - _colour(k)).max() < 4, (rgb, k)
    return k


def test_video_frames_are_sampled_evenly_over_the_whole_video(video):
    src = open_source(video, PRE, video_frames=8)
    out = _all(src, 3)
    expected = [2, 7, 12, 17, 22, 27, 32, 37]
    assert out.ids == [f"frame@{k}" for k in expected] and out.labels is None
    assert [_frame_number(x) for x in out.images] == expected
    s = src.summary
    assert (s.kind, s.found, s.used, s.labeled) == ("video", 40, 8, False)
    assert s.one_line() == f"8 of 40 frames (evenly spaced) from {video}"

    five = open_source(video, PRE, video_frames=8, limit=5)
    assert [_frame_number(x) for x in _all(five).images] == [4, 12, 20, 28, 36]
    assert five.summary.data_hash != s.data_hash
    assert open_source(video, PRE, video_frames=8).summary.data_hash == s.data_hash

    every = open_source(video, PRE, video_frames=100)
    assert [_frame_number(x) for x in _all(every, 16).images] == list(range(40))


def test_sequential_reading_matches_seeking(video):
    from vitedge.datasources.video import import_cv2, iter_seek, iter_sequential

    cv2 = import_cv2()
    wanted = [3, 19, 38]
    seek = dict(iter_seek(cv2, video, str(video), wanted))
    seq = dict(iter_sequential(cv2, video, str(video), wanted))
    assert sorted(seek) == sorted(seq) == wanted
    for k in wanted:
        np.testing.assert_array_equal(seek[k], seq[k])
    assert sum(1 for _ in iter_sequential(cv2, video, str(video), None)) == VIDEO_FRAMES


def test_video_beyond_the_memory_budget_is_read_again_per_batch(video, monkeypatch):
    cached = _all(open_source(video, PRE, video_frames=6))
    monkeypatch.setattr(_common, "CACHE_BYTES", 3 * 32 * 32 * 4)
    lazy = _all(open_source(video, PRE, video_frames=6), 4)
    assert lazy.ids == cached.ids
    np.testing.assert_array_equal(lazy.images, cached.images)


def test_unreadable_video_and_missing_opencv(tmp_path, monkeypatch):
    pytest.importorskip("cv2")
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"\x00" * 4096)
    with pytest.raises(CalibrationError, match="broken.mp4 cannot be opened as a video"):
        open_source(bad, PRE)
    monkeypatch.setitem(sys.modules, "cv2", None)  # what `import cv2` sees when it is not installed
    with pytest.raises(MissingDependencyError, match=r"OpenCV \(for video calibration\).*vitedge\[video\]"):
        open_source(bad, PRE)


# ---------------------------------------------------------------- too little or nothing


def test_too_few_usable_images_says_what_to_do(tmp_path):
    root = _folder(tmp_path / "few", {"": 3})
    (root / "bad1.jpg").write_bytes(b"garbage")
    (root / "bad2.png").write_bytes(b"more garbage")
    with pytest.raises(CalibrationError) as err:
        open_source(root, PRE, min_count=32)
    assert str(err.value) == (
        f"only 3 usable images in {root} (2 corrupt skipped); at least 32 needed: "
        f"add usable images to the folder"
    )
    assert len(open_source(root, PRE, min_count=3)) == 3


def test_missing_empty_and_unsupported_paths(tmp_path):
    with pytest.raises(CalibrationError, match="does not exist: pass a folder of images"):
        open_source(tmp_path / "nope", PRE)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CalibrationError, match="empty is empty: put calibration images"):
        open_source(tmp_path / "empty", PRE)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("x")
    np.save(tmp_path / "docs" / "frames.npy", U8)
    with pytest.raises(CalibrationError, match=r"no images .* found 2 other files .*pass the .npy/.npz file itself"):
        open_source(tmp_path / "docs", PRE)
    (tmp_path / "data.csv").write_text("1,2,3\n")
    with pytest.raises(CalibrationError, match=r"data.csv is not a supported data source \(.csv\)"):
        open_source(tmp_path / "data.csv", PRE)
    single = _write_rgb(tmp_path / "one.png", 0)
    with pytest.raises(CalibrationError, match="single image: pass the folder"):
        open_source(single, PRE)
    for err in (CalibrationError, UsageError):
        assert err("x").exit_code == 2


def test_summary_is_a_frozen_plain_record(tmp_path):
    src = open_source(_folder(tmp_path / "c", {"0": 1, "1": 1}), PRE)
    s = src.summary
    assert isinstance(s, SourceSummary)
    with pytest.raises(AttributeError):
        s.used = 0  # type: ignore[misc]
    d = s.to_dict()
    assert d["class_names"] is None and d["labeled"] is True and len(d["data_hash"]) == 64
    assert json.loads(json.dumps(d)) == d
