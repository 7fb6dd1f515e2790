"""What calibration produced (``Calibration``), and the candidate calibrations of method ``select``.

Kept apart from ``calibrate.py`` so that ``qdq`` (which reads a Calibration) and ``select`` (which
builds Q/DQ graphs to score the candidates) import it without a cycle through ``calibrate``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitedge.datasources.base import SourceSummary
from vitedge.quantize.config import QUANTIZER_VERSION, QuantConfig
from vitedge.quantize.graph import QuantLayer


@dataclass(frozen=True)
class Variant:
    """One candidate calibration of the same statistics: a threshold per activation (by one of
    ``vitedge.quantize.stats.CANDIDATES``) and the refinement (bias correction, GPTQ) made for them."""

    name: str
    thresholds: dict[str, float]
    refinement: Any = None  # vitedge.quantize.refine.Refinement or None


@dataclass(frozen=True)
class CandidateScore:
    """How far one candidate's full-INT8 graph is from FP32 on the selection images."""

    name: str
    error: float  # the selection metric: mean softmax KL (logits) or mean 1 - cosine (other outputs)
    agreement: float | None  # top-1 agreement with FP32 on the same images (logits), else None
    paired_t: float = 0.0  # paired t of log(first candidate's per-image error / this one's) (select.log_ratio_t)
    samples: int = 0  # images this candidate was scored on (0: the selection's ``samples``, records before the first look)

    def to_dict(self) -> dict[str, Any]:
        t = self.paired_t if np.isfinite(self.paired_t) else (1e9 if self.paired_t > 0 else -1e9)
        return {"name": self.name, "error": float(self.error), "agreement": self.agreement, "paired_t": round(float(t), 4),
                "samples": int(self.samples)}


@dataclass(frozen=True)
class Selection:
    """The choice of method ``select``: every candidate scored at the model's output, best first.

    Every candidate is scored on the first ``first_look`` images; only those at least ``contend_ratio``
    times closer to FP32 than ``first`` there (and ``first`` itself) go on to all ``available`` ones.
    ``samples`` is how many the choice was made on: ``available`` when a candidate contended, else the
    first look's."""

    chosen: str
    metric: str  # "softmax_kl" or "one_minus_cosine"
    samples: int  # calibration images the first candidate (and every contender) was scored on
    scores: tuple[CandidateScore, ...]
    reused: bool = False  # read from the cache: no candidate ran this time
    seconds: float = 0.0
    first: str = ""  # the candidate kept unless another is closer by at least min_t (paired t) and min_ratio times
    min_t: float = 0.0
    min_ratio: float = 1.0
    runs: int = 0  # ONNX Runtime runs this choice took (0 when reused)
    first_look: int = 0  # images every candidate was scored on first (0: all of them, records before it)
    contend_ratio: float = 0.0  # how much closer than ``first`` a candidate had to be there to go on
    available: int = 0  # images kept for scoring (0: ``samples``)

    def to_dict(self) -> dict[str, Any]:
        """Deterministic (no timings, no cache state): it goes into the Q/DQ graph's metadata."""
        return {"chosen": self.chosen, "metric": self.metric, "samples": self.samples, "first": self.first, "min_t": self.min_t,
                "min_ratio": self.min_ratio, "first_look": self.first_look, "contend_ratio": self.contend_ratio,
                "available": self.available, "candidates": [s.to_dict() for s in self.scores]}

    @classmethod
    def from_dict(cls, doc: dict[str, Any], *, reused: bool = False) -> "Selection":
        """The inverse of ``to_dict`` (older records: no first look, every candidate on ``samples``)."""
        scores = tuple(CandidateScore(str(c["name"]), float(c["error"]), None if c["agreement"] is None else float(c["agreement"]),
                                      float(c["paired_t"]), int(c.get("samples", 0))) for c in doc["candidates"])
        return cls(chosen=str(doc["chosen"]), metric=str(doc["metric"]), samples=int(doc["samples"]), scores=scores, reused=reused,
                   first=str(doc["first"]), min_t=float(doc["min_t"]), min_ratio=float(doc["min_ratio"]),
                   first_look=int(doc.get("first_look", 0)), contend_ratio=float(doc.get("contend_ratio", 0.0)),
                   available=int(doc.get("available", 0)))

    def score(self, name: str) -> CandidateScore | None:
        return next((s for s in self.scores if s.name == name), None)

    def one_line(self) -> str:
        metric = "softmax KL" if self.metric == "softmax_kl" else "1 - cosine"
        others = ", ".join(f"{s.name} {s.error:.3g}" for s in self.scores if s.name != self.chosen)
        best = self.score(self.chosen)
        if best is None:
            return f"thresholds by {self.chosen}"
        why = ""
        if self.scores and self.scores[0].name != self.chosen:
            top = self.scores[0]
            why = (f"; {top.name} closer ({best.error / max(top.error, 1e-300):.1f}x, t {top.paired_t:.2f}), short of "
                   f"{self.min_ratio:g}x at t >= {self.min_t:g}: {self.chosen} kept")
        return (f"thresholds by {self.chosen} ({metric} to FP32 {best.error:.3g} on {self.samples} calibration images"
                f"{'; ' + others if others else ''}{why}{self._first_look_text()})")

    def _first_look_text(self) -> str:
        """Which candidates stopped at the first look, and why."""
        if not self.first_look or not self.available or self.first_look >= self.available:
            return ""
        stopped = [s.name for s in self.scores if 0 < s.samples < self.samples]
        if self.samples < self.available:
            return (f"; none {self.contend_ratio:g}x closer than {self.first} on the first {self.samples} images, "
                    f"so none scored on all {self.available}")
        if stopped:
            return f"; {', '.join(stopped)} not {self.contend_ratio:g}x closer on the first {self.first_look} images, stopped there"
        return ""


@dataclass(frozen=True)
class Calibration:
    """What ``calibrate`` measured, ready for ``build_qdq``.

    ``model`` is the prepared FP32 graph with SmoothQuant applied (if on): the graph the
    Q/DQ pairs go into. ``thresholds`` maps each activation tensor of ``layers`` to its
    clipping threshold (INT8 scale = threshold / 127). ``reused`` is True when the
    statistics came from the cache; ``forward_passes`` counts the ONNX Runtime runs this
    call made (0 when reused).
    """

    fp32_path: Path
    fp32_sha256: str
    config: QuantConfig
    model: Any  # onnx.ModelProto
    layers: tuple[QuantLayer, ...]
    thresholds: dict[str, float]
    absmax: dict[str, float]
    smoothing: dict[str, np.ndarray]  # LayerNorm node name -> s
    smoothed_layers: tuple[str, ...]
    summary: SourceSummary
    key: str
    reused: bool
    forward_passes: int
    timings: dict[str, float] = field(default_factory=dict)
    cache_path: Path | None = None
    cache_note: str | None = None  # why the entry could not be written, if it could not
    refinement: Any = None  # vitedge.quantize.refine.Refinement when GPTQ / bias correction is on
    variants: dict[str, Variant] = field(default_factory=dict)  # method "select": every candidate, by name
    selection: Selection | None = None  # method "select": how the candidates scored
    variant: str | None = None  # method "select": the candidate whose thresholds this calibration carries

    def to_dict(self) -> dict[str, Any]:
        """Deterministic description (no timings): goes into the Q/DQ graph's metadata."""
        return {
            "quantizer_version": QUANTIZER_VERSION,
            "config": self.config.to_dict(),
            "fp32_sha256": self.fp32_sha256,
            "cache_key": self.key,
            "calibration": self.summary.to_dict(),
            "smoothquant": {"layernorms": len(self.smoothing), "linear_layers": len(self.smoothed_layers)},
            **({"selection": dict(self.selection.to_dict(), used=self.variant)} if self.selection is not None else {}),
        }

    def with_variant(self, name: str) -> Calibration:
        """The same statistics with candidate ``name``'s thresholds and refinement (method ``select``;
        the accuracy budget tries them before it returns layers to float). No forward pass."""
        if name not in self.variants:
            raise KeyError(f"no calibration candidate '{name}' (have: {', '.join(self.variants) or 'none'})")
        v = self.variants[name]
        return dataclasses.replace(self, thresholds=dict(v.thresholds), refinement=v.refinement, variant=name)

    def one_line(self) -> str:
        s = self.summary
        how = "statistics reused from cache" if self.reused else f"{self.forward_passes} forward passes in {self.timings.get('statistics', 0.0):.1f} s"
        sq = f", SmoothQuant on {len(self.smoothed_layers)} layers" if self.smoothing else ""
        chose = f", {self.selection.one_line()}" if self.selection is not None else ""
        if self.selection is not None and self.variant != self.selection.chosen:
            chose += f"; this graph uses {self.variant}"
        return f"calibrated {self.config.describe()} on {s.used} items (data {s.data_hash[:12]}){sq}{chose}; {how}"
