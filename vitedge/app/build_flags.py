"""`vitedge build`'s flags, typed (``BuildFlags``), to the one ``BuildRequest`` the build workflow takes.

The command (``vitedge.commands.build_cmd``) receives the flags from click, after the project
config (vitedge.toml) filled in what the command line left out, and hands them over as they are:
``BuildFlags(**flags).request()``. Each field is named as the command's parameter."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitedge.app.build import BuildRequest
from vitedge.app.overrides import THRESHOLD_FIELDS, QuantOverrides, ThresholdOverrides
from vitedge.budget import BudgetSettings
from vitedge.models.intake import IntakeOptions
from vitedge.validation.reference_cache import ReferenceCacheSettings


@dataclass(frozen=True, kw_only=True)
class BuildFlags:
    model: Path
    targets: tuple[str, ...]
    calib: Path
    val: Path | None = None
    out: Path | None = None
    force: bool = False
    intake: IntakeOptions
    calib_size: int | None = None
    seed: int = 0
    # the quantizer, over the profile's [quantization]
    method: str | None = None
    percentile: float | None = None
    smoothquant_alpha: float | None = None
    no_smoothquant: bool = False
    quantize_attention: bool | None = None
    weight_range: str | None = None
    keep_float: tuple[str, ...] = ()
    bake_preprocess: bool = False
    # the gate, over the profile's [thresholds] (THRESHOLD_FIELDS)
    max_top1_drop: float | None = None
    min_agreement: float | None = None
    min_speedup: float | None = None
    max_p99_ms: float | None = None
    min_embedding_cosine: float | None = None
    min_embedding_cosine_low: float | None = None
    min_nn_agreement: float | None = None
    near_tie_margin: float | None = None
    drop_confidence: float | None = None
    # latency, the accuracy budget, the caches, the terminal
    no_latency: bool = False
    no_fallback: bool = False
    fallback_max_evals: int
    cache_dir: Path | None = None
    reference_cache: bool = True
    int8_cache: bool = True
    quiet: bool = False

    def quant_overrides(self) -> QuantOverrides:
        return QuantOverrides.from_flags(method=self.method, percentile=self.percentile, smoothquant_alpha=self.smoothquant_alpha,
                                         no_smoothquant=self.no_smoothquant, quantize_attention=self.quantize_attention,
                                         weight_range=self.weight_range)

    def threshold_overrides(self) -> ThresholdOverrides:
        return ThresholdOverrides.of({k: getattr(self, k) for k in THRESHOLD_FIELDS})

    def cache(self) -> ReferenceCacheSettings:
        """The one cache-settings object every stage of the build reads."""
        return ReferenceCacheSettings(enabled=self.reference_cache, root=self.cache_dir, int8_outputs=self.int8_cache)

    def request(self, config_record: dict[str, Any] | None = None) -> BuildRequest:
        """The build these flags ask for; ``config_record``: the project config read and what it set."""
        quant = self.quant_overrides()
        return BuildRequest(
            model=self.model, targets=tuple(self.targets), calib=self.calib, out=self.out, val=self.val, force=self.force,
            intake=self.intake, calib_size=self.calib_size, seed=self.seed, quant_overrides=quant,
            threshold_overrides=self.threshold_overrides(), bake_preprocess=self.bake_preprocess, cache=self.cache(),
            keep_float=tuple(self.keep_float), measure_speed=not self.no_latency,
            budget=BudgetSettings(enabled=not self.no_fallback, max_evals=self.fallback_max_evals, measure_cost=not self.no_latency),
            config_record=config_record,
        )
