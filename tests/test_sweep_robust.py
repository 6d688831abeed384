"""Sweeps under bad input (issue 13, class 5): every inputs generated here.

* a sweep whose every point is invalid exits 2 with the reason (or each reason and its count);
  one with some valid points exits 0 and says how many have no result;
* a cache entry with the right key but the wrong shape is simulated again, never crashes a
  rerun nor reaches results.csv (hand-made shapes, then hypothesis-generated JSON);
* results.csv has the same columns, ``fits`` first, fresh, from the cache or half of each;
* a worker answer of the wrong type is an uncached internal-error row, not an abort;
* ``--workers`` is bounded by the CPUs and the points, and says so.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.errors import ScenarioError
from simulator.sweep import (
    CacheEntry,
    InlineExecutor,
    SweepRun,
    bound_workers,
    expand_sweep,
    load_sweep,
    point_key,
    run_sweep,
    write_results,
)
from simulator.sweep import executors as executors_module
from tests.test_sweep import BASE, ROOT


def _write(folder: Path, sweep: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "base.yaml").write_text(BASE)
    path = folder / "sweep.yaml"
    path.write_text(sweep)
    return path


def _run(path: Path, out: Path, executor: Executor | None = None) -> SweepRun:
    sweep = load_sweep(path)
    return run_sweep(expand_sweep(sweep), out, executor=executor or InlineExecutor(), varied=sweep.spec.varied_fields)


def _dtsim(*args: Any, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "simulator.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


# ----------------------------------------------------------------------------------------
# every point invalid

# a typo in a varied field or a value no scenario accepts: every point fails for one reason
ONE_REASON = [
    ("paralelism.tp: [1, 2]", "unknown field 'paralelism'"),
    ("training.micro_bach: [1, 2]", "micro_bach"),
    ("cluster.nodez: [1, 2]", "nodez"),
    ("model.seq_lenn: [512, 1024]", "seq_lenn"),
    ("parallelism.sharding: [zero9, zero10]", "sharding"),
    ("training.precision: [fp7, fp9]", "precision"),
]


@pytest.mark.parametrize(("axis", "fragment"), ONE_REASON)
def test_every_point_invalid_for_one_reason_exits_2_with_it(cli, tmp_path, axis, fragment):
    path = _write(tmp_path, f"base: base.yaml\nvary:\n  {axis}\n")
    out = tmp_path / "out"
    result = cli("sweep", path, "--out", out, "--executor", "serial")
    assert result.exit_code == 2, result.output
    assert "every point of the sweep is invalid" in result.output and fragment in result.output
    assert "Traceback" not in result.output
    assert not out.exists()  # nothing ran, nothing was written


def test_every_point_invalid_for_different_reasons_counts_each(cli, tmp_path):
    # tp 3 and 5 do not divide 8 GPUs; tp 6 neither: three reasons, one point each
    path = _write(tmp_path, "base: base.yaml\nvary:\n  parallelism.tp: [3, 5, 6, 3]\n  training.micro_batch: [4]\n")
    result = cli("sweep", path, "--out", tmp_path / "out", "--executor", "serial")
    assert result.exit_code == 2, result.output
    text = result.output
    assert "for 3 different reasons" in text
    assert "2 points: parallelism: tp*pp*cp = 3*1*1 = 3 does not divide" in text
    assert "1 point: parallelism: tp*pp*cp = 5*1*1 = 5" in text and "1 point: parallelism: tp*pp*cp = 6*1*1 = 6" in text


def test_some_valid_points_exit_0_and_count_the_invalid(cli, tmp_path):
    path = _write(tmp_path, "base: base.yaml\nvary:\n  parallelism.tp: [3, 1, 5]\n")
    out = tmp_path / "out"
    result = cli("sweep", path, "--out", out, "--executor", "serial")
    assert result.exit_code == 0, result.output
    assert "3 points (2 invalid)" in result.output and "2 of 3 points have no result" in result.output
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert [r["fits"] for r in rows] == ["", "True", ""]


def test_all_invalid_sweep_in_a_subprocess_is_one_line_exit_2(tmp_path):
    path = _write(tmp_path, "base: base.yaml\nvary:\n  paralelism.tp: [1, 2]\n")
    done = _dtsim("sweep", path, "--out", tmp_path / "out", "--executor", "local")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: every point of the sweep is invalid: paralelism")
    assert "Traceback" not in done.stderr + done.stdout


def test_user_text_reaches_the_terminal_inert(cli, tmp_path):
    """A terminal escape (OSC 0: retitle the terminal, ended by BEL) in a field name that makes
    every point invalid, and escapes plus console markup (a closing tag that would crash rich)
    in the sweep's name, are printed as text."""
    path = _write(tmp_path, 'base: base.yaml\nvary:\n  "x\\e]0;owned\\a": [1, 2]\n')
    result = cli("sweep", path, "--out", tmp_path / "out", "--executor", "serial")
    assert result.exit_code == 2, result.output
    assert "every point of the sweep is invalid" in result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    path = _write(tmp_path, 'name: "\\e]0;owned\\a[red]n[/red][/oops]"\nbase: base.yaml\nvary:\n  cluster.nodes: [1]\n')
    result = cli("sweep", path, "--out", tmp_path / "out", "--executor", "serial")
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "\\x1b]0;owned\\x07[red]n[/red][/oops]: 1 points" in result.output


# ----------------------------------------------------------------------------------------
# the cache

ONE_POINT = "base: base.yaml\nvary:\n  cluster.nodes: [1]\n"


def _entry_path(path: Path, out: Path) -> tuple[Path, str]:
    point = expand_sweep(load_sweep(path))[0]
    assert point.scenario is not None
    key = point_key(point.scenario)
    return out / "cache" / f"{key}.json", key


def _misshapen(key: str, good: dict[str, Any]) -> list[str]:
    metrics = good["metrics"]
    drop = {k: v for k, v in metrics.items() if k != "step_time_s"}
    variants: list[Any] = [
        [], {}, None, 1, "text", [good],
        {"key": key},
        {"key": key, "metrics": None, "error": None},
        {"key": key, "metrics": "fast", "error": None},
        {"key": key, "metrics": [1, 2, 3], "error": None},
        {"key": key, "metrics": {}, "error": None},
        {"key": key, "metrics": drop, "error": None},
        {"key": key, "metrics": {**metrics, "step_time_s": "1 s"}, "error": None},
        {"key": key, "metrics": {**metrics, "step_time_s": -1.0}, "error": None},
        {"key": key, "metrics": {**metrics, "tokens_per_s": None}, "error": None},
        {"key": key, "metrics": {**metrics, "oom": "no"}, "error": None},
        {"key": key, "metrics": {**metrics, "nested": {"a": 1}}, "error": None},
        {"key": key, "metrics": {**metrics, "list": [1]}, "error": None},
        {"key": key, "metrics": metrics, "error": 7},
        {"key": key, "metrics": metrics, "error": None, "extra": 1},
        {"key": key, "metrics": metrics, "error": None},  # no simulator_version
        {**good, "key": "another"},
        {**good, "key": 12},
    ]
    texts = [json.dumps(v) for v in variants]
    texts += [json.dumps(good)[:50], "", "\x00\x01\x02", "{" * 5000, '{"key": NaN}',
              json.dumps({**good, "metrics": {**metrics, "step_time_s": float("nan")}}),
              json.dumps({**good, "metrics": {**metrics, "step_time_s": float("inf")}})]
    return texts


def test_misshapen_cache_entries_are_simulated_again(tmp_path):
    """Each entry has the point's own file name (the right key) and a wrong shape: the rerun
    simulates the point, gets the fresh numbers and overwrites the entry with a valid one."""
    path = _write(tmp_path, ONE_POINT)
    out = tmp_path / "out"
    fresh = _run(path, out)
    entry_path, key = _entry_path(path, out)
    good = json.loads(entry_path.read_text())
    CacheEntry.model_validate(good)
    texts = _misshapen(key, good)
    assert len(texts) == 30
    for text in texts:
        entry_path.write_text(text)
        run = _run(path, out)
        assert (run.simulated, run.cached, run.failed) == (1, 0, 0), text[:80]
        assert run.rows[0]["fits"] is True and run.rows[0]["step_time_s"] == fresh.rows[0]["step_time_s"]
        CacheEntry.model_validate_json(entry_path.read_text())  # rewritten whole
    again = _run(path, out)
    assert again.cached == 1 and again.simulated == 0


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                                  max_size=4), max_leaves=12)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.dictionaries(st.sampled_from(["key", "metrics", "error", "simulator_version", "x"]), _json,
                               max_size=5), own_key=st.booleans())
def test_any_json_in_a_cache_entry_is_validated_or_recomputed(tmp_path, payload, own_key):
    """Whatever JSON sits under the right key: a row of the fresh numbers (recomputed) or, only
    if it is a valid entry, its own; never an exception."""
    path = _write(tmp_path, ONE_POINT)
    out = tmp_path / "out"
    entry_path, key = _entry_path(path, out)
    entry_path.parent.mkdir(parents=True, exist_ok=True)
    entry_path.write_text(json.dumps({**payload, "key": key} if own_key else payload))
    run = _run(path, out)
    assert run.simulated + run.cached == 1
    assert run.cached == 0  # random JSON never holds this key with valid metrics
    assert run.rows[0]["fits"] is True and run.rows[0]["error"] is None


# ----------------------------------------------------------------------------------------
# the CSV's columns


def test_csv_columns_are_the_same_fresh_from_cache_and_mixed(tmp_path):
    path = _write(tmp_path, "base: base.yaml\nvary:\n  cluster.nodes: [1, 2]\n  parallelism.tp: [1, 2, 3]\n")

    def header(out: Path, run: SweepRun) -> list[str]:
        write_results(run, out)
        with open(out / "results.csv", newline="") as handle:
            return next(csv.reader(handle))

    fresh_out = tmp_path / "fresh"
    fresh = header(fresh_out, _run(path, fresh_out))
    cached_run = _run(path, fresh_out)
    assert cached_run.cached == 4
    assert header(fresh_out, cached_run) == fresh
    mixed_out = tmp_path / "mixed"  # half the entries copied, half simulated
    (mixed_out / "cache").mkdir(parents=True)
    for entry in sorted((fresh_out / "cache").glob("*.json"))[:2]:
        (mixed_out / "cache" / entry.name).write_text(entry.read_text())
    mixed_run = _run(path, mixed_out)
    assert (mixed_run.cached, mixed_run.simulated) == (2, 2)
    assert header(mixed_out, mixed_run) == fresh
    assert fresh[:4] == ["fits", "point", "cluster.nodes", "parallelism.tp"]
    assert fresh[-3:] == ["series", "scaling_efficiency", "error"]


# ----------------------------------------------------------------------------------------
# worker answers


class _Answers(Executor):
    """Answers every submitted point with the given value (as a worker of another version, a
    broken transport or a bug might)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(self.answer)
        return future


GOOD_METRICS = {"step_time_s": 1.0, "tokens_per_s": 2.0, "oom": False}
WRONG_ANSWERS: list[Any] = [
    None, 42, "ok", b"bytes", [], [GOOD_METRICS], (GOOD_METRICS, None), {1, 2},
    {}, {"metrics": None}, {"error": None}, {"metrics": None, "error": None},
    {"metrics": GOOD_METRICS, "error": None, "extra": 1}, {"metrics": GOOD_METRICS},
    {"metrics": [1, 2], "error": None}, {"metrics": {**GOOD_METRICS, "step_time_s": "x"}, "error": None},
    {"metrics": {**GOOD_METRICS, "oom": 0}, "error": None}, {"metrics": {**GOOD_METRICS, "n": object()}, "error": None},
    {"metrics": None, "error": ["a"]}, {"metrics": {"step_time_s": float("nan"), "tokens_per_s": 1.0, "oom": False},
                                        "error": None},
]


def test_worker_answers_of_the_wrong_type_are_rows_not_aborts(tmp_path):
    path = _write(tmp_path, "base: base.yaml\nvary:\n  cluster.nodes: [1, 2]\n")
    for i, answer in enumerate(WRONG_ANSWERS):
        out = tmp_path / f"out{i}"
        run = _run(path, out, _Answers(answer))
        assert run.failed == 2, answer
        for row in run.rows:
            assert row["fits"] is None and row.get("step_time_s") is None
            assert row["error"].startswith("internal error: the worker's answer is not a point outcome ("), answer
        assert not list((out / "cache").glob("*.json"))  # never cached: the next run tries again
    good = _run(path, tmp_path / "good", _Answers({"metrics": GOOD_METRICS, "error": None}))
    assert good.failed == 0 and [r["fits"] for r in good.rows] == [True, True]


# ----------------------------------------------------------------------------------------
# the worker bound


@pytest.mark.parametrize(("requested", "tasks", "expected"), [
    (64, 5, (4, "--workers 64 capped at 4: 4 CPUs here")),
    (3, 2, (2, "--workers 3 capped at 2: 2 points to run")),
    (8, 1, (1, "--workers 8 capped at 1: 4 CPUs here, 1 point to run")),
    (2, 10, (2, None)),
    (None, 1, (1, None)),  # the default is cut silently
    (None, None, (4, None)),
    (4, 0, (1, "--workers 4 capped at 1: 0 points to run")),
])
def test_workers_are_bounded_by_cpus_and_points(monkeypatch, requested, tasks, expected):
    monkeypatch.setattr(executors_module, "default_workers", lambda: 4)
    assert bound_workers(requested, tasks) == expected


def test_zero_or_negative_workers_is_bad_input():
    for n in (0, -1):
        with pytest.raises(ScenarioError, match="need at least 1"):
            bound_workers(n)


def test_the_command_says_when_workers_are_capped(tmp_path):
    path = _write(tmp_path, "base: base.yaml\nvary:\n  cluster.nodes: [1]\n")
    done = _dtsim("sweep", path, "--out", tmp_path / "out", "--workers", "1000")
    assert done.returncode == 0, done.stderr
    assert "--workers 1000 capped at 1:" in done.stdout and "1 point to run" in done.stdout
