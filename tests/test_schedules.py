"""Pipeline schedules as pure functions: hand-derived action lists, counts, in-flight limits,
and the bubble of a unit-time simulation against (p - 1) / (v * m).

Actions are written ``F3`` / ``B3`` (micro-batch 3, chunk 0) or ``F3.1`` (chunk 1) when the
schedule has several chunks per rank.
"""

import pytest

from simulator.workload.pipeline.schedules import pipeline_schedule


def _names(actions, chunks=False):
    return " ".join(f"{a.kind}{a.microbatch}" + (f".{a.chunk}" if chunks else "") for a in actions)


def test_gpipe_runs_all_forwards_then_all_backwards():
    """GPipe (Huang et al. 2019), pp = 4, m = 4: the same list on every stage."""
    for stage in range(4):
        assert _names(pipeline_schedule("gpipe", 4, stage, 4)) == "F0 F1 F2 F3 B0 B1 B2 B3"


def test_1f1b_on_the_first_stage():
    """pp = 4, m = 8, stage 0: p - 0 - 1 = 3 warm-up forwards (F0 F1 F2), then 5 steady pairs
    (F3 B0 ... F7 B4), then the cool-down backwards B5 B6 B7."""
    assert _names(pipeline_schedule("1f1b", 4, 0, 8)) == (
        "F0 F1 F2 "
        "F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 "
        "B5 B6 B7"
    )


def test_1f1b_on_the_last_stage_alternates_from_the_start():
    """pp = 4, m = 8, stage 3: p - 3 - 1 = 0 warm-up forwards, 8 steady pairs, no cool-down."""
    assert _names(pipeline_schedule("1f1b", 4, 3, 8)) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"


def test_1f1b_with_fewer_micro_batches_than_warm_up_slots():
    """pp = 4, m = 2, stage 0: warm-up min(3, 2) = 2 forwards, no steady state, 2 backwards."""
    assert _names(pipeline_schedule("1f1b", 4, 0, 2)) == "F0 F1 B0 B1"


def test_1f1b_without_pipeline_is_plain_gradient_accumulation():
    assert _names(pipeline_schedule("1f1b", 1, 0, 3)) == "F0 B0 F1 B1 F2 B2"


def test_interleaved_follows_megatron_order():
    """pp = 2, v = 2, m = 4 (8 chunk passes per rank). Megatron-Core: the k-th forward is
    micro-batch (k // 4) * 2 + k % 2 on chunk (k // 2) % 2; backwards take chunks in reverse
    (1 - (k // 2) % 2). Forward order: 0.0 1.0 0.1 1.1 2.0 3.0 2.1 3.1; backward order:
    0.1 1.1 0.0 1.0 2.1 3.1 2.0 3.0. Warm-up (p - rank - 1) * 2 + (v - 1) * p:
    4 forwards on rank 0, 2 on rank 1; then F/B pairs; then the remaining backwards."""
    assert _names(pipeline_schedule("interleaved", 2, 0, 4, 2), chunks=True) == (
        "F0.0 F1.0 F0.1 F1.1 "
        "F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 "
        "B2.1 B3.1 B2.0 B3.0"
    )
    assert _names(pipeline_schedule("interleaved", 2, 1, 4, 2), chunks=True) == (
        "F0.0 F1.0 "
        "F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 "
        "B2.0 B3.0"
    )


@pytest.mark.parametrize(("kind", "pp", "m", "v"), [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1),
                                                    ("interleaved", 4, 8, 2), ("interleaved", 2, 4, 3)])
def test_every_stage_runs_each_forward_and_backward_once(kind, pp, m, v):
    """2 * m * v actions per stage: one F and one B per (micro-batch, chunk), each B after its F."""
    for stage in range(pp):
        actions = pipeline_schedule(kind, pp, stage, m, v)
        assert len(actions) == 2 * m * v
        order = {(a.kind, a.microbatch, a.chunk): i for i, a in enumerate(actions)}
        assert len(order) == 2 * m * v
        for mb in range(m):
            for chunk in range(v):
                assert order[("F", mb, chunk)] < order[("B", mb, chunk)]


def _max_in_flight(actions):
    held = peak = 0
    for a in actions:
        held += 1 if a.kind == "F" else -1
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize("stage", range(4))
def test_1f1b_holds_at_most_p_minus_stage_micro_batches(stage):
    """pp = 4, m = 8: stage s holds at most min(p - s, m) = 4 - s micro-batches' activations;
    GPipe holds all m = 8."""
    assert _max_in_flight(pipeline_schedule("1f1b", 4, stage, 8)) == 4 - stage
    assert _max_in_flight(pipeline_schedule("gpipe", 4, stage, 8)) == 8


def _unit_time_makespan(kind, pp, m, v=1):
    """Run every stage's actions in order, each taking 1 time unit once its inputs exist:
    F of virtual stage vs = chunk * pp + stage needs F of vs - 1; B needs its own F and B of
    vs + 1 (the last virtual stage turns around). Zero-time transfers. Pure python."""
    schedule = [pipeline_schedule(kind, pp, s, m, v) for s in range(pp)]
    last = pp * v - 1
    done: dict[tuple[str, int, int], int] = {}
    cursor, free = [0] * pp, [0] * pp
    progress = True
    while progress:
        progress = False
        for s in range(pp):
            while cursor[s] < len(schedule[s]):
                a = schedule[s][cursor[s]]
                vs = a.chunk * pp + s
                if a.kind == "F":
                    deps = [("F", a.microbatch, vs - 1)] if vs > 0 else []
                else:
                    deps = [("F", a.microbatch, vs)] + ([("B", a.microbatch, vs + 1)] if vs < last else [])
                if any(d not in done for d in deps):
                    break
                free[s] = done[(a.kind, a.microbatch, vs)] = max([free[s]] + [done[d] for d in deps]) + 1
                cursor[s] += 1
                progress = True
    assert cursor == [len(x) for x in schedule], "the schedule deadlocks"
    return max(free)


@pytest.mark.parametrize(("kind", "pp", "m", "v", "makespan"), [
    ("gpipe", 4, 8, 1, 22),
    ("1f1b", 4, 8, 1, 22),
    ("interleaved", 4, 8, 2, 38),
    ("interleaved", 2, 4, 2, 18),
    ("interleaved", 4, 8, 3, 54),
])
def test_unit_time_bubble_matches_the_formula(kind, pp, m, v, makespan):
    """Each stage computes 2 * m * v unit actions; the pipeline adds 2 * (p - 1) units of
    fill and drain (one F and one B slot per other stage, in chunk units). So
    makespan = 2mv + 2(p - 1) and bubble / compute = (p - 1) / (v * m) (Narayanan et al.
    SC'21 §2.2): gpipe and 1F1B at p = 4, m = 8: 16 + 6 = 22, 3/8; interleaved p = 4, m = 8,
    v = 2: 32 + 6 = 38, 3/16; p = 2, m = 4, v = 2: 16 + 2 = 18, 1/8; p = 4, m = 8, v = 3:
    48 + 6 = 54, 1/8."""
    got = _unit_time_makespan(kind, pp, m, v)
    assert got == makespan
    assert (got - 2 * m * v) / (2 * m * v) == pytest.approx((pp - 1) / (v * m), rel=1e-12)
