"""`dtsim schema --kind ...` (issue 14 item 9): a JSON Schema an editor can use for every file format.

Every file under scenarios/ (and every node file under topologies/nodes/) validates with
`jsonschema` against the schema of its kind; node types, GPUs and presets are enums of the
catalog; quantities name their unit and accept exactly the unit strings the parser reads.
"""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from simulator import units
from simulator.catalog import Catalog, default_catalog
from simulator.cli.schema import SCHEMA_KINDS, json_schema_of
from simulator.scenario.schema import cluster_json_schema, node_json_schema, scenario_json_schema
from simulator.yamlio import load_yaml, to_plain

ROOT = Path(__file__).resolve().parents[1]


def _kind_of(path: Path) -> str:
    rel = path.relative_to(ROOT)
    if rel.parts[:2] == ("scenarios", "models"):
        return "model"
    if rel.parts[:2] == ("scenarios", "sweeps") and len(rel.parts) == 3:
        return "sweep"
    if rel.parts[:2] == ("topologies", "nodes"):
        return "node"
    return "scenario"


def _validator(kind: str) -> jsonschema.Draft202012Validator:
    schema = json_schema_of(kind)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _errors(validator: jsonschema.Draft202012Validator, data) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message[:160]}" for e in validator.iter_errors(data)]


def test_every_shipped_file_validates_against_the_schema_of_its_kind():
    """Scenarios (two of them start from a preset and override seq_len), presets, sweeps (series
    as one field, zip as a list of groups) and node files: 6 + 25 + 3 + 1 + 15 files today."""
    files = sorted([*(ROOT / "scenarios").rglob("*.yaml"), *(ROOT / "topologies" / "nodes").glob("*.yaml")])
    validators = {kind: _validator(kind) for kind in SCHEMA_KINDS}
    kinds: dict[str, int] = {}
    failures = {}
    for path in files:
        kind = _kind_of(path)
        kinds[kind] = kinds.get(kind, 0) + 1
        errors = _errors(validators[kind], to_plain(load_yaml(path)))
        if errors:
            failures[str(path.relative_to(ROOT))] = errors
    assert not failures, failures
    assert kinds["model"] == len(default_catalog().preset_names()) and kinds["node"] == len(
        default_catalog().node_type_names())
    assert kinds["scenario"] >= 6 and kinds["sweep"] >= 3


def test_preset_overrides_and_file_paths_are_accepted_typos_and_unknown_units_are_not():
    validator = _validator("scenario")
    base = {"cluster": {"node": "p4d.24xlarge", "nodes": 2}, "training": {"global_batch": 64}}
    accepted = [
        {"model": "gpt3-175b"},
        {"model": {"preset": "llama3-8b", "seq_len": 4096}},
        {"model": {"layers": 2, "hidden": 64, "heads": 4, "seq_len": 128, "vocab": 1000}},
        {"model": "gpt3-125m", "cluster": {"node": "../my-nodes/lab.yaml", "nodes": 2, "gpu": "h100-sxm"}},
        {"model": "gpt3-125m", "cluster": {"node": "p4d.24xlarge", "nodes": 2,
                                           "fabric": {"nic_bandwidth": "400 Gb/s", "latency": "2us"}}},
    ]
    rejected = {
        "model.preset": {"model": {"preset": "llama3-8", "seq_len": 4096}},  # no such preset
        "model (fields missing)": {"model": {"seq_len": 4096}},
        "cluster.node": {"model": "gpt3-125m", "cluster": {"node": "p4d.24xl", "nodes": 2}},
        "cluster.gpu": {"model": "gpt3-125m", "cluster": {"node": "p4d.24xlarge", "nodes": 2, "gpu": "h100"}},
        "nic_bandwidth unit": {"model": "gpt3-125m", "cluster": {"node": "p4d.24xlarge", "nodes": 2,
                                                                "fabric": {"nic_bandwidth": "400 Gbit"}}},
    }
    for data in accepted:
        assert not _errors(validator, {**base, **data}), data
    for what, data in rejected.items():
        assert _errors(validator, {**base, **data}), what


@pytest.mark.parametrize("dimension, accepted, refused", [
    ("size", ["80GiB", "80 GiB", "512MiB", "1.5TB", "8Gb", "80Gib", "1e3 kB", "4096", " 2 B "],
     ["80gib", "1KB", "80 GiBs", "80G", "GiB", "80 Gi B"]),
    ("rate", ["400Gbps", "400 Gb/s", "25GB/s", "100 Gib/s", "5e10", "3.2 TB/s"],
     ["400Gbit", "400 gbps", "25 GBs", "400 Gb", "400G"]),
    ("time", ["2us", "2 µs", "1.5ms", "30s", "3min", "2 h", "5ns", "1e-6"],
     ["2usec", "2 sec", "1.5 MS", "2Kis", "3 mins"]),
    ("flop rate", ["312TFLOPS", "989 TFLOP/s", "1.2PFLOPS", "7e14"], ["312 TFlops", "312T", "1 TFLOP"]),
])
def test_unit_patterns_accept_exactly_what_the_parser_reads(dimension, accepted, refused):
    """JSON Schema's pattern is searched (re.search, as jsonschema does); each string is
    checked both ways: the pattern matches it iff the parser reads it."""
    parse = {"size": units.parse_bytes, "rate": units.parse_rate, "time": units.parse_time,
             "flop rate": units.parse_flop_rate}[dimension]
    pattern = re.compile(units.quantity_pattern(dimension))

    def parses(text: str) -> bool:
        try:
            parse(text)
        except units.UnitError:
            return False
        return True

    for text in accepted:
        assert pattern.search(text) and parses(text), text
    for text in refused:
        assert not pattern.search(text) and not parses(text), text


def test_quantities_and_counts_name_their_unit():
    """400 Gb/s = 400e9 / 8 = 50e9 B/s is the example the bandwidth's description gives. A file
    writes quantities with their unit: a positive rate has no unitless form in the schema, a
    size that may be 0 accepts exactly the number 0 (as the loader does: UNITS_REQUIRED)."""
    defs = scenario_json_schema()["$defs"]
    nic = defs["FatTreeFabric"]["properties"]["nic_bandwidth"]
    assert "ONE NIC" in nic["description"] and "bytes per second (B/s)" in nic["description"]
    assert "'400 Gb/s' (= 50e9 B/s)" in nic["description"] and "a bare number is refused" in nic["description"]
    string, null = nic["anyOf"]
    assert string["pattern"] == units.quantity_pattern("rate") and null == {"type": "null"}
    assert "seconds (s)" in defs["HostSpec"]["properties"]["op_issue"]["description"]
    bucket = defs["DdpOptions"]["properties"]["bucket_size"]
    assert "bytes (B)" in bucket["description"] and bucket["anyOf"][0]["const"] == 0
    validator = jsonschema.Draft202012Validator(bucket)
    assert validator.is_valid(0) and validator.is_valid("25 MiB") and not validator.is_valid(26214400)
    assert "not bytes" in defs["ZeroOptions"]["properties"]["reduce_bucket_size"]["description"]
    node = node_json_schema()
    assert "bytes (B)" in node["properties"]["host_memory"]["description"]
    assert "bytes per second (B/s)" in node["$defs"]["NicSpec"]["properties"]["bandwidth"]["description"]


@pytest.mark.parametrize("kind", list(SCHEMA_KINDS))
def test_every_property_has_a_description(kind):
    schema = json_schema_of(kind)
    missing = [f"{name}.{key}" for name, section in [("(root)", schema), *schema.get("$defs", {}).items()]
               for key, prop in section.get("properties", {}).items() if not prop.get("description")]
    assert not missing


def test_enums_follow_the_catalog_given(tmp_path: Path):
    """A catalog with one extra node type, GPU list and preset: the schema lists exactly its names."""
    shutil.copytree(ROOT / "topologies" / "nodes", tmp_path / "topologies" / "nodes")
    shutil.copy(ROOT / "topologies" / "gpus.yaml", tmp_path / "topologies" / "gpus.yaml")
    shutil.copy(ROOT / "topologies" / "nodes" / "dgx-a100.yaml", tmp_path / "topologies" / "nodes" / "lab-a100.yaml")
    (tmp_path / "scenarios" / "models").mkdir(parents=True)
    shutil.copy(ROOT / "scenarios" / "models" / "gpt3-125m.yaml", tmp_path / "scenarios" / "models" / "tiny.yaml")
    catalog = Catalog.load(tmp_path)
    schema = scenario_json_schema(catalog)
    node = schema["$defs"]["ClusterSpec"]["properties"]["node"]["anyOf"]
    assert node[0]["enum"] == catalog.node_type_names() and "lab-a100" in node[0]["enum"]
    assert re.search(node[1]["pattern"], "nodes/lab.yaml") and not re.search(node[1]["pattern"], "lab-a100")
    assert schema["properties"]["model"]["anyOf"][0]["enum"] == ["tiny"]
    gpus = schema["$defs"]["ClusterSpec"]["properties"]["gpu"]["anyOf"][0]["enum"]
    assert gpus == sorted(catalog.gpus) and "a100-40gb" in gpus
    cluster = cluster_json_schema(catalog)
    assert "topology" not in cluster["properties"]  # a cluster file cannot name another one
    assert not _errors(jsonschema.Draft202012Validator(cluster),
                       {"node": "lab-a100", "nodes": 2, "fabric": {"kind": "rail-optimized"}})


def test_dtsim_schema_command_prints_each_kind_and_refuses_an_unknown_one(tmp_path: Path):
    out = tmp_path / "sweep.json"
    run = subprocess.run([sys.executable, "-m", "simulator.cli", "schema", "--kind", "sweep", "--out", str(out)],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert json.loads(out.read_text()) == json_schema_of("sweep")
    bad = subprocess.run([sys.executable, "-m", "simulator.cli", "schema", "--kind", "preset"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "error: --kind 'preset': expected one of scenario, model, sweep, node, cluster"]
