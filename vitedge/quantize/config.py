"""Quantizer settings: one frozen, keyword-only dataclass, validated on construction."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from vitedge.core.errors import UsageError

# The weight-range rules (vitedge.quantize.weight_range applies them).
WEIGHT_RANGES = ("pairwise", "7bit", "full")

# What each rule needs of an x86 CPU's INT8 kernels (recorded in the manifest).
CPU_REQUIREMENT = {
    "pairwise": "any-x86",
    "7bit": "any-x86",
    "full": "vnni",
}

# Bump when a change would make cached statistics or the Q/DQ graph differ for the same
# inputs (placement, statistics, threshold search, SmoothQuant rewrite).
QUANTIZER_VERSION = "7"  # 7: sibling linear layers merged into one GEMM (quantize.merge); 6: exact per-channel |x| bins without bias correction (5: select stores every candidate's thresholds)

METHODS = ("select", "minmax", "percentile", "entropy", "mse", "auto")
HISTOGRAM_METHODS = ("select", "percentile", "entropy", "mse", "auto")
LAYER_KINDS = ("linear", "patch_embed", "attention_matmul", "head", "pool_kv")
# Kinds that stay float unless a caller lists them otherwise: see docs/quantization.md.
FLOAT_KINDS = ("pool_kv",)

# Defaults chosen by measurement: see docs/quantization.md and
# benchmarks/results/quant_accuracy.md. "select" measures every candidate of stats.CANDIDATES on
# the model itself (issue 30 item 4: entropy, the former default, collapsed on two ViTs trained
# by others while minmax / percentile / mse held).
DEFAULT_METHOD = "select"
# Method "select": calibration images its candidates are scored on (the first N), fewer past 2 GB.
SELECT_SAMPLES = 64
SELECT_SAMPLES_LARGE = 8
DEFAULT_PERCENTILE = 99.99
DEFAULT_SMOOTHQUANT_ALPHA: float | None = 0.5
DEFAULT_QUANTIZE_ATTENTION = False
DEFAULT_SMOOTHQUANT_SHARED = False
DEFAULT_NUM_BINS = 2048
# Safe on every x86 CPU (no int16 saturation in pre-VNNI kernels): vitedge.quantize.weight_range
DEFAULT_WEIGHT_RANGE = "pairwise"
# Data-driven refinement of the Linear layers (vitedge.quantize.refine): measured one by
# one in benchmarks/results/quant_accuracy.md (issue 13 item 4). Bias correction won: never
# below the baseline's agreement or logit cosine on the 3 models x 2 runtimes, one extra pass.
WEIGHT_ROUNDINGS = ("nearest", "gptq")
DEFAULT_WEIGHT_ROUNDING = "nearest"
DEFAULT_BIAS_CORRECTION = True
DEFAULT_SMOOTHQUANT_SEARCH = False


@dataclass(frozen=True, kw_only=True)
class QuantConfig:
    """How to calibrate and quantize.

    method             how an activation's clipping threshold is chosen from its statistics:
                       select (per model: every candidate of stats.CANDIDATES, i.e. entropy,
                       percentile 99.99 and 99.999, minmax and mse, builds its full-INT8 graph
                       and the one closest to FP32 at the output on the first calibration
                       images wins; the others stay available to the accuracy budget),
                       minmax (absolute max), percentile (of |x|), entropy (TensorRT-style
                       KL divergence), mse (least expected quantisation error), auto (per
                       tensor, whichever of entropy / percentile 99.99 and 99.999 / minmax /
                       mse gives the consuming Linear layers the least output error on the
                       calibration data; vitedge.quantize.refine)
    percentile         for method="percentile": the percentile of |x| kept unclipped
    smoothquant_alpha  migration strength a in s_j = max|X_j|^a / max|W_j|^(1-a);
                       None switches SmoothQuant off
    quantize_attention quantize the two attention matmuls (Q.K^T and P.V)
    float_small_gemms  keep float the MatMul/Gemm layers NVIDIA ModelOpt keeps float for
                       TensorRT: a GEMV at batch 1 (the classifier head: one row per image)
                       or K or N below 16 (10-class heads, attention heads narrower than 16);
                       see small_gemm.py. On for the NVIDIA target profiles
    smoothquant_shared also smooth Linear layers fed by a LayerNorm whose output feeds
                       something else too (post-norm residuals), through an explicit
                       per-channel Mul in front of them; otherwise they are left unsmoothed
    num_bins           histogram bins over [0, max|x|] (histogram methods)
    weight_range       how far INT8 weights reach: pairwise (no adjacent weight pair can
                       saturate a pre-VNNI x86 kernel; safe on every CPU), 7bit (|q| <= 64),
                       full (|q| <= 127: VNNI/AMX CPUs and GPUs only); see weight_range.py
    weight_rounding    nearest (each weight on its own) or gptq (rounding errors pushed onto
                       the input channels not rounded yet, weighted by the calibration
                       inputs' Hessian; same scales and weight_range limits); see gptq.py
    bias_correction    subtract each INT8 Linear layer's mean output error on the
                       calibration data from its bias; see refine.py
    smoothquant_search choose SmoothQuant's alpha per smoothing site (LayerNorm) from a grid,
                       by its layers' INT8 output error; see smooth_search.py
    """

    method: str = DEFAULT_METHOD
    percentile: float = DEFAULT_PERCENTILE
    smoothquant_alpha: float | None = DEFAULT_SMOOTHQUANT_ALPHA
    quantize_attention: bool = DEFAULT_QUANTIZE_ATTENTION
    float_small_gemms: bool = False
    smoothquant_shared: bool = DEFAULT_SMOOTHQUANT_SHARED
    num_bins: int = DEFAULT_NUM_BINS
    weight_range: str = DEFAULT_WEIGHT_RANGE
    weight_rounding: str = DEFAULT_WEIGHT_ROUNDING
    bias_correction: bool = DEFAULT_BIAS_CORRECTION
    smoothquant_search: bool = DEFAULT_SMOOTHQUANT_SEARCH

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UsageError(f"--method must be one of {', '.join(METHODS)}, got '{self.method}'")
        if isinstance(self.percentile, bool) or not isinstance(self.percentile, (int, float)):
            raise UsageError(f"--percentile must be a number, got {self.percentile!r}")
        if not (math.isfinite(self.percentile) and 90.0 <= float(self.percentile) <= 100.0):
            raise UsageError(f"--percentile must be between 90 and 100 (e.g. 99.99), got {self.percentile}")
        if self.method != "percentile" and self.percentile != DEFAULT_PERCENTILE:
            raise UsageError(f"--percentile only applies to --method percentile, not '{self.method}'")
        a = self.smoothquant_alpha
        if a is not None:
            if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or not 0.0 <= float(a) <= 1.0:
                raise UsageError(f"--smoothquant-alpha must be between 0 and 1 (e.g. 0.5), got {a!r}")
        if self.weight_rounding not in WEIGHT_ROUNDINGS:
            raise UsageError(f"--weight-rounding must be one of {', '.join(WEIGHT_ROUNDINGS)}, got {self.weight_rounding!r}")
        for name in ("quantize_attention", "float_small_gemms", "smoothquant_shared", "bias_correction", "smoothquant_search"):
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.weight_range not in WEIGHT_RANGES:
            raise UsageError(f"--weight-range must be one of {', '.join(WEIGHT_RANGES)}, got {self.weight_range!r}")
        if self.smoothquant_search and self.smoothquant_alpha is None:
            raise UsageError("the per-layer SmoothQuant alpha search needs SmoothQuant on (a smoothquant_alpha)")
        if isinstance(self.num_bins, bool) or not isinstance(self.num_bins, int) or not 256 <= self.num_bins <= 65536:
            raise UsageError(f"num_bins must be an integer between 256 and 65536, got {self.num_bins!r}")

    @property
    def needs_histograms(self) -> bool:
        return self.method in HISTOGRAM_METHODS

    def smoothquant_params(self) -> dict[str, Any] | None:
        """The SmoothQuant settings that change the statistics (part of the cache key)."""
        if self.smoothquant_alpha is None:
            return None
        params: dict[str, Any] = {"alpha": float(self.smoothquant_alpha), "shared": self.smoothquant_shared}
        if self.smoothquant_search:
            params["search"] = True
        return params

    def refine_params(self) -> dict[str, Any] | None:
        """The refinement settings (part of the refinement's cache key); None when off."""
        if self.weight_rounding == "nearest" and not self.bias_correction and self.method != "auto":
            return None
        return {"weight_rounding": self.weight_rounding, "bias_correction": self.bias_correction, "weight_range": self.weight_range}

    def method_params(self) -> dict[str, Any]:
        """The parameters that change this method's thresholds (part of the cache key)."""
        params: dict[str, Any] = {}
        if self.method == "percentile":
            params["percentile"] = float(self.percentile)
        if self.needs_histograms:
            params["num_bins"] = int(self.num_bins)
        return params

    def describe(self) -> str:
        method = self.method + (f" {self.percentile:g}%" if self.method == "percentile" else "")
        sq = "off" if self.smoothquant_alpha is None else f"alpha {self.smoothquant_alpha:g}"
        if self.smoothquant_alpha is not None and self.smoothquant_search:
            sq = "alpha per layer"
        if self.smoothquant_alpha is not None and self.smoothquant_shared:
            sq += " (+ Mul at shared LayerNorms)"
        out = f"{method}, SmoothQuant {sq}, attention matmuls {'INT8' if self.quantize_attention else 'float'}"
        if self.float_small_gemms:
            out += ", small GEMMs float"
        if self.weight_rounding != "nearest":
            out += f", {self.weight_rounding} rounding"
        if self.bias_correction:
            out += ", bias correction"
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
