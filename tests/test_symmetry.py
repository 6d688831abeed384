"""Symmetry reduction (workload/symmetry.py): which ranks are simulated and whom they stand for."""

import simulator
from simulator.cluster.mesh import MEGATRON_AXES, Mesh, mesh_for
from simulator.workload import build_workload, compute_profile
from simulator.workload.symmetry import Symmetry, block_ranks
from tests.conftest import small_scenario


def test_siblings_and_instances_by_hand():
    """tp 2 x pp 2 x dp 4 on 8-GPU nodes: a replica (slice) is 4 ranks, the block is
    lcm(4, 8) = 8 ranks (2 replicas). rank = tp + 2 * (pp + 2 * dp), so stage 0 of the first
    block is ranks {0, 1} (dp 0) and {4, 5} (dp 1); their tp groups are (0, 1) and (4, 5)."""
    mesh = Mesh.from_sizes(tp=2, pp=2, dp=4)
    sym = Symmetry(mesh, gpus_per_node=8, requested=True)
    assert block_ranks(mesh, 8) == sym.block == 8
    assert sym.simulated_ranks() == (0, 2)
    assert sym.siblings(0) == [0, 1, 4, 5] and sym.siblings(2) == [2, 3, 6, 7]
    assert sym.instances(0, "tp") == ((0, 1), (4, 5))
    assert sym.represents((0, 2)) == {0: 8, 2: 8}  # 16 ranks, 2 simulated


def test_ranks_that_differ_switch_the_reduction_off():
    """A rank_key that tells rank 5 apart (a straggler, say) makes stage 0 non-uniform: every
    rank is simulated, and the reason names the first two ranks that differ (1 and 5)."""
    mesh = Mesh.from_sizes(tp=2, pp=2, dp=4)
    sym = Symmetry(mesh, gpus_per_node=8, requested=True, rank_key=lambda r: "slow" if r == 5 else "ok")
    assert not sym.enabled and sym.block_ranks is None
    assert sym.simulated_ranks() == tuple(range(16))
    assert "ranks 0 and 5 of stage 0 differ" in sym.reason
    uniform = Symmetry(mesh, gpus_per_node=8, requested=True, rank_key=lambda r: "ok")
    assert uniform.enabled and uniform.simulated_ranks() == (0, 2)


def test_workload_simulates_every_rank_when_ranks_differ():
    """The workload follows the symmetry module: 16 GPUs of quickstart-like DDP, one rank
    simulated normally; all 16 when one rank's key differs, with the same tasks per rank."""
    sc = simulator.Scenario.model_validate(small_scenario())
    profile = compute_profile(sc.cluster.gpu_spec, None)
    gpn = sc.cluster.gpus_in_node
    reduced = build_workload(sc, profile, gpus_per_node=gpn).build()
    full = build_workload(sc, profile, gpus_per_node=gpn, rank_key=lambda r: r == 3).build()
    assert reduced.ranks == (0,)
    assert full.ranks == tuple(range(mesh_for(sc).world)) == tuple(range(sc.world_size))
    per_rank = len(reduced.tasks)
    assert len(full.tasks) == per_rank * sc.world_size


def test_megatron_rank_order_puts_each_stage_in_a_block():
    """Megatron-Core's order tp-cp-ep-dp-pp (rank_order tp-cp-dp-pp): tp 1 x pp 2 x dp 8 on 16 GPUs
    is rank = dp + 8 * pp, so stage 0 is ranks 0-7 (node 0) and an EP 8 group folded inside it is
    (0..7), one node; dtsim's default order (rank = pp + 2 * dp) puts stage 0 on the even ranks and
    the same EP group on two nodes. With pp outermost a replica spans the world: the block is all
    16 ranks, and a stage's siblings are its 8 ranks."""
    megatron = Mesh.from_sizes(pp=2, dp=8, ep=8, order=MEGATRON_AXES)
    assert megatron.group(0, "ep") == tuple(range(8)) and megatron.group(8, "pp") == (0, 8)
    assert Mesh.from_sizes(pp=2, dp=8, ep=8).group(0, "ep") == (0, 2, 4, 6, 8, 10, 12, 14)
    sym = Symmetry(megatron, gpus_per_node=8, requested=True)
    assert megatron.pp_outermost and sym.block == 16
    assert sym.simulated_ranks() == (0, 8) and sym.siblings(8) == list(range(8, 16))


def test_megatron_rank_order_simulates_alike_with_and_without_symmetry():
    """Qwen3-30B-A3B, tp 2 x pp 2 x dp 8 (ep 8) on 4 DGX-H100, Megatron order, flow network: one
    rank per stage standing for its stage gives the step of simulating all 32 ranks (to 1e-9 s)."""
    base = {"name": "t", "framework": "nemo", "model": {"preset": "qwen3-30b-a3b", "seq_len": 4096},
            "cluster": {"node": "dgx-h100", "nodes": 4},
            "parallelism": {"tp": 2, "pp": 2, "dp": 8, "ep": 8, "sequence_parallel": True},
            "training": {"micro_batch": 1, "global_batch": 64}}
    steps = {}
    for sym in ("auto", "off"):
        sc = simulator.Scenario.model_validate({**base, "sim": {"network": "flow", "symmetry": sym}})
        assert sc.parallelism.rank_order == "tp-cp-dp-pp"  # the nemo profile's
        steps[sym] = simulator.simulate(sc).step_time_s
    assert abs(steps["auto"] - steps["off"]) < 1e-9
