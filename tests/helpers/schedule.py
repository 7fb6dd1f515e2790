"""The order in which `--dist loadfile` hands test files to the xdist workers (tests/conftest.py applies it).

xdist sends one file at a time to whichever worker is nearly out of work, and by default it first sorts the files by
how many tests they hold, most first: the files with few but long tests (a whole CI recipe, a Ray matrix, the
SIGTERM builds) then came last, and one worker ran such a file alone while the other had finished (longest
processing time last: the worst order for the wall time). Here xdist keeps the collection's order, and the
collection puts the files measured heaviest first, heaviest first; every other file follows in its usual order and
fills the gaps at the end. Each file's tests stay together and in their own order, so module fixtures are built once.

HEAVIEST_FIRST is a measured list (docs/testing.md, "Time"): a file missing from it only runs later. A file it names
that no longer exists fails tests/package/test_schedule.py, so the list is kept with the files it names.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

# paths under tests/, heaviest first (each whole file, module fixtures and the once-per-run builds it happens to make
# included; measured 2026-11-29 on the 2-core AVX2 machine: the sum of each file's setup + call + teardown in a whole
# run, docs/testing.md). The first two use no bundle built once per run, so neither worker waits on the other's build
# at the start.
HEAVIEST_FIRST: tuple[str, ...] = (
    "models/test_corpus.py",
    "models/test_corpus_builds.py",
    "distributed/test_distributed.py",  # builds built_bundle for the files that read it
    "runtime/test_runtime.py",  # builds runtime_bundles for the files that read them
    "models/test_families.py",
    "budget/test_budget.py",  # makes outlier_vit for the budget files
    "reliability/test_sigterm.py",  # builds earlier_onnx_bundle for the files that read it
    "models/test_torchscript_export.py",
    "package/test_ci_recipes.py",
    "budget/test_budget_pins.py",
    "reliability/test_sigterm_late.py",
    "app/test_build_interrupts.py",
    "budget/test_budget_rebuild.py",
    "models/test_intake.py",
    "reliability/test_bounds.py",
    "reliability/test_output_lock.py",
    "app/test_int8_not_faster.py",
    "files/test_security_outputs.py",
    "models/test_family_checkpoints.py",
    "quantize/test_quantize_methods.py",
    "models/test_channels.py",
    "app/test_build.py",
    "quantize/test_quantize_runtime.py",
    "validation/test_speed_check.py",
    "package/test_toolchain.py",
    "backends/ort/test_ort_layouts.py",
    "backends/trt/test_tensorrt_bundle.py",
    "app/test_build_cli.py",
    "reliability/test_trust.py",
    "runtime/test_runtime_packaging.py",
    "bundle/test_manifest_schema.py",
    "app/test_bundle_schema.py",
    "validation/test_reference_cache.py",
    "camera_apps/test_camera_apps.py",
    "models/test_batch_check.py",
    "budget/test_embedding_gate.py",
    "backends/ort/test_ort_attention.py",
    "reliability/test_special_files_read.py",
    "backends/trt/test_tensorrt_surface.py",
    "backends/ort/test_ort_residual_sum.py",
)


def file_of(nodeid: str) -> str:
    """``tests/x/test_y.py::test_z[...]`` -> ``x/test_y.py`` (the file's path under tests/)."""
    path = nodeid.split("::", 1)[0]
    return path[len("tests/"):] if path.startswith("tests/") else path


def heaviest_first(items: Sequence, order: Sequence[str] = HEAVIEST_FIRST) -> list:
    """``items`` (anything with a ``nodeid``) with the files of ``order`` first, in that order, then every other file in
    the order it came; each file's items stay together and in their order."""
    rank = {name: i for i, name in enumerate(order)}
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(file_of(item.nodeid), i)

    def key(item) -> tuple[int, int]:
        name = file_of(item.nodeid)
        return (rank[name], 0) if name in rank else (len(rank), first_seen[name])

    return sorted(items, key=key)  # stable: the order inside a file is kept


def keep_collection_order(config) -> None:
    """Make xdist's file scheduling (``--dist loadfile``/``loadscope``/``loadgroup``) keep the collection's order instead
    of sorting the files by their number of tests; nothing without xdist."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
