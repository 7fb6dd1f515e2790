"""What the user sets over a target profile, as typed records: the quantizer flags over the profile's
``[quantization]`` (``QuantOverrides``) and the gate flags over its ``[thresholds]``
(``ThresholdOverrides``). Unset (None) leaves the profile's value."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from vitedge.errors import UsageError
from vitedge.profiles import TargetProfile, Thresholds
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

    def __post_init__(self) -> None:
        if self.smoothquant_off and self.smoothquant_alpha is not None:
            raise UsageError("--no-smoothquant and --smoothquant-alpha contradict each other; pass one")

    @classmethod
    def from_flags(cls, *, method: str | None, percentile: float | None, smoothquant_alpha: float | None,
                   no_smoothquant: bool, quantize_attention: bool | None, weight_range: str | None) -> QuantOverrides:
        """The quantizer flags as `vitedge build` and `vitedge calibrate` take them: --percentile alone means
        the percentile method (with another --method, QuantConfig refuses it, naming the flag)."""
        if percentile is not None and method is None:
            method = "percentile"
        return cls(method=method, percentile=percentile, smoothquant_alpha=smoothquant_alpha, smoothquant_off=no_smoothquant,
                   quantize_attention=quantize_attention, weight_range=weight_range)

    @classmethod
    def pop_flags(cls, flags: dict[str, object]) -> QuantOverrides:
        """Take the quantizer flags (``QUANT_FLAGS``) out of a command's flags and read them."""
        return cls.from_flags(**{k: flags.pop(k, None) for k in QUANT_FLAGS})  # type: ignore[arg-type]

    def changes(self) -> dict[str, object]:
        """QuantConfig field -> value, for the fields these overrides set."""
        out: dict[str, object] = {k: v for k, v in (("method", self.method), ("percentile", self.percentile),
                                                    ("quantize_attention", self.quantize_attention),
                                                    ("weight_range", self.weight_range)) if v is not None}
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


QUANT_FLAGS = ("method", "percentile", "smoothquant_alpha", "no_smoothquant", "quantize_attention", "weight_range")
THRESHOLD_FIELDS = ("max_top1_drop", "min_agreement", "min_speedup", "max_p99_ms", "min_embedding_cosine",
                    "min_embedding_cosine_low", "min_nn_agreement", "near_tie_margin", "drop_confidence",
                    "min_decisive_agreement")


@dataclass(frozen=True, kw_only=True)
class ThresholdOverrides:
    """The gate flags of `vitedge build` (and a matrix's ``[build]`` table), each named as the
    ``vitedge.profiles.Thresholds`` field it sets."""

    max_top1_drop: float | None = None
    min_agreement: float | None = None
    min_speedup: float | None = None
    max_p99_ms: float | None = None
    min_embedding_cosine: float | None = None
    min_embedding_cosine_low: float | None = None
    min_nn_agreement: float | None = None
    near_tie_margin: float | None = None
    drop_confidence: float | None = None
    min_decisive_agreement: float | None = None

    @classmethod
    def of(cls, values: Mapping[str, float | None]) -> ThresholdOverrides:
        """From a mapping of field -> value (unknown names are a bug of the caller: TypeError)."""
        return cls(**dict(values))

    @classmethod
    def pop_flags(cls, flags: dict[str, object]) -> ThresholdOverrides:
        """Take the gate flags (``THRESHOLD_FIELDS``) out of a command's flags and read them."""
        return cls.of({k: flags.pop(k, None) for k in THRESHOLD_FIELDS})  # type: ignore[misc]

    def as_dict(self) -> dict[str, float | None]:
        """Every field -> its value or None (what ``vitedge.validation.bundle.ValidateOptions`` takes)."""
        return {k: getattr(self, k) for k in THRESHOLD_FIELDS}

    def set_values(self) -> dict[str, float]:
        """Only the fields set."""
        return {k: v for k, v in self.as_dict().items() if v is not None}

    def apply(self, base: Thresholds) -> Thresholds:
        """``base`` with these values over it; a value out of range names the flag, not the profile key."""
        for k, v in self.set_values().items():
            try:
                dataclasses.replace(Thresholds(), **{k: v})
            except UsageError as err:
                raise UsageError(f"--{k.replace('_', '-')}: {err}") from None
        return base.with_overrides(self.as_dict())
