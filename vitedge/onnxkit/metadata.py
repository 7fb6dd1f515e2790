"""What vitedge writes into an ONNX graph's metadata: the model's input spec (``SPEC_KEY``), the
input format a graph takes (``INPUT_FORMAT_KEY``: ``FLOAT_NCHW`` or ``UINT8_NHWC_RGB``), and for an FP32
graph rewritten from another (the onnx bundle's fused reference) the sha256 of the graph it computes
(``FP32_SOURCE_KEY``), so FP32 outputs can be shared with references converted from that graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from onnx import ModelProto


SPEC_KEY = "vitedge.spec"
INPUT_FORMAT_KEY = "vitedge.input_format"
FLOAT_NCHW = "float32-nchw"
UINT8_NHWC_RGB = "uint8-nhwc-rgb"
FP32_SOURCE_KEY = "vitedge.fp32_source_sha256"


def set_metadata(model: ModelProto, values: dict[str, str]) -> None:
    existing = {p.key: p for p in model.metadata_props}
    for key, value in values.items():
        if key in existing:
            existing[key].value = value
        else:
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value


def get_metadata(model: ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}
