"""INT8 post-training quantization: one symmetric Q/DQ ONNX graph for every target.

    from vitedge.quantize import QuantConfig, calibrate, build_qdq
    cal = calibrate("model.onnx", source, QuantConfig(method="percentile"))
    q = build_qdq(cal, keep_float={"head"})
    q.save("model.int8.onnx")

Heavy imports (onnx, onnxruntime) happen inside the functions.
"""

from vitedge.quantize.calibrate import calibrate, quantize
from vitedge.quantize.record import Calibration
from vitedge.quantize.checker import Violation, assert_qdq_graph, check_qdq_graph
from vitedge.quantize.config import LAYER_KINDS, METHODS, QUANTIZER_VERSION, QuantConfig
from vitedge.quantize.graph import QuantLayer
from vitedge.quantize.qdq import (
    METADATA_KEY,
    QuantizedGraph,
    build_qdq,
    resolve_keep_float,
)

__all__ = [
    "LAYER_KINDS",
    "METADATA_KEY",
    "METHODS",
    "QUANTIZER_VERSION",
    "Calibration",
    "QuantConfig",
    "QuantLayer",
    "QuantizedGraph",
    "Violation",
    "assert_qdq_graph",
    "build_qdq",
    "calibrate",
    "check_qdq_graph",
    "quantize",
    "resolve_keep_float",
]
