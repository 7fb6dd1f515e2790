"""What one worker runs, Ray-free: a shard's raw outputs, or the latency measurement alone.

Workers open the bundle through its manifest (``contract.open_bundle`` checks every hash)
and run it on the bundle's own backend (the runners ``vitedge.runtime`` uses too): numpy,
Pillow and the backend, never torch. They return raw per-sample outputs; every metric is
computed on the driver by the single-process functions.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitedge.backends import get_backend
from vitedge.distributed.contract import (
    BundleAddress,
    DataAddress,
    host,
    open_bundle,
    open_data,
)
from vitedge.distributed.sharding import Shard
from vitedge.bundle.manifest import Manifest
from vitedge.validation.accuracy import collect_outputs, eval_batch
from vitedge.validation.bundle import bundle_profile
from vitedge.validation.latency import (
    LatencySettings,
    LatencyStats,
    current_rss,
    peak_rss,
)
from vitedge.validation.run import measure_speed_pair


@dataclass(frozen=True)
class ShardTask:
    bundle: BundleAddress
    data: DataAddress
    shard: Shard
    threads: int | None


@dataclass
class ShardOutputs:
    shard: Shard
    reference: np.ndarray  # FP32 outputs, one row per item of the shard
    artifact: np.ndarray  # INT8 outputs
    labels: np.ndarray | None
    memory: dict[str, Any]
    host: str
    torch_loaded: bool  # whether torch was imported in the worker (it must not be)


@dataclass(frozen=True)
class LatencyTask:
    bundle: BundleAddress
    data: DataAddress
    batch_sizes: tuple[int, ...]
    threads: int | None
    settings: LatencySettings


@dataclass
class LatencyOutputs:
    stats: dict[str, dict[str, LatencyStats]]
    speedup: float
    memory: dict[str, Any] = field(default_factory=dict)
    host: str = ""
    device: dict[str, Any] | None = None  # what the timing ran on (Backend.timing_device), this worker's


def _backend_for(manifest: Manifest, bundle: Path):

    profile = bundle_profile(manifest, bundle)
    return get_backend(manifest.target.backend or profile.backend), profile


def run_shard(task: ShardTask) -> ShardOutputs:
    """FP32 and INT8 outputs of the shard's items, in order (the same batches as a single-process run)."""

    manifest = open_bundle(task.bundle)
    bundle = Path(task.bundle.path)
    source = open_data(task.data, manifest.spec).shard(task.shard.start, task.shard.stop)
    backend, profile = _backend_for(manifest, bundle)
    pre = manifest.spec.preprocess
    arts = manifest.artifacts
    batch = eval_batch(profile.batch_sizes)  # the single-process batch: the shard starts on a multiple of it
    memory: dict[str, Any] = {}
    rss0 = current_rss()
    with backend.open_runner(bundle / arts.reference, profile.backend_options, threads=task.threads) as runner:
        ref = collect_outputs(runner, source, pre, batch_size=batch)
        rss1 = current_rss()
    with backend.open_runner(bundle / arts.model, profile.backend_options, threads=task.threads) as runner:
        got = collect_outputs(runner, source, pre, batch_size=batch)
        rss2 = current_rss()
    if rss0 is not None and rss1 is not None and rss2 is not None:
        memory["fp32_load_rss_bytes"] = max(0, rss1 - rss0)
        memory["int8_load_rss_bytes"] = max(0, rss2 - rss1)
    memory["peak_rss_bytes"] = peak_rss()
    return ShardOutputs(task.shard, ref.values, got.values, ref.labels, memory, host(), "torch" in sys.modules)


def run_latency(task: LatencyTask) -> LatencyOutputs:
    """Interleaved FP32/INT8 latency on this worker, with the single-process code and inputs (the data's first batch)."""

    manifest = open_bundle(task.bundle)
    bundle = Path(task.bundle.path)
    source = open_data(task.data, manifest.spec)
    backend, profile = _backend_for(manifest, bundle)
    pre = manifest.spec.preprocess
    arts = manifest.artifacts
    first = next(iter(source.batches(max(task.batch_sizes))))
    memory: dict[str, Any] = {}
    rss0 = current_rss()
    with backend.open_runner(bundle / arts.reference, profile.backend_options, threads=task.threads) as ref_runner:
        rss1 = current_rss()
        with backend.open_runner(bundle / arts.model, profile.backend_options, threads=task.threads) as int8_runner:
            rss2 = current_rss()
            stats, speedup = measure_speed_pair(ref_runner, int8_runner, first.images, task.batch_sizes, pre, task.settings,
                                                lambda _m: None)
    if rss0 is not None and rss1 is not None and rss2 is not None:
        memory["fp32_load_rss_bytes"] = max(0, rss1 - rss0)
        memory["int8_load_rss_bytes"] = max(0, rss2 - rss1)
    memory["peak_rss_bytes"] = peak_rss()
    return LatencyOutputs(stats, speedup, memory, host(), backend.timing_device())
