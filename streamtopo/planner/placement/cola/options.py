"""COLA's knobs, its objective f(U, C), and the "no valid solution" answer."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal


class NoValidPlan(ValueError):
    """No fusion and placement satisfies the constraints (Advanced COLA, Section 3.3, phase 2).

    ``reasons`` name the constraint entries (spec field names, as in GraphConstraints labels) that
    cannot be met together, e.g. ``hostExlocation[0]: needs 3 hosts, the cluster has 2``.
    """

    def __init__(self, reasons: list[str]):
        self.reasons = reasons
        super().__init__("no valid plan: " + "; ".join(reasons))


@dataclass(frozen=True)
class ColaOptions:
    """Parameters of Basic and Advanced COLA (Khandekar et al., Middleware 2009).

    ``utilization_weight`` and ``communication_weight`` define f(U, C) (Section 3.2, see
    :meth:`objective`); ``threshold`` is T of phase 4; ``gamma`` scales every host capacity the
    planner sees (Section 4's profiling heuristic). The partitioner knobs say which sparsest-cut
    methods compete per split and how long the Garg-Koenemann flow may run.
    """

    utilization_weight: float = 1.0
    communication_weight: float = 1.0
    threshold: float = 0.5
    gamma: float = 1.0
    phase4_patience: int | None = 24
    """Phase 4 also stops after this many splits without a better f(U, C) (None = only the paper's
    stopping rules). Phase 4 always stops once no plan below can beat the best (a proven bound)."""
    scheduler: Literal["auto", "lpt", "ip"] = "auto"
    """PE scheduler: LPT (Basic COLA), the integer program (3)-(8) at every step, or auto (the IP
    where constraints make greedy placement fragile and for the final placement; see scheduler.py)."""
    ip_time_limit: float = 0.5
    """CP-SAT deterministic time limit per solve (deterministic, so plans repeat under a seed)."""
    ip_gap: float = 0.002
    """Relative optimality gap at which CP-SAT may stop (0 = prove optimality within the time limit)."""
    ip_max_pes: int = 48
    advanced: bool = True
    postprocess: bool = True
    refine_moves: bool = True
    """After the post-processor, Fiduccia-Mattheyses passes move single super operators between PEs to
    lower f(U, C) (Advanced) or the cut (Basic) with U <= 1 throughout (refine.py; not in the paper)."""
    cut_methods: tuple[str, ...] = ("exact", "lr", "spectral", "metis")
    """Sparsest-cut methods tried per split; the sparsest result wins (``exact`` = enumeration on PEs
    of at most ``exact_max_nodes`` super operators, ``lr`` = Leighton-Rao on the Garg-Koenemann flow
    metric, ``spectral`` = Fiedler sweep, ``metis`` = pymetis bisection)."""
    exact_max_nodes: int = 12
    refine: bool = True
    """Polish each split with greedy single-vertex moves that lower ratio (2) (ratio_cut.refine)."""
    epsilon: float = 0.25
    """Garg-Koenemann accuracy; also bounds its number of steps (see multicommodity.py)."""
    gk_max_steps: int = 30
    gk_max_nodes: int = 40
    """Above this many (super-)operators in the PE being split, Leighton-Rao is skipped and the
    spectral and METIS cuts are used (all-pairs shortest paths per step get too slow)."""
    spectral_max_nodes: int = 3000
    """Above this, only METIS is used (the sparse eigensolver dominates the run time)."""

    def __post_init__(self) -> None:
        problems = []
        if self.utilization_weight < 0 or self.communication_weight < 0:
            problems.append("weights must be non-negative")
        if self.threshold < 0:
            problems.append("threshold must be non-negative")
        if not 0 < self.gamma <= 1.0 + 1e-12:
            problems.append("gamma must be in (0, 1]")
        if self.scheduler not in ("auto", "lpt", "ip"):
            problems.append("scheduler must be auto, lpt or ip")
        unknown = set(self.cut_methods) - {"exact", "lr", "spectral", "metis"}
        if unknown or not self.cut_methods:
            problems.append(
                f"cut_methods must be a non-empty subset of exact, lr, spectral, metis "
                f"(got {self.cut_methods})"
            )
        if not 0 < self.epsilon < 1:
            problems.append("epsilon must be in (0, 1)")
        if problems:
            raise ValueError("ColaOptions: " + "; ".join(problems))

    def objective(self, utilization: float, communication: float, capacity: Mapping[str, float]) -> float:
        """f(U, C) = w_U * U + w_C * C / mean host capacity.

        The paper leaves f open ("typically a weighted average", Section 3.2). Dividing C (cores) by
        the mean host capacity puts both terms in units of hosts, as Table 1 reports cut sizes as
        fractions of a host, so weights of 1 and 1 trade a host of traffic for a host of imbalance.
        """
        mean = sum(capacity.values()) / len(capacity)
        return self.utilization_weight * utilization + self.communication_weight * communication / mean
