"""What `build` checks before any work, so a mistake found at the last stage never costs a whole run:
paths that are not UTF-8, output folders that cannot be written, targets this machine cannot build."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
import numpy as np

from vitedge.backends import Backend
from vitedge.datasources.base import CalibrationSource
from vitedge.datasources.sources import check_data_exists
from vitedge.core.errors import BundleError, UsageError
from vitedge.targets.profiles import TargetProfile
from vitedge.bundle.spec import ModelSpec
from vitedge.files.swap import partial_prefix
from vitedge.validation.run import check_labels


def check_utf8(paths: dict[str, Path | None]) -> None:
    """Every path vitedge records (manifest, reports) must be text: refuse one with undecodable bytes."""
    for flag, path in paths.items():
        if path is None:
            continue
        try:
            os.fspath(path).encode("utf-8")
        except UnicodeEncodeError:
            shown = os.fsencode(path).decode("utf-8", "backslashreplace")
            raise UsageError(f"{flag} path {shown} is not valid UTF-8; the manifest and reports record it as text: rename it") from None


def check_writable(folder: Path, flag: str = "-o", *, inside: bool = False) -> None:
    """The nearest existing ancestor of ``folder`` must be a folder we can create entries in (with ``inside``:
    ``folder`` itself when it exists, for one that holds vitedge's entries, such as --cache-dir)."""
    folder = Path(folder)
    probe = folder if inside or folder.parent == folder else folder.parent
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"{flag} {folder} cannot be created: {probe} is a file, not a folder; choose another {flag}")
    try:
        # named as every vitedge temporary is (token and PID), so a run killed right here leaves nothing a later run keeps
        Path(tempfile.mkdtemp(prefix=partial_prefix(folder), suffix=".partial", dir=probe)).rmdir()
    except OSError as err:
        raise UsageError(f"{flag} {folder} cannot be written: {probe}: {err.strerror or err}; choose another {flag} or fix its permissions") from None


def check_targets(profiles: list[TargetProfile], backends: dict[str, Backend]) -> None:
    """Each target's backend usable here (or able to plan without its runtime) and its options honourable."""
    for p in profiles:
        backend = backends[p.name]
        env = backend.check_environment()
        if not env.can_build and not backend.facts.builds_without_runtime:
            raise BundleError(f"target {p.name} needs {p.backend}, which is not usable here: {env.detail}"
                              + (f"; {env.install_hint}" if env.install_hint else ""))
        if env.can_build:
            backend.check_options(p.backend_options)


def preflight(inputs: dict[str, Path | None], cache_root: Path | None, profiles: list[TargetProfile],
              backends: dict[str, Backend], dirs: dict[str, Path]) -> None:
    """``inputs``: the command's paths by flag ("MODEL", "--calib", "--val", "-o"); ``cache_root``: --cache-dir;
    ``dirs``: each target's output folder."""
    check_utf8({**inputs, "--cache-dir": cache_root, **{f"-o ({name})": d for name, d in dirs.items()}})
    for flag in ("--calib", "--val"):  # before the model is loaded and exported
        if inputs.get(flag) is not None:
            check_data_exists(inputs[flag])
    for d in dirs.values():
        check_writable(d)
    if cache_root is not None:
        check_writable(Path(cache_root), "--cache-dir", inside=True)
    check_targets(profiles, backends)


def check_data_labels(source: CalibrationSource, spec: ModelSpec) -> None:
    """Labels beyond the model's classes, found when the data is opened rather than after calibration."""
    labels = source.labels
    if labels and spec.output_kind == "logits" and spec.num_classes:
        check_labels(np.asarray(labels), int(spec.num_classes), source.summary.path)
