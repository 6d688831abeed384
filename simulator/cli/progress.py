"""The rich progress bar of ``dtsim sweep`` and ``dtsim search``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from simulator.cli.common import console

__all__ = ["sweep_progress"]


class _Failures(ProgressColumn):
    def render(self, task: Any) -> Any:
        from rich.text import Text

        failed = task.fields.get("failed", 0)
        cached = task.fields.get("cached", 0)
        return Text(f"{failed} infeasible/failed, {cached} cached", style="red" if failed else "dim")


@contextmanager
def sweep_progress() -> Iterator[tuple[Progress, Callable[[Any, Any], None]]]:
    """A rich progress bar: done/total, failures and cached points, elapsed and ETA."""
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), _Failures(),
                   TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False)

    def update(task: Any, state: Any) -> None:
        bar.update(task, completed=state.done, failed=state.failed, cached=state.cached)

    with bar:
        yield bar, update
