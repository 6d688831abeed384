"""``parallelism.p2p_blocking``: a pipeline send holds its rank until the transfer is done, as
Megatron's ``_communicate`` does (batched isend/irecv waited on, then torch.cuda.synchronize:
megatron/core/pipeline_parallel/p2p_communication.py:350-371 at
NVIDIA/Megatron-LM@f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4)."""

import pytest

import simulator
from tests.conftest import small_scenario


def _sim(blocking: bool, schedule: str = "1f1b") -> simulator.Simulation:
    """pp 2 on 2 x p4d (16 GPUs, dp 8), 4 micro-batches."""
    par = {"pp": 2, "p2p_blocking": blocking, "pipeline_schedule": schedule}
    if schedule == "interleaved":
        par["virtual_stages"] = 2
    return simulator.run_simulation(simulator.Scenario.model_validate(small_scenario(
        parallelism=par, training={"micro_batch": 4, "global_batch": 128})))


def _first_stage(sim: simulator.Simulation) -> tuple[list, object]:
    rank = min(r.rank for r in sim.rows)
    fwd = sorted((r for r in sim.rows if r.rank == rank and r.category == "compute" and r.info
                  and r.info.phase == "fwd"), key=lambda r: r.start_s)
    send = min((r for r in sim.rows if r.rank == rank and r.name == "send.act"), key=lambda r: r.start_s)
    return fwd, send


def test_the_first_stage_starts_its_second_forward_when_the_first_send_is_done():
    """1F1B, pp 2: stage 0 warms up with one forward, sends its activation (stage 1 has posted
    its receive at t = 0, so the transfer starts when the forward ends) and runs micro-batch 1's
    forward next, which needs no receive. Blocking: it starts when the send ends; otherwise
    when micro-batch 0's forward ends, before the send is done."""
    fwd, send = _first_stage(_sim(True))
    second = next(r for r in fwd if r.info.mb == 1)
    assert send.start_s == pytest.approx(max(r.end_s for r in fwd if r.info.mb == 0))
    assert second.start_s == pytest.approx(send.end_s)
    fwd, send = _first_stage(_sim(False))
    second = next(r for r in fwd if r.info.mb == 1)
    assert second.start_s == pytest.approx(max(r.end_s for r in fwd if r.info.mb == 0)) and second.start_s < send.end_s


def test_the_interleaved_schedule_keeps_its_sends_beside_the_compute():
    """Megatron batches the interleaved schedule's next receives with its sends, which dtsim's
    per-pass receives do not mirror: its sends stay non-blocking (the same run either way)."""
    assert _sim(True, "interleaved").result.step_time_s == _sim(False, "interleaved").result.step_time_s
