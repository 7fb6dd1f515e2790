"""Start or attach Ray, run one function over many payloads, and contain dead workers.

The only module that imports Ray, and only inside its functions. A task whose worker
process dies is retried by Ray (``max_retries``); when it still dies, it becomes that
task's failure (``TaskOutcome``), never the whole driver's crash. An error raised by the
task itself (a VitedgeError such as a hash mismatch) is not retried: it is the answer.
"""

from __future__ import annotations

import importlib.util
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from vitedge.core import telemetry
from vitedge.core.errors import (
    EnvironmentFault,
    MissingDependencyError,
    UsageError,
    VitedgeError,
)

INSTALL = "pip install 'vitedge[ray]'"
DEFAULT_RETRIES = 2


class WorkerFailure(EnvironmentFault):
    """A Ray task whose worker died on every attempt (killed, out of memory, node lost)."""


@dataclass(frozen=True)
class ClusterSettings:
    workers: int | None = None  # start a local Ray with this many CPUs for the run (--workers)
    address: str | None = None  # attach to an existing cluster (--ray-address), e.g. "ray://head:10001" or "auto"
    cpus_per_task: int = 1
    max_retries: int = DEFAULT_RETRIES

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise UsageError(f"--workers must be at least 1, got {self.workers}")
        if self.cpus_per_task < 1:
            raise UsageError(f"--cpus-per-worker must be at least 1, got {self.cpus_per_task}")

    def describe(self) -> str:
        return f"Ray cluster at {self.address}" if self.address else f"local Ray, {self.workers} worker(s)"


@dataclass
class TaskOutcome:
    index: int
    value: Any = None
    node: dict[str, str] | None = None  # {"host": ..., "node_id": ...} of the worker that ran it
    error: str | None = None  # why it failed: the worker died on every attempt
    cause: VitedgeError | None = None  # the task's own error (not retried)

    @property
    def ok(self) -> bool:
        return self.error is None and self.cause is None


def ray_available() -> bool:
    return importlib.util.find_spec("ray") is not None


def require_ray():
    telemetry.silence()  # Ray's usage stats: off before the cluster starts (its workers inherit it)
    try:
        import ray
    except ImportError:
        raise MissingDependencyError("Ray (for --workers / --ray-address and build-matrix on a cluster)", INSTALL) from None
    return ray


@contextmanager
def connected(settings: ClusterSettings) -> Iterator[Any]:
    """Ray, initialised for the run: a local cluster of ``settings.workers`` CPUs or the cluster at ``settings.address``.

    An already initialised Ray (a notebook, a test session) is used as it is and left running."""
    ray = require_ray()
    if ray.is_initialized():
        yield ray
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    if settings.address:
        kwargs["address"] = settings.address
    else:
        kwargs["num_cpus"] = (settings.workers or os.cpu_count() or 1) * settings.cpus_per_task
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as err:
        ray.shutdown()  # a half-started local cluster (GCS up, raylet not) must not outlive the run
        where = settings.address or "a local cluster"
        raise EnvironmentFault(f"cannot start or reach Ray ({where}): {str(err).splitlines()[0] if str(err) else type(err).__name__}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def largest_node_cpus() -> int:
    """CPUs of the biggest alive node: a task asking for that many runs alone on its node."""
    ray = require_ray()
    cpus = [int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive")]
    return max([c for c in cpus if c > 0] or [1])


def cluster_nodes() -> list[str]:
    ray = require_ray()
    return sorted(n.get("NodeManagerHostname", "?") for n in ray.nodes() if n.get("Alive"))


P = TypeVar("P")  # a task's payload
R = TypeVar("R")  # its result


def _with_node(fn: Callable[[P], R], payload: P) -> tuple[R, dict[str, str]]:
    """Run ``fn(payload)`` on a worker and say where it ran."""

    import ray

    return fn(payload), {"host": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id(), "pid": str(os.getpid())}


def run_tasks(fn: Callable[[Any], Any], payloads: Sequence[Any], *, num_cpus: int = 1,
              max_retries: int = DEFAULT_RETRIES, on_done: Callable[[TaskOutcome], None] | None = None) -> list[TaskOutcome]:
    """``fn(payload)`` for every payload as Ray tasks (Ray must be initialised); one outcome each, in payload order."""
    ray = require_ray()
    from ray.exceptions import RayTaskError, WorkerCrashedError

    remote = ray.remote(num_cpus=num_cpus, max_retries=max_retries, retry_exceptions=False)(_with_node)
    refs = [remote.remote(fn, p) for p in payloads]
    index = {ref: i for i, ref in enumerate(refs)}
    outcomes: list[TaskOutcome | None] = [None] * len(refs)
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        ref = done[0]
        i = index[ref]
        try:
            value, node = ray.get(ref)
            outcome = TaskOutcome(i, value, node)
        except RayTaskError as err:
            cause = getattr(err, "cause", None)
            if isinstance(cause, VitedgeError):
                outcome = TaskOutcome(i, cause=cause)
            else:
                what = f"{type(cause).__name__}: {cause}" if cause is not None else str(err).splitlines()[0]
                outcome = TaskOutcome(i, error=f"raised {what.splitlines()[0][:200]}")
        except WorkerCrashedError:
            outcome = TaskOutcome(i, error=f"its worker process died on each of {max_retries + 1} attempt(s)")
        except ray.exceptions.RayError as err:  # node lost, object lost, ...
            outcome = TaskOutcome(i, error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
        outcomes[i] = outcome
        if on_done is not None:
            on_done(outcome)
    return [o for o in outcomes if o is not None]
