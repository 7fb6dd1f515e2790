"""Click options shared by every command that reads a model."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

import click

from vitedge.cli_stats import stats_option
from vitedge.errors import UsageError
from vitedge.spec import INTERPOLATIONS


def model_options(func: Callable) -> Callable:
    """The flags that tell vitedge about a model (see `vitedge inspect --help`)."""
    decorators = [
        click.option("--arch", metavar="NAME", help="Named preset for what a state_dict cannot say (e.g. vit_base_patch16_224, vit_b_16), or any timm architecture: timm's own class, weights loaded strictly."),
        click.option("--num-heads", type=click.IntRange(min=1), help="Attention heads, when neither the file nor a preset says."),
        click.option("--model-class", metavar="FILE.py:CLASS", help="Your own ViT class, built before loading a state_dict."),
        click.option("--model-kwargs", metavar="JSON", default=None, help="Keyword arguments for --model-class, as JSON."),
        click.option("--trust-pickle", is_flag=True, help="Allow full unpickling (whole saved modules). Runs code from the file: only for files you trust."),
        click.option("--input-size", nargs=2, type=click.IntRange(min=1), metavar="H W", default=None,
                     help="Export at another resolution; position embeddings are interpolated in 2D."),
        click.option("--output-kind", type=click.Choice(["logits", "embedding"]), default=None,
                     help="What the model outputs, when vitedge cannot tell (custom and ONNX models)."),
        stats_option("--mean", "mean"),
        stats_option("--std", "std"),
        click.option("--crop-pct", type=float, default=None, help="Override centre-crop fraction (1.0 = no crop)."),
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
    from vitedge.models.intake import IntakeOptions

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
