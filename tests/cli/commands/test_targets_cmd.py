"""`vitedge targets`: one row per target in 80 columns, each install hint once, and --json."""

from __future__ import annotations

import json

from helpers.cli import run_vitedge

from vitedge.targets.families import list_families
from vitedge.targets.profiles import list_profiles


def test_targets_fit_80_columns_one_row_each_hints_once():
    code, text = run_vitedge(["targets"])
    assert code == 0, text
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    names = [p.stem for p in list_profiles()] + [p.stem for p in list_families()]
    for name in names:
        assert sum(1 for line in lines if line.split(" ", 1)[0] == name) == 1, name
    hints = [line for line in lines if line.startswith("[")]
    assert len(hints) == len({h.split("]", 1)[1] for h in hints})  # every note once
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        assert text.count("pip install 'vitedge[tensorrt]'") == 1  # not in every TensorRT row
        assert sum(1 for line in lines if "bundle only [1]" in line) == 4


def test_targets_json_for_scripts():
    code, text = run_vitedge(["targets", "--json"])
    assert code == 0, text
    doc = json.loads(text)
    assert doc["schema"] == "vitedge.targets/1"
    by_name = {t["name"]: t for t in doc["targets"]}
    assert set(by_name) == {p.stem for p in list_profiles()}
    assert by_name["onnx"]["status"] == "ready" and by_name["onnx"]["backend"] == "onnxruntime"
    assert by_name["jetson-orin"]["gate"]["min_agreement"] == 0.99 and by_name["jetson-orin"]["batch_sizes"] == [1, 4, 8]
    fams = {f["name"]: f for f in doc["families"]}
    assert fams["jetson"]["members"] == ["jetson-orin", "jetson-orin-nx", "jetson-orin-nano"]
    assert fams["nvidia-gpu"]["members"] == ["desktop-gpu"]
