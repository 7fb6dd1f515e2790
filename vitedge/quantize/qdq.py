"""Build the one Q/DQ ONNX graph every target consumes.

* Activations: one QuantizeLinear -> DequantizeLinear pair per tensor, per-tensor scale
  ``threshold / 127``, INT8 zero point 0, shared by every quantized node reading it.
* Weights: stored as INT8 initializers (4x smaller than FP32) with a per-output-channel
  DequantizeLinear (MatMul [K, N] -> axis 1, Gemm transB=1 -> axis 0, Conv -> axis 0).
* Only the inputs of quantized layers get Q/DQ: LayerNorm, Softmax, GELU and the
  residual Adds read float tensors, always.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitedge.core.errors import QuantizationError, UsageError
from vitedge.onnxkit.files import save_onnx
from vitedge.onnxkit.metadata import set_metadata
from vitedge.onnxkit.structure import NameScope, cleanup, topological_sort
from vitedge.quantize.checker import Violation, check_qdq_graph
from vitedge.quantize.config import (
    CPU_REQUIREMENT,
    FLOAT_KINDS,
    LAYER_KINDS,
    QUANTIZER_VERSION,
)
from vitedge.quantize.graph import GraphIndex, QuantLayer
from vitedge.quantize.record import Calibration
from vitedge.quantize.small_gemm import SOURCE as SMALL_GEMM_SOURCE
from vitedge.quantize.small_gemm import small_gemms
from vitedge.quantize.stats import QMAX, safe_scale
from vitedge.quantize.weight_range import quantize_weight

METADATA_KEY = "vitedge.quantization"


@dataclass(frozen=True)
class QuantizedGraph:
    """The Q/DQ graph, which layers went INT8 and which stayed float.

    ``violations`` is always empty: ``build_qdq`` refuses to return a graph that breaks
    a TensorRT explicit-quantization rule.
    """

    model: Any  # onnx.ModelProto
    layers: tuple[QuantLayer, ...]  # every quantizable layer
    quantized: tuple[str, ...]  # node names now INT8
    kept_float: tuple[str, ...]  # node names left in float
    calibration: Calibration
    violations: tuple[Violation, ...] = ()
    small_gemms: dict[str, str] = dataclasses.field(default_factory=dict)  # float by float_small_gemms: layer -> why

    def save(self, path: str | Path) -> Path:
        """Write the graph atomically; returns the path."""
        path = Path(path)
        save_onnx(self.model, path)
        return path

    def without_model(self) -> QuantizedGraph:
        """This record without its ModelProto, nor its calibration's: once the graph is saved,
        what reads the files needs neither, and each is as large as the weights (2.5 GB for vit_h_14)."""
        return dataclasses.replace(self, model=None, calibration=dataclasses.replace(self.calibration, model=None))

    def layer_kinds(self) -> dict[str, tuple[int, int]]:
        """kind -> (quantized, total)."""
        q = set(self.quantized)
        out: dict[str, tuple[int, int]] = {}
        for layer in self.layers:
            a, b = out.get(layer.kind, (0, 0))
            out[layer.kind] = (a + (layer.name in q), b + 1)
        return out

    def one_line(self) -> str:
        kinds = ", ".join(f"{k} {a}/{b}" for k, (a, b) in sorted(self.layer_kinds().items()))
        return f"{len(self.quantized)} of {len(self.layers)} layers INT8 ({kinds})"


def resolve_keep_float(layers: Iterable[QuantLayer], keep_float: Iterable[str] | str) -> set[str]:
    """Node names selected by ``keep_float``: node names, layer kinds, op types or fnmatch patterns."""
    layers = list(layers)
    if isinstance(keep_float, str):
        keep_float = (keep_float,)
    chosen: set[str] = set()
    for entry in keep_float:
        if not isinstance(entry, str) or not entry:
            raise UsageError(f"keep_float entries must be non-empty strings (node names, kinds or patterns), got {entry!r}")
        hit = {l.name for l in layers if l.kind == entry or l.op_type == entry or l.name == entry or fnmatch.fnmatchcase(l.name, entry)}
        if not hit:
            example = layers[0].name if layers else "?"
            raise UsageError(f"keep_float entry '{entry}' matches no quantizable layer; use a node name (e.g. '{example}'), "
                             f"a kind ({', '.join(LAYER_KINDS + ('conv',))}) or an fnmatch pattern")
        chosen |= hit
    return chosen


def _selected_layers(calibration: Calibration, keep_float: Iterable[str] | str, quantize_attention: bool | None) -> tuple[set[str], bool]:
    """(node names that stay float, the effective quantize_attention switch)."""
    layers = calibration.layers
    floats = resolve_keep_float(layers, keep_float)
    if quantize_attention is None:
        quantize_attention = calibration.config.quantize_attention
    if not isinstance(quantize_attention, bool):
        raise UsageError(f"quantize_attention must be True, False or None, got {quantize_attention!r}")
    if not quantize_attention:
        floats |= {l.name for l in layers if l.kind == "attention_matmul"}
    floats |= {l.name for l in layers if l.kind in FLOAT_KINDS}
    floats |= set(small_gemm_floats(calibration))
    return floats, quantize_attention


def small_gemm_floats(calibration: Calibration) -> dict[str, str]:
    """Layer -> why it stays float under ``float_small_gemms`` (NVIDIA ModelOpt's rule; {} when off)."""
    if not calibration.config.float_small_gemms or calibration.model is None:
        return {}
    return small_gemms(calibration.model, calibration.layers, cache_key=calibration.fp32_sha256)


class _QdqWriter:
    """Adds Q/DQ nodes and INT8 initializers to a copy of the calibrated graph, one per tensor / weight."""

    def __init__(self, calibration: Calibration):
        import onnx

        self.calibration = calibration
        self.refinement = calibration.refinement
        self.weight_range = calibration.config.weight_range
        self.model = onnx.ModelProto()
        self.model.CopyFrom(calibration.model)
        self.gi = GraphIndex(self.model)
        self.names = NameScope(self.model)
        self.new_inits: list[Any] = []
        self.added: list[Any] = []  # new nodes; topological_sort puts each right after the tensor it reads
        self.act_dq: dict[str, str] = {}
        self.weight_dq: dict[tuple[str, int], str] = {}

    def activation(self, tensor: str) -> str:
        """The dequantized form of an activation tensor: one Q -> DQ pair shared by every reader."""
        from onnx import helper, numpy_helper

        if tensor in self.act_dq:
            return self.act_dq[tensor]
        names = self.names
        scale = safe_scale(self.calibration.thresholds[tensor])
        s_name, z_name = names(f"{tensor}_scale"), names(f"{tensor}_zero_point")
        q_out, dq_out = names(f"{tensor}_quantized"), names(f"{tensor}_dequantized")
        self.new_inits.append(numpy_helper.from_array(np.array(scale, dtype=np.float32), s_name))
        self.new_inits.append(numpy_helper.from_array(np.array(0, dtype=np.int8), z_name))
        q = helper.make_node("QuantizeLinear", [tensor, s_name, z_name], [q_out], name=names(f"{tensor}_QuantizeLinear"))
        dq = helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [dq_out], name=names(f"{tensor}_DequantizeLinear"))
        self.added.extend([q, dq])
        self.act_dq[tensor] = dq_out
        return dq_out

    def weight(self, layer: QuantLayer) -> str:
        """The dequantized form of a layer's weight: INT8 initializer + per-channel DequantizeLinear."""
        from onnx import helper, numpy_helper

        key = (layer.weight, layer.weight_axis)
        if key in self.weight_dq:
            return self.weight_dq[key]
        axis = int(layer.weight_axis)
        refined = self.refinement.weights.get(layer.name) if self.refinement is not None else None
        if refined is not None:
            q, scale = refined
        else:
            q, scale = quantize_weight(np.asarray(self.gi.value(layer.weight), dtype=np.float32), axis, layer.op_type, self.weight_range)
        names, base = self.names, layer.weight
        q_name, s_name, z_name = names(f"{base}_quantized"), names(f"{base}_scale"), names(f"{base}_zero_point")
        dq_out = names(f"{base}_dequantized")
        self.new_inits.append(numpy_helper.from_array(q, q_name))
        self.new_inits.append(numpy_helper.from_array(scale, s_name))
        self.new_inits.append(numpy_helper.from_array(np.zeros(scale.shape, dtype=np.int8), z_name))
        self.added.append(helper.make_node("DequantizeLinear", [q_name, s_name, z_name], [dq_out], axis=axis, name=names(f"{base}_DequantizeLinear")))
        self.weight_dq[key] = dq_out
        return dq_out

    def correct_bias(self, layer: QuantLayer) -> None:
        """Bias correction: point the layer's bias input at its corrected values, when refinement has them."""
        from onnx import numpy_helper

        fix = self.refinement.biases.get(layer.name) if self.refinement is not None else None
        if fix is None:
            return
        gi = self.gi
        b_name = self.names(f"{layer.name}/corrected_bias")
        shape = gi.value(gi.nodes_by_name[fix.node].input[fix.index]).shape
        self.new_inits.append(numpy_helper.from_array(fix.values.reshape(shape), b_name))
        gi.nodes_by_name[fix.node].input[fix.index] = b_name

    def quantize(self, layer: QuantLayer) -> None:
        """Rewire one layer's inputs through Q/DQ."""
        node = self.gi.nodes_by_name[layer.name]
        self.correct_bias(layer)
        if layer.weight is not None:
            node.input[1] = self.weight(layer)
            node.input[0] = self.activation(layer.inputs[0])
        else:
            node.input[0] = self.activation(layer.inputs[0])
            node.input[1] = self.activation(layer.inputs[1])

    def finish(self) -> Any:
        """The graph with the new nodes in topological order and the new initializers; returns the ModelProto."""
        g = self.model.graph
        ordered = topological_sort(self.added + list(g.node))
        del g.node[:]
        g.node.extend(ordered)
        g.initializer.extend(self.new_inits)
        cleanup(self.model)
        return self.model


def _quantization_record(calibration: Calibration, chosen: list[QuantLayer], floats: set[str], quantize_attention: bool) -> dict[str, Any]:
    """What the graph's metadata says about how it was quantized."""
    from onnx import TensorProto

    refinement = calibration.refinement
    weight_range = calibration.config.weight_range
    info = calibration.to_dict()
    info["config"] = dict(info["config"], quantize_attention=quantize_attention)
    info.update({
        "quantizer": "vitedge",
        "quantizer_version": QUANTIZER_VERSION,
        "keep_float": sorted(floats),
        **({"small_gemms": {"float": small, "rule": SMALL_GEMM_SOURCE}} if (small := small_gemm_floats(calibration)) else {}),
        "quantized_layers": len(chosen),
        "layers": len(calibration.layers),
        "activation_dtype": TensorProto.DataType.Name(TensorProto.INT8),
        "weights": "int8 symmetric per-output-channel",
        "weight_range": weight_range,
        "cpu_requirement": CPU_REQUIREMENT[weight_range],
        "activations": "int8 symmetric per-tensor",
        "refined": {"gptq_layers": len([l for l in chosen if refinement is not None and l.name in refinement.weights]),
                    "bias_corrected_layers": len([l for l in chosen if refinement is not None and l.name in refinement.biases])},
    })
    return info


def build_qdq(calibration: Calibration, *, keep_float: Iterable[str] | str = (), quantize_attention: bool | None = None) -> QuantizedGraph:
    """Insert Q/DQ pairs into the calibrated (smoothed) FP32 graph. No forward pass runs.

    ``keep_float`` returns layers to float (node names, kinds, op types or fnmatch
    patterns); ``quantize_attention`` overrides the calibration config's switch (the
    statistics cover the attention matmuls either way).
    """
    layers = calibration.layers
    floats, quantize_attention = _selected_layers(calibration, keep_float, quantize_attention)
    chosen = [l for l in layers if l.name not in floats]
    writer = _QdqWriter(calibration)
    for layer in chosen:
        writer.quantize(layer)
    m = writer.finish()
    set_metadata(m, {METADATA_KEY: json.dumps(_quantization_record(calibration, chosen, floats, quantize_attention), sort_keys=True)})
    violations = check_qdq_graph(m)
    if violations:
        raise QuantizationError(f"internal error: the Q/DQ graph breaks {len(violations)} rule(s), first: {violations[0]}")
    return QuantizedGraph(
        model=m,
        layers=tuple(layers),
        quantized=tuple(l.name for l in chosen),
        kept_float=tuple(l.name for l in layers if l.name in floats),
        calibration=calibration,
        small_gemms=small_gemm_floats(calibration),
    )
