"""Resource limits (issue 13, class 1): one place (simulator/limits.py) with a documented default
and an override for each; an input over a limit is refused before the work it would cost, in
one line naming the file, line or field and the limit, exit 2.

Counted (the note of issue 13 quotes these): 26 oversized inputs through the Python API and
9 through the CLI (4 in subprocesses under a timeout), each refused in one line; 6 boundaries
at the limit accepted; 6 malformed overrides refused; overrides by DTSIM_LIMITS,
limits.raised and --limit each shown to change the verdict.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import simulator
from simulator import limits
from simulator.cli.run import _parse_ranks
from simulator.cluster import build_cluster
from simulator.errors import ScenarioError
from simulator.scenario import ClusterSpec, load_scenario
from simulator.scenario.loader import scenario_from_mapping
from simulator.sweep.expressions import ExpressionError, evaluate
from simulator.sweep.file import load_sweep
from tests.conftest import small_scenario
from tests.hostile import GOOD, ROOT, assert_refused, one_clean_line, run_dtsim, run_dtsim_many


@pytest.fixture(autouse=True)
def _no_limits_from_the_environment(monkeypatch):
    monkeypatch.delenv(limits.ENV_VAR, raising=False)


def _scenario(tmp_path: Path, text: str = GOOD) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


# -- scenario sizes: refused at load, located, before validation ---------------------------------

OVERSIZED = [
    # (override, limit named, what the message counts)
    ("cluster.nodes=1000000000000", "nodes=32,768", "1,000,000,000,000 nodes"),
    ("cluster.nodes=20000", "world_size=131,072", "160,000 GPUs"),  # 20,000 x 8 GPUs of p4d
    ("model.layers=100000000", "layers=4,096", "100,000,000 layers"),
    ("model.seq_len=1000000000000", "seq_len=16,777,216", "1,000,000,000,000 tokens"),
    ("training.global_batch=1000000000000000", "global_batch=16,777,216", "sequences"),
    # 2^22 sequences x 2048 tokens (gpt3-125m) = 2^33 tokens: exactly the limit, so 2^22 + 128 is over
    ("training.global_batch=4194432", "tokens_per_step=8,589,934,592", "8,590,196,736 tokens"),
]


@pytest.mark.parametrize(("override", "limit", "count"), OVERSIZED, ids=[o[0].split("=")[0] for o in OVERSIZED])
def test_oversized_scenarios_are_refused_naming_the_limit(tmp_path, override, limit, count):
    with pytest.raises(limits.LimitError) as caught:
        load_scenario(_scenario(tmp_path), [override])
    message = one_clean_line(str(caught.value))
    assert message.startswith(f"--set {override}: "), message
    assert f"exceeds the limit {limit}" in message and count in message, message
    assert "--limit " in message and "DTSIM_LIMITS=" in message, message


def test_an_oversized_count_in_a_file_names_its_line(tmp_path):
    path = _scenario(tmp_path, GOOD.replace("nodes: 2", "nodes: 99999999"))
    with pytest.raises(limits.LimitError) as caught:
        load_scenario(path)
    assert str(caught.value).startswith(f"{path}:4: cluster.nodes: cluster nodes: 99,999,999 nodes exceeds")


def test_the_limit_is_reported_before_the_cross_field_rule_it_also_breaks(tmp_path):
    """2^40 nodes also break 'global_batch divisible by micro_batch x dp'; the limit is the news."""
    with pytest.raises(limits.LimitError, match="nodes=32,768"):
        load_scenario(_scenario(tmp_path), [f"cluster.nodes={2**40}"])


def test_tokens_per_step_boundary():
    """gpt3-125m has seq_len 2048 = 2^11: global batch 2^22 gives 2^33 tokens, the limit (accepted);
    2^22 + 128 (a multiple of micro-batch 4 x dp 16 = 64, so otherwise valid) is over it."""
    scenario = scenario_from_mapping(small_scenario(training__global_batch=2**22))
    assert scenario.tokens_per_step == 2**33
    with pytest.raises(limits.LimitError, match="tokens_per_step"):
        scenario_from_mapping(small_scenario(training__global_batch=2**22 + 128))


def test_raising_a_limit_admits_the_input():
    data = small_scenario(model={"preset": "gpt3-125m", "layers": 4097})
    with pytest.raises(limits.LimitError, match="layers=4,096"):
        scenario_from_mapping(dict(data))
    with limits.raised(layers=4097):
        assert scenario_from_mapping(dict(data)).model.layers == 4097


# -- clusters, tasks, engine events ---------------------------------------------------------------


def test_build_cluster_refuses_before_building():
    """The Python API path (topo and collective too): 40,000 nodes are over nodes=32,768; 16,385
    p4d nodes are 131,080 GPUs, over world_size=131,072; neither builds a single vertex."""
    with pytest.raises(limits.LimitError, match="nodes=32,768"):
        build_cluster(ClusterSpec.model_validate({"node": "p4d.24xlarge", "nodes": 40_000}))
    with pytest.raises(limits.LimitError, match=r"131,080 GPUs exceeds the limit world_size=131,072"):
        build_cluster(ClusterSpec.model_validate({"node": "p4d.24xlarge", "nodes": 16_385}))


def test_task_limit_boundary():
    """The small scenario's program has as many tasks as the run has trace rows: a limit of
    exactly that many builds it, one fewer stops the builder at the task over it."""
    scenario = scenario_from_mapping(small_scenario())
    tasks = len(simulator.run_simulation(scenario).rows)
    with limits.raised(tasks=tasks):
        assert len(simulator.run_simulation(scenario).rows) == tasks
    with limits.raised(tasks=tasks - 1), pytest.raises(limits.LimitError) as caught:
        simulator.run_simulation(scenario)
    assert f"{tasks:,} tasks exceeds the limit tasks={tasks - 1:,}" in str(caught.value)


def test_engine_event_limit():
    """Every task takes at least one engine event: a limit of 5 events stops a program of 20 tasks."""
    scenario = scenario_from_mapping(small_scenario())
    assert simulator.run_simulation(scenario).facts.engine_events >= 5
    with limits.raised(engine_events=5), pytest.raises(limits.LimitError, match="engine_events=5"):
        simulator.run_simulation(scenario)


# -- sweeps, trace ranks, derived expressions -----------------------------------------------------


def _sweep(tmp_path: Path, axes: dict[str, list[int]]) -> Path:
    _scenario(tmp_path)
    lines = ["base: scenario.yaml", "vary:"] + [f"  {field}: {values}" for field, values in axes.items()]
    path = tmp_path / "sweep.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_sweep_of_billions_of_points_is_refused_from_its_axis_lengths(tmp_path):
    """6 axes of 50 values: 50^6 = 15,625,000,000 points, counted without building one."""
    fields = ["cluster.nodes", "training.micro_batch", "training.global_batch", "parallelism.tp", "model.layers",
              "model.hidden"]
    path = _sweep(tmp_path, {field: list(range(1, 51)) for field in fields})
    with pytest.raises(limits.LimitError) as caught:
        load_sweep(path)
    assert str(caught.value).startswith(f"{path}:2: vary: points of this sweep")
    assert "15,625,000,000 points exceeds the limit sweep_points=100,000" in str(caught.value)


def test_sweep_points_boundary(tmp_path):
    """2 x 2 axes = 4 points: accepted with sweep_points=4; 2 x 3 = 6 refused."""
    with limits.raised(sweep_points=4):
        assert load_sweep(_sweep(tmp_path, {"cluster.nodes": [1, 2], "training.micro_batch": [1, 2]})).spec.size == 4
        with pytest.raises(limits.LimitError, match="6 points exceeds the limit sweep_points=4"):
            load_sweep(_sweep(tmp_path, {"cluster.nodes": [1, 2], "training.micro_batch": [1, 2, 4]}))


def test_trace_ranks_are_counted_before_expanding():
    assert _parse_ranks("0-3,8") == [0, 1, 2, 3, 8]
    with limits.raised(trace_ranks=5):
        assert len(_parse_ranks("0-3,8")) == 5  # 4 + 1 ranks: at the limit
        with pytest.raises(limits.LimitError, match="6 ranks exceeds"):
            _parse_ranks("0-3,8,9")
    with pytest.raises(limits.LimitError, match="100,000,000,000,000 ranks exceeds the limit trace_ranks=131,072"):
        _parse_ranks("0-99999999999999")


@pytest.mark.parametrize("text", ["((2**64)**64)**64", "((((9**60)**60)**60)**60)", "({x}**64)**64"])
def test_nested_powers_are_refused_before_they_are_computed(text):
    """Each exponent is within the old guard (<= 64), but (2^64)^64 needs 4096 bits > 1024."""
    with pytest.raises(ExpressionError, match="expression_bits=1,024"):
        evaluate(text, {"x": 2**40})


def test_expression_values_at_the_bit_limit():
    """2^1023 has 1024 bits (accepted); 2^1024 has 1025 (refused); (-8)^0.5 is not real; 1e308 x 10 is inf."""
    assert evaluate("2**63 * 2**63 * 2**63 * 2**63 * 2**63 * 2**63 * 2**63 * 2**63 * 2**63 * 2**63 * 2**63 "
                    "* 2**63 * 2**63 * 2**63 * 2**63 * 2**63 * 2**15", {}) == 2**1023
    with pytest.raises(ExpressionError, match="1,025 bits"):
        evaluate("2**64 * 2**64 * 2**64 * 2**64 * 2**64 * 2**64 * 2**64 * 2**64 * 2**64 * 2**64 * 2**64 * 2**64 "
                 "* 2**64 * 2**64 * 2**64 * 2**64", {})
    with pytest.raises(ExpressionError, match="not a real number"):
        evaluate("(-8) ** 0.5", {})
    with pytest.raises(ExpressionError, match="not a finite number"):
        evaluate("1e308 * 10", {})


def test_a_count_of_thousands_of_digits_is_shown_by_its_size():
    """10^5000 cannot even be turned into a string under Python's 4300-digit rule: the message
    gives its order of magnitude (5000 digits: 10^5000 has bit length 16610, x log10(2) = 5000.1)."""
    scenario = small_scenario(cluster={"node": "p4d.24xlarge", "nodes": 10**5000})
    with pytest.raises(limits.LimitError, match=r"about 10\^5000 nodes exceeds the limit nodes=32,768"):
        scenario_from_mapping(scenario)


def test_file_size_limit(tmp_path):
    path = _scenario(tmp_path, GOOD + "#" * 2000 + "\n")
    with limits.raised(file_bytes=1024), pytest.raises(limits.LimitError, match="file_bytes=1,024"):
        load_scenario(path)


# -- overrides ------------------------------------------------------------------------------------


def test_parse_assignments():
    assert limits.parse_assignments("world_size=262144, sweep_points=1e6;tasks=5_000_000") == {
        "world_size": 262144, "sweep_points": 1_000_000, "tasks": 5_000_000}
    for bad, fragment in [("nodes", "expected NAME=N"), ("bogus=3", "unknown limit 'bogus'"),
                          ("nodes=0", "whole number >= 1"), ("nodes=2.5", "whole number"), ("nodes=x", "whole number"),
                          ("nodes=inf", "whole number")]:
        with pytest.raises(ScenarioError, match=fragment):
            limits.parse_assignments(bad)


def test_environment_overrides_and_scopes(monkeypatch):
    assert limits.get("nodes") == limits.LIMITS["nodes"].default == 32_768
    monkeypatch.setenv(limits.ENV_VAR, "nodes=7")
    assert limits.get("nodes") == 7
    with limits.raised(nodes=9):
        assert limits.get("nodes") == 9
    assert limits.get("nodes") == 7
    limits.apply_assignments(["layers=5"])  # --limit merges into the environment (worker processes inherit it)
    assert limits.parse_assignments(__import__("os").environ[limits.ENV_VAR]) == {"nodes": 7, "layers": 5}


def test_the_cli_refuses_oversized_requests_and_takes_overrides(tmp_path):
    """In subprocesses with a timeout: topo --nodes 10^8 and a sweep of 50^5 = 312,500,000
    points are refused; --limit and DTSIM_LIMITS lower a limit (2 nodes over nodes=1)."""
    sweep = _sweep(tmp_path, {f: list(range(1, 51)) for f in ("cluster.nodes", "training.micro_batch",
                                                               "training.global_batch", "parallelism.tp", "model.layers")})
    cases = [
        (("topo", "p4d.24xlarge", "--nodes", "100000000"), ("100,000,000 nodes", "nodes=32,768")),
        (("sweep", sweep, "--out", tmp_path / "out"), (f"{sweep}:2: vary", "312,500,000 points", "sweep_points")),
        (("--limit", "nodes=1", "topo", "p4d.24xlarge", "--nodes", "2"), ("2 nodes exceeds the limit nodes=1",)),
    ]
    for (_args, fragments), done in zip(cases, run_dtsim_many(*(args for args, _ in cases)), strict=True):
        assert_refused(done, *fragments)
    from_env = run_dtsim("topo", "p4d.24xlarge", "--nodes", "2", env={limits.ENV_VAR: "nodes=1"})
    assert_refused(from_env, "2 nodes exceeds the limit nodes=1")


@pytest.mark.parametrize(("args", "fragment"), [
    (("collective", "--node", "p4d.24xlarge", "--nodes", "5000000"), "5,000,000 nodes exceeds the limit nodes=32,768"),
    (("run", ROOT / "scenarios/quickstart.yaml", "--quiet", "--trace-ranks", "0-99999999999999"), "trace_ranks=131,072"),
    (("search", ROOT / "scenarios/quickstart.yaml", "--nodes", "4,100000000", "--executor", "serial"),
     "--nodes: cluster nodes: 100,000,000 nodes exceeds the limit nodes=32,768"),
    (("--limit", "bogus=1", "topo", "p4d.24xlarge"), "unknown limit 'bogus'"),
    (("--limit", "nodes=0", "topo", "p4d.24xlarge"), "whole number >= 1"),
], ids=["collective", "trace-ranks", "search", "unknown-limit", "zero-limit"])
def test_the_cli_refuses_in_process(cli, monkeypatch, args, fragment):
    monkeypatch.setenv(limits.ENV_VAR, "")  # restored after the test: --limit writes into it
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert fragment in one_clean_line(result.output)


def test_the_cli_limit_option_admits_what_it_allows(cli, monkeypatch):
    """--limit nodes=2 admits 2 nodes (2 x 8 A100 = 16 GPUs) and writes the override where
    worker processes would inherit it."""
    monkeypatch.setenv(limits.ENV_VAR, "")
    result = cli("--limit", "nodes=2", "topo", "p4d.24xlarge", "--nodes", "2")
    assert result.exit_code == 0 and "16 GPUs" in result.output, result.output
    assert __import__("os").environ[limits.ENV_VAR] == "nodes=2"


def test_every_limit_is_documented_in_readme_and_help():
    """README's limits table and dtsim --help name every limit with its default."""
    readme = (ROOT / "README.md").read_text()
    from simulator.cli.limits_option import LIMIT_HELP

    for limit in limits.LIMITS.values():
        assert re.search(rf"`{limit.name}`\s*\|\s*{limit.default:_}\b", readme), limit.name
        assert f"{limit.name}={limit.default:_}" in LIMIT_HELP, limit.name
