"""The ``dtsim`` typer application: every command registered in the order ``dtsim --help`` lists them.

Exit codes: 0 success, 2 bad input (one line naming file, line and field), 1 a bug.
"""

from __future__ import annotations

import sys

import typer

from simulator.cli.calibrate import calibrate
from simulator.cli.collective import collective
from simulator.cli.common import err_console
from simulator.cli.import_cmd import import_app
from simulator.cli.limits_option import limits_callback
from simulator.cli.run import run
from simulator.cli.schema import schema
from simulator.cli.search import search
from simulator.cli.sweep import sweep
from simulator.cli.topo import topo
from simulator.cli.validate import validate
from simulator.errors import ScenarioError

__all__ = ["app", "main"]

app = typer.Typer(
    name="dtsim",
    help="Discrete-event simulator of distributed deep-learning training.\n\n"
    "Run a scenario:  dtsim run scenarios/quickstart.yaml --set parallelism.tp=2",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.callback()(limits_callback)  # dtsim --limit NAME=N (simulator/limits.py)
for command in (run, sweep, search, schema, topo, collective, validate):
    app.command()(command)
# dtsim calibrate (simulator/cli/calibrate.py; PyTorch is imported only when it runs)
app.command(name="calibrate")(calibrate)
# dtsim import megatron | torchtitan | deepspeed (simulator/cli/import_cmd.py)
app.add_typer(import_app, name="import")


def main() -> None:
    try:
        app()
    except ScenarioError as exc:  # raised outside a guarded block
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
