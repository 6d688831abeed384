"""Multi-head latent attention under tensor parallelism (issue 15): Megatron-Core's
MLASelfAttention (megatron/core/transformer/multi_latent_attention.py at d98e8a6) keeps the
down-projections and the latents' norms on every TP rank (TELinear parallel_mode duplicated),
splits the up-projections by heads (column-parallel) and the output projection (row-parallel);
under sequence parallelism the latents, not the hidden state, are all-gathered. DeepSeek-V3's
shapes (arXiv:2412.19437 §4.2: h 7168, 128 heads, r_q 1536, r_kv 512, nope 128, rope 64, v 128)
at tp 2, one 4096-token sequence."""

from __future__ import annotations

import pytest

import simulator
from simulator.scenario.spec import Scenario
from simulator.workload.activations import shard_of
from simulator.workload.layout import ModelLayout
from simulator.workload.moe import moe_shape
from simulator.workload.parallel import layer_steps
from simulator.workload.steps import CommStep, ComputeStep, LayerSpec
from tests.test_moe import DEEPSEEK_V3

DENSE_MLA = {k: v for k, v in DEEPSEEK_V3.items()
             if k not in ("experts", "experts_per_token", "shared_experts", "expert_ffn_hidden", "moe_layers", "router")}


def _scenario(model: dict, sp: bool) -> Scenario:
    return Scenario.model_validate({"model": {**model, "layers": 4}, "cluster": {"node": "dgx-h800", "nodes": 1},
                                    "parallelism": {"tp": 2, "sequence_parallel": sp, "pp": 1},
                                    "training": {"global_batch": 4, "micro_batch": 1}})


def _steps(sc: Scenario, phase: str) -> list:
    return layer_steps(LayerSpec(sc.model, shard_of(sc), "block", phase, tp_overlap=sc.parallelism.tp_overlap))


def _flops(sc: Scenario) -> dict[str, float]:
    return {k.name: k.flops for s in _steps(sc, "fwd") if isinstance(s, ComputeStep) for k in s.kernels}


def test_per_rank_attention_parameters_at_tp2() -> None:
    """Per layer and rank: q 7168*1536 + 1536 (norm) + 1536*128*192/2 = 29,885,952; kv 7168*576 +
    512 (norm) + 512*128*256/2 = 12,517,888; out 128*128*7168/2 = 58,720,256. 101,124,096 in all,
    against 187,107,328 at tp 1 (tests/test_moe.py): the replicated 7168*(1536+576) + 1536 + 512 = 15,140,864 down-projection and
    norm parameters are not halved."""
    assert 7168 * 1536 + 1536 + 1536 * 128 * 192 // 2 == 29_885_952
    assert 7168 * 576 + 512 + 512 * 128 * 256 // 2 == 12_517_888
    layout = ModelLayout(_scenario(DENSE_MLA, sp=True))
    params = {p.name: p.numel for p in layout.chunk_params(layout.chunks[0])}
    assert params["l0.qkv"] == 29_885_952 + 12_517_888
    assert params["l0.proj"] == 58_720_256
    assert params["l0.qkv"] + params["l0.proj"] == 101_124_096
    assert 187_107_328 - 2 * (101_124_096 - 15_140_864) == 15_140_864


def test_per_rank_flops_at_tp2_with_sequence_parallelism() -> None:
    """T = 4096, a rank's sequence share Tn = 2048: q_down 2*2048*7168*1536, kv_down 2*2048*7168*576
    (replicated weights on the rank's own tokens); q_up 2*4096*1536*(64*192), kv_up
    2*4096*512*(64*256) (64 heads a rank); attention 2*64*4096*4096*320/2; proj 2*4096*(64*128)*7168.
    Half of tp 1's for every GEMM but the down-projections, which tp 1 runs on 4096 tokens."""
    f = _flops(_scenario(DENSE_MLA, sp=True))
    assert f["q_down"] == 2 * 2048 * 7168 * 1536 and f["kv_down"] == 2 * 2048 * 7168 * 576
    assert f["q_up"] == 2 * 4096 * 1536 * 64 * 192 and f["kv_up"] == 2 * 4096 * 512 * 64 * 256
    assert f["attention"] == pytest.approx(2 * 64 * 4096 * 4096 * 320 / 2)
    assert f["proj"] == 2 * 4096 * 64 * 128 * 7168


def test_without_sequence_parallelism_the_down_projections_see_every_token() -> None:
    """No SP: every TP rank holds the whole sequence, so the replicated down-projections run on
    4096 tokens (2*4096*7168*1536), the rest as with SP."""
    f = _flops(_scenario(DENSE_MLA, sp=False))
    assert f["q_down"] == 2 * 4096 * 7168 * 1536 and f["q_up"] == 2 * 4096 * 1536 * 64 * 192


def test_sequence_parallel_collectives_move_the_latents() -> None:
    """Forward: ln1 and the down-projections, then the all-gather of the latents and the key's rotary
    part, 4096 x (1536 + 512 + 64) x 2 B = 17,301,504 B (not the hidden state's 58,720,256), then the
    up-projections, attention and proj, then the reduce-scatter of 4096 x 7168 x 2 = 58,720,256 B.
    Backward: the output-gradient all-gather 58,720,256, the re-gather of the saved latents
    4096 x 2048 x 2 = 16,777,216, the input-gradient reduce-scatter 17,301,504; the
    down-projections' backward after it, with ln1's."""
    sc = _scenario(DENSE_MLA, sp=True)
    fwd = _steps(sc, "fwd")
    comms = [(s.name, s.nbytes) for s in fwd if isinstance(s, CommStep)]
    assert comms[:2] == [("tp.ag.attn", 17_301_504), ("tp.rs.attn", 58_720_256)]
    names = [[k.name for k in s.kernels] for s in fwd if isinstance(s, ComputeStep)]
    assert names[0] == ["ln1", "q_down", "kv_down"] and names[1][:2] == ["q_up", "kv_up"]
    bwd = _steps(sc, "bwd")
    comms = [(s.name, s.nbytes) for s in bwd if isinstance(s, CommStep) and ".attn" in s.name]
    assert comms == [("tp.ag.attn.grad", 58_720_256), ("tp.ag.attn.input", 16_777_216),
                     ("tp.rs.attn.bwd", 17_301_504)]
    last = [k.name for k in bwd[-1].kernels]
    assert set(last) == {"ln1.bwd", "q_down.dgrad", "q_down.wgrad", "kv_down.dgrad", "kv_down.wgrad"}
    every = [k.name for s in bwd if isinstance(s, ComputeStep) for k in s.kernels]
    assert len(every) == len(set(every)) and {"q_up.dgrad", "kv_up.wgrad", "proj.wgrad"} <= set(every)


def test_without_sequence_parallelism_the_latent_gradient_is_all_reduced() -> None:
    """No SP: forward all-reduce of proj's output, 58,720,256 B; backward all-reduce of the
    latents' input gradient from the column-parallel up-projections, 4096 x 2048 x 2 = 16,777,216 B
    (the replicated down-projections then give every rank the same hidden-state gradient)."""
    sc = _scenario(DENSE_MLA, sp=False)
    fwd = [(s.name, s.nbytes) for s in _steps(sc, "fwd") if isinstance(s, CommStep)]
    bwd = [(s.name, s.nbytes) for s in _steps(sc, "bwd") if isinstance(s, CommStep)]
    assert fwd[0] == ("tp.ar.attn", 58_720_256) and ("tp.ar.attn.bwd", 16_777_216) in bwd


def test_deepseek_v3_runs_with_mla_at_tp2() -> None:
    """The MoE model at tp 2 with SP (Megatron-Core needs SP for MoE with TP) simulates; the MoE
    blocks' attention has the same latent all-gather as a dense block's: 1024 x 2112 x 2 B."""
    sc = Scenario.model_validate({
        "model": {**DEEPSEEK_V3, "layers": 4, "moe_layers": {"first_dense": 1}, "seq_len": 1024},
        "cluster": {"node": "dgx-h800", "nodes": 1},
        "parallelism": {"tp": 2, "sequence_parallel": True, "ep": 4, "pp": 1, "sharding": "zero1"},
        "training": {"global_batch": 4, "micro_batch": 1, "recompute": "full"}})
    r = simulator.simulate(sc)
    assert r.step_time_s > 0
    moe = LayerSpec(sc.model, shard_of(sc), "block", "fwd", moe=moe_shape(sc))
    ag = [s.nbytes for s in layer_steps(moe) if isinstance(s, CommStep) and s.name == "tp.ag.attn"]
    assert ag == [1024 * (1536 + 512 + 64) * 2]


@pytest.mark.parametrize("sp,overlap", [(False, False), (True, False), (True, True)])
def test_every_kernel_lands_in_one_step(sp: bool, overlap: bool) -> None:
    """Whatever the TP variant (plain, sequence parallel, tp_comm_overlap's pipelined steps), the
    steps hold each forward kernel of the MLA block once, and each backward kernel once."""
    from simulator.workload.model import backward_of
    from simulator.workload.steps import block_kernels

    sc = _scenario(DENSE_MLA, sp=sp)
    spec = LayerSpec(sc.model, shard_of(sc), "block", "fwd", comm_overlap=overlap)
    want = sorted(k.name for k in block_kernels(spec))
    for phase, expected in (("fwd", want), ("bwd", sorted(k.name for k in backward_of(block_kernels(spec))))):
        steps = layer_steps(LayerSpec(sc.model, shard_of(sc), "block", phase, comm_overlap=overlap))
        got = sorted(k.name for s in steps if isinstance(s, ComputeStep) for k in s.kernels)
        assert got == expected


def test_replicated_gradients_are_all_reduced_over_tp_under_sequence_parallelism() -> None:
    """Under SP each TP rank's down-projections see half the tokens, so Megatron-Core all-reduces
    their gradients over tp at the step's end (finalize_model_grads): 4 layers x (7168*1536 + 1536 +
    7168*576 + 512 = 15,140,864) x 2 B (bf16 gradients) = 121,126,912 B, once a step. Without SP no
    such all-reduce."""
    assert 7168 * 1536 + 1536 + 7168 * 576 + 512 == 15_140_864
    sims = {sp: simulator.run_simulation(_scenario(DENSE_MLA, sp=sp)) for sp in (True, False)}
    found = [r.comm.nbytes for r in sims[True].rows if r.rank == 0 and r.name == "tp.replicated_grads"]
    assert found == [4 * 15_140_864 * 2]
    assert not [r for r in sims[False].rows if r.name == "tp.replicated_grads"]
