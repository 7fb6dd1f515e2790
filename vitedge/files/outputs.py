"""The one replace rule every command that writes follows, and the cleanup of temporary work
folders killed runs left behind.

:func:`check_output` is called by every writer (build and each build-matrix row, export, calibrate,
init, export-config, validate --report-dir, build-matrix's OUT, engine's BUNDLE, which it completes in place)
before any work, under the output's lock (vitedge/files/lock.py):

1. the output is never one of the run's inputs, a folder holding one, or inside or around a bundle it reads;
2. an output that does not exist is written;
3. an existing one needs ``--force`` (validate's report folder is replaced without it, as always);
4. ``--force`` replaces only an output of the command's own kind that vitedge wrote (``OUTPUT_KINDS``):
   a bundle (manifest.json with a vitedge schema; never a folder of other bundles, which a one-target build's -o
   would delete whole), an ONNX graph carrying vitedge's
   metadata, a config `vitedge init` wrote, a report folder (validation.json with vitedge's schema), a
   camera-app folder (its config's first line), or an empty folder. Anything else (the user's file or folder,
   pyproject.toml, the model) is refused, and nothing is deleted."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from vitedge.core.errors import Interrupted, UsageError
from vitedge.files.safefile import read_json
from vitedge.core.signals import exit_for
from vitedge.files.swap import _WORK, clean_debris, recover_swap
from vitedge.files.swap import work_prefix  # noqa: F401  (re-exported: the commands name their work folders through it)


def clean_work_folders() -> list[Path]:
    """Remove temporary work folders of vitedge runs that were killed (their process is gone)."""
    return clean_debris(Path(tempfile.gettempdir()), (_WORK,))


def is_bundle(path: Path) -> bool:
    manifest = Path(path) / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        data = read_json(manifest)
    except (OSError, ValueError):
        return False
    return str(data.get("schema", "")).startswith("vitedge.manifest/")


def _bundles_in(path: Path) -> list[str]:
    """The names of the bundle folders directly inside ``path``."""
    try:
        return sorted(p.name for p in Path(path).iterdir() if p.is_dir() and not p.is_symlink() and is_bundle(p))
    except OSError:
        return []


def _check_only_its_bundle(path: Path, where: str, flag: str) -> None:
    """A run writes one bundle at ``path`` and deletes only what it wrote: never a folder of other bundles (OUT of a
    several-target build, given to a one-target build: -o names the bundle itself), a bundle holding other bundles,
    nor a place inside another bundle (a several-target build whose -o is a bundle)."""
    if is_bundle(path.parent):
        raise UsageError(f"{where} is inside the bundle {path.parent}; a bundle is never written into another: choose an -o "
                         "that is not a bundle")
    if not path.is_dir() or path.is_symlink():
        return
    inner = _bundles_in(path)
    if not inner:
        return
    shown = ", ".join(inner[:6]) + (", ..." if len(inner) > 6 else "")
    if is_bundle(path):
        raise UsageError(f"{where} is a bundle that holds other bundles ({shown}); --force would delete them with it: "
                         f"choose another {flag}, or move them away yourself")
    raise UsageError(f"{where} holds the bundles of {len(inner)} build{'s' if len(inner) > 1 else ''} ({shown}); this run writes one "
                     f"bundle, which {flag} names, so --force would delete them all: pass {flag} {path / inner[0]} to replace "
                     f"that one, or choose a new {flag}")


def check_replaceable(path: Path) -> None:
    """A one-line UsageError unless --force may replace the bundle folder ``path``."""
    check_output(Path(path), "bundle", force=True)


def prepare_outputs(folders: Iterable[Path], *, force: bool, inputs: Iterable[Path | None] = ()) -> None:
    """Before any work: finish swaps killed runs left half-done, then apply the replace rule to each
    bundle folder (see :func:`check_output`)."""
    clean_work_folders()
    inputs = tuple(inputs)
    for folder in folders:
        recover_swap(Path(folder))
        clean_debris(Path(folder).parent)
        check_output(Path(folder), "bundle", force=force, inputs=inputs)


# ---- the replace rule ------------------------------------------------------------------------

@dataclass(frozen=True)
class OutputKind:
    """One kind of output a command writes: what it is called and how an existing one is proven vitedge's."""

    what: str  # "a bundle folder", used in messages
    folder: bool  # a folder (True) or a file
    owned: Callable[[Path], bool]  # the existing path is an output of this kind vitedge wrote


def _onnx_metadata(path: Path) -> dict[str, str]:
    try:
        import onnx

        return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}
    except Exception:  # not ONNX at all (the user's file): not ours
        return {}


def _is_fp32_graph(path: Path) -> bool:
    meta = _onnx_metadata(path)
    return "vitedge.spec" in meta and "vitedge.quantization" not in meta


def _is_qdq_graph(path: Path) -> bool:
    return "vitedge.quantization" in _onnx_metadata(path)


INIT_HEADER = "# vitedge project config, written by `vitedge init`"


def _is_init_config(path: Path) -> bool:
    if path.name == "pyproject.toml":
        return False  # a project's own file, whatever it holds
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().startswith(INIT_HEADER)
    except (OSError, UnicodeDecodeError):
        return False


def _is_report_dir(path: Path) -> bool:
    if path.name == "report" and is_bundle(path.parent):
        return True  # a bundle's own report/ (not hashed in its manifest)
    try:
        doc = read_json(path / "validation.json")
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and str(doc.get("schema", "")).startswith("vitedge.validation/")


def _starts_with(path: Path, head: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return not path.is_symlink() and f.readline().startswith(head)
    except (OSError, UnicodeDecodeError):
        return False


def _is_camera_dir(path: Path) -> bool:
    """A folder `vitedge export-config` wrote: DeepStream's config_infer.txt, or a Triton repository whose every
    model folder holds a config.pbtxt, each opening with the line vitedge writes (the folder gets no marker file:
    a Triton repository holds model folders only)."""
    if _starts_with(path / "config_infer.txt", "# DeepStream nvinfer config written by vitedge"):
        return True
    models = [p for p in Path(path).iterdir() if not p.name.startswith(".")]
    return bool(models) and all(p.is_dir() and not p.is_symlink()
                                and _starts_with(p / "config.pbtxt", "# Triton model configuration written by vitedge") for p in models)


MATRIX_FILES = ("matrix.md", "matrix.json", "matrix-junit.xml")


def _is_matrix_dir(path: Path) -> bool:
    """OUT of a build matrix. Each OUT/<model>/<target>/ bundle goes through the rule itself (as a bundle);
    OUT is written into, not replaced, so what is checked here is the three reports it overwrites:
    when one exists, matrix.json must be vitedge's."""
    path = Path(path)
    if not any(os.path.lexists(path / name) for name in MATRIX_FILES):
        return True
    try:
        doc = read_json(path / "matrix.json")
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and str(doc.get("schema", "")).startswith("vitedge.matrix/") and all(
        not os.path.lexists(path / name) or (path / name).is_file() and not (path / name).is_symlink() for name in MATRIX_FILES)


OUTPUT_KINDS: dict[str, OutputKind] = {
    "bundle": OutputKind("a bundle folder", True, is_bundle),
    "fp32-onnx": OutputKind("an FP32 ONNX graph vitedge exported", False, _is_fp32_graph),
    "qdq-onnx": OutputKind("an INT8 Q/DQ graph vitedge wrote", False, _is_qdq_graph),
    "config": OutputKind("a config `vitedge init` wrote", False, _is_init_config),
    "report": OutputKind("a report folder vitedge wrote", True, _is_report_dir),
    "camera": OutputKind("a camera-app folder `vitedge export-config` wrote", True, _is_camera_dir),
    "matrix": OutputKind("a build-matrix output folder (its matrix.md, matrix.json, matrix-junit.xml are vitedge's)", True,
                         _is_matrix_dir),
}


def check_output(path: Path, kind: str, *, force: bool, inputs: Iterable[Path | None] = (), reads: Iterable[Path] = (),
                 flag: str = "-o") -> None:
    """The replace rule, checked before any work: a one-line UsageError unless ``path`` may be written.

    ``inputs`` are what the run reads (the model, data, a bundle): the output may not be one of them nor a
    folder holding one. ``reads`` are folders whose content is hashed or read whole (the bundle of
    export-config or validate): the output may not lie inside them either."""

    path = Path(path)
    spec = OUTPUT_KINDS[kind]
    where = f"{flag} {path}"
    _check_not_an_input(path, where, spec, inputs, reads)
    if kind == "bundle":
        _check_only_its_bundle(path, where, flag)
    if not os.path.lexists(path):
        return
    if not spec.folder and path.is_dir():
        raise UsageError(f"{where} is a folder; {flag} names the file to write")
    if not force:
        raise UsageError(f"{where} exists; pass --force to replace it")
    if spec.folder:
        if path.is_symlink():
            raise UsageError(f"{where} is a symlink; vitedge neither replaces a link nor writes through one: name the folder "
                             f"itself, or choose another {flag}")
        if not path.is_dir():
            if kind == "bundle":  # the message build has always given
                raise UsageError(f"{where} is an existing file, not a vitedge bundle; --force replaces only bundle folders vitedge wrote: "
                                 f"choose another {flag} or remove the file yourself")
            raise UsageError(f"{where} is an existing file, not {spec.what}; choose another {flag} or remove the file yourself")
        if spec.owned(path) or not any(path.iterdir()):
            return
        if kind == "bundle":
            raise UsageError(f"{where} is a folder vitedge did not write (no vitedge manifest.json in it or its subfolders); --force "
                             f"replaces only bundles: choose a new {flag} folder, or move its contents away yourself")
        raise UsageError(f"{where} is a folder vitedge did not write; --force replaces only {spec.what}: choose a new {flag} folder, "
                         "or move its contents away yourself")
    if path.is_symlink() or not stat.S_ISREG(os.stat(path).st_mode):
        raise UsageError(f"{where} is not a regular file; --force replaces only {spec.what}: choose another {flag}")
    if not spec.owned(path):
        raise UsageError(f"{where} is not {spec.what}; --force replaces only that: choose another {flag}, or move the file away yourself")


def _check_not_an_input(path: Path, where: str, spec: OutputKind, inputs: Iterable[Path | None], reads: Iterable[Path]) -> None:
    target = Path(os.path.abspath(path))
    real = target.resolve()
    for item in inputs:
        if item is None:
            continue
        item_real = Path(item).resolve()  # an input the run will create (a cache folder) is compared by its path too
        if item_real == real or (os.path.lexists(target) and _same_file(item, target)):
            raise UsageError(f"{where} is {item}, an input of this run; choose another {where.split()[0]}")
        if real in item_real.parents:
            raise UsageError(f"{where} holds {item}, an input of this run; --force would delete it: choose another {where.split()[0]}")
    for folder in reads:
        folder_real = Path(folder).resolve()
        flag = where.split()[0]
        if real == folder_real or folder_real in real.parents:
            raise UsageError(f"{where} is inside {folder}, which this run reads and whose files manifest.json hashes; "
                             f"choose a {flag} outside it")
        if real in folder_real.parents:
            raise UsageError(f"{where} holds {folder}, which this run reads; --force would delete it: choose another {flag}")


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def interrupted_after(done: list[tuple[str, Path]], left: list[tuple[str, Path]], err: BaseException) -> Interrupted:
    """Ctrl-C or SIGTERM during a multi-target build after some bundles were completed: an error that
    names them and says how to finish the rest."""

    what, code = exit_for(err)
    kept = ", ".join(f"{name} ({path})" for name, path in done)
    todo = " ".join(f"--target {name}" for name, _ in left)
    out = left[0][1] if len(left) == 1 else left[0][1].parent
    return Interrupted(f"{what.split(';')[0]} while building {left[0][0]}; complete bundles kept: {kept}; not written: "
                       f"{', '.join(str(p) for _, p in left)}. Finish with the same command, its targets reduced to {todo} -o {out}, "
                       "or rerun every target with --force", exit_code=code)
