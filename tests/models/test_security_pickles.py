"""No pickle in a model file runs code without --trust-pickle: .pt2 archives, TorchScript archives and
Hugging Face .bin weights, each with a payload that would create a marker file."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from vitedge.core.errors import UnsafePickleError
from vitedge.models.archive_safety import pickle_globals
from vitedge.models.formats import read_model_file


class _Payload:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _evil(marker: Path) -> bytes:
    return pickle.dumps(_Payload(marker), protocol=2)


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.l(x)


def _rewrite(src: Path, dst: Path, change) -> Path:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            zout.writestr(info, change(info.filename, zin.read(info.filename)))
    return dst


@pytest.fixture(scope="module")
def pt2(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pt2") / "good.pt2"
    torch.export.save(torch.export.export(_Tiny(), (torch.randn(1, 4),)), str(path))
    return path


@pytest.fixture(scope="module")
def torchscript(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ts") / "good.pt"
    torch.jit.trace(_Tiny(), torch.randn(1, 4)).save(str(path))
    return path


def _sample_inputs_payload(pt2: Path, dst: Path, marker: Path) -> Path:
    return _rewrite(pt2, dst, lambda n, d: _evil(marker) if "/sample_inputs/" in n else d)


def _pickled_weight_payload(pt2: Path, dst: Path, marker: Path) -> Path:
    def change(name, data):
        if name.endswith("model_weights_config.json"):
            cfg = json.loads(data)
            entry = cfg["config"]["l.weight"]
            entry["use_pickle"] = True
            self_path = entry["path_name"]
            change.target = self_path
            return json.dumps(cfg).encode()
        return data

    step = _rewrite(pt2, dst.with_suffix(".tmp"), change)
    out = _rewrite(step, dst, lambda n, d: _evil(marker) if n.endswith("/weights/" + change.target) else d)
    step.unlink()
    return out


@pytest.mark.parametrize("placement", [_sample_inputs_payload, _pickled_weight_payload], ids=["sample-inputs", "pickled-weight"])
def test_pt2_payload_is_refused_and_never_runs(placement, pt2, tmp_path):
    marker = tmp_path / "MARKER"
    evil = placement(pt2, tmp_path / "evil.pt2", marker)
    with pytest.raises(UnsafePickleError, match="--trust-pickle"):
        read_model_file(evil)
    assert not marker.exists()
    assert read_model_file(pt2).kind == "exported_program"  # a clean archive still loads


@pytest.mark.parametrize("member", ["data.pkl", "constants.pkl"])
def test_torchscript_pickle_payload_is_refused(member, torchscript, tmp_path):
    marker = tmp_path / "MARKER"
    evil = _rewrite(torchscript, tmp_path / "evil.pt", lambda n, d: _evil(marker) if n.endswith("/" + member) else d)
    with pytest.raises(UnsafePickleError, match="posix.system|os.system"):
        read_model_file(evil)
    assert not marker.exists()
    assert read_model_file(torchscript).kind == "torchscript"


def test_torchscript_setstate_needs_trust(tmp_path):
    class WithState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.k = 1

        def forward(self, x):
            return x * self.k

        @torch.jit.export
        def __getstate__(self):
            return (self.k, self.training)

        @torch.jit.export
        def __setstate__(self, state: tuple[int, bool]):
            self.k = state[0]
            self.training = state[1]

    path = tmp_path / "stateful.pt"
    torch.jit.script(WithState()).save(str(path))
    with pytest.raises(UnsafePickleError, match="__setstate__"):
        read_model_file(path)
    assert read_model_file(path, trust_pickle=True).kind == "torchscript"


def test_huggingface_bin_payload_is_refused(tmp_path):
    transformers = pytest.importorskip("transformers")
    marker = tmp_path / "MARKER"
    folder = tmp_path / "hf"
    transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=1, num_attention_heads=3,
                           intermediate_size=96, num_labels=3, architectures=["ViTForImageClassification"]).save_pretrained(folder)
    (folder / "pytorch_model.bin").write_bytes(_evil(marker))
    from vitedge.models.intake import load_model

    with pytest.raises(UnsafePickleError, match="pickled Python objects"):
        load_model(folder)
    assert not marker.exists()
    single = tmp_path / "weights.bin"  # a lone .bin checkpoint
    single.write_bytes(_evil(marker))
    with pytest.raises(UnsafePickleError, match="--trust-pickle"):
        read_model_file(single)
    assert not marker.exists()


def test_pickle_globals_reads_memoised_stack_globals():
    data = pickle.dumps([_Payload(Path("/nonexistent")), _Payload(Path("/nonexistent"))], protocol=4)
    assert {"posix.system", "os.system"} & pickle_globals(data)
    assert pickle_globals(pickle.dumps({"a": [1, 2.0, "x"]}, protocol=4)) == set()


def test_cli_inspect_refuses_evil_pt2_in_one_line(pt2, tmp_path):
    marker = tmp_path / "MARKER"
    evil = _sample_inputs_payload(pt2, tmp_path / "evil.pt2", marker)
    r = subprocess.run([sys.executable, "-m", "vitedge", "inspect", str(evil)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "--trust-pickle" in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not marker.exists()
