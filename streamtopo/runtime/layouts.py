"""The state layouts an executor restores its units under: planner/upgrade.py's facts, with what only the
runtime decides: the sub-window (pane) a windowed aggregate keeps its state in, which follows the
aggregates it shares panes with and their rates (runtime/operators/shared_panes.py), and the format
operators encode state in (a runtime version's).

The executor stores each operator's digest beside its units' committed state and is refused a unit
written under another (runtime/state_store.py); ``streamtopo run --watch`` gives the same facts to the
upgrade decision, so it refuses or resets such a change before anything stops.
"""

from __future__ import annotations

from collections.abc import Iterable

from streamtopo.planner.model import StreamTopologySpec
from streamtopo.planner.upgrade import RuntimeFacts, fingerprint, has_state
from streamtopo.runtime.operators import SharedPanes, sharing_groups

STATE_FORMAT = "2"
"""The encoding operators write their state in (``UnitOperator.encode_state``): bump it with any change
of what an operator writes, so executors of a new runtime refuse state an older one wrote instead of
misreading it (2: Spark's partial buffers, runtime/operators/folds.py)."""


def runtime_facts(spec: StreamTopologySpec, sharing: Iterable[SharedPanes] | None = None) -> RuntimeFacts:
    """Operator -> facts for every stateful operator: the state format, and for a windowed aggregate its
    group's pane in seconds, or ``own`` (its own window's). ``sharing``: the groups the executors build
    (default: the spec's)."""
    groups = sharing_groups(spec) if sharing is None else sharing
    panes = {member: str(group.pane) for group in groups for member in group.members}
    return {
        op.name: {"format": STATE_FORMAT}
        | ({"pane": panes.get(op.name, "own")} if op.kind == "aggregate" and op.window is not None else {})
        for op in spec.operators
        if has_state(op)
    }


def layouts(spec: StreamTopologySpec, sharing: Iterable[SharedPanes]) -> dict[str, str]:
    """Operator -> the digest of its state layout ("" for a stateless one)."""
    facts = runtime_facts(spec, list(sharing))
    return {op.name: fingerprint(spec, op.name, facts) for op in spec.operators}
