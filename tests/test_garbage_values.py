"""Garbage is refused at the edge, never turned into a figure (issue 13, class 3): booleans
where counts are expected, non-finite or absurd rates and times, broken calibration profiles,
a profile of another device, ``nan`` in ``dtsim search``, bad byte counts in the Python API.
Every refusal is a :class:`ScenarioError` naming the field (and file and line when there is
one); nothing else escapes. Inputs are generated here; hypothesis draws the mappings."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import simulator
from simulator.errors import ScenarioError
from simulator.scenario import scenario_from_mapping
from simulator.scenario.calibration import load_profile_spec

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"
BUILTIN_A100 = ROOT / "topologies" / "calibration" / "builtin" / "a100-40gb.yaml"

# --set KEY=VALUE -> the error names KEY; each would have been accepted before (true as 1, a
# bare 400 as 400 B/s, 1e-300 B/s giving a 1e300 s step, .inf oversubscription)
SET_CASES = [
    ("cluster.nodes=true", "valid integer (got true)"),
    ("parallelism.tp=true", "valid integer (got true)"),
    ("parallelism.pp=false", "valid integer (got false)"),
    ("training.micro_batch=true", "valid integer (got true)"),
    ("training.global_batch=true", "valid integer (got true)"),
    ("model.layers=true", "valid integer (got true)"),
    ("model.seq_len=.nan", "finite"),
    ("sim.seed=true", "valid integer (got true)"),
    ("cluster.fabric.switch_radix=true", "valid integer (got true)"),
    ("cluster.fabric.oversubscription=.inf", "finite"),
    ("cluster.fabric.oversubscription=.nan", "finite"),
    ("cluster.fabric.nic_bandwidth=400", "400 has no unit; write e.g. '400 Gb/s'"),
    ("cluster.fabric.nic_bandwidth=1e-300", "has no unit"),
    ("cluster.fabric.nic_bandwidth=1e-300Bps", "between 1 kB/s and 1 EB/s"),
    ("cluster.fabric.nic_bandwidth=1e30TBps", "between 1 kB/s and 1 EB/s"),
    ("cluster.fabric.nic_bandwidth=.nan", "finite"),
    ("cluster.fabric.latency=2h", "between 0 and 1 hour"),
    ("cluster.fabric.latency=-1us", ""),
    ("parallelism.ddp.bucket_size=1e30", "has no unit"),
    ("parallelism.ddp.bucket_size=1e30B", "1 EiB"),
    ("cluster.fabric.efficiency=1e-300", "greater than or equal to 0.000001"),  # was a 1.02e+299 s step
    ("cluster.fabric.efficiency=0", "greater than or equal to 0.000001"),
]


@pytest.mark.parametrize(("override", "fragment"), SET_CASES, ids=[c[0] for c in SET_CASES])
def test_set_garbage_is_refused_naming_the_field(override: str, fragment: str) -> None:
    with pytest.raises(ScenarioError) as info:
        simulator.load_scenario(QUICKSTART, overrides=[override])
    message = str(info.value)
    assert message.startswith(f"--set {override}: ") and fragment in message, message


def test_a_rate_in_range_still_loads() -> None:
    """The bounds leave every real value alone: 100 Gb/s = 12.5e9 B/s, 1 us."""
    sc = simulator.load_scenario(QUICKSTART, overrides=["cluster.fabric.nic_bandwidth=100Gbps",
                                                        "cluster.fabric.latency=1us"])
    assert sc.cluster.fabric.nic_bandwidth_bytes_per_s == 12.5e9 and sc.cluster.fabric.latency_s == 1e-6


def test_a_boolean_in_a_file_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("model: gpt3-125m\ncluster:\n  node: p4d.24xlarge\n  nodes: true\n"
                    "training: {micro_batch: 1, global_batch: 8}\n")
    with pytest.raises(ScenarioError) as info:
        simulator.load_scenario(path)
    assert str(info.value).startswith(f"{path}:4: cluster.nodes: input should be a valid integer (got true)")


# ----------------------------------------------------------------------------------------
# property: any value at any field either validates or raises ScenarioError, nothing else

FIELDS = [("cluster", "nodes"), ("cluster", "gpus_per_node"), ("parallelism", "tp"), ("parallelism", "pp"),
          ("parallelism", "dp"), ("parallelism", "cp"), ("parallelism", "virtual_stages"),
          ("parallelism", "sharding"), ("training", "micro_batch"), ("training", "global_batch"),
          ("training", "precision"), ("training", "recompute"), ("model", "layers"), ("model", "hidden"),
          ("model", "seq_len"), ("model", "heads"), ("sim", "seed"), ("sim", "network"), ("name", None),
          ("framework", None)]
VALUES = st.one_of(
    st.booleans(), st.none(), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["nan", "inf", "-1", "1e999", "", "[/x]", "\x1b[31m"]),
    st.text(max_size=8), st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _small() -> dict[str, Any]:
    return {"model": {"preset": "gpt3-125m"}, "cluster": {"node": "p4d.24xlarge", "nodes": 1},
            "training": {"micro_batch": 1, "global_batch": 8}, "parallelism": {}, "sim": {}}


@settings(max_examples=120, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(FIELDS), value=VALUES)
def test_any_value_validates_or_is_a_scenario_error(field: tuple[str, str | None], value: Any) -> None:
    data = _small()
    section, key = field
    if key is None:
        data[section] = value
    else:
        data[section][key] = value
    try:
        sc = scenario_from_mapping(data)
    except ScenarioError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    # accepted: every number it holds is finite and a count is a real int
    assert isinstance(sc.cluster.nodes, int) and not isinstance(sc.cluster.nodes, bool)
    assert math.isfinite(sc.training.global_batch) and sc.world_size >= 1


# ----------------------------------------------------------------------------------------
# calibration profiles

CURVE = "{log10_flops: [9, 12], efficiency: [0.3, 0.8]}"
PROFILE_CASES = {
    "nan point": ("gemm: {bf16: {log10_flops: [9, .nan], efficiency: [0.3, 0.8]}}", "gemm.bf16.log10_flops[1]", "finite"),
    "unequal curves": ("gemm: {bf16: {log10_flops: [9, 10, 12], efficiency: [0.3, 0.8]}}", "gemm.bf16",
                       "has 3 points but efficiency has 2"),
    "decreasing sizes": ("gemm: {bf16: {log10_flops: [12, 9], efficiency: [0.3, 0.8]}}", "gemm.bf16", "increase"),
    "nan efficiency": ("gemm: {bf16: {log10_flops: [9, 12], efficiency: [.nan, 0.8]}}", "gemm.bf16.efficiency[0]", ""),
    "unknown precision": (f"gemm: {{bf17: {CURVE}}}", "gemm", "unknown precision 'bf17'"),
    "unknown collective": (f"gemm: {{bf16: {CURVE}}}\ncomm: {{all_to_al: {{alpha: 1us, beta: 0, ranks: 2, "
                           "backend: nccl}}", "comm", "unknown collective 'all_to_al'"),
    "boolean peak": (f"gemm: {{bf16: {CURVE}}}\npeak_flops: {{bf16: true}}", "peak_flops.bf16", "boolean"),
    "tiny bandwidth": (f"gemm: {{bf16: {CURVE}}}\nmemory_bandwidth: 1e-9", "memory_bandwidth", "1 kB/s"),
}


@pytest.mark.parametrize("case", PROFILE_CASES, ids=list(PROFILE_CASES))
def test_broken_profiles_are_refused_with_file_line_and_field(tmp_path: Path, case: str) -> None:
    body, field, fragment = PROFILE_CASES[case]
    if "gemm:" not in body.split("\n")[0]:
        body = f"gemm: {{bf16: {CURVE}}}\n{body}"
    path = tmp_path / "p.yaml"
    path.write_text(f"kind: dtsim-compute-profile\ngpu: a100-40gb\n{body}\nattention_fwd: {{bf16: {CURVE}}}\n"
                    f"attention_bwd: {{bf16: {CURVE}}}\n")
    with pytest.raises(ScenarioError) as info:
        load_profile_spec(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:") and f": {field}: " in message and fragment in message, message


def test_a_profile_of_another_device_is_refused_unless_asked(tmp_path: Path) -> None:
    """The built-in A100-40GB tables on DGX H100 nodes: refused, naming both devices and both
    ways out; accepted with cluster.gpu: a100-40gb or calibration_other_device: true."""
    profile = tmp_path / "a100.yaml"
    profile.write_text(BUILTIN_A100.read_text())
    over = [f"cluster.calibration={profile}", "cluster.node=dgx-h100"]
    with pytest.raises(ScenarioError) as info:
        simulator.load_scenario(QUICKSTART, overrides=over)
    message = str(info.value)
    assert "measured on a100-40gb, not on the cluster's GPU h100-sxm" in message
    assert "cluster.gpu: a100-40gb" in message and "cluster.calibration_other_device: true" in message
    assert simulator.load_scenario(QUICKSTART, overrides=[*over, "cluster.gpu=a100-40gb"]).cluster.gpu_name == "a100-40gb"
    forced = simulator.load_scenario(QUICKSTART, overrides=[*over, "cluster.calibration_other_device=true"])
    assert forced.cluster.calibration == str(profile)
    same = simulator.load_scenario(QUICKSTART, overrides=[f"cluster.calibration={profile}"])  # p4d: A100-40GB
    assert same.cluster.gpu_name == "a100-40gb"


# ----------------------------------------------------------------------------------------
# the Python API and dtsim search

@pytest.mark.parametrize("nbytes", [-1, -1e-9, math.nan, math.inf, -math.inf, "8", True, None],
                         ids=["-1", "tiny negative", "nan", "inf", "-inf", "string", "bool", "none"])
def test_simulate_collective_refuses_bad_byte_counts(nbytes: Any) -> None:
    cluster = {"node": "dgx-a100", "nodes": 1}
    for call in (simulator.simulate_collective, simulator.run.collective_choice):
        with pytest.raises(ValueError, match="nbytes") as info:
            call(cluster, "all_reduce", nbytes)
        assert isinstance(info.value, ScenarioError)
    assert simulator.simulate_collective(cluster, "all_reduce", 0) >= 0


@pytest.mark.parametrize("token", ["nan", "NaN", "inf", "-inf", "1e999", "nanT", "0", "-5"])
def test_search_counts_refuse_non_finite_and_non_positive(token: str) -> None:
    from simulator.cli.search import _parse_count, _parse_node_count

    with pytest.raises(ScenarioError, match=r"finite|positive"):
        _parse_count(token, "--tokens")
    with pytest.raises(ScenarioError):
        _parse_node_count(token)
    assert _parse_count("1.4T", "--tokens") == 1.4e12 and _parse_node_count("16") == 16
    with pytest.raises(ScenarioError, match="whole number"):
        _parse_node_count("2.5")


@pytest.mark.parametrize("args", [
    ("run", str(QUICKSTART), "-q", "--set", "cluster.nodes=true"),
    ("run", str(QUICKSTART), "-q", "--set", "cluster.fabric.nic_bandwidth=400"),
    ("search", str(QUICKSTART), "--tokens", "nan"),
    ("search", str(QUICKSTART), "--nodes", "nan"),
    ("collective", "--node", "dgx-a100", "--sizes", "8B:nan"),
    ("collective", "--node", "dgx-a100", "--sizes", "-8B"),
], ids=["bool nodes", "bare bandwidth", "nan tokens", "nan nodes", "nan size", "negative size"])
def test_cli_garbage_is_one_line_exit_2(args: tuple[str, ...]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DTSIM_DEBUG"}
    env.update({"PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    done = subprocess.run([sys.executable, "-m", "simulator.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: ")


NODE = (ROOT / "topologies" / "nodes" / "p4d.24xlarge.yaml").read_text()
NODE_CASES = [
    ("gpus: 8", "gpus: true", "gpus", "valid integer (got true)"),
    ("bandwidth: 100Gbps", "bandwidth: 400", "nics.bandwidth", "400 has no unit"),
    ("bandwidth: 100Gbps", "bandwidth: 400Bps", "nics.bandwidth", "between 1 kB/s and 1 EB/s"),
    ("bandwidth: 100Gbps", "bandwidth: .nan", "nics.bandwidth", "finite"),
    ("count: 4", "count: false", "nics.count", "valid integer (got false)"),
    ("generation: 4", "generation: 4.5", "pcie.generation", "integer"),
]


@pytest.mark.parametrize(("old", "new", "field", "fragment"), NODE_CASES, ids=[c[1] for c in NODE_CASES])
def test_a_node_file_with_garbage_names_file_line_and_field(tmp_path: Path, old: str, new: str, field: str,
                                                            fragment: str) -> None:
    """A user's node file (cluster.node: PATH) goes through the same edge as the scenario."""
    assert old in NODE
    node = tmp_path / "node.yaml"
    node.write_text(NODE.replace(old, new, 1))
    line = 1 + NODE.split(old, 1)[0].count("\n")
    with pytest.raises(ScenarioError) as info:
        simulator.load_scenario(QUICKSTART, overrides=[f"cluster.node={node}"])
    message = str(info.value)
    assert message.startswith(f"{node}:{line}: {field}: ") and fragment in message, message
