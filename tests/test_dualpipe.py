"""DualPipe (issue 15 item 3): DeepSeek-V3's bidirectional pipeline schedule (arXiv:2412.19437
§3.2.1, Figure 5, Table 2; the order of ``DualPipe.step`` in deepseek-ai/DualPipe at 3da1bbea).

Actions are written ``F3.0`` (forward of micro-batch 3 through local chunk 0), ``B``/``I``/``W``
(full backward, input-gradient backward with its weight gradients deferred, the deferred
weight gradients), ``*`` after a forward paired (overlapped) with the backward after it.
"""

from __future__ import annotations

from fractions import Fraction
from itertools import pairwise

import pytest

import simulator
from simulator.cluster.mesh import mesh_for
from simulator.errors import InfeasibleError
from simulator.scenario.spec import Scenario
from simulator.workload.builder import build_workload
from simulator.workload.layout import ModelLayout
from simulator.workload.pipeline.schedules import pipeline_schedule
from simulator.workload.profile import compute_profile
from tests.conftest import cross_microbatch_overlaps, small_scenario


def _names(actions):
    return " ".join(f"{a.kind}{a.microbatch}.{a.chunk}{'*' if a.paired else ''}" for a in actions)


def test_rank_0_order_follows_the_eight_steps():
    """pp = 4, m = 8, rank 0: h = 0, P = pp/2 = 2, M = m/2 = 4; chunk 0 takes micro-batches 0-3
    from this end, chunk 1 micro-batches 4-7 from rank 3. (1) 2(P-h-1) = 2 F0: F0.0 F1.0;
    (2) h+1 = 1 x F0 F1: F2.0 F4.1; (3) P-h-1 = 1 x I1 W F1: I4.1 W4.1 F5.1; (4) M-pp+h+1 = 1 x
    F0&B1 F1&B0: F3.0* B5.1 F6.1* B0.0; (5) 1 x B1 F1&B0: B6.1 F7.1* B1.0; (6) h+1 = 1 x B1 B0,
    zero bubble from (h+1)//2 = 0 on, after B1 as h is even: B7.1 I2.0; (7) 1 x W I0: W2.0 I3.0;
    (8) h+1 = 1 W: W3.0."""
    assert _names(pipeline_schedule("dualpipe", 4, 0, 8)) == (
        "F0.0 F1.0 F2.0 F4.1 I4.1 W4.1 F5.1 F3.0* B5.1 F6.1* B0.0 B6.1 F7.1* B1.0 B7.1 I2.0 W2.0 I3.0 W3.0")


def test_middle_rank_runs_its_first_pair_unoverlapped():
    """pp = 4, m = 8, rank 1 (a middle rank, h = 1): no step-1 forwards; (2) 2 x F0 F1; (4)
    M-pp+h+1 = 2 rounds, the first F0 and B1 not overlapped (the reference keeps them apart to
    shorten the bubble), then F1&B0, F0&B1, F1&B0; (6) 2 x B1 B0, zero bubble from k = 1 (h odd:
    before B1); (8) 2 W. No step 3, 5 or 7 (P-h-1 = 0)."""
    assert _names(pipeline_schedule("dualpipe", 4, 1, 8)) == (
        "F0.0 F4.1 F1.0 F5.1 "
        "F2.0 B4.1 F6.1* B0.0 F3.0* B5.1 F7.1* B1.0 "
        "B6.1 B2.0 I7.1 I3.0 W7.1 W3.0")


@pytest.mark.parametrize(("pp", "m"), [(2, 4), (4, 8), (4, 10), (8, 16)])
def test_every_pass_runs_once_in_dependency_order(pp, m):
    """Each rank: m/2 forwards and m/2 backwards of each chunk, a W after each I and none
    otherwise, each backward after its forward; the last stage of each direction turns around."""
    for rank in range(pp):
        actions = pipeline_schedule("dualpipe", pp, rank, m)
        seen = {}
        for i, a in enumerate(actions):
            assert (a.kind, a.microbatch) not in seen
            seen[(a.kind, a.microbatch)] = i
            assert a.chunk == (a.microbatch >= m // 2)
        for mb in range(m):
            back = seen.get(("B", mb), seen.get(("I", mb)))
            assert back is not None and seen[("F", mb)] < back
            assert (("I", mb) in seen) == (("W", mb) in seen)
            if ("I", mb) in seen:
                assert seen[("I", mb)] < seen[("W", mb)]
        for a, after in pairwise(actions):
            if a.paired:
                assert a.kind == "F" and after.kind in ("B", "I")


def _in_flight_peak(actions):
    held = peak = 0
    for a in actions:
        held += 1 if a.kind == "F" else -1 if a.kind in ("B", "W") else 0
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (8, 16), (8, 20)])
def test_activations_of_pp_plus_one_micro_batches_on_every_rank(pp, m):
    """Table 2: DualPipe holds PP + 1 micro-batches' activations per device (a chunk's stored
    activations live until its weight gradients, W or a full B), on every rank; 1F1B holds
    pp - rank."""
    for rank in range(pp):
        assert _in_flight_peak(pipeline_schedule("dualpipe", pp, rank, m)) == pp + 1
        assert _in_flight_peak(pipeline_schedule("1f1b", pp, rank, m)) == pp - rank


def _unit_makespan(pp, m, f, b, w):
    """Every rank runs its actions in order: F costs f, B costs b, I b - w, W w, a paired F&B f + b
    with both outputs sent at its end (``_forward_backward_chunk``); zero-time transfers. A
    forward of stage s needs stage s - 1's; a backward needs its forward and stage s + 1's
    backward. Chunk 0 of rank r is stage r, chunk 1 is stage pp - 1 - r."""
    sched = [pipeline_schedule("dualpipe", pp, r, m) for r in range(pp)]
    done, cursor, free = {}, [0] * pp, [0] * pp
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            while cursor[r] < len(sched[r]):
                a = sched[r][cursor[r]]
                group = sched[r][cursor[r]:cursor[r] + 2] if a.paired else [a]
                deps, cost = [], 0
                for x in group:
                    s = r if x.chunk == 0 else pp - 1 - r
                    if x.kind == "F":
                        deps += [("F", x.microbatch, s - 1)] if s > 0 else []
                        cost += f
                    elif x.kind in ("B", "I"):
                        deps += [("F", x.microbatch, s)] + ([("B", x.microbatch, s + 1)] if s < pp - 1 else [])
                        cost += b if x.kind == "B" else b - w
                    else:
                        cost += w
                if any(d not in done for d in deps):
                    break
                free[r] = max([free[r]] + [done[d] for d in deps]) + cost
                for x in group:
                    s = r if x.chunk == 0 else pp - 1 - r
                    done[("F" if x.kind == "F" else "B" if x.kind in ("B", "I") else "W", x.microbatch, s)] = free[r]
                cursor[r] += len(group)
                progress = True
    assert cursor == [len(x) for x in sched], "the schedule deadlocks"
    return max(free)


@pytest.mark.parametrize(("pp", "m", "f", "b", "w", "makespan"), [
    (4, 8, 1, 2, 1, 26),
    (8, 16, 1, 2, 1, 54),
    (8, 20, 1, 2, 1, 66),
    (4, 8, 3, 5, 2, 71),
    (2, 4, 1, 2, 1, 12),
])
def test_unit_cost_bubble_is_table_2s(pp, m, f, b, w, makespan):
    """Each rank computes m(F + B); Table 2's bubble is (PP/2 - 1)(F&B + B - 3W), F&B = F + B
    with no communication to hide. F = 1, B = 2, W = 1: pp 4, m 8: 8*3 + 1*(3 + 2 - 3) = 26;
    pp 8, m 16: 48 + 3*2 = 54; pp 8, m 20: 60 + 6 = 66; pp 2: 12 + 0 = 12. F = 3, B = 5, W = 2,
    pp 4, m 8: 64 + (8 + 5 - 6) = 71. 1F1B's (PP - 1)(F + B) would add 9, 21, 21, 24, 3."""
    assert _unit_makespan(pp, m, f, b, w) == makespan
    assert makespan == m * (f + b) + (pp // 2 - 1) * ((f + b) + b - 3 * w)


TINY = {"preset": "gpt3-1.3b", "vocab": 256, "layers": 16}


def _dense(pp, schedule, m):
    """pp stages of a 16-layer GPT-3 1.3B on one DGX A100 (NVLink p2p ~1% of a stage), micro-batches of 8."""
    return Scenario.model_validate(small_scenario(
        model=TINY, cluster={"node": "dgx-a100", "nodes": 1, "gpus_per_node": pp},
        parallelism={"pp": pp, "pipeline_schedule": schedule}, training={"micro_batch": 8, "global_batch": 8 * m}))


@pytest.mark.parametrize(("pp", "m"), [(4, 8), (8, 16)])
def test_simulated_bubble_matches_table_2(pp, m):
    """Equal stages of 16/pp blocks, per block F, B (its full backward) and W (its weight-gradient
    GEMMs) as the workload times them (B ~ 2.1 F, W ~ 0.82 F for this block). The step on pp
    GPUs against the whole model on one: pp * step_pp / step_1 = 1 + (PP/2 - 1)(F + 2B - 3W) /
    (m (F + B)) (Table 2, F&B = F + B: nothing to overlap without collectives), ~1.11 at pp 4,
    m 8 and ~1.17 at pp 8, m 16, against 1F1B's 1 + (pp - 1)/m = 1.375 and 1.4375."""
    sc = _dense(pp, "dualpipe", m)
    layers = build_workload(sc, compute_profile(sc.cluster.gpu_spec, None), gpus_per_node=pp).layers
    f, b, w = (sum(s.duration_s for s in layers.steps("block", phase)) for phase in ("fwd", "bwd", "bwd_weight"))
    assert b == pytest.approx(sum(s.duration_s for s in layers.steps("block", "bwd_input")) + w, rel=1e-12)
    single = simulator.simulate(_dense(1, "1f1b", m))
    piped = simulator.simulate(sc)
    ratio = pp * piped.step_time_s / single.step_time_s
    assert ratio == pytest.approx(1 + (pp // 2 - 1) * (f + 2 * b - 3 * w) / (m * (f + b)), rel=0.02)
    onef = simulator.simulate(_dense(pp, "1f1b", m))
    assert pp * onef.step_time_s / single.step_time_s == pytest.approx(1 + (pp - 1) / m, rel=0.02)


def test_each_rank_holds_two_chunks_of_states_and_pp_plus_one_activations():
    """Rank r holds stage r and stage pp-1-r: its parameters, gradients and optimizer states are
    exactly 1F1B's rank r plus 1F1B's rank pp-1-r (2x per rank, Table 2); its activations those of
    pp + 1 = 5 micro-batches of a stage against 1F1B's first stage's 4 (x 1.25, within the
    workspace of one layer's backward)."""
    pp, m = 4, 8
    dual = {x.stage: x for x in simulator.simulate(_dense(pp, "dualpipe", m)).memory}
    onef = {x.stage: x for x in simulator.simulate(_dense(pp, "1f1b", m)).memory}
    for r in range(pp):
        for part in ("params_bytes", "grads_bytes", "optimizer_bytes"):
            assert getattr(dual[r], part) == getattr(onef[r], part) + getattr(onef[pp - 1 - r], part)
    assert dual[1].activations_bytes == pytest.approx(onef[0].activations_bytes * Fraction(5, 4), rel=0.03)
    layout = ModelLayout(_dense(pp, "dualpipe", m))
    assert [[c.index for c in layout.chunks_of_stage(r)] for r in range(pp)] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert [layout.rank_of(c) for c in range(2 * pp)] == [0, 1, 2, 3, 3, 2, 1, 0]


@pytest.mark.parametrize(("sharding", "shards"), [("none", 1), ("zero1", 2)])
def test_mirror_ranks_sum_their_copies_gradients(sharding, shards):
    """Ranks r and pp-1-r hold the same two stages; after the data-parallel reduction each
    all-reduces the gradients its optimizer steps on with its mirror: pp 4 x dp ``shards`` on
    one node (16-bit gradients, 2 bytes), rank 1's stages 1 and 2 with rank 2, nbytes =
    params_of_stage(1) x 2 / dp (ZeRO-1's shard; the whole stage without sharding)."""
    pp, m = 4, 8
    sc = Scenario.model_validate(small_scenario(
        model=TINY, cluster={"node": "dgx-a100", "nodes": 1, "gpus_per_node": pp * shards},
        parallelism={"pp": pp, "pipeline_schedule": "dualpipe", "sharding": sharding},
        training={"micro_batch": 8, "global_batch": 8 * m * shards}))
    sim = simulator.run_simulation(sc)
    syncs = {r.rank: r for r in sim.rows if r.name == "dualpipe.grad_sync"}
    layout, mesh = ModelLayout(sc), mesh_for(sc)
    for rank, row in syncs.items():
        stage = sim.facts.stage_of[rank]
        assert row.comm.op == "all_reduce" and row.comm.ranks == 2
        assert row.comm.nbytes == pytest.approx(layout.params_of_stage(stage) * 2 / shards, rel=1e-12)
        assert row.comm.group == tuple(sorted({rank, mesh.moved(rank, pp=pp - 1 - stage)}))
    assert {sim.facts.stage_of[r] for r in syncs} == set(range(pp))


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_deferred_weight_gradients_keep_the_activations_until_they_run(recompute):
    """A block's split backward frees what a full backward frees, in two parts: the input-gradient
    half its workspace less what it rebuilt (nothing without recomputation; the whole layer,
    full_layer bytes, under full recomputation), the weight-gradient half the stored bytes and
    the rebuilt ones, which the weight GEMMs read."""
    data = small_scenario(model=TINY, cluster={"node": "dgx-a100", "nodes": 1, "gpus_per_node": 4},
                          parallelism={"pp": 4, "pipeline_schedule": "dualpipe"},
                          training={"micro_batch": 8, "global_batch": 64, "recompute": recompute})
    sc = Scenario.model_validate(data)
    layers = build_workload(sc, compute_profile(sc.cluster.gpu_spec, None), gpus_per_node=4).layers
    sizes, unit = layers.activations, 1  # unit 1 = block 0
    rebuilt = sizes.full_layer if recompute == "full" else 0.0
    assert sizes.rebuilt == rebuilt
    full, first, weights = (layers.jobs(unit, phase) for phase in ("bwd", "bwd_input", "bwd_weight"))
    assert first[-1].mem_end == -(sizes.backward_workspace - rebuilt)
    assert weights[-1].mem_end == -(sizes.per_layer + rebuilt)
    assert first[-1].mem_end + weights[-1].mem_end == pytest.approx(full[-1].mem_end, rel=1e-12)
    assert [j.phase for j in first] == [j.phase for j in full]  # a full recomputation's replay stays in front


MOE = {"name": "tiny MoE", "layers": 4, "hidden": 2048, "heads": 16, "ffn_hidden": 5632, "seq_len": 2048,
       "vocab": 32000, "mlp": "swiglu", "norm": "rmsnorm", "position_embedding": "rotary", "tied_embeddings": False,
       "bias": False, "dropout": False, "experts": 8, "experts_per_token": 2, "expert_ffn_hidden": 1408,
       "shared_experts": 1}


def _moe(schedule):
    """pp 2 x ep 8 on 2 p5.48xlarge: each stage's 8 ranks exchange tokens over NVLink; 4 micro-batches."""
    return Scenario.model_validate({"model": dict(MOE), "cluster": {"node": "p5.48xlarge", "nodes": 2},
                                    "parallelism": {"pp": 2, "ep": 8, "sharding": "zero1",
                                                    "pipeline_schedule": schedule},
                                    "training": {"global_batch": 32, "micro_batch": 1}})


def test_moe_pairs_overlap_one_micro_batch_s_all_to_all_with_another_s_compute():
    """With experts, DualPipe's F&B pairs put a dispatch or combine of one micro-batch beside compute
    of another on the same rank (the pair's steps alternate on the compute stream); 1F1B has
    no such overlap (one micro-batch at a time)."""
    dual = simulator.run_simulation(_moe("dualpipe"))
    onef = simulator.run_simulation(_moe("1f1b"))
    assert cross_microbatch_overlaps(dual) > 0
    assert cross_microbatch_overlaps(onef) == 0
    assert dual.result.step_time_s < onef.result.step_time_s


@pytest.mark.parametrize(("over", "gpus", "field"), [
    ({"pp": 3}, 6, "parallelism.pp"),
    ({"pp": 1}, 8, "parallelism.pp"),
    ({"virtual_stages": 2}, 8, "parallelism.virtual_stages"),
    ({"sharding": "fsdp"}, 8, "parallelism.sharding"),
    ({"stage_layers": [4, 4, 8]}, 8, "parallelism.stage_layers"),
])
def test_bad_layouts_name_their_field(over, gpus, field):
    """Two nodes of ``gpus`` GPUs, 64 sequences of 1: at least 16 micro-batches for pp 3 or 4."""
    par = {"pp": 4, "pipeline_schedule": "dualpipe", **over}
    data = small_scenario(model=TINY, cluster={"node": "dgx-a100", "nodes": 2, "gpus_per_node": gpus},
                          parallelism=par, training={"micro_batch": 1, "global_batch": 64})
    with pytest.raises(InfeasibleError) as err:
        Scenario.model_validate(data)
    assert err.value.field == field


@pytest.mark.parametrize("global_batch", [24, 36])
def test_micro_batches_must_be_even_and_at_least_twice_pp(global_batch):
    """pp 4 on 16 GPUs: dp 4, so 24 sequences are 6 micro-batches (< 2 pp = 8) and 36 are 9 (odd)."""
    data = small_scenario(model=TINY, cluster={"node": "dgx-a100", "nodes": 2},
                          parallelism={"pp": 4, "pipeline_schedule": "dualpipe"},
                          training={"micro_batch": 1, "global_batch": global_batch})
    with pytest.raises(InfeasibleError) as err:
        Scenario.model_validate(data)
    assert err.value.field == "training.global_batch"
    assert "2*pp = 8" in str(err.value)
