"""What the user sets over a target profile, as typed records: the quantizer flags over the profile's
``[quantization]`` (``QuantOverrides``) and the gate flags over its ``[thresholds]``
(``ThresholdOverrides``). Unset (None) leaves the profile's value."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from vitedge.core.errors import UsageError
from vitedge.targets.profiles import THRESHOLD_FIELDS, TargetProfile, ThresholdOverrides  # noqa: F401 - their old import path
from vitedge.quantize.config import QuantConfig


@dataclass(frozen=True, kw_only=True)
class QuantOverrides:
    """The quantizer flags of `vitedge build`. ``smoothquant_off`` (``--no-smoothquant``) switches
    SmoothQuant off whatever the profile says; ``smoothquant_alpha`` sets its strength."""

    method: str | None = None
    percentile: float | None = None
    smoothquant_alpha: float | None = None
    smoothquant_off: bool = False
    quantize_attention: bool | None = None
    weight_range: str | None = None
    float_small_gemms: bool | None = None  # --float-small-gemms / --quantize-small-gemms

    def __post_init__(self) -> None:
        if self.smoothquant_off and self.smoothquant_alpha is not None:
            raise UsageError("--no-smoothquant and --smoothquant-alpha contradict each other; pass one")

    @classmethod
    def from_flags(cls, *, method: str | None, percentile: float | None, smoothquant_alpha: float | None,
                   no_smoothquant: bool, quantize_attention: bool | None, weight_range: str | None,
                   float_small_gemms: bool | None = None) -> QuantOverrides:
        """The quantizer flags as `vitedge build` and `vitedge calibrate` take them: --percentile alone means
        the percentile method (with another --method, QuantConfig refuses it, naming the flag)."""
        if percentile is not None and method is None:
            method = "percentile"
        return cls(method=method, percentile=percentile, smoothquant_alpha=smoothquant_alpha, smoothquant_off=no_smoothquant,
                   quantize_attention=quantize_attention, weight_range=weight_range, float_small_gemms=float_small_gemms)

    @classmethod
    def pop_flags(cls, flags: dict[str, object]) -> QuantOverrides:
        """Take the quantizer flags (``QUANT_FLAGS``) out of a command's flags and read them."""
        return cls.from_flags(**{k: flags.pop(k, None) for k in QUANT_FLAGS})  # type: ignore[arg-type]

    def changes(self) -> dict[str, object]:
        """QuantConfig field -> value, for the fields these overrides set."""
        out: dict[str, object] = {k: v for k, v in (("method", self.method), ("percentile", self.percentile),
                                                    ("quantize_attention", self.quantize_attention),
                                                    ("weight_range", self.weight_range),
                                                    ("float_small_gemms", self.float_small_gemms)) if v is not None}
        if self.smoothquant_off or self.smoothquant_alpha is not None:
            out["smoothquant_alpha"] = None if self.smoothquant_off else self.smoothquant_alpha
        return out

    def config(self, base: Mapping[str, object] | None = None) -> QuantConfig:
        """``base`` (a profile's ``[quantization]``; none: the defaults) with these overrides on top."""
        values: dict[str, object] = dict(base or {})
        values.update(self.changes())
        return QuantConfig(**values)  # QuantConfig checks every value; a bad one names its flag

    def config_for(self, profile: TargetProfile) -> QuantConfig:
        """The profile's ``[quantization]`` with these overrides on top."""
        return self.config(profile.quantization)


QUANT_FLAGS = ("method", "percentile", "smoothquant_alpha", "no_smoothquant", "quantize_attention", "weight_range", "float_small_gemms")
