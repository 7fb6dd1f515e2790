"""`vitedge init MODEL`: a commented starter vitedge.toml from what `inspect` understood."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from vitedge import __version__
from vitedge.core.errors import UsageError
from vitedge.cli.project_config import CONFIG_NAME

DEFAULT_TARGETS = ("onnx",)


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quotes, backslashes and every control character escaped, so a
    file name holding a newline or a quote stays one value and never becomes a key. A name that is not
    valid UTF-8 (it reaches Python as lone surrogates) cannot be written in TOML at all: UsageError."""
    out = []
    for ch in str(text):
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        elif 0xD800 <= ord(ch) <= 0xDFFF:
            raise UsageError(f"{text.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8, which a TOML file cannot hold; rename it")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_key(key: str) -> str:
    return key if _BARE_KEY.match(key) else toml_string(key)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_key(str(k))} = {_toml(v)}" for k, v in value.items()) + " }"
    return toml_string(str(value))


def comment_safe(line: str) -> str:
    """A comment line with every control character (a newline would end the comment and start a key) and
    every undecodable byte of a file name shown escaped."""
    text = line.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(ch if ch == "\t" or not (ord(ch) < 0x20 or ord(ch) == 0x7F) else f"\\x{ord(ch):02x}" for ch in text)


def _rel(path: Path, base: Path) -> str:
    rel = os.path.relpath(Path(path).absolute(), base.absolute())
    return Path(rel).as_posix()


def render_config(loaded, config_path: Path, *, calib: Path | None = None, val: Path | None = None,
                  targets: tuple[str, ...] = (), output: str = "build", model_flags: dict[str, Any] | None = None,
                  known_targets: list[str] | None = None) -> str:
    """The text of a starter config for ``loaded`` (a vitedge.models.intake.LoadedModel) at ``config_path``."""
    spec, pre = loaded.spec, loaded.spec.preprocess
    base = config_path.absolute().parent
    src = spec.sources
    h, w = spec.image_size
    what = "embedding (no classification head)" if spec.output_kind == "embedding" else f"{spec.num_classes} classes"
    heads_from = src.get("num_heads", "file")
    lines = [
        f"# vitedge project config, written by `vitedge init` (vitedge {__version__}).",
        "# `vitedge build` and `vitedge validate` read it from this folder or any folder below it; flags",
        "# override it, and `vitedge build --dry-run` prints every setting and where it came from.",
        "# Keys are the long flags (calib-size = 64 is --calib-size 64); paths are relative to this file.",
        "",
        f"# {loaded.path.name}: {spec.family} {spec.variant}{', ' + spec.arch_name if spec.arch_name else ''}, {h}x{w} px,",
        f"# patch {spec.patch_size}, width {spec.embed_dim}, depth {spec.depth}, {spec.num_heads} heads (from {heads_from}), {what}.",
        f"model = {_toml(_rel(loaded.path, base))}",
    ]
    flags = {k: v for k, v in (model_flags or {}).items() if v not in (None, False, (), {})}
    if flags:
        lines.append("# model flags given to `vitedge init`")
        lines += [f"{toml_key(k.replace('_', '-'))} = {_toml(v)}" for k, v in flags.items()]
    elif spec.num_heads and heads_from not in ("file",):
        lines.append(f"# num-heads = {spec.num_heads}   # set it if the {heads_from} guess is wrong")
    lines += [
        "",
        "# Preprocessing vitedge will apply (from " + str(src.get("preprocess", "default")) + "): resize to cover "
        f"{pre.resize_size[0]}x{pre.resize_size[1]} ({pre.interpolation}, crop-pct {pre.crop_pct:g}), centre crop {pre.crop_size[0]}x{pre.crop_size[1]},",
        f"# mean {', '.join(f'{m:.4g}' for m in pre.mean)}, std {', '.join(f'{s:.4g}' for s in pre.std)}."
        " Override only if training used something else:",
        f"# mean = {_toml([round(m, 4) for m in pre.mean])}",
        f"# std = {_toml([round(s, 4) for s in pre.std])}",
        "",
        "# Calibration images: a folder (one subfolder per class if labelled), a .npy/.npz or a video.",
        "# A folder holding calib/ + val/ (or train/ + val/) is a split: calibrate on one, validate on the other.",
        (f"calib = {_toml(_rel(calib, base))}" if calib else '# calib = "data/calib"   # set this (or pass --calib)'),
        "# Held-out labelled validation data (default: val/ of a split, else the calibration images).",
        (f"val = {_toml(_rel(val, base))}" if val else '# val = "data/val"'),
        "# calib-size = 256",
        "",
        "# Targets" + (f" (known: {', '.join(known_targets)}; `vitedge targets` says which work here)" if known_targets else "") + ".",
        f"targets = {_toml(list(targets or DEFAULT_TARGETS))}",
        f"output = {_toml(output)}",
        "force = true   # a rebuild replaces the bundles in output",
        "",
        "# The parity gate (default: each target profile's):",
        "[thresholds]",
        "# max_top1_drop = 0.5   # top-1 points lost vs FP32",
        "# min_agreement = 0.99  # top-1 agreement with FP32",
        "# min_speedup = 1.0     # FP32 / INT8 latency at batch 1",
        "# max_p99_ms = 50.0     # INT8 p99 latency at batch 1",
        "",
    ]
    # each element is one line: comments carry names from the model file and the file system, escaped so
    # none can end its line; values are TOML strings (toml_string), which cannot either
    return "\n".join(comment_safe(line) if line.startswith("#") else line for line in lines)


def config_target(out: Path | None) -> Path:
    return Path(out) if out is not None else Path.cwd() / CONFIG_NAME
