"""Cached validation outputs cannot forge a verdict (issue 26 item 3).

The bundle here misses its gate on INT8 (exit 1). A forger who writes the FP32 outputs into the INT8
entry of the validation cache would make `validate` PASS at 100 % agreement if the cache were believed.
Entries carry an HMAC under a per-cache 0600 key (an unsigned or foreign entry is ignored), and a cached
INT8 entry is spot-checked by running random batches again (a re-signed forgery is caught there).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import CALIB_DIR
from rel_cli import cli


@pytest.fixture(scope="module")
def failing(timm_vit, tmp_path_factory, untimed_targets_dir):
    """A bundle built with the default gate and no accuracy budget: this random ViT misses max_top1_drop (exit 1).
    Built without the INT8-vs-FP32 timing (not what these tests pin)."""
    from helpers.profiles import untimed_targets

    root = tmp_path_factory.mktemp("forgery")
    with untimed_targets(untimed_targets_dir):
        run = cli("build", timm_vit[1], "-t", "onnx", "--calib", CALIB_DIR, "-o", root / "b", "-q", "--no-latency", "--no-fallback",
                  "--near-tie-margin", 0, "--drop-confidence", 0,  # the plain gate: this random ViT's flips all count
                  "--cache-dir", root / "build-cache")
    assert run.code == 1, run.err[-3000:]
    return root / "b"


def _validate(b: Path, cache: Path):
    run = cli("validate", b, "--no-latency", "--no-sensitivity", "--cache-dir", cache)
    doc = json.loads((b / "report" / "validation.json").read_text())
    return run, doc


def _fresh(failing: Path, tmp_path: Path):
    b = tmp_path / "b"
    shutil.copytree(failing, b)
    cache = tmp_path / "cache"
    run, doc = _validate(b, cache)  # fills the cache: FP32 and INT8 entries
    assert run.code == 1 and doc["data"]["int8_outputs"]["cache"] == "miss", run.err[-2000:]
    return b, cache, doc


def _forge(cache: Path, doc: dict, *, sign: bool) -> Path:
    """Write the FP32 outputs into the INT8 entry, with this cache's HMAC (as the same user could) or with none."""
    from vitedge.validation.reference_cache import ReferenceCache, ReferenceCacheSettings

    c = ReferenceCache(ReferenceCacheSettings(root=cache))
    ref = np.load(c.path_for(doc["data"]["reference"]["key"]))
    entry = c.path_for(doc["data"]["int8_outputs"]["key"])
    old = np.load(entry)
    meta, labels, values = str(old["meta"]), old["labels"], np.asarray(ref["values"], dtype=np.float32)
    arrays = {"meta": np.array(meta), "values": values, "labels": labels}
    if sign:
        arrays["mac"] = np.array(c.mac(meta, values, labels))
    with open(entry, "wb") as f:
        np.savez(f, **arrays)
    return entry


@pytest.mark.parametrize("sign, why", [(False, "HMAC does not match"), (True, "differ from the cached outputs")])
def test_a_forged_int8_cache_entry_cannot_make_a_failing_bundle_pass(sign, why, failing, tmp_path):
    b, cache, first = _fresh(failing, tmp_path)
    _forge(cache, first, sign=sign)
    run, doc = _validate(b, cache)
    assert run.code == 1, run.err[-2000:]  # still the real verdict, not a forged PASS
    assert "Traceback" not in run.err
    said = " ".join((run.out + run.err).split())
    assert why in said, said[-2000:]
    assert doc["data"]["int8_outputs"]["cache"] == "miss" and not doc["passed"]
    assert doc["accuracy"]["top1_agreement"] == first["accuracy"]["top1_agreement"] < 1.0
    # the entry was replaced by the artifact's real outputs: the next run reuses them (and checks them again)
    run, doc = _validate(b, cache)
    assert run.code == 1 and doc["data"]["int8_outputs"]["cache"] == "hit"


def test_a_forged_fp32_reference_entry_is_ignored(failing, tmp_path):
    """FP32 outputs replaced by the INT8 ones would give 100 % agreement too; without the key's HMAC they are ignored."""
    b, cache, first = _fresh(failing, tmp_path)
    from vitedge.validation.reference_cache import ReferenceCache, ReferenceCacheSettings

    c = ReferenceCache(ReferenceCacheSettings(root=cache))
    int8 = np.load(c.path_for(first["data"]["int8_outputs"]["key"]))
    entry = c.path_for(first["data"]["reference"]["key"])
    with np.load(entry) as z:
        old = {k: z[k] for k in z.files}  # read before the file is rewritten
    with open(entry, "wb") as f:
        np.savez(f, meta=old["meta"], values=int8["values"], labels=old["labels"], mac=old["mac"])  # the old HMAC: no longer matches
    run, doc = _validate(b, cache)
    assert run.code == 1 and doc["data"]["reference"]["cache"] == "miss"
    assert "HMAC does not match" in " ".join((run.out + run.err).split())


def test_a_cache_key_others_can_read_disables_the_cache(failing, tmp_path):
    b, cache, first = _fresh(failing, tmp_path)
    key = cache / "reference" / ".key"
    assert (key.stat().st_mode & 0o777) == 0o600
    os.chmod(key, 0o644)
    before = sorted(p.name for p in (cache / "reference").iterdir())
    run, doc = _validate(b, cache)
    assert run.code == 1 and doc["data"]["reference"]["cache"] == "miss" and doc["data"]["int8_outputs"]["cache"] == "miss"
    assert "not a private file of this user" in " ".join((run.out + run.err).split())
    assert sorted(p.name for p in (cache / "reference").iterdir()) == before  # nothing read, nothing written
