"""Framework profiles (issue 12 item 1): each loads and cites its values, precedence
(scenario and --set > profile > dtsim defaults), ``generic`` changes nothing, and
``dtsim run`` lists the settings with their source."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import simulator
from simulator.catalog import default_catalog
from simulator.scenario import scenario_json_schema
from simulator.scenario.framework import FRAMEWORKS, GENERIC
from simulator.yamlio import load_yaml, to_plain

ROOT = Path(__file__).resolve().parents[1]
GPT3 = ROOT / "scenarios" / "gpt3-175b-3d-dgx-a100.yaml"
PROFILES = [name for name in FRAMEWORKS if name != GENERIC]

SMALL = {
    "model": {"layers": 4, "hidden": 1024, "heads": 16, "seq_len": 2048, "vocab": 32000},
    "cluster": {"node": "dgx-a100", "nodes": 2},
    "training": {"micro_batch": 1, "global_batch": 64},
}


@pytest.mark.parametrize("name", PROFILES)
def test_each_profile_loads_and_validates(name):
    profile = default_catalog().framework(name)
    assert profile.name == name and profile.settings
    scenario = simulator.Scenario.model_validate({**SMALL, "framework": name})
    assert scenario.framework == name
    assert set(scenario.settings_source) == set(profile.settings)


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_value_cites_its_source(name):
    """Read the raw file: every setting has a value and a non-empty source naming a file or URL."""
    data = to_plain(load_yaml(ROOT / "topologies" / "frameworks" / f"{name}.yaml"))
    assert data["name"] == name
    for path, setting in data["settings"].items():
        assert "value" in setting, path
        source = setting.get("source") or ""
        assert "@" in source or source.startswith("https://"), (path, source)  # repo@commit or a doc URL
    for item in data.get("not_modelled", []):
        assert item["what"] and item["source"]


def test_profile_value_then_yaml_then_set_win(tmp_path):
    """ddp.overlap: dtsim default true; megatron-core's profile false; the file true; --set false."""
    base = "model: {layers: 4, hidden: 1024, heads: 16, seq_len: 2048, vocab: 32000}\n" \
           "cluster: {node: dgx-a100, nodes: 2}\ntraining: {micro_batch: 1, global_batch: 64}\n"
    generic = tmp_path / "generic.yaml"
    generic.write_text(base)
    profiled = tmp_path / "profiled.yaml"
    profiled.write_text("framework: megatron-core\n" + base)
    explicit = tmp_path / "explicit.yaml"
    explicit.write_text("framework: megatron-core\n" + base + "parallelism: {ddp: {overlap: true, bucket_size: 25MiB}}\n")

    assert simulator.load_scenario(generic).parallelism.ddp.overlap is True
    sc = simulator.load_scenario(profiled)
    assert sc.parallelism.ddp.overlap is False and sc.source_of("parallelism.ddp.overlap") == "megatron-core"
    # 40,000,000 fp32 gradient elements = 160,000,000 bytes
    assert sc.parallelism.ddp.bucket_size_bytes == 40_000_000 * 4
    sc = simulator.load_scenario(explicit)
    assert sc.parallelism.ddp.overlap is True and sc.source_of("parallelism.ddp.overlap") == "scenario"
    assert sc.parallelism.ddp.bucket_size_bytes == 25 * 2**20
    assert sc.parallelism.ddp.gradient_as_bucket_view is True  # the rest of the block still from the profile
    sc = simulator.load_scenario(explicit, overrides=["parallelism.ddp.overlap=false"])
    assert sc.parallelism.ddp.overlap is False and sc.source_of("parallelism.ddp.overlap") == "scenario"
    sc = simulator.load_scenario(generic, overrides=["framework=megatron-core", "training.grad_reduce_dtype=bf16"])
    assert sc.training.grad_reduce_dtype == "bf16" and sc.source_of("training.grad_reduce_dtype") == "scenario"
    assert sc.source_of("parallelism.tp") == "default" and sc.source_of("training.micro_batch") == "scenario"


def test_api_and_file_agree_and_blocks_follow_sharding():
    """model_validate applies the profile like the loader; a profile's option block applies only
    to the shardings that read it (nemo's zero block, not its ddp block, under its zero1)."""
    sc = simulator.Scenario.model_validate({**SMALL, "framework": "nemo"})
    assert sc.parallelism.sharding == "zero1" and sc.parallelism.zero.overlap_comm is True
    assert sc.parallelism.zero.reduce_bucket_size == 40_000_000
    assert sc.source_of("parallelism.ddp.overlap") == "default" and sc.parallelism.ddp == type(sc.parallelism.ddp)()
    ddp = simulator.Scenario.model_validate({**SMALL, "framework": "nemo", "parallelism": {"sharding": "none"}})
    assert ddp.parallelism.ddp.gradient_as_bucket_view is True and ddp.parallelism.zero.overlap_comm is None
    assert ddp.content_hash() != sc.content_hash()


def test_content_hash_follows_the_framework():
    generic = simulator.Scenario.model_validate(SMALL)
    explicit_generic = simulator.Scenario.model_validate({**SMALL, "framework": "generic"})
    fsdp = simulator.Scenario.model_validate({**SMALL, "framework": "pytorch-fsdp", "parallelism": {"sharding": "none"}})
    assert generic == explicit_generic and generic.content_hash() == explicit_generic.content_hash()
    # pytorch-fsdp's only difference here is the framework name itself (DDP defaults are PyTorch's)
    assert fsdp.parallelism == generic.parallelism and fsdp.content_hash() != generic.content_hash()
    assert "settings_source" not in generic.model_dump() and "settings_source" not in json.dumps(scenario_json_schema())


def test_generic_changes_nothing():
    generic = simulator.load_scenario(GPT3)
    assert generic.framework == GENERIC and generic.settings_source == {} and generic.framework_settings() == []
    assert simulator.load_scenario(GPT3, overrides=["framework=generic"]) == generic


def test_megatron_core_on_gpt3_changes_exactly_the_profile_fields():
    generic = simulator.load_scenario(GPT3)
    mcore = simulator.load_scenario(GPT3, overrides=["framework=megatron-core"])
    changed = {f"parallelism.zero.{k}" for k, v in mcore.parallelism.zero if getattr(generic.parallelism.zero, k) != v}
    changed |= {f"training.{k}" for k, v in mcore.training if getattr(generic.training, k) != v}
    assert mcore.parallelism.model_copy(update={"zero": generic.parallelism.zero, "p2p_blocking": False,
                                                "rank_order": "tp-cp-pp-dp"}) == generic.parallelism
    assert changed == {"parallelism.zero.overlap_comm", "parallelism.zero.reduce_bucket_size",
                       "parallelism.zero.allgather_bucket_size", "parallelism.zero.bucketing",
                       "parallelism.zero.bucket_size_per_dp_rank", "parallelism.zero.grad_nan_check",
                       "parallelism.zero.grad_prescale", "training.grad_reduce_dtype",
                       "training.attention_kernel", "training.cross_entropy", "training.embedding_grad"}
    rows = {path: (value, source) for path, value, source in mcore.framework_settings()}
    assert rows == {
        "parallelism.zero.gradient_reduction": ("reduce_scatter", "scenario"),  # the file states it
        "parallelism.zero.overlap_comm": (False, "megatron-core"),
        "parallelism.zero.reduce_bucket_size": (40_000_000, "megatron-core"),
        "parallelism.zero.allgather_bucket_size": (40_000_000, "megatron-core"),
        "parallelism.zero.bucketing": ("megatron-core", "megatron-core"),
        "parallelism.zero.bucket_size_per_dp_rank": (1_000_000, "megatron-core"),
        "parallelism.zero.grad_nan_check": (True, "megatron-core"),
        "parallelism.zero.grad_prescale": (True, "megatron-core"),
        "parallelism.p2p_blocking": (True, "megatron-core"),
        "parallelism.rank_order": ("tp-cp-dp-pp", "megatron-core"),
        "training.grad_reduce_dtype": ("fp32-for-bf16", "megatron-core"),
        "training.attention_kernel": ("cudnn", "megatron-core"),
        "training.cross_entropy": ("megatron", "megatron-core"),
        "training.embedding_grad": ("main-grad", "megatron-core"),
    }
    # the ddp block is not read by zero1: left at dtsim's defaults, and said so
    assert mcore.source_of("parallelism.ddp.overlap") == "default" and mcore.parallelism.ddp.overlap is True


def test_unknown_framework_names_the_values():
    with pytest.raises(simulator.ScenarioError, match="megatron-core"):
        simulator.load_scenario(GPT3, overrides=["framework=megatron"])


def test_cli_summary_lists_the_framework_settings():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "simulator.cli", "run", str(GPT3), "--set", "framework=megatron-core",
                          "--set", "parallelism.zero.reduce_bucket_size=50000000"],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "megatron-core: 14 setting(s) differ from generic" in out.stdout
    assert "parallelism.zero.overlap_comm = false (megatron-core)" in out.stdout
    assert "parallelism.zero.reduce_bucket_size = 50,000,000 elements (scenario)" in out.stdout
    assert "training.grad_reduce_dtype = fp32-for-bf16 (megatron-core)" in out.stdout


@pytest.mark.parametrize(("precision", "wire_bytes"), [("bf16", 4), ("fp16", 2), ("fp32", 4), ("fp8", 4)])
def test_megatron_reduces_gradients_in_fp32_only_for_bf16(precision, wire_bytes):
    """Megatron's rule (profile value ``fp32-for-bf16``): bf16 training accumulates and reduces
    fp32 main gradients (4 bytes per element); fp16 keeps fp16 gradients (2 bytes) unless told
    otherwise, as the SC'21 fp16 runs did; fp32 training reduces fp32 (4); fp8 runs keep bf16
    parameters (--bf16 --fp8-format) and so fp32 main gradients (4)."""
    from simulator.workload.data_parallel.base import grad_reduce_bytes

    node = ["cluster.node=dgx-h100"] if precision == "fp8" else []  # fp8 tensor cores
    scenario = simulator.load_scenario(GPT3, overrides=["framework=megatron-lm", f"training.precision={precision}",
                                                        *node])
    assert scenario.training.grad_reduce_dtype == "fp32-for-bf16"
    assert grad_reduce_bytes(scenario) == wire_bytes


def test_nemo_profile_runs_megatron_core_underneath():
    """NeMo 2 trains through Megatron-Core's DDP and pipeline schedules and Transformer Engine:
    its profile carries Megatron-Core's bucket layout, blocking pipeline sends and cuDNN attention,
    besides the recipes' overlaps."""
    s = simulator.load_scenario(GPT3, overrides=["framework=nemo"])
    assert (s.parallelism.sharding, s.parallelism.zero.bucketing, s.parallelism.zero.bucket_size_per_dp_rank) == (
        "zero1", "megatron-core", 1_000_000)
    assert s.parallelism.p2p_blocking and s.parallelism.zero.overlap_param_gather
    assert s.training.attention_kernel == "cudnn"


def test_settings_with_a_unit_print_with_it():
    """``ddp.bucket_size`` is a size: Megatron's 40,000,000 fp32 elements = 160,000,000 B =
    160e6 / 2**20 = 152.6 MiB; element counts (``zero.reduce_bucket_size``) say so; flags stay plain."""
    from simulator.scenario import Scenario
    from simulator.scenario.framework import field_quantity, format_setting

    assert field_quantity(Scenario, ("parallelism", "ddp", "bucket_size")) == "size"
    assert field_quantity(Scenario, ("parallelism", "zero", "reduce_bucket_size")) == "elements"
    assert field_quantity(Scenario, ("parallelism", "tp")) is None
    assert format_setting(160_000_000.0, "size") == "152.6 MiB"
    assert format_setting(40_000_000, "elements") == "40,000,000 elements" and format_setting(8, None) == "8"
    assert format_setting(False) == "false"
