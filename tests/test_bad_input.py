"""Every malformed scenario: exit code 2, one line naming file, line and field, no traceback."""

import textwrap

import pytest

GOOD = """\
model: gpt3-125m
cluster:
  node: p4d.24xlarge
  nodes: 2
parallelism:
  tp: 1
training:
  micro_batch: 4
  global_batch: 128
"""


def _run(cli, tmp_path, text, *extra):
    path = tmp_path / "scenario.yaml"
    path.write_text(textwrap.dedent(text))
    return cli("run", path, "--quiet", *extra), str(path)


CASES = [
    # (name, replace-from, replace-to, expected line, expected fragments)
    ("unknown key", "  tp: 1\n", "  tp: 1\n  tpp: 2\n", 7, ["parallelism.tpp", "unknown field 'tpp'", "did you mean"]),
    ("wrong type", "micro_batch: 4", "micro_batch: four", 8, ["training.micro_batch", "integer"]),
    ("zero size", "micro_batch: 4", "micro_batch: 0", 8, ["training.micro_batch", "greater than 0"]),
    ("negative size", "nodes: 2", "nodes: -2", 4, ["cluster.nodes", "greater than 0"]),
    ("unknown node", "p4d.24xlarge", "p9x.mega", 3, ["cluster.node", "unknown node type 'p9x.mega'"]),
    ("unknown preset", "gpt3-125m", "gpt7-1t", 1, ["model", "unknown model preset 'gpt7-1t'"]),
    ("bad unit", "  nodes: 2\n", "  nodes: 2\n  fabric:\n    nic_bandwidth: 400Gbs\n", 6,
     ["cluster.fabric.nic_bandwidth", "'400Gbs'"]),
    ("tp does not divide heads", "  tp: 1\n", "  tp: 8\n", 6, ["parallelism.tp", "tp=8 does not divide model.heads=12"]),
    ("tp does not tile the cluster", "  tp: 1\n", "  tp: 5\n", 5, ["parallelism", "does not divide the world size 16"]),
    ("world size", "  tp: 1\n", "  tp: 1\n  dp: 3\n", 7, ["parallelism.dp", "!= world size 16"]),
    ("bad literal", "micro_batch: 4", "micro_batch: 4\n  precision: fp64", 9, ["training.precision", "fp64"]),
]


@pytest.mark.parametrize(("name", "old", "new", "line", "fragments"), CASES, ids=[c[0] for c in CASES])
def test_bad_scenarios(cli, tmp_path, name, old, new, line, fragments):
    assert old in GOOD
    result, path = _run(cli, tmp_path, GOOD.replace(old, new, 1))
    out = result.output
    assert result.exit_code == 2, out
    assert "Traceback" not in out
    assert f"{path}:{line}" in out, out
    for fragment in fragments:
        assert fragment in out, (fragment, out)


def test_broken_yaml(cli, tmp_path):
    result, path = _run(cli, tmp_path, GOOD.replace("  nodes: 2\n", "  nodes: [2\n"))
    assert result.exit_code == 2 and "YAML syntax error" in result.output and path in result.output
    assert "Traceback" not in result.output


def test_missing_file(cli, tmp_path):
    result = cli("run", tmp_path / "nope.yaml")
    assert result.exit_code == 2 and "no such file" in result.output and "nope.yaml" in result.output


def test_missing_required_field(cli, tmp_path):
    result, _path = _run(cli, tmp_path, GOOD.replace("  global_batch: 128\n", ""))
    assert result.exit_code == 2 and "training.global_batch" in result.output and "required" in result.output


def test_bad_override(cli, root):
    result = cli("run", root / "scenarios/quickstart.yaml", "--quiet", "--set", "parallelism.tp=3")
    assert result.exit_code == 2 and "--set parallelism.tp=3" in result.output


def test_error_in_a_preset_file_names_that_file(cli, tmp_path, monkeypatch):
    models = tmp_path / "scenarios" / "models"
    models.mkdir(parents=True)
    (tmp_path / "topologies").symlink_to(__import__("simulator.datadirs").datadirs.topologies_dir())
    (models / "broken.yaml").write_text("name: broken\nlayers: -3\nhidden: 64\nheads: 4\nseq_len: 16\nvocab: 100\n")
    monkeypatch.setenv("DTSIM_DATA_DIR", str(tmp_path))
    from simulator import datadirs
    from simulator.catalog import forget_default_catalog

    datadirs.data_root.cache_clear()
    forget_default_catalog()
    try:
        result, _ = _run(cli, tmp_path, GOOD.replace("gpt3-125m", "broken"))
        assert result.exit_code == 2
        assert "broken.yaml:2" in result.output and "layers" in result.output
    finally:
        monkeypatch.delenv("DTSIM_DATA_DIR")
        datadirs.data_root.cache_clear()
        forget_default_catalog()


def test_oom_is_a_verdict_not_an_error(cli, tmp_path):
    """GPT-3 13B with plain DDP needs 16 bytes x 13e9 = 208 GB of model states per GPU."""
    text = GOOD.replace("gpt3-125m", "gpt3-13b").replace("micro_batch: 4", "micro_batch: 1")
    result, _ = _run(cli, tmp_path, text)
    assert result.exit_code == 0
    path = tmp_path / "scenario.yaml"
    full = cli("run", path)
    assert full.exit_code == 0 and "OUT OF MEMORY" in full.output and "optimizer" in full.output
