"""Class names as the camera apps' label files can hold them.

Triton's ``labels.txt`` is one class per line and nvinfer's (DeepStream) one line of classes separated by ``;``: a
name that holds a line break (or, for nvinfer, a ``;``) would split into two labels and shift every class after it
onto the wrong index, silently. Such characters are replaced (control characters by a space, nvinfer's ``;`` by a
``,``); the manifest keeps the names as the model gave them."""

from __future__ import annotations

import re
from collections.abc import Sequence

_CONTROL = re.compile(r"[\x00-\x1f\x7f\u0085\u2028\u2029]")


def _one_line(name: str) -> str:
    return _CONTROL.sub(" ", str(name))


def _nvinfer_label(name: str) -> str:
    return _one_line(name).replace(";", ",")


def triton_labels(names: Sequence[str]) -> str:
    """``labels.txt`` for Triton: one name per line."""
    return "".join(_one_line(n) + "\n" for n in names)


def nvinfer_labels(names: Sequence[str]) -> str:
    """``labels.txt`` for nvinfer's classifier: the names on one line, separated by ``;``."""
    return ";".join(_nvinfer_label(n) for n in names) + "\n"


def nvinfer_rewritten(names: Sequence[str]) -> int:
    """How many names ``nvinfer_labels`` cannot write as they are."""
    return sum(1 for n in names if _nvinfer_label(n) != str(n))
