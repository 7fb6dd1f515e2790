"""`matrix.toml`: models x targets, each model with its calibration/validation data.

    targets = ["onnx", "intel-cpu"]      # every model's targets (a model may list its own)
    out = "build-matrix"                 # bundles go to OUT/<model>/<target>/ (relative to this file)

    [build]                              # optional, for every row
    calib_size = 64
    seed = 0
    latency = false                      # measure latency and the speed gate (default true)
    max_top1_drop = 1.0                  # gate overrides, as the build flags
    min_agreement = 0.97
    fallback = true                      # the accuracy budget (default on)
    cache_dir = "~/.cache/vitedge"       # calibration cache shared by the rows (default as `build`)

    [[models]]
    name = "digits"                      # default: the file's stem
    path = "examples/digits_vit.pt"
    calib = "calibration/digits/calib"
    val = "calibration/digits/val"       # optional
    targets = ["onnx"]                   # optional

Everything is checked before any build starts: a bad key, a missing file or an unknown
target is one UsageError naming the matrix file and the entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from vitedge.core import limits
from vitedge.app.overrides import ThresholdOverrides
from vitedge.core.errors import ProfileError, UsageError
from vitedge.core.limits import check_number
from vitedge.files.lock import SIBLING_EXTRA
from vitedge.core.paths import NAME_MAX, path_problem
from vitedge.targets.profiles import Thresholds, load_profile
from vitedge.files.safefile import BadDocument, read_toml
from vitedge.validation.reference_cache import ReferenceCacheSettings

BUILD_KEYS = {"calib_size": int, "seed": int, "latency": bool, "max_top1_drop": (int, float), "min_agreement": (int, float),
              "min_speedup": (int, float), "max_p99_ms": (int, float), "near_tie_margin": (int, float),
              "drop_confidence": (int, float), "fallback": bool, "cache_dir": str}
MODEL_KEYS = {"name", "path", "calib", "val", "targets"}
TOP_KEYS = {"targets", "out", "build", "models"}


@dataclass(frozen=True)
class BuildSettings:
    calib_size: int | None = None
    seed: int = 0
    latency: bool = True
    fallback: bool = True
    cache: ReferenceCacheSettings = field(default_factory=ReferenceCacheSettings)  # root: the cache the rows share
    thresholds: ThresholdOverrides = field(default_factory=ThresholdOverrides)  # gate overrides


@dataclass(frozen=True)
class MatrixRow:
    model_name: str
    model: Path
    target: str  # as written (a profile name or a .toml path)
    target_name: str  # the profile's name
    calib: Path
    val: Path | None
    bundle: Path
    settings: BuildSettings

    @property
    def label(self) -> str:
        return f"{self.model_name}/{self.target_name}"

    @property
    def calibration_key(self) -> tuple:
        """Rows with the same key share calibration statistics (the cache keys on the same graph and data)."""
        return (str(self.model), str(self.calib), self.settings.calib_size, self.settings.seed)


@dataclass(frozen=True)
class Matrix:
    path: Path
    out: Path
    rows: tuple[MatrixRow, ...] = field(default_factory=tuple)


def _where(path: Path, what: str) -> str:
    return f"{path}: {what}"


def _check_keys(path: Path, where: str, got: dict[str, Any], allowed) -> None:
    unknown = sorted(set(got) - set(allowed))
    if unknown:
        raise UsageError(_where(path, f"unknown key '{unknown[0]}' in {where} (allowed: {', '.join(sorted(allowed))})"))


def _file(base: Path, matrix: Path, where: str, value: Any) -> Path:
    if not isinstance(value, str) or not value:
        raise UsageError(_where(matrix, f"{where} must be a path string"))
    problem = path_problem(value) or path_problem(base / value)
    if problem is not None:
        raise UsageError(_where(matrix, f"{where} {value[:120]!r} {problem}"))
    p = Path(value).expanduser()
    p = p if p.is_absolute() else base / p
    if not p.exists():
        raise UsageError(_where(matrix, f"{where} {value!r} does not exist ({p})"))
    return p.resolve()


def _targets(matrix: Path, where: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(t, str) and t for t in value):
        raise UsageError(_where(matrix, f"{where} must be a non-empty list of target names"))
    return list(value)


def _build_settings(matrix: Path, base: Path, data: Any) -> BuildSettings:
    if not isinstance(data, dict):
        raise UsageError(_where(matrix, "[build] must be a table"))
    _check_keys(matrix, "[build]", data, BUILD_KEYS)
    for k, v in data.items():
        if not isinstance(v, BUILD_KEYS[k]) or (BUILD_KEYS[k] is int and isinstance(v, bool)):
            raise UsageError(_where(matrix, f"[build] {k} has the wrong type ({type(v).__name__})"))
    thresholds = {k: float(data[k]) for k in ("max_top1_drop", "min_agreement", "min_speedup", "max_p99_ms",
                                              "near_tie_margin", "drop_confidence") if k in data}
    if data.get("calib_size") is not None and data["calib_size"] < 1:
        raise UsageError(_where(matrix, "[build] calib_size must be at least 1"))
    try:  # every number within its sane bound (vitedge.core.limits), before any row is built
        if data.get("calib_size") is not None:
            check_number("calib_size", data["calib_size"], 1, limits.MAX_ITEMS, integer=True)
        check_number("seed", data.get("seed", 0), 0, limits.MAX_SEED, integer=True)
        Thresholds(**thresholds)
    except UsageError as err:
        raise UsageError(_where(matrix, f"[build] {err}")) from None
    cache = data.get("cache_dir")
    root = (Path(cache).expanduser() if Path(cache).expanduser().is_absolute() else base / cache) if cache else None
    return BuildSettings(calib_size=data.get("calib_size"), seed=int(data.get("seed", 0)), latency=bool(data.get("latency", True)),
                         fallback=bool(data.get("fallback", True)), cache=ReferenceCacheSettings(root=root),
                         thresholds=ThresholdOverrides.of(thresholds))


def load_matrix(path: Path, out: Path | None = None) -> Matrix:
    """The matrix at ``path``, every row checked; ``out`` (the --out flag) overrides the file's."""

    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist: pass a matrix.toml (see docs/scale.md)")
    try:
        data = read_toml(path)
    except BadDocument as err:
        raise UsageError(str(err)) from None
    except OSError as err:
        raise UsageError(f"{err}: pass a matrix.toml (see docs/scale.md)") from None
    base = path.resolve().parent
    _check_keys(path, "the top level", data, TOP_KEYS)
    settings = _build_settings(path, base, data.get("build", {}))
    default_targets = _targets(path, "targets", data["targets"]) if "targets" in data else None
    out_dir = Path(out) if out is not None else base / str(data.get("out", "build-matrix"))
    models = data.get("models")
    if not isinstance(models, list) or not models:
        raise UsageError(_where(path, "no [[models]] entries: add at least one (name, path, calib)"))
    rows: list[MatrixRow] = []
    names: set[str] = set()
    profiles: dict[str, str] = {}
    bundles: dict[str, str] = {}  # where each row writes -> the row: two rows into one folder are refused
    for i, m in enumerate(models):
        where = f"[[models]] #{i + 1}"
        if not isinstance(m, dict):
            raise UsageError(_where(path, f"{where} must be a table"))
        _check_keys(path, where, m, MODEL_KEYS)
        for need in ("path", "calib"):
            if need not in m:
                raise UsageError(_where(path, f"{where} has no '{need}'"))
        model = _file(base, path, f"{where} path", m["path"])
        name = str(m.get("name") or (model.stem if model.is_file() else model.name))
        if name in names:
            raise UsageError(_where(path, f"two models are named '{name}'; give one a distinct name"))
        names.add(name)
        calib = _file(base, path, f"{where} calib", m["calib"])
        val = _file(base, path, f"{where} val", m["val"]) if m.get("val") else None
        targets = _targets(path, f"{where} targets", m["targets"]) if "targets" in m else default_targets
        if not targets:
            raise UsageError(_where(path, f"{where} has no targets and the matrix sets no top-level 'targets'"))
        if len(set(targets)) != len(targets):
            raise UsageError(_where(path, f"{where} lists a target twice"))
        targets = [str(base / t) if t.endswith(".toml") and not Path(t).is_absolute() else t for t in targets]
        for t in targets:
            if t not in profiles:
                try:
                    profiles[t] = load_profile(t).name
                except ProfileError as err:
                    raise UsageError(_where(path, f"{where}: {err}")) from None
            bundle = _bundle_path(path, out_dir, where, name, t, profiles[t])
            key = os.path.normcase(os.path.abspath(bundle))
            if key in bundles:
                raise UsageError(_where(path, f"rows {bundles[key]} and {name} / {t} both write {bundle}: two profiles with the name "
                                              f"'{profiles[t]}'; give one a distinct 'name' (bundles go to OUT/<model>/<profile name>/)"))
            bundles[key] = f"{name} / {t}"
            rows.append(MatrixRow(name, model, t, profiles[t], calib, val, bundle, settings))
    return Matrix(path, out_dir, tuple(rows))


def _folder_name(matrix: Path, where: str, what: str, value: str) -> str:
    """``value`` as one folder name under OUT; a UsageError for a name that could leave it (``..``, ``/abs``, ``a/b``)."""
    if (not value or value in (".", "..") or "/" in value or "\\" in value or "\0" in value or value != value.strip()
            or any(ord(c) < 32 for c in value)):
        raise UsageError(_where(matrix, f"{where} {what} {value!r} is not a plain folder name (no '/', '..', absolute path or "
                                        "control character): each row is written to OUT/<model>/<profile name>/; rename it"))
    problem = path_problem(value)
    if problem is not None:
        raise UsageError(_where(matrix, f"{where} {what} {value[:40]!r}... {problem} (each row is written to OUT/<model>/<profile name>/)"))
    size = len(value.encode("utf-8"))
    if size + SIBLING_EXTRA > NAME_MAX:  # the row's folder and vitedge's temporary names beside it
        raise UsageError(_where(matrix, f"{where} {what} {value[:40]!r}... is {size} bytes; a row's folder name (with vitedge's "
                                        f"temporary names beside it) takes at most {NAME_MAX - SIBLING_EXTRA}: use a shorter name"))
    return value


def _bundle_path(matrix: Path, out_dir: Path, where: str, name: str, target: str, profile_name: str) -> Path:
    """OUT/<model>/<profile name>, refused when it would not stay inside OUT (even through a symlink)."""
    bundle = out_dir / _folder_name(matrix, where, "name", name) / _folder_name(matrix, f"{where} target {target}:", "profile name", profile_name)
    problem = path_problem(bundle)
    if problem is not None:
        raise UsageError(_where(matrix, f"{where}: row {name[:40]} / {target} would be written to a path that {problem}"))
    root = os.path.realpath(out_dir)
    real = os.path.realpath(bundle)
    if os.path.commonpath([root, real]) != root or real == root:
        raise UsageError(_where(matrix, f"{where}: row {name} / {target} would be written to {real}, outside the output folder {root} "
                                        "(a symlink inside it?); remove the link or choose another out"))
    return bundle
