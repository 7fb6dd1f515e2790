"""What `--force` may replace, and the cleanup of temporary work folders killed runs left behind.

`--force` replaces only a folder vitedge wrote: a bundle (manifest.json with a vitedge schema), a
folder of such bundles (several targets), or an empty folder. Anything else (a file, a folder with
the user's model or data) is refused before any work is done."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from vitedge.errors import Interrupted, UsageError
from vitedge.signals import exit_for
from vitedge.swap import _WORK, clean_debris, recover_swap
from vitedge.swap import work_prefix as work_prefix  # the commands name their work folders through it


def clean_work_folders() -> list[Path]:
    """Remove temporary work folders of vitedge runs that were killed (their process is gone)."""
    return clean_debris(Path(tempfile.gettempdir()), (_WORK,))


def is_bundle(path: Path) -> bool:
    manifest = Path(path) / "manifest.json"
    if not manifest.is_file():
        return False
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and str(data.get("schema", "")).startswith("vitedge.manifest/")


def is_bundle_tree(path: Path) -> bool:
    children = [p for p in Path(path).iterdir() if not p.name.startswith(".")]
    return bool(children) and all(p.is_dir() and not p.is_symlink() and is_bundle(p) for p in children)


def check_replaceable(path: Path) -> None:
    """A one-line UsageError unless --force may replace ``path``."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        raise UsageError(f"-o {path} is an existing file, not a vitedge bundle; --force replaces only bundle folders vitedge wrote: "
                         "choose another -o or remove the file yourself")
    if is_bundle(path) or is_bundle_tree(path) or not any(path.iterdir()):
        return
    raise UsageError(f"-o {path} is a folder vitedge did not write (no vitedge manifest.json in it or its subfolders); --force "
                     "replaces only bundles: choose a new -o folder, or move its contents away yourself")


def prepare_outputs(folders: Iterable[Path], *, force: bool, inputs: Iterable[Path | None] = ()) -> None:
    """Before any work: finish swaps killed runs left half-done, then refuse folders that exist
    (without --force), that are not vitedge's to replace, or that hold one of the run's ``inputs``."""
    clean_work_folders()
    for folder in folders:
        recover_swap(Path(folder))
        clean_debris(Path(folder).parent)
        if os.path.lexists(folder):
            if not force:
                raise UsageError(f"output folder {folder} exists; pass --force to replace it")
            check_replaceable(folder)
            _check_holds_no_input(Path(folder), inputs)


def _check_holds_no_input(folder: Path, inputs: Iterable[Path | None]) -> None:
    root = folder.resolve()
    for item in inputs:
        if item is None or not os.path.lexists(item):
            continue
        where = Path(item).resolve()
        if where == root or root in where.parents:
            raise UsageError(f"-o {folder} holds {item}, an input of this run; --force would delete it: choose another -o")


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
