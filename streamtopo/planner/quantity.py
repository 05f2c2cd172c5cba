"""Kubernetes resource quantities (``3500m``, ``16Gi``): their grammar for the CRD, their value for checks,
and the least memory an executor pod runs in.

One place for the three, since the model (a spec's ``executor.resources.memory``), the operator's settings
(the chart's ``executor.memory``) and the nodes' allocatable CPU and memory all read quantities.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""A Kubernetes resource quantity (the API server's own grammar)."""
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=64)]

MIN_EXECUTOR_MEMORY = "1Gi"
"""The least memory an executor pod may be given. Its JVM's heap is at least 512 MiB (Spark refuses much
less, runtime/spark.py) and the JVM's own memory and the Python driver take about as much again: an
idle word count's executor measured 700 MiB with a 512 MiB heap (docs/operator.md, "Executor memory").
Below this the kernel kills the pod at its limit, and a restart on the same limit dies the same way."""


def quantity(value: str | float) -> float:
    """A quantity as a number, parsed by the Kubernetes client's own parser."""
    from kubernetes.utils import parse_quantity

    try:
        return float(parse_quantity(value))  # type: ignore[no-untyped-call]  # the client ships no types
    except (ValueError, TypeError, ArithmeticError):
        raise ValueError(f"not a resource quantity: {value!r}") from None


def executor_memory_problem(value: str) -> str | None:
    """Why ``value`` cannot be an executor pod's memory, or None."""
    try:
        too_small = quantity(value) < quantity(MIN_EXECUTOR_MEMORY)
    except ValueError as error:
        return str(error)
    if too_small:
        return (
            f"{value} is less than {MIN_EXECUTOR_MEMORY}, the least an executor runs in (a JVM with a heap of "
            "at least 512Mi, plus its Python driver); the pod would be killed at its limit on every restart"
        )
    return None
