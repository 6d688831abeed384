"""``dtsim --limit NAME=N``: the option, given before the command, that raises a resource limit
of :mod:`simulator.limits` for this run (``DTSIM_LIMITS`` in the environment does the same).

:data:`LimitOption` and :func:`apply_limit_options` are the pieces the application callback
(``simulator/cli/application.py``, beside ``--debug``) is made of."""

from __future__ import annotations

from typing import Annotated

import typer

from simulator import limits
from simulator.cli.common import guard

__all__ = ["LIMIT_HELP", "LimitOption", "apply_limit_options"]

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

