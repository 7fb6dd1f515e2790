"""The project config: `vitedge.toml` (or `[tool.vitedge]` in pyproject.toml), found from the
working directory upward, holding what `build` and `validate` would otherwise take as flags.

Keys are the long flags (`calib-size` or `calib_size`); `targets` (or `target`) is a list,
`output` (or `out`) the bundle folder, `[thresholds]` the parity gate as in target profiles.
Relative paths are relative to the file. Flags given on the command line override it.
Parsing is strict, as for profiles: an unknown key, a wrong type or a missing path is a
one-line error naming the key and the file.

Trust (docs/reliability.md, "What vitedge trusts"): a config is read only when the user named it
(``--config``) or when it sits in the project: the search upward stops at the repository root (a
folder holding ``.git``) or at $HOME, whichever comes first, and the file found must be owned by the
user and writable by no one else. A config found upward that fails that check is ignored as a whole,
with one warning line. The keys that run code or loosen a gate (``SENSITIVE``) are announced on
stderr whenever a config sets them, ``-q`` included, and every report records which config set what.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from vitedge.app.build import BuildRequest, bundle_dirs
from vitedge.core.errors import UsageError
from vitedge.core.paths import check_path, path_problem
from vitedge.targets.profiles import Thresholds, load_profile
from vitedge.files.safefile import BadDocument, FileTooLarge, NotRegularFile, ownership_reason, parse_toml, read_toml

CONFIG_NAME = "vitedge.toml"
PYPROJECT = "pyproject.toml"
PYPROJECT_TABLE = "tool.vitedge"


# ---- the keys --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Key:
    """One config key: its command parameter, what it must be and what `vitedge init` says of it."""

    param: str  # the click parameter it sets
    kind: str  # path | must_exist | str | int | float | bool | str_list | floats3 | ints2 | table | targets | model_class
    help: str = ""


KEYS: dict[str, Key] = {
    "model": Key("model", "must_exist", "the trained ViT (state_dict, TorchScript, .pt2, HF folder or ONNX)"),
    "calib": Key("calib", "must_exist", "calibration data: image folder, .npy/.npz or video; a calib/+val/ folder is a split"),
    "val": Key("val", "must_exist", "held-out labelled validation data"),
    "targets": Key("targets", "targets", "target profiles (see `vitedge targets`) or your own .toml files"),
    "output": Key("out", "path", "bundle folder (one target) or parent of one folder per target"),
    "force": Key("force", "bool"),
    "calib_size": Key("calib_size", "int"),
    "seed": Key("seed", "int"),
    "method": Key("method", "str"),
    "percentile": Key("percentile", "float"),
    "smoothquant_alpha": Key("smoothquant_alpha", "float"),
    "no_smoothquant": Key("no_smoothquant", "bool"),
    "quantize_attention": Key("quantize_attention", "bool"),
    "float_small_gemms": Key("float_small_gemms", "bool"),
    "keep_float": Key("keep_float", "str_list"),
    "bake_preprocess": Key("bake_preprocess", "bool"),
    "cpu_kind": Key("cpu_kind", "str", "the CPU kind the bundles are for (avx2, avx512, avx-vnni, avx512-vnni, amx); default: this CPU's"),
    "no_latency": Key("no_latency", "bool"),
    "no_fallback": Key("no_fallback", "bool"),
    "fallback_max_evals": Key("fallback_max_evals", "int"),
    "cache_dir": Key("cache_dir", "path"),
    "reference_cache": Key("reference_cache", "bool"),
    "int8_cache": Key("int8_cache", "bool"),
    # model flags (see `vitedge inspect --help`)
    "arch": Key("arch", "str"),
    "num_heads": Key("num_heads", "int"),
    "model_class": Key("model_class", "model_class"),
    "model_kwargs": Key("model_kwargs", "table"),
    "trust_pickle": Key("trust_pickle", "bool"),
    "input_size": Key("input_size", "ints2"),
    "output_kind": Key("output_kind", "str"),
    "mean": Key("mean", "floats3"),
    "std": Key("std", "floats3"),
    "crop_pct": Key("crop_pct", "float"),
    "interpolation": Key("interpolation", "str"),
}
ALIASES = {"target": "targets", "out": "output"}
SECTIONS = ("thresholds",)

# click parameter -> what setting it from a config does. Such a key is announced on stderr every time
# (-q included) and honoured only from a trusted config (named with --config, or in the project and
# writable only by its owner, the user).
SENSITIVE: dict[str, str] = {
    "model_class": "imports and runs a Python file",
    "model_kwargs": "arguments for that Python code",
    "trust_pickle": "unpickles the model file, which can run code",
    "cache_dir": "results cached there are believed",
    "no_latency": "drops the speed gate",
    "max_top1_drop": "sets the parity gate",
    "min_agreement": "sets the parity gate",
    "min_speedup": "sets the parity gate",
    "max_p99_ms": "sets the parity gate",
    "min_decisive_agreement": "sets the parity gate",
    "near_tie_margin": "sets the parity gate",
    "drop_confidence": "sets the parity gate",
    "targets": "a profile file carries its own [thresholds]",  # only when a target is a file (is_sensitive)
}


def is_sensitive(param: str, value: object) -> bool:
    """Whether a config setting ``param`` to ``value`` runs code or loosens a gate: every key of SENSITIVE,
    `targets` only when one of them is a profile file (a name picks one of vitedge's own profiles)."""
    if param == "targets":
        return any(isinstance(t, (str, Path)) and (str(t).endswith(".toml") or "/" in str(t)) for t in (value or ()))
    return param in SENSITIVE


@dataclass(frozen=True)
class ProjectConfig:
    path: Path  # the file
    table: str | None  # "tool.vitedge" when read from pyproject.toml
    values: dict[str, Any] = field(default_factory=dict)  # click parameter -> value (paths resolved)
    keys: dict[str, str] = field(default_factory=dict)  # click parameter -> the key as written

    @property
    def label(self) -> str:
        return f"{self.path} [{self.table}]" if self.table else str(self.path)

    def where(self, param: str) -> str:
        return f"{self.path.name}:{self.keys.get(param, param)}"


# ---- finding and parsing ---------------------------------------------------------------------

def search_folders(start: Path | None = None) -> list[Path]:
    """The folders searched for a config: ``start`` (the working directory) and those above it, up to and
    including the repository root (the first folder holding ``.git``) or $HOME, whichever comes first."""
    here = Path(start or Path.cwd()).resolve()
    home = _home()
    folders = []
    for folder in (here, *here.parents):
        folders.append(folder)
        if os.path.lexists(folder / ".git") or (home is not None and folder == home):
            break
    return folders


def _home() -> Path | None:
    try:
        return Path.home().resolve()
    except (RuntimeError, KeyError, OSError):
        return None


def find_config(start: Path | None = None) -> Path | None:
    """vitedge.toml, or a pyproject.toml with [tool.vitedge], in ``start`` (the working directory) or above,
    no higher than the repository root or $HOME (see :func:`search_folders`)."""
    for folder in search_folders(start):
        if (folder / CONFIG_NAME).is_file():
            return folder / CONFIG_NAME
        pyproject = folder / PYPROJECT
        if pyproject.is_file() and _pyproject_table(pyproject) is not None:
            return pyproject
    return None


def untrusted_reason(path: Path) -> str | None:
    """Why a config found upward may not be read (None when it may): it must be owned by the user running
    vitedge and writable by no one else, and so must everything that decides what it holds: a link is judged by
    who owns the link itself, not its target, and every folder on the way must be the user's or root's and not
    writable by others (``safefile.ownership_reason``), so nobody but the user can have put a key in it."""
    try:
        return ownership_reason(path)
    except OSError as err:
        return f"it cannot be examined ({err.strerror or err})"


@dataclass(frozen=True)
class ConfigChoice:
    """The config a command uses and why it is trusted, or the one it ignored and why."""

    path: Path | None  # the config read (None: none)
    how: str = ""  # why it is trusted: "named with --config" | "found from the working directory upward, owned by you ..."
    ignored: Path | None = None  # a config found upward that is not read
    why_ignored: str = ""


def choose_config(explicit: Path | None, start: Path | None = None) -> ConfigChoice:
    """``--config FILE`` when given (the user's choice: trusted), else the config found upward if it passes
    :func:`untrusted_reason`, else none (with the reason it was ignored)."""
    if explicit is not None:
        return ConfigChoice(Path(explicit), "named with --config")
    found = find_config(start)
    if found is None:
        return ConfigChoice(None)
    reason = untrusted_reason(found)
    if reason is not None:
        return ConfigChoice(None, ignored=found, why_ignored=reason)
    return ConfigChoice(found, "found from the working directory upward, owned by you and writable only by you")


def ignored_warning(choice: ConfigChoice) -> str:
    return (f"vitedge: WARNING: ignoring {choice.ignored}: {choice.why_ignored}; a config found upward is read only when you own it "
            f"and only you can write it: `chmod go-w {choice.ignored}` if it is yours, or pass --config {choice.ignored} to use it anyway")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return read_toml(path)
    except BadDocument as err:
        raise UsageError(f"{err}; fix or remove it") from None
    except (NotRegularFile, FileTooLarge) as err:
        raise UsageError(f"{err}; a config is a small text file: fix or remove it") from None
    except OSError as err:
        raise UsageError(f"{path}: cannot be read ({err.__class__.__name__}); fix or remove it") from None


def _pyproject_table(path: Path) -> dict[str, Any] | None:
    try:
        data = read_toml(path)
    except (BadDocument, OSError):
        return None  # not ours to judge unless it holds [tool.vitedge]
    table = data.get("tool", {}).get("vitedge") if isinstance(data.get("tool"), dict) else None
    return table if isinstance(table, dict) else None


def load_config(path: Path) -> ProjectConfig:
    path = Path(path)
    if not path.exists():
        raise UsageError(f"config file {path} does not exist; pass an existing --config or drop the flag")
    if path.name == PYPROJECT:
        _read_toml(path)  # a syntax error is reported as such
        table = _pyproject_table(path)
        if table is None:
            raise UsageError(f"{path} has no [{PYPROJECT_TABLE}] table; add one or use a {CONFIG_NAME}")
        return parse_config(table, path, PYPROJECT_TABLE)
    return parse_config(_read_toml(path), path, None)


def check_config_text(text: str, path: Path) -> ProjectConfig:
    """Parse ``text`` as the config file ``path`` would be (before it is written)."""
    try:
        data = parse_toml(text, str(path))
    except BadDocument as err:
        raise UsageError(str(err)) from None
    return parse_config(data, path, None)


def parse_config(data: dict[str, Any], path: Path, table: str | None = None) -> ProjectConfig:
    where = f"{path} [{table}]" if table else str(path)
    base = path.absolute().parent
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    seen: dict[str, str] = {}
    allowed = ", ".join(sorted(set(KEYS) | set(SECTIONS)))
    for raw, value in data.items():
        name = ALIASES.get(raw.replace("-", "_"), raw.replace("-", "_"))
        if name in SECTIONS:
            _thresholds(value, where, raw, values, keys)
            continue
        if name not in KEYS:
            hint = ("; thresholds go in a [thresholds] table" if name.replace("_", "-") in _threshold_names(dash=True)
                    or name in _threshold_names() else f" (allowed: {allowed})")
            raise UsageError(f"{where}: unknown key '{raw}'{hint}")
        if name in seen:
            raise UsageError(f"{where}: '{raw}' and '{seen[name]}' set the same thing; keep one")
        seen[name] = raw
        key = KEYS[name]
        values[key.param] = _convert(key, value, raw, where, base)
        keys[key.param] = raw
    return ProjectConfig(path=path, table=table, values=values, keys=keys)


def _threshold_names(dash: bool = False) -> set[str]:

    names = {f.name for f in dataclasses.fields(Thresholds)}
    return {n.replace("_", "-") for n in names} if dash else names


def _thresholds(value: Any, where: str, raw: str, values: dict[str, Any], keys: dict[str, str]) -> None:

    if not isinstance(value, dict):
        raise UsageError(f"{where}: '{raw}' must be a table ([thresholds]), got {value!r}")
    names = _threshold_names()
    for k, v in value.items():
        n = k.replace("-", "_")
        if n not in names:
            raise UsageError(f"{where}: unknown key 'thresholds.{k}' (allowed: {', '.join(sorted(names))})")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UsageError(f"{where}: 'thresholds.{k}' must be a number, got {v!r}")
        values[n] = float(v)
        keys[n] = f"thresholds.{k}"
    try:
        Thresholds(**{n: values[n] for n in names if n in values})
    except UsageError as err:
        raise UsageError(f"{where}: [thresholds] {err}") from None


def _type_error(where: str, raw: str, expected: str, value: object) -> UsageError:
    return UsageError(f"{where}: '{raw}' must be {expected}, got {value!r}")


def _convert(key: Key, value: Any, raw: str, where: str, base: Path) -> Any:
    kind = key.kind
    if kind in ("path", "must_exist"):
        if not isinstance(value, str) or not value:
            raise _type_error(where, raw, "a path (a string)", value)
        check_path(value, f"{where}: '{raw}' names")
        path = _absolute(Path(value).expanduser(), base)
        check_path(path, f"{where}: '{raw}' names")
        if kind == "must_exist" and not path.exists():
            raise UsageError(f"{where}: '{raw}' names {path}, which does not exist (paths are relative to the config file)")
        return path
    if kind == "targets":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items or not all(isinstance(t, str) and t for t in items):
            raise _type_error(where, raw, "a list of target names, e.g. [\"onnx\", \"intel-cpu\"]", value)
        return tuple(str(_resolve_if_path(t, base, where, raw)) for t in items)
    if kind == "model_class":
        if not isinstance(value, str) or ":" not in value:
            raise _type_error(where, raw, "\"FILE.py:CLASS\"", value)
        file, cls = value.rsplit(":", 1)
        return f"{_resolve_if_path(file, base, where, raw, force=True)}:{cls}"
    if kind == "table":
        if not isinstance(value, dict):
            raise _type_error(where, raw, "a table", value)
        return json.dumps(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise _type_error(where, raw, "true or false", value)
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(where, raw, "an integer", value)
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _type_error(where, raw, "a number", value)
        return float(value)
    if kind == "str":
        if not isinstance(value, str):
            raise _type_error(where, raw, "a string", value)
        return value
    if kind == "str_list":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
            raise _type_error(where, raw, "a list of strings", value)
        return tuple(items)
    if kind in ("floats3", "ints2"):
        n, typ, what = (3, (int, float), "3 numbers (R, G, B)") if kind == "floats3" else (2, int, "2 integers (H, W)")
        if not isinstance(value, list) or len(value) != n or any(isinstance(v, bool) or not isinstance(v, typ) for v in value):
            raise _type_error(where, raw, f"a list of {what}", value)
        return tuple(float(v) for v in value) if kind == "floats3" else tuple(value)
    raise AssertionError(kind)  # pragma: no cover - every kind is handled above


def _absolute(path: Path, base: Path) -> Path:
    return path if path.is_absolute() else Path(os.path.normpath(base / path))


def _resolve_if_path(text: str, base: Path, where: str, raw: str, *, force: bool = False) -> str | Path:
    """A target name stays a name; a profile file (.toml or a path) is resolved against the config's folder."""
    if not force and not (text.endswith(".toml") or "/" in text):
        return text
    check_path(text, f"{where}: '{raw}' names")
    path = _absolute(Path(text).expanduser(), base)
    check_path(path, f"{where}: '{raw}' names")
    if not path.is_file():
        raise UsageError(f"{where}: '{raw}' names {path}, which does not exist (paths are relative to the config file)")
    return path


# ---- applying it to a command ----------------------------------------------------------------

def _checked_config(ctx, param, value: Path | None) -> Path | None:
    """--config FILE: a path the OS would refuse (too long, not UTF-8) is a usage error, not an OSError later."""
    if value is not None:
        problem = path_problem(value)
        if problem is not None:
            raise click.BadParameter(f"{str(value)[:120]} {problem}", ctx=ctx, param=param)
    return value


@dataclass(frozen=True)
class Setting:
    name: str
    value: Any
    source: str  # "flag", "CONFIG:key" or "default"


def merge(ctx, kwargs: dict[str, Any], config: ProjectConfig | None) -> list[Setting]:
    """Fill kwargs from the config where no flag was given; return every setting and where it came from."""

    settings = []
    for p in ctx.command.params:
        if p.name not in kwargs:
            continue
        src = ctx.get_parameter_source(p.name)
        name = p.name.upper() if not isinstance(p, click.Option) else max(p.opts, key=len)
        given = src in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT, ParameterSource.PROMPT)
        if not given and config is not None and p.name in config.values:
            kwargs[p.name] = _cast(ctx, p, config.values[p.name], config)
            settings.append(Setting(name, kwargs[p.name], config.where(p.name)))
        else:
            settings.append(Setting(name, kwargs[p.name], "flag" if given else "default"))
    return settings


def _cast(ctx, param, value: Any, config: ProjectConfig) -> Any:
    """Check the value against the flag's own type (choices, ranges)."""

    if isinstance(value, Path) or param.name in ("targets", "model_class", "model_kwargs"):
        return value
    try:
        return param.type_cast_value(ctx, list(value) if isinstance(value, tuple) else value)
    except click.BadParameter as err:
        raise UsageError(f"{config.label}: '{config.keys.get(param.name, param.name)}': {err.format_message()}") from None


def missing(what: str, flag: str, key: str, config: ProjectConfig | None) -> UsageError:
    where = (f"or set {key} in {config.label}" if config is not None
             else f"or set {key} in a {CONFIG_NAME} (none read from {Path.cwd()} upward to the repository root or $HOME; "
                  "`vitedge init MODEL` writes one)")
    return UsageError(f"no {what}: pass {flag} {where}")


def format_settings(settings: list[Setting], config: ProjectConfig | None) -> list[str]:
    head = f"config: {config.label}" if config else f"config: none ({CONFIG_NAME} or [{PYPROJECT_TABLE}] not found from {Path.cwd()} upward)"
    rows = [(s.name, _show(s.value), s.source) for s in settings]
    width = max(len(r[0]) for r in rows) if rows else 0
    vwidth = min(max((len(r[1]) for r in rows), default=0), 48)
    return [head] + [f"  {n:<{width}}  {v:<{vwidth}}  {src}" for n, v, src in rows]


def _show(value: object) -> str:
    if value is None or value == ():
        return "-"
    if isinstance(value, (tuple, list)):
        return ", ".join(str(v) for v in value)
    return str(value)


def with_project_config(require: Callable[[dict[str, Any], ProjectConfig | None], None] | None = None, *,
                        dry_run: bool = False) -> Callable:
    """Decorator for a click command (placed right under @click.command): adds --config (and
    --dry-run), fills the parameters no flag set from the project config, runs ``require`` on
    the result (to name what is still missing) and, with --dry-run, prints the settings instead."""

    def deco(func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            ctx = click.get_current_context()
            explicit = kwargs.pop("config", None)
            dry = kwargs.pop("dry_run", False)
            choice = choose_config(explicit)
            if choice.ignored is not None:
                click.echo(ignored_warning(choice), err=True)  # always, -q included
            config = load_config(choice.path) if choice.path is not None else None
            settings = merge(ctx, kwargs, config)
            used = [s for s in settings if s.source not in ("flag", "default")]
            record = config_record(config, choice, kwargs, used)
            if record and record["sensitive"]:
                click.echo(announce(config, choice, record), err=True)  # always, -q included
            if dry:
                for line in format_settings(settings, config):
                    click.echo(line)
            if require is not None:
                require(kwargs, config)
            if dry:
                return None
            if used and not kwargs.get("quiet"):
                click.echo(f"vitedge: {len(used)} setting(s) from {config.label}", err=True)
            ctx.meta["vitedge.cli.project_config"] = config
            ctx.meta["vitedge.config_record"] = record
            return func(*args, **kwargs)

        wrapper = click.option("--config", "config", type=click.Path(path_type=Path), default=None, metavar="FILE", callback=_checked_config,
                               help=f"Project config (default: {CONFIG_NAME} or [{PYPROJECT_TABLE}] in pyproject.toml, "
                                    "from the working directory upward to the repository root or $HOME, if you own it and only "
                                    "you can write it). Flags override it.")(wrapper)
        if dry_run:
            wrapper = click.option("--dry-run", is_flag=True,
                                   help="Print the effective settings and where each came from (flag, config, default); build nothing.")(wrapper)
        return wrapper

    return deco


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (tuple, list)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and value != value:
        return None  # validation.json is strict JSON (no NaN)
    return value


def config_record(config: ProjectConfig | None, choice: ConfigChoice, kwargs: dict[str, Any], used: list[Setting]) -> dict[str, Any] | None:
    """What the reports record: the config read, why it was trusted, every key it set (flags overrode the
    rest) and which of those run code or loosen a gate; or the config ignored and why."""
    if config is None:
        return {"file": None, "ignored": str(choice.ignored), "why_ignored": choice.why_ignored,
                "set": {}, "sensitive": []} if choice.ignored is not None else None
    params = [p for p in config.values if any(s.source == config.where(p) for s in used)]
    return {
        "file": str(config.path.absolute()) + (f" [{config.table}]" if config.table else ""),
        "trusted": choice.how,
        "set": {config.keys.get(p, p): _jsonable(kwargs.get(p, config.values[p])) for p in params},
        "sensitive": [config.keys.get(p, p) for p in params if is_sensitive(p, config.values[p])],
    }


def announce(config: ProjectConfig, choice: ConfigChoice, record: dict[str, Any]) -> str:
    params = {config.keys.get(p, p): p for p in config.values}
    parts = [f"{k} = {json.dumps(record['set'][k])} ({SENSITIVE[params[k]]})" for k in record["sensitive"]]
    return f"vitedge: {config.label} ({choice.how}) sets what runs code or loosens a gate: " + "; ".join(parts)


def require_build(kwargs: dict[str, Any], config: ProjectConfig | None) -> None:
    if kwargs.get("model") is None:
        raise missing("model", "MODEL", 'model = "path/to/model.pt"', config)
    if not kwargs.get("targets"):
        raise missing("target", "--target NAME (see `vitedge targets`)", 'targets = ["onnx"]', config)
    if kwargs.get("calib") is None:
        raise missing("calibration data", "--calib DATA", 'calib = "path/to/calib"', config)
    for target in kwargs["targets"]:  # an unknown target or a bad profile file is refused now, --dry-run included
        load_profile(target)


def config_bundles(config: ProjectConfig | None) -> list[Path]:
    """The bundle folders a build with this config writes (for `vitedge validate` with no BUNDLE)."""

    if config is None:
        raise UsageError(f"pass BUNDLE (a folder written by `vitedge build`), or run where a {CONFIG_NAME} names "
                         f"model, targets and output (none found from {Path.cwd()} upward)")
    model, targets = config.values.get("model"), config.values.get("targets")
    if model is None or not targets:
        raise UsageError(f"pass BUNDLE, or set model and targets in {config.label} so vitedge knows which bundles it built")
    req = BuildRequest(model=model, targets=tuple(targets), calib=Path("."), out=config.values.get("out"))
    return list(bundle_dirs(req).values())
