"""A local run's sources as its options shape them: rates scaled (``--rate-scale``) and generators made
finite (``--source-seconds``), so a laptop runs a cluster's job at its own pace and to end of stream."""

from __future__ import annotations

import math

from streamtopo.planner.model import StreamTopology


def scale_rates(topology: StreamTopology, factor: float) -> StreamTopology:
    """The topology with every source's ratePerSecond multiplied by ``factor`` (a local run's scale-down).

    The examples declare cluster rates (VWAP: 40k + 60k rec/s); a laptop's executors sustain a fraction of
    that, so ``--rate-scale 0.05`` keeps the shape of the job (ratios, key distribution) at a rate the
    machine can carry. Declared costs (cores at the declared rate) scale with it.
    """
    if factor == 1.0:
        return topology
    if factor <= 0:
        raise ValueError(f"--rate-scale must be > 0, got {factor}")
    data = topology.model_dump(mode="json", by_alias=True, exclude_none=True)
    for op in data["spec"]["operators"]:
        if op.get("source", {}).get("ratePerSecond") is not None:
            op["source"]["ratePerSecond"] = op["source"]["ratePerSecond"] * factor
        if op.get("cost", {}).get("cpu") is not None:
            op["cost"]["cpu"] = op["cost"]["cpu"] * factor
    for stream in data["spec"].get("streams", []):
        if stream.get("rate") is not None:
            stream["rate"] = stream["rate"] * factor
    return StreamTopology.model_validate(data)


def limit_sources(topology: StreamTopology, seconds: float | None) -> StreamTopology:
    """The topology with every generator ending after ``seconds`` of records (``count`` = rate x seconds,
    or its own count if smaller), so a run ends at end of stream, every window fired and nothing waiting,
    rather than being stopped mid-stream with records in flight. Applied after :func:`scale_rates`."""
    if seconds is None:
        return topology
    if seconds <= 0:
        raise ValueError(f"--source-seconds must be > 0, got {seconds}")
    data = topology.model_dump(mode="json", by_alias=True, exclude_none=True)
    for op in data["spec"]["operators"]:
        source = op.get("source", {})
        if source.get("generator") is not None:
            cap = math.ceil(source["ratePerSecond"] * seconds)
            source["count"] = min(source.get("count", cap), cap)
    return StreamTopology.model_validate(data)
