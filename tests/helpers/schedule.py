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

# paths under tests/, heaviest first (each whole file, module fixtures included; measured 2026-11-29 on the 2-core AVX2
# machine: the slowest tests of a whole run, docs/testing.md). The first two use no bundle built once per run, so neither
# worker waits on the other's build at the start.
HEAVIEST_FIRST: tuple[str, ...] = (
    "models/test_torchscript_export.py",
    "models/test_channels.py",
    "app/test_build.py",
    "validation/test_reference_cache.py",  # builds built_bundle for the files that read it
    "files/test_security_outputs.py",
    "backends/ort/test_ort_layouts.py",
    "reliability/test_bounds.py",
    "models/test_corpus_builds.py",
    "models/test_corpus.py",
    "runtime/test_runtime.py",  # builds runtime_bundles for the files that read them
    "models/test_families.py",
    "distributed/test_distributed.py",
    "package/test_ci_recipes.py",
    "app/test_build_cli.py",
    "reliability/test_matrix_resume.py",
    "reliability/test_output_lock.py",
    "reliability/test_special_files_read.py",
    "reliability/test_trust.py",
    "quantize/test_large_graph_memory.py",
    "backends/ort/test_ort_attention.py",
    "backends/trt/test_tensorrt_graphs.py",
    "bundle/test_manifest_schema.py",
    "reliability/test_bad_input.py",
    "validation/test_speed_check.py",
    "runtime/test_runtime_arguments.py",
    "backends/test_backend_registry.py",
    "cli/commands/test_validate_cli.py",
    "reliability/test_hostile_names.py",
    "budget/test_budget.py",
    "budget/test_budget_pins.py",
    "budget/test_budget_rebuild.py",
    "models/test_family_checkpoints.py",
    "cli/test_cli.py",
    "reliability/test_sigterm.py",
    "reliability/test_sigterm_late.py",
    "app/test_build_interrupts.py",
    "backends/test_int8_payoff.py",
    "camera_apps/test_camera_apps.py",
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
