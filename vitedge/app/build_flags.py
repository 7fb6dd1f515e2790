"""`vitedge build`'s flags, typed (``BuildFlags``), to the one ``BuildRequest`` the build workflow takes.

The command (``vitedge.cli.commands.build_cmd``) receives the flags from click, after the project
config (vitedge.toml) filled in what the command line left out, and hands them over as they are:
``BuildFlags.from_click(flags).request()``. Each field is named as the command's parameter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitedge.app.build import BuildRequest
from vitedge.app.overrides import QuantOverrides, ThresholdOverrides
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
    quant: QuantOverrides = QuantOverrides()  # the quantizer, over the profile's [quantization]
    keep_float: tuple[str, ...] = ()
    bake_preprocess: bool = False
    cpu_kind: str | None = None  # the CPU kind the bundles are for (BuildRequest.cpu_kind)
    thresholds: ThresholdOverrides = ThresholdOverrides()  # the gate, over the profile's [thresholds]
    # latency, the accuracy budget, the caches, the terminal
    no_latency: bool = False
    no_fallback: bool = False
    fallback_max_evals: int
    cache_dir: Path | None = None
    reference_cache: bool = True
    int8_cache: bool = True
    quiet: bool = False

    @classmethod
    def from_click(cls, flags: Mapping[str, object]) -> BuildFlags:
        """The command's flags as click hands them over (each named as the command's parameter)."""
        rest = dict(flags)
        quant, thresholds = QuantOverrides.pop_flags(rest), ThresholdOverrides.pop_flags(rest)
        return cls(quant=quant, thresholds=thresholds, **rest)  # type: ignore[arg-type]

    def cache(self) -> ReferenceCacheSettings:
        """The one cache-settings object every stage of the build reads."""
        return ReferenceCacheSettings(enabled=self.reference_cache, root=self.cache_dir, int8_outputs=self.int8_cache)

    def request(self, config_record: dict[str, Any] | None = None) -> BuildRequest:
        """The build these flags ask for; ``config_record``: the project config read and what it set."""
        return BuildRequest(
            model=self.model, targets=tuple(self.targets), calib=self.calib, out=self.out, val=self.val, force=self.force,
            intake=self.intake, calib_size=self.calib_size, seed=self.seed, quant_overrides=self.quant,
            threshold_overrides=self.thresholds, bake_preprocess=self.bake_preprocess, cache=self.cache(),
            keep_float=tuple(self.keep_float), measure_speed=not self.no_latency,
            budget=BudgetSettings(enabled=not self.no_fallback, max_evals=self.fallback_max_evals, measure_cost=not self.no_latency),
            config_record=config_record, cpu_kind=self.cpu_kind,
        )
