"""The top-level handler of ``dtsim`` (simulator/cli/application.py): bad input exits 2 with
one line, any other exception exits 1 with one ``internal error`` line that points to
``--debug``, and ``--debug`` / ``DTSIM_DEBUG=1`` print the traceback. The CLI runs in a
subprocess (with a timeout) as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a bug planted in the subprocess: simulate() raises an exception no code expects
CRASH = ("import sys, simulator, simulator.run\n"
         "def boom(*a, **k): raise ZeroDivisionError('planted bug\\nsecond line')\n"
         "simulator.run_simulation = boom\n"
         "from simulator.cli import main\n"
         "sys.argv = ['dtsim', *sys.argv[1:]]\n"
         "main()\n")


def _dtsim(*args: str, env: dict[str, str] | None = None, code: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "simulator.cli", *args]
    environment = {k: v for k, v in os.environ.items() if k != "DTSIM_DEBUG"}
    environment.update({"PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})})
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=environment)


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def test_an_unexpected_exception_is_one_line_and_exit_1() -> None:
    done = _dtsim("run", "scenarios/quickstart.yaml", "-q", code=CRASH)
    assert done.returncode == 1, done.stderr
    lines = _lines(done.stderr)
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("internal error: ZeroDivisionError: planted bug second line")
    assert "rerun with --debug" in lines[0] and "Traceback" not in done.stderr


@pytest.mark.parametrize("how", ["option", "env"])
def test_debug_prints_the_traceback(how: str) -> None:
    args = ("--debug", "run", "scenarios/quickstart.yaml", "-q") if how == "option" else (
        "run", "scenarios/quickstart.yaml", "-q")
    done = _dtsim(*args, code=CRASH, env={"DTSIM_DEBUG": "1"} if how == "env" else None)
    assert done.returncode == 1
    assert "Traceback (most recent call last)" in done.stderr and "ZeroDivisionError: planted bug" in done.stderr
    assert "internal error: ZeroDivisionError" in _lines(done.stderr)[-1]


def test_bad_input_keeps_exit_2_and_one_line(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: gpt3-125m\ncluster: {node: p4d.24xlarge, nodes: 2}\ntraining: {global_batch: 0}\n")
    done = _dtsim("run", str(scenario))
    assert done.returncode == 2
    lines = _lines(done.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"error: {scenario}:3: training.global_batch"), done.stderr
    # under --debug the same bad input still exits 2, now with the traceback first
    debug = _dtsim("--debug", "run", str(scenario))
    assert debug.returncode == 2 and "Traceback" in debug.stderr and _lines(debug.stderr)[-1] == lines[0]


def test_missing_file_and_unknown_command_are_bad_input() -> None:
    missing = _dtsim("run", "no/such/scenario.yaml")
    assert missing.returncode == 2 and len(_lines(missing.stderr)) == 1 and "Traceback" not in missing.stderr
    unknown = _dtsim("runn")
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr


def test_help_documents_exit_codes_and_debug() -> None:
    done = _dtsim("--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "--debug" in text and "DTSIM_DEBUG" in text and "2 bad input" in text and "1 an internal error" in text
