"""Flux (Shah et al., ICDE 2003) as ALBIC's paper describes it (Sec. 2.2 and 5.1), on key groups.

At the end of each period the executors are sorted by load (percent of their own capacity); the most
loaded is paired with the least loaded, the second with the second least, and so on. For each pair the
biggest *suitable* key group (unit) of the heavy executor moves to the light one, where suitable means
the move lowers the pair's larger load (the key group is smaller than the gap). Passes repeat, re-sorting
each time, until no pair can improve or the migration bound (the same maxMigrations / maxMigrCost the
MILP gets) is spent. Executors marked for removal are donors ahead of every other and never receive.
PE co-location units move whole; moves that would break a PlacementRule or a memory cap are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamtopo.planner.allocation import AllocationState, Rebalance
from streamtopo.planner.rebalance.albic.metrics import build_rebalance
from streamtopo.planner.rebalance.albic.moves import MoveBook
from streamtopo.planner.rebalance.albic.state import check_budget, index_state


@dataclass(frozen=True)
class FluxConfig:
    min_gap: float = 0.0
    """Pairs whose load gap (percentage points) is at most this are left alone (Flux's threshold)."""
    max_passes: int = 1000


def flux_rebalance(
    state: AllocationState,
    *,
    max_migrations: int | None = None,
    max_migration_cost: float | None = None,
    config: FluxConfig | None = None,
    seed: int = 0,
) -> Rebalance:
    """One Flux round; deterministic (ties by executor name), ``seed`` is unused."""
    config = config or FluxConfig()
    check_budget(max_migrations, max_migration_cost)
    ix = index_state(state)
    book = MoveBook(state, ix, max_migrations, max_migration_cost)
    passes = 0
    while passes < config.max_passes and book.budget_left():
        passes += 1
        if not _one_pass(book, config):
            break
    return build_rebalance(
        state,
        ix,
        book.assignment,
        details={"passes": passes},
        reason=f"flux: {book.count} migration(s) in {passes} pass(es)",
    )


def _one_pass(book: MoveBook, config: FluxConfig) -> bool:
    active = sorted((n for n in book.ix.names if n not in book.marked), key=lambda n: (book.util(n), n))
    draining = sorted(
        (n for n in book.marked if book.load[n] > 0 or book.units_on(n)), key=lambda n: (-book.util(n), n)
    )
    donors = draining + active[::-1]
    receivers = active
    moved = False
    for heavy, light in zip(donors, receivers[: len(donors)]):
        if heavy == light or not book.budget_left():
            continue
        gap = book.util(heavy) - book.util(light)
        if heavy not in book.marked and gap <= config.min_gap:
            continue
        best = None
        for unit in book.units_on(heavy):
            size = book.unit_load(unit)
            new_heavy = book.util(heavy) - size / book.cap[heavy]
            new_light = book.util(light) + size / book.cap[light]
            suitable = heavy in book.marked or max(new_heavy, new_light) < book.util(heavy) - 1e-9
            if suitable and (best is None or size > best[0]) and book.can_move(unit, light):
                best = (size, unit)
        if best is not None:
            book.move(best[1], light)
            moved = True
    return moved
