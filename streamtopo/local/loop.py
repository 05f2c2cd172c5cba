"""The controller's adaptation loop over a local run's executors (``streamtopo run``): the same
AdaptationLoop as on Kubernetes, scraping the local processes directly."""

from __future__ import annotations

from streamtopo.contracts import RoutingTable
from streamtopo.controller.adaptation_loop import AdaptationLoop
from streamtopo.controller.scrape import ScrapeMetricsSource
from streamtopo.local.platform import LocalPlatform
from streamtopo.planner.model import StreamTopology


def local_loop(
    platform: LocalPlatform, topology: StreamTopology, routing: RoutingTable, interval: float, seed: int
) -> AdaptationLoop:
    """The controller's AdaptationLoop over this run's processes, scraped directly, on
    :func:`short_windows` of the spec: the operator's decision path, tuned to a short run."""
    short = short_windows(topology, interval)
    return AdaptationLoop(
        platform, ScrapeMetricsSource(platform.endpoints), short, routing=routing, seed=seed
    )


def short_windows(topology: StreamTopology, interval: float) -> StreamTopology:
    """``topology`` with its statistics period set to ``interval``, the scaling rule's metric window and
    stabilisation to one period (defaults: 5 minutes) and scale-down delay and grace to 3 periods, so
    decisions come within a minutes-long run while every safeguard keeps its order. Only the spec
    changes: the decision path stays the operator's."""
    short = {
        "interval": interval,
        "metric_window": interval,
        "stabilization": interval,
        "scale_down_delay": 3 * interval,
        "scale_up_grace": 3 * interval,
    }
    auto = topology.spec.autoscaling.model_copy(update=short)
    return topology.model_copy(update={"spec": topology.spec.model_copy(update={"autoscaling": auto})})
