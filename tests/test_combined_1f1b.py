"""Megatron-Core's combined 1F1B (issue 15 item 3, ``parallelism.moe.overlap_a2a_1f1b``): each
steady-state forward merged with a backward of another micro-batch, so that one's dispatch and
combine run beside the other's compute (megatron/core/pipeline_parallel/combined_1f1b.py at
NVIDIA/Megatron-LM@3816e4de). Actions are written as in tests/test_dualpipe.py: ``F3.0`` the
forward of micro-batch 3 through local chunk 0, ``*`` a forward paired with the backward after it.
"""

from __future__ import annotations

import pytest

import simulator
from simulator.errors import InfeasibleError
from simulator.scenario.spec import Scenario
from simulator.workload.pipeline.schedules import pipeline_schedule
from tests.conftest import cross_microbatch_overlaps


def _names(actions):
    return " ".join(f"{a.kind}{a.microbatch}.{a.chunk}{'*' if a.paired else ''}" for a in actions)


def test_no_pipelining_pairs_each_forward_with_the_previous_micro_batch_s_backward():
    """pp 1, m 4 (combined_1f1b_schedule_for_no_pipelining): F0 alone, then F(i+1) merged with
    B(i) for i = 0, 1, 2, then B3 alone."""
    assert _names(pipeline_schedule("1f1b", 1, 0, 4, combined=True)) == (
        "F0.0 F1.0* B0.0 F2.0* B1.0 F3.0* B2.0 B3.0")
    assert _names(pipeline_schedule("1f1b", 1, 0, 4)) == "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0 F3.0 B3.0"


def test_interleaved_runs_one_more_warm_up_forward_then_pairs():
    """pp 2, v 2, m 4: 8 virtual micro-batches. Forward k is chunk (k // 2) % 2 of micro-batch
    (k // 4) * 2 + k % 2: 0.0 1.0 0.1 1.1 2.0 3.0 2.1 3.1; backwards visit chunks in reverse:
    0.1 1.1 0.0 1.0 2.1 3.1 2.0 3.0. Warm-up (pp - rank - 1) * 2 + (v - 1) * pp, plus 1 combined
    (schedules.py:966-970): rank 0 4 -> 5, rank 1 2 -> 3; then (8 - warm-up) F&B pairs and the
    remaining backwards alone."""
    assert _names(pipeline_schedule("interleaved", 2, 0, 4, 2)) == (
        "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0")
    assert _names(pipeline_schedule("interleaved", 2, 0, 4, 2, combined=True)) == (
        "F0.0 F1.0 F0.1 F1.1 F2.0 F3.0* B0.1 F2.1* B1.1 F3.1* B0.0 B1.0 B2.1 B3.1 B2.0 B3.0")
    assert _names(pipeline_schedule("interleaved", 2, 1, 4, 2, combined=True)) == (
        "F0.0 F1.0 F0.1 F1.1* B0.1 F2.0* B1.1 F3.0* B0.0 F2.1* B1.0 F3.1* B2.1 B3.1 B2.0 B3.0")


MOE = {"name": "tiny MoE", "layers": 4, "hidden": 2048, "heads": 16, "ffn_hidden": 5632, "seq_len": 2048,
       "vocab": 32000, "mlp": "swiglu", "norm": "rmsnorm", "position_embedding": "rotary", "tied_embeddings": False,
       "bias": False, "dropout": False, "experts": 8, "experts_per_token": 2, "expert_ffn_hidden": 1408,
       "shared_experts": 1}


def _moe(pp: int, overlap: bool, **par: object) -> Scenario:
    """pp x ep 8 on pp p5.48xlarge (each stage's 8 ranks exchange tokens over NVLink, dp 8), 4 micro-batches;
    pp 2 interleaved over 2 chunks of one layer each."""
    extra = {"pipeline_schedule": "interleaved", "virtual_stages": 2} if pp > 1 else {}
    return Scenario.model_validate({"model": dict(MOE), "cluster": {"node": "p5.48xlarge", "nodes": pp},
                                    "parallelism": {"pp": pp, "ep": 8, "sharding": "zero1", **extra,
                                                    "moe": {"overlap_a2a_1f1b": overlap}, **par},
                                    "training": {"global_batch": 32, "micro_batch": 1}})


@pytest.mark.parametrize("pp", [1, 2])
def test_the_partner_s_compute_hides_the_all_to_all(pp):
    """Without the option a rank runs one micro-batch's pass at a time, so each dispatch and
    combine waits exposed (no all-to-all beside another micro-batch's compute); with it the
    paired passes' steps alternate on the compute stream and the step is strictly shorter."""
    plain = simulator.run_simulation(_moe(pp, False))
    combined = simulator.run_simulation(_moe(pp, True))
    assert cross_microbatch_overlaps(plain) == 0
    assert cross_microbatch_overlaps(combined) > 0
    assert combined.result.step_time_s < plain.result.step_time_s


@pytest.mark.parametrize(("par", "field"), [
    ({"pipeline_schedule": "1f1b", "virtual_stages": 1}, "parallelism.pipeline_schedule"),  # pp 2 needs vp
    ({"ep": 1}, "parallelism.ep"),
    ({"moe": {"overlap_a2a_1f1b": True, "dispatcher": "allgather"}}, "parallelism.moe.dispatcher"),
    ({"moe": {"overlap_a2a_1f1b": True, "overlap_ep_comm": True}}, "parallelism.moe.overlap_ep_comm"),
])
def test_what_megatron_refuses_names_its_field(par, field):
    """transformer_config.py:3007-3041 at 3816e4de: vp with pp > 1, ep > 1, the alltoall or flex
    dispatcher, no moe_shared_expert_overlap."""
    with pytest.raises(InfeasibleError) as err:
        _moe(2, True, **par)
    assert err.value.field == field


@pytest.mark.parametrize(("section", "key", "value"), [
    ("training", "recompute", "full"),  # transformer_config.py:3021-3023
    ("training", "precision", "fp32"),  # 3035-3037: a bf16 or fp16 model
    ("model", "mtp_layers", 2),  # 3042-3046: at most one multi-token-prediction layer
])
def test_other_refusals_name_their_field(section, key, value):
    data = _moe(1, False).model_dump(exclude_unset=True)
    data["parallelism"]["moe"] = {"overlap_a2a_1f1b": True}
    data[section][key] = value
    with pytest.raises(InfeasibleError) as err:
        Scenario.model_validate(data)
    assert err.value.field == f"{section}.{key}"


@pytest.mark.parametrize(("pp", "v", "m"), [(1, 1, 1), (1, 1, 6), (2, 2, 2), (2, 2, 4), (4, 2, 8), (4, 3, 12)])
def test_every_pass_runs_once_after_its_forward(pp, v, m):
    """Each rank runs each (micro-batch, chunk) forward and backward once, the backward later; a
    paired forward is followed by a backward; every forward after the warm-up ((p - rank - 1) * 2
    + (v - 1) * p + 1, capped at m v) is paired: m v - warm-up pairs."""
    for rank in range(pp):
        actions = pipeline_schedule("interleaved" if pp > 1 else "1f1b", pp, rank, m, v, combined=True)
        seen = {(a.kind, a.microbatch, a.chunk): i for i, a in enumerate(actions)}
        assert len(seen) == len(actions) == 2 * m * v
        assert all(seen[("F", mb, c)] < seen[("B", mb, c)] for _, mb, c in seen)
        pairs = [i for i, a in enumerate(actions) if a.paired]
        assert all(actions[i].kind == "F" and actions[i + 1].kind == "B" for i in pairs)
        warmup = min((pp - rank - 1) * 2 + (v - 1) * pp + 1, m * v)
        assert len(pairs) == m * v - warmup


def test_deeper_interleaved_pipeline_runs_to_the_end():
    """pp 4 x v 2 over 4 p5.48xlarge (ep 8 in each), 8 micro-batches of one layer per virtual
    stage: the combined order's transfers all match (the step finishes) and it is shorter."""
    model = {**MOE, "layers": 8}
    def sc(overlap: bool) -> Scenario:
        return Scenario.model_validate({"model": model, "cluster": {"node": "p5.48xlarge", "nodes": 4},
                                        "parallelism": {"pp": 4, "ep": 8, "sharding": "zero1",
                                                        "pipeline_schedule": "interleaved", "virtual_stages": 2,
                                                        "moe": {"overlap_a2a_1f1b": overlap}},
                                        "training": {"global_batch": 64, "micro_batch": 1}})
    plain, combined = simulator.simulate(sc(False)), simulator.simulate(sc(True))
    assert 0 < combined.step_time_s < plain.step_time_s


def test_delayed_weight_gradients_hide_the_next_layer_s_first_all_to_all():
    """delay_wgrad_compute: a layer's weight gradients wait until the next layer's backward has
    started, so that layer's first all-to-all (combine.bwd) runs beside them: on rank 0 (pp 1) a
    combine.bwd overlaps a wgrad task of its own micro-batch, which never happens without the
    option (there the weight GEMMs sit inside the backward before the all-to-all is issued), and
    the step is strictly shorter than with the combined 1F1B alone."""
    def beside(sim) -> int:
        rows = [r for r in sim.rows if r.rank == 0 and r.info is not None and r.duration_s > 0]
        a2a = [r for r in rows if r.name == "combine.bwd"]
        wgrad = [r for r in rows if r.stream == "compute" and r.name.endswith(".wgrad")]
        return sum(1 for a in a2a for w in wgrad if a.info.mb == w.info.mb and w.start_s < a.end_s and a.start_s < w.end_s)

    combined = simulator.run_simulation(_moe(1, True))
    delayed = simulator.run_simulation(_moe(1, True, moe={"overlap_a2a_1f1b": True, "delay_wgrad_compute": True}))
    assert beside(combined) == 0 and beside(delayed) > 0
    assert delayed.result.step_time_s < combined.result.step_time_s


@pytest.mark.parametrize(("par", "field"), [
    ({"moe": {"delay_wgrad_compute": True}}, "parallelism.moe.delay_wgrad_compute"),
    ({"moe": {"overlap_a2a_1f1b": True, "delay_wgrad_compute": True}, "sharding": "fsdp"}, "parallelism.sharding"),
])
def test_delay_wgrad_compute_refusals(par, field):
    """transformer_config.py:3073-3077 at 3816e4de: delay_wgrad_compute asserts
    overlap_moe_expert_parallel_comm; modelled with sharding none or zero1 only (the split
    backward's gathering hooks of fsdp / zero3 are not)."""
    with pytest.raises(InfeasibleError) as err:
        _moe(1, False, **par)
    assert err.value.field == field
