"""What a platform lets its tenants choose, and why a choice is refused.

A :class:`PlatformPolicy` comes from the chart's values (the operator's environment) and is handed to
the model's validators as their context (:data:`POLICY`), so the CLI, the admission webhook and the
reconcile refuse the same things with the same words. No policy (a local run) means the user runs
their own code and images.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PlatformPolicy:
    """What a platform lets its tenants choose (the chart's ``executor`` values), given to validation as
    its context; no policy (a local run) means the user runs their own code and images."""

    udf_modules: tuple[str, ...] = ()
    """Modules UDFs may come from, with their submodules; empty: no UDFs."""
    images: tuple[str, ...] = ()
    """Image name prefixes ``spec.image`` may use besides the platform's runtime image (the spec's
    default); empty: only that image."""
    shared_streams: tuple[str, ...] = ()
    """``<namespace>/<name>`` streams any topology may read (read only) from another namespace; empty:
    named streams are namespace-local."""
    prometheus_urls: tuple[str, ...] = ()
    """URL prefixes a topology's own Prometheus may have (the operator sends requests there from inside
    the cluster, so an open choice would let a tenant reach any internal service); empty: none."""
    max_executors: int | None = None
    """The most executors one topology may ask for (``autoscaling.maxExecutors``, ``replicas``);
    None: the model's own bound."""
    max_key_groups: int | None = None
    """The most key groups of one operator (``keyGroups``, per operator or topology-wide)."""
    max_operators: int | None = None
    """The most operators of one topology."""
    node_keys: tuple[str, ...] = ()
    """Node label and taint keys tenants may select on and tolerate (a key, or a prefix ending in ``/``);
    empty: any key but the cluster's own (:func:`node_key_problem`)."""


POLICY = "policy"
"""Validation-context key of the :class:`PlatformPolicy`."""


def udf_problem(function: str, allowed: Sequence[str] | None) -> str | None:
    """Why a UDF ``module:function`` may not run: never from the standard library or streamtopo itself
    (``os:system``, ``builtins:exec``), and on a platform that lists modules, only from those (or their
    submodules)."""
    module = function.split(":")[0]
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top == "streamtopo":
        return f"{function!r}: UDFs cannot come from the standard library or streamtopo ({top})"
    if allowed is not None and not any(module == m or module.startswith(m + ".") for m in allowed):
        listed = ", ".join(allowed) or "none"
        return f"{function!r}: module {module} is not among the platform's UDF modules ({listed})"
    return None


def image_problem(image: str, default: str, allowed: Sequence[str] | None) -> str | None:
    """Why an executor image may not run: on a platform, anything but its runtime image (the spec's
    default) must start with one of the platform's prefixes; tenants' images run tenants' code next to
    the platform's credentials and nodes."""
    if allowed is None or image == default or any(image.startswith(prefix) for prefix in allowed):
        return None
    listed = ", ".join(allowed) or "none; the platform runs its runtime image only"
    return f"{image!r} is not among the platform's allowed images (prefixes: {listed})"


def shared_stream_problem(stream: str, policy: PlatformPolicy | None) -> str | None:
    """Why a source may not read ``stream``: on a platform, a stream of another namespace
    (``<namespace>/<name>``) must be one the platform shares. Locally there are no namespaces to guard."""
    if policy is None or "/" not in stream or stream in policy.shared_streams:
        return None
    shared = ", ".join(policy.shared_streams) or "none"
    return f"{stream!r} is another namespace's stream, which the platform does not share (shared: {shared})"


SCHEDULING_LABELS = (
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
)
"""The well-known node labels under kubernetes.io/ a tenant may select on; every other key there, and
under k8s.io/, is the cluster's (node roles, lifecycle taints such as not-ready or unschedulable)."""


def node_key_problem(key: str | None, policy: PlatformPolicy | None) -> str | None:
    """Why a tenant may not select on or tolerate node key ``key`` (None: a toleration of every taint).

    On a platform the cluster's own keys are refused (selecting control-plane nodes and tolerating their
    taint would put tenant code beside the cluster's secrets), and with ``policy.node_keys`` only the
    listed keys or prefixes pass. Locally (no policy) anything goes: there are no nodes to protect.
    """
    if policy is None:
        return None
    if key is None:
        return "a toleration without a key tolerates every taint, the cluster's own included"
    domain = key.split("/")[0] if "/" in key else ""
    if domain.endswith(("kubernetes.io", "k8s.io")) and key not in SCHEDULING_LABELS:
        return f"{key!r} belongs to the cluster (of its keys only {', '.join(SCHEDULING_LABELS)} may be used)"
    allowed = policy.node_keys
    if allowed and not any(key == a or (a.endswith("/") and key.startswith(a)) for a in allowed):
        return f"{key!r} is not among the platform's node keys ({', '.join(allowed)})"
    return None
