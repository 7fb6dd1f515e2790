"""pytest hooks: the objects of imported libraries kept out of every full garbage collection.

vitedge's build collects garbage after its large-graph stages (vitedge.core.memory.release_freed_memory: about
seven full collections per build). A full collection walks every object the process tracks, and a test process
that has imported torch, timm, ONNX, ONNX Runtime, OpenVINO and NNCF tracks about half a million of them that live
as long as the process: 0.4 s of CPU per collection on the 2-core AVX2 machine, 11 % of the CPU time of
tests/app/test_build.py run alone. ``gc.freeze()`` moves the objects alive at that moment to a permanent generation
no collection walks; reference counting still frees them, only a reference cycle among them would stay. So before a
test or a fixture is set up, when at least ``NEW_MODULES`` modules were imported since the last freeze, the process
collects once and freezes what is left: a handful of times per process, each time mostly library objects.
The builds themselves are unchanged (each still collects and trims the heap); they only have less to walk.
tests/conftest.py imports these hooks; tests/package/test_gc_freeze.py pins them."""

from __future__ import annotations

import gc
import sys

import pytest

NEW_MODULES = 50  # imported since the last freeze: enough to be worth one full collection

_frozen_at = [0]  # len(sys.modules) at the last freeze


def freeze_if_imported(new_modules: int = NEW_MODULES) -> bool:
    """Collect, then freeze every object alive, when ``new_modules`` or more modules were imported since the last
    time this froze; True when it did."""
    count = len(sys.modules)
    if count - _frozen_at[0] < new_modules:
        return False
    gc.collect()
    gc.freeze()
    _frozen_at[0] = count
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    freeze_if_imported()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    freeze_if_imported()  # a module fixture's builds after the first, which imported the runtimes
    yield
