"""Per-layer SmoothQuant alpha: for each smoothing site, the alpha of ``ALPHA_GRID`` that
gives its Linear layers the least INT8 output error on the calibration data.

For a site with input ``x`` (per-channel max ``m``) and layers ``W``, each alpha gives
scales ``s`` (``smoothquant.smoothing_scales``); the error is
``sum ||Q(x / s) Q_w(diag(s) W) - x W||^2`` with ``Q`` the activation's per-tensor Q/DQ
(threshold ``max(m / s)``) and ``Q_w`` the per-channel weight rounding under the config's
weight-range rule. One extra pass over the calibration data (``QuantConfig.smoothquant_search``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from vitedge.quantize import smoothquant
from vitedge.quantize.graph import GraphIndex, SmoothSite
from vitedge.quantize.refine import fake_quant
from vitedge.quantize.weight_range import quantize_weight

if TYPE_CHECKING:
    from vitedge.quantize.collect import CalibrationPass

ALPHA_GRID = (0.25, 0.4, 0.5, 0.6, 0.75, 0.9)


def choose_alphas(runner: CalibrationPass, gi: GraphIndex, sites: list[SmoothSite], chan: dict[str, np.ndarray], weight_range: str) -> dict[str, float]:
    """LayerNorm node name -> chosen alpha."""
    plans = []  # (site, tensor, [(w_kn, {alpha: (s, wq_kn, threshold)})])
    for site in sites:
        x_max = np.max([chan[t] for t in site.inputs], axis=0)
        w_max = smoothquant.weight_input_absmax(gi, site)
        per_alpha = {a: smoothquant.smoothing_scales(x_max, w_max, a) for a in ALPHA_GRID}
        for t in site.inputs:
            layers = []
            for name in site.layers:
                node = gi.nodes_by_name[name]
                if node.input[0] != t:
                    continue
                w = np.asarray(gi.value(node.input[1]), dtype=np.float64)
                w_kn = w if smoothquant._in_axis(node) == 0 else w.T
                options = {}
                for a, s in per_alpha.items():
                    q, sc = quantize_weight((w_kn * s[:, None]).astype(np.float32), 1, "MatMul", weight_range)
                    options[a] = (s, q.astype(np.float64) * sc.astype(np.float64)[None, :], float(np.max(chan[t] / s)))
                layers.append((w_kn, options))
            if layers:
                plans.append((site, t, layers))
    errors = {site.norm: {a: 0.0 for a in ALPHA_GRID} for site in sites}
    tensors = sorted({t for _, t, _ in plans})
    if not tensors:
        return {site.norm: 0.5 for site in sites}
    for values in runner._run(tensors, "calibrating: SmoothQuant alpha per layer"):
        for site, t, layers in plans:
            x = np.asarray(values[t], dtype=np.float32)
            x = x.reshape(-1, x.shape[-1]).astype(np.float64)
            for w_kn, options in layers:
                ref = x @ w_kn
                for a, (s, wq, th) in options.items():
                    errors[site.norm][a] += float(np.sum(np.square(fake_quant(x / s, th) @ wq - ref)))
    return {norm: min(errs, key=lambda a: (errs[a], abs(a - 0.5))) for norm, errs in errors.items()}
