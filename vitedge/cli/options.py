"""Click options shared by several commands: one declaration (name, type, choices, default) each.

Choices and defaults come from where they are defined: the quantizer's registries
(vitedge.quantize), the target profile's gate (vitedge.targets.profiles.Thresholds) and
vitedge.validation.defaults. The quantizer's are read when an option is first shown or parsed,
not when it is declared, so `vitedge --help` imports no numpy or quantizer.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from vitedge.core import limits
from vitedge.cli.stats import stats_option
from vitedge.core.errors import UsageError
from vitedge.models.intake import IntakeOptions
from vitedge.core.paths import path_problem
from vitedge.quantize.config import METHODS, WEIGHT_RANGES, QuantConfig
from vitedge.bundle.spec import INTERPOLATIONS


# ---- numbers and paths: every value checked when parsed ------------------------------------------

class Bounded(click.ParamType):
    """A finite int or float in [lo, hi] (``hi`` may be a function of this machine, read when parsing):
    nan, inf and values past a sane bound are refused in one line naming the flag and the bound."""

    def __init__(self, lo: float | None, hi: float | Callable[[], float] | None, *, integer: bool = False,
                 lo_open: bool = False) -> None:
        self.lo, self._hi, self.integer, self.lo_open = lo, hi, integer, lo_open
        self.name = "integer" if integer else "float"

    @property
    def hi(self) -> float | None:
        return self._hi() if callable(self._hi) else self._hi

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not limits.is_number(value):
            try:
                value = int(str(value), 10) if self.integer else float(str(value))
            except ValueError:
                self.fail(f"{value!r} is not {'an integer' if self.integer else 'a number'}", param, ctx)
        if not limits.within(value, self.lo, self.hi, integer=self.integer, lo_open=self.lo_open):
            self.fail(f"{value!r} is not {limits.kind_text(self.integer)}{limits.bounds_text(self.lo, self.hi, self.lo_open)}", param, ctx)
        return value

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str | None:
        return None

    def __repr__(self) -> str:
        return f"Bounded({self.lo}, {self.hi}, integer={self.integer})"


def bounded_int(lo: int, hi: int | Callable[[], int]) -> Bounded:
    return Bounded(lo, hi, integer=True)


def bounded_float(lo: float | None, hi: float | None, *, lo_open: bool = False) -> Bounded:
    return Bounded(lo, hi, lo_open=lo_open)


def threads_type() -> Bounded:
    """Runtime threads: 1 up to limits.max_threads() (a few per CPU of this machine)."""
    return bounded_int(1, limits.max_threads)


class CheckedPath(click.Path):
    """click.Path that refuses an empty path and the file system root in one line, and resolves a path
    that has no name of its own (`.`, `..`, `dir/..`) to the absolute folder it means, so every
    later step sees a real name."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = os.fsdecode(value) if isinstance(value, (bytes, os.PathLike)) else str(value)
        if text.strip() == "":
            self.fail("the path is empty; name a file or folder", param, ctx)
        parts = Path(text).parts
        if not parts or ".." in parts:  # `.`, `./`, `..`, `a/..`: no name of its own
            text = os.path.abspath(text)
        if os.path.abspath(text) == os.path.abspath(os.sep):
            self.fail(f"{text} is the file system root; name a file or a folder below it", param, ctx)
        problem = path_problem(text)
        if problem is not None:
            self.fail(f"{text[:120]} {problem}", param, ctx)
        return super().convert(text, param, ctx)


def model_options(func: Callable) -> Callable:
    """The flags that tell vitedge about a model (see `vitedge inspect --help`)."""
    decorators = [
        click.option("--arch", metavar="NAME", help="Named preset for what a state_dict cannot say (e.g. vit_base_patch16_224, vit_b_16), or any timm architecture: timm's own class, weights loaded strictly."),
        click.option("--num-heads", type=bounded_int(1, limits.MAX_HEADS), help="Attention heads, when neither the file nor a preset says."),
        click.option("--model-class", metavar="FILE.py:CLASS", help="Your own ViT class, built before loading a state_dict."),
        click.option("--model-kwargs", metavar="JSON", default=None, help="Keyword arguments for --model-class, as JSON."),
        click.option("--trust-pickle", is_flag=True, help="Allow full unpickling (whole saved modules). Runs code from the file: only for files you trust."),
        click.option("--input-size", nargs=2, type=bounded_int(1, limits.MAX_INPUT_SIDE), metavar="H W", default=None,
                     help="Export at another resolution; position embeddings are interpolated in 2D."),
        click.option("--output-kind", type=click.Choice(["logits", "embedding"]), default=None,
                     help="What the model outputs, when vitedge cannot tell (custom and ONNX models)."),
        stats_option("--mean", "mean"),
        stats_option("--std", "std"),
        click.option("--crop-pct", type=bounded_float(limits.MIN_CROP_PCT, 1.0), default=None,
                     help=f"Override centre-crop fraction (1.0 = no crop; at least {limits.MIN_CROP_PCT:g})."),
        click.option("--interpolation", type=click.Choice(INTERPOLATIONS), default=None, help="Override resize interpolation."),
    ]
    for deco in reversed(decorators):
        func = deco(func)
    return func


MODEL_OPTION_NAMES = (
    "arch", "num_heads", "model_class", "model_kwargs", "trust_pickle", "input_size",
    "output_kind", "mean", "std", "crop_pct", "interpolation",
)


def intake_options_from(kwargs: dict[str, Any]):
    """Pop the model flags out of a command's kwargs into IntakeOptions."""

    values = {name: kwargs.pop(name, None) for name in MODEL_OPTION_NAMES}
    raw_kwargs = values.pop("model_kwargs")
    model_kwargs: dict[str, Any] = {}
    if raw_kwargs:
        try:
            model_kwargs = json.loads(raw_kwargs)
        except json.JSONDecodeError as err:
            raise UsageError(f"--model-kwargs is not valid JSON ({err.msg} at character {err.pos}); e.g. --model-kwargs '{{\"dim\": 128}}'") from None
        if not isinstance(model_kwargs, dict):
            raise UsageError("--model-kwargs must be a JSON object, e.g. '{\"dim\": 128}'")
    if model_kwargs and not values["model_class"]:
        raise UsageError("--model-kwargs goes with --model-class")
    return IntakeOptions(
        arch=values["arch"],
        num_heads=values["num_heads"],
        model_class=values["model_class"],
        model_kwargs=model_kwargs,
        trust_pickle=bool(values["trust_pickle"]),
        input_size=tuple(values["input_size"]) if values["input_size"] else None,
        output_kind=values["output_kind"],
        mean=tuple(values["mean"]) if values["mean"] else None,
        std=tuple(values["std"]) if values["std"] else None,
        crop_pct=values["crop_pct"],
        interpolation=values["interpolation"],
    )


def with_intake(func: Callable) -> Callable:
    """Decorator: replaces the model flags in kwargs with `intake=IntakeOptions(...)`."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["intake"] = intake_options_from(kwargs)
        return func(*args, **kwargs)

    return model_options(wrapper)


# ---- values read from their registry when first needed ---------------------------------------

class RegistryChoice(click.Choice):
    """A click.Choice whose choices are read from their registry the first time they are needed
    (help, parsing, a config value), not when the option is declared."""

    def __init__(self, load: Callable[[], Sequence[str]]) -> None:
        self._load = load
        self._choices: tuple[str, ...] | None = None
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        if self._choices is None:
            self._choices = tuple(self._load())
        return self._choices


class RegistryHelpOption(click.Option):
    """A click.Option whose help names values (e.g. ``{method}``) read from their registry when the
    help is shown."""

    def __init__(self, *args: Any, help_values: Callable[[], dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._help_values = help_values

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        template = self.help
        self.help = template.format(**self._help_values()) if template else template
        try:
            return super().get_help_record(ctx)
        finally:
            self.help = template


def _methods() -> tuple[str, ...]:

    return METHODS


def _weight_ranges() -> tuple[str, ...]:

    return WEIGHT_RANGES


def quantizer_defaults() -> dict[str, Any]:
    """QuantConfig's defaults, for help texts: ``{method}``, ``{percentile}``, ``{smoothquant_alpha}``,
    ``{quantize_attention}`` (yes/no), ``{weight_range}``."""

    d = QuantConfig()
    return {"method": d.method, "percentile": d.percentile, "smoothquant_alpha": d.smoothquant_alpha,
            "quantize_attention": "yes" if d.quantize_attention else "no", "weight_range": d.weight_range}


def quantizer_option(*decls: str, help: str | None, **attrs: Any) -> Callable:
    """click.option whose help may name the quantizer's defaults (``{method}``, see quantizer_defaults):
    filled in when the help is shown."""
    if help and "{" in help:
        return click.option(*decls, cls=RegistryHelpOption, help_values=quantizer_defaults, help=help, **attrs)
    return click.option(*decls, help=help, **attrs)


# ---- calibration and quantization (build, calibrate) ------------------------------------------

def calibration_method_option(help: str) -> Callable:
    return quantizer_option("--method", type=RegistryChoice(_methods), default=None, help=help)


def percentile_option(help: str) -> Callable:
    return quantizer_option("--percentile", type=bounded_float(None, None), default=None, help=help)


def smoothquant_options(alpha_help: str) -> Callable:
    """--smoothquant-alpha A and --no-smoothquant."""
    def apply(func: Callable) -> Callable:
        func = click.option("--no-smoothquant", is_flag=True, help="Switch SmoothQuant off.")(func)
        return quantizer_option("--smoothquant-alpha", type=bounded_float(None, None), default=None, metavar="A", help=alpha_help)(func)
    return apply


def quantize_attention_option(help: str) -> Callable:
    return quantizer_option("--quantize-attention/--no-quantize-attention", default=None, help=help)


def small_gemms_option(func: Callable) -> Callable:
    return click.option("--float-small-gemms/--quantize-small-gemms", default=None,
                        help="Keep float the GEMMs NVIDIA ModelOpt keeps float for TensorRT: the classifier head (a GEMV at batch 1) "
                             "and any with K or N below 16, such as attention heads narrower than 16 (default: the profile's; "
                             "on for the NVIDIA targets).")(func)


def keep_float_option(func: Callable) -> Callable:
    return click.option("--keep-float", multiple=True, metavar="PATTERN",
                        help="Keep layers in float: node name, kind (linear, head, ...) or fnmatch pattern. Repeatable.")(func)


def cache_dir_option(func: Callable) -> Callable:
    return click.option("--cache-dir", type=CheckedPath(path_type=Path), default=None,
                        help="Calibration and FP32 reference cache [default: $VITEDGE_CACHE_DIR or ~/.cache/vitedge].")(func)


def weight_range_option(help: str) -> Callable:
    return quantizer_option("--weight-range", type=RegistryChoice(_weight_ranges), default=None, help=help)


def calib_size_option(help: str) -> Callable:
    return click.option("--calib-size", type=bounded_int(1, limits.MAX_ITEMS), default=None, help=help)


def seed_option(help: str | None = None) -> Callable:
    """The seed of a seeded subset (--calib-size, --data-size)."""
    return click.option("--seed", type=bounded_int(0, limits.MAX_SEED), default=0, show_default=True, help=help)


def reference_cache_option() -> Callable:
    """Reuse FP32 validation outputs cached beside the calibration cache (build, validate)."""
    return click.option("--reference-cache/--no-reference-cache", default=True, show_default=True,
                        help="Reuse the FP32 reference outputs of an earlier validation with the same FP32 graph, data, runtime, "
                             "settings and CPU, cached in the cache dir under reference/ (--no-reference-cache: reuse nothing).")


def int8_cache_option() -> Callable:
    """Reuse the INT8 outputs of a byte-identical artifact from the same cache (build, validate)."""
    return click.option("--int8-cache/--no-int8-cache", default=True, show_default=True,
                        help="Also reuse the INT8 outputs of an earlier validation of a byte-identical artifact (same quantized "
                             "graph and weights, data, runtime, settings and CPU); any change runs it. --no-int8-cache: always run INT8.")


# ---- the parity gate (build, validate) ---------------------------------------------------------

# flag -> help; each sets the vitedge.targets.profiles.Thresholds field of its name over the profile's
THRESHOLD_FLAGS = {
    "--max-top1-drop": "Gate: most top-1 points lost vs FP32 (overrides the profile).",
    "--min-agreement": "Gate: least top-1 agreement with FP32, a fraction in [0, 1].",
    "--min-speedup": "Gate: least FP32/INT8 median latency ratio at batch 1.",
    "--max-p99-ms": "Gate: most INT8 p99 latency at batch 1, in ms.",
}


def threshold_options(func: Callable) -> Callable:
    """The gate flags; the command receives them as max_top1_drop, min_agreement, min_speedup, max_p99_ms."""
    for flag, text in reversed(THRESHOLD_FLAGS.items()):
        func = click.option(flag, type=float, default=None, help=text)(func)
    return func
