"""`--mean` / `--std`: one value per input channel, however the user types them.

Accepted: ``--mean 0.5`` (broadcast to every channel), ``--mean 0.485,0.456,0.406``,
``--mean "0.485 0.456 0.406"`` and, unquoted, ``--mean 0.485 0.456 0.406`` (the option
takes the numbers that follow it). How many values fit is the model's business: intake
checks them against its channel count (vitedge.bundle.spec.fit_stats).
"""

from __future__ import annotations

import re
from typing import Any

import click

_SPLIT = re.compile(r"[\s,]+")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class ChannelValues(click.ParamType):
    name = "VALUES"

    def convert(self, value: Any, param, ctx) -> tuple[float, ...]:
        if isinstance(value, tuple):
            return value
        if isinstance(value, list):  # from a project config (TOML array)
            if value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                return tuple(float(v) for v in value)
            self.fail(f"{value!r} is not a list of numbers; give one per channel, e.g. 0.5 or [0.485, 0.456, 0.406]", param, ctx)
        parts = [p for p in _SPLIT.split(str(value).strip()) if p]
        if not parts or not all(_is_number(p) for p in parts):
            self.fail(f"{value!r} is not a list of numbers; give one per channel, e.g. 0.5 or 0.485,0.456,0.406", param, ctx)
        return tuple(float(p) for p in parts)


class ChannelValuesOption(click.Option):
    """An option that also takes the bare numbers following it (``--mean 0.1 0.2 0.3``)."""

    def add_to_parser(self, parser, ctx) -> None:
        super().add_to_parser(parser, ctx)
        for name in self.opts:
            opt = parser._long_opt.get(name) or parser._short_opt.get(name)
            if opt is None:
                continue
            previous = opt.process

            def process(value: Any, state: Any, _previous=previous) -> None:
                values = [value]
                while state.rargs and _is_number(state.rargs[0]):
                    values.append(state.rargs.pop(0))
                _previous(" ".join(str(v) for v in values), state)

            opt.process = process


def stats_option(flag: str, what: str):
    return click.option(flag, cls=ChannelValuesOption, type=ChannelValues(), metavar="V [V ...]", default=None,
                        help=f"Override normalisation {what}: one value per input channel (space- or comma-separated), or one for all.")
