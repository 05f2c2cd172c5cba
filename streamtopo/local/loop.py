"""The controller's adaptation loop over a local run's executors (``streamtopo run``): the same
AdaptationLoop as on Kubernetes, scraping the local processes directly."""

from __future__ import annotations

from streamtopo.contracts import RoutingTable
from streamtopo.controller.reconcile import AdaptationLoop
from streamtopo.controller.scrape import ScrapeMetricsSource
from streamtopo.local.platform import LocalPlatform
from streamtopo.planner.model import StreamTopology


def local_loop(
    platform: LocalPlatform, topology: StreamTopology, routing: RoutingTable, interval: float, seed: int
) -> AdaptationLoop:
    """The controller's AdaptationLoop over this run's processes, scraped directly, tuned to a short run.

    The spec's interval becomes ``interval``; the scaling rule's metric window and stabilisation shrink to
    one period (ScalingConfig.from_spec would force a 300 s window otherwise) and scale-down waits
    3 periods, so decisions come within a minutes-long run while keeping every safeguard's order.
    """
    auto = topology.spec.autoscaling.model_copy(update={"interval": interval})
    local = topology.model_copy(update={"spec": topology.spec.model_copy(update={"autoscaling": auto})})
    overrides = {
        "metric_window": interval,
        "stabilization": interval,
        "scale_down_delay": 3 * interval,
        "scale_up_grace": 3 * interval,
        "dstreams_interval": interval,
    }
    return AdaptationLoop(
        platform,
        ScrapeMetricsSource(platform.endpoints),
        local,
        routing=routing,
        seed=seed,
        scaling_overrides=overrides,
    )
