"""Helpers of the hostile-input tests (test_hostile_files.py, test_limits.py): hostile paths
made in a temporary folder, the CLI run in a subprocess under a timeout (a hang fails the
test instead of hanging it), and the promise every bad input must keep: exit 2, one line, no
traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120  # far above the ~2 s a refused input takes even on a loaded machine; only a hang gets near it

# a small valid scenario (GPT-3 125M on 2 x p4d): the base every hostile variant edits
GOOD = """\
model: gpt3-125m
cluster:
  node: p4d.24xlarge
  nodes: 2
training:
  micro_batch: 4
  global_batch: 128
"""

# kinds of path that are not a readable YAML file, each made by make_path
PATH_KINDS = ("missing", "directory", "fifo", "dev_zero", "symlink_loop", "nul_bytes", "not_utf8", "oversized")


def make_path(kind: str, folder: Path) -> Path:
    """A path of ``kind`` (one of :data:`PATH_KINDS`) under ``folder``; ``oversized`` is a valid
    scenario of 2 KiB, over the limit only when ``file_bytes`` is lowered to 1 KiB."""
    path = folder / f"{kind}.yaml"
    if kind == "missing":
        return path
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        return Path("/dev/zero")
    elif kind == "symlink_loop":
        other = folder / f"{kind}-other.yaml"
        path.symlink_to(other)
        other.symlink_to(path)
    elif kind == "nul_bytes":
        path.write_bytes(GOOD.encode().replace(b"nodes: 2", b"nodes: 2\x00"))
    elif kind == "not_utf8":
        path.write_bytes(GOOD.encode() + b"name: caf\xe9\n")
    elif kind == "oversized":
        path.write_text(GOOD + "# padding\n" * 200)
    else:
        raise ValueError(kind)
    return path


def run_dtsim(*args: Any, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``dtsim ARGS`` in a fresh interpreter, killed after :data:`TIMEOUT_S` (raising TimeoutExpired)."""
    full_env = {key: value for key, value in os.environ.items() if key != "DTSIM_LIMITS"}
    full_env.update({"PYTHONPATH": str(ROOT), "COLUMNS": "400", **(env or {})})
    return subprocess.run([sys.executable, "-m", "simulator.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=full_env, cwd=cwd or ROOT, stdin=subprocess.DEVNULL)


def run_dtsim_many(*calls: tuple[Any, ...], env: dict[str, str] | None = None) -> list[subprocess.CompletedProcess[str]]:
    """:func:`run_dtsim` for each argument tuple, four at a time (each waits mostly on its own
    interpreter's start), in the order given."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(lambda args: run_dtsim(*args, env=env), calls))


def one_clean_line(text: str) -> str:
    """The single non-empty line of ``text``, after checking there is one and no traceback."""
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


def assert_refused(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """A CLI run that refused its input: exit 2, one line on stderr, nothing on stdout."""
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert done.stdout.strip() == "", done.stdout
    line = one_clean_line(done.stderr)
    assert line.startswith("error: "), line
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line
