"""Hostile files (issue 13, class 2): a path that is no readable YAML file, a YAML document built
to exhaust memory or the stack, keys and numbers no dtsim field can hold. Every input below is
made in the test; each must be refused with one line (exit 2 from the CLI, a ScenarioError from
the Python API), never a traceback, a hang or a silent acceptance.

Counted per group (the note of issue 13 quotes these):
* paths: 6 roles (scenario, topology, node file, calibration, sweep file, sweep base) x
  8 kinds (missing, directory, FIFO, /dev/zero, symlink loop, NUL bytes, not UTF-8,
  oversized) = 48 inputs through the Python API, 6 of them again through the CLI;
* YAML documents: 19 in a file, 5 as ``--set`` values, 2 of them again through the CLI, plus
  the alias-bomb and nesting properties (hypothesis, 30 generated documents each);
* other config formats: 6 JSON/TOML documents for ``dtsim import``, 1 again through the CLI.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import limits, run_simulation
from simulator.errors import ScenarioError
from simulator.scenario import load_scenario
from simulator.sweep.file import load_sweep
from simulator.yamlio import parse_yaml_text
from tests.hostile import GOOD, PATH_KINDS, assert_refused, make_path, one_clean_line, run_dtsim_many

# -- paths that are not a readable YAML file ----------------------------------------------------

# what the message says for each kind when the file itself is read (scenario, topology, sweep, base)
KIND_WORDS = {
    "missing": "no such file",
    "directory": "is a directory",
    "fifo": "is a FIFO",
    "dev_zero": "is a device",
    "symlink_loop": "symbolic link loop",
    "nul_bytes": "NUL byte",
    "not_utf8": "not UTF-8",
    "oversized": "file_bytes=1,024",
}


def _scenario_with_cluster(folder: Path, **cluster: Any) -> Path:
    lines = "\n".join(f"  {key}: {value}" for key, value in cluster.items())
    path = folder / "scenario-using-it.yaml"
    path.write_text(GOOD.replace("  node: p4d.24xlarge\n", lines + "\n" if lines else ""))
    return path


def _load_in_role(role: str, hostile: Path, folder: Path) -> Any:
    if role == "scenario":
        return load_scenario(hostile)
    if role == "topology":
        return load_scenario(_scenario_with_cluster(folder, topology=hostile))
    if role == "node":
        return load_scenario(_scenario_with_cluster(folder, node=hostile))
    if role == "calibration":  # read when the run needs it: a scenario naming it validates without reading it
        return run_simulation(load_scenario(_scenario_with_cluster(folder, node="p4d.24xlarge", calibration=hostile)))
    if role == "sweep":
        return load_sweep(hostile)
    assert role == "sweep_base"
    sweep = folder / "sweep.yaml"
    sweep.write_text(f"base: {hostile}\nvary:\n  cluster.nodes: [1, 2]\n")
    return load_sweep(sweep)


ROLES = ("scenario", "topology", "node", "calibration", "sweep", "sweep_base")


@pytest.mark.parametrize("kind", PATH_KINDS)
@pytest.mark.parametrize("role", ROLES)
def test_a_path_that_is_no_readable_file_is_one_line_naming_it(tmp_path, role, kind):
    load_scenario(_scenario_with_cluster(tmp_path, node="p4d.24xlarge"))  # the catalog is read before any limit drops
    hostile = make_path(kind, tmp_path)
    scope = limits.raised(file_bytes=1024) if kind == "oversized" else limits.raised()
    with scope, pytest.raises(ScenarioError) as caught:
        _load_in_role(role, hostile, tmp_path)
    message = one_clean_line(str(caught.value))
    assert str(hostile) in message, message
    expected = "not found" if kind == "missing" and role in ("node", "calibration") else KIND_WORDS[kind]
    assert expected in message, message  # it says why, not only that it failed


# -- YAML documents built to hurt ---------------------------------------------------------------


def _alias_bomb(width: int, levels: int) -> str:
    """``levels`` anchored lists, each holding ``width`` aliases of the one before: 1 + w + ... + w^levels values."""
    rows = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels + 1):
        rows.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(rows) + "\n"


def _deep_block(levels: int) -> str:
    return "".join("  " * i + f"k{i}:\n" for i in range(levels)) + "  " * levels + "leaf: 1\n"


DOCUMENTS = [
    # (name, the document, expected line or None, fragment of the message)
    ("alias bomb", _alias_bomb(10, 9), 6, "yaml_nodes=1,000,000"),  # a5 expands to 1,111,111 values
    ("too many aliases", "a: &a 1\nb: [" + ", ".join(["*a"] * 1001) + "]\n", 2, "yaml_aliases=1,000"),
    ("flow nesting 5000 deep", "a: " + "[" * 5000 + "]" * 5000 + "\n", 1, "yaml_depth=64"),
    ("block nesting 2000 deep", _deep_block(2000), 64, "yaml_depth=64"),
    ("mixed nesting 3000 deep", "a: " + "[{b: " * 1500 + "1" + "}]" * 1500 + "\n", 1, "yaml_depth=64"),
    ("recursive alias", "a: &r [1, *r]\n", 1, "refers to a node that contains it"),
    ("alias deepening past the depth", "a: &d " + "[" * 40 + "1" + "]" * 40 + "\nb: " + "[" * 40 + "*d" + "]" * 40
     + "\n", 2, "once aliases are expanded"),
    ("list as a key", "model: gpt3-125m\n? [tp, dp]\n: 2\n", 2, "not a list"),
    ("mapping as a key", "model: gpt3-125m\ncluster:\n  ? {nodes: 2}\n  : 2\n", 3, "not a mapping"),
    (".inf count", GOOD.replace("micro_batch: 4", "micro_batch: .inf"), 6, "'.inf' is not a finite number"),
    ("-.inf count", GOOD.replace("micro_batch: 4", "micro_batch: -.inf"), 6, "not a finite number"),
    (".nan count", GOOD.replace("global_batch: 128", "global_batch: .nan"), 7, "'.nan' is not a finite number"),
    ("1e999 bandwidth", GOOD.replace("  nodes: 2\n", "  nodes: 2\n  fabric:\n    nic_bandwidth: 1e999\n"), 6,
     "'1e999' is not a finite number"),
    ("'1e999 GB/s' string", GOOD.replace("  nodes: 2\n", "  nodes: 2\n  fabric:\n    nic_bandwidth: 1e999 GB/s\n"),
     6, "not a finite"),
    ("400-digit integer", GOOD.replace("nodes: 2", "nodes: " + "9" * 400), 4, "400 digits"),
    ("NUL byte", GOOD.replace("nodes: 2", "nodes: 2\0"), 4, "NUL byte"),
    ("2^80 nodes", GOOD.replace("nodes: 2", f"nodes: {2**80}"), 4, "nodes=32,768"),
    ("python object tag", GOOD.replace("gpt3-125m", "!!python/object/apply:os.system [ls]"), 1,
     "YAML tag '!!python/object/apply:os.system' is not supported"),
    ("custom tag", GOOD.replace("micro_batch: 4", "micro_batch: !big 4"), 6, "YAML tag '!big' is not supported"),
]


@pytest.mark.parametrize(("name", "text", "line", "fragment"), DOCUMENTS, ids=[d[0] for d in DOCUMENTS])
def test_hostile_yaml_documents_are_one_located_line(tmp_path, name, text, line, fragment):
    path = tmp_path / "hostile.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    message = one_clean_line(str(caught.value))
    assert f"{path}:{line}:" in message, message
    assert fragment in message, message


SET_VALUES = [
    ("alias bomb", "sim=" + "{" + _alias_bomb(10, 7).strip().replace("\n", ", ") + "}", "yaml_nodes"),
    ("nesting 5000 deep", "sim.x=" + "[" * 5000 + "]" * 5000, "yaml_depth"),
    (".inf", "training.micro_batch=.inf", "not a finite number"),
    ("integer of 50 digits", "cluster.nodes=" + "7" * 50, "50 digits"),
    ("NUL byte", "name=a\0b", "NUL byte"),
]


@pytest.mark.parametrize(("name", "override", "fragment"), SET_VALUES, ids=[s[0] for s in SET_VALUES])
def test_hostile_set_values_are_one_line_naming_the_option(tmp_path, name, override, fragment):
    path = tmp_path / "scenario.yaml"
    path.write_text(GOOD)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path, [override])
    message = one_clean_line(str(caught.value))
    assert message.startswith("--set " + override[:20]), message
    assert fragment in message, message
    assert len(message) < 400, message  # the value is shortened, not echoed whole


def _expanded_size(width: int, levels: int) -> int:
    """Values of ``_alias_bomb(width, levels)`` once expanded, counted as the guard counts them
    (every scalar, list and mapping, keys included): list a_i holds 1 + w + ... + w^(i+1)
    values (a_0 is itself and w scalars; a_i is itself and w copies of a_(i-1)), and the
    document is its mapping plus one key and one list per level."""
    return 1 + sum(1 + sum(width**k for k in range(i + 2)) for i in range(levels + 1))


def test_expanded_size_arithmetic():
    """width 10, levels 1: a_0 = 1 + 10 = 11, a_1 = 1 + 10 x 11 = 111; mapping 1 + (1 + 11) + (1 + 111) = 125."""
    assert _expanded_size(10, 1) == 125


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(width=st.integers(2, 12), levels=st.integers(1, 12))
def test_alias_expansion_is_accepted_exactly_up_to_the_limits(width, levels):
    """An alias document loads exactly when its expanded size is at most yaml_nodes (1e6) and it
    uses at most yaml_aliases (1000) aliases (width x levels); otherwise it is refused naming
    the limit it broke: never anything but a ScenarioError, never a long expansion."""
    try:
        parse_yaml_text(_alias_bomb(width, levels), file="bomb.yaml")
        loaded = True
    except ScenarioError as exc:
        message = one_clean_line(str(exc))
        assert "yaml_nodes" in message or "yaml_aliases" in message, message
        loaded = False
    assert loaded == (_expanded_size(width, levels) <= 1_000_000 and width * levels <= 1000)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["[", "{k: ", "- "]), min_size=1, max_size=400))
def test_any_nesting_loads_or_is_refused_for_depth_never_a_recursion_error(openers):
    """``a: `` followed by n nested flow collections around a scalar is n + 2 levels deep (the
    root mapping, the n collections, the innermost scalar; a key sits one level below its
    mapping like a value): it loads when n + 2 <= 64 and is otherwise refused naming
    yaml_depth, never a RecursionError."""
    text, closers = "", []
    for opener in openers:
        opener = "[" if opener == "- " else opener
        text += opener
        closers.append("]" if opener == "[" else "}")
    text += "1" + "".join(reversed(closers))
    try:
        parse_yaml_text("a: " + text, file="deep.yaml")
        assert len(openers) + 2 <= 64
    except ScenarioError as exc:
        assert "yaml_depth=64" in one_clean_line(str(exc))
        assert len(openers) + 2 > 64


# -- other config formats (dtsim import) ---------------------------------------------------------

CONFIGS = [
    ("deepspeed", "json nested 100000 deep", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("deepspeed", "json object nested 50000 deep", '{"a":' * 50_000 + "1" + "}" * 50_000, "nested too deeply"),
    ("deepspeed", "json NaN", '{"train_batch_size": NaN}', "NaN is not a finite number"),
    ("deepspeed", "json 1e999", '{"train_batch_size": 1e999}', "1e999 is not a finite number"),
    ("deepspeed", "json 5000-digit integer", '{"train_batch_size": ' + "9" * 5000 + "}", "digits"),
    ("torchtitan", "toml nested 100000 deep", "a = " + "[" * 100_000 + "]" * 100_000, "nested too deeply"),
]


@pytest.mark.parametrize(("importer", "name", "text", "fragment"), CONFIGS, ids=[c[1] for c in CONFIGS])
def test_hostile_import_configs_are_one_line(importer, name, text, fragment):
    if importer == "deepspeed":
        from simulator.importers.deepspeed import parse_json as parse
    else:
        from simulator.importers.torchtitan import parse_toml as parse
    with pytest.raises(ScenarioError) as caught:
        parse(text, "config")
    message = one_clean_line(str(caught.value))
    assert message.startswith("config: ") and fragment in message, message


def _hostile_cli_cases(tmp_path: Path) -> list[tuple[tuple[Any, ...], tuple[str, ...]]]:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(GOOD)
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb(10, 9))
    config = tmp_path / "ds_config.json"
    config.write_text("[" * 100_000 + "]" * 100_000)
    paths = {kind: make_path(kind, tmp_path) for kind in ("fifo", "dev_zero", "directory", "symlink_loop")}
    import_args = ("--node", "p4d.24xlarge", "--nodes", "1")
    return [
        (("run", paths["fifo"], "--quiet"), (str(paths["fifo"]), "is a FIFO")),
        (("import", "deepspeed", paths["dev_zero"], "--model", paths["dev_zero"], *import_args), ("is a device",)),
        (("run", paths["symlink_loop"], "--quiet"), (str(paths["symlink_loop"]), "symbolic link loop")),
        (("run", bomb, "--quiet"), (f"{bomb}:6", "yaml_nodes")),
        (("import", "deepspeed", config, "--model", config, *import_args), ("nested too deeply",)),
        # the same guards in-process from here on (the subprocesses above prove the real command line)
        (("run", paths["dev_zero"], "--quiet"), ("/dev/zero", "is a device")),
        (("run", paths["directory"], "--quiet"), (str(paths["directory"]), "is a directory")),
        (("sweep", paths["fifo"], "--out", tmp_path / "out"), (str(paths["fifo"]), "is a FIFO")),
        (("run", scenario, "--quiet", "--set", "sim.x=" + "[" * 5000 + "]" * 5000), ("--set sim.x=[[[", "yaml_depth")),
    ]


IN_SUBPROCESS = 5


def test_the_cli_refuses_hostile_inputs_without_blocking(tmp_path):
    """Through the real command line, in subprocesses with a timeout (a FIFO read blocking or a
    bomb expanding fails by TimeoutExpired): exit 2, one line on stderr naming the input."""
    cases = _hostile_cli_cases(tmp_path)[:IN_SUBPROCESS]
    for (_args, fragments), done in zip(cases, run_dtsim_many(*(args for args, _ in cases)), strict=True):
        assert_refused(done, *fragments)


def test_the_cli_refuses_hostile_inputs_in_process(cli, tmp_path):
    for args, fragments in _hostile_cli_cases(tmp_path)[IN_SUBPROCESS:]:
        result = cli(*args)
        assert result.exit_code == 2, (args, result.output)
        line = one_clean_line(result.output)
        assert all(fragment in line for fragment in fragments), (fragments, line)


def test_good_files_still_load(tmp_path):
    """The guards refuse only what they name: anchors, aliases and merge keys of ordinary size load."""
    path = tmp_path / "anchors.yaml"
    path.write_text(textwrap.dedent("""\
        name: &c quick
        model: gpt3-125m
        cluster: &c
          node: p4d.24xlarge
          nodes: &n 2
        training:
          micro_batch: 4
          global_batch: 128
        sim: {}
        """))
    scenario = load_scenario(path)  # a reused anchor (&c twice) is legal YAML: no warning, no error
    assert scenario.world_size == 16  # 2 nodes x 8 GPUs
