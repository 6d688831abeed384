"""CLI conventions (issue 14 item 10), exercised the way a user meets them: ``--version``, ``-h``,
``dtsim fit``, the cost line of ``dtsim run``, ``dtsim diff``, tables that keep their numbers at
80 columns, the results table of ``dtsim sweep``, and a typo in a file reported first."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import ROOT


def _dtsim(*args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(ROOT), "COLUMNS": str(columns), "PATH": "/usr/bin:/bin", "TERM": "dumb"}
    return subprocess.run([sys.executable, "-m", "simulator.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


def test_version_prints_the_package_version():
    from simulator.version import __version__

    for flag in ("--version", "-V"):
        done = _dtsim(flag)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"dtsim {__version__}"


def test_short_help_on_the_app_and_on_a_command(cli):
    top = cli("-h")
    assert top.exit_code == 0 and "dtsim fit" in top.output and "diff" in top.output
    sub = cli("run", "-h")
    assert sub.exit_code == 0 and "--prices" in sub.output and "--memory-only" in sub.output


def test_a_typo_in_a_file_is_reported_first_with_a_suggestion(tmp_path):
    """``hiden`` makes two problems: an unknown field and a missing ``hidden``, plus a bad
    ``layers``; the unknown field comes first, at its line (4), with the suggestion."""
    path = tmp_path / "typo.yaml"
    path.write_text(textwrap.dedent("""\
        model:
          name: mine
          layers: -3
          hiden: 2048
          heads: 16
          vocab: 50000
          seq_len: 2048
        cluster: {node: p4d.24xlarge, nodes: 1}
        training: {micro_batch: 1, global_batch: 8}
        """))
    done = _dtsim("run", path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    line = " ".join(done.stderr.split())
    assert f"{path}:4: model.hiden: unknown field 'hiden' (did you mean 'hidden'?)" in line, line
    assert "(+2 more problems)" in line


def test_fit_agrees_with_run_on_the_quickstart(tmp_path):
    """``dtsim fit`` prints the numbers of :func:`estimate_stage_memory` (the search's pre-estimate)
    and its verdict is ``dtsim run``'s: on the quickstart both say it fits, with a peak of 37.43 GiB
    (the estimate equals the simulated peak here: DDP keeps no transient state at the first backward)."""
    import json

    import simulator
    from simulator import units
    from simulator.workload.memory_estimate import estimate_stage_memory

    scenario = ROOT / "scenarios" / "quickstart.yaml"
    (est,) = estimate_stage_memory(simulator.load_scenario(scenario))
    fit = _dtsim("fit", scenario, columns=120)
    assert fit.returncode == 0, fit.stderr
    assert f"fits: at least {units.format_bytes(est.peak_bytes)} of {units.format_bytes(est.capacity_bytes)}" in fit.stdout
    for part in (est.params_bytes, est.grads_bytes, est.optimizer_bytes, est.activations_bytes, est.context_bytes):
        assert units.format_bytes(part) in fit.stdout
    assert _dtsim("run", scenario, "--memory-only", columns=120).stdout == fit.stdout
    done = _dtsim("run", scenario, "--quiet", "--json", tmp_path / "r.json")
    result = json.loads((tmp_path / "r.json").read_text())
    assert done.returncode == 0 and result["oom"] is False
    assert units.format_bytes(result["peak_memory_bytes"]) == units.format_bytes(est.peak_bytes) == "37.43 GiB"


def test_fit_says_when_it_does_not_fit():
    """GPT-3 XL with micro-batch 8 on A100-40GB: the estimate is over 40 GiB, so the verdict is
    certain (a lower estimate above the capacity); dtsim run agrees (OOM)."""
    scenario = ROOT / "scenarios" / "quickstart.yaml"
    fit = _dtsim("fit", scenario, "--set", "training.micro_batch=8", columns=120)
    assert fit.returncode == 0 and "DOES NOT FIT" in fit.stdout
    run = _dtsim("run", scenario, "--set", "training.micro_batch=8", columns=200)
    assert "OUT OF MEMORY" in run.stdout


def test_fit_lists_each_pipeline_stage():
    fit = _dtsim("fit", ROOT / "scenarios" / "gpt3-175b-3d-dgx-a100.yaml", columns=120)
    assert fit.returncode == 0, fit.stderr
    stage_rows = [line.split()[0] for line in fit.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert stage_rows == [str(s) for s in range(8)]


def test_run_prints_the_cost_of_a_step(tmp_path):
    """quickstart: 4 x p4d.24xlarge at $32.77 per node-hour (topologies/prices.yaml). A step of
    S seconds costs S / 3600 x 4 x 32.77 dollars (S = 0.7982: $0.0291); it processes
    256 x 2048 = 524,288 tokens, so a million tokens cost that x 1e6 / 524,288 ($0.0554)."""
    import json

    done = _dtsim("run", ROOT / "scenarios" / "quickstart.yaml", "--json", tmp_path / "r.json", columns=400)
    assert done.returncode == 0, done.stderr
    step = json.loads((tmp_path / "r.json").read_text())["step_time_s"]
    line = next(x for x in done.stdout.splitlines() if x.startswith("cost:"))
    per_step = step / 3600 * 4 * 32.77
    assert f"${per_step:,.4f} per step" in line
    assert f"${per_step / 524_288 * 1e6:,.4f} per million tokens" in line
    assert "4 x p4d.24xlarge at $32.77 per node-hour" in line and "topologies/prices.yaml" in line


def test_run_cost_from_a_prices_file(tmp_path):
    """A --prices entry replaces the shipped one: $100 per node-hour x 4 nodes = $400 per hour,
    the cost line names the file."""
    prices = tmp_path / "mine.yaml"
    prices.write_text("prices:\n  p4d.24xlarge: {usd_per_hour: 100, kind: reserved, date: '2026', source: contract}\n")
    done = _dtsim("run", ROOT / "scenarios" / "quickstart.yaml", "--prices", prices, columns=400)
    line = next(x for x in done.stdout.splitlines() if x.startswith("cost:"))
    assert "at $100.00 per node-hour, reserved" in line and str(prices) in line


def test_diff_shows_absolute_and_relative_change(tmp_path):
    """Two results differing by construction; the relative change of each row is (B - A) / A of
    the values in the JSON files."""
    from simulator.cli.diff import load_result, relative_change

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    scenario = ROOT / "scenarios" / "quickstart.yaml"
    assert _dtsim("run", scenario, "-q", "--json", a).returncode == 0
    assert _dtsim("run", scenario, "-q", "--json", b, "--set", "cluster.nodes=8").returncode == 0
    ra, rb = load_result(a), load_result(b)
    done = _dtsim("diff", a, b, columns=200)
    assert done.returncode == 0, done.stderr
    gpus = next(x for x in done.stdout.splitlines() if x.startswith("│ GPUs"))
    assert "32" in gpus and "64" in gpus and "+32" in gpus and "+100.0%" in gpus  # (64 - 32) / 32
    step = next(x for x in done.stdout.splitlines() if x.startswith("│ step time"))
    expected = f"{100 * (rb.step_time_s - ra.step_time_s) / ra.step_time_s:+.1f}%"
    assert expected in step and relative_change(ra.step_time_s, rb.step_time_s) == expected
    assert relative_change(2.0, 3.0) == "+50.0%" and relative_change(4.0, 3.0) == "-25.0%"
    assert relative_change(0.0, 0.0) == "+0.0%" and relative_change(0.0, 1.0) == "-"


def test_diff_refuses_a_file_that_is_not_a_result(tmp_path):
    not_json = ROOT / "scenarios" / "quickstart.yaml"
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    for bad in (not_json, other):
        done = _dtsim("diff", bad, bad)
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert str(bad) in done.stderr and "dtsim run --json" in done.stderr


def _render_80(table) -> str:
    import io

    from rich.console import Console

    from simulator.cli.common import print_table

    buffer = io.StringIO()
    print_table(table, Console(file=buffer, width=80, force_terminal=True, color_system=None))
    return buffer.getvalue()


def test_tables_keep_every_number_at_80_columns():
    """A search-style row and a validate-style row rendered on an 80-column terminal: every
    number is printed whole and no cell ends in an ellipsis; the long record name folds."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    cells = ["llmfoundry_a100_80_mpt125m_s2048_g8_v2", "1024", "159.637", "161.916", "+1.4%", "49.0", "$12,345,678",
             "1,158,779"]
    for i, _ in enumerate(cells):
        table.add_column(f"c{i}", no_wrap=i > 0, overflow="fold")
    table.add_row(*cells)
    text = _render_80(table)
    assert "\u2026" not in text
    for cell in cells[1:]:
        assert cell in text
    assert "".join(line.split()[0] for line in text.splitlines()[2:] if line.strip()) == cells[0]


def test_search_and_validate_tables_at_80_columns():
    """The commands' own tables at 80 columns on a terminal (TTY_COMPATIBLE=1): search's cost
    column and validate's record names are whole."""
    import re

    from simulator.validation.records import load_records

    env_cols = {"TTY_COMPATIBLE": "1"}
    ids = [r.id for r in load_records() if r.source == "megatron-sc21"]
    done = _dtsim_env(env_cols, "validate", "--source", "megatron-sc21", "--no-docs")
    text = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)
    assert "\u2026" not in text
    folded = "".join(line.split()[0] for line in text.splitlines() if line.startswith("megatron_sc21") or
                     (line[:1].isalnum() and not line.startswith(("record", "predicted", "mean", "source"))))
    for record_id in ids:
        assert record_id in folded
    search = _dtsim_env(env_cols, "search", ROOT / "scenarios" / "quickstart.yaml", "--top", "2",
                        "--max-estimates", "4", "--executor", "serial")
    text = re.sub(r"\x1b\[[0-9;]*m", "", search.stdout)
    assert search.returncode == 0, search.stderr
    table = text[text.index("best by"):text.index("time to train")]
    assert "\u2026" not in table and re.search(r"\$[\d,]+\s*$", table.splitlines()[3])


def _dtsim_env(extra: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(ROOT), "COLUMNS": "80", "PATH": "/usr/bin:/bin", **extra}
    return subprocess.run([sys.executable, "-m", "simulator.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


def test_sweep_prints_a_results_table(tmp_path):
    """quickstart-nodes: 5 node counts x 2 shardings = 10 points in sweep order; at 16 nodes
    256 sequences do not split into micro-batches of 4 on 128 GPUs (no result: '-')."""
    done = _dtsim("sweep", ROOT / "scenarios" / "sweeps" / "quickstart-nodes.yaml", "--out", tmp_path / "o",
                  "--executor", "serial", columns=120)
    assert done.returncode == 0, done.stderr
    rows = [line.split("│")[1:-1] for line in done.stdout.splitlines() if line.startswith("│")]
    rows = [[c.strip() for c in r] for r in rows]
    assert [r[0] for r in rows] == [str(i) for i in range(10)]
    assert [(r[1], r[2]) for r in rows[:2]] == [("1", "none"), ("1", "zero1")]
    assert [r[3] for r in rows] == ["yes"] * 8 + ["-"] * 2
    assert rows[4][4] == "798.2 ms"  # 4 nodes, DDP: the quickstart itself
