"""The corpus cache: checkpoints and test sets that other people published, kept out of git.

Nothing here is committed: the files belong to their authors, and the workplace rule is that a
snapshot's code, checkpoints and data are never committed. A session fills the cache from the
repository snapshots the search tool's ``fetch`` brings to /work/.mirror (benchmarks/corpus/fetch.md
lists the calls); CI and scripts cannot reach public repositories, so everything that uses the
corpus skips, naming what is missing, when the cache is empty.

    python benchmarks/corpus/cache.py fill [--mirror /work/.mirror]   copy from the snapshots, check hashes
    python benchmarks/corpus/cache.py check                           say what is there and what is missing

The cache is ``$VITEDGE_CORPUS_CACHE``, else ``~/.cache/vitedge/corpus``. Layout::

    models/<id><suffix>                  each checkpoint as its authors committed it
    data/<dataset>/...                   each test set as its source committed it
    splits/<dataset>/{calib,val}/<label>/<n>.png|jpg   made by make_split(): image folders for vitedge

Only the standard library, numpy and Pillow are imported (no torch).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.toml"
DEFAULT_CACHE = Path("~/.cache/vitedge/corpus")
ENV = "VITEDGE_CORPUS_CACHE"
DEFAULT_MIRROR = Path("/work/.mirror")


def cache_dir() -> Path:
    return Path(os.environ.get(ENV) or DEFAULT_CACHE).expanduser()


@dataclass(frozen=True)
class FileEntry:
    """One file of a source repository, pinned by commit and sha256."""

    repo: str
    commit: str
    path: str
    sha256: str
    dest: str  # relative to the cache


@dataclass(frozen=True)
class TreeEntry:
    """A folder of a source repository: its files' sha256 are folded into one digest (see tree_digest)."""

    repo: str
    commit: str
    path: str
    digest: str
    count: int
    dest: str


@dataclass(frozen=True)
class Model:
    id: str
    file: FileEntry
    model_class: str
    dataset: str
    licence: str
    channels: int
    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    claimed_top1: float | None
    claimed_where: str
    measured_fp32_top1: float | None
    needs_input_size: bool
    notes: str
    raw: dict = field(repr=False, compare=False, default_factory=dict)

    @property
    def path(self) -> Path:
        return cache_dir() / self.file.dest


@dataclass(frozen=True)
class Dataset:
    id: str
    kind: str  # "mnist-idx" or "image-folders"
    files: tuple[FileEntry, ...]
    trees: tuple[TreeEntry, ...]
    classes: tuple[str, ...]
    licence: str

    @property
    def root(self) -> Path:
        return cache_dir() / "data" / self.id


@dataclass(frozen=True)
class Manifest:
    models: tuple[Model, ...]
    datasets: dict[str, Dataset]

    def model(self, model_id: str) -> Model:
        for m in self.models:
            if m.id == model_id:
                return m
        raise KeyError(f"no corpus model '{model_id}' (known: {', '.join(m.id for m in self.models)})")


def load_manifest(path: Path = MANIFEST) -> Manifest:
    raw = tomllib.loads(path.read_text())
    datasets = {}
    for d in raw.get("dataset", []):
        files = tuple(FileEntry(d["repo"], d["commit"], f["path"], f["sha256"], f"data/{d['id']}/{f['name']}") for f in d.get("file", []))
        trees = tuple(TreeEntry(d["repo"], d["commit"], t["path"], t["digest"], int(t["count"]), f"data/{d['id']}/{t['name']}")
                      for t in d.get("tree", []))
        datasets[d["id"]] = Dataset(d["id"], d["kind"], files, trees, tuple(d["classes"]), d["licence"])
    models = []
    for m in raw.get("model", []):
        suffix = Path(m["path"]).suffix
        pre = m["preprocess"]
        models.append(Model(
            id=m["id"], file=FileEntry(m["repo"], m["commit"], m["path"], m["sha256"], f"models/{m['id']}{suffix}"),
            model_class=m["model_class"], dataset=m["dataset"], licence=m["licence"], channels=int(pre["channels"]),
            size=int(pre["size"]), mean=tuple(pre["mean"]), std=tuple(pre["std"]), claimed_top1=m.get("claimed_top1"),
            claimed_where=m.get("claimed_where", ""), measured_fp32_top1=m.get("measured_fp32_top1"),
            needs_input_size=bool(m.get("needs_input_size", False)), notes=m.get("notes", ""), raw=m,
        ))
    return Manifest(tuple(models), datasets)


# ------------------------------------------------------------------ hashes


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_digest(root: Path) -> tuple[str, int]:
    """sha256 over the sorted lines '<relative path> <sha256 of the file>' of every file under root."""
    lines = []
    for p in sorted(root.rglob("*")):
        if p.is_file():
            lines.append(f"{p.relative_to(root).as_posix()} {sha256_file(p)}\n")
    return hashlib.sha256("".join(lines).encode()).hexdigest(), len(lines)


# ------------------------------------------------------------------ what is missing, and how to bring it


def _snapshot(mirror: Path, repo: str) -> Path:
    return mirror / repo.replace("/", "+") / "repo"


def how_to_bring(repo: str) -> str:
    return (f"in a session with the search tool, call fetch(\"github:{repo}\"), then run "
            f"`python benchmarks/corpus/cache.py fill` (benchmarks/corpus/fetch.md)")


def problems(manifest: Manifest, model_ids: list[str] | None = None) -> list[str]:
    """One line per missing or altered file the given models (default: all) and their datasets need."""
    out: list[str] = []
    models = [manifest.model(i) for i in model_ids] if model_ids else list(manifest.models)
    for m in models:
        out += _file_problem(m.file, f"model {m.id}")
    for ds_id in sorted({m.dataset for m in models}):
        ds = manifest.datasets[ds_id]
        for f in ds.files:
            out += _file_problem(f, f"dataset {ds.id}")
        for t in ds.trees:
            out += _tree_problem(t, f"dataset {ds.id}")
    return out


def _file_problem(f: FileEntry, what: str) -> list[str]:
    p = cache_dir() / f.dest
    if not p.is_file():
        return [f"{what}: {p} is missing ({f.repo} {f.commit[:12]}:{f.path}); {how_to_bring(f.repo)}"]
    got = sha256_file(p)
    if got != f.sha256:
        return [f"{what}: {p} has sha256 {got[:16]}..., the manifest says {f.sha256[:16]}...; delete it and {how_to_bring(f.repo)}"]
    return []


def _tree_problem(t: TreeEntry, what: str) -> list[str]:
    p = cache_dir() / t.dest
    stamp = p.parent / f".{p.name}.verified"
    if not p.is_dir():
        return [f"{what}: {p} is missing ({t.repo} {t.commit[:12]}:{t.path}/, {t.count} files); {how_to_bring(t.repo)}"]
    if stamp.is_file() and stamp.read_text().strip() == t.digest:
        return []  # hashed once after filling: 10,000 small files need not be read at every run
    digest, count = tree_digest(p)
    if digest != t.digest:
        return [f"{what}: {p} ({count} files) does not match the manifest's digest; delete it and {how_to_bring(t.repo)}"]
    stamp.write_text(t.digest + "\n")
    return []


# ------------------------------------------------------------------ filling from the fetched snapshots


def _git(git_dir: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True, capture_output=True).stdout


def fill(manifest: Manifest, mirror: Path = DEFAULT_MIRROR) -> list[str]:
    """Copy every file of the manifest from the snapshots under ``mirror``; return what is still missing."""
    missing: list[str] = []
    entries: list[FileEntry | TreeEntry] = [m.file for m in manifest.models]
    for ds in manifest.datasets.values():
        entries += list(ds.files) + list(ds.trees)
    for e in entries:
        dest = cache_dir() / e.dest
        if (dest.is_file() or dest.is_dir()) and not (_file_problem(e, "") if isinstance(e, FileEntry) else _tree_problem(e, "")):
            continue
        git_dir = _snapshot(mirror, e.repo)
        if not git_dir.is_dir():
            missing.append(f"{e.repo}: no snapshot at {git_dir}; {how_to_bring(e.repo)}")
            continue
        try:
            if isinstance(e, FileEntry):
                data = _git(git_dir, "show", f"{e.commit}:{e.path}")
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(dest.name + ".part")
                tmp.write_bytes(data)
                tmp.replace(dest)
            else:
                _extract_tree(git_dir, e, dest)
        except subprocess.CalledProcessError as err:
            msg = err.stderr.decode(errors="replace").strip().splitlines()[:1]
            missing.append(f"{e.repo}: {e.commit[:12]}:{e.path} is not in the snapshot ({' '.join(msg)}); "
                           "the snapshot may be newer than the pinned commit or lack files of 4 MiB and more")
    return missing + problems(manifest)


def _extract_tree(git_dir: Path, t: TreeEntry, dest: Path) -> None:
    data = _git(git_dir, "archive", "--format=tar", t.commit, t.path)
    part = dest.with_name(dest.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    prefix = t.path.rstrip("/") + "/"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(prefix) or ".." in member.name:
                continue
            out = part / member.name[len(prefix):]
            out.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            assert src is not None
            out.write_bytes(src.read())
    shutil.rmtree(dest, ignore_errors=True)
    part.rename(dest)


# ------------------------------------------------------------------ reading the test sets


def load_images(ds: Dataset):
    """Every test image of the dataset, as (list of (relative name, encoded bytes or uint8 array), labels).

    MNIST comes as idx files (arrays, HxW uint8); the CIFAR-10 set as class folders of JPEG files."""
    import numpy as np

    if ds.kind == "mnist-idx":
        images = _read_idx(ds.root / "t10k-images-idx3-ubyte.gz")
        labels = _read_idx(ds.root / "t10k-labels-idx1-ubyte.gz").astype(np.int64)
        return [(f"{i:05d}", images[i]) for i in range(len(images))], labels
    if ds.kind == "image-folders":
        items, labels = [], []
        root = ds.root / ds.trees[0].dest.rsplit("/", 1)[-1]
        for label, name in enumerate(ds.classes):
            for p in sorted((root / name).iterdir()):
                items.append((f"{name}/{p.name}", p.read_bytes()))
                labels.append(label)
        return items, np.asarray(labels, dtype=np.int64)
    raise ValueError(f"unknown dataset kind {ds.kind}")


def _read_idx(path: Path):
    import numpy as np

    raw = gzip.decompress(path.read_bytes())
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def decode(item, channels: int):
    """uint8 HxWxC array of one item (idx arrays are already pixels; files are decoded with Pillow)."""
    import numpy as np
    from PIL import Image

    _, data = item
    if isinstance(data, (bytes, bytearray)):
        img = Image.open(io.BytesIO(data))
        img = img.convert("L" if channels == 1 else "RGB")
        arr = np.asarray(img)
    else:
        arr = np.asarray(data)
    return arr[..., None] if arr.ndim == 2 else arr


@dataclass(frozen=True)
class Split:
    """Disjoint calibration and validation index lists into a dataset's test images (seeded)."""

    calib: tuple[int, ...]
    val: tuple[int, ...]


def split_indices(n_total: int, n_calib: int, n_val: int, seed: int = 0) -> Split:
    import numpy as np

    if n_calib + n_val > n_total:
        raise ValueError(f"{n_calib} calibration + {n_val} validation images > {n_total} available")
    order = np.random.default_rng(seed).permutation(n_total)
    return Split(tuple(int(i) for i in order[n_val:n_val + n_calib]), tuple(int(i) for i in order[:n_val]))


def make_split(ds: Dataset, n_calib: int, n_val: int, seed: int = 0) -> Path:
    """Write (once) splits/<dataset>-c<n>-v<n>-s<seed>/{calib,val}/<label>/ as image folders vitedge reads:
    MNIST as lossless PNG, the JPEG files of CIFAR-10 as they are (byte for byte). Returns the folder."""
    import numpy as np
    from PIL import Image

    out = cache_dir() / "splits" / f"{ds.id}-c{n_calib}-v{n_val}-s{seed}"
    if (out / ".complete").is_file():
        return out
    items, labels = load_images(ds)
    split = split_indices(len(items), n_calib, n_val, seed)
    part = out.with_name(out.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    for sub, idx in (("calib", split.calib), ("val", split.val)):
        for i in idx:
            name, data = items[i]
            folder = part / sub / str(int(labels[i]))
            folder.mkdir(parents=True, exist_ok=True)
            if isinstance(data, (bytes, bytearray)):
                (folder / f"{i:05d}{Path(name).suffix}").write_bytes(data)
            else:
                Image.fromarray(np.asarray(data)).save(folder / f"{i:05d}.png")
    (part / ".complete").write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    part.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fill", help="copy every corpus file from the fetched snapshots and check its hash")
    f.add_argument("--mirror", type=Path, default=DEFAULT_MIRROR)
    sub.add_parser("check", help="check the cache against the manifest's hashes")
    args = ap.parse_args(argv)
    manifest = load_manifest()
    bad = fill(manifest, args.mirror) if args.cmd == "fill" else problems(manifest)
    for line in bad:
        print(line)
    if bad:
        print(f"{len(bad)} problem(s); the cache is {cache_dir()}")
        return 1
    print(f"corpus complete: {len(manifest.models)} models, {len(manifest.datasets)} test sets in {cache_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
