"""The Spark Streaming (DStreams) dynamic-allocation rule, the scaling baseline.

Spark's ``streaming.scheduler.ExecutorAllocationManager`` looks, every
``spark.streaming.dynamicAllocation.scalingInterval`` (60 s), at the average ratio of batch processing
time to batch interval and

- requests ``max(round(ratio), 1)`` executors when ``ratio >= scalingUpRatio`` (0.9),
- kills one executor when ``ratio <= scalingDownRatio`` (0.3),

with no stabilisation, delay, band or backlog awareness. In normal overload (ratio below 1.5) this is
one executor at a time; Spark adds more only when batches take 1.5x the interval or longer, and so do we.
Here the ratio is the cores the input needs over the cores the executors have (``demand / capacity``),
which is what a micro-batch's processing time over its interval measures when the work spreads over
the executors; like Spark's it exceeds 1 when the job falls behind.
"""

from __future__ import annotations

import math
from dataclasses import replace

from streamtopo.planner.scaling.policy import (
    ScalingConfig,
    ScalingDecision,
    ScalingObservation,
    ScalingState,
    capacity_per_executor,
    change_to,
    check_observation,
    enforce_bounds,
    hold,
    scale_up_within_room,
)

EPS = 1e-9


def decide_dstreams(
    obs: ScalingObservation, state: ScalingState, config: ScalingConfig
) -> tuple[ScalingDecision, ScalingState]:
    """One evaluation of Spark's rule (ratios ``config.dstreams_up_ratio`` / ``dstreams_down_ratio``)."""
    check_observation(obs)
    if (forced := enforce_bounds(obs, state, config)) is not None:
        return forced
    if state.last_decision is not None and obs.time - state.last_decision < config.dstreams_interval - EPS:
        return hold(obs, f"waiting for the scaling interval {config.dstreams_interval:.0f} s"), state
    state = replace(state, last_decision=obs.time)
    ratio = (
        obs.demand / (obs.executors * capacity_per_executor(obs, config)) if obs.executors else float("inf")
    )
    facts = f"processing time / batch interval = {ratio:.2f}"
    if ratio >= config.dstreams_up_ratio - EPS and obs.executors < config.max_executors:
        new = min(obs.executors + max(math.floor(ratio + 0.5), 1), config.max_executors)  # Java's Math.round
        reason = f"{facts} >= {config.dstreams_up_ratio:g}"
        return scale_up_within_room(obs, state, config, new, reason, ratio, obs.demand)
    if ratio <= config.dstreams_down_ratio + EPS and obs.executors > config.min_executors:
        return change_to(
            obs,
            state,
            obs.executors - 1,
            f"{facts} <= {config.dstreams_down_ratio:g}",
            ratio,
            obs.executors - 1,
        )
    return hold(
        obs, f"{facts} within [{config.dstreams_down_ratio:g}, {config.dstreams_up_ratio:g}]", ratio
    ), state
