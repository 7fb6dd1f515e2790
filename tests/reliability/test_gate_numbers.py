"""No gate is fooled by a number (issue 46, class 4). Every figure a gate reads from a file is range-checked before
the gate uses it: `vitedge compare` refuses a report whose median latency is 0 ms, negative or infinite (it used to
take an old p50 of 0 or below at face value, so a build 100x slower passed), whose accuracy is not a fraction, whose
batch size is not one, or whose paired test's confidence is out of [0, 1). A model whose inputs preprocessing makes
one value (`--std 1e30`: FP32 sees only zeros) is refused naming --mean/--std instead of passing with a warning, and
a model declaring more classes than a bundle can hold is refused when it is read, not by runtime.load afterwards.
Each case asserts exit 2, the one line, and that nothing changed."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from conftest import CALIB_DIR, EXAMPLES
from rel_cli import assert_one_line, cli, debris, export_fp32, snapshot

DIGITS = EXAMPLES / "digits_vit.pt"


def _stats(b: str, p50: float) -> dict:
    return {"batch": int(b), "iterations": 50, "p50_ms": p50, "p90_ms": abs(p50) * 1.1 or 1.0, "p99_ms": abs(p50) * 1.2 or 1.0,
            "mean_ms": abs(p50) or 1.0, "throughput": 1000.0, "stable": True}


def _timed(doc: dict, int8_p50: float, fp32_p50: float = 2.0, batch: str = "1") -> dict:
    doc["latency"] = dict(doc["latency"], measured=True, fp32={batch: _stats(batch, fp32_p50)}, int8={batch: _stats(batch, int8_p50)},
                          speedup={batch: 2.0})
    return doc


def _write(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc).replace("Infinity", "1e999"))  # valid JSON that Python reads as inf
    return path


@pytest.fixture
def reports(built_bundle, tmp_path):
    base = json.loads((built_bundle / "report" / "validation.json").read_text())
    return base, tmp_path


def _compare(tmp_path: Path, old: dict, new: dict, code: int, *fragments: str) -> str:
    a, b = _write(tmp_path / "old.json", old), _write(tmp_path / "new.json", new)
    before = snapshot(tmp_path)
    line = assert_one_line(cli("compare", a, b), code, *fragments)
    assert snapshot(tmp_path) == before and not debris(tmp_path)
    return line


def test_a_sound_pair_of_timed_reports_gates_as_before(reports):
    base, tmp_path = reports
    run = cli("compare", _write(tmp_path / "old.json", _timed(json.loads(json.dumps(base)), 1.0)),
              _write(tmp_path / "new.json", _timed(json.loads(json.dumps(base)), 100.0)))
    assert run.code == 1 and "p50" in run.out + run.err, (run.code, run.out[-1500:], run.err[-1500:])  # 100x slower: a regression


@pytest.mark.parametrize("side,p50,shown", [
    ("old", 0.0, "0.0"), ("old", -3.0, "-3.0"), ("old", float("inf"), "inf"), ("new", 0.0, "0.0"), ("new", -0.5, "-0.5"),
])
def test_a_median_latency_out_of_range_is_refused_not_gated(reports, side, p50, shown):
    base, tmp_path = reports
    good, bad = _timed(json.loads(json.dumps(base)), 1.0), _timed(json.loads(json.dumps(base)), p50)
    if side == "new":
        good, bad = _timed(json.loads(json.dumps(base)), 1.0), _timed(json.loads(json.dumps(base)), p50)
        old, new = good, bad
    else:
        old, new = bad, _timed(json.loads(json.dumps(base)), 100.0)
    path = tmp_path / f"{side}.json"
    _compare(tmp_path, old, new, 2, f"{path} does not follow", f"latency.int8.1.p50_ms is {shown}, outside (0, 3.6e+06]",
             "hand-edited report")


def test_an_fp32_median_of_zero_cannot_fool_the_ratio_row(reports):
    base, tmp_path = reports
    old = _timed(json.loads(json.dumps(base)), 1.0, fp32_p50=0.0)
    _compare(tmp_path, old, _timed(json.loads(json.dumps(base)), 1.0), 2, "latency.fp32.1.p50_ms is 0.0, outside (0, 3.6e+06]")


@pytest.mark.parametrize("key,value", [("int8_top1", 1.5), ("int8_top1", -0.25), ("top1_agreement", 7), ("fp32_top1", 1e308 * 10)])
def test_an_accuracy_that_is_not_a_fraction_is_refused(reports, key, value):
    base, tmp_path = reports
    old = json.loads(json.dumps(base))
    old["accuracy"][key] = value
    _compare(tmp_path, old, json.loads(json.dumps(base)), 2, f"accuracy.{key} is {value!r}, outside [0, 1]")


def test_a_batch_size_that_is_not_one_is_refused(reports):
    base, tmp_path = reports
    old = _timed(json.loads(json.dumps(base)), 1.0, batch="1")
    old["latency"]["int8"]["many"] = _stats("1", 1.0)
    _compare(tmp_path, old, _timed(json.loads(json.dumps(base)), 1.0), 2, "latency.int8 has batch 'many', not a batch size")


@pytest.mark.parametrize("value", [1.0, -0.5, 40])
def test_a_paired_confidence_out_of_range_is_refused(reports, value):
    base, tmp_path = reports
    new = json.loads(json.dumps(base))
    new["thresholds"]["drop_confidence"] = value
    _compare(tmp_path, json.loads(json.dumps(base)), new, 2, f"thresholds.drop_confidence is {value!r}, outside [0, 0.999999]")


# ------------------------------------------------------------------ inputs that preprocessing makes one value

@pytest.mark.parametrize("flags,says", [
    (["--std", "2e5"], "spread"),  # within the flag's bound, yet every image is nearly 0
    (["--mean", "9e5", "--std", "0.5"], "spread"),  # one large value float32 cannot tell images apart around
    (["--std", "1e9"], "--std 1e+09 is outside (0, 1e+06]"),
    (["--mean", "-5e7"], "--mean -5e+07 is outside [-1e+06, 1e+06]"),
])
def test_inputs_that_preprocessing_makes_one_value_are_refused_naming_mean_std(tmp_path, flags, says):
    out, cache = tmp_path / "b", tmp_path.parent / f"{tmp_path.name}-cache"
    before = snapshot(tmp_path)
    run = cli("build", "-q", DIGITS, "-t", "onnx", "--calib", CALIB_DIR, "-o", out, "--cache-dir", cache, "--no-latency", *flags)
    line = assert_one_line(run, 2, says, "--mean/--std")
    assert not out.exists() and snapshot(tmp_path) == before and not debris(tmp_path)
    assert not list(cache.rglob("*.npz")) if cache.exists() else True, line  # no statistics were stored for it


# ------------------------------------------------------------------ a class count no bundle can hold

@pytest.fixture(scope="module")
def fp32(tmp_path_factory) -> Path:
    return export_fp32(DIGITS, tmp_path_factory.mktemp("classes") / "m.onnx")


@pytest.mark.parametrize("how,count", [("declared output", 1_000_000), ("declared output", 250_001), ("spec metadata", 2_000_000),
                                       ("spec metadata", 0)])
def test_a_class_count_runtime_load_would_refuse_is_refused_when_the_model_is_read(fp32, tmp_path, how, count):
    model = onnx.load(str(fp32))
    if how == "declared output":
        del model.metadata_props[:]  # another tool's graph: the class count comes from its output shape
        model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = count
    else:
        prop = next(p for p in model.metadata_props if p.key == "vitedge.spec")
        spec = json.loads(prop.value)
        spec["num_classes"] = count
        prop.value = json.dumps(spec)
    path = tmp_path / "m" / "m.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path))
    before = snapshot(tmp_path)
    run = cli("build", "-q", path, "-t", "onnx", "--calib", CALIB_DIR, "-o", tmp_path / "b", "--no-latency")
    assert_one_line(run, 2, f"{path}: 'model.spec.num_classes' is {count}, expected an integer in [1, 100000]")
    assert snapshot(tmp_path) == before and not (tmp_path / "b").exists()
