"""The ``dtsim`` typer application: every command registered in the order ``dtsim --help`` lists them,
and :func:`main`, the one place every exception ends.

Exit codes: 0 success, 2 bad input (one line naming file, line and field), 1 a bug (one line
``internal error: ...``; ``dtsim --debug`` or ``DTSIM_DEBUG=1`` prints the traceback), 130 interrupted.
"""

from __future__ import annotations

import sys
import traceback
from typing import Annotated

import typer

from simulator.cli.calibrate import calibrate
from simulator.cli.collective import collective
from simulator.cli.common import console, debug_enabled, err_console, one_line, safe, set_debug
from simulator.cli.diff import diff
from simulator.cli.fit import fit
from simulator.cli.goodput import goodput
from simulator.cli.import_cmd import import_app
from simulator.cli.limits_option import LimitOption, apply_limit_options
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
    "Run a scenario:  dtsim run scenarios/quickstart.yaml --set parallelism.tp=2\n\n"
    "Does it fit?  dtsim fit scenarios/quickstart.yaml (memory estimate, no simulation)\n\n"
    "Compare two results:  dtsim diff a.json b.json (from dtsim run --json)\n\n"
    "A whole run with failures:  dtsim goodput scenarios/llama3-405b-16k-h100.yaml --tokens 15.6T\n\n"
    "Exit codes: 0 success; 2 bad input (one line naming file, line and field); 1 an internal error "
    "(one line; rerun with --debug, or DTSIM_DEBUG=1, for the traceback).",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from simulator.version import __version__

        console.print(f"dtsim {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option("--version", "-V", callback=_print_version, is_eager=True,
                                          help="print dtsim's version and exit")] = False,
    debug: Annotated[bool, typer.Option("--debug", envvar="DTSIM_DEBUG",
                                        help="print the full traceback of an error (also DTSIM_DEBUG=1)")] = False,
    limit: LimitOption = None,
) -> None:
    set_debug(debug)
    apply_limit_options(limit)


for command in (run, fit, goodput, diff, sweep, search, schema, topo, collective, validate):
    app.command()(command)
# dtsim calibrate (simulator/cli/calibrate.py; PyTorch is imported only when it runs)
app.command(name="calibrate")(calibrate)
# dtsim import megatron | torchtitan | deepspeed (simulator/cli/import_cmd.py)
app.add_typer(import_app, name="import")


def _error(text: str) -> None:
    err_console.print(f"[bold red]error:[/] {safe(one_line(text))}", highlight=False, soft_wrap=True)


def main() -> None:
    """Run ``dtsim``: bad input exits 2 with one line, a write that the system refuses exits 2
    with one line, anything else is a bug: one line and exit 1 (the traceback under ``--debug``)."""
    try:
        app()
    except ScenarioError as exc:  # raised outside a guarded block
        if debug_enabled():
            traceback.print_exc()
        _error(str(exc))
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted", highlight=False)
        sys.exit(130)
    except BrokenPipeError:  # dtsim schema | head: the reader left; nothing more to say
        sys.stderr.close()
        sys.exit(141)
    except OSError as exc:
        if debug_enabled():
            traceback.print_exc()
        if exc.filename is None:
            raise _internal(exc) from None
        _error(f"{exc.filename}: {exc.strerror or exc}")
        sys.exit(2)
    except Exception as exc:  # the one place a bug is turned into one line
        raise _internal(exc) from None


def _internal(exc: BaseException) -> SystemExit:
    if debug_enabled():
        traceback.print_exception(exc)
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    err_console.print(f"[bold red]internal error:[/] {safe(one_line(detail, 300))} "
                      "(rerun with --debug for the traceback)", highlight=False, soft_wrap=True)
    return SystemExit(1)
