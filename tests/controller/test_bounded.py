"""One call in a process of its own under a time and a memory limit (controller/bounded.py), as every
planning call runs: the limits stop it with a message naming the limit, what it raises comes back."""

from __future__ import annotations

import time

import pytest

from streamtopo.controller import bounded


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def allocate(megabytes: int) -> int:
    blocks = [bytearray(2**20) for _ in range(megabytes)]
    time.sleep(5)  # held while the parent looks
    return len(blocks)


def fail(message: str) -> None:
    raise ValueError(message)


def test_a_call_returns_its_result_and_raises_what_it_raised():
    assert bounded.call(sleep, 0.01, limits=bounded.Limits(seconds=60, memory=2**30)) == 0.01
    with pytest.raises(ValueError, match="no plan here"):
        bounded.call(fail, "no plan here", limits=bounded.Limits())


def test_the_time_limit_stops_a_call_and_counts_from_its_start():
    with pytest.raises(bounded.OverLimit, match="did not finish within 0.5s"):
        bounded.call(sleep, 30, limits=bounded.Limits(seconds=0.5, memory=None))
    # Starting the interpreter takes longer than this limit on any machine: it is not the call's time.
    assert bounded.call(sleep, 0, limits=bounded.Limits(seconds=0.05, memory=None)) == 0


def test_the_memory_limit_stops_a_call():
    with pytest.raises(bounded.OverLimit, match="needed more than"):
        bounded.call(allocate, 600, limits=bounded.Limits(seconds=60, memory=300 * 2**20))


def test_sizes_read_as_kubernetes_and_people_write_them():
    assert bounded.parse_bytes("4GiB") == bounded.parse_bytes("4Gi") == 4 * 2**30
    assert bounded.parse_bytes("512Mi") == 512 * 2**20 and bounded.parse_bytes("1000") == 1000
    with pytest.raises(ValueError):
        bounded.parse_bytes("lots")
