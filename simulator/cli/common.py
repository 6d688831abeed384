"""What every ``dtsim`` command shares: the consoles and the bad-input exit.

Exit codes: 0 success, 2 bad input (one line naming file, line and field), 1 a bug.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from simulator.errors import ScenarioError

__all__ = ["console", "err_console", "fail", "guard", "cluster_spec"]

console = Console()
err_console = Console(stderr=True)


def fail(message: str) -> None:
    """Print ``error: message`` on stderr and exit with status 2 (bad input)."""
    from rich.markup import escape

    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def guard(fn: Callable[[], Any]) -> Any:
    """``fn()``, turning a :class:`~simulator.errors.ScenarioError` into :func:`fail`."""
    try:
        return fn()
    except ScenarioError as exc:
        fail(str(exc))


def cluster_spec(data: dict[str, Any]) -> Any:
    """A validated :class:`~simulator.scenario.ClusterSpec` from command-line options; bad
    values raise a located :class:`~simulator.errors.ScenarioError` (for :func:`guard`)."""
    from pydantic import ValidationError

    from simulator.scenario import ClusterSpec
    from simulator.yamlio import error_from_validation

    try:
        return ClusterSpec.model_validate(data)
    except ValidationError as exc:
        raise error_from_validation(exc) from None
