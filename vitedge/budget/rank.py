"""Which INT8 layers to return to float first: the candidate layers ranked by per-layer
sensitivity (``vitedge.validation.sensitivity.layer_sensitivity``), cached beside the
calibration statistics under a key that covers everything that changes a ranking."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitedge.budget.record import BudgetResult
from vitedge.budget.settings import BUDGET_VERSION, BudgetSettings
from vitedge.files.atomic import atomic_write_path
from vitedge.quantize.cache import CalibrationCache
from vitedge.validation.sensitivity import first_inputs, layer_sensitivity

if TYPE_CHECKING:
    from vitedge.datasources.base import CalibrationSource
    from vitedge.bundle.preprocess import Preprocess
    from vitedge.quantize.qdq import QuantizedGraph
    from vitedge.quantize.record import Calibration


def sensitivity_key(calibration: Calibration, float_layers: Iterable[str], data_hash: str, samples: int, output_kind: str) -> str:
    """Like the calibration cache key (it includes it), plus what changes a ranking: the quantizer
    settings, the layers already float, the evaluation data and how many samples."""
    parts = {
        "budget_version": BUDGET_VERSION,
        "calibration_key": calibration.key,
        "config": calibration.config.to_dict(),
        "float_layers": sorted(float_layers),
        "data_hash": data_hash,
        "samples": int(samples),
        "output_kind": output_kind,
    }
    if getattr(calibration, "variant", None):  # method select: the candidate whose thresholds the graph carries
        parts["variant"] = calibration.variant
    return hashlib.sha256(json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class SensitivityCache:
    """``<cache root>/sensitivity/<key>.json``, beside ``<cache root>/calibration/``."""

    def __init__(self, root: str | Path | None = None):

        self.root = CalibrationCache(root).root

    def path_for(self, key: str) -> Path:
        return self.root / "sensitivity" / f"{key}.json"

    def load(self, key: str) -> dict[str, Any] | None:
        path = self.path_for(key)
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(doc.get("layers"), list):
            return None
        return doc

    def save(self, key: str, doc: dict[str, Any]) -> Path:

        path = self.path_for(key)
        with atomic_write_path(path) as tmp:
            tmp.write_text(json.dumps(dict(doc, key=key), sort_keys=True))
        return path


def rank_layers(result: BudgetResult, calibration: Calibration, full: QuantizedGraph, source: CalibrationSource, output_kind: str,
                preprocess: Preprocess | None, cache_dir: str | Path | None, settings: BudgetSettings,
                info: Callable[[str], None]) -> list[str]:
    """Candidate layers, most harmful first: from the cache, or from per-layer sensitivity."""
    samples = min(settings.sensitivity_samples, len(source))
    key = sensitivity_key(calibration, full.kept_float, source.summary.data_hash, samples, output_kind)
    cache = SensitivityCache(cache_dir)
    doc = cache.load(key)
    candidates = set(full.quantized)
    if doc is not None and {r["name"] for r in doc["layers"]} == candidates:
        result.sensitivity_cache = "reused"
        result.sensitivity_evaluations = 0
        info(f"sensitivities reused from {cache.path_for(key)}")
    else:

        x = first_inputs(source, samples)
        sens = layer_sensitivity(calibration.model, full.model, x, output_kind=output_kind, preprocess=preprocess,
                                 batch_size=min(64, len(x)), threads=settings.threads, recover_smoothing=False)  # the exact graph the Q/DQ went into
        doc = sens.to_dict()
        result.sensitivity_cache = "computed"
        result.sensitivity_evaluations = len(sens.layers)
        info(f"per-layer sensitivity: {len(sens.layers)} layers on {len(x)} inputs in {sens.seconds:.1f} s")
        try:
            cache.save(key, doc)
        except OSError as err:
            info(f"could not write the sensitivity cache in {cache.root}: {err.strerror or err}")
    result.cache_path = str(cache.path_for(key))
    metric = doc["metric"]
    ranked = [r for r in doc["layers"] if r["name"] in candidates]
    ranked.sort(key=lambda r: (r.get("rank") or 0))
    result.sensitivity = {"metric": metric, "samples": doc.get("samples"), "seconds": doc.get("seconds"),
                          "baseline": doc.get("baseline"), "full": doc.get("full"),
                          "layers": [{"rank": r["rank"], "name": r["name"], "kind": r["kind"], metric: r[metric]} for r in ranked]}
    return [r["name"] for r in ranked]
