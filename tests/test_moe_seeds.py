"""The routing imbalance's spread over seeds (issue 15 item 4): the Result reports the slowdown's
mean and 10th / 90th percentiles over ``training.moe_routing.seeds`` analytic redraws, and the
time above balance they imply, without simulating each seed; the draws are bounded by a limit."""

from __future__ import annotations

import pytest

from simulator import limits
from simulator.costs.moe import SeedSpread, routing_imbalance, spread_over_seeds
from simulator.results.moe import moe_lines, moe_summary
from simulator.scenario.loader import scenario_from_mapping
from simulator.workload.moe import imbalance_of, imbalance_over_seeds
from tests.test_moe import MIXTRAL, mixtral


def test_percentiles_over_seeds() -> None:
    """11 factors 1.0, 1.1, ..., 2.0: mean 1.5; p10 at position 0.1 x 10 = 1 -> 1.1; p90 at 9 -> 1.9.
    4 factors 1, 2, 3, 4: p10 at 0.3 -> 1 + 0.3 x 1 = 1.3; p90 at 2.7 -> 3 + 0.7 = 3.7."""
    s = spread_over_seeds([1.0 + i / 10 for i in range(11)])
    assert (s.seeds, s.mean, s.p10, s.p90) == (11, pytest.approx(1.5), pytest.approx(1.1), pytest.approx(1.9))
    s = spread_over_seeds([1.0, 2.0, 3.0, 4.0])
    assert (s.p10, s.p90) == (pytest.approx(1.3), pytest.approx(3.7))


def test_time_above_balance_at_the_percentiles() -> None:
    """expert 1.0 s + all-to-all 0.5 s at slowdown 1.5: balanced 1.0 s, 0.5 s above it; at p10 1.2 and
    p90 1.8 the same balanced second gives 0.2 s and 0.8 s."""
    s = moe_summary(params_total=1, params_active=1, ep=8, edp=1, factor=1.5, spread=0.1, dropped=0.0,
                    expert_compute_s=1.0, all_to_all_s=0.5, step_time_s=10.0, seeds=SeedSpread(8, 1.4, 1.2, 1.8))
    assert s.imbalance_s == pytest.approx(0.5)
    assert (s.imbalance_s_p10, s.imbalance_s_p90) == (pytest.approx(0.2), pytest.approx(0.8))
    assert s.imbalance_seeds == 8 and s.imbalance_slowdown_seed_mean == 1.4
    assert any(label.strip() == "over seeds" and "p10 x1.200 to p90 x1.800" in text for label, text in moe_lines(s))


def test_each_seed_is_its_own_draw_and_the_first_is_the_simulated_one() -> None:
    """Mixtral, ep 8, skew 0.2, seed 5, 4 seeds: the factors are routing_imbalance's with seeds
    5, 6, 7, 8 over the rank's 4096 tokens; the simulated step uses seed 5's."""
    sc = mixtral(training__moe_routing={"skew": 0.2, "seed": 5, "seeds": 4})
    got = imbalance_over_seeds(sc)
    factors = [routing_imbalance(experts=8, ep=8, tokens=4096, top_k=2, skew=0.2, seed=s, samples=16).factor
               for s in (5, 6, 7, 8)]
    assert got == spread_over_seeds(factors) and got.seeds == 4
    assert imbalance_of(sc).factor == factors[0]
    assert len(set(factors)) == 4 and got.p10 < got.p90


def test_balance_has_no_spread() -> None:
    """skew 0: every seed gives factor 1; the 8 default seeds are reported, all at 1."""
    assert imbalance_over_seeds(mixtral()) == SeedSpread(8, 1.0, 1.0, 1.0)


def test_routing_draws_are_limited() -> None:
    """samples 4096 x seeds 32 = 131,072 draws > routing_draws = 65,536; samples 4096 alone with the
    default 8 seeds (32,768) is accepted."""
    data = {"model": dict(MIXTRAL), "cluster": {"node": "p5.48xlarge", "nodes": 2}, "parallelism": {"ep": 8},
            "training": {"global_batch": 32, "micro_batch": 1, "moe_routing": {"samples": 4096, "seeds": 32}}}
    with pytest.raises(limits.LimitError, match="routing_draws=65,536"):
        scenario_from_mapping(data)
    data["training"]["moe_routing"] = {"samples": 4096}
    assert scenario_from_mapping(data).training.moe_routing.seeds == 8
