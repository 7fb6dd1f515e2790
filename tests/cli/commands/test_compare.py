"""`vitedge compare OLD.json NEW.json`: a regression gate between two validation reports.

NEW is a real report (`vitedge validate` on the bundled example, latency measured); OLD
is that report edited into a plausible earlier one.
"""

from __future__ import annotations

import copy
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
from conftest import VAL_DIR
from helpers.cli import run_cli


@pytest.fixture(scope="module")
def new_report(built_bundle, tmp_path_factory) -> Path:
    from vitedge.cli.entry import main

    work = tmp_path_factory.mktemp("compare")
    bundle = work / "bundle"
    shutil.copytree(built_bundle, bundle)
    with pytest.raises(SystemExit) as exc:
        main(["validate", str(bundle), "--data", str(VAL_DIR), "--data-size", "32", "--no-sensitivity", "--latency-seconds", "0.05",
              "--max-top1-drop", "100", "--min-agreement", "0", "--min-decisive-agreement", "0", "--min-speedup", "0", "-q"])
    assert exc.value.code in (0, None)
    report = bundle / "report" / "validation.json"
    doc = json.loads(report.read_text())
    _settle(doc)
    report.write_text(json.dumps(doc))
    return report


# Milliseconds per batch size and side that stand for a quiet machine. The validate run above really timed the
# bundle, but for 0.05 s: whether its medians settled, and what they were, depends on the machine's load and CPU
# kind. Every test here reads timings and "stable" flags through this fixed form, and a test that wants an
# unsettled or slower median (or a busy machine's core wait) edits it in, so no machine can change a verdict.
SETTLED_MS = {"int8": {"1": 3.0, "8": 20.0}, "fp32": {"1": 6.0, "8": 45.0}}


def _settle(doc) -> None:
    for side, per_batch in SETTLED_MS.items():
        for b, stats in doc["latency"][side].items():
            p50 = per_batch[b]
            stats.update(p50_ms=p50, p90_ms=1.1 * p50, p99_ms=1.2 * p50, mean_ms=1.05 * p50,
                         throughput=int(b) * 1000.0 / p50, stable=True, core_wait=0.01)
    doc["latency"]["speedup"] = {b: SETTLED_MS["fp32"][b] / SETTLED_MS["int8"][b] for b in doc["latency"]["speedup"]}


def _old(new_report: Path, tmp_path: Path, edit) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    doc = json.loads(new_report.read_text())
    old = copy.deepcopy(doc)
    old["created"] = "2026-01-01T00:00:00+00:00"
    edit(old)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    return path


def _scale_latency(doc, factor):
    for stats in doc["latency"]["int8"].values():
        for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms"):
            stats[k] *= factor


def test_no_regression_passes(new_report, tmp_path, capsys):
    old = _old(new_report, tmp_path, lambda d: _scale_latency(d, 1.02))  # the old run was a little slower
    code, out, err = run_cli(capsys, "compare", old, new_report, "--report-dir", tmp_path / "r")
    assert code == 0, err
    assert "PASS" in out
    doc = json.loads((tmp_path / "r" / "compare.json").read_text())
    assert doc["schema"] == "vitedge.comparison/1" and doc["passed"] is True
    assert [r["status"] for r in doc["gate"]] == ["pass", "pass", "pass", "pass"]


def test_latency_regression_fails_naming_the_rows(new_report, tmp_path, capsys):
    old = _old(new_report, tmp_path, lambda d: _scale_latency(d, 0.5))  # NEW is twice as slow as OLD
    code, out, err = run_cli(capsys, "compare", old, new_report, "--max-latency-regression", "10%", "--report-dir", tmp_path / "r")
    assert code == 1
    line = err.strip().splitlines()[-1]
    assert len(err.strip().splitlines()) == 1
    assert "INT8 p50 at batch 1" in line and "INT8 p50 at batch 8" in line and "+100.0%" in line and "over by" in line
    doc = json.loads((tmp_path / "r" / "compare.json").read_text())
    rows = {r["name"]: r for r in doc["gate"]}
    assert rows["p50_regression_b1"]["status"] == "fail" and rows["p50_regression_b1"]["value"] == pytest.approx(100.0)
    assert rows["top1_regression"]["status"] == "pass"
    root = ET.parse(tmp_path / "r" / "compare-junit.xml").getroot()
    cases = root.find("testsuite").findall("testcase")
    assert len(cases) == 4 and sum(c.find("failure") is not None for c in cases) == 2
    assert "FAIL" in (tmp_path / "r" / "compare.md").read_text()


def test_accuracy_regression_fails(new_report, tmp_path, capsys):
    def better_before(d):
        d["accuracy"]["int8_top1"] += 0.01  # one point higher before
    old = _old(new_report, tmp_path, better_before)
    code, _, err = run_cli(capsys, "compare", old, new_report, "--max-accuracy-regression", "0.2", "--max-latency-regression", "1000%")
    assert code == 1
    assert "top-1" in err and "lost 1.000 points" in err


def test_fraction_and_percent_mean_the_same(new_report, tmp_path, capsys):
    old = _old(new_report, tmp_path, lambda d: _scale_latency(d, 1 / 1.05))  # NEW 5% slower
    assert run_cli(capsys, "compare", old, new_report, "--max-latency-regression", "10%")[0] == 0
    assert run_cli(capsys, "compare", old, new_report, "--max-latency-regression", "0.1")[0] == 0
    assert run_cli(capsys, "compare", old, new_report, "--max-latency-regression", "0.01")[0] == 1
    code, _, err = run_cli(capsys, "compare", old, new_report, "--max-latency-regression", "10")
    assert code == 2 and "ambiguous" in err


@pytest.mark.parametrize("edit, expect", [
    (lambda d: d.update(schema="vitedge.validation/2"), "major version 1"),
    (lambda d: d.update(schema="something.else/1"), "is not a vitedge validation report"),
    (lambda d: d["target"].update(name="intel-cpu"), "different targets"),
    (lambda d: d["model"].update(source="other.pt"), "different models"),
    (lambda d: d.pop("gate"), "gate is missing"),
])
def test_refuses_incomparable_reports(new_report, tmp_path, capsys, edit, expect):
    old = _old(new_report, tmp_path, edit)
    code, _, err = run_cli(capsys, "compare", old, new_report, "--report-dir", tmp_path / "r")
    assert code == 2 and expect in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_allow_mismatch_and_data_warning(new_report, tmp_path, capsys):
    def other(d):
        d["target"]["name"] = "intel-cpu"
        d["data"]["data_hash"] = "0" * 64
    old = _old(new_report, tmp_path, other)
    code, _, err = run_cli(capsys, "compare", old, new_report, "--allow-mismatch")
    assert code == 0
    assert "different targets" in err and "different data" in err


def test_missing_report_is_usage_error(new_report, tmp_path, capsys):
    code, _, err = run_cli(capsys, "compare", tmp_path / "nope.json", new_report)
    assert code == 2 and "does not exist" in err


def test_the_report_records_the_cpu_that_timed_it(new_report):
    from vitedge.core.cpu import read_cpu, usable_cpus

    device = json.loads(new_report.read_text())["latency"]["device"]
    assert device == {"kind": "cpu", "model": read_cpu().model or "unknown", "isa": read_cpu().isa, "cpus": usable_cpus()}
    assert f"Timed on {device['model']} ({device['isa']}, {device['cpus']} CPU(s))." in (new_report.parent / "summary.md").read_text()


def _timed_elsewhere(d, factor):
    """OLD timed on another CPU: every figure (FP32 and INT8) `factor` times the new one's."""
    d["latency"]["device"] = {"kind": "cpu", "model": "Intel(R) Xeon(R) Platinum 8370C CPU @ 2.80GHz", "isa": "avx512-vnni", "cpus": 2}
    for side in ("fp32", "int8"):
        for stats in d["latency"][side].values():
            for k in ("p50_ms", "p90_ms", "p99_ms", "mean_ms"):
                stats[k] *= factor


def test_reports_timed_on_other_cpus_compare_the_int8_fp32_ratio(new_report, tmp_path, capsys):
    """The same build timed on a CPU half as fast is not a regression: its INT8/FP32 ratio did not move; p50 would
    have said +100 %. A slower INT8 relative to its own FP32 still fails."""
    old = _old(new_report, tmp_path, lambda d: _timed_elsewhere(d, 0.5))
    code, out, err = run_cli(capsys, "compare", old, new_report, "--report-dir", tmp_path / "r")
    assert code == 0, err
    assert "different CPUs" in err and "Xeon" in err and "INT8 p50 is not compared" in err
    doc = json.loads((tmp_path / "r" / "compare.json").read_text())
    rows = {r["name"]: r for r in doc["gate"]}
    assert not any(n.startswith("p50_regression") for n in rows)
    assert rows["int8_fp32_ratio_regression_b1"]["status"] == "pass"
    assert rows["int8_fp32_ratio_regression_b1"]["value"] == pytest.approx(0.0, abs=1e-9)

    def int8_worse(d):
        _timed_elsewhere(d, 0.5)
        _scale_latency(d, 1 / 1.5)  # OLD's INT8 was 1.5x faster against its own FP32 than NEW's
    old = _old(new_report, tmp_path, int8_worse)
    code, _, err = run_cli(capsys, "compare", old, new_report, "--report-dir", tmp_path / "r2")
    assert code == 1, err
    line = err.strip().splitlines()[-1]
    assert "INT8/FP32 time at batch 1" in line and "+50.0%" in line and "different CPUs" in line
    md = (tmp_path / "r2" / "compare.md").read_text()
    assert "INT8/FP32" in md and "old timed on Intel(R) Xeon(R) Platinum 8370C" in md and "new timed on " in md
    assert json.loads((tmp_path / "r2" / "compare.json").read_text())["old"]["timed_on"]["isa"] == "avx512-vnni"


def test_report_without_a_device_is_compared_by_p50_with_a_warning(new_report, tmp_path, capsys):
    old = _old(new_report, tmp_path, lambda d: d["latency"].pop("device"))
    code, _, err = run_cli(capsys, "compare", old, new_report, "--report-dir", tmp_path / "r")
    assert code == 0, err
    assert "does not record the device" in err
    rows = {r["name"] for r in json.loads((tmp_path / "r" / "compare.json").read_text())["gate"]}
    assert "p50_regression_b1" in rows


def test_two_jetsons_are_told_apart_by_their_modules(new_report, tmp_path, capsys):
    def on(module, gpu="Orin"):
        return {"kind": "gpu", "model": module, "gpu": gpu, "compute_capability": "8.7"}
    new = _old(new_report, tmp_path / "n", lambda d: d["latency"].update(device=on("NVIDIA Jetson Orin NX 16GB")))
    old = _old(new_report, tmp_path, lambda d: d["latency"].update(device=on("NVIDIA Jetson Orin Nano 8GB")))
    code, _, err = run_cli(capsys, "compare", old, new)
    assert code == 0 and "different GPUs" in err and "Orin Nano 8GB" in err and "Orin NX 16GB" in err, err
    same = _old(new_report, tmp_path / "s", lambda d: d["latency"].update(device=on("NVIDIA Jetson Orin NX 16GB")))
    code, out, err = run_cli(capsys, "compare", same, new)
    assert code == 0 and "different" not in err and "p50_regression_b1" in out, err


def _with_images_lost(d, k, key="int8_correct", figure="int8_top1"):
    """The report with ``k`` more images wrong (the first ``k`` it got right), its bits and its figure agreeing."""
    from vitedge.validation import per_sample

    acc = d["accuracy"]
    bits = per_sample.bits(acc["per_sample"], key)
    right = np.flatnonzero(bits)[:k]
    assert len(right) == k
    bits[right] = False
    acc["per_sample"][key] = per_sample.pack(bits)
    acc[figure] = float(bits.mean())


def _labelled_report(new_report, tmp_path, edit=lambda d: None) -> Path:
    path = _old(new_report, tmp_path, edit)
    assert json.loads(path.read_text())["accuracy"]["per_sample"]["items"] == 32
    return path


def test_one_image_is_noise_and_ten_are_a_real_loss_when_paired(new_report, tmp_path, capsys):
    """Same data, per-image bits in both: one image flipped (3.1 points on 32 images, far over the 0.2 limit) is not
    shown to be a loss; ten are. Without the pairing the one image fails, as the point figure says."""
    base = _labelled_report(new_report, tmp_path / "old")
    one = _labelled_report(new_report, tmp_path / "one", lambda d: _with_images_lost(d, 1))
    code, out, err = run_cli(capsys, "compare", base, one, "--report-dir", tmp_path / "r1", "--max-latency-regression", "1000%")
    assert code == 0, err
    row = {r["name"]: r for r in json.loads((tmp_path / "r1" / "compare.json").read_text())["gate"]}["top1_regression"]
    assert row["status"] == "pass" and "within noise" in row["detail"] and "1 lost, 0 gained" in row["detail"]

    ten = _labelled_report(new_report, tmp_path / "ten", lambda d: _with_images_lost(d, 10))
    code, _, err = run_cli(capsys, "compare", base, ten, "--max-latency-regression", "1000%")
    assert code == 1 and "a real loss" in err and "10 lost, 0 gained" in err, err

    def other_data(d):
        _with_images_lost(d, 1)
        d["data"]["data_hash"] = "f" * 64
    elsewhere = _labelled_report(new_report, tmp_path / "else", other_data)
    code, _, err = run_cli(capsys, "compare", base, elsewhere, "--max-latency-regression", "1000%")
    assert code == 1 and "unpaired: the reports are of different data" in err, err


def test_agreement_is_paired_too_and_drop_confidence_0_turns_pairing_off(new_report, tmp_path, capsys):
    base = _labelled_report(new_report, tmp_path / "old")
    flipped = _labelled_report(new_report, tmp_path / "one",
                               lambda d: _with_images_lost(d, 1, key="int8_agrees", figure="top1_agreement"))
    code, out, err = run_cli(capsys, "compare", base, flipped, "--max-latency-regression", "1000%")
    assert code == 0 and "within noise" in out, out + err

    def strict(d):
        _with_images_lost(d, 1, key="int8_agrees", figure="top1_agreement")
        d["thresholds"]["drop_confidence"] = 0.0  # the target asked for point figures
    code, _, err = run_cli(capsys, "compare", base, _labelled_report(new_report, tmp_path / "strict", strict),
                           "--max-latency-regression", "1000%")
    assert code == 1 and "agreement with FP32" in err and "unpaired: the new report's drop_confidence is 0" in err, err


def test_bits_that_do_not_add_up_to_the_figure_are_not_paired(new_report, tmp_path, capsys):
    def edited(d):
        d["accuracy"]["int8_top1"] -= 0.1  # the figure edited, the bits not
    code, _, err = run_cli(capsys, "compare", _labelled_report(new_report, tmp_path / "old"),
                           _labelled_report(new_report, tmp_path / "new", edited), "--max-latency-regression", "1000%")
    assert code == 1 and "do not add up to the reports' figures" in err, err


@pytest.mark.parametrize("kind", ["fifo", "too-large", "folder"])
def test_a_report_that_is_not_a_bounded_regular_file_is_refused_without_reading_it(new_report, tmp_path, capsys, kind):
    """A report may come from another job's artifacts: a FIFO would block compare forever, a huge file fill memory."""
    import os

    bad = tmp_path / "old.json"
    if kind == "fifo":
        os.mkfifo(bad)
    elif kind == "too-large":
        with open(bad, "wb") as f:
            f.truncate(65 << 20)  # sparse: 65 MB of nothing, over the bound
    else:
        bad.mkdir()
    code, _, err = run_cli(capsys, "compare", bad, new_report)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert {"fifo": "FIFO", "too-large": "MB bound", "folder": "a folder"}[kind] in err, err


def test_a_row_whose_median_never_settled_says_so(new_report, tmp_path, capsys):
    def busy(d):
        _scale_latency(d, 0.5)  # NEW twice as slow: fails
        d["latency"]["int8"]["1"]["stable"] = False
    code, _, err = run_cli(capsys, "compare", _old(new_report, tmp_path, busy), new_report)
    line = err.strip().splitlines()[-1]
    assert code == 1 and "INT8 p50 at batch 1" in line and "did not settle in" in line and "old.json" in line, line
    assert line.count("did not settle") == 1  # batch 8 settled


def test_a_row_timed_on_a_busy_machine_says_so(new_report, tmp_path, capsys):
    """A report whose timed threads waited for a core past the busy line (core_wait over 0.1 s per second run): the
    row says which report, and the verdict stays the figures' own."""
    def busy(d):
        _scale_latency(d, 0.5)  # NEW twice as slow: fails
        d["latency"]["int8"]["1"]["core_wait"] = 3.2
        d["latency"]["int8"]["8"]["core_wait"] = 0.08  # under the busy line: nothing to say
    code, _, err = run_cli(capsys, "compare", _old(new_report, tmp_path, busy), new_report)
    lines = [l for l in err.strip().splitlines() if "INT8 p50 at batch" in l]
    b1 = next(l for l in lines if "batch 1" in l)
    assert code == 1 and "old.json was timed on a busy machine" in b1 and "re-run it before trusting this row" in b1, b1
    assert all("busy machine" not in l for l in lines if "batch 1" not in l), lines


def test_a_bundle_folder_stands_for_its_report(new_report, tmp_path, capsys):
    bundle = new_report.parent.parent  # BUNDLE/report/validation.json
    code, out, err = run_cli(capsys, "compare", bundle, new_report, "--report-dir", tmp_path / "r")
    assert code == 0, err
    assert json.loads((tmp_path / "r" / "compare.json").read_text())["old"]["path"] == str(bundle / "report" / "validation.json")


def test_an_unsettled_fp32_median_does_not_taint_the_p50_row(new_report, tmp_path, capsys):
    """The p50 row reads INT8 only: FP32's median that did not settle is no reason to doubt it."""
    def busy_fp32(d):
        _scale_latency(d, 0.5)
        d["latency"]["fp32"]["1"]["stable"] = False
    code, _, err = run_cli(capsys, "compare", _old(new_report, tmp_path, busy_fp32), new_report)
    assert code == 1 and "did not settle" not in err, err
