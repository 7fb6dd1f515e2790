"""`vitedge build` end to end on the bundled example: bundles and shared calibration, read from one build of both CPU
targets. The interrupted builds are in test_build_interrupts.py and the CLI's summary and exit code in
test_build_cli.py: three files, so `--dist loadfile` can run them on both workers."""

from __future__ import annotations

import collections

import onnx
import pytest
from conftest import CALIB_DIR, EXAMPLES, REPO, VAL_DIR
from helpers.profiles import untimed_targets

from vitedge.backends.onnxruntime.attention import fuse_attention
from vitedge.backends.onnxruntime.gemm_bias import fuse_gemm_bias
from vitedge.backends.onnxruntime.patch_embed import fuse_patch_embedding
from vitedge.backends.onnxruntime.residual_sum import unfuse_skip_norm
from vitedge.backends.onnxruntime.shape_constants import fold_shape_arithmetic
from vitedge.backends.onnxruntime.transpose_pairs import cancel_transpose_pairs
from vitedge.app.build import BuildRequest, run_build
from vitedge.validation import passes
from vitedge.validation.reference_cache import ReferenceCacheSettings, graph_sha256
from vitedge.core.errors import UsageError
from vitedge.files.atomic import sha256_file
from vitedge.bundle.manifest import read_manifest, verify_bundle
from vitedge.core.ui import StageLog

DIGITS = EXAMPLES / "digits_vit.pt"
pytestmark = pytest.mark.skipif(not DIGITS.exists(), reason="bundled example not present")


@pytest.fixture(scope="module")
def two_target_build(tmp_path_factory, untimed_targets_dir):
    """One build of both CPU targets from one calibration (fresh cache), without the INT8-vs-FP32 timing (its tests are
    tests/backends/test_int8_payoff.py's): the onnx bundle must ship the shared Q/DQ graph, which the timing may not."""
    root = tmp_path_factory.mktemp("build")
    log = StageLog(quiet=True)
    req = BuildRequest(model=DIGITS, targets=("onnx", "intel-cpu"), calib=CALIB_DIR, val=VAL_DIR, out=root / "out",
                       cache=ReferenceCacheSettings(root=root / "cache"), measure_speed=True)
    passes.reset()
    with untimed_targets(untimed_targets_dir):
        results = run_build(req, log)
    _COLD_PASSES[:] = passes.passes()
    return root, results, log


_COLD_PASSES: list[passes.InferencePass] = []  # the inference passes two_target_build's cold build ran


def test_two_targets_share_one_calibration(two_target_build):
    root, results, log = two_target_build
    assert log.counts["calibrate"] == 1 and log.counts["quantize"] == 1 and log.counts["build"] == 2
    onnx_m, ov_m = (read_manifest(root / "out" / t) for t in ("onnx", "intel-cpu"))
    assert onnx_m.calibration["cache_key"] == ov_m.calibration["cache_key"]
    assert onnx_m.calibration["reused"] is False
    # the same Q/DQ graph: intel-cpu's copy as built, the onnx target's with its attention cores, GEMM biases and
    # patch embedding fused, the residual Add only the final LayerNorm reads written as Sum (no
    # SkipLayerNormalization: slower on CPU), and its shape arithmetic as constants (a batch-first ViT: no Transpose pair)
    shared = onnx.load(root / "out" / "intel-cpu" / "model.int8.onnx")
    assert fuse_attention(shared).fused == 6
    assert fuse_gemm_bias(shared).folded == 25  # 4 per block and the head (a Gemm)
    assert fuse_patch_embedding(shared).folded == 1
    assert unfuse_skip_norm(shared) == 1
    assert fold_shape_arithmetic(shared).replaced > 0
    assert cancel_transpose_pairs(shared) == 0
    assert onnx.load(root / "out" / "onnx" / "model.int8.onnx").SerializeToString() == shared.SerializeToString()
    # and both manifests name that shared graph by its hash
    assert onnx_m.quantization.qdq_sha256 == ov_m.quantization.qdq_sha256 == sha256_file(root / "out" / "intel-cpu" / "model.int8.onnx")


def test_cold_build_runs_each_inference_pass_once(two_target_build):
    """Issue 28 item 4: the accuracy budget runs the files each target ships, and validation reuses those
    outputs instead of running the same (graph, runtime, data) pass again; and the FP32 graph runs once for
    both CPU runtimes: OpenVINO's FP32 side takes ONNX Runtime's outputs after its spot check agrees.
    3 passes (FP32 once, INT8 per runtime) where there were 4."""
    root, results, _ = two_target_build
    census = collections.Counter((p.side, p.runtime, p.graph_sha256, p.data_hash) for p in _COLD_PASSES)
    assert census and max(census.values()) == 1, census
    assert sorted((p.stage, p.side, p.runtime, p.items) for p in _COLD_PASSES) == sorted(
        [("budget", "fp32", "onnxruntime", 397)] + [("budget", "int8", runtime, 397) for runtime in ("onnxruntime", "openvino")]
        + [("probe", f"fp32{m:+g}", "onnxruntime", 397) for m in (-0.25, 0.25)])  # the labelled probe, once for both targets
    ran = {p.graph_sha256 for p in _COLD_PASSES}
    for r in results:  # what ran is what ships, and validation says it read it (INT8 after its spot check)
        bundle = root / "out" / r.profile.name
        m = read_manifest(bundle)
        assert graph_sha256(bundle / m.artifacts.model) in ran
        data = m.validation["data"]
        assert data["int8_outputs"]["cache"] == "hit", data
        # the accuracy rows, not min_speedup: a timed verdict on a shared 2-core machine is noise (CI stop 41
        # failed here with the speedup of the 0.2 MB digits model under 1.0x while the other worker ran)
        accuracy_rows = [row for row in m.validation["gate"] if row["name"] != "min_speedup"]
        assert accuracy_rows and all(row["passed"] for row in accuracy_rows), accuracy_rows
    onnx_data, ov_data = (read_manifest(root / "out" / t).validation["data"] for t in ("onnx", "intel-cpu"))
    onnx_reference = root / "out" / "onnx" / read_manifest(root / "out" / "onnx").artifacts.reference  # attention fused
    assert onnx_data["reference"]["cache"] == "hit" and graph_sha256(onnx_reference) in ran
    shared = ov_data["reference"]["shared"]
    assert ov_data["reference"]["cache"] == "shared" and shared["runtime"] == "onnxruntime", ov_data
    assert len(shared["spot_check_items"]) == 2 and shared["max_abs_diff"] <= shared["tolerance"] * shared["output_scale"]
    assert "FP32 reference: 397 outputs computed by onnxruntime" in (root / "out" / "intel-cpu" / "report.md").read_text()


def test_onnx_target_fuses_every_attention_core(two_target_build):
    """The bundled digits ViT has 6 blocks: the `onnx` bundle runs 6 MultiHeadAttention nodes and says so."""
    root, _, _ = two_target_build
    m = read_manifest(root / "out" / "onnx")
    fusion = m.backend_info["attention_fusion"]
    assert fusion["operator"] == "com.microsoft.MultiHeadAttention"
    assert fusion["fused"] == fusion["candidates"] == 6 and fusion["skipped"] == [] and len(fusion["num_heads"]) == 1
    model = onnx.load(root / "out" / "onnx" / "model.int8.onnx")
    ops = collections.Counter((n.domain, n.op_type) for n in model.graph.node)
    assert ops[("com.microsoft", "MultiHeadAttention")] == 6 and ops[("", "Softmax")] == 0
    assert "com.microsoft" in {o.domain for o in model.opset_import}
    assert "attention_fusion" not in read_manifest(root / "out" / "intel-cpu").backend_info


def test_profile_can_keep_the_plain_qdq_graph(tmp_path, two_target_build, untimed_targets_dir):
    """targets/onnx.toml with fuse_attention = false: a model.int8.onnx any ONNX reader takes (no com.microsoft node).
    (Started from the untimed copy of it, as two_target_build: the graph read here is the Q/DQ one, never timed away.)"""
    root, _, _ = two_target_build
    shipped = (untimed_targets_dir / "onnx.toml").read_text()
    assert "fuse_attention = true" in shipped
    profile = tmp_path / "onnx-plain.toml"
    profile.write_text(shipped.replace('name = "onnx"', 'name = "onnx-plain"').replace("fuse_attention = true", "fuse_attention = false"))
    out = tmp_path / "plain"
    [result] = run_build(BuildRequest(model=DIGITS, targets=(str(profile),), calib=CALIB_DIR, out=out, cache=ReferenceCacheSettings(root=root / "cache"),
                                      measure_speed=False), StageLog(quiet=True))
    m = verify_bundle(out)
    assert m.target.name == "onnx-plain" and m.target.profile["backend_options"]["fuse_attention"] is False
    assert m.calibration["reused"] is True and "attention_fusion" not in m.backend_info
    model = onnx.load(out / "model.int8.onnx")
    assert not [n for n in model.graph.node if n.domain == "com.microsoft"]
    assert "com.microsoft" not in {o.domain for o in model.opset_import}
    assert collections.Counter(n.op_type for n in model.graph.node)["Softmax"] == 6


def test_bundles_hold_what_the_manifest_says(two_target_build):
    root, results, _ = two_target_build
    expected = {"onnx": {"model.int8.onnx", "reference.fp32.onnx"},
                "intel-cpu": {"model.xml", "model.bin", "reference.fp32.xml", "reference.fp32.bin", "model.int8.onnx", "reference.fp32.onnx"}}
    for r in results:
        bundle = root / "out" / r.profile.name
        m = verify_bundle(bundle)
        assert set(m.files) == expected[r.profile.name]
        for rel, digest in m.files.items():
            assert sha256_file(bundle / rel) == digest
        assert (bundle / "report.md").is_file() and (bundle / "manifest.json").is_file()
        assert m.artifacts.built is True and (bundle / m.artifacts.model).is_file()
        assert m.input.to_json() == {"name": "input", "format": "float32-nchw", "shape": [None, 3, 32, 32], "dtype": "float32",
                           "channels": 3, "color_mode": "RGB", "preprocess": m.spec.preprocess.to_dict(), "preprocess_baked": False}
        assert m.output.class_names == [str(i) for i in range(10)]
        cal = m.calibration["calibration"]
        assert cal["used"] == 200 and cal["seed"] == 0 and len(cal["data_hash"]) == 64
        assert m.quantization.layers_int8 > 0 and m.quantization.layers_total >= m.quantization.layers_int8
        assert {"python", "onnx", "onnxruntime", "torch"} <= set(m.toolchain)
        v = m.validation
        assert v["data"]["items"] == 397 and v["data"]["labeled"] is True
        acc = v["accuracy"]
        assert 0.9 < acc["fp32_top1"] <= 1 and 0.9 < acc["int8_top1"] <= 1 and 0.95 <= acc["top1_agreement"] <= 1
        assert v["latency"]["int8"]["1"]["iterations"] >= 20 and v["speedup"] > 0
        assert {row["name"] for row in v["gate"]} == {"max_top1_drop", "min_agreement", "min_decisive_agreement", "max_expected_drop",
                                                    "min_speedup"}
    assert "openvino" in read_manifest(root / "out" / "intel-cpu").toolchain


def test_the_onnx_bundle_ships_one_fp32_graph_and_says_which(two_target_build):
    """The onnx bundle holds one FP32 graph, reference.fp32.onnx: the exported graph with the INT8 graph's float
    rewrites, the one INT8 is validated against and the analysis reads; the manifest names its form and the exported
    graph it computes, which the intel-cpu bundle of the same build ships and converts (the sharing link)."""
    from vitedge.onnxkit.files import onnx_sha256
    from vitedge.validation.reference_cache import fp32_source_sha256

    root, _, _ = two_target_build
    bundle, ov_bundle = root / "out" / "onnx", root / "out" / "intel-cpu"
    m, ov = read_manifest(bundle), read_manifest(ov_bundle)
    graphs = [p.name for p in bundle.iterdir() if p.name.endswith(".onnx") and p.name != m.artifacts.model]
    assert graphs == ["reference.fp32.onnx"] == [m.artifacts.reference] == [m.artifacts.fp32_onnx]
    exported = onnx_sha256(ov_bundle / "reference.fp32.onnx")
    assert m.artifacts.fp32_graph == {"form": "fused", "source_sha256": exported}
    assert ov.artifacts.fp32_graph == {"form": "exported", "source_sha256": exported}
    assert fp32_source_sha256(bundle / "reference.fp32.onnx") == fp32_source_sha256(ov_bundle / "reference.fp32.xml") == exported
    ops = collections.Counter(n.op_type for n in onnx.load(bundle / "reference.fp32.onnx").graph.node)
    assert ops["MultiHeadAttention"] == 6 and ops["Softmax"] == 0
    assert "the exported graph " + exported[:12] + " with q/k/v merged and attention fused" in (bundle / "report.md").read_text()


def test_user_profile_and_existing_output_refused(tmp_path, two_target_build):
    root, _, _ = two_target_build
    profile = tmp_path / "edge-box.toml"
    # lenient thresholds: this test is about the profile and the output folder (a build without --val has few images)
    profile.write_text('backend = "onnxruntime"\nprecision = "int8"\nbatch_sizes = [1]\n[thresholds]\nmin_agreement = 0.5\n'
                       'min_decisive_agreement = 0.0\n'
                       '[backend_options]\ngraph_optimization = "basic"\nint8_payoff = false\n')
    out = tmp_path / "b"
    log = StageLog(quiet=True)
    [result] = run_build(BuildRequest(model=DIGITS, targets=(str(profile),), calib=CALIB_DIR, out=out, cache=ReferenceCacheSettings(root=root / "cache"),
                                      measure_speed=False), log)
    m = verify_bundle(out)
    assert m.target.name == "edge-box" and m.target.profile["backend_options"]["graph_optimization"] == "basic"
    assert m.calibration["reused"] is True and result.passed is True
    with pytest.raises(UsageError, match="--force"):
        run_build(BuildRequest(model=DIGITS, targets=(str(profile),), calib=CALIB_DIR, out=out, cache=ReferenceCacheSettings(root=root / "cache")), log)


def test_openvino_float_regions_follow_the_profile_and_the_reference_stays_f32(two_target_build):
    """intel-cpu's profile asks for bf16 float regions: the INT8 IR gets them where the CPU has bf16,
    its FP32 reference runs in f32 whatever the profile says, and the manifest records both."""
    import openvino as ov

    from vitedge.backends.openvino import (
        OpenVinoOptions,
        OpenVinoRunner,
        float_precision_used,
    )

    root, _, _ = two_target_build
    bundle = root / "out" / "intel-cpu"
    m = read_manifest(bundle)
    options = OpenVinoOptions(**m.target.profile["backend_options"])
    assert options.float_precision == "bf16"
    expected = float_precision_used(ov.Core(), "CPU", "bf16")  # bf16 on CPUs with bf16 units, else f32
    assert m.backend_info["float_precision"] == {"requested": "bf16", "used": expected, "reference": "f32"}
    with OpenVinoRunner(bundle / "model.xml", options) as int8, OpenVinoRunner(bundle / "reference.fp32.xml", options) as ref:
        assert (int8.role, int8.float_precision) == ("int8", expected)
        assert (ref.role, ref.float_precision) == ("fp32-reference", "f32")
        assert int8.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name() == expected
        assert ref.compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name() == "f32"
    with OpenVinoRunner(bundle / "model.xml", OpenVinoOptions(float_precision="f32")) as plain:
        assert plain.float_precision == "f32"


def test_openvino_float_precision_must_be_known(tmp_path):
    from vitedge.core.errors import ProfileError
    from vitedge.targets.profiles import load_profile

    profile = tmp_path / "mine.toml"
    profile.write_text((REPO / "targets" / "intel-cpu.toml").read_text().replace('float_precision = "bf16"', 'float_precision = "fp16"'))
    with pytest.raises(ProfileError) as err:
        load_profile(str(profile))
    msg = str(err.value)
    assert str(profile) in msg and "float_precision" in msg and "fp16" in msg and "\n" not in msg
