"""The onnx target's rewrites on ViT layouts other than timm's (issue 47): per-head query/key/value Linear layers
with a distillation token, one q/k/v Linear each per block, nn.TransformerEncoder (exported with its fast path off,
and traced with it on), and a CCT's conv tokenizer. Each small model is written with our own code
(tests/helpers/vit_layouts.py), loaded and exported by vitedge, quantized from one calibration; the tests count the
fused attention cores and folded biases and compare the rewritten graph's outputs with the plain one's."""

from __future__ import annotations

import collections
import functools
import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import CALIB_DIR

from vitedge.backends.onnxruntime.backend import _fuse_file
from vitedge.backends.onnxruntime.attention import fuse_attention
from vitedge.models.intake import IntakeOptions
from vitedge.onnxkit.session import SessionSettings, ort_session

LAYOUTS_PY = Path(__file__).resolve().parents[2] / "helpers" / "vit_layouts.py"
# name -> (class, kwargs): 2 blocks each; heads per block
MODELS = {
    "per_head_deit": ("PerHeadViT", {"dim": 48, "depth": 2, "heads": 3}),
    "separate_qkv": ("SeparateQKVViT", {"dim": 48, "depth": 2, "heads": 3}),
    "torch_encoder": ("EncoderViT", {"dim": 32, "depth": 2, "heads": 2, "channels": 1}),
    "torch_encoder_fastpath": ("EncoderViT", {"dim": 32, "depth": 2, "heads": 2, "channels": 1}),
    "cct": ("CCT", {"dim": 32, "depth": 2, "heads": 2}),
}
pytestmark = pytest.mark.skipif(not CALIB_DIR.is_dir(), reason="calibration/digits is not in this checkout")


def _module(name):
    spec = importlib.util.spec_from_file_location("vit_layouts", LAYOUTS_PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cls, kwargs = MODELS[name]
    torch.manual_seed(0)
    return getattr(mod, cls)(**kwargs).eval()


def _checkpoint(name, folder):
    """(file, IntakeOptions) as a user hands it to vitedge."""
    cls, kwargs = MODELS[name]
    model = _module(name)
    if name == "torch_encoder_fastpath":  # traced under no_grad: aten::_transformer_encoder_layer_fwd, the fast path
        with torch.no_grad():
            traced = torch.jit.trace(model, torch.randn(2, 1, 32, 32), check_trace=False)
        path = folder / "encoder.ts.pt"
        torch.jit.save(traced, str(path))
        return path, IntakeOptions(mean=(0.5,), std=(0.5,))
    path = folder / f"{name}.pt"
    torch.save(model.state_dict(), path)
    return path, IntakeOptions(model_class=f"{LAYOUTS_PY}:{cls}", model_kwargs=kwargs)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory):
    """name -> (FP32 path, Q/DQ path, spec), exported and quantized (minmax, 16 images) once."""
    from vitedge.datasources.sources import open_source
    from vitedge.models.export import export_onnx
    from vitedge.models.intake import load_model
    from vitedge.quantize import QuantConfig, build_qdq, calibrate

    cache = tmp_path_factory.mktemp("calib-cache")

    @functools.lru_cache(maxsize=None)
    def get(name):
        folder = tmp_path_factory.mktemp(name)
        loaded = load_model(*_checkpoint(name, folder))
        fp32 = folder / "model.fp32.onnx"
        export_onnx(loaded, fp32)
        source = open_source(CALIB_DIR, loaded.spec.preprocess, limit=16, seed=0, class_names=None)
        qdq = build_qdq(calibrate(fp32, source, QuantConfig(method="minmax"), cache_dir=cache)).save(folder / "model.qdq.onnx")
        return fp32, qdq, loaded.spec

    return get


def _run(path_or_model, x):
    src = path_or_model.SerializeToString() if isinstance(path_or_model, onnx.ModelProto) else path_or_model
    sess = ort_session(src, SessionSettings(threads=2))
    return sess.run(None, {sess.get_inputs()[0].name: x})[0]


def _assert_same(a, b, spec, rel=1e-4):
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, spec.preprocess.channels, *spec.image_size)).astype(np.float32)
        ref, got = _run(a, x), _run(b, x)
        peak = float(np.max(np.abs(ref)))
        assert peak > 0 and ref.shape == got.shape
        assert float(np.max(np.abs(ref - got))) <= rel * peak + 1e-6, f"batch {batch}"


def _ops(model):
    return collections.Counter(n.op_type for n in model.graph.node)


@pytest.mark.parametrize("name", ["per_head_deit", "torch_encoder_fastpath"])
def test_float_attention_of_other_layouts_fuses(name, graphs):
    """Per-head cores (each head's q/k/v its own tensors) join into one MultiHeadAttention per block; the
    fast-path trace's cores (a Reshape before the Softmax, the decomposed attention's Where guard after it) fuse."""
    fp32, _, spec = graphs(name)
    model = onnx.load(str(fp32))
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    report = fuse_attention(fused)
    assert (report.candidates, report.fused, report.skipped) == (2, 2, ()), report
    assert set(report.num_heads) == {MODELS[name][1]["heads"]}
    assert _ops(fused)["Softmax"] == 0 and _ops(fused)["MultiHeadAttention"] == 2
    _assert_same(model, fused, spec)


@pytest.mark.parametrize("name", ["per_head_deit", "separate_qkv", "torch_encoder", "torch_encoder_fastpath"])
def test_int8_graph_of_other_layouts_fuses_every_core_and_bias(name, graphs, tmp_path):
    """The onnx artifact: q/k/v merged into one GEMM before quantization, every attention core one
    MultiHeadAttention, every INT8 GEMM's bias folded, no INT8 layer left for ONNX Runtime to run in float."""
    _, qdq, spec = graphs(name)
    attention, gemm_bias, patch, payoff = _fuse_file(qdq, tmp_path / "model.int8.onnx")
    assert (attention.candidates, attention.fused) == (2, 2), attention
    assert set(attention.num_heads) == {MODELS[name][1]["heads"]}
    # per block: one q/k/v GEMM, the projection, fc1, fc2; and the head(s) (DeiT-distilled: two)
    heads = 2 if name == "per_head_deit" else 1
    assert (gemm_bias.gemms, gemm_bias.folded, gemm_bias.skipped) == (4 * 2 + heads,) * 2 + ((),), gemm_bias
    assert patch.folded == 1 and payoff.layers == ()
    _assert_same(qdq, tmp_path / "model.int8.onnx", spec, rel=1e-3)


@pytest.mark.parametrize("name", ["torch_encoder", "per_head_deit"])
def test_fp32_reference_gets_the_attention_rewrite_the_int8_graph_got(name, graphs, tmp_path):
    """The onnx target's FP32 anchor (what INT8 is timed and validated against, and what ships when the whole
    model stays float) runs the same attention fusion as its INT8 graph: no Softmax left, no more nodes than the
    INT8 artifact (the exported graph keeps the attention's shape arithmetic), the same outputs as the export;
    the budget's ``shipped_graph`` writes the same bytes; it takes the exported graph's place (one FP32 graph in the
    bundle) and records the exported graph it computes."""
    from vitedge.backends.base import BuildContext
    from vitedge.backends.onnxruntime.backend import OnnxRuntimeBackend, OnnxRuntimeOptions
    from vitedge.onnxkit.files import onnx_sha256 as graph_sha256
    from vitedge.validation.reference_cache import fp32_source_sha256

    fp32, qdq, spec = graphs(name)
    out = tmp_path / "bundle"
    out.mkdir()
    options = OnnxRuntimeOptions(int8_payoff=False)
    backend = OnnxRuntimeBackend()
    artifact = backend.build(BuildContext(qdq_path=qdq, fp32_path=fp32, out_dir=out, options=options, batch_sizes=(1,)))
    reference, model = onnx.load(str(out / artifact.reference)), onnx.load(str(out / artifact.model))
    assert artifact.reference == "reference.fp32.onnx" and artifact.info["reference_attention_fusion"]["fused"] == 2
    assert sorted(p.name for p in out.iterdir()) == ["model.int8.onnx", "reference.fp32.onnx"]
    assert _ops(reference)["MultiHeadAttention"] == _ops(model)["MultiHeadAttention"] == 2 and _ops(reference)["Softmax"] == 0
    assert len(reference.graph.node) <= len(model.graph.node) < len(onnx.load(str(fp32)).graph.node)
    _assert_same(fp32, out / artifact.reference, spec)
    assert fp32_source_sha256(out / "reference.fp32.onnx") == graph_sha256(fp32)
    shipped = backend.shipped_graph(fp32, "reference", options, tmp_path)
    assert graph_sha256(shipped) == graph_sha256(out / artifact.reference)


def test_attention_fusion_timed_slower_here_is_used_in_neither_graph(graphs, tmp_path, monkeypatch):
    """Where the build times the fused FP32 attention slower than the exported one, the reference is the exported
    graph and the INT8 artifact keeps its attention unfused too, and the records say why."""
    import vitedge.backends.onnxruntime.backend as backend_mod
    import vitedge.backends.onnxruntime.payoff as payoff
    from vitedge.backends.base import BuildContext
    from vitedge.backends.int8_timing import TimedRatio

    monkeypatch.setattr(backend_mod, "attention_fusion_pays", lambda *a, **k: {"fused_over_exported": {"1": 1.3}, "slower": True})
    monkeypatch.setattr(payoff, "interleaved_times", lambda *a, **k: TimedRatio(0.5, 1.0, 1e-3))
    fp32, qdq, _ = graphs("torch_encoder")
    out = tmp_path / "bundle"
    out.mkdir()
    artifact = backend_mod.OnnxRuntimeBackend().build(BuildContext(qdq_path=qdq, fp32_path=fp32, out_dir=out,
                                                                   options=backend_mod.OnnxRuntimeOptions(), batch_sizes=(1,)))
    assert artifact.reference == "reference.fp32.onnx" and not (out / backend_mod.FUSED_REFERENCE).exists()
    assert artifact.info["reference_attention_fusion"]["timed"]["slower"] is True
    fusion = artifact.info["attention_fusion"]
    assert fusion["fused"] == 0 and fusion["candidates"] == 2 and "timed slower" in fusion["skipped"][0]
    ops = _ops(onnx.load(str(out / artifact.model)))
    assert ops["MultiHeadAttention"] == 0 and ops["Softmax"] == 2 and ops["MatMulIntegerToFloat"] > 0


def test_fused_attention_is_timed_against_the_exported_graph(tmp_path):
    """``attention_fusion_pays`` reads a graph with three times the work as slower, and one as fast as not."""
    from onnx import TensorProto, helper, numpy_helper

    from vitedge.backends.onnxruntime.payoff import attention_fusion_pays

    def chain(path, links):
        w = numpy_helper.from_array(np.eye(256, dtype=np.float32), "w")
        names = ["x"] + [f"h{i}" for i in range(links - 1)] + ["y"]
        nodes = [helper.make_node("MatMul", [names[i], "w"], [names[i + 1]]) for i in range(links)]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 512, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 512, 256])], [w])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        return path

    exported, slow = chain(tmp_path / "a.onnx", 1), chain(tmp_path / "b.onnx", 3)
    record = attention_fusion_pays(exported, slow, (1,), "avx2")
    assert record["slower"] is True and record["verdicts"] == {"1": "slower"} and record["fused_over_exported"]["1"] > 1.5


def test_per_head_qkv_is_one_gemm_per_block_before_quantization(graphs):
    """3 heads x q/k/v = 9 Linear layers per block become one quantized GEMM (and the graph computes the same:
    the merge is checked at quantization time, and here against the exported FP32 graph)."""
    from vitedge.quantize.graph import GraphIndex, find_layers, prepare

    fp32, qdq, spec = graphs("per_head_deit")
    model = onnx.load(str(fp32))
    prepared = prepare(model)
    layers = find_layers(GraphIndex(prepared))
    linear = [l for l in layers if l.kind == "linear"]
    assert len(linear) == 4 * 2  # per block: packed q/k/v, proj, fc1, fc2
    packed = [l for l in linear if l.channels == 3 * 48]
    assert len(packed) == 2 and all(l.name.endswith("/merged") for l in packed)
    _assert_same(model, prepared, spec)
    names = {n.name for n in onnx.load(str(qdq)).graph.node if n.op_type == "MatMul"}
    assert {l.name for l in packed} <= names  # the Q/DQ graph quantizes the merged GEMMs
    assert not [n for n in names if n.endswith(("/query/MatMul", "/key/MatMul", "/value/MatMul"))]


def test_conv_tokenizer_ort_runs_in_float_stays_float(graphs, tmp_path):
    """A CCT's conv tokenizer (3x3 conv + ReLU + max-pool): ONNX Runtime has no integer kernel for a Conv without a
    QuantizeLinear after it, so the onnx artifact keeps it float, and says so."""
    _, qdq, spec = graphs("cct")
    attention, gemm_bias, _, payoff = _fuse_file(qdq, tmp_path / "model.int8.onnx")
    assert attention.fused == 2  # the sequence pooling's Softmax is no attention core
    [kept] = payoff.layers
    assert kept["op_type"] == "Conv" and "tokenizer" in kept["name"] and "float" in kept["why"]
    assert payoff.to_dict()["cpu"] and "1 layer(s) kept float" in payoff.one_line()
    out = onnx.load(str(tmp_path / "model.int8.onnx"))
    conv = next(n for n in out.graph.node if n.op_type == "Conv")
    producers = {o: n.op_type for n in out.graph.node for o in n.output}
    assert "DequantizeLinear" not in {producers.get(i) for i in conv.input}
    # closer to FP32 than the INT8 conv was (the image's and the weight's rounding are gone)
    fp32 = graphs("cct")[0]
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32)
    ref = _run(str(fp32), x)
    assert np.abs(_run(str(tmp_path / "model.int8.onnx"), x) - ref).max() <= np.abs(_run(str(qdq), x) - ref).max()


def test_build_records_the_keep_float_decision_in_manifest_and_report(tmp_path, monkeypatch):
    """`vitedge build --target onnx` of a small CCT: the manifest's quantization section names the layer kept float,
    why, and the CPU kind whose ONNX Runtime decided; report.md says the same in one line. The build's INT8/FP32
    timing is made to find INT8 paying: on a loaded machine it may keep the whole model float, which is another test's;
    and the per-layer profile to find no layer slower."""
    import vitedge.backends.onnxruntime.payoff as payoff
    from vitedge.app.build import BuildRequest, run_build

    from vitedge.backends.int8_timing import TimedRatio

    monkeypatch.setattr(payoff, "interleaved_times", lambda *a, **k: TimedRatio(0.5, 1.0, 1e-3))
    from vitedge.backends.onnxruntime import layer_payoff

    monkeypatch.setattr(layer_payoff, "profile_verdicts", lambda *a, **k: [])  # per layer: no layer found slower (another test's)
    from vitedge.budget import BudgetSettings
    from vitedge.core.cpu import read_cpu
    from vitedge.bundle.manifest import read_manifest
    from vitedge.core.ui import StageLog
    from vitedge.validation.reference_cache import ReferenceCacheSettings

    pt, intake = _checkpoint("cct", tmp_path)
    [result] = run_build(BuildRequest(model=pt, targets=("onnx",), calib=CALIB_DIR, calib_size=16, out=tmp_path / "out", intake=intake,
                                      cache=ReferenceCacheSettings(root=tmp_path / "cache"), measure_speed=False,
                                      budget=BudgetSettings(enabled=False)), StageLog(quiet=True))
    manifest = read_manifest(result.bundle)
    record = manifest.quantization.int8_payoff
    assert record["cpu"] == read_cpu().isa and record["source"] == "onnxruntime optimized graph"
    [kept] = record["kept_float"]
    assert kept["op_type"] == "Conv" and "tokenizer" in kept["name"] and "runs it as a float" in kept["why"]
    gemms = manifest.backend_info["gemm_bias_fusion"]
    assert gemms["folded"] == gemms["gemms"] - 2 and all("qkv" in r for r in gemms["skipped"])  # CCT's q/k/v have no bias
    report = (result.bundle / "report.md").read_text()
    [line] = [l for l in report.splitlines() if "kept float where INT8 does not pay" in l]
    assert kept["name"] in line and read_cpu().isa in line


def test_a_bundle_still_slower_says_what_was_tried():
    from vitedge.app.reporting import still_slower_line

    info = {"attention_fusion": {"fused": 12, "candidates": 12}, "gemm_bias_fusion": {"folded": 48, "gemms": 48},
            "int8_payoff": {"kept_float": [{"name": "conv"}]}}
    line = still_slower_line(info, 0.8)
    assert line.startswith("INT8 still ran slower than FP32 here (0.80x") and "attention fusion 12 of 12" in line
    assert "GEMM bias folding 48 of 48" in line and "1 layer(s) kept float" in line
    assert still_slower_line(info, 1.3) is None and still_slower_line(info, None) is None


def test_a_bundle_kept_float_whole_says_what_it_tried_and_that_it_ships_fp32():
    """After the timing kept the whole model float, the line names the steps timed and says the shipped graph is the
    FP32 one, not that "N layer(s) kept float" left INT8 slower."""
    from vitedge.app.reporting import still_slower_line

    why = "INT8 of the whole model is slower than FP32 in ONNX Runtime on avx2 (INT8 1.70/0.99)"
    info = {"attention_fusion": {"fused": 0, "candidates": 16}, "gemm_bias_fusion": {"folded": 13, "gemms": 61},
            "int8_payoff": {"cpu": "avx2", "kept_float": [{"name": f"mm{i}", "op_type": "MatMul", "why": why} for i in range(61)],
                            "timed": {"timed_on": "avx2", "whole_model_float": True, "control_noise": 0.03,
                                      "steps": [{"step": "INT8", "taken": True, "int8_over_fp32": {"1": 1.7, "8": 0.99}}]}}}
    line = still_slower_line(info, 0.97)
    assert line.startswith("the shipped graph is the FP32 one") and "layer(s) kept float" not in line
    assert "INT8 1.70/0.99" in line and "(b1/b8)" in line and "attention fusion 0 of 16" in line
    assert "61 INT8 layer(s)" in line and "3%" in line and "0.97x" in line
    ov = {"int8_payoff": {"cpu": "avx2", "whole_model_float": True, "control_noise": 0.1, "kept_float": [{"name": "fc", "why": "x"}],
                          "steps": [{"step": "INT8 (bf16 float regions)", "taken": True, "int8_over_fp32": {"1": 1.4}},
                                    {"step": "INT8 (f32 float regions)", "taken": False, "int8_over_fp32": {"1": 1.5}},
                                    {"step": "whole model float", "taken": True, "int8_over_fp32": {"1": 1.0}}]}}
    line = still_slower_line(ov, 0.95)
    assert "INT8 (f32 float regions) 1.50 (not taken)" in line and "whole model float 1.00" in line


def _injected_node_times(slow):
    """A stand-in for ONNX Runtime's profile: the real node names of the graph ORT runs, with fixed times: every
    INT8 kernel 10 us (those whose name contains ``slow``: 100 us), every float matrix node 50 us, anything else 20 us."""
    from vitedge.backends.onnxruntime import layer_payoff

    def node_times(path, batch, runs=20, percentile=20.0):
        out = {}
        for n in layer_payoff.optimized_graph(path).graph.node:
            if n.op_type in layer_payoff.INT8_KERNELS:
                out[n.name] = (100.0 if slow in n.name else 10.0) * batch
            else:
                out[n.name] = (50.0 if n.op_type in layer_payoff.FLOAT_KERNELS else 20.0) * batch
        return out

    return node_times


@pytest.mark.parametrize("candidate_time, taken", [(0.7, True), (0.95, False)])
def test_layers_slower_per_layer_go_float_when_the_graph_then_times_faster(graphs, tmp_path, monkeypatch, candidate_time, taken):
    """The per-layer step with the profile and the side-by-side timing replaced by fixed figures (no timing is
    asserted): the feed-forward layers whose INT8 (kernel + quantization) takes longer than their FP32 layer are
    float in the shipped artifact when the whole graph then times faster than the artifact beyond the control's
    noise, and the manifest's records say which layers, their ratios, the CPU kind; otherwise the artifact stays as
    it was and the record says the step was not taken. The shipped file is what the validation then runs."""
    import vitedge.backends.onnxruntime.backend as backend_mod
    import vitedge.backends.onnxruntime.payoff as payoff
    from vitedge.backends.base import BuildContext
    from vitedge.backends.float_layers import int8_layers
    from vitedge.backends.int8_timing import TimedRatio
    from vitedge.backends.onnxruntime import layer_payoff
    from vitedge.core.cpu import read_cpu

    monkeypatch.setattr(backend_mod, "attention_fusion_pays", lambda *a, **k: {"fused_over_exported": {"1": 0.9}, "slower": False})
    monkeypatch.setattr(payoff, "interleaved_times", lambda *a, **k: TimedRatio(0.5, 1.0, 1e-3))  # whole model: INT8 pays
    fake = _injected_node_times("linear1")
    monkeypatch.setattr(layer_payoff, "node_times_side_by_side", lambda paths, batch, *a, **k: [fake(p, batch) for p in paths])
    monkeypatch.setattr(layer_payoff, "interleaved_percentiles",
                        lambda runs, **k: {"fp32": 1.0, "control": 1.01, "current": 0.9, "candidate": candidate_time})
    fp32, qdq, spec = graphs("torch_encoder")
    out = tmp_path / "bundle"
    out.mkdir()
    artifact = backend_mod.OnnxRuntimeBackend().build(BuildContext(qdq_path=qdq, fp32_path=fp32, out_dir=out,
                                                                   options=backend_mod.OnnxRuntimeOptions(), batch_sizes=(1, 8)))
    record = artifact.info["int8_payoff"]
    layers = record["layers"]
    assert layers["timed_on"] == read_cpu().isa and layers["batches"] == [1, 8] and layers["taken"] is taken
    chosen = {n for c in layers["candidates"] for n in c["layers"]}
    assert chosen and all("linear1" in n for n in chosen)
    assert all(set(c["int8_over_fp32"]) == {"1", "8"} and min(c["int8_over_fp32"].values()) >= 2.0 for c in layers["candidates"])
    shipped = onnx.load(str(out / artifact.model))
    int8_names = {layer_payoff.base_name(n.name) for n in shipped.graph.node if n.op_type == "MatMulIntegerToFloat"} | set(int8_layers(shipped))
    per_layer = [k for k in record["kept_float"] if "slower than its FP32 layer" in k["why"]]
    if taken:
        assert {k["name"] for k in per_layer} == chosen and not chosen & int8_names
        assert all(read_cpu().isa in k["why"] and "INT8/FP32 per layer b1 " in k["why"] for k in per_layer)
        expected = onnx.load(str(qdq))  # the same graph built by hand: those layers float, then the target's rewrites
        from vitedge.backends.float_layers import return_to_float

        return_to_float(expected, lambda node, dq: "x" if node.name in chosen else None)
        onnx.save(expected, str(tmp_path / "expected.qdq.onnx"))
        _fuse_file(tmp_path / "expected.qdq.onnx", tmp_path / "expected.onnx")
        _assert_same(tmp_path / "expected.onnx", out / artifact.model, spec, rel=0.0)
    else:
        assert not per_layer and chosen <= int8_names
    line = backend_mod.layer_payoff_line(layers, len(chosen))
    assert ("kept float" in line) == taken and f"{len(chosen)} INT8 layer(s)" in line


def test_the_report_says_what_the_per_layer_step_did():
    """report.md's lines for the per-layer step, from the record alone: not taken (the graph with the slower layers
    float was not faster) names how many layers and both figures; taken, the still-slower line counts them."""
    from types import SimpleNamespace

    from vitedge.app.reporting import layer_step_line, still_slower_line

    layers = {"timed_on": "avx2 (no vnni)", "batches": [1, 8], "taken": False, "control_noise": 0.04,
              "candidates": [{"layers": ["/b0/fc1/MatMul"], "gain": 0.01}, {"layers": ["/b1/q/MatMul", "/b1/k/MatMul"], "gain": 0.02}],
              "current_over_fp32": {"1": 0.9, "8": 0.8}, "candidate_over_fp32": {"1": 0.88, "8": 0.85}}
    q = SimpleNamespace(int8_payoff={"cpu": "avx2 (no vnni)", "kept_float": [], "layers": layers})  # what it reads of the section
    line = layer_step_line(q)
    assert "3 INT8 layer(s) timed slower" in line and "0.90/0.80 as shipped, 0.88/0.85 with them float" in line
    assert "avx2 (no vnni)" in line and "moved by 4%" in line
    info = {"int8_payoff": {"kept_float": [], "layers": layers}}
    assert "3 layer(s) slower per layer timed float (the graph was not faster: not taken)" in still_slower_line(info, 0.9)
    taken = {**layers, "taken": True}
    kept = [{"name": "/b0/fc1/MatMul", "why": "its INT8 ... is slower than its FP32 layer in ONNX Runtime on avx2"}]
    q.int8_payoff = {"kept_float": kept, "layers": taken}
    assert layer_step_line(q) is None
    line = still_slower_line({"int8_payoff": {"kept_float": kept, "layers": taken}}, 0.9)
    assert "1 layer(s) slower per layer kept float" in line and "1 layer(s) kept float," not in line
    # taken, and then the whole model float: the whole model's record replaced the kept layers; the step still counts
    whole = [{"name": "/b0/fc1/MatMul", "why": "INT8 of the whole model is slower than FP32 in ONNX Runtime on avx2"}]
    line = still_slower_line({"int8_payoff": {"kept_float": whole, "layers": {**taken, "floated": 3},
                                              "timed": {"whole_model_float": True, "steps": []}}}, 0.95)
    assert "3 layer(s) slower per layer kept float" in line and "not taken" not in line and "the shipped graph is the FP32 one" in line
