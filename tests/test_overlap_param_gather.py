"""Megatron-Core's overlapped parameter all-gather (``parallelism.zero.overlap_param_gather``)."""

import pytest

import simulator
from tests.conftest import small_scenario

MS = 1e-3


def _sim(overlap: bool) -> simulator.Simulation:
    zero = {"gradient_reduction": "reduce_scatter", "allgather_bucket_size": 40_000_000,
            "overlap_param_gather": overlap}
    return simulator.run_simulation(simulator.Scenario.model_validate(
        small_scenario(parallelism={"sharding": "zero1", "zero": zero})))


def test_buckets_are_filled_backwards_and_gathered_first_layers_first():
    """GPT-3 125M on 16 GPUs (zero1, dp 16), buckets of 40,000,000 elements.

    Per layer: ln1 1,536 + qkv 768*2304 + 2304 = 1,771,776 + proj 768*768 + 768 = 590,592
    + ln2 1,536 + fc1 768*3072 + 3072 = 2,362,368 + fc2 768*3072 + 768 = 2,360,064 = 7,087,872.
    Filling in reverse: final norm 1,536 + layers 11..7 (5 x 7,087,872) = 35,440,896, + l6.fc2
    = 37,800,960, + l6.fc1 = 40,163,328 >= 40M: the first bucket formed. The rest of l6
    (2,365,440) + layers 5..1 (35,439,360) + l0.fc2 = 40,164,864: the second. Left: the rest
    of l0 (4,727,808) + the embedding (50257*768 + 2048*768 = 40,170,240) = 44,898,048.
    Gathered in reverse order of forming, at 2 bytes per element (bf16)."""
    rows = _sim(True).rows
    gathers = sorted((r for r in rows if r.name == "zero.param_allgather"), key=lambda r: r.start_s)
    assert [g.comm.nbytes for g in gathers] == [44_898_048 * 2, 40_164_864 * 2, 40_163_328 * 2]
    assert all(g.comm.op == "all_gather" and g.comm.ranks == 16 for g in gathers)
    # one after another on the dp stream, the first at the start of the step
    assert gathers[0].start_s == 0.0
    assert gathers[1].start_s == pytest.approx(gathers[0].end_s) and gathers[2].start_s == pytest.approx(gathers[1].end_s)


def test_first_forwards_wait_for_their_bucket_and_nothing_is_gathered_after_the_step():
    """The embedding's first forward starts when the first bucket's all-gather ends; layer 6's
    (split over the last two buckets) when the third ends; the optimizer step is the last task."""
    sim = _sim(True)
    gathers = sorted((r for r in sim.rows if r.name == "zero.param_allgather"), key=lambda r: r.start_s)
    fwd0 = [r for r in sim.rows if r.category == "compute" and r.info and r.info.phase == "fwd" and r.info.mb == 0]
    embedding = min(fwd0, key=lambda r: r.start_s)
    assert embedding.start_s == pytest.approx(gathers[0].end_s)
    layer6 = min((r for r in fwd0 if r.info.layer == 6), key=lambda r: r.start_s)
    assert layer6.start_s >= gathers[2].end_s - 1e-12
    optimizer = next(r for r in sim.rows if r.name == "optimizer")
    assert all(g.end_s <= optimizer.start_s for g in gathers)
    assert max(r.end_s for r in sim.rows if r.category != "marker") == pytest.approx(sim.result.step_time_s)


def test_overlapping_the_gather_shortens_the_step_by_at_most_the_gather():
    """Without the overlap the four 62.6 MB all-gathers (125,226,240 elements / 4 pieces of at
    most 40M, 2 bytes each) run after the optimizer step, exposed; with it they move into the
    forward, where the first one is exposed and the rest hide behind compute."""
    off, on = _sim(False), _sim(True)
    tail = [r for r in off.rows if r.name == "zero.param_allgather"]
    assert len(tail) == 1 and tail[0].comm.count == 4 and tail[0].comm.nbytes == 125_226_240 * 2 / 4
    exposed = tail[0].end_s - tail[0].start_s
    assert off.result.step_time_s - exposed < on.result.step_time_s < off.result.step_time_s


def test_a_later_stage_starts_gathering_at_the_start_of_the_step():
    """pp 2: the optimizer's zero_grad dispatches the first bucket's all-gather before the
    forward (distrib_optimizer.py:1330-1337 at f2e5db40), so stage 1's first gather starts at
    t = 0, long before stage 0's activation reaches it; each next one starts no earlier than
    the compute before the unit that waited for the previous one."""
    zero = {"gradient_reduction": "reduce_scatter", "allgather_bucket_size": 40_000_000, "overlap_param_gather": True}
    sim = simulator.run_simulation(simulator.Scenario.model_validate(
        small_scenario(parallelism={"pp": 2, "sharding": "zero1", "zero": zero})))
    stage1 = max({r.rank for r in sim.rows})
    gathers = sorted((r for r in sim.rows if r.rank == stage1 and r.name == "zero.param_allgather"),
                     key=lambda r: r.start_s)
    recv = min((r for r in sim.rows if r.rank == stage1 and r.name == "recv.act"), key=lambda r: r.start_s)
    assert gathers[0].start_s == 0.0 and gathers[0].end_s < recv.end_s
    assert all(g.start_s >= recv.end_s for g in gathers[1:])
