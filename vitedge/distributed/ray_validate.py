"""`vitedge validate --workers N | --ray-address ADDR`: shard the data over Ray workers, merge exactly.

The driver opens the data once (its content hash is the contract), splits it into
batch-aligned shards (``sharding``), and runs one Ray task per shard (``shard_tasks.run_shard``):
each returns the raw FP32 and INT8 outputs of its items. The driver concatenates them in
order and computes accuracy with ``validation.run.accuracy_of``, the single-process function,
so top-1 counts, agreement and the logit statistics are those of a single-process run.
Latency is then measured by one more task, alone on the largest node (it asks for all of that
node's CPUs), and the report names that node.

``ShardedValidator`` has the signature of ``validation.run.validate_artifact`` and is passed to
``validate_bundle``: thresholds, the gate, sensitivity and the FP32 preprocessing probe (on the
driver) and the report files are the single-process ones.
"""

from __future__ import annotations

import contextlib
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitedge.distributed.cluster import (
    ClusterSettings,
    WorkerFailure,
    cluster_nodes,
    connected,
    largest_node_cpus,
    require_ray,
    run_tasks,
)
from vitedge.distributed.contract import BundleAddress, DataAddress
from vitedge.distributed.shard_tasks import (
    LatencyTask,
    ShardTask,
    run_latency,
    run_shard,
)
from vitedge.distributed.sharding import shard_ranges
from vitedge.validation.accuracy import Outputs, eval_batch
from vitedge.validation.document import ValidationReport
from vitedge.validation.latency import LatencySettings
from vitedge.validation.run import (
    ValidationResult,
    accuracy_of,
    assemble_result,
    probe_if_needed,
    source_data,
)


@dataclass
class ShardedValidator:
    """A drop-in for ``validate_artifact`` that runs the accuracy pass as Ray tasks (Ray initialised by the caller)."""

    cluster: ClusterSettings
    bundle: BundleAddress
    data: DataAddress
    shards: int
    record: dict[str, Any] = field(default_factory=dict)  # what ran where, for the report
    timing_device: dict[str, Any] | None = None  # what the latency task timed on (Backend.timing_device)

    def __call__(self, backend, options, model_path: Path, reference_path: Path, source, spec, thresholds,
                 batch_sizes: tuple[int, ...] = (1,), *, measure_speed: bool = True, threads: int | None = None,
                 latency: LatencySettings | None = None, output_kind: str | None = None, log=None,
                 reference_cache=None) -> ValidationResult:
        """``reference_cache`` is not used: each worker computes its shard's FP32 and INT8 outputs."""
        info = log or (lambda _m: None)
        kind = output_kind or spec.output_kind
        settings = latency or LatencySettings()
        shards = shard_ranges(len(source), self.shards, align=eval_batch(batch_sizes))
        shard_threads = threads or self.cluster.cpus_per_task
        info(f"{len(shards)} shard(s) of {len(source)} inputs on {self.cluster.describe()} ({', '.join(cluster_nodes())})")
        tasks = [ShardTask(self.bundle, self.data, s, shard_threads) for s in shards]
        outcomes = run_tasks(run_shard, tasks, num_cpus=self.cluster.cpus_per_task, max_retries=self.cluster.max_retries,
                             on_done=lambda o: info(f"{shards[o.index].describe()}: "
                                                    + ("done on " + o.node["host"] if o.ok else "FAILED")))
        _raise_failures(outcomes, [s.describe() for s in shards])
        parts = [o.value for o in outcomes]
        if any(p.torch_loaded for p in parts):
            info("NOTE torch was imported on a worker")
        labels = None if any(p.labels is None for p in parts) else np.concatenate([p.labels for p in parts])
        ref = Outputs(np.concatenate([p.reference for p in parts]), labels)
        got = Outputs(np.concatenate([p.artifact for p in parts]), labels)
        accuracy = accuracy_of(ref, got, kind, thresholds, source.summary.path, info)
        batch = eval_batch(batch_sizes)
        with contextlib.ExitStack() as stack:  # the probe's two shifted FP32 passes run on the driver, as sensitivity does
            opened: list[Any] = []

            def open_fp32():
                if not opened:
                    opened.append(stack.enter_context(backend.open_runner(reference_path, options, threads=threads)))
                return opened[0]

            probe_lookups = probe_if_needed(accuracy, thresholds, ref, open_fp32, backend, reference_path, source,
                                            spec.preprocess, batch, None, info, key_of=dict)
        stats: dict[str, Any] = {"fp32": {}, "int8": {}}
        speedup = None
        memory = dict(parts[0].memory)
        lat_node = None
        if measure_speed:
            cpus = largest_node_cpus()
            info(f"latency: one task alone on a node ({cpus} CPU(s) reserved), after every shard finished")
            task = LatencyTask(self.bundle, self.data, tuple(batch_sizes), threads, settings)
            (lat,) = run_tasks(run_latency, [task], num_cpus=cpus, max_retries=self.cluster.max_retries)
            _raise_failures([lat], ["the latency task"])
            stats, speedup, memory, lat_node = lat.value.stats, lat.value.speedup, dict(lat.value.memory), lat.node
            self.timing_device = lat.value.device
        self.record = {
            "engine": "ray",
            "cluster": self.cluster.address or f"local ({self.cluster.workers} worker(s))",
            "shards": len(shards),
            "cpus_per_task": self.cluster.cpus_per_task,
            "nodes": sorted({o.node["host"] for o in outcomes}),
            "shard_nodes": [{"shard": o.index, "start": shards[o.index].start, "stop": shards[o.index].stop,
                             "host": o.node["host"], "node_id": o.node["node_id"]} for o in outcomes],
            "torch_on_workers": any(p.torch_loaded for p in parts),
            "latency_node": lat_node,
            "memory_from": "the latency worker" if measure_speed else "shard 0's worker",
        }
        data = dict(source_data(source),
                    reference={"cache": "off", "batch": batch, "note": "sharded: each worker computes its shard's FP32 outputs"},
                    int8_outputs={"cache": "off", "batch": batch, "note": "sharded: each worker computes its shard's INT8 outputs"})
        if probe_lookups:
            data["probe_outputs"] = probe_lookups
        return assemble_result(accuracy, stats, speedup, memory, settings if measure_speed else None, data, thresholds)

    def annotate(self, report: ValidationReport) -> None:
        """Add what ran where to a validation report."""
        report.distributed = self.record
        node = self.record.get("latency_node")
        if node and report.latency.measured:
            report.latency.measured_on = f"{node['host']} (Ray node {node['node_id'][:12]})"
            report.latency.device = self.timing_device  # the timing worker's, not the driver's


def _raise_failures(outcomes, names: list[str]) -> None:
    for o in outcomes:
        if o.cause is not None:
            raise o.cause  # the task's own error (a refused hash, bad data): the single-process message
    failed = [f"{names[o.index]}: {o.error}" for o in outcomes if not o.ok]
    if failed:
        raise WorkerFailure("sharded validation incomplete, no report written: " + "; ".join(failed))


def sharded_validator(cluster: ClusterSettings, bundle: Path, source, limit: int | None, seed: int) -> ShardedValidator:
    """The validator for ``bundle`` on the opened ``source`` (opened with ``limit``/``seed``): one shard per worker slot."""

    ray = require_ray()
    total = int(ray.cluster_resources().get("CPU", 1))
    shards = cluster.workers or max(1, total // cluster.cpus_per_task)
    return ShardedValidator(cluster, BundleAddress.of(bundle), DataAddress.of(source, limit, seed), shards)


def scale_from_flags(workers: int | None, ray_address: str | None) -> ClusterSettings | None:
    """`validate`'s --workers / --ray-address as cluster settings; None for the single-process run."""
    if workers is None and not ray_address:
        return None
    return ClusterSettings(workers=workers, address=ray_address or None)


def ray_session(scale: ClusterSettings | None):
    """Ray for the whole command when ``scale`` is set; a no-op context otherwise (Ray never imported)."""


    return nullcontext() if scale is None else connected(scale)
