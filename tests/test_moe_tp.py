"""Tensor parallelism with MoE and expert tensor parallelism (issue 15): Megatron-Core's fold
of a stage's ranks into etp x ep x edp, the token exchange's groups and bytes under tp and
etp, the expert GEMMs split by etp, expert memory sharded by etp, and the layouts refused.
Mixtral 8x7B (tests/test_moe.py's inline shape) on 2 p5.48xlarge (16 H100)."""

from __future__ import annotations

import pytest

import simulator
from simulator.cluster.mesh import Mesh
from simulator.costs.moe import expert_capacity
from simulator.errors import InfeasibleError
from simulator.scenario.spec import Scenario
from simulator.workload.activations import shard_of
from simulator.workload.layout import ModelLayout
from simulator.workload.moe import imbalance_of, moe_shape
from simulator.workload.parallel import layer_steps
from simulator.workload.steps import CommStep, ComputeStep, LayerSpec
from tests.test_moe import MIXTRAL


def scenario(model: dict | None = None, **par: object) -> Scenario:
    """Mixtral 8x7B on 16 H100, tp 2 with sequence parallelism, ZeRO-1, micro-batch 1 x 4096."""
    parallelism = {"tp": 2, "sequence_parallel": True, "ep": 4, "sharding": "zero1", **par}
    return Scenario.model_validate({"model": {**MIXTRAL, **(model or {})}, "cluster": {"node": "p5.48xlarge", "nodes": 2},
                                    "parallelism": parallelism, "training": {"global_batch": 32, "micro_batch": 1}})


def steps(sc: Scenario, phase: str) -> list:
    return layer_steps(LayerSpec(sc.model, shard_of(sc), "block", phase, tp_overlap=sc.parallelism.tp_overlap,
                                 moe=moe_shape(sc)))


def comms(sc: Scenario, phase: str) -> list[tuple[str, str, str, float]]:
    return [(s.name, s.op, s.axis, s.nbytes) for s in steps(sc, phase) if isinstance(s, CommStep)]


def test_expert_groups_fold_etp_inside_ep() -> None:
    """tp 2, dp 8, pp 1 (16 ranks, one stage, stage index = rank). etp 2, ep 4: etp groups are
    pairs (0, 1); ep groups stride etp: (0, 2, 4, 6); tp_ep the 8 consecutive ranks; edp =
    16 / (2*4) = 2 with stride 8: (0, 8). etp 1, ep 4: ep (0, 1, 2, 3), edp 16/4 = 4: (0, 4, 8, 12)."""
    mesh = Mesh.from_sizes(tp=2, dp=8, ep=4, etp=2)
    assert mesh.group(0, "etp") == (0, 1) and mesh.group(5, "etp") == (4, 5)
    assert mesh.group(0, "ep") == (0, 2, 4, 6) and mesh.group(3, "ep") == (1, 3, 5, 7)
    assert mesh.group(0, "tp_ep") == tuple(range(8)) and mesh.group(9, "tp_ep") == tuple(range(8, 16))
    assert mesh.group(0, "edp") == (0, 8)
    flat = Mesh.from_sizes(tp=2, dp=8, ep=4, etp=1)
    assert flat.group(0, "ep") == (0, 1, 2, 3) and flat.group(0, "edp") == (0, 4, 8, 12)
    assert flat.group(0, "etp") == (0,)


def test_token_exchange_bytes_under_tp_and_etp() -> None:
    """tp 2 with SP: a rank routes 4096 / 2 = 2048 tokens; all-to-all 2048 x (4096 x 2 x 2 B) =
    33,554,432 B each way over ep. etp 2 (the default, = tp): the expert-TP all-gather after the
    dispatch and reduce-scatter before the combine move the gathered 2 x 33,554,432 = 67,108,864 B
    over etp; the backward mirrors them (combine's gradient first, all-gather <-> reduce-scatter)."""
    a2a, gathered = 2048 * 4096 * 2 * 2, 2 * 2048 * 4096 * 2 * 2
    assert (a2a, gathered) == (33_554_432, 67_108_864)
    sc = scenario()
    assert sc.parallelism.expert_tp == 2 and sc.edp == 2
    tp_attn = [c for c in comms(sc, "fwd") if c[2] == "tp"]
    assert [c[0] for c in tp_attn] == ["tp.ag.attn", "tp.rs.attn"]  # no dense MLP collectives in an MoE block
    assert [c for c in comms(sc, "fwd") if c[2] != "tp"] == [
        ("dispatch", "all_to_all", "ep", a2a), ("etp.ag", "all_gather", "etp", gathered),
        ("etp.rs", "reduce_scatter", "etp", gathered), ("combine", "all_to_all", "ep", a2a)]
    assert [c for c in comms(sc, "bwd") if c[2] != "tp"] == [
        ("combine.bwd", "all_to_all", "ep", a2a), ("etp.ag.bwd", "all_gather", "etp", gathered),
        ("etp.rs.bwd", "reduce_scatter", "etp", gathered), ("dispatch.bwd", "all_to_all", "ep", a2a)]
    # etp 1: no expert-TP collectives; the allgather dispatcher gathers ep x etp x 2048 x 4096 x 2 B
    assert [c[0] for c in comms(scenario(etp=1), "fwd") if c[2] != "tp"] == ["dispatch", "combine"]
    ag = comms(scenario(moe={"dispatcher": "allgather"}), "fwd")
    assert [c for c in ag if c[2] != "tp"] == [("dispatch", "all_gather", "tp_ep", 4 * 2 * 2048 * 4096 * 2),
                                              ("combine", "reduce_scatter", "tp_ep", 4 * 2 * 2048 * 4096 * 2)]


def test_expert_gemms_split_by_etp() -> None:
    """A rank holds E/ep = 2 experts. etp 2: after the all-gather it runs 2048 x 2 x 2 = 8192 routed
    rows through F_e / 2 = 7168 columns: fc1 2*8192*4096*(2*7168) + fc2 2*8192*7168*4096 =
    3 * 2 * 8192 * 4096 * 7168 FLOPs. etp 1: 4096 rows through 14336, the same FLOPs."""
    for etp in (2, 1):
        step = next(s for s in steps(scenario(etp=etp), "fwd") if isinstance(s, ComputeStep) and s.name == "experts")
        fc1 = next(k for k in step.kernels if k.name == "experts.fc1")
        assert fc1.mnk == (2048 * 2 * etp, 2 * 14336 / etp, 4096)
        assert sum(k.flops for k in step.kernels) == pytest.approx(3 * 2 * 8192 * 4096 * 7168)


def test_expert_memory_sharded_by_etp() -> None:
    """32 layers x (8/ep experts) x 176,160,768 / etp: ep 4 etp 2: 32 x 2 x 88,080,384 =
    5,637,144,576 parameters, edp 16/(4*2) = 2; etp 1: twice that, 11,274,289,152, edp 4."""
    assert ModelLayout(scenario()).expert_params_of_stage(0) == 5_637_144_576
    one = scenario(etp=1)
    assert ModelLayout(one).expert_params_of_stage(0) == 11_274_289_152 and one.edp == 4


def test_shared_experts_use_the_attention_tp_group() -> None:
    """With a shared expert (expert_ffn_hidden 14336) and tp 2 + SP, its input is all-gathered and
    its output reduce-scattered over tp: 4096 tokens x 4096 x 2 B = 33,554,432 B each. With
    overlap_ep_comm the dispatch runs beside the shared expert's GEMMs (the gather before it)."""
    sc = scenario({"shared_experts": 1}, moe={"overlap_ep_comm": True})
    fwd = steps(sc, "fwd")
    names = [s.name for s in fwd]
    i = names.index("tp.ag.shared")
    assert names[i:i + 7] == ["tp.ag.shared", "dispatch", "shared_experts", "tp.rs.shared", "etp.ag", "experts",
                              "etp.rs"]
    assert fwd[i].nbytes == fwd[i + 3].nbytes == 4096 * 4096 * 2 and fwd[i + 1].overlap
    shared = fwd[i + 2]
    assert next(k for k in shared.kernels if k.name == "shared.fc1").mnk == (4096, 14336, 4096)  # 2 x 14336 / tp
    bwd = [s.name for s in steps(sc, "bwd")]
    want = ["tp.ag.shared.grad", "shared.fc2.bwd", "tp.ag.shared.input", "shared.fc1.dgrad", "tp.rs.shared.bwd",
            "shared.fc1.wgrad"]
    assert bwd[bwd.index("tp.ag.shared.grad"):bwd.index("shared.fc1.wgrad") + 1] == want


def test_capacity_counts_a_ranks_sequence_parallel_tokens() -> None:
    """cf 1.1 and tp 2: a source rank routes 4096 / 2 = 2048 tokens (the MoE layer's input under
    SP), capacity ceil(2048 x 2 / 8 x 1.1) = ceil(563.2) = 564 per expert and source (tp 1 would
    give ceil(1126.4) = 1127 for 4096). ep 4: 2048 x 2 x 4 = 16,384 routed tokens; an expert with
    half of them (8192) keeps 4 x 564 = 2256, the others (1170.3 each) keep all: dropped
    (8192 - 2256) / 16,384 = 0.362305 (tp 1's count would give (16,384 - 4508) / 32,768 = 0.362427)."""
    assert expert_capacity(2048, 8, 2, 1.1) == 564 and expert_capacity(4096, 8, 2, 1.1) == 1127
    sc = scenario({"capacity_factor": 1.1}, ep=4)
    sc = sc.model_copy(update={"training": sc.training.model_copy(update={"moe_routing": sc.training.moe_routing.model_copy(
        update={"histogram": [0.5] + [0.5 / 7] * 7})})})
    assert imbalance_of(sc).dropped_fraction == pytest.approx((8192 - 2256) / 16384, rel=1e-9)


@pytest.mark.parametrize(("par", "field"), [
    ({"sequence_parallel": False}, "parallelism.sequence_parallel"),
    ({"etp": 3}, "parallelism.etp"),  # ep*etp = 4*3 = 12 does not divide 16 ranks
])
def test_inconsistent_layouts_name_their_field(par: dict, field: str) -> None:
    with pytest.raises(InfeasibleError) as err:
        scenario(**par)
    assert err.value.field == field


def test_etp_on_a_dense_model_names_etp() -> None:
    """A dense model (Mixtral's shape without experts) given only etp: the error names etp."""
    dense = {k: v for k, v in MIXTRAL.items() if k not in ("experts", "experts_per_token")}
    with pytest.raises(InfeasibleError) as err:
        Scenario.model_validate({"model": dense, "cluster": {"node": "p5.48xlarge", "nodes": 2},
                                 "parallelism": {"tp": 2, "sequence_parallel": True, "etp": 2},
                                 "training": {"global_batch": 32, "micro_batch": 1}})
    assert err.value.field == "parallelism.etp"


def test_symmetric_simulation_matches_every_rank() -> None:
    """tp 2, ep 4, etp 2 (ep groups span ranks 0..7 of a node, the edp pairs both nodes): simulating
    one rank per stage gives the step every-rank simulation gives."""
    sc = scenario()
    off = sc.model_copy(update={"sim": sc.sim.model_copy(update={"symmetry": "off"})})
    a, b = simulator.simulate(sc), simulator.simulate(off)
    assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-9)
    assert a.moe is not None and a.moe.edp == 2 and a.moe.all_to_all_s > 0
