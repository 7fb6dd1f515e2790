"""pytest hooks: a run that leaves a process of its own alive fails, naming it.

Every xdist worker (and a run without xdist) shuts Ray down if a test left it initialised, then
waits for its child processes and kills what is still alive; the controller does the same after
xdist has torn its workers down (so a worker that would not exit is killed, not left holding
the run's stdout). Anything killed is listed under "leftover processes" and the run exits 1.
tests/conftest.py imports these hooks; tests/package/test_toolchain.py runs them on a planted leftover."""

from __future__ import annotations

import sys

import pytest

from helpers.processes import reap

_KEY = "vitedge_leftover_processes"


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _shutdown_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and getattr(ray, "is_initialized", lambda: False)():
        ray.shutdown()


@pytest.hookimpl(trylast=True)  # after the session fixtures' teardown, and (controller) after xdist's own
def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    found = getattr(config, "_vitedge_leftovers", [])
    _shutdown_ray()
    where = f"xdist worker {config.workerinput['workerid']}" if _is_worker(config) else "pytest"
    found += [f"{where}: {item}" for item in reap()]
    if _is_worker(config):
        config.workeroutput[_KEY] = found  # sent to the controller with "workerfinished"
    config._vitedge_leftovers = found
    config._vitedge_session = session


@pytest.hookimpl(optionalhook=True)  # an xdist hook: without xdist there are no workers
def pytest_testnodedown(node, error) -> None:
    """Controller: collect what each worker had to kill."""
    found = getattr(node.config, "_vitedge_leftovers", [])
    found += list(getattr(node, "workeroutput", {}).get(_KEY, []))
    node.config._vitedge_leftovers = found


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    found = getattr(config, "_vitedge_leftovers", [])
    if not found:
        return
    terminalreporter.section("leftover processes", red=True)
    for line in found:
        terminalreporter.line(f"killed {line}")
    terminalreporter.line("a test or fixture left these running: each must stop what it starts, on every path")
    session = getattr(config, "_vitedge_session", None)
    if session is not None:  # pytest returns session.exitstatus after this hook
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
