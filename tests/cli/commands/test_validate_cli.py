"""`vitedge validate` on a real bundle built from the bundled example: the gate, the reports,
the per-layer sensitivity, and `build` writing the same reports through the same code.

Timing values are printed and recorded in the reports, never asserted against wall-clock limits.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from conftest import VAL_DIR
from helpers.cli import run_cli

LENIENT = ("--max-top1-drop", 100, "--min-agreement", 0, "--min-decisive-agreement", 0)  # the gate cannot fail on accuracy: these tests are about plumbing


def _junit(path: Path) -> tuple[ET.Element, list[ET.Element]]:
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    return suite, suite.findall("testcase")


def test_validate_passes_and_writes_every_report(bundle, capsys, monkeypatch, tmp_path):
    from vitedge.bundle.manifest import read_manifest
    from vitedge.validation.report import (
        check_validation_document,
        matplotlib_available,
    )

    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    code, out, err = run_cli(capsys, "validate", bundle, "--data", VAL_DIR, "--data-size", 48, "--no-latency",
                             "--sensitivity-samples", 8, *LENIENT)
    assert code == 0, err
    assert "PASS: onnx" in out
    report = bundle / "report"
    doc = json.loads((report / "validation.json").read_text())
    assert check_validation_document(doc) == []
    assert doc["schema"] == "vitedge.validation/1" and doc["passed"] is True and doc["producer"] == "vitedge validate"
    assert doc["data"]["items"] == 48 and doc["accuracy"]["samples"] == 48 and doc["accuracy"]["labeled"] is True
    assert sorted(doc["thresholds"]["overridden"]) == ["max_top1_drop", "min_agreement", "min_decisive_agreement"]
    assert doc["artifact"]["bytes"] == (bundle / "model.int8.onnx").stat().st_size
    assert doc["memory"]["peak_rss_bytes"] > 0
    assert [(r["name"], r["status"]) for r in doc["gate"]] == [("max_top1_drop", "pass"), ("min_agreement", "pass"),
                                                               ("min_decisive_agreement", "pass"), ("max_expected_drop", "pass"),
                                                               ("min_speedup", "skip")]

    # per-layer sensitivity: every INT8 layer once, ranked worst first, on ONNX Runtime
    sens = doc["sensitivity"]
    manifest = read_manifest(bundle)
    assert sens["samples"] == 8 and "onnxruntime" in sens["runtime"]
    assert len(sens["layers"]) == manifest.quantization.layers_int8
    assert [l["rank"] for l in sens["layers"]] == list(range(1, len(sens["layers"]) + 1))
    values = [l[sens["metric"]] for l in sens["layers"]]
    assert values == sorted(values, reverse=True)
    assert sens["baseline"][sens["metric"]] < values[0]  # the float twin is closer to FP32 than the worst layer
    assert {l["kind"] for l in sens["layers"]} <= {"linear", "patch_embed", "head", "conv", "attention_matmul"}
    print(f"sensitivity: {len(values)} layers in {sens['seconds']:.1f} s; worst {sens['layers'][0]['name']} {values[0]:.2e}; "
          f"floor {sens['baseline'][sens['metric']]:.2e}")

    suite, cases = _junit(report / "junit.xml")
    assert [c.get("name") for c in cases] == ["max_top1_drop", "min_agreement", "min_decisive_agreement", "max_expected_drop",
                                               "min_speedup"]
    assert suite.get("tests") == "5" and suite.get("failures") == "0" and suite.get("skipped") == "1"
    md = (report / "summary.md").read_text()
    assert "PASS" in md and "Most sensitive layers" in md
    assert summary.read_text().strip() == md.strip()
    if matplotlib_available():
        assert (report / "sensitivity.png").read_bytes()[:4] == b"\x89PNG"
    assert not (report / "latency.png").exists()  # --no-latency: no latency plot


def test_unmeetable_thresholds_fail_with_one_line_naming_each(bundle, capsys, tmp_path):
    report = tmp_path / "reports"
    code, out, err = run_cli(capsys, "validate", bundle, "--data", VAL_DIR, "--data-size", 16, "--no-sensitivity",
                             "--latency-seconds", 0.05, "--max-p99-ms", 0.0001, "--min-speedup", 1000,
                             "--report-dir", report, "-q", *LENIENT)
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "speedup over FP32" in lines[0] and "short by" in lines[0]
    assert "p99 latency" in lines[0] and "over by" in lines[0]
    doc = json.loads((report / "validation.json").read_text())
    rows = {r["name"]: r for r in doc["gate"]}
    assert rows["min_speedup"]["status"] == "fail" and rows["min_speedup"]["margin"] > 0
    assert rows["max_p99_ms"]["status"] == "fail" and rows["max_p99_ms"]["margin"] > 0
    assert doc["passed"] is False and len(doc["failures"]) == 2
    lat = doc["latency"]
    assert lat["measured"] and set(lat["int8"]) == {"1", "8"} and set(lat["speedup"]) == {"1", "8"}
    for b, s in lat["int8"].items():
        print(f"batch {b}: INT8 p50 {s['p50_ms']:.3f} ms p99 {s['p99_ms']:.3f} ms over {s['iterations']} iterations "
              f"(stable {s['stable']}); speedup {lat['speedup'][b]:.2f}x")
    suite, cases = _junit(report / "junit.xml")
    assert suite.get("tests") == "6" and suite.get("failures") == "2"  # min_decisive_agreement and max_expected_drop are rows of their own
    failed = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert set(failed) == {"min_speedup", "max_p99_ms"}
    assert "over by" in failed["max_p99_ms"].get("message")
    assert "FAIL" in (report / "summary.md").read_text()
    assert not (bundle / "report").exists()  # --report-dir: nothing in the bundle


def test_build_runs_the_same_validation_and_reports(built_bundle):
    from vitedge.bundle.manifest import verify_bundle
    from vitedge.validation.report import check_validation_document

    manifest = verify_bundle(built_bundle)  # report/ is not part of the hashed files
    doc = json.loads((built_bundle / "report" / "validation.json").read_text())
    assert check_validation_document(doc) == []
    assert doc["producer"] == "vitedge build" and doc["sensitivity"] is None and doc["latency"]["measured"] is False
    assert manifest.validation["schema"] == doc["schema"] and manifest.validation["gate"] == doc["gate"]
    assert "report/validation.json" in (built_bundle / "report.md").read_text()
    _, cases = _junit(built_bundle / "report" / "junit.xml")
    assert len(cases) == len(doc["gate"]) == 5  # the onnx profile sets no max_p99_ms (rows: drop, agreement, decisive, expected drop, speed)


def test_default_data_is_the_set_recorded_at_build_time(bundle, capsys):
    code, out, err = run_cli(capsys, "validate", bundle, "--no-latency", "--no-sensitivity", *LENIENT)
    assert code == 0, err
    assert "re-validating on the validation set the build validated on" in " ".join(err.split())
    doc = json.loads((bundle / "report" / "validation.json").read_text())
    assert doc["data"]["path"] == str(VAL_DIR) and doc["data"]["role"] == "validation"


def test_sensitivity_api_ranks_a_chosen_subset(built_bundle):
    from vitedge.datasources.sources import open_source
    from vitedge.bundle.manifest import read_manifest
    from vitedge.validation.sensitivity import first_inputs, layer_sensitivity

    m = read_manifest(built_bundle)
    x = first_inputs(open_source(VAL_DIR, m.spec.preprocess, class_names=m.spec.class_names), 4)
    every = layer_sensitivity(built_bundle / "reference.fp32.onnx", built_bundle / "model.int8.onnx", x, layers=[])
    assert every.layers == []
    import onnx

    qdq = onnx.load(str(built_bundle / "model.int8.onnx"))
    producer = {o: n.op_type for n in qdq.graph.node for o in n.output}
    names = [n.name for n in qdq.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")
             and producer.get(n.input[0]) == "DequantizeLinear"][:3]
    result = layer_sensitivity(built_bundle / "reference.fp32.onnx", qdq, x, layers=names)
    ranked = result.ranked()
    assert sorted(name for name, _, _ in ranked) == sorted(names)
    assert all("kl" in metrics and "top1_flip_rate" in metrics for _, _, metrics in ranked)
    assert result.full["kl"] >= 0 and result.samples == 4


def test_docs_describe_every_schema_key():
    from conftest import REPO

    from vitedge.validation import report

    text = (REPO / "docs" / "reports.md").read_text()
    keys = {k for keys in report.VALIDATION_KEYS.values() for k in keys}
    keys |= set(report.LOGIT_KEYS + report.LABEL_KEYS + report.EMBEDDING_KEYS + report.LATENCY_STATS_KEYS
                + report.SENSITIVITY_KEYS + report.SENSITIVITY_LAYER_KEYS)
    assert report.SCHEMA in text
    assert sorted(k for k in keys if f"`{k}`" not in text and f".{k}`" not in text) == []


def test_embedding_parity_and_its_gate():
    """Encoders are gated on per-sample embedding cosine (mean and a low percentile); nearest-neighbour
    agreement is reported, and gated only when min_nn_agreement is set."""
    import numpy as np

    from vitedge.targets.profiles import Thresholds
    from vitedge.validation.accuracy import compare_embeddings
    from vitedge.validation.report import check_validation_document
    from vitedge.validation.run import evaluate_gate

    rng = np.random.default_rng(0)
    ref = rng.normal(size=(50, 16)).astype(np.float32)
    acc = compare_embeddings(ref, ref + rng.normal(scale=0.01, size=ref.shape).astype(np.float32))
    acc["output_kind"] = "embedding"
    assert acc["embedding_cosine_mean"] > 0.99 and acc["embedding_cosine_worst1pct"] <= acc["embedding_cosine_low"] <= acc["embedding_cosine_mean"]
    assert acc["embedding_cosine_low_percentile"] == 5.0
    assert acc["nn_agreement"] >= 0.9 and acc["top1_agreement"] == acc["nn_agreement"]
    rows = {r.name: r for r in evaluate_gate(acc, None, None, Thresholds())}
    assert [r for r in rows] == ["max_top1_drop", "min_agreement", "min_embedding_cosine", "min_embedding_cosine_low", "min_speedup"]
    assert rows["min_embedding_cosine"].status == rows["min_embedding_cosine_low"].status == "pass"
    assert rows["min_agreement"].status == "skip" and "embedding cosine" in rows["min_agreement"].detail
    assert rows["max_top1_drop"].status == "skip" and "embedding" in rows["max_top1_drop"].detail
    # neighbours swapped, cosine intact: passes unless the user asks for neighbour agreement
    close = np.repeat(rng.normal(size=(1, 16)), 50, axis=0) + rng.normal(scale=1e-3, size=(50, 16))
    swapped = compare_embeddings(close, close + rng.normal(scale=1e-3, size=close.shape))
    swapped["output_kind"] = "embedding"
    assert swapped["nn_agreement"] < 0.5 and swapped["embedding_cosine_low"] > 0.999
    assert all(r.status != "fail" for r in evaluate_gate(swapped, None, None, Thresholds()))
    asked = {r.name: r for r in evaluate_gate(swapped, None, None, Thresholds(min_nn_agreement=0.9))}
    assert asked["min_nn_agreement"].status == "fail" and "nearest-neighbour" in asked["min_nn_agreement"].detail
    # a few bad samples: the mean holds, the low percentile catches them
    some = ref.copy()
    some[:5] = rng.normal(size=(5, 16))
    tail = compare_embeddings(ref, some)
    tail["output_kind"] = "embedding"
    rows = {r.name: r for r in evaluate_gate(tail, None, None, Thresholds(min_embedding_cosine=0.85))}
    assert rows["min_embedding_cosine"].status == "pass" and rows["min_embedding_cosine_low"].status == "fail"
    # the report schema takes the encoder's rows (and min_nn_agreement when set)
    for gate in (evaluate_gate(acc, None, None, Thresholds()), list(asked.values())):
        doc = {"accuracy": acc, "gate": [r.to_dict() for r in gate]}
        assert not [p for p in check_validation_document(doc) if p.startswith("gate")]


def test_min_decisive_agreement_is_a_flag_of_validate_and_sets_its_row(bundle, capsys, tmp_path):
    """--min-decisive-agreement sets the decisive row's limit like the profile's [thresholds] key; out of [0, 1]: exit 2."""
    report = tmp_path / "reports"
    code, _, err = run_cli(capsys, "validate", bundle, "--data", VAL_DIR, "--data-size", 64, "--no-sensitivity", "--no-latency",
                           "--min-decisive-agreement", "0.9", "--report-dir", report, "-q", *LENIENT[:4])
    assert code == 0, err
    doc = json.loads((report / "validation.json").read_text())
    row = {r["name"]: r for r in doc["gate"]}["min_decisive_agreement"]
    assert row["limit"] == 0.9 and doc["thresholds"]["min_decisive_agreement"] == 0.9, row
    code, _, err = run_cli(capsys, "validate", bundle, "--min-decisive-agreement", "1.5", "--no-latency", "-q")
    assert code == 2 and "--min-decisive-agreement" in err and len(err.strip().splitlines()) == 1, err
