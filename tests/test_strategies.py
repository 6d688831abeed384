"""Issue-3 checks: model states per ZeRO stage, pipeline bubbles, bytes on the wire per strategy."""

import pytest

import simulator
from tests.conftest import small_scenario


def _sim(**over):
    return simulator.simulate(simulator.Scenario.model_validate(small_scenario(**over)))


# 8 x dgx-a100 = 64 GPUs; GPT-3 1.3B; a persistence threshold of 1 element shards everything
ND = 64
BASE = dict(model="gpt3-1.3b", cluster={"node": "dgx-a100", "nodes": 8},
            training={"micro_batch": 1, "global_batch": 64})


def _states(result):
    m = result.memory[0]
    return m.params_bytes + m.grads_bytes + m.optimizer_bytes


@pytest.mark.parametrize(
    ("sharding", "per_param"),
    [("none", 16.0), ("zero1", 4 + 12 / ND), ("zero2", 2 + 14 / ND), ("zero3", 16 / ND)],
)
def test_zero_model_states_per_gpu(sharding, per_param):
    """ZeRO §5 at N_d = 64: 16 Psi, 4 Psi + 12 Psi/N_d, 2 Psi + 14 Psi/N_d, 16 Psi/N_d."""
    zero = {"zero": {"param_persistence_threshold": 1}} if sharding != "none" else {}  # ZeRO options need ZeRO
    r = _sim(**BASE, parallelism={"sharding": sharding, **zero})
    assert _states(r) == pytest.approx(per_param * r.params, rel=1e-6)


def test_mics_model_states_are_16_psi_over_p():
    r = _sim(**BASE, parallelism={"sharding": "mics", "shard_group_size": 8,
                                  "zero": {"param_persistence_threshold": 1}})
    assert _states(r) == pytest.approx(16 * r.params / 8, rel=1e-6)


def test_fsdp_and_hsdp_shard_everything_over_their_groups():
    fsdp = _sim(**BASE, parallelism={"sharding": "fsdp"})
    hsdp = _sim(**BASE, parallelism={"sharding": "hsdp", "shard_group_size": 8})
    assert _states(fsdp) == pytest.approx(16 * fsdp.params / 64, rel=1e-6)
    assert _states(hsdp) == pytest.approx(16 * hsdp.params / 8, rel=1e-6)


# -- pipeline bubbles ------------------------------------------------------------------------

TINY_VOCAB = {"preset": "gpt3-1.3b", "vocab": 256, "layers": 16}


def _pipeline(pp, schedule="1f1b", v=1, m=8):
    """pp stages on one node (NVLink p2p ~1% of a stage's compute), micro-batches of 8 x 2048 tokens."""
    par = {"pp": pp, "pipeline_schedule": schedule, "virtual_stages": v}
    return simulator.simulate(simulator.Scenario.model_validate(small_scenario(
        model=TINY_VOCAB, cluster={"node": "dgx-a100", "nodes": 1, "gpus_per_node": pp},
        parallelism=par, training={"micro_batch": 8, "global_batch": 8 * m})))


@pytest.mark.parametrize(("schedule", "pp", "v"), [("1f1b", 4, 1), ("gpipe", 4, 1), ("interleaved", 4, 2)])
def test_bubble_matches_the_schedule_formula(schedule, pp, v):
    """Equal stages, little communication: p * step_p / step_1 = 1 + (p-1)/(v*m) with m = 8
    micro-batches (Narayanan et al. SC'21 §2.2): 1.375 for 1F1B and GPipe, 1.1875 interleaved."""
    m = 8
    single = _pipeline(1, m=m)
    piped = _pipeline(pp, schedule, v, m=m)
    ratio = pp * piped.step_time_s / single.step_time_s
    assert ratio == pytest.approx(1 + (pp - 1) / (v * m), rel=0.02)
    assert piped.breakdown.bubble_s > 0


def test_end_of_step_gradient_reduction_does_not_stretch_the_pipeline():
    """ZeRO-1 without overlap_comm reduces gradients after each stage's last backward
    (DeepSpeed's ReduceGrads, Megatron's finalize_model_grads), so stage 0 still idles
    (p - 1) forward-backward slots: bubble / compute = (p - 1) / m = 3 / 8. Reductions inside
    the last backward would make every later stage's buckets delay the earlier stages."""
    pp, m = 4, 8
    r = simulator.simulate(simulator.Scenario.model_validate(small_scenario(
        model=TINY_VOCAB, cluster={"node": "dgx-a100", "nodes": 2, "gpus_per_node": pp},
        parallelism={"pp": pp, "sharding": "zero1", "zero": {"reduce_bucket_size": 2_000_000}},
        training={"micro_batch": 8, "global_batch": 2 * 8 * m})))
    first = next(b for b in r.stage_breakdown if b.stage == 0)
    assert r.wire_bytes_per_rank["dp"] > 0
    assert first.bubble_s / first.compute_s == pytest.approx((pp - 1) / m, rel=0.05)


def test_1f1b_bounds_in_flight_activations_by_the_stage():
    """1F1B: stage i holds at most p - i micro-batches; GPipe holds all m."""
    onef = _pipeline(4, "1f1b", m=8)
    gpipe = _pipeline(4, "gpipe", m=8)
    act = {m.stage: m.activations_bytes for m in onef.memory}
    assert act[0] > act[3]  # the first stage keeps the most micro-batches in flight
    assert act[0] == pytest.approx(act[3] * 4, rel=0.1)  # 4 in flight against 1
    assert max(m.activations_bytes for m in gpipe.memory) > 1.9 * act[0]  # 8 against 4


# -- bytes on the wire -------------------------------------------------------------------------


def test_data_parallel_bytes_per_rank():
    """DDP sends 2(N-1)/N * Psi * e bytes per rank per step: Psi = 1,315,723,264 params of
    GPT-3 XL, bf16 gradients (e = 2), N = 64."""
    r = _sim(**BASE)
    assert r.wire_bytes_per_rank["dp"] == pytest.approx(2 * 63 / 64 * r.params * 2, rel=1e-6)


def test_zero3_sends_one_and_a_half_times_data_parallel():
    """ZeRO-3: forward all-gather + backward all-gather + reduce-scatter, (N-1)/N * Psi * e
    each = 1.5x DDP's all-reduce (ZeRO §7.2.2); the gradient-norm all-reduce is 8 bytes."""
    ddp = _sim(**BASE)
    z3 = _sim(**BASE, parallelism={"sharding": "zero3", "zero": {"param_persistence_threshold": 1}})
    z3_bytes = z3.wire_bytes_per_rank["shard"] + z3.wire_bytes_per_rank.get("dp", 0.0)
    assert z3_bytes == pytest.approx(1.5 * ddp.wire_bytes_per_rank["dp"], rel=1e-4)


def test_tensor_parallel_bytes_per_layer():
    """Megatron TP: 4 all-reduces of b*s*h*e per layer per micro-batch, 8*b*s*h*(t-1)/t elements
    per rank (Narayanan §3.2); t = 8, b = 1, s = 2048, h = 2048, 24 layers, 8 micro-batches,
    plus the embedding's and the loss's all-reduces."""
    r = _sim(model="gpt3-1.3b", cluster={"node": "dgx-a100", "nodes": 1}, parallelism={"tp": 8},
             training={"micro_batch": 1, "global_batch": 8})
    b, s, h, t, e = 1, 2048, 2048, 8, 2
    per_layer = 8 * b * s * h * (t - 1) / t * e
    embedding = 2 * (t - 1) / t * b * s * h * e
    loss = 2 * (t - 1) / t * 3 * b * s * 4
    logits_bwd = 2 * (t - 1) / t * b * s * h * e
    assert r.wire_bytes_per_rank["tp"] == pytest.approx(8 * (24 * per_layer + embedding + loss + logits_bwd), rel=1e-9)


def test_sequence_parallel_moves_the_same_bytes_as_tp():
    """SP replaces each all-reduce by a reduce-scatter + all-gather: the same (t-1)/t volume,
    plus backward's re-gather of the saved input: 4 AG + 2 RS against 2 AR in backward."""
    tp = _sim(model="gpt3-1.3b", cluster={"node": "dgx-a100", "nodes": 1}, parallelism={"tp": 8},
              training={"micro_batch": 1, "global_batch": 8})
    sp = _sim(model="gpt3-1.3b", cluster={"node": "dgx-a100", "nodes": 1},
              parallelism={"tp": 8, "sequence_parallel": True}, training={"micro_batch": 1, "global_batch": 8})
    assert sp.wire_bytes_per_rank["tp"] > tp.wire_bytes_per_rank["tp"]
    assert sp.memory[0].activations_bytes < tp.memory[0].activations_bytes


def test_mics_keeps_parameter_traffic_off_the_network():
    """4 x p4d, shard group 8 (one node): MiCS moves parameters over NVLink only; its network
    bytes (the boundary all-reduce of Psi*e/8 shards) are far below ZeRO-3's 3 x Psi*e."""
    common = dict(model="gpt3-1.3b", cluster={"node": "p4d.24xlarge", "nodes": 4},
                  training={"micro_batch": 1, "global_batch": 64}, sim={"symmetry": "off"})
    z3 = _sim(**common, parallelism={"sharding": "zero3"})
    mics = _sim(**common, parallelism={"sharding": "mics", "shard_group_size": 8})
    assert mics.link_bytes["efa"] < 0.5 * z3.link_bytes["efa"]
    assert mics.link_bytes["nvlink"] > z3.link_bytes["nvlink"]


def test_hsdp_all_reduces_shards_every_micro_step_mics_once():
    common = dict(model="gpt3-1.3b", cluster={"node": "dgx-a100", "nodes": 4},
                  training={"micro_batch": 1, "global_batch": 128})  # 4 micro-batches
    hsdp = _sim(**common, parallelism={"sharding": "hsdp", "shard_group_size": 8})
    mics = _sim(**common, parallelism={"sharding": "mics", "shard_group_size": 8})
    assert hsdp.wire_bytes_per_rank["dp"] == pytest.approx(4 * mics.wire_bytes_per_rank["dp"], rel=0.01)


def _mics_vs_zero3(node, precision):
    times = {}
    for sharding in ("zero3", "mics"):
        par = {"sharding": sharding, **({"shard_group_size": 8} if sharding == "mics" else {})}
        times[sharding] = _sim(model={"preset": "gpt3-13b", "seq_len": 512}, cluster={"node": node, "nodes": 16},
                               parallelism=par, training={"micro_batch": 8, "global_batch": 4096,
                                                          "precision": precision, "recompute": "full"}).step_time_s
    return times["zero3"] / times["mics"]


def test_mics_beats_zero3_on_p3dn_and_the_gap_shrinks_on_p4d():
    """MiCS (Zhang et al. VLDB'23): with 100 Gb/s of first-generation EFA per p3dn node, ZeRO-3
    moves 3 x Psi x e across nodes every micro-step (4 here), MiCS-8 keeps gathers and
    reduce-scatters on NVLink and all-reduces Psi*e/8 shards once: markedly faster. With
    4 x 100 Gb/s on p4d and A100 compute, ZeRO-3's traffic hides behind compute."""
    p3dn = _mics_vs_zero3("p3dn.24xlarge", "fp16")
    p4d = _mics_vs_zero3("p4d.24xlarge", "bf16")
    assert p3dn > 1.5
    assert p4d < p3dn and p4d < 1.2


def test_tp_comm_overlap_pairs_each_collective_with_its_gemm():
    """Megatron-Core --tp-comm-overlap, ideal overlap (overlap_slowdown 0): a forward layer
    takes ln1 + max(AG, qkv) + core + max(RS, proj) + ln2 + max(AG, fc1) + act + max(RS, fc2)
    + out, against the sum of all of them without the overlap. Read back from the fused
    layer's timeline (GPT-3 1.3B, tp 8 with SP on one DGX H100, b = 1)."""
    common = dict(model="gpt3-1.3b", cluster={"node": "dgx-h100", "nodes": 1},
                  training={"micro_batch": 1, "global_batch": 1}, sim={"overlap_slowdown": 0})

    def layer_parts(overlap):
        sc = simulator.Scenario.model_validate(
            small_scenario(**common, parallelism={"tp": 8, "sequence_parallel": True, "tp_comm_overlap": overlap}))
        fwd = next(row for row in simulator.run_simulation(sc).rows if row.info and row.info.fused and row.name.startswith("fwd."))
        parts = {p.name: p for p in fwd.info.fused.parts}
        return parts, parts["block2.ln1"][2] - parts["block1.ln1"][2]

    parts, layer_s = layer_parts(True)
    d = {name.removeprefix("block1."): p[3] for name, p in parts.items() if name.startswith("block1.")}
    expected = (d["ln1"] + max(d["tp.ag.attn"], d["qkv"]) + d["core"] + max(d["tp.rs.attn"], d["proj"]) + d["ln2"]
                + max(d["tp.ag.mlp"], d["fc1"]) + d["act"] + max(d["tp.rs.mlp"], d["fc2"]) + d["out"])
    assert layer_s == pytest.approx(expected, rel=1e-9)
    _, serial_s = layer_parts(False)
    assert serial_s == pytest.approx(sum(d.values()), rel=1e-9)
    assert layer_s < serial_s


def test_fsdp_without_gradient_sync_reduces_once_and_holds_unsharded_gradients():
    """fsdp.reduce_every_microbatch: false (torch pipelining's no-sync FSDP2 backward): 4 micro-
    batches (global 256 on 64 GPUs) reduce-scatter each unit once instead of 4 times, so the rank
    sends 3 reduce-scatters less, 3 x (63/64) x Psi x 2 bytes (bf16 reduction); at the peak it
    holds the whole unsharded gradient, 2 x Psi bytes, beside its 2/64 x Psi shard."""
    common = dict(model="gpt3-1.3b", cluster={"node": "dgx-a100", "nodes": 8},
                  training={"micro_batch": 1, "global_batch": 256})
    sync = _sim(**common, parallelism={"sharding": "fsdp"})
    no_sync = _sim(**common, parallelism={"sharding": "fsdp", "fsdp": {"reduce_every_microbatch": False}})
    psi = sync.params
    saved = sync.wire_bytes_per_rank["shard"] - no_sync.wire_bytes_per_rank["shard"]
    assert saved == pytest.approx(3 * 63 / 64 * psi * 2, rel=1e-9)
    assert sync.memory[0].grads_bytes == pytest.approx(2 * psi / 64, rel=1e-9)
    assert no_sync.memory[0].grads_bytes == pytest.approx(2 * psi + 2 * psi / 64, rel=1e-9)


def test_fsdp2_copies_each_all_gather_out_into_per_parameter_tensors():
    """FSDP2's buffers (fsdp.py docstring): a GPT-3 125M block (h = 768, F = 3072, biases) has
    6 parameter tensors of 2 bytes per element: ln1 and ln2 2*768 = 1536 elements (3072 B each),
    qkv 768*2304 + 2304 = 1,771,776 (3,543,552 B), proj 768*768 + 768 = 590,592 (1,181,184 B),
    fc1 768*3072 + 3072 = 2,362,368 (4,724,736 B), fc2 3072*768 + 768 = 2,360,064
    (4,720,128 B): 14,175,744 B, the size of the block's flat all-gather output. Forward: block
    2's copy-out frees block 1's flat output (held until the next copy-out) and allocates the six
    tensors; block 1's frees the root embedding's, (50257 + 2048) * 768 * 2 = 80,340,480 B.
    Backward: a block's copy-out frees its own flat output. Releases free the six tensors."""
    from simulator.workload import build_workload, compute_profile

    sc = simulator.Scenario.model_validate(small_scenario(parallelism={"sharding": "fsdp"},
                                                          training={"micro_batch": 1, "global_batch": 16}))
    program = build_workload(sc, compute_profile(sc.cluster.gpu_spec, None), gpus_per_node=8).build()
    tasks = [t for t in program.tasks if t.rank == 0]
    block = [3072.0, 3543552.0, 1181184.0, 3072.0, 4724736.0, 4720128.0]
    assert sum(block) == 14175744.0
    copy_outs = [[d.nbytes for d in t.mem] for t in tasks if t.name == "copy_out.u2"]
    assert copy_outs == [[-14175744.0, *block]] * 2  # forward (block 1's flat), backward (its own)
    assert next(d.nbytes for t in tasks if t.name == "copy_out.u1" for d in t.mem) == -80340480.0
    flat = [t.mem[0].nbytes for t in tasks if t.name.endswith("allgather.u2")]
    assert flat == [14175744.0] * 2 and all(t.stream == "shard" for t in tasks if "allgather" in t.name)
    releases = [[d.nbytes for d in t.mem] for t in tasks if t.name == "release.u2"]
    assert releases == [[-b for b in block]] * 2
