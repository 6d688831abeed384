"""Pipeline schedules as data: the ordered actions each pipeline rank performs.

An :class:`Action` is a forward (``F``) or backward (``B``) pass of one micro-batch through
one model chunk held by the rank. With ``pp = 1`` every schedule is the plain
gradient-accumulation loop F0 B0 F1 B1 ... Zero-bubble schedules (DualPipe,
:func:`dualpipe`) also split a backward into its input-gradient half (``I``, whose
weight gradients are deferred) and the deferred weight gradients (``W``), and pair a forward
with the backward after it (``paired``: the two run as one overlapped F&B chunk).

* GPipe (Huang et al. 2019): all forwards, then all backwards.
* 1F1B / PipeDream-Flush (Narayanan et al. 2021): ``p - rank - 1`` warm-up forwards, then
  one forward and one backward alternately, then the cool-down backwards; at most
  ``p - rank`` micro-batches in flight on rank ``rank``.
* Interleaved 1F1B (Narayanan et al. SC'21 §2.2.2): each rank holds ``v`` chunks (virtual
  stages ``rank, rank + p, ...``); Megatron-Core's warm-up count
  ``(p - rank - 1) * 2 + (v - 1) * p`` (``schedules.py``, micro-batch group size p), capped
  at ``m * v``; micro-batches walk the chunks in groups of p.
* Combined 1F1B (Megatron-Core ``--overlap-moe-expert-parallel-comm``, :func:`combined_1f1b`):
  pp = 1 or interleaved, one more warm-up forward, each steady-state F paired with the next B.
* DualPipe (DeepSeek-V3, arXiv:2412.19437 §3.2.1): two chunks per rank, one per direction
  (:func:`dualpipe`).

Bubble fraction with equal stages: (p - 1) / m for GPipe and 1F1B, (p - 1) / (v * m)
interleaved (``tests/test_schedules.py`` checks a unit-time run of the schedules against these,
``tests/test_strategies.py`` the simulated step times); DualPipe's bubble is
(p/2 - 1)(F&B + B - 3W) against m (F + B) of compute (its Table 2; ``tests/test_dualpipe.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Action", "pipeline_schedule", "SCHEDULES"]


@dataclass(frozen=True, slots=True)
class Action:
    kind: str  # "F" | "B" | "I" (input gradients only, weights deferred) | "W" (a deferred I's weight gradients)
    microbatch: int
    chunk: int  # model chunk index on this rank (0 .. v-1); virtual stage = chunk * p + rank
    paired: bool = False  # an F overlapped with the backward that follows it (DualPipe's F&B, combined 1F1B)


def gpipe(pp: int, rank: int, m: int, v: int = 1) -> list[Action]:
    return [Action("F", i, 0) for i in range(m)] + [Action("B", i, 0) for i in range(m)]


def one_f_one_b(pp: int, rank: int, m: int, v: int = 1) -> list[Action]:
    warmup = min(pp - rank - 1, m)
    actions = [Action("F", i, 0) for i in range(warmup)]
    f, b = warmup, 0
    while f < m:
        actions.append(Action("F", f, 0))
        f += 1
        actions.append(Action("B", b, 0))
        b += 1
    while b < m:
        actions.append(Action("B", b, 0))
        b += 1
    return actions


def interleaved(pp: int, rank: int, m: int, v: int, combined: bool = False) -> list[Action]:
    """Megatron-Core's interleaved 1F1B order (``forward_backward_pipelining_with_interleaving``).

    The k-th forward on a rank processes chunk ``(k // p) % v`` of micro-batch
    ``(k // (p * v)) * p + k % p``; backwards visit chunks in reverse order.

    ``combined``: Megatron-Core's combined 1F1B (``overlap_moe_expert_parallel_comm``, see
    :func:`combined_1f1b`): one more warm-up forward, and every steady-state forward paired
    with the backward after it.
    """
    total = m * v

    def forward_id(k: int) -> tuple[int, int]:
        group, within = divmod(k, pp * v)
        chunk = within // pp
        return group * pp + within % pp, chunk

    def backward_id(k: int) -> tuple[int, int]:
        group, within = divmod(k, pp * v)
        chunk = v - 1 - within // pp
        return group * pp + within % pp, chunk

    warmup = min((pp - rank - 1) * 2 + (v - 1) * pp + combined, total)
    actions = [Action("F", *forward_id(k)) for k in range(warmup)]
    f, b = warmup, 0
    while f < total:
        actions.append(Action("F", *forward_id(f), combined))
        f += 1
        actions.append(Action("B", *backward_id(b)))
        b += 1
    while b < total:
        actions.append(Action("B", *backward_id(b)))
        b += 1
    return actions


def dualpipe(pp: int, rank: int, m: int, v: int = 1) -> list[Action]:
    """DualPipe (DeepSeek-V3 technical report, arXiv:2412.19437 §3.2.1, Figure 5): a
    bidirectional pipeline. Rank ``r`` holds two chunks: chunk 0 is stage ``r`` of the
    forward direction, fed micro-batches ``0 .. m/2 - 1`` from rank 0; chunk 1 is stage
    ``pp - 1 - r`` of the reverse direction, fed micro-batches ``m/2 .. m - 1`` from rank
    ``pp - 1`` (:meth:`~simulator.workload.layout.ModelLayout.chunk_of`).

    The order is the eight steps of ``DualPipe.step`` (deepseek-ai/DualPipe
    dualpipe/dualpipe.py at 3da1bbea53606543d7f5f232338fc58096db30e3), with ``h = min(r, pp -
    1 - r)``, ``P = pp / 2``, ``M = m / 2`` and "phase 0" the direction that reaches the rank
    first (chunk 0 on the first half of the ranks, chunk 1 on the second): (1) ``2(P - h -
    1)`` F0; (2) ``h + 1`` times F0 F1; (3) ``P - h - 1`` times I1 W F1; (4) ``M - pp + h + 1``
    times the overlapped pairs F0&B1 F1&B0 (on the two middle ranks the first F0, B1 not
    overlapped); (5) ``P - h - 1`` times B1 F1&B0; (6) ``h + 1`` times B1 B0, the second half
    of them input-gradient only (``I``); (7) ``P - h - 1`` times W I0; (8) ``h + 1`` W. A ``W``
    runs the oldest deferred weight gradients (the reference's FIFO ``WeightGradStore``).
    ``pp`` and ``m`` are even and ``m >= 2 pp`` (the reference asserts both).
    """
    half, h, mm = pp // 2, min(rank, pp - 1 - rank), m // 2
    middle = h == half - 1
    swap = rank >= half  # phase p is chunk p ^ swap
    next_mb = [0, 0]  # per chunk: the next forward's and backward's micro-batch
    next_b = [0, 0]
    out: list[Action] = []

    def f(phase: int, paired: bool = False) -> None:
        chunk = phase ^ swap
        out.append(Action("F", next_mb[chunk] + chunk * mm, chunk, paired))
        next_mb[chunk] += 1

    def b(phase: int, kind: str = "B") -> None:
        chunk = phase ^ swap
        out.append(Action(kind, next_b[chunk] + chunk * mm, chunk))
        next_b[chunk] += 1

    deferred: list[Action] = []

    def i(phase: int) -> None:
        b(phase, "I")
        deferred.append(out[-1])

    def w() -> None:
        done = deferred.pop(0)
        out.append(Action("W", done.microbatch, done.chunk))

    for _ in range(2 * (half - h - 1)):  # 1: nF0
        f(0)
    for _ in range(h + 1):  # 2: nF0F1
        f(0)
        f(1)
    for _ in range(half - h - 1):  # 3: nB1W1F1 (zero bubble)
        i(1)
        w()
        f(1)
    for k in range(mm - pp + h + 1):  # 4: nF0B1F1B0
        f(0, paired=not (k == 0 and middle))
        b(1)
        f(1, paired=True)
        b(0)
    for _ in range(half - h - 1):  # 5: nB1F1B0
        b(1)
        f(1, paired=True)
        b(0)
    zb = False
    for k in range(h + 1):  # 6: nB1B0, the second half zero bubble
        if k == (h + 1) // 2 and h % 2 == 1:
            zb = True
        if zb:
            i(1)
        else:
            b(1)
        if k == (h + 1) // 2 and h % 2 == 0:
            zb = True
        if zb:
            i(0)
        else:
            b(0)
    for _ in range(half - h - 1):  # 7: nWB0
        w()
        i(0)
    for _ in range(h + 1):  # 8: nW
        w()
    assert not deferred
    return out


def combined_1f1b(pp: int, rank: int, m: int, v: int = 1) -> list[Action]:
    """Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``): in the steady
    state each forward runs merged with a backward of another micro-batch, layer by layer, so
    that one's dispatch and combine all-to-alls run beside the other's compute
    (``combined_forward_backward_step``, megatron/core/pipeline_parallel/combined_1f1b.py at
    NVIDIA/Megatron-LM@3816e4de305284599b4d25137b22175412807913; the per-layer order is
    ``TransformerLayerSchedulePlan.run``, megatron/core/models/common/model_chunk_schedule_plan.py
    there). With ``pp = 1`` (``combined_1f1b_schedule_for_no_pipelining``): F0, then F(i+1)
    merged with B(i) for i < m - 1, then B(m-1) alone. With ``pp > 1`` only the interleaved
    schedule has it (TransformerConfig asserts virtual_pipeline_model_parallel_size when
    pp > 1, transformer_config.py:3007-3011 there), whose warm-up runs one forward more
    (``get_pp_rank_microbatches``, schedules.py:966-970 there) so that the forward and backward
    of each steady-state step are independent. Both are :func:`interleaved` with ``combined``
    (``pp = 1``: ``v = 1``, warm-up 1).
    """
    return interleaved(pp, rank, m, v if pp > 1 else 1, combined=True)


SCHEDULES: dict[str, Callable[[int, int, int, int], list[Action]]] = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved, "dualpipe": dualpipe}


def pipeline_schedule(kind: str, pp: int, rank: int, m: int, v: int = 1, *, combined: bool = False) -> list[Action]:
    """Actions of pipeline rank ``rank`` for ``m`` micro-batches (``v`` chunks if interleaved);
    ``combined``: Megatron-Core's combined 1F1B (:func:`combined_1f1b`) in place of ``kind``
    (pp = 1, or interleaved)."""
    if combined:
        return combined_1f1b(pp, rank, m, v)
    return SCHEDULES[kind](pp, rank, m, v)
