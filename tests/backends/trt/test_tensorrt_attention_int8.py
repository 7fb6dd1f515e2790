"""INT8 attention for the NVIDIA targets: their Q/DQ graph quantizes both inputs of Q.K^T and P.V
(the accuracy budget returns any that costs accuracy to float, matmul by matmul), the CPU targets'
graph keeps them float, and the bundle says per block whether TensorRT's fused-MHA rules allow
INT8 fusion and why not."""

from __future__ import annotations

import onnx
import pytest

from vitedge.backends.tensorrt.attention import AttentionBlock, attention_blocks, fusion_table
from vitedge.manifest import read_manifest
from vitedge.profiles import load_profile


@pytest.mark.parametrize("name", ["jetson-orin", "jetson-orin-nx", "jetson-orin-nano", "desktop-gpu", "jetson", "nvidia-gpu"])
def test_nvidia_profiles_quantize_attention_and_cpu_profiles_do_not(name):
    assert load_profile(name).quantization.get("quantize_attention") is True
    for cpu in ("onnx", "intel-cpu", "intel-cpu-vnni"):
        assert not load_profile(cpu).quantization.get("quantize_attention", False)


def test_nvidia_graph_has_int8_attention_where_the_budget_allows_and_the_cpu_graph_keeps_it_float(example_bundles):
    root = example_bundles[0]
    jetson, cpu = read_manifest(root / "jetson"), read_manifest(root / "intel-cpu")
    assert jetson.quantization["config"]["quantize_attention"] is True
    assert cpu.quantization["config"]["quantize_attention"] is False
    assert jetson.quantization["qdq_sha256"] != cpu.quantization["qdq_sha256"]  # a separate NVIDIA graph, validated by its own budget
    blocks = attention_blocks(onnx.load(str(root / "jetson" / "model.int8.onnx")))
    kept = set(jetson.quantization["kept_float"])
    assert len(blocks) == 6
    for b in blocks:  # Q/DQ on both inputs of each matmul the budget did not return to float
        assert b.qk_quantized == (b.qk_matmul not in kept) and b.pv_quantized == (b.pv_matmul not in kept), b
    assert any(b.qk_quantized and b.pv_quantized for b in blocks)
    cpu_blocks = attention_blocks(onnx.load(str(root / "intel-cpu" / "model.int8.onnx")))
    assert len(cpu_blocks) == 6 and not any(b.qk_quantized or b.pv_quantized for b in cpu_blocks)

    recorded = jetson.backend_info["attention"]["blocks"]  # the family bundle records them too
    assert [AttentionBlock(**b) for b in recorded] == blocks
    report = (root / "jetson" / "report.md").read_text()
    rows = [line for line in report.splitlines() if line.startswith("| `/blocks/blocks.")]
    assert len(rows) == len(blocks)
    for b, row in zip(blocks, rows):
        assert row.startswith(f"| `{b.scope}` | {b.heads} | {b.tokens} | {b.head_size} |")
        assert ("no: " not in row) == (not b.int8_mha_blockers())


def test_fusion_table_says_per_block_whether_and_why_not():
    def block(i, *, heads=12, tokens=197, head_size=64, qk=True, pv=True):
        return AttentionBlock(scope=f"/blocks.{i}/attn/", softmax="s", qk_matmul="qk", pv_matmul="pv", heads=heads,
                              tokens=tokens, head_size=head_size, qk_quantized=qk, pv_quantized=pv)

    rows = fusion_table([block(0), block(1, pv=False), block(2, tokens=577), block(3, head_size=48), block(4, tokens=None)])[2:]
    assert rows[0].endswith("| yes | yes | allowed by the rules (the engine inspector confirms it on the device) |")
    assert "| yes | no | no: its attention matmuls have no Q/DQ on both inputs (they run in float) |" in rows[1]
    assert "no: 577 tokens is more than 512" in rows[2]
    assert "no: head size 48 is not 16, 32 or 64" in rows[3]
    assert "| ? |" in rows[4] and "allowed as far as the graph shows (token count not inferred" in rows[4]
    assert fusion_table([]) == []
