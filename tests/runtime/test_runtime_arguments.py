"""`vitedge.runtime.load` checks its arguments before it opens anything: a wrong type or a value out of range is one
UsageError (a ValueError's sibling: a VitedgeError) naming the argument. A thread count past this machine's cores made
ONNX Runtime fail with std::bad_alloc and OpenVINO crash the process (SIGSEGV); ``max_batch=0``, ``threads=-3`` or a
string ``warmup`` failed later or not at all. Concurrent loads of an OpenVINO bundle open one runner at a time."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import numpy as np
import pytest

from vitedge.core import limits
from vitedge.backends import backend_class
from vitedge.core.errors import UsageError
from vitedge.runtime import load


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


BAD = [
    ("threads", 10**9, "threads must be an integer in [1,"),
    ("threads", 0, "threads must be an integer in [1,"),
    ("threads", -3, "threads must be an integer in [1,"),
    ("threads", 2.5, "threads must be an integer"),
    ("threads", "4", "threads must be an integer"),
    ("threads", True, "threads must be an integer"),
    ("max_batch", 0, "max_batch must be an integer in [1, 4096]"),
    ("max_batch", -1, "max_batch must be an integer in [1, 4096]"),
    ("max_batch", 10**9, "max_batch must be an integer in [1, 4096]"),
    ("max_batch", 1.5, "max_batch must be an integer"),
    ("warmup", "2", "warmup must be an integer in [0, 1000]"),
    ("warmup", -1, "warmup must be an integer in [0, 1000]"),
    ("warmup", 10**7, "warmup must be an integer in [0, 1000]"),
    ("warmup", None, "warmup must be an integer"),
    ("runners", 0, "runners must be an integer in [1, 256]"),
    ("runners", "2", "runners must be an integer"),
    ("runners", 10**6, "runners must be an integer in [1, 256]"),
    ("verify", "no", "verify must be True or False"),
    ("verify", None, "verify must be True or False"),
    ("allow_cpu_mismatch", "yes", "allow_cpu_mismatch must be True or False (or None)"),
]


@pytest.mark.parametrize("target", ["onnx", "intel-cpu"])
@pytest.mark.parametrize("name,value,message", BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_bad_argument_is_one_usage_error(runtime_bundles, target, name, value, message):
    bundle = runtime_bundles["plain"][target]
    before = _tree(bundle)
    with pytest.raises(UsageError) as err:
        load(bundle, **{name: value})
    text = str(err.value)
    assert message in text, text
    assert "\n" not in text and repr(value) in text
    assert _tree(bundle) == before


@pytest.mark.parametrize("bundle", [None, 3, b"", ""], ids=["None", "int", "empty-bytes", "empty"])
def test_bundle_must_be_a_path(bundle):
    with pytest.raises(UsageError, match="bundle must be a bundle folder's path"):
        load(bundle)


def test_the_thread_bound_is_this_machines():
    """The highest thread count load takes is the CLI's --threads bound (a few per CPU this process may use)."""
    with pytest.raises(UsageError, match=rf"threads must be an integer in \[1, {limits.max_threads()}\]"):
        load("no-such-bundle", threads=limits.max_threads() + 1)


def test_in_range_arguments_still_load(runtime_bundles):
    with load(runtime_bundles["plain"]["onnx"], threads=1, max_batch=1, warmup=0, runners=2, allow_cpu_mismatch=None) as model:
        assert model.max_batch == 1
        assert model.predict(np.zeros((8, 8, 3), np.uint8)).label is not None


def test_concurrent_openvino_loads_open_one_at_a_time(runtime_bundles):
    """OpenVINO's facts ask for serial opens; four threads loading the same bundle at once all get a working model."""
    assert backend_class("openvino").facts.open_serially and not backend_class("onnxruntime").facts.open_serially
    bundle = runtime_bundles["plain"]["intel-cpu"]
    labels, errors = [], []

    def one():
        try:
            with load(bundle) as model:
                labels.append(model.predict(np.full((32, 32, 3), 90, np.uint8)).label)
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not any(t.is_alive() for t in threads), "a load never returned"
    assert errors == [] and len(set(labels)) == 1 and len(labels) == 4, (errors, labels)
