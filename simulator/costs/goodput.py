"""Goodput of a whole training run: optimal checkpoint intervals, the expected wall-clock under
Poisson failures, and the replay of one failure schedule. Pure functions of seconds.

Notation (Daly 2006): ``C`` (δ) the time training stops to write a checkpoint, ``M`` the job's
mean time between failures, ``R`` the time from a failure to training again, ``τ`` the
compute time between checkpoints, ``T_s`` the failure-free compute time of the run.

* Young 1974 ("A first order approximation to the optimum checkpoint interval", CACM 17(9)):
  ``τ = sqrt(2 C M)``.
* Daly 2006 ("A higher order estimate of the optimum checkpoint interval for restart dumps",
  FGCS 22(3)), the perturbation solution of the complete model:
  ``τ = sqrt(2 C M) [1 + sqrt(C / 2M) / 3 + (C / 2M) / 9] - C`` for ``C < 2M``, else ``τ = M``.
  Checked against the paper's worked examples (Figs. 3-5, δ = 5 min): M = 24 h gives 117 min,
  M = 6 h 57 min, M = 15 min 9.1 min (``tests/test_goodput.py``).
* Daly's complete model of the expected wall-clock with exponential failures (which may also
  strike during a restart): ``T_w = M e^{R/M} (e^{(τ+C)/M} - 1) T_s / τ``. :func:`expected_run`
  splits it exactly into its parts: per segment of ``s = τ + C`` seconds the expected number
  of failures is ``e^{s/M} - 1`` (a geometric count of failed attempts), the work each loses
  is ``M - s / (e^{s/M} - 1)`` on average (an exponential time given it is below ``s``, summed
  over them: ``M (e^{s/M} - 1) - s``), and each restart takes ``M (e^{R/M} - 1)`` (the mean time
  to get through ``R`` uninterrupted); productive + checkpoints + lost + restarts is Daly's
  ``T_w``. Restarts of different kinds (a hardware failure waits for a node, a software one
  does not) enter as the failure-rate-weighted mean of ``M (e^{R_i/M} - 1)``.

Effective training time ratio (ETTR, Kokolis et al. 2024): productive time / wall-clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["young_interval_s", "daly_interval_s", "RunTime", "expected_run", "replay", "Failure",
           "poisson_at_least", "poisson_excess"]


def young_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Young 1974: the compute time between checkpoints that minimises lost time, ``sqrt(2 C M)``."""
    return math.sqrt(2.0 * checkpoint_s * mtbf_s)


def daly_interval_s(checkpoint_s: float, mtbf_s: float) -> float:
    """Daly 2006, higher-order optimum: ``sqrt(2CM)(1 + sqrt(C/2M)/3 + (C/2M)/9) - C`` when
    ``C < 2M``, else ``M``."""
    if checkpoint_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = checkpoint_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * checkpoint_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - checkpoint_s


@dataclass(frozen=True)
class RunTime:
    """Where a run's wall-clock goes, in seconds, and how many interruptions it met."""

    productive_s: float
    checkpoint_s: float
    lost_s: float
    restart_s: float
    failures: float
    planned: float = 0.0

    @property
    def wall_s(self) -> float:
        return self.productive_s + self.checkpoint_s + self.lost_s + self.restart_s

    @property
    def ettr(self) -> float:
        """Effective training time ratio: productive / wall-clock."""
        return self.productive_s / self.wall_s if self.wall_s > 0 else 1.0


def _mean_restart_s(mtbf_s: float, restarts: Sequence[tuple[float, float]]) -> float:
    """``Σ w_i M (e^{R_i/M} - 1) / Σ w_i``: the mean time to get through a restart of kind i
    (weight w_i, e.g. its failure rate) when failures may strike during it."""
    total = sum(w for w, _ in restarts)
    if total <= 0:
        return 0.0
    return sum(w * mtbf_s * math.expm1(r / mtbf_s) for w, r in restarts) / total


def expected_run(work_s: float, interval_s: float, checkpoint_s: float, mtbf_s: float,
                 restarts: Sequence[tuple[float, float]], *, extra_lost_s: float = 0.0,
                 planned_mtbf_s: float | None = None, planned_restart_s: float = 0.0) -> RunTime:
    """Expected breakdown of a run of ``work_s`` failure-free compute seconds, checkpointing every
    ``interval_s`` of compute at ``checkpoint_s`` each, with unplanned failures at mean interval
    ``mtbf_s`` (``math.inf``: none) restarting as ``restarts`` = [(weight, restart_s)] (Daly's
    complete model, split as the module says). ``extra_lost_s`` adds to each failure's lost work
    (an asynchronous checkpoint not yet written). Planned interruptions (mean interval
    ``planned_mtbf_s``) each cost a checkpoint and ``planned_restart_s`` and lose no work."""
    if work_s <= 0:
        return RunTime(0.0, 0.0, 0.0, 0.0, 0.0)
    segments = work_s / interval_s
    segment_s = interval_s + checkpoint_s
    if math.isinf(mtbf_s):
        failures_per_segment = lost_per_segment = 0.0
    else:
        failures_per_segment = math.expm1(segment_s / mtbf_s)
        lost_per_segment = mtbf_s * failures_per_segment - segment_s
    failures = segments * failures_per_segment
    lost = segments * lost_per_segment + failures * extra_lost_s
    restart = failures * _mean_restart_s(mtbf_s, restarts) if failures else 0.0
    if failures:  # and those striking during restarts: e^{R/M} - 1 more per failure (geometric)
        failures += restart / mtbf_s
    checkpoints = segments * checkpoint_s
    run = RunTime(work_s, checkpoints, lost, restart, failures)
    if planned_mtbf_s is None or math.isinf(planned_mtbf_s):
        return run
    per_planned = checkpoint_s + planned_restart_s
    if per_planned >= planned_mtbf_s:
        raise ValueError("planned interruptions come faster than the job can checkpoint and restart")
    # wall = W + wall * per/Mp: the planned stops take a fixed share of the wall-clock
    planned = run.wall_s / (planned_mtbf_s - per_planned)
    return RunTime(work_s, checkpoints + planned * checkpoint_s, lost, restart + planned * planned_restart_s,
                   failures, planned)


@dataclass(frozen=True)
class Failure:
    """One interruption of a schedule: when (wall-clock seconds from the start), how long the
    restart takes, and whether it was planned (a checkpoint first, no work lost)."""

    at_s: float
    restart_s: float
    planned: bool = False


def replay(work_s: float, interval_s: float, checkpoint_s: float, failures: Iterable[Failure], *,
           write_s: float = 0.0) -> RunTime:
    """The wall-clock of one run under a given failure schedule, exactly.

    The run computes ``interval_s`` then stops ``checkpoint_s`` to checkpoint, again and again
    (no checkpoint after the last piece of work). An unplanned failure at ``t`` loses the work
    since the last checkpoint (and, with asynchronous checkpoints whose write takes ``write_s``,
    the piece before too when the failure strikes less than ``write_s`` after that checkpoint);
    the job then restarts for ``restart_s`` and resumes from the checkpoint (a failure during
    a restart starts the restart again). A planned interruption checkpoints the work done and
    restarts. Failures past the end of the run are ignored; the schedule must be in time order.
    """
    t = lost = ckpt = restart = 0.0
    last_restart_s = 0.0
    left = work_s
    n_failures = n_planned = 0
    segment_s = interval_s + checkpoint_s
    for failure in failures:
        f = failure.at_s
        if f < t:  # during a restart: it starts again (a planned stop there is dropped)
            if not failure.planned:
                restart += failure.restart_s - min(t - f, last_restart_s)
                t, last_restart_s = f + failure.restart_s, failure.restart_s
                n_failures += 1
            continue
        pieces = math.ceil(left / interval_s - 1e-12)
        if t + left + (pieces - 1) * checkpoint_s <= f:
            break
        whole = min(int((f - t) // segment_s), pieces - 1)
        t += whole * segment_s
        left -= whole * interval_s
        ckpt += whole * checkpoint_s
        into = f - t
        if failure.planned:
            saved = min(into, interval_s, left)
            left -= saved
            ckpt += into - saved + checkpoint_s
            t = f + checkpoint_s
            n_planned += 1
        else:
            lost += into
            if write_s > 0.0 and whole > 0 and into < write_s:  # the last checkpoint was still being written
                lost += interval_s
                left += interval_s
            t = f
            n_failures += 1
        restart += failure.restart_s
        t += failure.restart_s
        last_restart_s = failure.restart_s
    ckpt += (math.ceil(left / interval_s - 1e-12) - 1) * checkpoint_s if left > 0 else 0.0
    return RunTime(work_s, ckpt, lost, restart, float(n_failures), float(n_planned))


def poisson_at_least(mean: float, k: int) -> float:
    """P(N >= k) for N ~ Poisson(mean)."""
    if k <= 0:
        return 1.0
    term = math.exp(-mean)
    below = term
    for i in range(1, k):
        term *= mean / i
        below += term
    return max(0.0, 1.0 - below)


def poisson_excess(mean: float, k: int) -> float:
    """E[max(0, N - k)] for N ~ Poisson(mean): nodes still out when ``k`` spares are in use."""
    term = math.exp(-mean)
    below = 0.0  # E[(k - N)^+] = Σ_{n<k} (k - n) P(n)
    for n in range(k):
        below += (k - n) * term
        term *= mean / (n + 1)
    return mean - k + below
