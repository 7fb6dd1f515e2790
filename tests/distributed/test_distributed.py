"""`vitedge.distributed`: Ray stays out of the core import path; a sharded `validate` on a real
local Ray cluster (2 CPUs) gives the single-process report; dead workers are retried or reported;
a worker that sees other files than the driver refuses to run.

One Ray session for the module (each start costs seconds); no timing is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, VAL_DIR
from helpers.cli import run_cli
from helpers.documents import mismatches
from helpers.profiles import untimed_targets, untimed_targets_env

LENIENT = ("--max-top1-drop", 100, "--min-agreement", 0, "--min-decisive-agreement", 0)  # the gate cannot fail on accuracy: these tests are about plumbing

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def ray_cluster(untimed_targets_dir):
    """A real local Ray cluster of 2 CPUs; the workers import this checkout and the tests folder. The module's builds,
    here, in the Ray workers and in the child without Ray, skip the INT8-vs-FP32 timing (tests/conftest.py:
    no_int8_timing): what is pinned here is the plumbing."""
    # this file's folder too: Ray workers import the functions defined here by this module's name
    path = os.pathsep.join([str(REPO), str(REPO / "tests"), str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")])
    with untimed_targets(untimed_targets_dir):
        try:  # shut down on every path, a failed or interrupted init included (a live raylet outlives pytest)
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": path, **untimed_targets_env(untimed_targets_dir)}})
            yield ray
        finally:
            ray.shutdown()


def test_core_imports_never_load_ray():
    code = ("import sys, vitedge, vitedge.runtime, vitedge.cli.entry, vitedge.cli.commands.validate_cmd, vitedge.cli.commands.build_matrix_cmd, "
            "vitedge.distributed.ray_validate, vitedge.app.matrix.run, vitedge.app.matrix.report, "
            "vitedge.distributed.cluster; bad = [m for m in ('ray',) if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shards_are_batch_aligned_and_cover_every_item():
    from vitedge.distributed.sharding import shard_ranges

    for items, shards in [(397, 2), (397, 4), (33, 4), (31, 3), (64, 2), (1000, 7)]:
        parts = shard_ranges(items, shards)
        assert parts[0].start == 0 and parts[-1].stop == items
        assert all(a.stop == b.start for a, b in zip(parts, parts[1:]))
        assert all(len(p) > 0 and p.start % 32 == 0 for p in parts)
        assert len(parts) == min(shards, -(-items // 32))


def test_sharded_validate_matches_single_process(ray_cluster, bundle, capsys, tmp_path):
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    code, out, err = run_cli(capsys, "validate", bundle, "--data", VAL_DIR, "--no-latency", "--no-sensitivity",
                             "--report-dir", single, *LENIENT)
    assert code == 0, err
    # latency is measured (the plumbing under test), but --min-speedup 0: 0.05 s of timing on a shared machine is noise
    code, out, err = run_cli(capsys, "validate", bundle, "--data", VAL_DIR, "--workers", 2, "--latency-seconds", 0.05,
                             "--no-sensitivity", "--report-dir", sharded, "--min-speedup", 0, *LENIENT)
    assert code == 0, err
    a = json.loads((single / "validation.json").read_text())
    b = json.loads((sharded / "validation.json").read_text())
    from vitedge.validation.report import check_validation_document

    assert check_validation_document(b) == []
    ref_a, ref_b = a["data"].pop("reference"), b["data"].pop("reference")  # FP32: cached or not; sharded: on the workers
    assert ref_b["cache"] == "off" and ref_b["batch"] == ref_a["batch"]
    int8_a, int8_b = a["data"].pop("int8_outputs"), b["data"].pop("int8_outputs")  # INT8 likewise
    assert int8_b["cache"] == "off" and int8_b["batch"] == int8_a["batch"]
    # the preprocessing probe runs on every labelled build whose rows pass: sharded, on the driver, uncached
    probe_a, probe_b = a["data"].pop("probe_outputs"), b["data"].pop("probe_outputs")
    assert sorted(probe_a) == sorted(probe_b) == ["+0.25", "-0.25"] and {v["cache"] for v in probe_b.values()} == {"off"}
    assert "fp32_preprocessing_probe" in a["accuracy"] and "fp32_preprocessing_probe" in b["accuracy"]  # values: mismatches() below
    assert a["data"] == b["data"] and b["data"]["items"] == 397
    # numbers within float round-off of the reduction order, strings (output_kind) and flags exactly
    assert mismatches(b["accuracy"], a["accuracy"], rel=1e-6, abs_tol=1e-9, where="accuracy") == []
    for key in ("fp32_top1", "int8_top1", "fp32_top5", "int8_top5", "top1_agreement", "samples"):
        assert b["accuracy"][key] == a["accuracy"][key], key  # counts: exact
    rows = {r["name"]: r for r in b["gate"]}
    for r in a["gate"]:
        if r["name"] in ("max_top1_drop", "min_agreement"):
            assert rows[r["name"]]["value"] == r["value"] and rows[r["name"]]["status"] == r["status"]
    assert sorted(p.name for p in single.iterdir() if p.suffix != ".png") == sorted(p.name for p in sharded.iterdir() if p.suffix != ".png")
    dist = b["distributed"]
    batch = ref_a["batch"]  # the single-process batch (the profile's, vitedge.validation.accuracy.eval_batch): shards start on it
    blocks = -(-397 // batch)
    assert dist["shards"] == 2 and [s["start"] for s in dist["shard_nodes"]] == [0, -(-blocks // 2) * batch]
    assert dist["torch_on_workers"] is False
    assert b["latency"]["measured"] and b["latency"]["measured_on"].startswith(dist["latency_node"]["host"])
    assert b["latency"]["device"]["kind"] == "cpu" and b["latency"]["device"]["cpus"] >= 1  # the timing worker's CPU
    assert "Measured on" in (sharded / "summary.md").read_text()


def _die_on_first_attempt(marker: str) -> str:
    if not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        os._exit(1)  # the worker process dies, as if killed
    return "second attempt"


def _always_die(_payload) -> None:
    os._exit(1)


def test_dead_worker_is_retried_then_reported(ray_cluster, tmp_path):
    from vitedge.distributed.cluster import run_tasks

    (retried,) = run_tasks(_die_on_first_attempt, [str(tmp_path / "died-once")], max_retries=1)
    assert retried.ok and retried.value == "second attempt"
    assert (tmp_path / "died-once").read_text() != retried.node["pid"]  # another process finished it
    (dead,) = run_tasks(_always_die, [None], max_retries=1)
    assert not dead.ok and "died" in dead.error and dead.value is None


def test_worker_refuses_files_the_driver_did_not_see(ray_cluster, bundle):
    from vitedge.datasources.sources import open_source
    from vitedge.distributed.cluster import run_tasks
    from vitedge.distributed.contract import BundleAddress, DataAddress
    from vitedge.distributed.shard_tasks import ShardTask, run_shard
    from vitedge.distributed.sharding import Shard
    from vitedge.core.errors import BundleError, DataError
    from vitedge.bundle.manifest import read_manifest

    spec = read_manifest(bundle).spec
    data = DataAddress.of(open_source(VAL_DIR, spec.preprocess, limit=40, seed=0, class_names=spec.class_names), 40, 0)
    good = BundleAddress.of(bundle)
    other_bundle = ShardTask(BundleAddress(good.path, "0" * 64), data, Shard(0, 0, 32), 1)
    other_data = ShardTask(good, DataAddress(data.path, 40, 1, data.data_hash, 40), Shard(0, 0, 32), 1)  # seed 1: other items
    fine = ShardTask(good, data, Shard(0, 0, 32), 1)
    a, b, c = run_tasks(run_shard, [other_bundle, other_data, fine], max_retries=0)
    assert isinstance(a.cause, BundleError) and "refuses to run" in str(a.cause)
    assert isinstance(b.cause, DataError) and "refuses to run" in str(b.cause)
    assert c.ok and c.value.reference.shape[0] == 32 and not c.value.torch_loaded


def test_without_ray_the_flag_says_how_to_install(bundle):
    code = ("import sys; sys.modules['ray'] = None; from vitedge.cli.entry import main; "
            f"main(['validate', {str(bundle)!r}, '--data', {str(VAL_DIR)!r}, '--workers', '2', '--no-latency'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 2, proc.stderr
    assert "vitedge[ray]" in proc.stderr and "Traceback" not in proc.stderr


def _matrix(tmp_path: Path, extra_build: str = "", latency: bool = False) -> Path:
    text = f"""
targets = ["onnx", "intel-cpu"]
out = "out"

[build]
calib_size = 32
latency = {str(latency).lower()}
fallback = false
cache_dir = "cache"
{extra_build}

[[models]]
name = "digits"
path = "{REPO / 'examples' / 'digits_vit.pt'}"
calib = "{REPO / 'calibration' / 'digits' / 'calib'}"
val = "{VAL_DIR}"
"""
    path = tmp_path / "matrix.toml"
    path.write_text(text)
    return path


def test_build_matrix_on_ray_shares_calibration_names_failures_and_resumes(ray_cluster, capsys, tmp_path):
    import xml.etree.ElementTree as ET

    # a gate no build can meet, whatever the quantizer's accuracy: no ViT runs a batch in 1 microsecond
    matrix = _matrix(tmp_path, "max_p99_ms = 0.001", latency=True)
    code, out, err = run_cli(capsys, "build-matrix", matrix, "--workers", 2)
    assert code == 1, err
    assert "digits/onnx" in err and "digits/intel-cpu" in err and "failed the gate" in err
    doc = json.loads((tmp_path / "out" / "matrix.json").read_text())
    rows = {r["label"]: r for r in doc["rows"]}
    assert [rows["digits/onnx"]["calibration"], rows["digits/intel-cpu"]["calibration"]] == ["computed", "cache"]
    assert all(r["status"] == "fail" and not r["resumed"] for r in rows.values())
    assert doc["engine"].startswith("ray") and doc["failed"] == ["digits/onnx", "digits/intel-cpu"]
    suite = ET.parse(tmp_path / "out" / "matrix-junit.xml").getroot().find("testsuite")
    assert suite.get("tests") == "2" and suite.get("failures") == "2"
    for label in rows:
        assert (tmp_path / "out" / label / "manifest.json").is_file()
    # a re-run resumes from the complete bundles: nothing is rebuilt, the verdict is the same
    code, out, err = run_cli(capsys, "build-matrix", matrix, "--workers", 2)
    assert code == 1
    again = json.loads((tmp_path / "out" / "matrix.json").read_text())
    assert all(r["resumed"] for r in again["rows"])
    # without Ray: the same matrix, sequentially, and it says so. In this process with `import ray` made to fail, as a
    # child did with the same `sys.modules['ray'] = None` (test_without_ray_the_flag_says_how_to_install keeps a child
    # for the exit status): the child imported torch and timm again to resume two complete rows
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(sys.modules, "ray", None)
        code, out, err = run_cli(capsys, "build-matrix", matrix)
    assert code == 1, err
    assert "Ray is not installed" in out and "sequentially" in out
    assert json.loads((tmp_path / "out" / "matrix.json").read_text())["engine"].startswith("sequential")


def test_build_matrix_bad_file_is_one_line(capsys, tmp_path):
    matrix = _matrix(tmp_path, "colour = 'red'")
    code, out, err = run_cli(capsys, "build-matrix", matrix, "--sequential")
    assert code == 2 and "unknown key 'colour' in [build]" in err and "Traceback" not in err
