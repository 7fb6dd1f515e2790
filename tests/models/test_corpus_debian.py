"""A corpus test set that comes from a Debian package (Fashion-MNIST), and the model trained on it.

`cache.py fill` reads such a file from the package's .deb (found in --from-debs DIR, else brought with
`apt-get download NAME=VERSION`), checks the .deb's sha256 and then the file's. These tests build small .deb
files here (an ar archive holding data.tar.xz, as dpkg writes them) and need no network; the model test runs
where a corpus folder holds the files and skips naming what is missing elsewhere."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.corpus_suite import MANIFEST, cache, classes


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ar_member(name: str, data: bytes) -> bytes:
    header = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
    assert len(header) == 60
    return header + data + (b"\n" if len(data) % 2 else b"")


def _deb(files: dict[str, bytes]) -> bytes:
    """A .deb as dpkg writes it: debian-binary, control.tar.xz, data.tar.xz (members named ./usr/...)."""
    def tar_xz(members: dict[str, bytes]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:xz") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    return (b"!<arch>\n" + _ar_member("debian-binary", b"2.0\n")
            + _ar_member("control.tar.xz", tar_xz({"./control": b"Package: dataset-tiny\n"}))
            + _ar_member("data.tar.xz", tar_xz({f"./{k}": v for k, v in files.items()})))


def _debian_corpus(tmp_path: Path, images: bytes = b"images", labels: bytes = b"labels"):
    """A .deb of a tiny idx test set in tmp_path/debs and a manifest whose test set names it."""
    deb = _deb({"usr/share/datasets/tiny/t10k-images-idx3-ubyte.gz": images,
                "usr/share/datasets/tiny/t10k-labels-idx1-ubyte.gz": labels})
    debs = tmp_path / "debs"
    debs.mkdir()
    (debs / "dataset-tiny_1.0-1_all.deb").write_bytes(deb)
    text = f'''
[[dataset]]
id = "tiny"
kind = "mnist-idx"
debian_package = "dataset-tiny"
debian_version = "1.0-1"
deb_sha256 = "{_sha(deb)}"
licence = "MIT"
classes = ["a", "b"]
  [[dataset.file]]
  name = "t10k-images-idx3-ubyte.gz"
  path = "usr/share/datasets/tiny/t10k-images-idx3-ubyte.gz"
  sha256 = "{_sha(images)}"
  [[dataset.file]]
  name = "t10k-labels-idx1-ubyte.gz"
  path = "usr/share/datasets/tiny/t10k-labels-idx1-ubyte.gz"
  sha256 = "{_sha(labels)}"
'''
    (tmp_path / "manifest.toml").write_text(text)
    return debs, cache.load_manifest(tmp_path / "manifest.toml")


def test_fill_reads_each_file_from_the_pinned_debian_package_and_checks_both_hashes(tmp_path, monkeypatch):
    debs, manifest = _debian_corpus(tmp_path)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    assert cache.fill(manifest, debs=debs) == []
    root = tmp_path / "cache" / "data" / "tiny"
    assert (root / "t10k-images-idx3-ubyte.gz").read_bytes() == b"images"
    assert (root / "t10k-labels-idx1-ubyte.gz").read_bytes() == b"labels"
    assert cache.problems(manifest) == []


def test_a_deb_whose_hash_differs_is_refused_and_named(tmp_path, monkeypatch):
    debs, manifest = _debian_corpus(tmp_path)
    (debs / "dataset-tiny_1.0-1_all.deb").write_bytes(_deb({"usr/share/datasets/tiny/t10k-images-idx3-ubyte.gz": b"other"}))
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    lines = cache.fill(manifest, debs=debs)
    assert any("Debian package dataset-tiny=1.0-1" in ln and "no dataset-tiny_*.deb with sha256" in ln for ln in lines)
    assert not (tmp_path / "cache" / "data" / "tiny" / "t10k-images-idx3-ubyte.gz").exists()


def test_a_missing_test_set_names_the_package_and_how_to_bring_it(tmp_path, monkeypatch):
    _, manifest = _debian_corpus(tmp_path)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "empty"))
    lines = [ln for f in manifest.datasets["tiny"].files for ln in cache._file_problem(f, "dataset tiny", tmp_path / "empty")]
    assert len(lines) == 2 and all("Debian package dataset-tiny=1.0-1" in ln and "apt-get download" in ln
                                   and "--from-debs" in ln for ln in lines)


def test_without_apt_get_the_line_says_to_give_the_deb_folder(tmp_path, monkeypatch):
    _, manifest = _debian_corpus(tmp_path)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(cache.shutil, "which", lambda name: None)
    lines = cache.fill(manifest)
    assert any("apt-get not found" in ln and "--from-debs DIR" in ln for ln in lines)


def test_a_file_the_package_does_not_hold_is_named(tmp_path):
    deb = tmp_path / "x_1_all.deb"
    deb.write_bytes(_deb({"usr/share/a": b"a"}))
    assert cache.deb_member(deb, "usr/share/a") == b"a"
    with pytest.raises(cache.FillError, match="holds no usr/share/b"):
        cache.deb_member(deb, "usr/share/b")
    (tmp_path / "not.deb").write_bytes(b"PK\x03\x04")
    with pytest.raises(cache.FillError, match="not a Debian package"):
        cache.deb_member(tmp_path / "not.deb", "usr/share/a")


def test_the_manifest_pins_fashion_mnist_to_a_debian_package_and_the_model_to_raw_pixels():
    ds = MANIFEST.datasets["fashion-mnist-test"]
    assert ds.kind == "mnist-idx" and len(ds.classes) == 10
    assert all(f.deb is not None and f.deb.name == "dataset-fashion-mnist" and len(f.deb.sha256) == 64 for f in ds.files)
    m = MANIFEST.model("jason-fashion")
    assert m.dataset == "fashion-mnist-test" and m.mean == (0.0,) and m.std[0] * 255 == pytest.approx(1.0)
    module = classes.JasonFashionHybridViT()
    assert module.pretrained_cfg["std"][0] == pytest.approx(m.std[0]) and module.pretrained_cfg["mean"] == m.mean


def test_the_hybrid_model_reads_the_stems_map_as_196_tokens_without_a_position_table():
    """The stem's 14x14 map is the sequence (no patch embedding, no position table): moving content by one stem
    pixel moves tokens, so the class token's output must change, and the state_dict has no positional key."""
    torch.manual_seed(0)
    module = classes.JasonFashionHybridViT().eval()
    assert not any("pos" in k for k in module.state_dict())
    x = torch.rand(2, 1, 28, 28) * 255
    with torch.no_grad():
        tokens = module.cnn(x).flatten(2).transpose(1, 2)
        assert tokens.shape == (2, 196, 128)
        together = module(x)
        alone = torch.cat([module(x[i:i + 1]) for i in range(2)])
    assert together.shape == (2, 10) and torch.allclose(together, alone, atol=1e-4)


def test_fashion_mnist_test_set_is_the_published_one():
    """10,000 images of 28x28 and 1,000 of each of the 10 classes, as Fashion-MNIST's test set has."""
    folder = cache.find_cache(MANIFEST, ["jason-fashion"])
    if folder is None:
        pytest.skip(f"no corpus folder with the Fashion-MNIST test set: {cache.problems(MANIFEST, ['jason-fashion'])[0]}")
    root = folder / "data" / "fashion-mnist-test"
    images = cache._read_idx(root / "t10k-images-idx3-ubyte.gz")
    labels = cache._read_idx(root / "t10k-labels-idx1-ubyte.gz")
    assert images.shape == (10000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels, minlength=10).tolist() == [1000] * 10
    assert gzip.decompress((root / "t10k-labels-idx1-ubyte.gz").read_bytes())[:4] == b"\x00\x00\x08\x01"
