"""Plan data made on first read (simulator/cluster/collective_plan.py, engine/lowering.py): a
moved plan's flows and every phase's (link, weight) pairs are made only when read, and then
equal those of the plan built without translation, to the bit."""

import pytest

from simulator.catalog import default_catalog
from simulator.cluster import collectives
from simulator.cluster.builders import build_cluster
from simulator.cluster.collectives import CollectivePlanner
from simulator.cluster.routing import Router
from simulator.engine.lowering import lower_plans
from tests.test_translation import FABRICS, _scenario


def _planners(nodes: int) -> tuple[CollectivePlanner, CollectivePlanner]:
    out = []
    for translate in (True, False):
        cluster = build_cluster(_scenario(nodes, FABRICS["fat-tree"]).cluster, default_catalog(), replicated=True)
        planner = CollectivePlanner(cluster, Router(cluster))
        planner.translate = translate
        out.append(planner)
    return out[0], out[1]


def test_moved_flows_and_pairs_made_on_first_read() -> None:
    """16 nodes of a fat tree (period 4 nodes = 32 GPUs). The data-parallel ring of local GPU 0
    on nodes 4..11 (GPUs 32, 40, ..., 88) is the ring on nodes 0..7 moved by 32 GPUs: 8 flows,
    none made, and no pairs made, until read; then equal to the ring routed flow by flow."""
    moved, routed = _planners(16)
    group = tuple(range(32, 96, 8))
    plan = moved.plan("all_gather", "ring", group)
    phase = plan.phases[0]
    assert phase.__dict__["_flows"] is None and phase.__dict__["_link_weights"] is None
    lowered = lower_plans([plan], [1])[0].groups[0]
    assert lowered.__dict__["_flows"] is phase  # lowering reads no flow either
    assert phase.__dict__["_flows"] is None
    reference = routed.plan("all_gather", "ring", group).phases[0]
    assert len(phase.flows) == 8 and phase.flows == reference.flows and lowered.flows == reference.flows
    assert phase.link_weights == reference.link_weights
    assert plan == routed.plan("all_gather", "ring", group)


def test_rings_of_one_group_route_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A group's all-gather, reduce-scatter and all-reduce rings cross the same (source,
    destination) pairs in the same order: each planner lists their routes once (2 calls of
    route_terms for the two planners, not 6), and each phase's weights are still its own (ring
    factors (n-1)/n and 2(n-1)/n), equal between the translating and the routing planner."""
    moved, routed = _planners(16)
    calls = []
    real = collectives.route_terms
    monkeypatch.setattr(collectives, "route_terms", lambda *a: calls.append(1) or real(*a))
    group = tuple(range(0, 128, 8))
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        assert moved.plan(op, "ring", group) == routed.plan(op, "ring", group)
    assert len(calls) == 2
