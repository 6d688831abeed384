"""Sweeps: the file format, expansion, executors (serial, process pool, Dask, Ray), the cache
and resuming, recorded failures, the CSV and the scaling numbers."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

import pytest

from simulator.results.scaling import scaling_efficiency
from simulator.sweep import (
    ExpressionError,
    InlineExecutor,
    SweepRun,
    evaluate,
    expand_sweep,
    load_sweep,
    open_executor,
    point_key,
    references,
    run_sweep,
    write_results,
)
from simulator.sweep import runner as sweep_module

ROOT = Path(__file__).resolve().parents[1]

BASE = """\
name: tiny
model: gpt3-125m
cluster:
  node: p4d.24xlarge
  nodes: 1
training:
  micro_batch: 4
  global_batch: 64
"""


def _write(tmp_path: Path, sweep: str, base: str = BASE) -> Path:
    (tmp_path / "base.yaml").write_text(base)
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep)
    return path


def _rows(out: Path) -> list[dict[str, str]]:
    with open(out / "results.csv", newline="") as handle:
        return list(csv.DictReader(handle))


# ----------------------------------------------------------------------------------------
# derived values


def test_expressions_compute_arithmetic_over_references():
    values = {"cluster.nodes": 4, "training.micro_batch": 2}
    assert evaluate("{cluster.nodes} * 8 * 4", values) == 128
    assert isinstance(evaluate("{cluster.nodes} * 8 / 2", values), int)  # 16.0 comes back as 16
    assert evaluate("max(1, {cluster.nodes} // 3) + 2 ** 3 - -1", values) == 10
    assert evaluate("{cluster.nodes} / 3", values) == pytest.approx(4 / 3)
    assert evaluate("ceil({cluster.nodes} / 3) % 2", values) == 0
    assert references("{a.b} + { c.d }") == ["a.b", "c.d"]


@pytest.mark.parametrize("text, fragment", [
    ("__import__('os')", "not allowed"),
    ("{cluster.nodes}.real", "not allowed"),
    ("nodes * 2", "name 'nodes'"),
    ("'8' * 2", "not allowed"),
    ("{cluster.nodes} > 2", "not allowed"),
    ("2 ** 1000", "exponent"),
    ("{cluster.nodes} / 0", "division by zero"),
    ("{training.global_batch} * 2", "not a field"),
    ("{name} * 2", "not a number"),
    ("(1 +", "cannot parse"),
])
def test_expressions_reject_everything_else(text, fragment):
    with pytest.raises(ExpressionError, match=fragment):
        evaluate(text, {"cluster.nodes": 4, "name": "x"})


# ----------------------------------------------------------------------------------------
# the file and its expansion


def test_expansion_is_the_product_of_vary_and_zip_with_derived_values(tmp_path):
    path = _write(tmp_path, """\
base: base.yaml
set: {training.recompute: selective}
vary:
  cluster.nodes: [1, 2]
zip:
  parallelism.sharding: [zero3, mics]
  parallelism.shard_group_size: [null, 8]
derive:
  training.global_batch: "{cluster.nodes} * 8 * 4"
""")
    sweep = load_sweep(path)
    points = expand_sweep(sweep)
    assert sweep.spec.size == 4 and len(points) == 4
    assert [p.values for p in points] == [
        {"cluster.nodes": 1, "parallelism.sharding": "zero3", "parallelism.shard_group_size": None,
         "training.global_batch": 32},
        {"cluster.nodes": 1, "parallelism.sharding": "mics", "parallelism.shard_group_size": 8,
         "training.global_batch": 32},
        {"cluster.nodes": 2, "parallelism.sharding": "zero3", "parallelism.shard_group_size": None,
         "training.global_batch": 64},
        {"cluster.nodes": 2, "parallelism.sharding": "mics", "parallelism.shard_group_size": 8,
         "training.global_batch": 64},
    ]
    assert all(p.error is None and p.scenario is not None for p in points)
    zero3, mics = points[2].scenario, points[3].scenario
    assert zero3 is not None and mics is not None
    assert zero3.parallelism.shard_group_size is None  # null removed the field: the default applies
    assert mics.parallelism.shard_group_size == 8
    assert zero3.training.recompute == "selective" and zero3.training.global_batch == 64
    assert sweep.spec.varied_fields == ["cluster.nodes", "parallelism.sharding", "parallelism.shard_group_size",
                                        "training.global_batch"]
    assert sweep.spec.series_fields() == ["parallelism.sharding"]  # the zip group's first field; nodes is the x axis


def test_invalid_combinations_are_points_with_a_reason(tmp_path):
    path = _write(tmp_path, """\
base: base.yaml
vary:
  parallelism.tp: [1, 5]
derive:
  training.micro_batch: "{training.global_batch} // 0"
""")
    points = expand_sweep(load_sweep(path))
    assert all(p.scenario is None for p in points)
    assert "division by zero" in (points[0].error or "")
    path = _write(tmp_path, "base: base.yaml\nvary:\n  parallelism.tp: [1, 5]\n")
    ok, bad = expand_sweep(load_sweep(path))
    assert ok.error is None
    assert bad.scenario is None
    assert bad.error == "parallelism: tp*pp*cp = 5*1*1 = 5 does not divide the world size 8 (1 x 8 GPUs of p4d.24xlarge)"


@pytest.mark.parametrize("text, line, fragments", [
    ("base: base.yaml\nvray:\n  cluster.nodes: [1]\n", 2, ["vray", "did you mean 'vary'"]),
    ("base: base.yaml\nvary:\n  cluster.nodes: []\n", 2, ["at least one value"]),
    ("base: base.yaml\nvary:\n  cluster.nodes: 4\n", 3, ["vary.cluster.nodes", "list"]),
    ("base: base.yaml\nzip:\n  - parallelism.tp: [1, 2]\n    parallelism.pp: [1]\n", 3, ["equal lengths"]),
    ("base: base.yaml\nvary:\n  parallelism.tp: [1]\nderive:\n  parallelism.tp: '2'\n", 5,
     ["parallelism.tp appears in both vary and derive"]),
    ("base: base.yaml\nvary:\n  cluster..nodes: [1]\n", 2, ["dotted field path"]),
    ("base: base.yaml\nvary:\n  cluster.nodes: [1]\nseries: parallelism.tp\n", 4, ["not a field this sweep varies"]),
    ("base: missing.yaml\nvary:\n  cluster.nodes: [1]\n", None, ["missing.yaml", "no such file"]),
    ("vary:\n  cluster.nodes: [1]\n", 1, ["base", "required"]),
])
def test_bad_sweep_files_exit_2_naming_file_line_and_field(cli, tmp_path, text, line, fragments):
    path = _write(tmp_path, text)
    result = cli("sweep", path, "--out", tmp_path / "out", "--executor", "serial")
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    if line is not None:
        assert f"sweep.yaml:{line}:" in message, message
    for fragment in fragments:
        assert fragment in message, message


def test_unknown_executor_is_bad_input(cli, tmp_path):
    path = _write(tmp_path, "base: base.yaml\nvary:\n  cluster.nodes: [1]\n")
    result = cli("sweep", path, "--out", tmp_path / "out", "--executor", "mpi")
    assert result.exit_code == 2 and "--executor 'mpi'" in result.output


def test_shipped_sweep_files_expand():
    files = sorted((ROOT / "scenarios" / "sweeps").glob("*.yaml"))
    assert files
    for path in files:
        points = expand_sweep(load_sweep(path))
        assert points and any(p.scenario is not None for p in points), path
    points = expand_sweep(load_sweep(ROOT / "scenarios/sweeps/gpt3-13b-p4d-sharding.yaml"))
    assert len(points) == 15 and all(p.scenario is not None for p in points)


# ----------------------------------------------------------------------------------------
# running, cache, resume, failures

NODES_SWEEP = """\
base: base.yaml
vary:
  cluster.nodes: [1, 2]
  parallelism.sharding: [none, zero1]
derive:
  training.global_batch: "{cluster.nodes} * 8 * 4"
"""


def _run(path: Path, out: Path, executor: Executor, **kw: Any) -> SweepRun:
    sweep = load_sweep(path)
    return run_sweep(expand_sweep(sweep), out, executor=executor, varied=sweep.spec.varied_fields,
                     series=sweep.spec.series_fields(), **kw)


def test_sweep_on_dask_localcluster_in_process(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    path = _write(tmp_path, NODES_SWEEP)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        run = _run(path, tmp_path / "out", client.get_executor())
    assert run.simulated == 4 and run.failed == 0
    assert [r["point"] for r in run.rows] == [0, 1, 2, 3]
    serial = _run(path, tmp_path / "serial", InlineExecutor())
    for a, b in zip(run.rows, serial.rows, strict=True):  # same numbers wherever they ran
        assert a["step_time_s"] == b["step_time_s"] and a["scenario_hash"] == b["scenario_hash"]


def test_sweep_on_a_process_pool(tmp_path):
    path = _write(tmp_path, NODES_SWEEP)
    with open_executor("local", workers=2) as executor:
        run = _run(path, tmp_path / "out", executor)
    assert run.simulated == 4 and run.failed == 0


class _InterruptAfter(Executor):
    """Runs calls inline; the call after ``k`` raises KeyboardInterrupt inside the 'worker'."""

    def __init__(self, k: int) -> None:
        self.k, self.calls = k, 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.calls += 1
        if self.calls > self.k:
            raise KeyboardInterrupt
        return InlineExecutor().submit(fn, *args, **kwargs)


def test_an_interrupted_sweep_resumes_and_gives_every_row_exactly_once(tmp_path):
    path = _write(tmp_path, NODES_SWEEP)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        _run(path, out, _InterruptAfter(2))
    cached = sorted((out / "cache").glob("*.json"))
    assert len(cached) == 2  # what finished before the interrupt is on disk, whole
    (out / "cache" / ".stray.json.1.tmp").write_text("{\"key\": ")  # a write cut short elsewhere
    run = _run(path, out, InlineExecutor())
    assert run.cached == 2 and run.simulated == 2 and run.failed == 0
    write_results(run, out)
    rows = _rows(out)
    assert [r["point"] for r in rows] == ["0", "1", "2", "3"]
    assert len({r["scenario_hash"] for r in rows}) == 4
    again = _run(path, out, InlineExecutor())  # nothing left to do
    assert again.simulated == 0 and again.cached == 4
    assert [r["step_time_s"] for r in again.rows] == [r["step_time_s"] for r in run.rows]


def test_a_corrupt_cache_entry_is_simulated_again(tmp_path):
    path = _write(tmp_path, NODES_SWEEP)
    out = tmp_path / "out"
    first = _run(path, out, InlineExecutor())
    points = expand_sweep(load_sweep(path))
    assert points[0].scenario is not None
    entry = out / "cache" / f"{point_key(points[0].scenario)}.json"
    entry.write_text(entry.read_text()[:40])
    run = _run(path, out, InlineExecutor())
    assert run.simulated == 1 and run.cached == 3
    assert run.rows[0]["step_time_s"] == first.rows[0]["step_time_s"]


def test_failing_points_are_recorded_and_the_others_complete(tmp_path, monkeypatch):
    path = _write(tmp_path, """\
base: base.yaml
vary:
  parallelism.tp: [1, 3, 2]
""")
    out = tmp_path / "out"
    run = _run(path, out, InlineExecutor())
    assert run.failed == 1 and run.simulated == 2
    bad = run.rows[1]
    assert bad["error"].startswith("parallelism: tp*pp*cp = 3*1*1 = 3 does not divide")
    assert bad.get("step_time_s") is None
    assert run.rows[0]["error"] is None and run.rows[2]["error"] is None

    # a bug in a worker is recorded, not cached: the next run tries the point again
    real = sweep_module.simulate_point

    def flaky(payload: dict[str, Any]) -> dict[str, Any]:
        if payload["parallelism"]["tp"] == 2:
            raise RuntimeError("boom")
        return real(payload)

    monkeypatch.setattr(sweep_module, "simulate_point", flaky)
    run = _run(path, tmp_path / "out2", InlineExecutor())
    assert run.rows[2]["error"] == "internal error: RuntimeError: boom"
    monkeypatch.setattr(sweep_module, "simulate_point", real)
    run = _run(path, tmp_path / "out2", InlineExecutor())
    assert run.rows[2]["error"] is None and run.simulated == 1 and run.cached == 1


def test_out_of_memory_points_keep_their_metrics_and_say_why(tmp_path):
    path = _write(tmp_path, """\
base: base.yaml
set: {model: gpt3-6.7b, training.micro_batch: 1, training.global_batch: 8}
vary:
  parallelism.sharding: [none, zero3]
""")
    run = _run(path, tmp_path / "out", InlineExecutor())
    ddp, zero3 = run.rows
    assert ddp["oom"] is True and ddp["fits"] is False and ddp["error"].startswith("out of memory")
    assert ddp["peak_memory_bytes"] > ddp["gpu_memory_bytes"] and ddp["memory_headroom_bytes"] < 0
    assert zero3["oom"] is False and zero3["fits"] is True and zero3["error"] is None
    assert ddp["scaling_efficiency"] is None  # not a point of any scaling curve


# ----------------------------------------------------------------------------------------
# outputs


def test_csv_columns_and_scaling_efficiency_by_hand(cli, tmp_path):
    path = _write(tmp_path, """\
name: tiny scaling
base: base.yaml
vary:
  cluster.nodes: [1, 2, 4]
  parallelism.sharding: [none, zero1]
derive:
  training.global_batch: "{cluster.nodes} * 8 * 4"
""")
    out = tmp_path / "out"
    result = cli("sweep", path, "--out", out, "--executor", "serial")
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    header = list(rows[0])
    assert header[:6] == ["fits", "point", "cluster.nodes", "parallelism.sharding", "training.global_batch", "nodes"]
    assert header[-3:] == ["series", "scaling_efficiency", "error"]
    for column in ("step_time_s", "tokens_per_s", "tflops_per_gpu", "mfu", "hfu", "peak_memory_bytes",
                   "memory_headroom_bytes", "oom", "world_size", "dp", "compute_s", "exposed_comm_s", "bubble_s",
                   "scenario_hash", "simulator_version"):
        assert column in header, column
    assert len(rows) == 6 and all(r["error"] == "" and r["fits"] == "True" for r in rows)

    # efficiency = throughput_N / (N / N0 * throughput_N0), per series, against the 8-GPU point
    for sharding in ("none", "zero1"):
        series = [r for r in rows if r["parallelism.sharding"] == sharding]
        assert [r["world_size"] for r in series] == ["8", "16", "32"]
        t8, t16, t32 = (float(r["tokens_per_s"]) for r in series)
        assert float(series[0]["scaling_efficiency"]) == pytest.approx(1.0)
        assert float(series[1]["scaling_efficiency"]) == pytest.approx(t16 / (16 / 8 * t8))
        assert float(series[2]["scaling_efficiency"]) == pytest.approx(t32 / (32 / 8 * t8))
        assert {r["series"] for r in series} == {f"sharding={sharding}"}

    # the figure's own efficiency (viz.scaling) agrees with the table
    from simulator.viz.scaling import scaling_series

    document = json.loads((out / "results.json").read_text())
    drawn = scaling_series(document["rows"], series_key="series")
    for label, points in drawn.items():
        table = [r for r in document["rows"] if r["series"] == label]
        assert [e for _, _, e in points] == pytest.approx([r["scaling_efficiency"] for r in table])
    html = (out / "scaling.html").read_text()
    assert "scaling efficiency" in html and "sharding=zero1" in html and "tiny scaling" in html
    assert document["points"] == 6 and document["simulated"] == 6


def test_scaling_efficiencies_formula():
    # 2x the GPUs at 1.8x the throughput: 90 %; ties at N0 take the best throughput
    assert scaling_efficiency([8, 16, 8], [100.0, 180.0, 90.0]) == pytest.approx([1.0, 0.9, 0.9])


def test_gpt3_13b_sharding_sweep_on_dask_local(cli, tmp_path):
    """The issue's sweep: nodes {1..16} x sharding {none, zero3, mics}, 13B on p4d, on a Dask
    LocalCluster of two worker processes."""
    pytest.importorskip("dask.distributed")
    out = tmp_path / "out"
    result = cli("sweep", ROOT / "scenarios/sweeps/gpt3-13b-p4d-sharding.yaml", "--executor", "dask-local",
                 "--workers", "2", "--out", out)
    assert result.exit_code == 0, result.output
    rows = _rows(out)
    assert len(rows) == 15 and (out / "scaling.html").stat().st_size > 0
    by = {(r["cluster.nodes"], r["parallelism.sharding"]): r for r in rows}
    for nodes in ("1", "2", "4", "8", "16"):
        ddp = by[(nodes, "none")]  # 16 bytes of states per parameter do not fit in 40 GB
        assert ddp["oom"] == "True" and ddp["error"].startswith("out of memory")
        for sharding in ("zero3", "mics"):
            assert by[(nodes, sharding)]["error"] == "", (nodes, sharding)
    # MiCS keeps parameter gathering inside the node: faster than ZeRO-3 beyond one node
    assert float(by[("16", "mics")]["tokens_per_s"]) > float(by[("16", "zero3")]["tokens_per_s"])


@pytest.mark.slow
def test_ray_adapter(tmp_path):
    """Only where Ray is installed (the optional ``ray`` extra); starting Ray takes ~15 s."""
    pytest.importorskip("ray")
    path = _write(tmp_path, "base: base.yaml\nvary:\n  cluster.nodes: [1, 2]\n")
    with open_executor("ray", workers=2) as executor:
        run = _run(path, tmp_path / "out", executor)
    assert run.simulated == 2 and run.failed == 0


def test_sweep_modules_stay_light():
    code = ("import sys, simulator.sweep; "
            "print(','.join(m for m in ('dask', 'ray', 'plotly', 'distributed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
