"""The corpus's Tiny ImageNet test set and its two models (benchmarks/corpus): the annotated validation folder, the
training checkpoints read through `state_dict_key`, a model scored on its source labels, and blocks that keep no head.

The reader and `fill` are checked on small folders and git repositories made here (real JPEG files); the two
checkpoints where a corpus folder holds them (skipped, naming what is missing, elsewhere)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.corpus_suite import MANIFEST, cache, classes
from helpers.corpus_suite import need as _need

# the annotations of a small validation folder: img_3 and img_4 are of a class outside the dataset, img_5 is
# a file the annotations do not name (the repository's extra images)
ANNOTATIONS = [("img_0.JPEG", "n02"), ("img_1.JPEG", "n01"), ("img_2.JPEG", "n02"), ("img_3.JPEG", "n99"),
               ("img_4.JPEG", "n99"), ("img_6.JPEG", "n01")]


def _jpeg(value: int) -> bytes:
    import io

    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), value, np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def _manifest_text(repo: str, commit: str, annotations_sha: str, digest: str, count: int, model_sha: str = "0" * 64) -> str:
    """A manifest of the small test set and a model (its file in the same repository) scored on its source labels."""
    return f'''
[[dataset]]
id = "tin"
kind = "tiny-imagenet-val"
repo = "{repo}"
commit = "{commit}"
licence = "none"
classes = ["n02", "n01"]
source_labels = [7, 3]
  [[dataset.file]]
  name = "val_annotations.txt"
  path = "val/val_annotations.txt"
  sha256 = "{annotations_sha}"
  [[dataset.tree]]
  name = "images"
  path = "val/images"
  annotated_by = "val_annotations.txt"
  count = {count}
  digest = "{digest}"

[[model]]
id = "m"
repo = "{repo}"
commit = "{commit}"
path = "checkpoints/vit1"
sha256 = "{model_sha}"
licence = "none"
dataset = "tin"
model_class = "M"
claimed_where = "nowhere"
preprocess = {{ channels = 3, size = 8, mean = [0.5, 0.5, 0.5], std = [0.5, 0.5, 0.5] }}
state_dict_key = "state_dict"
outputs = 10
labels = "source"
'''


def _git(*args, cwd):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "init.defaultBranch=main", *args],
                   cwd=cwd, check=True, capture_output=True)


def _validation_repo(tmp_path: Path):
    """A git repository holding val/images (six JPEG files) and val/val_annotations.txt, and a manifest of its
    2 classes pinned at its commit, with the digest of the four images the annotations give those classes."""
    repo = tmp_path / "repos" / "o" / "tin"
    (repo / "val" / "images").mkdir(parents=True)
    for i in (0, 1, 2, 3, 4, 5, 6):
        (repo / "val" / "images" / f"img_{i}.JPEG").write_bytes(_jpeg(30 * i))
    text = "".join(f"{name}\t{wnid}\t0\t0\t7\t7\n" for name, wnid in ANNOTATIONS)
    (repo / "val" / "val_annotations.txt").write_text(text)
    (repo / "checkpoints").mkdir()
    (repo / "checkpoints" / "vit1").write_bytes(b"weights")
    _git("init", "-q", cwd=repo)
    _git("add", ".", cwd=repo)
    _git("commit", "-qm", "val", cwd=repo)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    kept = sorted(name for name, wnid in ANNOTATIONS if wnid in ("n01", "n02"))
    lines = "".join(f"{n} {hashlib.sha256((repo / 'val' / 'images' / n).read_bytes()).hexdigest()}\n" for n in kept)
    digest = hashlib.sha256(lines.encode()).hexdigest()
    (tmp_path / "manifest.toml").write_text(
        _manifest_text("o/tin", commit, hashlib.sha256(text.encode()).hexdigest(), digest, len(kept),
                       hashlib.sha256(b"weights").hexdigest()))
    return tmp_path / "repos", cache.load_manifest(tmp_path / "manifest.toml")


def test_fill_brings_only_the_annotated_images_of_the_datasets_classes(tmp_path, monkeypatch):
    repos, manifest = _validation_repo(tmp_path)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    assert cache.fill(manifest, url=f"file://{repos}/{{repo}}") == []
    assert (tmp_path / "cache" / "models" / "m.pth").read_bytes() == b"weights"  # a file without a suffix is kept as .pth
    images = tmp_path / "cache" / "data" / "tin" / "images"
    assert sorted(p.name for p in images.iterdir()) == ["img_0.JPEG", "img_1.JPEG", "img_2.JPEG", "img_6.JPEG"]
    assert cache.problems(manifest) == []
    (images / "img_1.JPEG").write_bytes(_jpeg(200))  # an altered image is caught by the tree's digest
    (images.parent / ".images.verified").unlink()
    assert any("does not match the manifest's digest" in ln for ln in cache.problems(manifest))


def test_the_reader_gives_the_annotated_images_in_order_with_their_class_positions_and_source_labels(tmp_path, monkeypatch):
    repos, manifest = _validation_repo(tmp_path)
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    assert cache.fill(manifest, url=f"file://{repos}/{{repo}}") == []
    ds = manifest.datasets["tin"]
    items, labels = cache.load_images(ds)
    assert [name for name, _ in items] == ["img_0.JPEG", "img_1.JPEG", "img_2.JPEG", "img_6.JPEG"]
    assert labels.tolist() == [0, 1, 0, 1]  # positions in classes = ["n02", "n01"]
    assert cache.decode(items[1], 3).shape == (8, 8, 3) and abs(int(cache.decode(items[1], 3).mean()) - 30) <= 2
    model = manifest.model("m")
    assert model.outputs == 10 and model.source_labels and model.state_dict_key == "state_dict"
    assert cache.model_labels(model, ds, labels).tolist() == [7, 3, 7, 3]
    monkeypatch.setenv(cache.SPLITS_ENV, str(tmp_path / "splits"))
    plain = cache.make_split(ds, 1, 2, seed=0)
    source = cache.make_split(ds, 1, 2, seed=0, source_labels=True)
    assert plain != source and source.name.endswith("-src")
    assert {p.name for p in (plain / "val").iterdir()} <= {"0", "1"}
    assert {p.name for p in (source / "val").iterdir()} <= {"7", "3"}

    def files(folder: Path) -> list[bytes]:
        return sorted(p.read_bytes() for p in folder.rglob("*.JPEG"))

    assert files(plain / "val") == files(source / "val") and files(plain / "calib") == files(source / "calib")


def test_source_labels_must_name_one_label_per_class(tmp_path):
    text = _manifest_text("o/tin", "0" * 40, "0" * 64, "0" * 64, 1).replace("source_labels = [7, 3]", "source_labels = [7]")
    (tmp_path / "manifest.toml").write_text(text)
    with pytest.raises(ValueError, match="1 source_labels for 2 classes"):
        cache.load_manifest(tmp_path / "manifest.toml")


def test_state_dict_key_reads_the_weights_of_a_training_checkpoint(tmp_path):
    """A training checkpoint as the Tiny ImageNet models' authors saved it (weights beside optimizer, scheduler and
    scaler state): torch.load(weights_only=True) reads it, weights_of takes the manifest's key, and a key the file
    lacks is one line naming it and what the file holds."""
    module = classes.AlessioTinyImageNetPrunedViT()
    optimizer = torch.optim.AdamW(module.parameters())
    module(torch.zeros(1, 3, 64, 64)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    path = tmp_path / "ckpt.pth"
    torch.save({"epoch": 3, "state_dict": module.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "best_acc": 20.5, "scaler": {"scale": 65536.0}}, path)
    (tmp_path / "manifest.toml").write_text(_manifest_text("o/tin", "0" * 40, "0" * 64, "0" * 64, 1))
    m = cache.load_manifest(tmp_path / "manifest.toml").model("m")
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    fresh = classes.AlessioTinyImageNetPrunedViT()
    fresh.load_state_dict(cache.weights_of(m, loaded), strict=True)
    assert torch.equal(fresh.classifier.weight, module.classifier.weight)
    with pytest.raises(KeyError, match="no 'state_dict' in its file.*'best_acc'"):
        cache.weights_of(m, {"best_acc": 1.0, "model": {}})
    bare = MANIFEST.model("gaurav-mnist")
    assert bare.state_dict_key is None and cache.weights_of(bare, loaded) is loaded


def test_a_block_that_keeps_no_head_is_its_mlp_alone_and_kept_heads_are_computed_in_index_order():
    torch.manual_seed(0)
    module = classes.AlessioTinyImageNetPrunedViT().eval()
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.2)
    x = torch.randn(2, 65, 64)
    with torch.no_grad():
        empty = module.encoder.blocks[2]
        assert torch.equal(empty(x), empty.mlp(empty.norm2(x)) + x)
        block = module.encoder.blocks[1]
        h = block.norm1(x)
        heads = torch.cat([block.attention.heads[i](h) for i in (1, 2, 4, 7)], dim=-1)
        assert block.attention.output_projection.in_features == 32
        assert torch.allclose(block.attention(h), block.attention.output_projection(heads), atol=1e-6)
        together = module(torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1)))
        alone = torch.cat([module(torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))[i:i + 1]) for i in range(3)])
    assert torch.allclose(together, alone, atol=1e-5)
    scripted = torch.jit.script(module)
    y = torch.randn(2, 3, 64, 64)
    assert torch.allclose(scripted(y), module(y), atol=1e-6)


def test_the_pruned_checkpoint_keeps_the_heads_with_a_query_bias_and_no_head_in_three_blocks(monkeypatch):
    """The source marks pruned heads in a set the checkpoint does not store: the class's kept heads must be those
    whose query bias is not zero, as many per block as the output projection is wide."""
    _need(monkeypatch, "alessio-tin-pruned")
    m = MANIFEST.model("alessio-tin-pruned")
    sd = cache.weights_of(m, torch.load(m.path, map_location="cpu", weights_only=True))
    for b, kept in enumerate(classes.AlessioTinyImageNetPrunedViT.KEPT):
        nonzero = tuple(i for i in range(8) if sd[f"encoder.blocks.{b}.attention.heads.{i}.query.bias"].abs().sum() > 0)
        assert nonzero == kept, b
        if kept:
            assert sd[f"encoder.blocks.{b}.attention.output_projection.weight"].shape[1] == 8 * len(kept), b
    assert [b for b, kept in enumerate(classes.AlessioTinyImageNetPrunedViT.KEPT) if not kept] == [2, 4, 5]
