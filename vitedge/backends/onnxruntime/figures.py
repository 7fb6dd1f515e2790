"""Which source decides the onnx target's keep-float step for the CPU kind a bundle is for, and the recorded per-kind
figures it reads when that kind is not the build machine's (issue 47 item 2).

A bundle is for one CPU kind (``vitedge build --cpu-kind``, default: the build machine's; the kinds are
``vitedge.core.cpu.CPU_KINDS``). INT8 pays or not per kind: the same GEMM runs other kernels on AVX2 (u8s8 pairs
summed in int16) than on AVX512-VNNI or AMX. So:

* **measured here** when the build machine is of that kind: the per-layer profile and the whole graph's timing
  (``layer_payoff``, ``payoff``), as before;
* **recorded figures** for that kind otherwise: package data (``payoff_figures/<kind>.json``) written by
  ``benchmarks/int8_payoff_groups.py --package`` from a results file measured on a CPU of that kind, holding the
  ISA, the date and that results file. Each figure is one GEMM group (the QuantizeLinear of its input and its
  MatMulIntegerToFloat with bias, against the FP32 MatMul) at one shape (rows M = batch x tokens, widths K, N), from
  ONNX Runtime's profiler at one thread. A group of the bundle goes float when, at every batch size the target
  promises, its INT8 time by the nearest recorded shape (times scaled by the work) exceeds its FP32 time by more
  than the figures' own noise (how far one profile's ratio moved from a second's: their 90th percentile). Nothing
  is timed: the whole graph was not timed on that kind, and the record and the report say so;
* **none** when no figures are recorded for that kind: the layers stay INT8 and the build says in one line that it
  could not judge the payoff there, and that a build on that CPU kind measures it.

Only what was measured is shipped: a kind without a results file has no figures.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitedge.backends.onnxruntime.layer_payoff import GroupVerdict, LayerGroup
from vitedge.core.cpu import CPU_KINDS, cpu_kind, read_cpu
from vitedge.core.errors import UsageError

if TYPE_CHECKING:
    from onnx import ModelProto

FIGURES = Path(__file__).with_name("payoff_figures")
MEASURED, RECORDED, NONE = "measured", "recorded", "none"


def host_kind() -> str:
    """This CPU's kind as ONNX Runtime runs on it (a oneDNN ISA cap does not apply to ONNX Runtime)."""
    return cpu_kind(read_cpu(capped=False))


@dataclass(frozen=True)
class GroupFigure:
    """One GEMM group at one shape, in microseconds."""

    m: int
    k: int
    n: int
    fp32_us: float
    int8_kernel_us: float
    quantize_us: float


@dataclass(frozen=True)
class RecordedFigures:
    isa: str
    date: str
    source: str  # the results file they come from (repository-relative)
    machine: str
    noise: float  # the 90th percentile of how far one profile's INT8/FP32 ratio moved from a second profile's
    groups: tuple[GroupFigure, ...]

    def label(self) -> str:
        return f"recorded figures for {self.isa} CPUs ({self.source}, measured {self.date})"

    def to_dict(self) -> dict[str, Any]:
        return {"isa": self.isa, "date": self.date, "source": self.source, "machine": self.machine, "noise": self.noise}

    def at(self, m: int, k: int, n: int) -> tuple[float, float, float] | None:
        """(INT8 kernel us, input quantization us, FP32 us) of a GEMM of shape m x k x n: the nearest recorded shape
        (in log2 of each axis), its kernel times scaled by m*k*n and its quantization by m*k; None outside the
        recorded range (an axis beyond half the smallest or twice the largest recorded)."""
        for axis, v in (("m", m), ("k", k), ("n", n)):
            values = [getattr(g, axis) for g in self.groups]
            if v <= 0 or v < min(values) / 2 or v > max(values) * 2:
                return None
        g = min(self.groups, key=lambda g: abs(math.log2(m / g.m)) + abs(math.log2(k / g.k)) + abs(math.log2(n / g.n)))
        work, quant = (m * k * n) / (g.m * g.k * g.n), (m * k) / (g.m * g.k)
        return g.int8_kernel_us * work, g.quantize_us * quant, g.fp32_us * work


def load_figures(kind: str, folder: Path = FIGURES) -> RecordedFigures | None:
    """The figures recorded for ``kind``, or None when nobody measured that kind."""
    path = folder / f"{kind}.json"
    if not path.is_file():
        return None
    d = json.loads(path.read_text())
    return RecordedFigures(d["isa"], d["date"], d["source"], d.get("machine", ""), float(d["noise"]),
                           tuple(GroupFigure(**g) for g in d["groups"]))


@dataclass(frozen=True)
class KindDecision:
    """Which source decides the keep-float step: ``kind`` the bundle's CPU kind, ``host`` the build machine's."""

    kind: str
    host: str
    figures: RecordedFigures | None = None

    @property
    def source(self) -> str:
        return MEASURED if self.kind == self.host else RECORDED if self.figures is not None else NONE

    def decided_by(self) -> str:
        if self.source == MEASURED:
            return f"measured on this CPU ({self.host})"
        if self.figures is not None:
            return self.figures.label()
        return f"none: no figures are recorded for {self.kind} CPUs"

    def not_judged_line(self) -> str:
        return (f"INT8 payoff: no figures are recorded for {self.kind} CPUs, so this build (on an {self.host} CPU) could not "
                f"judge which INT8 layers pay there: they stay INT8; build on an {self.kind} CPU to measure it")

    def not_timed(self) -> str:
        return f"not timed on {self.kind} CPUs: this build ran on an {self.host} CPU"


def decide_source(kind: str | None, host: str | None = None) -> KindDecision:
    """The decision source for a bundle for ``kind`` (None: this CPU's) built on ``host`` (None: this CPU)."""
    host = host or host_kind()
    if kind is not None and kind not in CPU_KINDS:
        raise UsageError(f"the CPU kind a bundle is for must be one of {', '.join(CPU_KINDS)}, got {str(kind)[:40]!r}")
    kind = kind or host
    return KindDecision(kind, host, None if kind == host else load_figures(kind))


def layer_shapes(qdq: ModelProto) -> dict[str, tuple[int, int, int]]:
    """Q/DQ layer name -> (rows at batch 1, input width, output width) of each MatMul, Gemm or Conv reading an int8
    weight, from ONNX shape inference on the Q/DQ graph (standard operators only); layers whose shapes it cannot
    tell are left out (they are then not judged)."""
    import onnx

    from vitedge.backends.float_layers import int8_layers

    inferred = onnx.shape_inference.infer_shapes(qdq)
    shapes: dict[str, list[int]] = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
        if v.type.tensor_type.HasField("shape") and dims and dims[-1] and dims.count(None) <= 1:
            shapes[v.name] = [d or 1 for d in dims]  # the one unknown axis is the batch: 1 row of it
    inits = {t.name: list(t.dims) for t in qdq.graph.initializer}
    out: dict[str, tuple[int, int, int]] = {}
    layers = int8_layers(inferred)
    for node in inferred.graph.node:
        dq = layers.get(node.name) if node.op_type in ("MatMul", "Gemm", "Conv") else None
        w = inits.get(dq.input[0]) if dq is not None else None
        x = shapes.get(node.input[0]) if w else None
        if not w or not x:
            continue
        if node.op_type == "Conv":
            y = shapes.get(node.output[0])
            if y and len(y) == 4 and len(w) == 4:
                out[node.name] = (y[2] * y[3], w[1] * w[2] * w[3], w[0])
            continue
        trans_b = any(a.name == "transB" and a.i for a in node.attribute)
        out[node.name] = (math.prod(x[:-1]), x[-1], w[0] if trans_b else w[-1])
    return out


def recorded_verdicts(groups: list[LayerGroup], shapes: dict[str, tuple[int, int, int]], figures: RecordedFigures,
                      batches: tuple[int, ...], readers: dict[str, set[str]]) -> list[GroupVerdict]:
    """Per group whose every layer has a shape and a recorded figure at every batch size: INT8 (its kernels, and its
    QuantizeLinear when only the group reads it) and FP32 microseconds by ``figures``; float when INT8/FP32 exceeds
    1 + the figures' noise at every batch size. ``gain`` is the sum over the batch sizes of INT8/FP32 - 1."""
    out = []
    for g in groups:
        per: dict[int, tuple[float, float]] = {}
        for b in batches:
            found = [figures.at(shapes[n][0] * b, shapes[n][1], shapes[n][2]) if n in shapes else None for n in g.names]
            if any(f is None for f in found):
                break
            own_quant = bool(g.quantize) and readers.get(g.quantize or "", set()) <= set(g.layers)
            quant = max(f[1] for f in found) if own_quant else 0.0  # type: ignore[index]
            per[b] = (sum(f[0] for f in found) + quant, sum(f[2] for f in found))  # type: ignore[index]
        if len(per) != len(batches) or any(f <= 0 for _, f in per.values()):
            continue
        ratios = {b: i / f for b, (i, f) in per.items()}
        out.append(GroupVerdict(g, {b: per[b][0] for b in per}, {b: per[b][1] for b in per}, sum(r - 1 for r in ratios.values()),
                                all(r > 1 + figures.noise for r in ratios.values())))
    return out
