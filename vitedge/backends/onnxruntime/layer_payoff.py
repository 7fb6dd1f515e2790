"""INT8 layer by layer on ONNX Runtime: the layers whose INT8 does not pay on this CPU kind go back to float
(issue 47 item 2).

On an AVX2 CPU ONNX Runtime's INT8 GEMM (MatMulIntegerToFloat, u8s8) plus the QuantizeLinear of its input is not
faster than MLAS's float GEMM on a few dozen rows: most INT8 layers of the small corpus ViTs lose at batch 1, many
still win at batch 8 (benchmarks/results/int8_payoff_ops_avx2.md). So the build profiles the onnx artifact and its
FP32 reference here (ONNX Runtime's profiler, one inference thread, each node's low percentile of its kernel times)
at each batch size the target promises, and:

* **groups** the INT8 layers by the quantized activation they read: the layers that read one QuantizeLinear (a
  block's merged q/k/v GEMM, or q, k and v when they stay apart) go float together or not at all, since only then
  does the QuantizeLinear go away. An INT8 layer here outputs float (MatMulIntegerToFloat), so a float layer
  between two INT8 ones adds no quantization at its output: alternation costs nothing more than each group's own
  QuantizeLinear, which the group's INT8 time includes (``group_times``). A layer's FP32 time includes the Add of its
  bias, which ONNX Runtime runs apart from a float MatMul on tokens while the INT8 layer holds it (``bias_adds``), and
  both graphs are profiled in alternation (``node_times_side_by_side``) so that a change of load weighs on both;
* **weighs the batch sizes**: a group goes float when that lowers the sum over the promised batch sizes of the
  whole graph's INT8/FP32 ratio (``choose_float``): its INT8 time minus its FP32 time, over the FP32 graph's time
  at that batch size, summed. Each promised batch size counts as much as the other, in the ratio the target
  promises at it. A group that loses at batch 1 by less, relatively, than it wins at batch 8 stays INT8;
* **checks end to end**: the candidate (those groups float, written from the Q/DQ graph by the same rewrites) is
  timed against the artifact and the FP32 reference side by side (``int8_timing``, a second FP32 copy the
  control), and replaces the artifact only when its mean INT8/FP32 ratio over the batch sizes is lower by more than
  the control moved from 1, and it is slower at no batch size beyond that noise. Per-node figures are a guide; what
  ships is decided by the whole graph's time.

The decision is this CPU's: recorded with its ISA label (``quantization.int8_payoff``: ``kept_float`` with each
layer's ratios, ``layers`` with the step's figures). The validation then runs the graph that ships.
"""

from __future__ import annotations

import collections
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from vitedge.backends.int8_timing import interleaved_percentiles, timing_input
from vitedge.files.swap import work_prefix
from vitedge.onnxkit.session import SessionSettings, ort_session
from vitedge.onnxkit.structure import node_index

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

INT8_KERNELS = frozenset({"MatMulIntegerToFloat", "QLinearMatMul", "MatMulInteger", "QLinearConv", "ConvInteger", "QGemm",
                          "DynamicQuantizeMatMul"})
FLOAT_KERNELS = frozenset({"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "Conv", "FusedConv", "NhwcFusedConv"})
# what the onnx target's rewrites add to a Q/DQ layer's node name (gemm_bias, patch_embed), and ORT's own QDQ actions
# The per-node profile of one graph at one batch size runs at most about this long (``node_times``)
PROFILE_SECONDS = 8.0
SUFFIXES = ("/with_bias", "/gemm_with_bias_t", "/as_gemm", "/patch_embed_gemm", "_quant")


def base_name(name: str) -> str:
    """The Q/DQ graph's layer name of an artifact or optimized-graph node."""
    for s in SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


@dataclass(frozen=True)
class LayerGroup:
    """INT8 layers that read one quantized activation (node names of the graph ONNX Runtime runs)."""

    layers: tuple[str, ...]
    quantize: str | None  # the QuantizeLinear they all read (None: read no QuantizeLinear of their own)

    @property
    def names(self) -> tuple[str, ...]:
        """The Q/DQ graph's names of its layers (what the manifest counts)."""
        return tuple(base_name(n) for n in self.layers)


def layer_groups(graph: ModelProto) -> list[LayerGroup]:
    """The INT8 layers of ``graph`` (an optimized or artifact graph), grouped by the QuantizeLinear their input comes
    from (through a DequantizeLinear or directly); a QuantizeLinear that also feeds a non-layer node is kept in its
    group (it stays when the group goes float: ``group_times`` then does not count it)."""
    producer = node_index(graph.graph.node).producer
    by_q: dict[str, list[str]] = collections.defaultdict(list)
    order: list[str] = []
    for n in graph.graph.node:
        if n.op_type not in INT8_KERNELS and not _qdq_layer(n, producer):
            continue
        src = producer.get(n.input[0])
        if src is not None and src.op_type == "DequantizeLinear":
            src = producer.get(src.input[0])
        key = src.name if src is not None and src.op_type in ("QuantizeLinear", "DynamicQuantizeLinear") else f"\0{n.name}"
        if key not in by_q:
            order.append(key)
        by_q[key].append(n.name)
    return [LayerGroup(tuple(by_q[k]), None if k.startswith("\0") else k) for k in order]


def _qdq_layer(node: NodeProto, producer: dict[str, NodeProto]) -> bool:
    if node.op_type not in FLOAT_KERNELS or len(node.input) < 2:
        return False
    dq = producer.get(node.input[1])
    return dq is not None and dq.op_type == "DequantizeLinear"


def sole_readers(graph: ModelProto) -> dict[str, set[str]]:
    """QuantizeLinear name -> the names of the nodes reading it (directly or through its DequantizeLinears)."""
    readers: dict[str, set[str]] = collections.defaultdict(set)
    consumers = node_index(graph.graph.node).consumers
    for n in graph.graph.node:
        if n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear"):
            for r, _ in consumers.get(n.output[0], ()):
                if r.op_type == "DequantizeLinear":
                    readers[n.name] |= {rr.name for rr, _ in consumers.get(r.output[0], ())}
                else:
                    readers[n.name].add(r.name)
    return readers


def bias_adds(graph: ModelProto) -> dict[str, str]:
    """Add node name -> the GEMM whose bias it adds, in a graph ONNX Runtime runs: an Add of a constant to the output of
    a float or INT8 layer that nothing else reads. ONNX Runtime fuses no bias into a float MatMul of more than two
    dimensions (a ViT's tokens), while the onnx target folds each INT8 layer's bias into its MatMulIntegerToFloat: a
    layer's FP32 time is its MatMul's plus that Add's."""
    index = node_index(graph.graph.node)
    constants = {i.name for i in graph.graph.initializer}
    out: dict[str, str] = {}
    for n in graph.graph.node:
        if n.op_type != "Add" or len(n.input) != 2:
            continue
        for ours, other in ((n.input[0], n.input[1]), (n.input[1], n.input[0])):
            src = index.producer.get(ours)
            if (src is not None and other in constants and (src.op_type in FLOAT_KERNELS or src.op_type in INT8_KERNELS)
                    and len(index.consumers.get(ours, ())) == 1):
                out[n.name] = src.name
                break
    return out


def with_bias_adds(times: dict[str, float], adds: dict[str, str]) -> dict[str, float]:
    """``times`` (node name -> us) with each bias Add's time counted in its GEMM's (``bias_adds``)."""
    out = {k: v for k, v in times.items() if k not in adds or adds[k] not in times}
    for add, gemm in adds.items():
        if add in times and gemm in times:
            out[gemm] += times[add]
    return out


def group_times(group: LayerGroup, int8_us: dict[str, float], fp32_us: dict[str, float],
                readers: dict[str, set[str]]) -> tuple[float, float] | None:
    """(INT8 us, FP32 us) of one group at one batch size: its INT8 kernels plus its QuantizeLinear (when only the
    group reads it), against the FP32 nodes of the same Q/DQ names; None when a layer has no figure on either side."""
    fp32_by_base: dict[str, float] = collections.defaultdict(float)
    for name, us in fp32_us.items():
        fp32_by_base[base_name(name)] += us
    if any(n not in int8_us for n in group.layers) or any(b not in fp32_by_base for b in group.names):
        return None
    q = int8_us.get(group.quantize or "", 0.0) if group.quantize and readers.get(group.quantize, set()) <= set(group.layers) else 0.0
    return sum(int8_us[n] for n in group.layers) + q, sum(fp32_by_base[b] for b in group.names)


@dataclass(frozen=True)
class GroupVerdict:
    """One group's figures per batch size and the decision."""

    group: LayerGroup
    int8_us: dict[int, float]
    fp32_us: dict[int, float]
    gain: float  # sum over batch sizes of (INT8 - FP32) / FP32 graph total: what floating it takes off the ratios
    to_float: bool

    def why(self, cpu: str) -> str:
        per = ", ".join(f"b{b} {self.int8_us[b] / self.fp32_us[b]:.2f}" for b in sorted(self.int8_us) if self.fp32_us[b] > 0)
        return (f"its INT8 (kernel + input quantization) is slower than its FP32 layer in ONNX Runtime on {cpu} "
                f"(INT8/FP32 per layer {per}; the graph's ratios summed over the batch sizes drop by {self.gain:.3f})")


def choose_float(groups: list[LayerGroup], int8: dict[int, dict[str, float]], fp32: dict[int, dict[str, float]],
                 readers: dict[str, set[str]]) -> list[GroupVerdict]:
    """Per group with figures at every batch size: float when its INT8 time minus its FP32 time, over the FP32
    graph's total at each batch size, summed over the batch sizes, is above 0 (it lowers the sum of the promised
    ratios). Deterministic: figures in, decisions out."""
    totals = {b: sum(fp32[b].values()) for b in fp32}
    out = []
    for g in groups:
        per = {b: group_times(g, int8[b], fp32[b], readers) for b in int8}
        if any(v is None for v in per.values()) or any(totals[b] <= 0 for b in per):
            continue
        gain = sum((per[b][0] - per[b][1]) / totals[b] for b in per)  # type: ignore[index]
        out.append(GroupVerdict(g, {b: per[b][0] for b in per}, {b: per[b][1] for b in per}, gain, gain > 0))  # type: ignore[index]
    return out


def node_times(path: Path, batch: int, runs: int = 20, percentile: float = 20.0, seconds: float = PROFILE_SECONDS) -> dict[str, float]:
    """Node name (of the graph ONNX Runtime runs) -> the ``percentile`` of its kernel times in microseconds over
    ``runs`` runs at ``batch``, one inference thread, after 3 untimed runs; fewer runs (at least 3) where ``runs``
    of the graph would take over ``seconds`` (a ViT-B/16 at batch 8 takes seconds a run on one thread)."""
    return node_times_side_by_side((path,), batch, runs, percentile, seconds)[0]


def node_times_side_by_side(paths: tuple[Path, ...], batch: int, runs: int = 20, percentile: float = 20.0,
                            seconds: float = PROFILE_SECONDS) -> list[dict[str, float]]:
    """``node_times`` of each graph, their runs alternating (one run of each in turn), so that a machine whose load
    changes during the profile weighs on every graph alike; ``seconds`` bounds each graph's share of the time."""
    with tempfile.TemporaryDirectory(prefix=work_prefix("ort-opt")) as tmp:
        calls = []
        for i, path in enumerate(paths):
            session = ort_session(path, SessionSettings(threads=1, profile_prefix=str(Path(tmp) / f"profile{i}")))
            inp = session.get_inputs()[0]
            x = timing_input([batch] + [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape[1:]], "uint8" in inp.type)
            calls.append((session, {inp.name: x}))
        slowest = 1e-6
        for session, feed in calls:
            session.run(None, feed)
            t0 = time.perf_counter()
            session.run(None, feed)
            slowest = max(slowest, time.perf_counter() - t0)
        runs = max(3, min(runs, int(seconds / slowest)))
        for _ in range(runs + 1):
            for session, feed in calls:
                session.run(None, feed)
        out = []
        for session, _ in calls:
            profile = Path(session.end_profiling())
            events = json.loads(profile.read_text())
            os.remove(profile)
            samples: dict[str, list[float]] = collections.defaultdict(list)
            for e in events:
                if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time"):
                    samples[e["name"][: -len("_kernel_time")]].append(float(e["dur"]))
            out.append({k: float(np.percentile(v[3:] or v, percentile)) for k, v in samples.items()})
    return out


def optimized_graph(path: Path) -> ModelProto:
    """The graph ONNX Runtime runs for ``path`` on this machine (its node names are the profiler's)."""
    import onnx
    from vitedge.onnxkit.session import SessionSettings, ort_session

    with tempfile.TemporaryDirectory(prefix=work_prefix("ort-opt")) as tmp:
        out = Path(tmp) / "optimized.onnx"
        ort_session(path, SessionSettings(threads=1, optimization="all", optimized_model_path=out))
        return onnx.load(str(out), load_external_data=False)


def profile_verdicts(model: Path, reference: Path, batches: tuple[int, ...], runs: int = 20) -> list[GroupVerdict]:
    """``choose_float`` on this machine's profiles of the artifact and its FP32 reference at each batch size."""
    graph = optimized_graph(model)
    i_adds, f_adds = bias_adds(graph), bias_adds(optimized_graph(reference))
    int8: dict[int, dict[str, float]] = {}
    fp32: dict[int, dict[str, float]] = {}
    for b in batches:
        i_us, f_us = node_times_side_by_side((model, reference), b, runs)
        int8[b], fp32[b] = with_bias_adds(i_us, i_adds), with_bias_adds(f_us, f_adds)
    return choose_float(layer_groups(graph), int8, fp32, sole_readers(graph))


def side_by_side(reference: Path, current: Path, candidate: Path, batches: tuple[int, ...],
                 run: Callable[[Path, int], Callable[[], Any]], seconds: float = 3.0) -> dict[str, Any]:
    """The candidate and the current artifact over FP32 per batch size, and the FP32-vs-FP32 control, timed side by
    side (``interleaved_percentiles``: one thread, CPU time, p10, random order)."""
    out: dict[str, Any] = {"current": {}, "candidate": {}, "control": {}}
    for b in batches:
        t = interleaved_percentiles({"fp32": run(reference, b), "control": run(reference, b), "current": run(current, b),
                                     "candidate": run(candidate, b)}, rounds=12, per_round=3, seed=200 + b, max_seconds=seconds)
        for k in ("current", "candidate", "control"):
            out[k][b] = t[k] / t["fp32"]
    return out


def candidate_pays(timed: dict[str, Any]) -> tuple[bool, float]:
    """(take the candidate, the control's largest distance from 1): its mean ratio is lower than the artifact's by
    more than that noise, and it is not slower than the artifact by more than it at any batch size."""
    noise = max(abs(c - 1.0) for c in timed["control"].values())
    cur, cand = timed["current"], timed["candidate"]
    lower = float(np.mean(list(cand.values()))) < float(np.mean(list(cur.values()))) - noise
    return lower and all(cand[b] <= cur[b] * (1.0 + noise) for b in cur), noise
