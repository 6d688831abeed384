"""``dtsim``: the command line (typer + rich), one module per command.

    dtsim run | fit | diff | sweep | search | schema | topo | collective | validate | calibrate | import

:mod:`~simulator.cli.application` holds the typer application and :func:`main` (the console script
``dtsim = simulator.cli:main``); :mod:`~simulator.cli.common` the consoles and the
bad-input exit; each command lives in the module of its name.

Exit codes: 0 success, 2 bad input (one line naming file, line and field), 1 a bug.
"""

from __future__ import annotations

from simulator.cli.application import app, main

__all__ = ["app", "main"]
