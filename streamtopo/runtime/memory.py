"""What memory this process may use: the machine's, or its cgroup's limit (a pod's) when lower.

One reading for every budget the data plane sizes from it: a join's pairs per step, the JVM's heap."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import psutil


def memory_limit() -> float:
    """Bytes this process may use: the machine's memory, or its cgroup's limit (a pod's) when lower."""
    return min(psutil.virtual_memory().total, _cgroup_limit())


@cache
def _cgroup_limit() -> float:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            return float(Path(path).read_text().strip())
        except (OSError, ValueError):  # absent, or "max": no limit there
            continue
    return math.inf
