"""Output paths are checked before any work (issue 13, class 4; simulator/cli/common.py:
``check_output_file``, ``check_output_dir``): a directory given as a file, a file given as a
folder, a cache folder that is a file, a parent that is a file, a read-only location, a
too-long name: one line, exit 2, no traceback. Paths are built here; the CLI runs in a
subprocess with a timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cli.common import check_output_dir, check_output_file

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "scenarios" / "quickstart.yaml")
SWEEP = str(next((ROOT / "scenarios" / "sweeps").glob("*.yaml")))
LONG = "n" * 300  # above the usual 255-byte NAME_MAX


def _dtsim(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DTSIM_DEBUG"}
    env.update({"PYTHONPATH": str(ROOT), "COLUMNS": "300"})
    return subprocess.run([sys.executable, "-m", "simulator.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "cache").write_text("not a folder")
    return tmp_path


CASES = [
    # (arguments with {t} for the tree, the fragment of the one error line)
    (("run", QUICKSTART, "--json", "{t}/dir"), "is a directory; give a file name"),
    (("run", QUICKSTART, "--json", "{t}/file/result.json"), "/file is not a directory"),
    (("run", QUICKSTART, "--trace", "/proc/dtsim-no-such/trace.json"), "cannot write in /proc"),
    (("run", QUICKSTART, "--report", f"{{t}}/{LONG}.html"), "longer than the file system allows"),
    (("run", QUICKSTART, "--report", "{t}/dir/"), "is a directory"),
    (("run", QUICKSTART, "--hta", "{t}/file"), "is a file, not a directory"),
    (("run", QUICKSTART, "--json", "{t}/" + "/".join(["d" * 200] * 25) + "/r.json"), "path is longer"),
    (("schema", "--out", "{t}/dir"), "is a directory; give a file name"),
    (("schema", "--out", "{t}/file/schema.json"), "is not a directory"),
    (("sweep", SWEEP, "--out", "{t}/file"), "is a file, not a directory"),
    (("sweep", SWEEP, "--out", "{t}/out"), "cache is a file, not a directory"),
    (("search", QUICKSTART, "--out", "{t}/out"), "cache is a file, not a directory"),
    (("validate", "--json", "{t}/dir"), "is a directory; give a file name"),
    (("validate", "--docs", "{t}/file"), "is a file, not a directory"),
    (("calibrate", "--device", "cpu", "--out", "{t}/dir"), "is a directory; give a file name"),
    (("import", "torchtitan", QUICKSTART, "--node", "dgx-a100", "--nodes", "1", "--out", "{t}/dir"),
     "is a directory; give a file name"),
]


@pytest.mark.parametrize(("args", "fragment"), CASES, ids=[f"{c[0][0]} {c[0][-2]} {c[1][:20]}" for c in CASES])
def test_bad_output_paths_are_one_line_exit_2(tree: Path, args: tuple[str, ...], fragment: str) -> None:
    done = _dtsim(*(a.replace("{t}", str(tree)) for a in args))
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert fragment in lines[0] and "Traceback" not in done.stderr
    assert not done.stdout.strip(), done.stdout  # refused before any work: nothing printed
    assert (tree / "out" / "cache").is_file() and not list((tree / "dir").iterdir())


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_read_only_folder(tree: Path) -> None:
    (tree / "dir").chmod(0o500)
    try:
        done = _dtsim("schema", "--out", str(tree / "dir" / "s.json"))
    finally:
        (tree / "dir").chmod(0o700)
    assert done.returncode == 2 and "cannot write in" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_missing_parents_are_created(tree: Path) -> None:
    """A missing folder under a writable one is fine: the writer creates it."""
    target = tree / "new" / "deeper" / "schema.json"
    done = _dtsim("schema", "--out", str(target))
    assert done.returncode == 0, done.stderr
    assert target.read_text().startswith("{")


PARTS = st.sampled_from(["dir", "file", "missing", LONG, "out", "cache", ".", "..", "x.json"])


@settings(max_examples=150, derandomize=True, deadline=None)
@given(parts=st.lists(PARTS, min_size=1, max_size=5), as_dir=st.booleans())
def test_any_path_passes_or_exits_2(parts: list[str], as_dir: bool) -> None:
    """Whatever the path, the checks return or exit with code 2; nothing else escapes, and a
    path that passes as a file target is not an existing directory."""
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "dir").mkdir()
        (base / "file").write_text("x")
        (base / "out").mkdir()
        (base / "out" / "cache").write_text("x")
        path = base.joinpath(*parts)
        try:
            if as_dir:
                check_output_dir(path, "--out", inside=("cache",))
            else:
                check_output_file(path, "--out")
        except typer.Exit as exc:
            assert exc.exit_code == 2
            return
        if as_dir:
            assert not path.exists() or (path.is_dir() and not (path / "cache").is_file())
        else:
            assert not path.is_dir()


def test_report_counts() -> None:
    """16 CLI cases, the read-only folder and the created parents: the subprocess inputs here."""
    assert len(CASES) + 2 == 18
