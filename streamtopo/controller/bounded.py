"""One call in a process of its own, under a time and a memory limit: what one tenant's planning may cost.

Planning time and memory grow with a topology's size (key groups, operators, constraints); a spec near
the model's bounds can keep a solver busy for minutes in gigabytes. The operator (controller/
planner_worker.py) and ``streamtopo plan`` therefore run each planning call through :func:`call`:

- a fresh ``spawn`` process per call, whose address space is capped (``RLIMIT_AS``): past it the call's
  allocations fail (a ``MemoryError``) instead of the node's OOM killer taking the operator;
- the time limit counts from when the call starts in its process, so waiting for a free slot (other
  tenants' calls) or for the interpreter to start is never charged to it; past it the process is killed;
- what the call raises comes back as its exception; a limit that stopped it is :class:`OverLimit`, whose
  message says which limit and how to fit within it.
"""

from __future__ import annotations

import multiprocessing
import resource
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

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
    process = context.Process(target=_run, args=(send, function, args, limits.memory), daemon=True)
    process.start()
    send.close()
    try:
        if not _wait(receive, process, None):  # the interpreter starting: not the call's time
            raise OverLimit(f"the planning process ended before it started (exit code {process.exitcode})")
        receive.recv()
        if not _wait(receive, process, limits.seconds):
            raise OverLimit(
                f"planning did not finish within {limits.seconds:g}s (the limit per call): fewer key groups, "
                "fewer operators or a simpler fusion algorithm plan faster"
            )
        outcome, value = receive.recv()
    finally:
        if process.is_alive():
            process.kill()
        process.join()
        receive.close()
    if outcome == "memory":
        raise OverLimit(
            f"planning needed more than {(limits.memory or 0) / 2**30:.3g} GiB (the limit per call): fewer key "
            "groups or operators, or the logical graph (spec.fusion.graph), need less"
        )
    if outcome == "error":
        raise value
    return value


def _wait(receive: Connection, process: Any, seconds: float | None) -> bool:
    """Whether a message arrived within ``seconds`` (None: until the process ends)."""
    if seconds is None:
        while process.is_alive() or receive.poll():
            if receive.poll(0.1):
                return True
        return False
    return bool(receive.poll(seconds))


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
