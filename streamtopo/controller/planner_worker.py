"""Planning in a worker process, so the long-lived kopf process stays small.

The planning stack (COLA's and ALBIC's solvers, OR-Tools among them) adds well over 100 MB to any process
that imports it, and CPython rarely gives that memory back. The operator therefore hands every planning
call (``plan_topology`` + Aeolus at create/update/node changes, Algorithm 1 of ALBIC every SPL) to one
worker process and only applies the results itself:

- one worker (``max_workers=1``): planning calls queue instead of multiplying the solvers' memory;
- the ``spawn`` start method: the worker starts from a fresh interpreter, not a copy of the kopf process
  (its threads, sockets and event loop), and imports only what the planning needs;
- created lazily on the first call, and replaced after ``tasks_per_child`` calls so whatever the
  solvers grew is returned to the system. The replacement is done here (the retired pool finishes its
  queued calls, then its worker exits) rather than with ``max_tasks_per_child``: on Python 3.11-3.13
  that option deadlocks when calls are queued as the worker reaches its limit (CPython gh-115634), and
  the operator's threads do queue calls;
- a worker that died (OOM-killed, say) is replaced and the call retried once;
- a planning call (``plan``) runs in a process of its own under a time and a memory limit
  (controller/bounded.py: ``timeout`` seconds counted from when it starts, ``memory`` bytes of address
  space), at most ``slots`` at once; past a limit it is refused (NoValidPlan, the message says which)
  and its process killed, so one tenant's huge graph costs the others neither the queue nor the node's
  memory. The size of a request is bounded before it gets here, by the model's limits and the planning
  size check (planner/graph.py ``plan_size_problems``; docs/security.md). ALBIC's periodic solves
  (``adapt``) stay on the shared worker: they are bounded by deterministic time.

Arguments and results cross the process boundary by pickling (pydantic models and dataclasses). A refused
plan comes back as data (:class:`Refused`) because ``TopologyError`` carries its problems in an attribute
that pickling would lose; the caller re-raises it, so :func:`streamtopo.controller.reconcile.reconcile`
sees exactly what in-process planning raises.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from streamtopo.contracts import RoutingTable
from streamtopo.controller import bounded
from streamtopo.controller.platform import DesiredState
from streamtopo.controller.reconcile import IN_PROCESS, Collocations, Planner
from streamtopo.planner.allocation import AllocationState
from streamtopo.planner.cluster import Cluster
from streamtopo.planner.model import StreamTopology, TopologyError
from streamtopo.planner.plan import Plan

if TYPE_CHECKING:
    from streamtopo.planner.placement.cola.profiling import Profile

DEFAULT_TASKS_PER_CHILD = 50
DEFAULT_TIMEOUT = 120.0
"""Seconds one planning call may run (``STREAMTOPO_PLAN_TIMEOUT``), waiting for a slot not included."""
DEFAULT_MEMORY = 4 * 2**30
"""Bytes of address space one planning call may use (``STREAMTOPO_PLAN_MEMORY``)."""
DEFAULT_SLOTS = 2
"""Planning calls running at once (each in its own process)."""


@dataclass(frozen=True)
class Refused:
    """A plan the spec does not allow: TopologyError's problems, or another ValueError's message."""

    problems: list[tuple[str, str]] | None
    message: str

    def exception(self) -> ValueError:
        return TopologyError(self.problems) if self.problems is not None else ValueError(self.message)


def _plan(
    topology: StreamTopology,
    cluster: Cluster,
    previous: RoutingTable | None,
    seed: int,
    profile: Profile | None = None,
    room: Mapping[str, float] | None = None,
) -> tuple[DesiredState, Plan] | Refused:
    """Runs in the worker."""
    try:
        return IN_PROCESS.plan(topology, cluster, previous, seed, profile, room)
    except TopologyError as error:
        return Refused(error.problems, str(error))
    except ValueError as error:  # COLA's NoValidPlan: only its message matters to the caller
        return Refused(None, str(error))


def _adapt(
    topology: StreamTopology,
    state: AllocationState,
    scaling_state: Any,
    now: float,
    window: float,
    seed: int,
    collocations: Collocations,
) -> Any:
    """Runs in the worker."""
    return IN_PROCESS.adapt(
        topology,
        state,
        scaling_state,
        now=now,
        window=window,
        seed=seed,
        collocations=collocations,
    )


class WorkerPlanner(Planner):
    """A :class:`~streamtopo.controller.reconcile.Planner` whose computations run in one worker process.

    Thread-safe: kopf's handler threads and the SPL daemons' threads share one instance; their calls
    queue for the single worker.
    """

    def __init__(
        self,
        tasks_per_child: int = DEFAULT_TASKS_PER_CHILD,
        start_method: str = "spawn",
        timeout: float | None = DEFAULT_TIMEOUT,
        memory: int | None = DEFAULT_MEMORY,
        slots: int = DEFAULT_SLOTS,
    ):
        if tasks_per_child < 1:
            raise ValueError(f"tasks_per_child must be at least 1, got {tasks_per_child}")
        self.tasks_per_child = tasks_per_child
        self.timeout = timeout
        self.memory = memory
        self._slots = threading.Semaphore(slots)
        self.start_method = start_method
        self._pool: ProcessPoolExecutor | None = None
        self._calls = 0
        """Calls handed to the current pool."""
        self._lock = threading.Lock()

    def plan(
        self,
        topology: StreamTopology,
        cluster: Cluster,
        previous: RoutingTable | None,
        seed: int,
        profile: Profile | None = None,
        room: Mapping[str, float] | None = None,
    ) -> tuple[DesiredState, Plan]:
        limits = bounded.Limits(seconds=self.timeout, memory=self.memory)
        with self._slots:  # waiting here is not the call's time
            try:
                result = bounded.call(_plan, topology, cluster, previous, seed, profile, room, limits=limits)
            except bounded.OverLimit as error:
                result = Refused(None, str(error))
        if isinstance(result, Refused):
            raise result.exception()
        return cast(tuple[DesiredState, Plan], result)

    def adapt(
        self,
        topology: StreamTopology,
        state: AllocationState,
        scaling_state: Any,
        *,
        now: float,
        window: float,
        seed: int,
        collocations: Collocations = (),
    ) -> Any:
        return self._call(_adapt, topology, state, scaling_state, now, window, seed, collocations)

    def _submit(self, function: Callable[..., Any], *args: Any) -> tuple[ProcessPoolExecutor, Future[Any]]:
        """Queue one call; the pool's last call retires it (its worker exits once the queue is done)."""
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context(self.start_method)
                )
                self._calls = 0
            pool = self._pool
            future = pool.submit(function, *args)
            self._calls += 1
            if self._calls >= self.tasks_per_child:
                self._pool = None
                pool.shutdown(wait=False)
        return pool, future

    def _call(self, function: Callable[..., Any], *args: Any) -> Any:
        pool, future = self._submit(function, *args)
        try:
            return self._result(pool, future, function)
        except BrokenProcessPool:  # the worker died: a fresh one gets the call once more
            self._discard(pool)
        pool, future = self._submit(function, *args)
        return self._result(pool, future, function)

    def _result(self, pool: ProcessPoolExecutor, future: Future[Any], function: Callable[..., Any]) -> Any:
        return future.result()  # ALBIC's solves are bounded by deterministic time

    def _discard(self, pool: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._pool is pool:
                self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)

    def shutdown(self) -> None:
        """Stop the worker (the next call starts a new one)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
