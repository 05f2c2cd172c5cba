"""One call in a process of its own, under a time and a memory limit: what one tenant's planning may cost.

Planning time and memory grow with a topology's size (key groups, operators, constraints); a spec near
the model's bounds can keep a solver busy for minutes in gigabytes. The operator (controller/
planner_worker.py) and ``streamtopo plan`` therefore run each planning call through :func:`call`:

- a fresh ``spawn`` process per call, killed when its resident memory passes the limit (watched every
  tenth of a second), its address space capped at twice the limit (``RLIMIT_AS``) as a backstop the
  watch cannot miss: the node's OOM killer never has to choose the operator. (The watch comes first
  because native solvers that hit ``RLIMIT_AS`` in a thread may hang rather than fail);
- the time limit counts from when the call starts in its process, so waiting for a free slot (other
  tenants' calls) or for the interpreter to start is never charged to it; past it the process is killed;
- what the call raises comes back as its exception; a limit that stopped it is :class:`OverLimit`, whose
  message says which limit and how to fit within it.
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, cast

import psutil

PARSE_UNITS = {"": 1, "k": 2**10, "ki": 2**10, "m": 2**20, "mi": 2**20, "g": 2**30, "gi": 2**30}


@dataclass(frozen=True)
class Limits:
    """A call's bounds; None: unbounded."""

    seconds: float | None = 120.0
    memory: int | None = 4 * 2**30
    """Bytes of address space."""


class OverLimit(RuntimeError):
    """A call stopped by its time or memory limit."""


def parse_bytes(text: str) -> int:
    """``4GiB``, ``512Mi``, ``2G`` or a number of bytes."""
    number = text.strip().rstrip("Bb")
    unit = "".join(c for c in number if c.isalpha()).lower()
    value = number[: len(number) - len(unit)] if unit else number
    if unit not in PARSE_UNITS:
        raise ValueError(f"{text!r} is not a size (bytes, or a number with Ki, Mi, Gi)")
    return int(float(value) * PARSE_UNITS[unit])


def call(function: Callable[..., Any], *args: Any, limits: Limits = Limits()) -> Any:
    """``function(*args)`` in a fresh process under ``limits``; its result, or what it raised."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    ceiling = 2 * limits.memory if limits.memory is not None else None
    process = context.Process(target=_run, args=(send, function, args, ceiling), daemon=True)
    process.start()
    send.close()
    try:
        if _wait(receive, process, None, None) != "ready":  # the interpreter starting: not the call's time
            raise OverLimit(f"the planning process ended before it started (exit code {process.exitcode})")
        receive.recv()
        stopped = _wait(receive, process, limits.seconds, limits.memory)
        if stopped == "time":
            raise OverLimit(
                f"planning did not finish within {limits.seconds:g}s (the limit per call): fewer key "
                "groups, fewer operators or a simpler fusion algorithm plan faster"
            )
        if stopped == "ended":
            raise OverLimit(f"the planning process ended without an answer (exit code {process.exitcode})")
        outcome, value = receive.recv() if stopped == "ready" else ("memory", None)
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        receive.close()
    if outcome == "memory":
        raise OverLimit(
            f"planning needed more than {(limits.memory or 0) / 2**30:.3g} GiB (the limit per call): fewer "
            "key groups or operators, or the logical graph (spec.fusion.graph), need less"
        )
    if outcome == "error":
        raise cast(BaseException, value)
    return value


def _wait(receive: Connection, process: Any, seconds: float | None, memory: int | None) -> str:
    """``ready`` when a message arrived; ``time`` after ``seconds``, ``memory`` once the process's
    resident memory passed ``memory``, ``ended`` if it ended without a word."""
    deadline = None if seconds is None else time.monotonic() + seconds
    watched = psutil.Process(process.pid)
    while True:
        if receive.poll(0.1):
            return "ready"
        if not process.is_alive():
            return "ready" if receive.poll() else "ended"
        if deadline is not None and time.monotonic() > deadline:
            return "time"
        if memory is not None:
            try:
                if watched.memory_info().rss > memory:
                    return "memory"
            except psutil.NoSuchProcess:
                continue


def _run(send: Connection, function: Callable[..., Any], args: tuple[Any, ...], memory: int | None) -> None:
    """In the child: cap the address space, say it started, run, send the outcome."""
    if memory is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    send.send("started")
    try:
        outcome: tuple[str, Any] = ("ok", function(*args))
    except MemoryError:
        outcome = ("memory", None)
    except Exception as error:  # noqa: BLE001 - handed to the caller, which raises it
        outcome = ("error", error)
    try:
        send.send(outcome)
    except Exception as error:  # noqa: BLE001 - an exception that does not pickle: its words do
        send.send(("error", RuntimeError(f"{type(error).__name__}: {error}")))
