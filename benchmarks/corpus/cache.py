"""The corpus cache: checkpoints and test sets that other people published, kept out of git.

Nothing here is committed: the files belong to their authors. ``fill`` gets every file of the manifest
from its public repository at the pinned commit and checks its sha256; everything that uses the corpus
checks the hashes first and skips or stops, naming what is missing, when a file is absent.

    python benchmarks/corpus/cache.py fill                      fetch each pinned commit from GitHub (git over https)
    python benchmarks/corpus/cache.py fill --from-clones DIR    read the commits from local clones instead
    python benchmarks/corpus/cache.py fill --from-debs DIR      read Debian packages from DIR instead of apt-get download
    python benchmarks/corpus/cache.py check                     say what is there and what is missing

Tiny ImageNet's validation images come as one folder of JPEG files and an annotations file naming each image's
class: ``fill`` keeps only the images the annotations give one of the dataset's classes (the tree's ``annotated_by``),
and the tree's digest is over those.

A test set that no repository holds whole (Fashion-MNIST's test images are larger than any repository
copy found) comes from a Debian package instead: ``apt-get download NAME=VERSION``, the .deb's sha256
checked, the file read from its data archive and its own sha256 checked.

``fill`` writes to ``$VITEDGE_CORPUS_CACHE``, else ``~/.cache/vitedge/corpus``. Readers (the tests, the
benchmark) use the first complete folder of: ``$VITEDGE_CORPUS_CACHE``; ``~/.cache/vitedge/corpus``; a
``shared/corpus`` folder next to the checkout (find_cache). Layout::

    models/<id><suffix>                  each checkpoint as its authors committed it (.pth where their file has no suffix)
    data/<dataset>/...                   each test set as its source committed it

Splits made from the test sets (make_split) go to ``$VITEDGE_CORPUS_SPLITS``, else ``splits/`` of the cache
when it is writable, else a folder of the system's temporary directory: a corpus folder may be read-only.

Only the standard library, numpy and Pillow are imported (no torch).
"""

from __future__ import annotations

import argparse
import contextlib
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
SPLITS_ENV = "VITEDGE_CORPUS_SPLITS"
# where `fill` fetches a repository from; {repo} is owner/name
DEFAULT_GIT_URL = "https://github.com/{repo}.git"
# a corpus folder next to the checkout (the checkout's parent holds shared/corpus)
BESIDE_CHECKOUT = HERE.parents[2] / "shared" / "corpus"


def cache_dir() -> Path:
    """Where `fill` writes and what readers use: $VITEDGE_CORPUS_CACHE, else ~/.cache/vitedge/corpus."""
    return Path(os.environ.get(ENV) or DEFAULT_CACHE).expanduser()


def find_cache(manifest: "Manifest", model_ids: list[str] | None = None) -> Path | None:
    """The first folder holding every file the given models (default: all) and their test sets need:
    $VITEDGE_CORPUS_CACHE when set (and only it), else ~/.cache/vitedge/corpus, else shared/corpus next to
    the checkout. None when none is complete."""
    if os.environ.get(ENV):
        candidates = [Path(os.environ[ENV]).expanduser()]
    else:
        candidates = [DEFAULT_CACHE.expanduser(), BESIDE_CHECKOUT]
    for folder in candidates:
        if folder.is_dir() and not problems(manifest, model_ids, root=folder):
            return folder
    return None


def use_cache(folder: Path) -> None:
    """Make every reader of this process (and its subprocesses) use ``folder`` as the corpus."""
    os.environ[ENV] = str(folder)


def writable(folder: Path) -> bool:
    """The folder is meant to be written: its owner write bit is set (a folder made read-only is left alone
    even by a user, such as root, whom the permissions do not stop) and this user may write to it."""
    try:
        return folder.is_dir() and bool(folder.stat().st_mode & 0o200) and os.access(folder, os.W_OK)
    except OSError:
        return False


def splits_dir() -> Path:
    """Where make_split writes: $VITEDGE_CORPUS_SPLITS, else the cache's splits/ when the cache is writable,
    else vitedge-corpus-splits in the system's temporary directory."""
    if os.environ.get(SPLITS_ENV):
        return Path(os.environ[SPLITS_ENV]).expanduser()
    root = cache_dir()
    if writable(root):
        return root / "splits"
    import tempfile

    return Path(tempfile.gettempdir()) / f"vitedge-corpus-splits-{os.getuid() if hasattr(os, 'getuid') else 0}"


@dataclass(frozen=True)
class DebPackage:
    """A Debian package pinned by version and the sha256 of its .deb file."""

    name: str
    version: str
    sha256: str

    @property
    def spec(self) -> str:
        return f"{self.name}={self.version}"


@dataclass(frozen=True)
class FileEntry:
    """One file of a source repository, pinned by commit and sha256; or, with ``deb``, one file of a Debian
    package (``path`` inside its data archive, ``commit`` the package version)."""

    repo: str
    commit: str
    path: str
    sha256: str
    dest: str  # relative to the cache
    deb: DebPackage | None = None

    @property
    def origin(self) -> str:
        return f"Debian package {self.deb.spec}:{self.path}" if self.deb else f"{self.repo} {self.commit[:12]}:{self.path}"


@dataclass(frozen=True)
class TreeEntry:
    """A folder of a source repository: its files' sha256 are folded into one digest (see tree_digest). With
    ``annotated_by`` (the name of a file of the same dataset, lines '<image name> TAB <class> ...'), only the images
    it names with one of ``classes`` are brought and hashed."""

    repo: str
    commit: str
    path: str
    digest: str
    count: int
    dest: str
    annotated_by: str = ""
    classes: tuple[str, ...] = ()


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
    # where the file nests the weights (a training checkpoint: model, optimizer, ...), None for a bare state_dict
    state_dict_key: str | None = None
    # the model's number of outputs where it is not the dataset's number of classes
    outputs: int | None = None
    # True: the model's output index of a class is the dataset's source_labels entry, not the class's position
    source_labels: bool = False
    raw: dict = field(repr=False, compare=False, default_factory=dict)

    @property
    def path(self) -> Path:
        return cache_dir() / self.file.dest


@dataclass(frozen=True)
class Dataset:
    id: str
    kind: str  # "mnist-idx", "image-folders" or "tiny-imagenet-val"
    files: tuple[FileEntry, ...]
    trees: tuple[TreeEntry, ...]
    classes: tuple[str, ...]
    licence: str
    # per class, its index in the labelling the source's models were trained with (None: the position in classes)
    source_labels: tuple[int, ...] | None = None

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
        if "debian_package" in d:  # a test set from a Debian package, not a repository
            pkg = DebPackage(d["debian_package"], d["debian_version"], d["deb_sha256"])
            files = tuple(FileEntry("", pkg.version, f["path"], f["sha256"], f"data/{d['id']}/{f['name']}", pkg)
                          for f in d.get("file", []))
            trees: tuple[TreeEntry, ...] = ()
        else:
            files = tuple(FileEntry(d["repo"], d["commit"], f["path"], f["sha256"], f"data/{d['id']}/{f['name']}")
                          for f in d.get("file", []))
            trees = tuple(TreeEntry(d["repo"], d["commit"], t["path"], t["digest"], int(t["count"]), f"data/{d['id']}/{t['name']}",
                                    t.get("annotated_by", ""), tuple(d["classes"]) if t.get("annotated_by") else ())
                          for t in d.get("tree", []))
        source = tuple(int(i) for i in d["source_labels"]) if "source_labels" in d else None
        if source is not None and len(source) != len(d["classes"]):
            raise ValueError(f"dataset {d['id']}: {len(source)} source_labels for {len(d['classes'])} classes")
        datasets[d["id"]] = Dataset(d["id"], d["kind"], files, trees, tuple(d["classes"]), d["licence"], source)
    models = []
    for m in raw.get("model", []):
        # a file its authors saved without a suffix (a training checkpoint named "vit1") is kept as .pth: vitedge reads a
        # checkpoint by its suffix
        suffix = Path(m["path"]).suffix or ".pth"
        pre = m["preprocess"]
        models.append(Model(
            id=m["id"], file=FileEntry(m["repo"], m["commit"], m["path"], m["sha256"], f"models/{m['id']}{suffix}"),
            model_class=m["model_class"], dataset=m["dataset"], licence=m["licence"], channels=int(pre["channels"]),
            size=int(pre["size"]), mean=tuple(pre["mean"]), std=tuple(pre["std"]), claimed_top1=m.get("claimed_top1"),
            claimed_where=m.get("claimed_where", ""), measured_fp32_top1=m.get("measured_fp32_top1"),
            needs_input_size=bool(m.get("needs_input_size", False)), notes=m.get("notes", ""),
            state_dict_key=m.get("state_dict_key"), outputs=m.get("outputs"), source_labels=m.get("labels") == "source", raw=m,
        ))
    return Manifest(tuple(models), datasets)


def weights_of(model: Model, loaded: dict) -> dict:
    """The state_dict inside what torch.load returned for the model's file: the entry the manifest's
    ``state_dict_key`` names (a training checkpoint), else the whole file."""
    if model.state_dict_key is None:
        return loaded
    if not isinstance(loaded, dict) or model.state_dict_key not in loaded:
        keys = sorted(map(str, loaded)) if isinstance(loaded, dict) else type(loaded).__name__
        raise KeyError(f"model {model.id}: no '{model.state_dict_key}' in its file (the manifest's state_dict_key; it holds {keys})")
    return loaded[model.state_dict_key]


def model_labels(model: Model, ds: Dataset, labels):
    """The dataset's labels (positions in ds.classes) as the model's output indices: the source labelling where the
    model was trained on it (``labels = "source"`` in the manifest), else unchanged."""
    if not model.source_labels:
        return labels
    return source_labels_of(ds, labels, f"model {model.id} is scored on source labels, but ")


def source_labels_of(ds: Dataset, labels, why: str = ""):
    """``labels`` (positions in ds.classes) as the dataset's source labels; ``why`` starts the error's sentence."""
    import numpy as np

    if ds.source_labels is None:
        raise ValueError(f"{why}dataset {ds.id} has no source_labels")
    return np.asarray(ds.source_labels, dtype=np.int64)[labels]


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


def how_to_bring(repo: str, deb: DebPackage | None = None) -> str:
    if deb is not None:
        return (f"`python benchmarks/corpus/cache.py fill` gets it from the Debian package {deb.spec} with apt-get download "
                "(or --from-debs DIR; benchmarks/corpus/fetch.md)")
    return (f"`python benchmarks/corpus/cache.py fill` gets it from {DEFAULT_GIT_URL.format(repo=repo)} "
            "(or --from-clones DIR; benchmarks/corpus/fetch.md)")


def problems(manifest: Manifest, model_ids: list[str] | None = None, root: Path | None = None) -> list[str]:
    """One line per missing or altered file the given models (default: all) and their datasets need, in
    ``root`` (default: cache_dir())."""
    root = cache_dir() if root is None else root
    out: list[str] = []
    models = [manifest.model(i) for i in model_ids] if model_ids else list(manifest.models)
    for m in models:
        out += _file_problem(m.file, f"model {m.id}", root)
    for ds_id in sorted({m.dataset for m in models}):
        ds = manifest.datasets[ds_id]
        for f in ds.files:
            out += _file_problem(f, f"dataset {ds.id}", root)
        for t in ds.trees:
            out += _tree_problem(t, f"dataset {ds.id}", root)
    return out


def _file_problem(f: FileEntry, what: str, root: Path) -> list[str]:
    p = root / f.dest
    if not p.is_file():
        return [f"{what}: {p} is missing ({f.origin}); {how_to_bring(f.repo, f.deb)}"]
    got = sha256_file(p)
    if got != f.sha256:
        return [f"{what}: {p} has sha256 {got[:16]}..., the manifest says {f.sha256[:16]}...; delete it and {how_to_bring(f.repo, f.deb)}"]
    return []


def _tree_problem(t: TreeEntry, what: str, root: Path) -> list[str]:
    p = root / t.dest
    stamp = p.parent / f".{p.name}.verified"
    if not p.is_dir():
        return [f"{what}: {p} is missing ({t.repo} {t.commit[:12]}:{t.path}/, {t.count} files); {how_to_bring(t.repo)}"]
    if stamp.is_file() and stamp.read_text().strip() == t.digest:
        return []  # hashed once after filling: 10,000 small files need not be read at every run
    digest, count = tree_digest(p)
    if digest != t.digest:
        return [f"{what}: {p} ({count} files) does not match the manifest's digest; delete it and {how_to_bring(t.repo)}"]
    if writable(stamp.parent):  # a read-only corpus folder is hashed at every run instead
        with contextlib.suppress(OSError):
            stamp.write_text(t.digest + "\n")
    return []


# ------------------------------------------------------------------ filling from the public repositories


class FillError(Exception):
    """A file that could not be brought (one line)."""


def _git(*args: str, cwd: Path | None = None) -> bytes:
    proc = subprocess.run(["git", *args], capture_output=True, cwd=cwd, stdin=subprocess.DEVNULL,
                          env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        raise FillError(f"git {args[0]}: {lines[-1] if lines else f'exit {proc.returncode}'}")
    return proc.stdout


def clone_in(folder: Path, repo: str) -> Path | None:
    """The git repository (bare or with a work tree) for owner/name in ``folder``: folder/owner+name or
    folder/owner/name, None when neither is one."""
    owner, name = repo.split("/", 1)
    for cand in (folder / f"{owner}+{name}", folder / owner / name):
        if (cand / ".git").exists() or ((cand / "HEAD").is_file() and (cand / "objects").is_dir()):
            return cand
    return None


class GitSource:
    """Pinned commits read from git repositories: local clones (``clones``) or, fetched once per repository
    into a temporary bare repository, ``url`` (a template with {repo}, default GitHub over https)."""

    def __init__(self, work: Path, clones: Path | None = None, url: str = DEFAULT_GIT_URL) -> None:
        self.work, self.clones, self.url = work, clones, url
        self._fetched: dict[tuple[str, str], Path | FillError] = {}

    def repository(self, repo: str, commit: str) -> Path:
        if self.clones is not None:
            found = clone_in(self.clones, repo)
            if found is None:
                owner, name = repo.split("/", 1)
                raise FillError(f"no git repository at {self.clones / (owner + '+' + name)} or {self.clones / owner / name}; "
                                f"clone {DEFAULT_GIT_URL.format(repo=repo)} there")
            return found
        key = (repo, commit)
        if key not in self._fetched:
            bare = self.work / f"{repo.replace('/', '+')}-{commit[:12]}.git"
            shutil.rmtree(bare, ignore_errors=True)
            _git("init", "-q", "--bare", str(bare))
            try:
                _git("fetch", "-q", "--depth", "1", "--no-tags", self.url.format(repo=repo), commit, cwd=bare)
            except FillError as err:
                self._fetched[key] = err  # said once per repository and commit, not once per file
                raise
            self._fetched[key] = bare
        got = self._fetched[key]
        if isinstance(got, FillError):
            raise got
        return got

    def read(self, repo: str, commit: str, path: str) -> bytes:
        return _git("show", f"{commit}:{path}", cwd=self.repository(repo, commit))

    def archive(self, repo: str, commit: str, path: str) -> bytes:
        return _git("archive", "--format=tar", commit, path, cwd=self.repository(repo, commit))


class DebSource:
    """Files of pinned Debian packages: each .deb read from ``debs`` (a folder holding NAME_*.deb files) or,
    without it, brought once with ``apt-get download NAME=VERSION`` into ``work``; its sha256 checked before
    anything is read from it."""

    def __init__(self, work: Path, debs: Path | None = None) -> None:
        self.work, self.debs = work, debs
        self._got: dict[DebPackage, Path | FillError] = {}

    def package(self, deb: DebPackage) -> Path:
        if deb not in self._got:
            try:
                self._got[deb] = self._find(deb) if self.debs is not None else self._download(deb)
            except FillError as err:
                self._got[deb] = err  # said once per package, not once per file
        got = self._got[deb]
        if isinstance(got, FillError):
            raise got
        return got

    def _find(self, deb: DebPackage) -> Path:
        assert self.debs is not None
        for p in sorted(self.debs.glob(f"{deb.name}_*.deb")):
            if sha256_file(p) == deb.sha256:
                return p
        raise FillError(f"no {deb.name}_*.deb with sha256 {deb.sha256[:16]}... in {self.debs}; "
                        f"`apt-get download {deb.spec}` there")

    def _download(self, deb: DebPackage) -> Path:
        if shutil.which("apt-get") is None:
            raise FillError(f"apt-get not found: get the Debian package {deb.spec} (its .deb) and give its folder with --from-debs DIR")
        folder = self.work / f"deb-{deb.name}"
        folder.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["apt-get", "download", deb.spec], capture_output=True, cwd=folder, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.decode(errors="replace").strip().splitlines() if not ln.startswith("W:")]
            raise FillError(f"apt-get download {deb.spec}: {lines[-1] if lines else f'exit {proc.returncode}'}")
        found = sorted(folder.glob(f"{deb.name}_*.deb"))
        if not found:
            raise FillError(f"apt-get download {deb.spec} wrote no .deb file")
        got = sha256_file(found[0])
        if got != deb.sha256:
            raise FillError(f"{found[0].name} has sha256 {got[:16]}..., the manifest says {deb.sha256[:16]}...")
        return found[0]

    def read(self, deb: DebPackage, member: str) -> bytes:
        return deb_member(self.package(deb), member)


def deb_member(deb_file: Path, member: str) -> bytes:
    """The bytes of one file of a .deb's data archive (an ar archive holding data.tar.*), read with the standard
    library (no dpkg needed)."""
    data = deb_file.read_bytes()
    if not data.startswith(b"!<arch>\n"):
        raise FillError(f"{deb_file.name} is not a Debian package (no ar header)")
    pos, want = 8, member.lstrip("./")
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name = header[:16].decode(errors="replace").strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size % 2)
        if not name.startswith("data.tar"):
            continue
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
            for info in tar.getmembers():
                if info.isfile() and info.name.lstrip("./") == want:
                    src = tar.extractfile(info)
                    assert src is not None
                    return src.read()
        raise FillError(f"{deb_file.name} holds no {member}")
    raise FillError(f"{deb_file.name} has no data archive")


def fill(manifest: Manifest, clones: Path | None = None, url: str = DEFAULT_GIT_URL, debs: Path | None = None) -> list[str]:
    """Bring every file of the manifest into cache_dir() at its pinned commit, from local clones or over
    git from ``url``, and each file of a Debian package from ``debs`` or apt-get download; check every sha256.
    Returns one line per file still missing or altered."""
    import tempfile

    missing: list[str] = []
    entries: list[FileEntry | TreeEntry] = [m.file for m in manifest.models]
    for ds in manifest.datasets.values():
        entries += list(ds.files) + list(ds.trees)
    root = cache_dir()
    with tempfile.TemporaryDirectory(prefix="vitedge-corpus-fill-") as tmp:
        source = GitSource(Path(tmp), clones, url)
        packages = DebSource(Path(tmp), debs)
        for e in entries:
            dest = root / e.dest
            if (dest.is_file() or dest.is_dir()) and not (
                    _file_problem(e, "", root) if isinstance(e, FileEntry) else _tree_problem(e, "", root)):
                continue
            try:
                if isinstance(e, FileEntry) and e.deb is not None:
                    _write_file(dest, packages.read(e.deb, e.path))
                elif isinstance(e, FileEntry):
                    _write_file(dest, source.read(e.repo, e.commit, e.path))
                else:
                    _extract_tree(source.archive(e.repo, e.commit, e.path), e, dest, annotated_names(e, root))
            except FillError as err:
                missing.append(f"{e.origin if isinstance(e, FileEntry) else f'{e.repo} {e.commit[:12]}:{e.path}'}: {err}")
    return missing + problems(manifest)


def _write_file(dest: Path, data: bytes) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(dest)


def annotated_names(t: TreeEntry, root: Path) -> set[str] | None:
    """The file names a tree keeps: those its annotations file (already in the cache) gives one of the dataset's
    classes; None for a tree kept whole."""
    if not t.annotated_by:
        return None
    path = root / t.dest.rsplit("/", 1)[0] / t.annotated_by
    if not path.is_file():
        raise FillError(f"{t.annotated_by} is not in the cache, and it says which images to keep")
    return {name for name, cls in read_annotations(path) if cls in t.classes}


def read_annotations(path: Path) -> list[tuple[str, str]]:
    """(image name, class) per line of a Tiny ImageNet annotations file ('<name> TAB <wnid> TAB <box>...')."""
    rows = []
    for line in path.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) >= 2 and fields[0].strip():
            rows.append((fields[0].strip(), fields[1].strip()))
    return rows


def _extract_tree(data: bytes, t: TreeEntry, dest: Path, keep: set[str] | None = None) -> None:
    part = dest.with_name(dest.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    prefix = t.path.rstrip("/") + "/"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(prefix) or ".." in member.name.split("/"):
                continue
            if keep is not None and member.name[len(prefix):] not in keep:
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

    MNIST comes as idx files (arrays, HxW uint8); the CIFAR-10 set as class folders of JPEG files; Tiny ImageNet's
    validation set as one folder of JPEG files and an annotations file (the images of the dataset's classes, in the
    annotations' order; the label is the class's position in ds.classes)."""
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
    if ds.kind == "tiny-imagenet-val":
        tree = ds.trees[0]
        folder = ds.root / tree.dest.rsplit("/", 1)[-1]
        index = {name: i for i, name in enumerate(ds.classes)}
        items, labels = [], []
        for name, cls in read_annotations(ds.root / tree.annotated_by):
            if cls in index:
                items.append((name, (folder / name).read_bytes()))
                labels.append(index[cls])
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


def make_split(ds: Dataset, n_calib: int, n_val: int, seed: int = 0, source_labels: bool = False) -> Path:
    """Write (once) <splits_dir()>/<dataset>-c<n>-v<n>-s<seed>/{calib,val}/<label>/ as image folders vitedge reads:
    MNIST as lossless PNG, the JPEG files of CIFAR-10 and Tiny ImageNet as they are (byte for byte). With
    ``source_labels`` the folders are named by the dataset's source labels (the model's output indices; folder
    suffix -src), the same images. Returns the folder."""
    import numpy as np
    from PIL import Image

    out = splits_dir() / f"{ds.id}-c{n_calib}-v{n_val}-s{seed}{'-src' if source_labels else ''}"
    if (out / ".complete").is_file():
        return out
    items, labels = load_images(ds)
    if source_labels:
        labels = source_labels_of(ds, labels)
    split = split_indices(len(items), n_calib, n_val, seed)
    part = out.with_name(out.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
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
    f = sub.add_parser("fill", help="get every corpus file at its pinned commit and check its sha256")
    f.add_argument("--from-clones", type=Path, default=None, metavar="DIR",
                   help="read the commits from git clones in DIR (DIR/OWNER+NAME or DIR/OWNER/NAME, bare or not) "
                        "instead of fetching them")
    f.add_argument("--git-url", default=DEFAULT_GIT_URL, metavar="TEMPLATE",
                   help="where to fetch a repository from, {repo} standing for OWNER/NAME (default: %(default)s)")
    f.add_argument("--from-debs", type=Path, default=None, metavar="DIR",
                   help="read the Debian packages the manifest names from .deb files in DIR instead of apt-get download")
    sub.add_parser("check", help="check the cache against the manifest's hashes")
    args = ap.parse_args(argv)
    manifest = load_manifest()
    if args.cmd == "fill" and args.from_clones is not None and not args.from_clones.is_dir():
        print(f"--from-clones {args.from_clones}: no such folder", file=sys.stderr)
        return 2
    if args.cmd == "fill" and args.from_debs is not None and not args.from_debs.is_dir():
        print(f"--from-debs {args.from_debs}: no such folder", file=sys.stderr)
        return 2
    bad = fill(manifest, args.from_clones, args.git_url, args.from_debs) if args.cmd == "fill" else problems(manifest)
    for line in bad:
        print(line)
    if bad:
        print(f"{len(bad)} problem(s); the cache is {cache_dir()}")
        return 1
    print(f"corpus complete: {len(manifest.models)} models, {len(manifest.datasets)} test sets in {cache_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
