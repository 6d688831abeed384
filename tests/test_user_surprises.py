"""Issue 14, items 1, 3 and 4, met the way a user meets them: ``dtsim run`` in a subprocess.

Unitless quantities in files are errors; the summary shows the cluster's bandwidths; a run that
does not fit says so in its headline, rows and report; overlap defaults that cost time are
named; settings without effect get a note; every shipped scenario fits or says it does not.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import simulator
from simulator.errors import ScenarioError
from simulator.scenario import scenario_from_mapping

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "scenarios" / "quickstart.yaml"
H100 = ROOT / "scenarios" / "llama3-8b-tp-sp-cp-h100.yaml"
P3DN = ROOT / "scenarios" / "gpt3-13b-mics-p3dn.yaml"


def dtsim(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "400"}  # wide: no wrapped table cells
    return subprocess.run([sys.executable, "-m", "simulator.cli", *map(str, args)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)


def rows(out: str, label: str) -> list[str]:
    """The text of every summary row whose first cell is ``label`` ('' for continuation rows)."""
    found = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) == 2 and cells[0] == label:
            found.append(cells[1])
    return found


def _quickstart_with(tmp_path: Path, fabric_line: str) -> Path:
    text = QUICK.read_text().replace("  nodes: 4\n", f"  nodes: 4\n  fabric:\n    {fabric_line}\n")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


# -- item 1: units -------------------------------------------------------------------------------


def test_a_bare_bandwidth_in_a_file_is_an_error_naming_file_line_and_field(tmp_path: Path) -> None:
    """``nic_bandwidth: 400`` used to run as 400 B/s (a 3.5e6 s step); now it stops with exit 2 on
    the line that holds it: quickstart's ``nodes: 4`` is line 10, ``fabric:`` 11, the field 12."""
    path = _quickstart_with(tmp_path, "nic_bandwidth: 400")
    out = dtsim("run", path)
    assert out.returncode == 2
    assert out.stderr.strip() == (f"error: {path}:12: cluster.fabric.nic_bandwidth: 400 has no unit; "
                                  "write e.g. '400 Gb/s'")
    assert "Traceback" not in out.stderr


def test_a_quoted_bare_number_and_a_bare_set_value_are_errors_too(tmp_path: Path) -> None:
    out = dtsim("run", _quickstart_with(tmp_path, "latency: '5'"))
    assert out.returncode == 2 and "cluster.fabric.latency: 5 has no unit; write e.g. '5 us'" in out.stderr
    out = dtsim("run", QUICK, "--set", "parallelism.ddp.bucket_size=26214400")
    assert out.returncode == 2
    assert "26214400 has no unit; write e.g. '26214400 B'" in out.stderr and "--set" in out.stderr


def test_zero_needs_no_unit_and_a_unit_string_is_read(tmp_path: Path) -> None:
    """0 s of latency is 0 in any unit; '400Gbps' = 400e9 / 8 = 5e10 B/s."""
    sc = simulator.load_scenario(_quickstart_with(tmp_path, "latency: 0"))
    assert sc.cluster.fabric.latency_s == 0.0
    sc = simulator.load_scenario(_quickstart_with(tmp_path, "nic_bandwidth: 400Gbps"))
    assert sc.cluster.fabric.nic_bandwidth_bytes_per_s == 5e10


def test_the_python_api_takes_plain_numbers_in_si_units() -> None:
    """Without a file, a number is SI: 5e10 means 5e10 B/s; from a file the same mapping fails."""
    data = {"model": "gpt3-125m", "cluster": {"node": "p4d.24xlarge", "nodes": 1, "fabric": {"nic_bandwidth": 5e10}},
            "training": {"micro_batch": 1, "global_batch": 8}}
    sc = simulator.Scenario.model_validate(data)
    assert sc.cluster.fabric.nic_bandwidth_bytes_per_s == 5e10
    with pytest.raises(ScenarioError, match=r"50000000000\.0 has no unit"):
        scenario_from_mapping(data, file="x.yaml")


def test_the_summary_shows_per_nic_and_per_node_bandwidth_and_nvlink() -> None:
    """p4d.24xlarge: 4 EFA NICs of 100 Gb/s = 400 Gb/s = 50 GB/s per node; A100 NVLink 300 GB/s
    per GPU through NVSwitch; PCIe gen4 x16 (the catalog's 31.5 GB/s)."""
    out = dtsim("run", QUICK, "--set", "training.global_batch=128")
    assert out.returncode == 0, out.stderr
    lines = rows(out.stdout, "")
    assert "scale-out: 4 NIC x 100 Gb/s per NIC = 400 Gb/s (50 GB/s) per node, each direction" in lines
    assert any(line.startswith("intra-node: NVLink 300 GB/s per GPU (NVSwitch); PCIe gen4 x16") for line in lines)


# -- item 3: out of memory -----------------------------------------------------------------------


def test_an_out_of_memory_run_says_so_in_its_headline_and_on_every_rate(tmp_path: Path) -> None:
    """Without ZeRO-1 the shipped Llama 3 8B scenario keeps 8.03e9 / tp 2 x 12 bytes = 44.9 GiB
    of optimizer state per GPU and needs 87.3 GiB of 79.6: the title, a verdict row and the step
    time, throughput and MFU rows say it; the report opens with a banner."""
    report = tmp_path / "r.html"
    out = dtsim("run", H100, "--set", "parallelism.sharding=none", "--report", report)
    assert out.returncode == 0, out.stderr
    assert out.stdout.lstrip().startswith("OUT OF MEMORY Llama 3 8B")
    (verdict,) = rows(out.stdout, "verdict")
    assert verdict.startswith("OUT OF MEMORY: does not fit (87.33 GiB needed on rank 0, 79.65 GiB available)")
    for label in ("step time", "throughput", "per GPU"):
        (row,) = rows(out.stdout, label)
        assert row.endswith("(not valid: out of memory)"), row
    page = report.read_text()
    assert re.search(r'<div class="oom-banner" role="alert">OUT OF MEMORY: this configuration does not fit '
                     r"\(87.33 GiB needed", page)
    assert "<h1>OUT OF MEMORY: " in page


def test_a_run_that_fits_has_no_banner(tmp_path: Path) -> None:
    report = tmp_path / "r.html"
    out = dtsim("run", H100, "--report", report)
    assert out.returncode == 0 and "OUT OF MEMORY" not in out.stdout
    assert 'class="oom-banner"' not in report.read_text()


def test_every_shipped_scenario_fits_or_says_in_its_comment_that_it_does_not() -> None:
    for path in sorted((ROOT / "scenarios").glob("*.yaml")):
        result = simulator.simulate(simulator.load_scenario(path))
        comment = "\n".join(line for line in path.read_text().splitlines() if line.startswith("#")).lower()
        assert not result.oom or "out of memory" in comment, f"{path.name} does not fit and does not say so"


def test_the_scaling_figure_leaves_out_of_memory_points_out_with_a_note() -> None:
    from simulator.viz.scaling import scaling_figure

    records = [{"world_size": 8, "tokens_per_s": 100.0, "oom": False},
               {"world_size": 16, "tokens_per_s": 190.0, "oom": False},
               {"world_size": 32, "tokens_per_s": 400.0, "oom": True}]
    fig = scaling_figure(records)
    assert list(fig.data[0].x) == [8, 16]  # the 32-GPU point does not fit: not drawn
    assert [a.text for a in fig.layout.annotations if "out-of-memory" in a.text] == [
        "1 out-of-memory point(s) not drawn: they do not fit, so their throughput is not achievable"]


# -- item 4: defaults that surprise --------------------------------------------------------------


def test_zero2_on_p3dn_names_the_overlap_default_that_exposes_its_reduction() -> None:
    """DeepSpeed ZeRO-2 (overlap_comm: null = off below stage 3) on 16 p3dn: the gradient
    all-reduce runs after the backward, 64.9% of the step; with overlap_comm on, that why
    line goes (step 52.2 s -> 35.2 s) and the setting reads true (scenario)."""
    args = ("run", P3DN, "--set", "parallelism.sharding=zero2", "--set", "parallelism.shard_group_size=null",
            "--set", "framework=deepspeed")
    out = dtsim(*args)
    assert out.returncode == 0, out.stderr
    assert "parallelism.zero.overlap_comm = false (DeepSpeed default for stages 1 and 2)" in rows(out.stdout, "")
    assert rows(out.stdout, "why") == [
        "data-parallel gradient communication is 65% of the step, exposed: all-reduce not overlapped with the "
        "backward: zero.overlap_comm=false (DeepSpeed default for stages 1 and 2)"]
    on = dtsim(*args, "--set", "parallelism.zero.overlap_comm=true")
    assert on.returncode == 0, on.stderr
    assert "parallelism.zero.overlap_comm = true (scenario)" in rows(on.stdout, "")
    assert not any("not overlapped" in line for line in rows(on.stdout, "why"))


def test_sequence_parallel_with_tp_1_gets_a_note() -> None:
    out = dtsim("run", QUICK, "--set", "parallelism.sequence_parallel=true", "--set", "training.global_batch=128")
    assert out.returncode == 0, out.stderr
    (note,) = rows(out.stdout, "note")
    assert note.startswith("parallelism.sequence_parallel=true has no effect with tp 1")
    plain = dtsim("run", QUICK, "--set", "training.global_batch=128")
    assert rows(plain.stdout, "note") == []
