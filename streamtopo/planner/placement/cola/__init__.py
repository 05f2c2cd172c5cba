"""COLA: fusing operators into PEs and placing them on hosts (Khandekar et al., Middleware 2009).

``cola_plan`` runs Advanced COLA (phases 1-4 with the six constraint kinds and the IP scheduler) or,
with ``ColaOptions(advanced=False)``, Basic COLA (LPT, no constraints). ``profile_iterations`` is the
Section 4 profiling loop. See docs/cola.md.
"""

from streamtopo.planner.placement.cola.algorithm import cola_plan
from streamtopo.planner.placement.cola.options import ColaOptions, NoValidPlan
from streamtopo.planner.placement.cola.profiling import ProfileIteration, gamma_schedule, profile_iterations

__all__ = [
    "ColaOptions",
    "NoValidPlan",
    "ProfileIteration",
    "cola_plan",
    "gamma_schedule",
    "profile_iterations",
]
