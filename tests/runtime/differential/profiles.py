"""How much the differential harness runs: the bounded profile (CI, a few minutes) or the long one.

    STREAMTOPO_DIFFERENTIAL=long [STREAMTOPO_DIFFERENTIAL_SEED=N] [STREAMTOPO_DIFFERENTIAL_EXAMPLES=N]

The bounded profile has a fixed seed per test (the same examples every run, so CI is stable) and does not shrink
(a failure prints the whole case and the branch that differs). The long profile draws ``examples``
cases per path from a seed (printed, random unless given) and shrinks each distinct failure to a minimal
case (hypothesis gives up shrinking after five minutes per failure).
"""

from __future__ import annotations

import os
import random
import zlib
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, settings

ENV, SEED_ENV, EXAMPLES_ENV = (
    "STREAMTOPO_DIFFERENTIAL",
    "STREAMTOPO_DIFFERENTIAL_SEED",
    "STREAMTOPO_DIFFERENTIAL_EXAMPLES",
)


@dataclass(frozen=True)
class Profile:
    name: str
    pipeline_examples: int
    """Cases per pipeline path (each is one run of a topology of several branches)."""
    cli_examples: int
    """Cases per ``streamtopo run`` executor count (each starts executor processes, their JVMs)."""
    component_examples: int
    max_records: int
    seed: int | None

    def seed_for(self, test: str) -> int:
        """The long profile's seed; in the bounded one a fixed seed per test (the same cases every run,
        different cases on each path)."""
        return self.seed if self.seed is not None else zlib.crc32(test.encode())

    def settings(self, examples: int) -> settings:
        phases = [Phase.explicit, Phase.reuse, Phase.generate] + (
            [Phase.shrink] if self.name == "long" else []
        )
        return settings(
            max_examples=examples,
            deadline=None,
            phases=phases,
            suppress_health_check=[
                HealthCheck.too_slow,
                HealthCheck.data_too_large,
                HealthCheck.filter_too_much,
            ],
            report_multiple_bugs=True,
            print_blob=True,
        )


def current() -> Profile:
    if os.environ.get(ENV, "bounded") != "long":
        return Profile(
            "bounded", pipeline_examples=3, cli_examples=0, component_examples=10, max_records=24, seed=None
        )
    seed = int(os.environ.get(SEED_ENV) or random.SystemRandom().randrange(2**32))
    examples = int(os.environ.get(EXAMPLES_ENV) or 40)
    print(f"\ndifferential harness: long profile, seed {seed}, {examples} examples per path")
    return Profile("long", examples, max(2, examples // 10), examples * 10, max_records=48, seed=seed)


PROFILE = current()
