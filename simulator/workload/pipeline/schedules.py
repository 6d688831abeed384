"""Pipeline schedules as data: the ordered actions each pipeline rank performs.

An :class:`Action` is a forward (``F``) or backward (``B``) pass of one micro-batch through
one model chunk held by the rank. With ``pp = 1`` every schedule is the plain
gradient-accumulation loop F0 B0 F1 B1 ...

* GPipe (Huang et al. 2019): all forwards, then all backwards.
* 1F1B / PipeDream-Flush (Narayanan et al. 2021): ``p - rank - 1`` warm-up forwards, then
  one forward and one backward alternately, then the cool-down backwards; at most
  ``p - rank`` micro-batches in flight on rank ``rank``.
* Interleaved 1F1B (Narayanan et al. SC'21 §2.2.2): each rank holds ``v`` chunks (virtual
  stages ``rank, rank + p, ...``); Megatron-Core's warm-up count
  ``(p - rank - 1) * 2 + (v - 1) * p`` (``schedules.py``, micro-batch group size p), capped
  at ``m * v``; micro-batches walk the chunks in groups of p.

Bubble fraction with equal stages: (p - 1) / m for GPipe and 1F1B, (p - 1) / (v * m)
interleaved (``tests/test_schedules.py`` checks a unit-time run of the schedules against these,
``tests/test_strategies.py`` the simulated step times).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Action", "pipeline_schedule", "SCHEDULES"]


@dataclass(frozen=True, slots=True)
class Action:
    kind: str  # "F" | "B"
    microbatch: int
    chunk: int  # model chunk index on this rank (0 .. v-1); virtual stage = chunk * p + rank


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


def interleaved(pp: int, rank: int, m: int, v: int) -> list[Action]:
    """Megatron-Core's interleaved 1F1B order (``forward_backward_pipelining_with_interleaving``).

    The k-th forward on a rank processes chunk ``(k // p) % v`` of micro-batch
    ``(k // (p * v)) * p + k % p``; backwards visit chunks in reverse order.
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

    warmup = min((pp - rank - 1) * 2 + (v - 1) * pp, total)
    actions = [Action("F", *forward_id(k)) for k in range(warmup)]
    f, b = warmup, 0
    while f < total:
        actions.append(Action("F", *forward_id(f)))
        f += 1
        actions.append(Action("B", *backward_id(b)))
        b += 1
    while b < total:
        actions.append(Action("B", *backward_id(b)))
        b += 1
    return actions


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b, "interleaved": interleaved}


def pipeline_schedule(kind: str, pp: int, rank: int, m: int, v: int = 1) -> list[Action]:
    """Actions of pipeline rank ``rank`` for ``m`` micro-batches (``v`` chunks if interleaved)."""
    return SCHEDULES[kind](pp, rank, m, v)
