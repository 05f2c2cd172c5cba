"""``streamtopo run --watch``: a running local topology takes its file's new spec, as the operator takes a
``kubectl apply`` (docs/operator.md, "Spec changes").

Saving the file is the apply. The new spec goes through the same gates as on Kubernetes: the validator
(open key groups keep their running count), the pipeline check the run does before it starts (Spark's
analyzer), then the upgrade decision (planner/upgrade.py, here with the runtime's own sub-window facts,
so it is exact where the operator has to be conservative) and its first half (reconcile.hold_upgrade:
refuse naming the field, or stop every executor and reset what the decision resets). A refused or
invalid spec changes nothing: the run goes on with the spec it has, and the refusal is printed. An
accepted one restarts the executors on the new spec with the next routing version; a change only the
control plane reads (costs, constraints, autoscaling) restarts nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from streamtopo.contracts import RoutingTable
from streamtopo.controller.platform import DesiredState
from streamtopo.controller.reconcile import Outcome, hold_upgrade, problems_message, upgrade_message
from streamtopo.controller.upgrade import ResetReport
from streamtopo.documents import load_topology, read_text
from streamtopo.local.platform import LocalPlatform
from streamtopo.planner.model import StreamTopology, TopologyError
from streamtopo.planner.plan import Plan
from streamtopo.planner.upgrade import plan_upgrade
from streamtopo.runtime.layouts import runtime_facts


@dataclass
class SpecFile:
    """The watched file: reports its text once it changed since it was last taken and reads the same on
    two successive looks.

    Why two: a save that truncates and then writes (most editors, ``Path.write_text``) can be read in
    between, empty or cut short; taking that would refuse a spec the user never wrote.
    """

    path: Path
    seen: str | None = None
    """The text last taken (the running spec's)."""
    settling: str | None = None
    """A new text read once, taken if the next look reads it again."""

    def __post_init__(self) -> None:
        self.seen = self.text()

    def text(self) -> str | None:
        try:
            return read_text(self.path)
        except TopologyError:
            return None  # gone for a moment (a rename-over save): looked at again on the next tick

    def changed(self) -> str | None:
        text = self.text()
        if text is None or text == self.seen:
            self.settling = None
            return None
        if text != self.settling:
            self.settling = text
            return None
        self.seen, self.settling = text, None
        return text


@dataclass(frozen=True)
class Edit:
    """What one change of the file did."""

    message: str
    topology: StreamTopology | None = None
    """The spec now running; None when the change was refused (the old one runs on)."""
    routing: RoutingTable | None = None
    plan: Plan | None = None
    restarted: bool = False
    report: ResetReport | None = None
    """What the reset wrote, with the upgrade point of every generator source."""


def apply_edit(
    text: str,
    current: DesiredState,
    platform: LocalPlatform,
    *,
    prepare: Callable[[StreamTopology], StreamTopology],
    check: Callable[[StreamTopology], None],
    route: Callable[[StreamTopology], tuple[RoutingTable, Plan | None]],
) -> Edit:
    """Apply the file's new ``text`` to the run whose deployment is ``current``.

    ``prepare``: the run's own changes to a spec (rate scale, source limits, loop options); ``check``: the
    pipeline check (raises ValueError naming the operator and field); ``route``: the run's routing for a
    spec (a version to continue from is set here).
    """
    old = current.topology
    try:
        new = prepare(load_topology(text, running=old.spec))
    except TopologyError as error:
        return Edit(f"refused, the running spec stays: {problems_message(error.problems)}")
    if new.metadata.name != old.metadata.name:
        return Edit(f"refused, the running spec stays: metadata.name: the run is {old.metadata.name!r}")
    if new.spec.suspend:
        return Edit("refused, the running spec stays: spec.suspend: a local run stops with Ctrl-C")
    try:
        check(new)
    except ValueError as error:
        return Edit(f"refused, the running spec stays: {error}")
    upgrade = plan_upgrade(old.spec, new.spec, runtime=(runtime_facts(old.spec), runtime_facts(new.spec)))
    held = hold_upgrade(platform, current, new, upgrade)
    if isinstance(held, Outcome):  # refused: a local platform stops its executors at once, so never waiting
        refusal = next((c.message for c in held.conditions if c.type == "Planned"), "")
        return Edit(f"refused, the running spec stays: {refusal}")
    if not upgrade.restart:
        platform.write_topology(new)
        return Edit(
            "applied without a restart (only fields the control plane reads changed)", new, current.routing
        )
    routing, plan = route(new)
    routing = routing.model_copy(update={"version": current.routing.version + 1})
    platform.apply(DesiredState(new, routing))
    return Edit(upgrade_message(upgrade, held), new, routing, plan, restarted=True, report=held)
