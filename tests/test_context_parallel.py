"""Context parallelism: the ring of per-step attention calls and the K/V exchange of each
implementation (simulator/workload/parallel/context.py), by hand."""

from __future__ import annotations

import pytest

import simulator
from simulator.costs.attention import AttentionShape
from simulator.scenario.model import ModelSpec
from simulator.workload.model import Shard, block_forward
from simulator.workload.parallel import layer_steps
from simulator.workload.parallel.context import kv_elements, merge_bytes, ring_blocks
from simulator.workload.steps import CommStep, ComputeStep, LayerSpec, base_steps

# Llama-3-8B-like: h 4096, 32 query heads of 128, 8 kv heads; s = 16384 over cp = 4 (4096 each)
MODEL = ModelSpec(layers=1, hidden=4096, heads=32, kv_heads=8, seq_len=16384, vocab=32000)
SHARD = Shard(batch=1, seq=16384, cp=4)
KV = 2 * 4096 * 8 * 128  # K and V of one rank's 4096 tokens, 8 kv heads: 8,388,608 elements
Q = 4096 * 32 * 128  # the local queries' output: 16,777,216 elements


def _spec(phase: str, comm: str = "ring-p2p", heads: str = "grouped") -> LayerSpec:
    return LayerSpec(MODEL, SHARD, "block", phase, cp_comm=comm, cp_kv_heads=heads)


def _ring(steps: list) -> list:
    """The steps from the first CP exchange to the last ring step (the core's part of the layer)."""
    first = next(i for i, s in enumerate(steps) if isinstance(s, CommStep) and s.axis == "cp")
    last = max(i for i, s in enumerate(steps) if (isinstance(s, ComputeStep) and "ring" in s.name)
               or (isinstance(s, CommStep) and s.axis == "cp"))
    return steps[first:last + 1]


def test_kv_elements_grouped_and_repeated():
    """2 * b * s/cp * heads/tp * d: 8 kv heads -> 2 * 4096 * 8 * 128 = 8,388,608; repeated to the
    32 query heads, 4x that."""
    assert kv_elements(_spec("fwd")) == KV
    assert kv_elements(_spec("fwd", heads="repeated")) == 4 * KV


def test_ring_blocks_split_flops_and_shapes():
    """cp = 4, causal: four steps of F/4 each; step 0 the masked 4096 block, steps 1-3 unmasked
    4096 x 2048 blocks looked up at their shorter side, 2048."""
    (core,) = [k for k in block_forward(MODEL, SHARD) if k.kind == "attention"]
    steps = ring_blocks([core], 4, True)
    assert [s[0].attn for s in steps] == [AttentionShape(4096, 128, 1.0)] + [AttentionShape(2048, 128, 0.0)] * 3
    assert sum(s[0].flops for s in steps) == pytest.approx(core.flops)
    assert [s[0].name for s in steps] == ["attention.ring0", "attention.ring1", "attention.ring2", "attention.ring3"]
    unmasked = ring_blocks([core], 4, False)
    assert {s[0].attn for s in unmasked} == {AttentionShape(4096, 128, 0.0)}


def test_merge_bytes_by_hand():
    """bf16 (e = 2). Forward, both: Q * (2 + 2*4) = 10 B per output element = 167,772,160.
    Backward, PyTorch (fp32 accumulators): (Q + KV) * 10 + KV * 8 (fp32 send copy)
    = 251,658,240 + 67,108,864 = 318,767,104; Transformer Engine (K/V-dtype buffers): (Q + KV) * 6."""
    assert merge_bytes(_spec("fwd", "allgather"), backward=False) == Q * 10
    assert merge_bytes(_spec("fwd"), backward=False) == Q * 10
    assert merge_bytes(_spec("bwd", "allgather"), backward=True) == (Q + KV) * 10 + KV * 8
    assert merge_bytes(_spec("bwd"), backward=True) == (Q + KV) * 6


def test_ring_p2p_steps():
    """Transformer Engine, cp = 4. Forward: a hop of the K/V block (KV * 2 B) beside steps 0-2,
    costed as an all-gather of 4/3 of it; step 3 alone. Backward: step 0 carries K/V, steps 1-2
    K/V and dK/dV, step 3 dK/dV, each beside its step; nothing after."""
    kv = KV * 2.0
    fwd = _ring(layer_steps(_spec("fwd")))
    assert [(type(s).__name__, s.name) for s in fwd] == [
        ("CommStep", "cp.kv.p2p0"), ("ComputeStep", "attention.ring0"), ("CommStep", "cp.kv.p2p1"),
        ("ComputeStep", "attention.ring1"), ("CommStep", "cp.kv.p2p2"), ("ComputeStep", "attention.ring2"),
        ("ComputeStep", "attention.ring3")]
    assert all(s.op == "all_gather" and s.overlap and s.nbytes == pytest.approx(kv * 4 / 3)
               for s in fwd if isinstance(s, CommStep))
    bwd = _ring(layer_steps(_spec("bwd")))
    comms = [s for s in bwd if isinstance(s, CommStep)]
    assert [c.nbytes for c in comms] == pytest.approx([kv * 4 / 3, 2 * kv * 4 / 3, 2 * kv * 4 / 3, kv * 4 / 3])
    assert all(c.overlap for c in comms) and isinstance(bwd[-1], ComputeStep)
    assert [k.name for k in bwd[-1].kernels] == ["attention.ring3.bwd", "attention.bwd.merge3"]


def test_allgather_steps():
    """PyTorch's all-gather rotater, cp = 4. Forward: one all-gather of all four K/V blocks beside
    step 0, then steps 1-3 with nothing beside. Backward: the all-gather beside step 0, the fp32
    dK/dV (KV * 4 B) hopping beside steps 1-3, and its last hop after step 3, not overlapped."""
    fwd = _ring(layer_steps(_spec("fwd", "allgather")))
    assert isinstance(fwd[0], CommStep) and fwd[0].nbytes == KV * 2.0 * 4 and fwd[0].overlap
    assert [s.name for s in fwd[1:]] == [f"attention.ring{i}" for i in range(4)]
    bwd = _ring(layer_steps(_spec("bwd", "allgather")))
    comms = [s for s in bwd if isinstance(s, CommStep)]
    assert comms[0].nbytes == KV * 2.0 * 4
    assert [c.nbytes for c in comms[1:]] == pytest.approx([KV * 4.0 * 4 / 3] * 4)
    assert [c.overlap for c in comms] == [True, True, True, True, False]
    assert bwd[-1] is comms[-1]


def test_flops_unchanged_by_the_ring():
    """Splitting the core changes no FLOPs: the layer's total equals the same layer at cp = 1 on
    s/cp queries against s keys (the kernel list of the model), for both implementations."""
    def flops(steps: list) -> float:
        return sum(k.flops for s in steps if isinstance(s, ComputeStep) for k in s.kernels)
    base = LayerSpec(MODEL, SHARD, "block", "bwd")
    for comm in ("ring-p2p", "allgather"):
        assert flops(layer_steps(_spec("bwd", comm))) == pytest.approx(flops(base_steps(base)))


def test_torchtitan_profile_runs_allgather_and_its_exchange_is_exposed_across_nodes():
    """The torchtitan profile sets cp_comm: allgather; with cp across nodes (tp 8 fills a node,
    torchtitan's mesh puts cp outside tp) the all-gather of 7 blocks beside one step shows as
    exposed cp time, more than the ring's hops beside every step."""
    sc = simulator.load_scenario("scenarios/llama3-8b-tp-sp-cp-h100.yaml")
    assert sc.parallelism.cp_comm == "ring-p2p"
    par = sc.parallelism
    model = sc.model.model_copy(update={"seq_len": 131072})
    wide = sc.model_copy(update={"model": model, "cluster": sc.cluster.model_copy(update={"nodes": 4}),
                                 "parallelism": par.model_copy(update={"tp": 8, "cp": 4})})
    ring = simulator.simulate(wide).breakdown.exposed_comm_s.get("cp", 0.0)
    gather = simulator.simulate(wide.model_copy(update={"parallelism": wide.parallelism.model_copy(
        update={"cp_comm": "allgather"})})).breakdown.exposed_comm_s.get("cp", 0.0)
    assert gather > ring


@pytest.mark.parametrize("comm", ["ring-p2p", "allgather"])
def test_fused_layers_match_the_per_task_program(comm: str, monkeypatch: pytest.MonkeyPatch):
    """tp 2 x cp 4 in one DGX H100 (dp 1): the fused layers (closed-form timeline of the ring
    steps and hops) and the per-task program (every ring step and hop a task on the engine) give
    the same step time, for both implementations (to 0.1%; they differ by 0.03% here)."""
    sc = simulator.load_scenario("scenarios/llama3-8b-tp-sp-cp-h100.yaml")
    sc = sc.model_copy(update={"cluster": sc.cluster.model_copy(update={"nodes": 1}),
                               "training": sc.training.model_copy(update={"global_batch": 8}),
                               "parallelism": sc.parallelism.model_copy(update={"cp_comm": comm})})
    monkeypatch.setattr("simulator.workload.builder.layer_comm_private", lambda *a: False)
    tasks = simulator.run_simulation(sc)
    monkeypatch.setattr("simulator.workload.builder.layer_comm_private", lambda *a: True)
    fused = simulator.run_simulation(sc)
    assert len(fused.rows) < len(tasks.rows)  # the fused path really ran
    assert fused.result.step_time_s == pytest.approx(tasks.result.step_time_s, rel=1e-3)
