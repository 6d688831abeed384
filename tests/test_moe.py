"""Mixture of experts and expert parallelism (issue 15): hand-derived parameter counts, the
all-to-all's bytes, expert state sharding, the routing-skew model and the fold of ep over a
stage's ranks. The scenarios are written inline (the shipped presets are data of their own)."""

from __future__ import annotations

import pytest

import simulator
from simulator.cluster.mesh import Mesh, mesh_for
from simulator.costs.moe import dispatch_bytes_per_token, expert_capacity, routing_imbalance
from simulator.errors import InfeasibleError
from simulator.scenario.spec import Scenario
from simulator.workload.activations import shard_of, state_bytes_per_param
from simulator.workload.data_parallel import expert_sharded_states, strategy_for
from simulator.workload.layout import ModelLayout
from simulator.workload.moe import moe_shape
from simulator.workload.parallel import layer_steps
from simulator.workload.steps import CommStep, ComputeStep, LayerSpec

# Mixtral 8x7B's published shape (mistralai/Mixtral-8x7B-v0.1 config.json; Jiang et al. 2024, Table 1)
MIXTRAL = {"name": "Mixtral 8x7B", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336,
           "seq_len": 4096, "vocab": 32000, "mlp": "swiglu", "norm": "rmsnorm", "position_embedding": "rotary",
           "tied_embeddings": False, "bias": False, "dropout": False, "experts": 8, "experts_per_token": 2}


def mixtral(**over: object) -> Scenario:
    """Mixtral 8x7B on 2 p5.48xlarge (16 H100), ep 8, ZeRO-1."""
    data: dict = {"model": dict(MIXTRAL), "cluster": {"node": "p5.48xlarge", "nodes": 2},
                  "parallelism": {"ep": 8, "sharding": "zero1"},
                  "training": {"global_batch": 32, "micro_batch": 1}}
    for path, value in over.items():
        section, key = path.split("__")
        data[section] = {**data[section], key: value}
    return Scenario.model_validate(data)


def test_mixtral_total_and_active_parameters() -> None:
    """Per layer: attention 4096*(4096 + 2*8*128) + 4096^2 = 41,943,040; each expert 3*4096*14336 =
    176,160,768; router 4096*8 = 32,768; two RMSNorms 8,192. Total per layer 41,943,040 + 8*176,160,768
    + 32,768 + 8,192 = 1,451,270,144; x32 = 46,440,644,608; + embedding and untied output 2*32000*4096 =
    262,144,000; + final norm 4,096 = 46,702,792,704 (46.7B). Active: 2 experts instead of 8,
    46,702,792,704 - 32*6*176,160,768 = 12,879,925,248 (12.9B)."""
    counts = ModelLayout(mixtral()).counts
    assert counts.total == 46_702_792_704
    assert counts.active == 12_879_925_248
    # model FLOPs count the active matmul parameters: active less the input embedding table
    assert counts.matmul == 12_879_925_248 - 32000 * 4096


def test_all_to_all_bytes_per_token_and_per_layer() -> None:
    """Per token and direction h x k x 2 bytes = 4096*2*2 = 16,384 B; dispatch + combine 32,768 B.
    A micro-batch of 1 x 4096 tokens puts 4096 * 16,384 = 67,108,864 B into each all-to-all of an
    MoE layer: dispatch and combine forward, and both again in the backward."""
    assert dispatch_bytes_per_token(4096, 2, 2) * 2 == 32_768
    sc = mixtral()
    for phase, names in (("fwd", ["dispatch", "combine"]), ("bwd", ["combine.bwd", "dispatch.bwd"])):
        spec = LayerSpec(sc.model, shard_of(sc), "block", phase, moe=moe_shape(sc))
        comms = [s for s in layer_steps(spec) if isinstance(s, CommStep)]
        assert [c.name for c in comms] == names
        assert all(c.op == "all_to_all" and c.axis == "ep" and c.nbytes == 67_108_864 for c in comms)


def test_expert_states_sharded_over_expert_data_parallel_group() -> None:
    """16 GPUs, ep 8, pp 1: edp = 16 / 8 = 2, dp = 16. One GPU holds 8/8 = 1 expert per layer,
    32 * 176,160,768 = 5,637,144,576 expert parameters; the distributed optimizer (zero1) shards
    their 12 B/param of fp32 Adam states over edp = 2 (33,822,867,456 B), the dense rest over dp = 16."""
    sc = mixtral()
    layout = ModelLayout(sc)
    experts = layout.expert_params_of_stage(0)
    assert experts == 32 * 176_160_768 == 5_637_144_576
    assert sc.edp == 2 and sc.dp == 16
    per = state_bytes_per_param(sc)
    assert per.optimizer == 12
    states = expert_sharded_states(strategy_for(sc, mesh_for(sc), layout), sc, 0, layout.params_of_stage(0), per)
    dense = layout.params_of_stage(0) - experts
    assert states.optimizer == pytest.approx(dense * 12 / 16 + experts * 12 / 2)
    assert states.params == pytest.approx(layout.params_of_stage(0) * per.params)


def test_one_expert_at_twice_the_mean_load_doubles_the_expert_gemms() -> None:
    """8 experts on ep 8, one expert with 2/8 of the routed tokens and the others 0.75/7 each:
    the busiest rank gets 2x the balanced share, so the routed experts' GEMMs do exactly 2x the
    FLOPs and the all-to-all messages are 2x too."""
    hist = [0.25] + [0.75 / 7] * 7
    skewed = mixtral(training__moe_routing={"histogram": hist})
    balanced = mixtral()
    assert moe_shape(skewed).factor == pytest.approx(2.0)

    def experts(sc: Scenario) -> tuple[float, float]:
        spec = LayerSpec(sc.model, shard_of(sc), "block", "fwd", moe=moe_shape(sc))
        steps = layer_steps(spec)
        step = next(s for s in steps if isinstance(s, ComputeStep) and s.name == "experts")
        comm = next(s for s in steps if isinstance(s, CommStep))
        return sum(k.flops for k in step.kernels), comm.nbytes

    (f1, b1), (f2, b2) = experts(balanced), experts(skewed)
    # balanced: 4096 tokens x 2 experts = 8192 routed rows; fc1 2*8192*4096*28672 + fc2 2*8192*14336*4096
    assert f1 == pytest.approx(3 * 2 * 8192 * 4096 * 14336)
    assert f2 == pytest.approx(2 * f1) and b2 == pytest.approx(2 * b1)


def test_dirichlet_skew_is_seeded_and_zero_skew_is_balance() -> None:
    """skew 0: every expert 1/E exactly, factor 1, spread 0. skew 0.1 (Dirichlet alpha 10): the busiest
    of 8 ranks of 8 experts is above the mean, and the same seed gives the same draws."""
    args = {"experts": 64, "ep": 8, "tokens": 4096, "top_k": 8, "samples": 32}
    flat = routing_imbalance(skew=0.0, seed=0, **args)
    assert (flat.factor, flat.spread, flat.dropped_fraction) == (1.0, 0.0, 0.0)
    a, b = routing_imbalance(skew=0.1, seed=3, **args), routing_imbalance(skew=0.1, seed=3, **args)
    assert a == b and a.factor > 1.0 and a.spread > 0.0
    assert routing_imbalance(skew=0.5, seed=3, **args).factor > a.factor


def test_capacity_factor_drops_tokens_above_capacity() -> None:
    """E = 8, k = 2, 4096 tokens per rank, cf 1.0: capacity ceil(4096*2/8*1.0) = 1024 per source rank,
    8 * 1024 = 8192 per expert over the ep 8 group. An expert with half of the 65,536 routed tokens
    (32,768) keeps 8192: 24,576 dropped = 37.5%; the busiest rank is then at the balanced share, 1.0."""
    assert expert_capacity(4096, 8, 2, 1.0) == 1024
    imb = routing_imbalance(experts=8, ep=8, tokens=4096, top_k=2, skew=0.0, seed=0, samples=1,
                            histogram=[0.5] + [0.5 / 7] * 7, capacity_factor=1.0)
    assert imb.dropped_fraction == pytest.approx(0.375)
    assert imb.factor == pytest.approx(1.0)


def test_expert_groups_fold_over_the_stage() -> None:
    """tp 1, pp 2, dp 8 (world 16): stage 0 is ranks 0, 2, 4, ..., 14 (pp inside dp); with ep 4 the ep
    groups are 4 consecutive stage ranks (0, 2, 4, 6) and edp = 8/4 = 2 joins ranks 0 and 8."""
    mesh = Mesh.from_sizes(pp=2, dp=8, ep=4)
    assert mesh.group(0, "ep") == (0, 2, 4, 6)
    assert mesh.group(6, "ep") == (0, 2, 4, 6)
    assert mesh.group(8, "ep") == (8, 10, 12, 14)
    assert mesh.group(2, "edp") == (2, 10)
    assert mesh.group(1, "ep") == (1, 3, 5, 7)


def test_moe_layers_rule() -> None:
    """{first_dense: 3} on 61 layers: 58 MoE layers (DeepSeek-V3); {every: 2}: layers 1, 3, 5, ..."""
    m = mixtral().model
    first = type(m).model_validate({**m.model_dump(), "layers": 61, "moe_layers": {"first_dense": 3}})
    assert first.n_moe_layers == 58 and not first.is_moe_layer(2) and first.is_moe_layer(3)
    every = type(m).model_validate({**m.model_dump(), "moe_layers": {"every": 2}})
    assert [i for i in range(6) if every.is_moe_layer(i)] == [1, 3, 5]


@pytest.mark.parametrize(("over", "field"), [
    ({"parallelism__ep": 3}, "parallelism.ep"),   # 3 divides neither 8 experts nor 16 ranks
    ({"parallelism__tp": 2}, "parallelism.sequence_parallel"),  # Megatron-Core: MoE with tp needs SP
    ({"parallelism__etp": 4}, "parallelism.etp"),  # ep*etp = 8*4 = 32 does not divide 16 ranks
])
def test_bad_layouts_name_their_field(over: dict, field: str) -> None:
    with pytest.raises(InfeasibleError) as err:
        mixtral(**over)
    assert err.value.field == field


def test_ep_needs_experts() -> None:
    data = {"model": {k: v for k, v in MIXTRAL.items() if k not in ("experts", "experts_per_token")},
            "cluster": {"node": "p5.48xlarge", "nodes": 2}, "parallelism": {"ep": 8},
            "training": {"global_batch": 32}}
    with pytest.raises(InfeasibleError) as err:
        Scenario.model_validate(data)
    assert err.value.field == "parallelism.ep"


def test_simulated_step_reports_moe_summary() -> None:
    """The DES runs the all-to-alls on the ep stream: the summary reports their share, the active
    parameters, and with the 2x histogram the imbalance costs (f - 1)/f = half of the expert phase."""
    base = simulator.simulate(mixtral())
    assert base.moe is not None and base.moe.params_active == 12_879_925_248
    assert base.moe.all_to_all_s > 0 and 0 < base.moe.all_to_all_share < 1
    assert base.moe.imbalance_s == 0.0
    skewed = simulator.simulate(mixtral(training__moe_routing={"histogram": [0.25] + [0.75 / 7] * 7}))
    assert skewed.moe is not None and skewed.moe.imbalance_slowdown == pytest.approx(2.0)
    assert skewed.moe.imbalance_s == pytest.approx((skewed.moe.expert_compute_s + skewed.moe.all_to_all_s) / 2)
    assert skewed.step_time_s > base.step_time_s


def test_inter_node_all_to_all_costs_more_than_nvlink() -> None:
    """16 experts of Mixtral's shape on 2 p5.48xlarge. ep 8 keeps each all-to-all in a node: 7/8 of a
    rank's 67 MB leave over NVLink (450 GB/s per GPU). ep 16 spans both nodes: 8/16 of the bytes
    cross EFA, 400 GB/s per node = 50 GB/s per GPU, so the exchange takes about
    (0.5 / 50) / (0.875 / 450) = 5.1x longer; more than 3x is asserted (latency, contention)."""
    model = {**MIXTRAL, "experts": 16}
    intra = simulator.simulate(mixtral(model__experts=16, parallelism__ep=8))
    inter = simulator.simulate(Scenario.model_validate(
        {"model": model, "cluster": {"node": "p5.48xlarge", "nodes": 2},
         "parallelism": {"ep": 16, "sharding": "zero1"}, "training": {"global_batch": 32}}))
    assert intra.moe is not None and inter.moe is not None
    assert inter.moe.all_to_all_s > 3 * intra.moe.all_to_all_s


def test_allgather_dispatcher_gathers_the_ep_groups_tokens() -> None:
    """allgather: each rank all-gathers the ep group's 8 x 4096 tokens x 4096 x 2 B = 268,435,456 B
    and reduce-scatters the outputs back (Megatron-Core MoEAllGatherTokenDispatcher)."""
    sc = mixtral(parallelism__moe={"dispatcher": "allgather"})
    spec = LayerSpec(sc.model, shard_of(sc), "block", "fwd", moe=moe_shape(sc))
    comms = [s for s in layer_steps(spec) if isinstance(s, CommStep)]
    assert [(c.op, c.nbytes) for c in comms] == [("all_gather", 268_435_456), ("reduce_scatter", 268_435_456)]


def test_model_and_hardware_flops_count_active_parameters() -> None:
    """Mixtral, full recompute. Model FLOPs per token 6 x 12,748,853,248 active matmul parameters +
    12*32*4096*4096 = 82,935,570,432; recomputation adds 2 x 12,617,777,152 active layer parameters +
    4*32*4096*4096 = 27,383,037,952, so hardware / model = 110,318,608,384 / 82,935,570,432."""
    r = simulator.simulate(mixtral(training__recompute="full"))
    assert r.model_flops_per_step == pytest.approx(82_935_570_432 * 32 * 4096)
    assert r.hardware_tflops_per_gpu / r.tflops_per_gpu == pytest.approx(110_318_608_384 / 82_935_570_432)
    assert "active parameters" in r.flops_convention


DEEPSEEK_V3 = {"name": "DeepSeek-V3", "layers": 61, "hidden": 7168, "heads": 128, "ffn_hidden": 18432, "seq_len": 4096,
               "vocab": 129280, "mlp": "swiglu", "norm": "rmsnorm", "position_embedding": "rotary",
               "tied_embeddings": False, "bias": False, "dropout": False, "experts": 256, "experts_per_token": 8,
               "shared_experts": 1, "expert_ffn_hidden": 2048, "moe_layers": {"first_dense": 3},
               "router": "sigmoid-topk", "attention": "mla",
               "mla": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                       "v_head_dim": 128}}


def test_deepseek_v3_total_and_active_parameters_with_mla() -> None:
    """DeepSeek-V3's config (arXiv:2412.19437 §4.2; 671B total, 37B active). MLA per layer:
    q 7168*1536 + 1536 + 1536*128*192 = 48,760,320; kv 7168*(512+64) + 512 + 512*128*256 = 20,906,496;
    out 128*128*7168 = 117,440,512; 187,107,328 in all. Dense layer: + 3*7168*18432 + 2*7168 =
    583,483,392 (x3). MoE layer: + router 7168*256 + 257 experts * 3*7168*2048 + 2*7168 =
    11,507,286,016 (x58). Embedding and output 2*129280*7168 = 1,853,358,080; final norm 7168.
    Total 671,026,404,352. Active: 9 experts per MoE layer, 585,318,400 x 58 + 1,750,450,176 +
    1,853,358,080 + 7168 = 37,552,282,624."""
    sc = Scenario.model_validate({"model": DEEPSEEK_V3, "cluster": {"node": "dgx-h800", "nodes": 32},
                                  "parallelism": {"pp": 16, "ep": 16, "sharding": "zero1",
                                                  "stage_layers": [3] + [4] * 14 + [2]},
                                  "training": {"global_batch": 256}})
    counts = ModelLayout(sc).counts
    assert (counts.total, counts.active) == (671_026_404_352, 37_552_282_624)
    assert sc.edp == 1  # 256 GPUs / (pp 16 * ep 16)


def test_mla_attention_kernels_follow_the_ranks() -> None:
    """One 4096-token sequence: q_down 2*4096*7168*1536, q_up 2*4096*1536*24576, kv_down 2*4096*7168*576,
    kv_up 2*4096*512*32768, and the causal attention 2*128*4096*4096*(192+128)/2 FLOPs."""
    sc = Scenario.model_validate({"model": DEEPSEEK_V3, "cluster": {"node": "dgx-h800", "nodes": 32},
                                  "parallelism": {"pp": 16, "stage_layers": [3] + [4] * 14 + [2]},
                                  "training": {"global_batch": 256}})
    steps = layer_steps(LayerSpec(sc.model, shard_of(sc), "block", "fwd"))
    flops = {k.name: k.flops for s in steps if isinstance(s, ComputeStep) for k in s.kernels}
    T = 4096
    assert flops["q_down"] == 2 * T * 7168 * 1536 and flops["q_up"] == 2 * T * 1536 * 128 * 192
    assert flops["kv_down"] == 2 * T * 7168 * 576 and flops["kv_up"] == 2 * T * 512 * 128 * 256
    assert flops["attention"] == pytest.approx(2 * 128 * T * T * 320 / 2)
    assert flops["proj"] == 2 * T * 128 * 128 * 7168


def test_mla_refuses_what_it_does_not_model() -> None:
    with pytest.raises(InfeasibleError) as err:
        Scenario.model_validate({"model": DEEPSEEK_V3, "cluster": {"node": "dgx-h800", "nodes": 32},
                                 "parallelism": {"pp": 16, "ep": 16, "stage_layers": [3] + [4] * 14 + [2]},
                                 "training": {"global_batch": 256, "recompute": "selective-op"}})
    assert err.value.field == "training.recompute" and "latent attention" in str(err.value)
