"""The ``deepep`` dispatcher (issue 15 item 3): DeepEP's normal dispatch / combine kernels as a
two-hop all-to-all on the real links (NVLink inside a node; RDMA to the same-index GPU of the
destination node, then NVLink forwarding), each token sent once per destination rank and
node, fp8 dispatch with scales, run through the engine's flows.

Sources: DeepEP README "Performance" (deepseek-ai/DeepEP at 0aaa674: H800, ~160 GB/s NVLink,
CX7 400 Gb/s RDMA; 4096 tokens, hidden 7168, top-4 groups, top-8 experts, fp8 dispatch, bf16
combine); DeepEP tests/test_internode.py at 499ec88 (fp8 bytes = bf16 x (1 + 4/128) / 2);
DeepSeek-V3, arXiv:2412.19437 §3.2.2 (IB to the same-index GPU, NVLink forwarding, at most 4
nodes a token) and §3.3.2 (fp8 dispatch, bf16 combine).
"""

from __future__ import annotations

import math

import pytest

import simulator
from simulator.cli.schema import json_schema_of
from simulator.cluster import Router, build_cluster
from simulator.cluster.collective_algorithms import deepep_algorithm
from simulator.cluster.collectives import CollectivePlanner
from simulator.costs.moe import deepep_fanout, deepep_token_bytes, hit_probability
from simulator.errors import InfeasibleError, ScenarioError
from simulator.run import simulate_collective
from simulator.scenario import ClusterSpec
from simulator.scenario.spec import Scenario
from simulator.workload.activations import shard_of
from simulator.workload.moe import moe_shape
from simulator.workload.parallel import layer_steps
from simulator.workload.steps import CommStep, LayerSpec
from tests.test_moe import MIXTRAL

NVLINK_BPS = 200e9 * 0.68  # H800 NVLink one direction x DeepEP's measured efficiency (topologies/gpus.yaml)
IB_BPS = 50e9 * 0.90  # 400 Gb/s NDR x InfiniBand efficiency (topologies/transports.yaml)


def _miss(pool: int, owned: int, k: int) -> float:
    """P(k draws without replacement from pool avoid the owned ones) = prod (pool-owned-i)/(pool-i)."""
    return math.prod((pool - owned - i) / (pool - i) for i in range(k))


def test_token_bytes_fp8_with_scales_and_bf16() -> None:
    """hidden 7168: fp8 7168 x 1 B + 7168/128 = 56 scales x 4 B = 7,392 B; bf16 7168 x 2 = 14,336 B;
    7392 / 14336 = (1 + 4/128) / 2 = 0.515625 (DeepEP's fp8_factor)."""
    assert deepep_token_bytes(7168, True) == 7392.0
    assert deepep_token_bytes(7168, False) == 14336.0
    assert 7392 / 14336 == (1 + 4 / 128) / 2


def test_fanout_uniform_and_node_limited() -> None:
    """256 experts, top-8. EP 8 on one node: a rank owns 32, P(rank) = 1 - prod_{i<8} (224-i)/(256-i)
    = 0.6618. EP 64 on 8 nodes with at most 4 nodes a token: the 8 experts come from 4 x 32 = 128
    experts of 4 chosen nodes; P(node) = 4/8 x (1 - prod (96-i)/(128-i)) = 0.4536, P(rank) = 4/8 x
    (1 - prod (124-i)/(128-i)) = 0.1150."""
    rank, node = deepep_fanout(256, 8, 8, 1, None)
    assert rank == pytest.approx(1 - _miss(256, 32, 8)) and rank == pytest.approx(0.6618, abs=1e-4)
    assert node == 1.0
    rank, node = deepep_fanout(256, 8, 64, 8, 4)
    assert node == pytest.approx(0.5 * (1 - _miss(128, 32, 8))) and node == pytest.approx(0.4536, abs=1e-4)
    assert rank == pytest.approx(0.5 * (1 - _miss(128, 4, 8))) and rank == pytest.approx(0.1150, abs=1e-4)
    assert hit_probability(10, 5, 6) == 1.0  # 6 draws cannot all miss 5 of 10


def test_two_hop_flows_go_to_the_same_index_gpu() -> None:
    """Plain deepep over GPUs 0, 1 (node 0) and 8, 9 (node 1), D what a rank sends: 0 -> 1 carries
    D/4 over NVLink, 0 -> 8 (local index 0 on node 1) the node's g/n = 2/4 over RDMA, 8 forwards
    D/4 to 9; nothing goes 0 -> 9 directly. NVLink hops weigh 0.822 / 0.68 per byte (the links
    carry NCCL's efficiency, DeepEP reaches its own)."""
    c = build_cluster(ClusterSpec.model_validate({"node": "dgx-h800", "nodes": 2}))
    plan = CollectivePlanner(c, Router(c)).plan("all_to_all", "deepep", (0, 1, 8, 9))
    flows = {(f.src, f.dst): f.weight for f in plan.phases[0].flows if f.src == 0 or f.dst == 9}
    nv = 0.822 / 0.68
    assert flows[(0, 1)] == pytest.approx(0.25 * nv) and flows[(0, 8)] == 0.5 and flows[(8, 9)] == pytest.approx(0.25 * nv)
    assert (0, 9) not in flows and len(plan.phases) == 1


def _bandwidth_s(nodes: int, algorithm: str, nbytes: float) -> float:
    """The engine's time of the all-to-all over every GPU minus its fixed latency: t(2D) - t(D)."""
    spec = {"node": "dgx-h800", "nodes": nodes}
    return simulate_collective(spec, "all_to_all", 2 * nbytes, algorithm) - simulate_collective(
        spec, "all_to_all", nbytes, algorithm)


D = 4096 * 7392.0  # DeepEP README's batch: 4096 tokens of hidden 7168 in fp8 with scales


def test_two_nodes_are_nvlink_bound() -> None:
    """EP 16 on 2 DGX H800, 256 experts, top-8, no node limit: P(rank) = 1 - prod (240-i)/(256-i)
    = 0.4078, P(node) = 1 - prod (128-i)/(256-i) = 0.9966. A GPU's NVLink port sends 7 x P(rank) x
    D to its node and forwards 7 x P(rank) x D for the same-index GPU of the other node: 14 x
    0.4077 x D / (200 GB/s x 0.68, DeepEP's NVLink efficiency) = 1.271 ms; its NIC sends 0.9966 x D /
    45 GB/s = 0.671 ms. NVLink sets the pace."""
    p_rank, p_node = 1 - _miss(256, 16, 8), 1 - _miss(256, 128, 8)
    nvlink, nic = 14 * p_rank * D / NVLINK_BPS, p_node * D / IB_BPS
    assert nvlink == pytest.approx(1.271e-3, rel=1e-3) and nic < nvlink
    assert _bandwidth_s(2, deepep_algorithm(256, 8, None), D) == pytest.approx(nvlink, rel=1e-6)


def test_eight_nodes_node_limited_are_rdma_bound() -> None:
    """EP 64 on 8 DGX H800, at most 4 nodes a token: each GPU's NIC sends P(node) x D to each of
    the 7 other nodes, 7 x 0.4536 x D / 45 GB/s = 2.137 ms; its NVLink port 7 x P(rank) x D local
    plus 7 x 7 x P(rank) x D forwarded = 56 x 0.1150 x D / 136 GB/s = 1.434 ms. RDMA sets the pace.
    Logical bandwidth as DeepEP's test counts it (each token once per node, the own node too):
    8 x 0.4536 x D / 2.137 ms = 8/7 x 45 GB/s = 51.4 GB/s, beside the README's 51 GB/s (dispatch, EP 64)."""
    p_rank, p_node = 0.5 * (1 - _miss(128, 4, 8)), 0.5 * (1 - _miss(128, 32, 8))
    nic, nvlink = 7 * p_node * D / IB_BPS, 56 * p_rank * D / NVLINK_BPS
    assert nic == pytest.approx(2.137e-3, rel=1e-3) and nvlink < nic
    t = _bandwidth_s(8, deepep_algorithm(256, 8, 4), D)
    assert t == pytest.approx(nic, rel=1e-6)
    assert 8 * p_node * D / t == pytest.approx(8 / 7 * IB_BPS, rel=1e-6)


def _scenario(**moe: object) -> Scenario:
    """DeepSeek-V3 (hidden 7168, 256 experts, top-8) at sequence 1024, ep 16 on 2 DGX H800."""
    return Scenario.model_validate({
        "model": {"preset": "deepseek-v3", "seq_len": 1024}, "cluster": {"node": "dgx-h800", "nodes": 2},
        "parallelism": {"pp": 1, "ep": 16, "sharding": "zero1", "moe": {"dispatcher": "deepep", **moe}},
        "training": {"micro_batch": 1, "global_batch": 16, "recompute": "full"}})


def _comms(sc: Scenario, phase: str) -> list[tuple[str, str, str, float, str | None]]:
    spec = LayerSpec(sc.model, shard_of(sc), "block", phase, moe=moe_shape(sc))
    return [(s.name, s.op, s.axis, s.nbytes, s.algorithm) for s in layer_steps(spec) if isinstance(s, CommStep)]


def test_layer_sends_fp8_dispatches_and_bf16_combines() -> None:
    """1024 tokens a rank (tp 1): forward dispatch 1024 x 7,392 = 7,569,408 B, combine 1024 x
    14,336 = 14,680,064 B over tp_ep (= ep here) as deepep/256/8/4; the backward's combine of
    output gradients goes out as a dispatch (fp8), the dispatch's gradient comes back as a
    combine (bf16), DeepSeek-V3 §3.3.2. Without fp8_dispatch both ways carry 14,680,064 B."""
    alg = "deepep/256/8/4"
    assert _comms(_scenario(fp8_dispatch=True, max_nodes_per_token=4), "fwd") == [
        ("dispatch", "all_to_all", "tp_ep", 7_569_408.0, alg), ("combine", "all_to_all", "tp_ep", 14_680_064.0, alg)]
    assert _comms(_scenario(fp8_dispatch=True, max_nodes_per_token=4), "bwd") == [
        ("combine.bwd", "all_to_all", "tp_ep", 7_569_408.0, alg), ("dispatch.bwd", "all_to_all", "tp_ep", 14_680_064.0, alg)]
    assert {c[3] for c in _comms(_scenario(), "fwd")} == {14_680_064.0}


@pytest.mark.parametrize("moe,field", [({"dispatcher": "alltoall", "fp8_dispatch": True}, "parallelism.moe.fp8_dispatch"),
                                       ({"dispatcher": "allgather", "max_nodes_per_token": 4},
                                        "parallelism.moe.max_nodes_per_token")])
def test_deepep_options_need_deepep(moe: dict, field: str) -> None:
    with pytest.raises(InfeasibleError) as err:
        _scenario(**moe)
    assert err.value.field == field


def test_schema_offers_deepep() -> None:
    """`dtsim schema` lists the dispatcher and its two options."""
    text = str(json_schema_of("scenario"))
    assert "'deepep'" in text and "fp8_dispatch" in text and "max_nodes_per_token" in text


def test_deepep_across_nodes_needs_infiniband() -> None:
    """Mixtral (8 experts, top-2) with ep 8 x pp 2 on 2 p5.48xlarge: pp sits inside dp, so a
    stage's ranks, and its ep group, are 0, 2, ..., 14 on both nodes, whose NICs speak EFA; DeepEP's
    internode kernels need InfiniBand RDMA, so the run is refused naming the dispatcher, and the
    collective alone cannot run there either."""
    sc = Scenario.model_validate({"model": MIXTRAL, "cluster": {"node": "p5.48xlarge", "nodes": 2},
                                  "parallelism": {"pp": 2, "ep": 8, "sharding": "zero1",
                                                  "moe": {"dispatcher": "deepep"}},
                                  "training": {"global_batch": 32, "micro_batch": 1}})
    with pytest.raises(ScenarioError) as err:
        simulator.simulate(sc)
    assert getattr(err.value, "field", None) == "parallelism.moe.dispatcher"
    with pytest.raises(ValueError, match="InfiniBand"):
        simulate_collective({"node": "p5.48xlarge", "nodes": 2}, "all_to_all", 1e6, "deepep")


def test_one_node_reproduces_the_intranode_row_it_was_fitted_on() -> None:
    """EP 8 on one DGX H800 (the README's intranode row, which nvlink.deepep_efficiency 0.68 comes
    from): each GPU's NVLink port sends 7 x P(rank) x D, P(rank) = 0.6618, at 200 x 0.68 = 136 GB/s:
    7 x 0.6618 x D / 136 GB/s = 1.031 ms. Counted as DeepEP's test counts it (every received token,
    the own rank's too): 8 x 0.6618 x D / t = 8/7 x 136 = 155.4 GB/s, between the README's 153
    (dispatch) and 158 (combine)."""
    p_rank = 1 - _miss(256, 32, 8)
    t = _bandwidth_s(1, deepep_algorithm(256, 8, None), D)
    assert t == pytest.approx(7 * p_rank * D / NVLINK_BPS, rel=1e-6) and t == pytest.approx(1.031e-3, rel=1e-3)
    assert 8 * p_rank * D / t / 1e9 == pytest.approx(155.4, abs=0.05)


def _beside(comms: list[tuple[str, float, float, float | None]], slowdown: float) -> dict[str, tuple[float, float]]:
    """A 10 ms kernel on rank 0 beside collectives (axis, ms, start_ms, own slowdown) of rank 0,
    each gated to start at start_ms (tests/test_engine_core.py's harness)."""
    from dataclasses import replace as _replace

    from simulator.ir import ProgramBuilder
    from tests.test_engine_core import _op, _run

    pb = ProgramBuilder()
    pb.add(0, "compute", "kernel", "compute", duration_s=10e-3)
    for i, (axis, ms, after, own) in enumerate(comms):
        op = _replace(_op(axis, ms, group=(0, 9)), sm_slowdown=own)
        pb.add(0, axis, f"{axis}{i}", axis, comm=op, join=i)
        gate = pb.add(9, f"gate{i}", f"gate{i}", "compute", duration_s=after * 1e-3)
        pb.add(9, axis, f"{axis}{i}.peer", axis, comm=op, join=i, deps=[gate])
    log, _ = _run(pb, slowdown=slowdown)
    return {name: (start, end) for name, start, end in log}


def test_deepep_slows_compute_by_its_own_sms() -> None:
    """DeepEP holds 20 of the H800's 132 SMs: compute beside it runs at 112/132, slowdown 132/112 - 1
    = 0.17857. A 10 ms kernel inside a 20 ms dispatch takes 11.786 ms, with the run's NCCL slowdown
    at 0.25 or at 0 alike. Beside an NCCL all-reduce too ([0, 4] ms, 0.25) the larger applies: 4 x
    0.8 = 3.2 ms of work by 4 ms, the other 6.8 ms at 1/1.17857: ends at 4 + 6.8 x 1.17857 = 12.014 ms."""
    s = 132 / 112 - 1
    sc = _scenario()
    assert moe_shape(sc).sm_slowdown == pytest.approx(s)
    assert _beside([("tp", 20.0, 0.0, s)], 0.25)["kernel"][1] == pytest.approx(11.786, abs=1e-3)
    assert _beside([("tp", 20.0, 0.0, s)], 0.0)["kernel"][1] == pytest.approx(11.786, abs=1e-3)
    assert _beside([("tp", 20.0, 0.0, s), ("dp", 4.0, 0.0, None)], 0.25)["kernel"][1] == pytest.approx(
        4 + 6.8 * (1 + s), abs=1e-6)
    assert _beside([("dp", 20.0, 0.0, None)], 0.25)["kernel"][1] == pytest.approx(12.5)  # NCCL's alone: unchanged


@pytest.mark.parametrize("dispatcher", ["deepep", "allgather"])
def test_moe_summary_counts_the_etp_ep_group_exchange(dispatcher: str) -> None:
    """The deepep and allgather dispatchers exchange tokens over the etp x ep group (tasks on the
    tp_ep stream): Result.moe.all_to_all_s is their time on the summarised rank (it read 0 s before)."""
    sc = Scenario.model_validate({
        "model": {**MIXTRAL, "layers": 2}, "cluster": {"node": "dgx-h800", "nodes": 1},
        "parallelism": {"pp": 1, "ep": 8, "sharding": "zero1", "moe": {"dispatcher": dispatcher}},
        "training": {"micro_batch": 1, "global_batch": 8}})
    sim = simulator.run_simulation(sc)
    per_rank: dict[int, float] = {}
    for r in sim.rows:
        if r.stream == "tp_ep":
            per_rank[r.rank] = per_rank.get(r.rank, 0.0) + r.duration_s
    assert sim.result.moe is not None and sim.result.moe.all_to_all_s > 0
    assert sim.result.moe.all_to_all_s == pytest.approx(max(per_rank.values()))
