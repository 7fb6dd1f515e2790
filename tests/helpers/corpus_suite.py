"""The public corpus's own code (benchmarks/corpus) as the corpus tests load it, and the folder a test needs.

Shared by tests/models/test_corpus.py (manifest, classes, accuracy, `fill`) and test_corpus_builds.py (two corpus
models through `vitedge build`), which are two files so `--dist loadfile` runs them on two workers."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[2] / "benchmarks" / "corpus"


def load_module(name: str, path: Path):
    """The Python file ``path`` as module ``name`` (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


cache = load_module("corpus_cache_for_tests", CORPUS / "cache.py")
classes = load_module("corpus_models_for_tests", CORPUS / "models.py")
MANIFEST = cache.load_manifest()
IDS = [m.id for m in MANIFEST.models]


def need(monkeypatch, *model_ids: str) -> Path:
    """The corpus folder holding these models and their test sets (cache.find_cache), made this test's
    cache; skips naming the first missing file where there is none."""
    folder = cache.find_cache(MANIFEST, list(model_ids))
    if folder is None:
        missing = cache.problems(MANIFEST, list(model_ids))
        where = cache.cache_dir() if os.environ.get(cache.ENV) else f"{cache.DEFAULT_CACHE} or {cache.BESIDE_CHECKOUT}"
        pytest.skip(f"no corpus folder with {', '.join(model_ids)} ({where}): {missing[0]}")
    monkeypatch.setenv(cache.ENV, str(folder))
    return folder
