"""Aeolus (Sax et al., ICDE 2014): Eq. 2-4 and Algorithm 1 against hand computations written out here."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamtopo.planner.model import StreamTopologySpec
from streamtopo.planner.scaling.aeolus import (
    aeolus_plan,
    initial_executors,
    open_key_groups,
    optimal_batch,
    optimal_dop,
    output_rate,
)
from streamtopo.planner.scaling.policy import ScalingConfig

N, S, T = 1e-4, 1e-8, 100  # 100 us per message, 10 ns per byte, 100-byte records: t*s = 1e-6 s


def chain(
    rate: float = 100_000, max_bytes: int = 65536, size: int | None = None, **extra
) -> StreamTopologySpec:
    return StreamTopologySpec.model_validate(
        {
            "keyGroups": 8,
            "batching": {"maxBytes": max_bytes, **({"size": size} if size else {})},
            "operators": [
                {
                    "name": "src",
                    "kind": "source",
                    "source": {"generator": "sequence", "ratePerSecond": rate},
                    "recordBytes": T,
                },
                {
                    "name": "m",
                    "kind": "map",
                    "inputs": ["src"],
                    "select": ["value"],
                    "recordBytes": T,
                    "selectivity": 1.0,
                    **extra,
                },
                {"name": "out", "kind": "sink", "inputs": ["m"], "sink": {"console": {}}},
            ],
        }
    )


PPT = {"src": 2e-6, "m": 50e-6, "out": 1e-6}


def test_eq2_is_strict() -> None:
    # ppt * r_i = 5e-5 * 1e5 = 5.0 exactly: 5 tasks would be 100 % busy, Eq. 2 asks dop > 5.
    assert optimal_dop(50e-6, 100_000) == 6
    assert optimal_dop(50e-6, 90_000) == 5  # 4.5 -> 5
    assert optimal_dop(0.0, 100_000) == 1


def test_eq3_and_eq4_by_hand() -> None:
    # Source task: l_i = 1/1e5 = 1e-5 s; unbatched it needs ppt + n + t*s = 2e-6 + 1e-4 + 1e-6 = 1.03e-4 > l_i.
    # Eq. 4: b >= n / (l_i - ppt - t*s) = 1e-4 / (1e-5 - 2e-6 - 1e-6) = 1e-4 / 7e-6 = 14.29 -> 15.
    assert optimal_batch(1e-5, 2e-6, N, T, S) == 15
    # Eq. 3 with b = 15: 15 / max(15 * 1e-5, 1e-4 + 15 * 3e-6) = 15 / max(1.5e-4, 1.45e-4) = 1e5.
    assert output_rate(15, 1e-5, 2e-6, N, T, S) == pytest.approx(100_000)
    # With b = 14 shipping still dominates: 14 / (1e-4 + 14 * 3e-6) = 14 / 1.42e-4 = 98591.5 < 1e5.
    assert output_rate(14, 1e-5, 2e-6, N, T, S) == pytest.approx(14 / 1.42e-4)
    # Unbatched: r_o = 1 / max(l_i, ppt + n + t*s) = 1 / 1.03e-4.
    assert output_rate(1, 1e-5, 2e-6, N, T, S) == pytest.approx(1 / 1.03e-4)
    # No batch can keep up when l_i <= ppt + t*s.
    assert math.isinf(optimal_batch(3e-6, 2e-6, N, T, S))


def test_algorithm1_on_a_chain_by_hand() -> None:
    plan = aeolus_plan(chain(), PPT, n=N, s=S)
    # src: dop = floor(2e-6 * 1e5) + 1 = 1; batch 15 (above); r_o = 1 * 1e5.
    # m: r_i = 1e5, ppt * r_i = 5 -> Eq. 2 gives 6. Per task l_i = 6 / 1e5 = 6e-5;
    #    unbatched 5e-5 + 1e-4 + 1e-6 = 1.51e-4 > 6e-5 -> Eq. 4: 1e-4 / (6e-5 - 5e-5 - 1e-6) = 11.1 -> 12.
    #    Eq. 3 per task: 12 / max(12 * 6e-5, 1e-4 + 12 * 5.1e-5) = 12 / 7.2e-4 = 16666.7; x 6 tasks = 1e5.
    # out: ppt * r_i = 0.1 -> 1.
    assert plan.dop == {"src": 1, "m": 6, "out": 1}
    assert plan.batch_sizes == {"src->m": 15, "m->out": 12}
    assert plan.output_rate["m->out"] == pytest.approx(6 * 12 / 7.2e-4)
    assert plan.input_rate["out"] == pytest.approx(100_000)
    assert plan.warnings == []


def test_bmax_cap_raises_the_producers_dop() -> None:
    # B_max = 800 bytes = 8 records. src would need 15 > 8: line 7 raises its dop until the capped
    # batch suffices: dop >= r * (ppt + t*s + n/8) = 1e5 * (2e-6 + 1e-6 + 1.25e-5) = 1.55 -> 2.
    # Then l_i = 2e-5 and Eq. 4 gives 1e-4 / (2e-5 - 3e-6) = 5.88 -> 6.
    # m: Eq. 2 gives 6 (above), Eq. 4 at dop 6 gives 12 > 8: dop >= 1e5 * (5e-5 + 1e-6 + 1.25e-5) = 6.35 -> 7;
    #    l_i = 7e-5, b = 1e-4 / (7e-5 - 5.1e-5) = 5.26 -> 6.
    plan = aeolus_plan(chain(max_bytes=800), PPT, n=N, s=S)
    assert plan.dop == {"src": 2, "m": 7, "out": 1}
    assert plan.batch_sizes == {"src->m": 6, "m->out": 6}
    assert all(b <= 8 for b in plan.batch_sizes.values())


def test_no_batching_when_the_input_is_slow() -> None:
    # 100 rec/s: l_i = 0.01 s > ppt + n + t*s, so line 4 keeps b = 1 and r_o = 1 / l_i = 100.
    plan = aeolus_plan(chain(rate=100), PPT, n=N, s=S)
    assert plan.batch_sizes == {"src->m": 1, "m->out": 1}
    assert plan.output_rate["src->m"] == pytest.approx(100)


def test_fixed_batch_size_overrides_eq4() -> None:
    plan = aeolus_plan(chain(size=50), PPT, n=N, s=S)
    assert plan.batch_sizes == {"src->m": 50, "m->out": 50}
    # Eq. 3 with b = 50 at the source: 50 / max(50 * 1e-5, 1e-4 + 50 * 3e-6) = 50 / 5e-4 = 1e5.
    assert plan.output_rate["src->m"] == pytest.approx(100_000)


def test_selectivity_scales_the_edge_rate() -> None:
    spec = chain(selectivity=0.25)
    plan = aeolus_plan(spec, PPT, n=N, s=S)
    assert plan.input_rate["out"] == pytest.approx(25_000)


def test_profiled_cost_gives_ppt_and_key_group_warning() -> None:
    # cost.cpu = 2 cores at 1e5 rec/s -> ppt = 2e-5; Eq. 2: 2e-5 * 1e5 = 2 -> 3 tasks; l_i = 3e-5 and
    # Eq. 4: 1e-4 / (3e-5 - 2e-5 - 1e-6) = 11.1 -> 12 records per batch.
    spec = chain(cost={"cpu": 2.0}, keyGroups=2)
    plan = aeolus_plan(spec, {"src": 2e-6, "out": 1e-6}, n=N, s=S)
    assert plan.dop["m"] == 3
    assert plan.batch_sizes["m->out"] == 12
    assert any("'m'" in w and "keyGroups" in w for w in plan.warnings)


def test_bad_measurement_is_named() -> None:
    with pytest.raises(ValueError, match=r"measured\['m'\]"):
        aeolus_plan(chain(), {"m": float("nan")})
    with pytest.raises(ValueError, match="^n:"):
        aeolus_plan(chain(), PPT, n=-1.0)


@settings(max_examples=40, deadline=None)
@given(rate=st.floats(10, 1e6), ppt=st.floats(1e-7, 1e-3), n=st.floats(1e-6, 1e-3), t=st.integers(8, 2000))
def test_eq2_and_eq4_are_minimal(rate: float, ppt: float, n: float, t: int) -> None:
    dop = optimal_dop(ppt, rate)
    assert dop > ppt * rate * (1 - 1e-9) and dop - 1 <= ppt * rate * (1 + 1e-9)
    latency = dop / rate
    b = optimal_batch(latency, ppt, n, t, S)
    if math.isfinite(b):
        assert b * latency >= n + b * (ppt + t * S) - 1e-12  # Eq. 4's condition holds at b ...
        if b > 1:
            assert (b - 1) * latency < n + (b - 1) * (ppt + t * S)  # ... and not at b - 1


def test_demand_and_initial_executors_by_hand() -> None:
    plan = aeolus_plan(chain(), PPT, n=N, s=S)
    # Processing: 1e5 * (2e-6 + 5e-5 + 1e-6) = 5.3 cores. Shipping: src->m 1e5 * (1e-4 / 15 + 1e-6) and
    # m->out 1e5 * (1e-4 / 12 + 1e-6).
    shipping = 1e5 * (1e-4 / 15 + 1e-6) + 1e5 * (1e-4 / 12 + 1e-6)
    assert plan.demand == pytest.approx(5.3 + shipping)  # 7.0 cores
    config = ScalingConfig(min_executors=1, max_executors=32, target_utilization=0.75)
    assert initial_executors(plan, config) == math.ceil((5.3 + shipping) / 0.75)  # 7.0 / 0.75 -> 10
    assert initial_executors(plan, ScalingConfig(max_executors=4)) == 4


def open_chain(**extra) -> dict:
    """chain() as a document whose spec leaves keyGroups open."""
    doc = chain(**extra).model_dump(by_alias=True, exclude_unset=True)
    del doc["keyGroups"]
    return doc


def test_key_groups_left_open_follow_eq2_with_headroom() -> None:
    # cost.cpu = 40 cores at 1e5 rec/s -> ppt = 4e-4; Eq. 2: 4e-4 * 1e5 = 40 -> 41 tasks; twice that is
    # 82 -> 128 key groups (a power of two). src and out are light: they keep the default 32.
    spec = StreamTopologySpec.model_validate(open_chain(cost={"cpu": 40.0}))
    assert aeolus_plan(spec).dop["m"] == 41
    assert open_key_groups(spec) == {"m": 128}
    assert open_key_groups(spec, limit=64) == {"m": 64}  # the platform's maxKeyGroups caps it
    # 16 tasks fit the default 32 key groups at the headroom of 2: nothing to size
    light = StreamTopologySpec.model_validate(open_chain(cost={"cpu": 15.5}))
    assert aeolus_plan(light).dop["m"] == 16 and open_key_groups(light) == {}
    # a spec-wide keyGroups, or the operator's own, is the user's choice and stays
    assert open_key_groups(chain(cost={"cpu": 40.0})) == {}
    assert (
        open_key_groups(StreamTopologySpec.model_validate(open_chain(cost={"cpu": 40.0}, keyGroups=4))) == {}
    )


def test_every_reader_of_a_topology_sees_the_sized_key_groups(tmp_path) -> None:
    """load_topology (run, plan, webhook, reconcile, executors) sizes the open operators once; the sized
    topology written back out reads the same."""
    import yaml

    from streamtopo.documents import load_topology

    document = {"metadata": {"name": "heavy"}, "spec": open_chain(cost={"cpu": 40.0})}
    topology = load_topology(document)
    assert topology.spec.key_groups_of("m") == 128 and topology.spec.key_groups_of("src") == 32
    assert not aeolus_plan(topology.spec).warnings
    written = tmp_path / "topology.yaml"
    written.write_text(yaml.safe_dump(topology.model_dump(mode="json", by_alias=True, exclude_none=True)))
    assert load_topology(written).spec.key_groups_of("m") == 128
