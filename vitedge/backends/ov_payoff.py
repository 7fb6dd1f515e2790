"""Keep float on the intel-cpu target what INT8 does not pay for, measured on this CPU (issue 47 item 2).

On small ViTs (width 32-64, 16-65 tokens) OpenVINO's INT8 IR can run no faster than the FP32 one: the INT8
FullyConnected kernels save little on such small GEMMs, while the activations' FakeQuantize nodes, the reorders
between f32/bf16 and u8 layouts and the bf16 float regions cost a fixed time per call (per-layer profile in
benchmarks/results/int8_payoff_avx512-vnni.md). So after the IR is converted, the build times INT8 against the FP32
reference on this CPU, interleaved, at each batch size of the profile, and while INT8 is slower it tries, in order,
keeping what it has when a step does not help:

1. the float regions in f32 instead of bf16 (where bf16 was used): bf16 adds converts around every region;
2. every INT8 layer whose own time in OpenVINO's per-layer counters (its kernel, plus the FakeQuantize and Reorder
   nodes that only feed it) is not below the same layer's time in the FP32 IR goes back to float
   (``float_layers.return_to_float``);
3. the whole model in float: the bundle ships its FP32 reference IR as the artifact, held once (INT8 of this model
   does not pay on this CPU; ``artifacts.single_graph`` in the manifest).

The decision is made by timing on the machine that builds, and recorded with its CPU kind (``vitedge.core.cpu``): a
bundle built on one CPU kind for another keeps its decision, which the manifest states with the kind it was made on.
Timings on a shared machine are noisy: a step is taken only when its median INT8/FP32 ratio is lower.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from vitedge.backends.float_layers import int8_layers, return_to_float
from vitedge.backends.int8_timing import PayoffTiming, interleaved_ratio, timed_steps_line, timing_input

_COMPUTE = ("FullyConnected", "FullyConnectedQuantizedLegacy", "FullyConnectedQuantized", "MatMul", "Convolution")
_FEEDERS = ("FakeQuantize", "Reorder")  # nodes a quantized layer adds in front of itself
_NAME_SUFFIXES = ("/DequantizationMultiply", "/WithoutBiases")


@dataclass(frozen=True)
class OvPayoff:
    """What the intel-cpu build kept float because INT8 did not pay on this CPU, and the times that said so."""

    cpu: str
    steps: tuple[dict[str, Any], ...] = ()  # {"step", "ratios": {batch: INT8/FP32}, "taken"}
    layers: tuple[dict[str, str], ...] = field(default=())  # {"name", "op_type", "why"}
    whole_model: bool = False
    float_precision: str | None = None  # the float regions' precision the build chose, None when unchanged
    noise: float = 0.0  # the largest distance from 1 of the FP32-vs-FP32 control ratio (PayoffTiming)
    source: str = "openvino timing on the build machine"

    @property
    def final_ratios(self) -> dict[int, float]:
        taken = [s for s in self.steps if s["taken"]]
        return dict(taken[-1]["ratios"]) if taken else {}

    def one_line(self) -> str:
        ratios = ", ".join(f"b{b} {r:.2f}" for b, r in sorted(self.final_ratios.items()))
        if self.whole_model:
            return (f"INT8 payoff: INT8 of this model is slower than FP32 on OpenVINO on {self.cpu} after every step tried "
                    f"({self._tried()}): the whole model is kept float, and the bundle holds its FP32 graph once "
                    "(reference.fp32.xml, the artifact too)")
        if not self.layers and self.float_precision is None:
            return f"INT8 payoff: INT8 pays on OpenVINO on {self.cpu} (INT8/FP32 time {ratios})"
        parts = []
        if self.float_precision:
            parts.append(f"float regions in {self.float_precision}")
        if self.layers:
            names = ", ".join(l["name"] for l in self.layers[:3]) + (", ..." if len(self.layers) > 3 else "")
            parts.append(f"{len(self.layers)} layer(s) kept float ({names})")
        return f"INT8 payoff on OpenVINO on {self.cpu}: {'; '.join(parts)} (INT8/FP32 time {ratios})"

    def _tried(self) -> str:
        return timed_steps_line(list(self.steps))

    def to_dict(self) -> dict[str, Any]:
        return {"cpu": self.cpu, "source": self.source, "kept_float": [dict(l) for l in self.layers],
                "whole_model_float": self.whole_model, "float_precision": self.float_precision, "control_noise": self.noise,
                "steps": [{"step": s["step"], "taken": s["taken"], "int8_over_fp32": {str(b): round(r, 4) for b, r in s["ratios"].items()}}
                          for s in self.steps]}


class OvTimer:
    """Compiles IRs at a fixed batch size and times them (the FP32 reference compiled once per batch size)."""

    def __init__(self, reference_xml: Path, batches: tuple[int, ...], timing: PayoffTiming):
        import openvino as ov

        self.core = ov.Core()
        self.batches, self.timing = batches, timing
        self._fp32 = {b: self.compile(reference_xml, b, "f32") for b in batches}
        self._control = {b: self.compile(reference_xml, b, "f32")[0] for b in batches}
        self.noise = 0.0

    def compile(self, xml: Path, batch: int, precision: str, perf: bool = False) -> tuple[Any, np.ndarray]:
        model = self.core.read_model(str(xml))
        dims = [d.get_length() if d.is_static else 1 for d in model.inputs[0].get_partial_shape()]
        dims[0] = batch
        model.reshape({model.inputs[0]: dims})
        config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": 1}
        if perf:
            config["PERF_COUNT"] = "YES"
        compiled = self.core.compile_model(model, "CPU", config)
        return compiled, timing_input(dims, integral=model.inputs[0].get_element_type().is_integral())

    def ratios(self, xml: Path, precision: str) -> dict[int, float]:
        """Per batch size, INT8/FP32 time of the IR ``xml`` (float regions in ``precision``); the control's
        distance from 1 at each batch size is kept in ``self.noise`` (the largest seen)."""
        out = {}
        for b in self.batches:
            (ref, x), (cand, _) = self._fp32[b], self.compile(xml, b, precision)
            r_ref, r_ctl, r_cand = ref.create_infer_request(), self._control[b].create_infer_request(), cand.create_infer_request()
            out[b], control = interleaved_ratio(lambda: r_ref.infer({0: x}), lambda: r_ctl.infer({0: x}),
                                                lambda: r_cand.infer({0: x}), self.timing, seed=b)
            self.noise = max(self.noise, abs(control - 1.0))
        return out

    def layer_costs(self, xml: Path, precision: str, reference_xml: Path, runs: int = 20) -> list[tuple[list[str], float, float]]:
        """Per INT8 compute layer of ``xml``: (its original layer names, INT8 ms, the same layer's FP32 ms), each the
        shortest of ``runs`` runs, summed over the batch sizes; the INT8 cost includes the FakeQuantize/Reorder nodes that feed only it. Layers are
        matched to the FP32 IR's by their order among the compute layers; [] when the two IRs' counts differ."""
        rows: dict[int, list] = {}
        for b in self.batches:
            int8 = _profiled(self.compile(xml, b, precision, perf=True), runs)
            fp32 = _profiled(self.compile(reference_xml, b, "f32", perf=True), runs)
            if len(int8) != len(fp32):
                return []
            for i, ((names, ms, is_int8), (_, fp_ms, _)) in enumerate(zip(int8, fp32)):
                row = rows.setdefault(i, [names, 0.0, 0.0, is_int8])
                row[1] += ms
                row[2] += fp_ms
        return [(names, ms, fp) for names, ms, fp, is_int8 in rows.values() if is_int8]


def _profiled(compiled_x: tuple[Any, np.ndarray], runs: int) -> list[tuple[list[str], float, bool]]:
    """Per compute layer of the runtime model, in order: (original layer names, its shortest ms over ``runs`` runs
    plus its own feeders', whether its kernel is INT8)."""
    compiled, x = compiled_x
    request = compiled.create_infer_request()
    for _ in range(3):
        request.infer({0: x})
    totals: dict[str, float] = {}  # each node's shortest time over the runs: a loaded machine only stretches a node
    for _ in range(runs):
        request.infer({0: x})
        for info in request.profiling_info:
            ms = info.real_time.total_seconds() * 1e3
            totals[info.node_name] = min(totals.get(info.node_name, ms), ms)
    ops = compiled.get_runtime_model().get_ordered_ops()
    readers: dict[str, int] = {}
    for op in ops:
        for inp in op.inputs():
            src = inp.get_source_output().get_node().get_friendly_name()
            readers[src] = readers.get(src, 0) + 1
    rows = []
    for op in ops:
        info = op.get_rt_info()
        kind = str(info["layerType"].astype(str)) if "layerType" in info else ""
        if kind not in _COMPUTE:
            continue
        prec = str(info["runtimePrecision"].astype(str)).lower() if "runtimePrecision" in info else ""
        ms = totals.get(op.get_friendly_name(), 0.0)
        for inp in op.inputs():
            src = inp.get_source_output().get_node()
            src_info = src.get_rt_info()
            src_kind = str(src_info["layerType"].astype(str)) if "layerType" in src_info else ""
            if src_kind in _FEEDERS and readers.get(src.get_friendly_name(), 0) == 1:
                ms += totals.get(src.get_friendly_name(), 0.0)
        names = str(info["originalLayersNames"].astype(str)).split(",") if "originalLayersNames" in info else [op.get_friendly_name()]
        rows.append((names, ms, prec in ("i8", "u8")))
    return rows


def onnx_layer(names: list[str], layers: dict[str, Any], outputs: dict[str, str] | None = None) -> str | None:
    """The Q/DQ graph's layer an OpenVINO runtime layer came from: one of its names with OpenVINO's suffixes cut,
    or, for the layer that feeds a graph output (OpenVINO names it after the output tensor), the layer whose
    output (or bias Add's output) that tensor is (``outputs``: tensor name -> layer name, ``layer_outputs``)."""
    for name in names:
        name = name.strip()
        if outputs and name in outputs:
            return outputs[name]
        while name:
            if name in layers:
                return name
            cut = next((s for s in _NAME_SUFFIXES if name.endswith(s)), None)
            if cut is None:
                break
            name = name[: -len(cut)]
    return None


def layer_outputs(model: Any, layers: dict[str, Any]) -> dict[str, str]:
    """Tensor name -> INT8 layer name: each layer's output, and the output of an Add that adds its bias."""
    out = {}
    for node in model.graph.node:
        if node.name in layers:
            out[node.output[0]] = node.name
    for node in model.graph.node:
        if node.op_type == "Add" and any(i in out for i in node.input):
            out[node.output[0]] = next(out[i] for i in node.input if i in out)
    return out


@dataclass
class PayoffRun:
    """What ``settle`` works on: the Q/DQ graph, the FP32 graph, and how to (re)convert the shipped IR."""

    qdq: Path  # the bundle's Q/DQ graph: rewritten in place when layers go back to float
    fp32: Path
    model_xml: Path
    reference_xml: Path
    convert: Callable[[Path], None]  # ONNX graph -> model_xml (the shipped IR)
    precision: str  # the float regions' precision the IR runs in
    cpu: str
    batches: tuple[int, ...] = (1, 8)
    timing: PayoffTiming = PayoffTiming()
    log: Callable[[str], None] | None = None


def settle(run: PayoffRun) -> OvPayoff:
    """Time INT8 against FP32 here and keep float what does not pay (module docstring); rewrites ``run.qdq`` and
    ``run.model_xml`` when it keeps layers float. When the whole model stays float it removes ``run.model_xml``: the
    bundle then ships ``run.reference_xml`` as its artifact (one FP32 graph), and ``run.qdq`` is the caller's to drop."""
    import onnx

    timer = OvTimer(run.reference_xml, run.batches, run.timing)
    precision = run.precision
    best = timer.ratios(run.model_xml, precision)
    steps = [{"step": f"INT8 ({precision} float regions)", "ratios": best, "taken": True}]

    def pays(r: dict[int, float]) -> bool:
        return max(r.values()) <= 1.0

    def better(r: dict[int, float]) -> bool:  # lower by more than the control moved
        return float(np.mean(list(r.values()))) < float(np.mean(list(best.values()))) - timer.noise

    chosen_precision = None
    if not pays(best) and precision == "bf16":
        r = timer.ratios(run.model_xml, "f32")
        taken = better(r)
        steps.append({"step": "INT8 (f32 float regions)", "ratios": r, "taken": taken})
        if taken:
            best, precision, chosen_precision = r, "f32", "f32"
    layers: list[dict[str, str]] = []
    if not pays(best):
        model = onnx.load(str(run.qdq))
        by_name = int8_layers(model)
        outputs = layer_outputs(model, by_name)
        unpaid = {}
        for names, ms, fp_ms in timer.layer_costs(run.model_xml, precision, run.reference_xml):
            name = onnx_layer(names, by_name, outputs)
            if name is not None and ms >= fp_ms:
                unpaid[name] = f"INT8 {ms:.3f} ms vs float {fp_ms:.3f} ms in OpenVINO's per-layer counters on {run.cpu}"
        if unpaid:
            candidate = run.qdq.with_name("payoff-candidate.onnx")
            kept = return_to_float(model, lambda node, dq: unpaid.get(node.name))
            onnx.save(model, str(candidate))
            previous = run.model_xml.with_name("payoff-previous.xml")
            _move_ir(run.model_xml, previous)
            run.convert(candidate)
            r = timer.ratios(run.model_xml, precision)
            taken = better(r)
            steps.append({"step": f"{len(kept)} layer(s) float", "ratios": r, "taken": taken})
            if taken:
                best, layers = r, kept
                candidate.replace(run.qdq)
            else:
                candidate.unlink()
                _move_ir(previous, run.model_xml)
            _remove_ir(previous)
    whole = False
    if not pays(best):  # the FP32 reference IR is what ships: timed as it is (its ratio is the FP32 control's)
        r = timer.ratios(run.reference_xml, "f32")
        steps.append({"step": "whole model float", "ratios": r, "taken": True})
        whole, precision, chosen_precision = True, "f32", "f32"
        _remove_ir(run.model_xml)
        qdq_model = onnx.load(str(run.qdq), load_external_data=False)
        names = int8_layers(qdq_model)
        why = f"INT8 of the whole model is slower than FP32 in OpenVINO on {run.cpu} ({timed_steps_line(steps[:-1])})"
        floated = {k["name"] for k in layers}  # layers the per-layer step already returned: float too, for this reason
        layers = [{"name": n.name, "op_type": n.op_type, "why": why}
                  for n in qdq_model.graph.node if n.name in names or n.name in floated]
    payoff = OvPayoff(run.cpu, tuple(steps), tuple(layers), whole, chosen_precision, noise=round(timer.noise, 4))
    if run.log:
        run.log(payoff.one_line())
    return payoff


def _move_ir(xml: Path, dest_xml: Path) -> None:
    xml.replace(dest_xml)
    xml.with_suffix(".bin").replace(dest_xml.with_suffix(".bin"))


def _remove_ir(xml: Path) -> None:
    for p in (xml, xml.with_suffix(".bin")):
        p.unlink(missing_ok=True)
