"""The accuracy-budget tests' builds (tests/budget/test_budget*.py): the layers examples/make_outlier_vit.py damages,
the quantization that leaves them damaged, one build through `run_build`, and the INT8 layers of a bundle."""

from __future__ import annotations

from pathlib import Path

from vitedge.app.build import BuildRequest, TargetResult, run_build
from vitedge.app.overrides import QuantOverrides, ThresholdOverrides
from vitedge.core.ui import StageLog
from vitedge.validation.reference_cache import ReferenceCacheSettings

REPO = Path(__file__).resolve().parents[2]
CALIB_DIR = REPO / "calibration" / "digits" / "calib"
VAL_DIR = REPO / "calibration" / "digits" / "val"

# the layers whose inputs the rewrite gives outlier channels
PLANTED = {"/blocks/blocks.1/attn/qkv/MatMul", "/blocks/blocks.1/mlp/fc1/MatMul", "/blocks/blocks.3/mlp/fc1/MatMul",
           "/blocks/blocks.4/attn/proj/MatMul"}
NO_SQ = QuantOverrides(smoothquant_off=True, method="percentile")


def budget_build(model, out, cache, *, target="onnx", speed=False, keep_float=(), budget=None, quant=NO_SQ,
                 **thresholds) -> tuple[TargetResult, StageLog]:
    """One target built with the budget's usual gate (top-1 drop 0.2 points, agreement 0.99) unless ``thresholds`` say."""
    req = BuildRequest(model=model, targets=(str(target),), calib=CALIB_DIR, val=VAL_DIR, out=out, cache=ReferenceCacheSettings(root=cache),
                       measure_speed=speed, quant_overrides=quant, keep_float=tuple(keep_float), budget=budget,
                       threshold_overrides=ThresholdOverrides.of({"max_top1_drop": 0.2, "min_agreement": 0.99, **thresholds}))
    log = StageLog(quiet=True)
    return run_build(req, log)[0], log


def int8_nodes(bundle: Path) -> set[str]:
    """The names of the MatMul/Gemm/Conv layers of ``bundle``'s model.int8.onnx that read a dequantized input."""
    import onnx

    from vitedge.backends.onnxruntime.backend import unfold_int8_rewrites

    m = onnx.load(str(bundle / "model.int8.onnx"))
    unfold_int8_rewrites(m)  # the onnx target ships its INT8 layers as MatMulIntegerToFloat: back to DQ -> MatMul/Conv, same names
    dq = {o for n in m.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return {n.name for n in m.graph.node if n.op_type in ("MatMul", "Gemm", "Conv") and any(i in dq for i in n.input)}
