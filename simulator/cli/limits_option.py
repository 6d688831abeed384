"""``dtsim --limit NAME=N``: the option, given before the command, that raises a resource limit
of :mod:`simulator.limits` for this run (``DTSIM_LIMITS`` in the environment does the same).

:data:`LimitOption` and :func:`apply_limit_options` are the pieces; :func:`limits_callback` is
the application callback made of them (a typer application has one callback: another global
option joins it as a further parameter)."""

from __future__ import annotations

from typing import Annotated

import typer

from simulator import limits
from simulator.cli.common import guard

__all__ = ["LIMIT_HELP", "LimitOption", "apply_limit_options", "limits_callback"]

LIMIT_HELP = (
    "Raise a resource limit for this run (repeatable, before the command; the environment "
    f"variable {limits.ENV_VAR}=NAME=N,NAME=N does the same). Limits and defaults: "
    + "; ".join(f"{lim.name}={lim.default:_} {lim.unit}" for lim in limits.LIMITS.values())
    + ". An input over a limit is refused with exit code 2."
)

LimitOption = Annotated[list[str] | None, typer.Option("--limit", metavar="NAME=N", help=LIMIT_HELP)]


def apply_limit_options(values: list[str] | None) -> None:
    """Check ``DTSIM_LIMITS`` and merge the ``--limit`` values into it (exit 2 when malformed)."""
    guard(lambda: limits.apply_assignments(list(values or [])))


def limits_callback(limit: LimitOption = None) -> None:
    """Check ``DTSIM_LIMITS`` and merge the ``--limit`` options into it before any command runs."""
    apply_limit_options(limit)
