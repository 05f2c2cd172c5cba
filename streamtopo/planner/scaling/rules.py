"""The scaling rules by name, as ``spec.autoscaling.rule``, scenario files and ``simulate --scaling`` name them."""

from __future__ import annotations

from streamtopo.planner.scaling.dstreams import decide_dstreams
from streamtopo.planner.scaling.policy import Scaler, decide_off, decide_target

RULES: dict[str, Scaler] = {"target": decide_target, "dstreams": decide_dstreams, "off": decide_off}
SCALING_RULES = tuple(RULES)


def scaler(name: str) -> Scaler:
    """The rule called ``name``: ``target``, ``dstreams`` or ``off``."""
    if name not in RULES:
        raise ValueError(f"unknown scaling rule {name!r}: use one of {', '.join(sorted(RULES))}")
    return RULES[name]
