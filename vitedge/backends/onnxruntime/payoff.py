"""Keep float the INT8 layers that ONNX Runtime would run in float anyway (issue 47).

ONNX Runtime turns a quantized layer into an integer kernel only where one of its QDQ rules matches: a MatMul or
Gemm reading two DequantizeLinears becomes MatMulIntegerToFloat / QGemm, but a Conv without a QuantizeLinear after it
(a CCT's conv tokenizer feeding ReLU and max-pool, a hybrid's stem), a Gemm with a float bias, or a MatMul whose
DequantizeLinear has a second reader stays a float kernel, and then dequantizes its input and its weight on every
run: the INT8 layer costs time and precision and saves nothing. So before the onnx artifact is written, ONNX Runtime
optimizes the graph on the build machine (``SessionOptions.optimized_model_filepath``, the graph it would run), and
every layer whose weight still reaches a float matrix kernel through a DequantizeLinear goes back to float here:
its weight becomes the float tensor it dequantized to (the values the INT8 graph used, so what the accuracy budget
measured for that weight stands) and its input the float tensor before its QuantizeLinear.

The decision is made by this CPU's ONNX Runtime and recorded with the CPU kind (``vitedge.core.cpu``). ONNX Runtime picks
these QDQ rules by op pattern, not by ISA level (read from its qdq_transformer selectors): a layer ORT runs in
float on one x86 CPU it runs in float on any. The runtime's other per-ISA choice, uint8 vs int8 activations, is
made in ``ort_gemm_bias``.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from vitedge.backends.float_layers import int8_layers, return_to_float
from vitedge.backends.int8_timing import SLOWER, TOO_SHORT, PayoffTiming, interleaved_times, payoff_verdict, timed_steps_line, timing_input
from vitedge.onnxkit.session import SessionSettings, ort_session
from vitedge.onnxkit.structure import node_index
from vitedge.files.swap import work_prefix

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

_FLOAT_MATRIX = frozenset({"MatMul", "Gemm", "Conv", "FusedConv", "FusedMatMul", "FusedGemm", "NhwcFusedConv", "ConvTranspose"})


@dataclass(frozen=True)
class Int8Payoff:
    """Which INT8 layers went back to float because ONNX Runtime ran them in float, and on which CPU kind."""

    cpu: str  # vitedge.core.cpu's ISA label of the machine whose ONNX Runtime decided
    layers: tuple[dict[str, str], ...] = field(default=())  # {"name", "op_type", "why"}
    source: str = "onnxruntime optimized graph"

    def one_line(self) -> str:
        if not self.layers:
            return f"INT8 payoff: every INT8 layer runs as an integer kernel in ONNX Runtime ({self.cpu})"
        names = ", ".join(l["name"] for l in self.layers[:3]) + (", ..." if len(self.layers) > 3 else "")
        return (f"INT8 payoff: {len(self.layers)} layer(s) kept float, ONNX Runtime runs them as float kernels on "
                f"{self.cpu} (INT8 would only add dequantization): {names}")

    def to_dict(self) -> dict[str, Any]:
        return {"cpu": self.cpu, "source": self.source, "kept_float": [dict(l) for l in self.layers]}


def _float_weights(model: ModelProto) -> dict[str, str]:
    """int8 weight initializer -> the float op ONNX Runtime (this machine, this version) feeds it to dequantized."""
    import onnx

    with tempfile.TemporaryDirectory(prefix=work_prefix("ort-opt")) as tmp:
        out = Path(tmp) / "optimized.onnx"
        ort_session(model.SerializeToString(), SessionSettings(optimization="all", optimized_model_path=out))
        opt = onnx.load(str(out), load_external_data=False)
    inits = {t.name for t in opt.graph.initializer}
    producer = node_index(opt.graph.node).producer
    found = {}
    for n in opt.graph.node:
        if n.op_type not in _FLOAT_MATRIX:
            continue
        for i in n.input[1:2]:
            dq = producer.get(i)
            if dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in inits:
                found[dq.input[0]] = n.op_type
    return found


def keep_unpaid_float(model: ModelProto, cpu: str) -> Int8Payoff:
    """Return to float, in place, every INT8 layer this machine's ONNX Runtime would run as a float kernel."""
    try:
        unpaid = _float_weights(model)
    except Exception as err:  # noqa: BLE001 - a graph ORT cannot optimize here is shipped as it is
        return Int8Payoff(cpu, (), f"unavailable: {str(err).splitlines()[0][:120] if str(err) else type(err).__name__}")
    if not unpaid:
        return Int8Payoff(cpu)
    kept = return_to_float(model, lambda node, dq: (f"ONNX Runtime runs it as a float {unpaid[dq.input[0]]} reading "
                                                    "dequantized inputs") if dq.input[0] in unpaid else None)
    return Int8Payoff(cpu, tuple(kept))


def keep_float_if_slower(model_path: Path, reference_path: Path, batches: tuple[int, ...], cpu: str,
                         timing: PayoffTiming = PayoffTiming()) -> dict[str, Any]:
    """Time the onnx artifact against its FP32 reference here (``int8_timing``) at each batch size; when INT8 is
    slower beyond the timing's noise at any of them (``payoff_verdict``), or not faster on their mean
    (``whole_model_float_reason``), the whole model goes back to float: the
    record says so (``whole_model_float``) and the caller ships the FP32 graph instead of ``model_path`` (the onnx
    bundle then holds that one graph). A batch size too short to time decides nothing; when none can be timed, INT8
    is kept and the record says why. Nothing is written. Returns the record (``steps``, ``verdicts``, ``fp32_ms``,
    ``whole_model_float``, ``control_noise``, ``rule``, and the layers kept float when it did)."""
    import onnx

    timed = {b: interleaved_times(one_thread_run(reference_path, b), one_thread_run(reference_path, b), one_thread_run(model_path, b), timing, seed=b)
             for b in batches}
    ratios = {b: t.int8 for b, t in timed.items()}
    verdicts = {b: payoff_verdict(t, timing) for b, t in timed.items()}
    steps = [{"step": "INT8", "ratios": ratios, "taken": True}]
    record: dict[str, Any] = {
        "timed_on": cpu, "whole_model_float": False,
        "control_noise": round(max(abs(t.control - 1.0) for t in timed.values()), 4),
        "steps": [{"step": s["step"], "taken": s["taken"], "int8_over_fp32": {str(b): round(r, 4) for b, r in s["ratios"].items()}}
                  for s in steps],
        "verdicts": {str(b): v for b, v in verdicts.items()},
        "fp32_ms": {str(b): round(t.fp32_seconds * 1e3, 4) for b, t in timed.items()},
        "rule": (f"whole model float when INT8/FP32 exceeds 1 by more than the FP32-vs-FP32 control moved and by "
                 f"over {timing.slower_margin:.0%} at a batch size whose FP32 call takes {timing.min_seconds * 1e3:.3f} ms or more, "
                 "or when its mean over those batch sizes is 1 or more (INT8 not faster)"),
    }
    if all(v == TOO_SHORT for v in verdicts.values()):
        record["undecided"] = (f"FP32 runs in under {timing.min_seconds * 1e3:.3f} ms at every batch size timed: the timing "
                               "cannot tell INT8 from FP32 here, INT8 is kept")
    reason = whole_model_float_reason(ratios, verdicts)
    if reason is None:
        return record
    model = onnx.load(str(model_path), load_external_data=False)
    why = f"INT8 of the whole model is {reason} in ONNX Runtime on {cpu} ({timed_steps_line(steps)})"
    layers = set(int8_layers(model)) | {n.name for n in model.graph.node if n.domain == "com.microsoft" and n.op_type == "MatMulIntegerToFloat"}
    record["whole_model_float"] = True
    record["float_reason"] = reason  # for the build's line; the caller takes it out of the record
    record["kept_float_whole"] = [{"name": n.name, "op_type": n.op_type, "why": why} for n in model.graph.node if n.name in layers]
    return record


def whole_model_float_reason(ratios: dict[int, float], verdicts: dict[int, str]) -> str | None:
    """Why the whole model goes back to float, or None to keep INT8. Only batch sizes long enough to time count: INT8
    slower beyond the noise at any of them, or not faster on their mean (INT8/FP32 of 1 or more: an INT8 graph that
    times no faster than FP32 has no speed to show for its precision, and a target that promises speed must not ship
    one that may be slower; within the noise at one batch size is kept when the others make the mean faster)."""
    timed = {b: r for b, r in ratios.items() if verdicts[b] != TOO_SHORT}
    if not timed:
        return None
    if SLOWER in verdicts.values():
        return "slower than FP32"
    mean = float(np.mean(list(timed.values())))
    if mean >= 1.0:
        return f"not faster than FP32 (INT8/FP32 {mean:.2f} on the mean of the batch sizes timed)"
    return None


def one_thread_run(path: Path, batch: int) -> Callable[[], Any]:
    """One call of the graph at ``path`` on one thread (no spinning) at ``batch``, on the timing's input."""
    session = ort_session(path, SessionSettings(threads=1, spinning=False))
    inp = session.get_inputs()[0]
    dims = [batch] + [d if isinstance(d, int) else 1 for d in inp.shape[1:]]
    x = timing_input(dims, integral="uint8" in inp.type)
    return lambda: session.run(None, {inp.name: x})


def attention_fusion_pays(exported: Path, fused: Path, batches: tuple[int, ...], cpu: str,
                          timing: PayoffTiming = PayoffTiming()) -> dict[str, Any]:
    """Time the FP32 graph with its attention cores fused (``fused``) against the exported one here, the way INT8 is
    timed against FP32 (``int8_timing``: a second copy of the exported graph is the control). MultiHeadAttention is
    not faster on every layout: on small heads ONNX Runtime's unfused kernels can win. The attention core is float
    in the INT8 graph too, so what the FP32 graphs show holds for it. Returns the record; ``slower`` is True when the
    fused graph is slower beyond the noise at a batch size long enough to time (``payoff_verdict``)."""

    timed = {b: interleaved_times(one_thread_run(exported, b), one_thread_run(exported, b), one_thread_run(fused, b), timing, seed=100 + b) for b in batches}
    verdicts = {b: payoff_verdict(t, timing) for b, t in timed.items()}
    return {"timed_on": cpu, "fused_over_exported": {str(b): round(t.int8, 4) for b, t in timed.items()},
            "verdicts": {str(b): v for b, v in verdicts.items()},
            "control_noise": round(max(abs(t.control - 1.0) for t in timed.values()), 4),
            "slower": SLOWER in verdicts.values()}
