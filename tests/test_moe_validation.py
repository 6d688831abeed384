"""The ``moe`` validation source (issue 15): how its records become scenarios and step times.

These run in any build: they check the mapping (a plain mapping with the MoE contract fields)
and the measured step time's arithmetic, not the simulation of it.
"""

import copy
import types

import pytest

from simulator.scenario import Scenario
from simulator.scenario.pipeline_layout import stage_layer_counts
from simulator.validation import moe_runs
from simulator.validation.records import _data


def _record(record_id: str) -> dict:
    return next(r for r in _data()["training_records"] if r["id"] == record_id)


def test_step_time_from_tokens_per_gpu():
    """Qwen3-235B-A22B, 25.11 table, DGX-H100: GBS 2048 x seq 4096 = 8,388,608 tokens a step at
    1575 tokens/s/GPU on 256 GPUs (403,200 tokens/s): 20.8051 s. TP 2 x PP 8 x CP 1 leaves dp 16;
    VP 4 is the interleaved schedule with 4 chunks per rank; tp > 1 turns on sequence parallelism; etp 1
    comes from the nemo profile (NeMo's recipes), not the record;
    FP8-CS is the tensorwise recipe; force-balanced routing is skew 0. The performance recipe
    (v0.2.0) adds what dtsim models: no recomputation, bf16 gradient reduction, the alltoall
    dispatcher, no shared-expert overlap but the combined-1F1B all-to-all overlap with delayed weight
    gradients, no TP communication overlap."""
    run = moe_runs._megatron_bridge(_record("moe_mbridge_2511_h100_qwen3_235b_a22b"))
    assert run.step_s == pytest.approx(2048 * 4096 / (1575 * 256)) and run.step_s == pytest.approx(20.8051, abs=1e-4)
    sc = run.scenario
    assert sc["framework"] == "nemo" and sc["cluster"] == {"node": "dgx-h100", "nodes": 32}
    assert sc["model"] == {"preset": "qwen3-235b-a22b", "seq_len": 4096}
    assert sc["parallelism"] == {"tp": 2, "pp": 8, "cp": 1, "dp": 16, "ep": 32,
                                 "pipeline_schedule": "interleaved",
                                 "virtual_stages": 4, "sequence_parallel": True, "tp_comm_overlap": False,
                                 "moe": {"dispatcher": "alltoall", "overlap_ep_comm": False, "overlap_a2a_1f1b": True,
                                         "delay_wgrad_compute": True}}
    assert sc["training"] == {"micro_batch": 1, "global_batch": 2048, "moe_routing": {"skew": 0.0},
                              "precision": "fp8", "fp8": {"recipe": "tensorwise"}, "recompute": "none",
                              "grad_reduce_dtype": "bf16"}
    # every row of the source on the analytical network (a simulation-speed choice, stated in the assumptions)
    assert sc["sim"] == {"network": "analytical"}
    assert moe_runs.NETWORK_METHOD in run.assumptions
    scenario = Scenario.model_validate(sc)
    assert scenario.parallelism.etp == 1 and scenario.settings_source["parallelism.etp"] == "nemo"


def test_bf16_row_without_interleaving():
    """GPT OSS 120B, 26.02 table: BF16, TP 1 PP 4 EP 8 on 64 GPUs (dp 16), VP n/a; 1280 x 4096 =
    5,242,880 tokens at 5993 x 64 = 383,552 tokens/s: 13.6692 s."""
    run = moe_runs._megatron_bridge(_record("moe_mbridge_2602_h100_gpt_oss_120b"))
    assert run.step_s == pytest.approx(13.6692, abs=1e-4)
    assert run.scenario["parallelism"] == {"tp": 1, "pp": 4, "cp": 1, "dp": 16, "ep": 8, "moe": {"dispatcher": "alltoall"}}
    assert run.scenario["training"]["precision"] == "bf16" and "fp8" not in run.scenario["training"]
    assert run.scenario["sim"] == {"network": "analytical"}  # the same method as the EP 32 rows


def test_unsimulable_rows_are_listed_with_the_simulators_reason(monkeypatch):
    """A row whose scenario the simulator refuses is listed with that refusal, not simulated
    (DeepSeek-V3's 25.09 row moved to VP 2: 61 layers over PP 8 x VP 2 = 16 stages with no
    recipe layout for it, 64 - 61 = 3 layers short of an even split); a row it accepts is a
    MoeRun (Qwen3-235B-A22B at TP 2, ETP 1); the Megatron-Core one-line figure is listed as unstated."""
    assert isinstance(moe_runs.moe_run(_record("moe_mbridge_2511_h100_qwen3_235b_a22b")), moe_runs.MoeRun)
    vp2 = copy.deepcopy(_record("moe_mbridge_2509_h100_deepseek_v3"))
    vp2["parallelism"]["virtual_pp"] = 2
    assert moe_runs.moe_run(vp2).startswith(
        "not simulable in this build: parallelism.pp: pp*virtual_stages = 8*2 = 16 does not divide model.layers=61")
    monkeypatch.setattr(moe_runs, "Scenario", types.SimpleNamespace(model_validate=lambda data: data))
    assert isinstance(moe_runs.moe_run(vp2), moe_runs.MoeRun)
    assert "not stated" in moe_runs.moe_run(_record("moe_mcore_v08_mixtral_8x7b"))


def test_deepseek_v3_takes_its_recipes_pipeline_layout():
    """The 25.09 DeepSeek-V3 row (PP 8, VP 4 on H100) ran Megatron-Bridge's performance recipe, whose
    layout 'Et|(tt|)*30mL' (run_script.py:64-66 at a2884419) is 32 stages: the embedding and 1 layer,
    30 x 2 layers, then the MTP layer and the loss; with mtp_num_layers 1 (the recipe's default).
    Rank p holds stages p, p+8, p+16, p+24: 7, 8 (ranks 1-6) and 6 layers. Other rows get no layout."""
    run = moe_runs._megatron_bridge(_record("moe_mbridge_2509_h100_deepseek_v3"))
    sc = run.scenario
    assert sc["parallelism"]["pipeline_layout"] == "Et|(tt|)*30mL" and sc["model"]["mtp_layers"] == 1
    counts = stage_layer_counts(8, 4, 61, None, sc["parallelism"]["pipeline_layout"], sc["model"]["mtp_layers"])
    assert [sum(counts[r::8]) for r in range(8)] == [7, 8, 8, 8, 8, 8, 8, 6]
    assert any("run_script.py:64-66" in a for a in run.assumptions)
    assert any("deepseek_v3.py:174" in a for a in run.assumptions)
    other = moe_runs._megatron_bridge(_record("moe_mbridge_2602_h100_qwen3_235b_a22b"))  # PP 8, VP 4 too
    assert "pipeline_layout" not in other.scenario["parallelism"] and "mtp_layers" not in other.scenario["model"]


def test_every_row_states_its_performance_recipe():
    """Each DGX-H100 row of 25.11 and 26.02 gets its container's Megatron-Bridge recipe (v0.2.0 /
    v0.3.0): bf16 gradient reduction (grad_reduce_in_fp32 False) in every row; the Qwen3 rows'
    combined-1F1B all-to-all overlap (moe_a2a_overlap) as parallelism.moe.overlap_a2a_1f1b; the 26.02 Qwen3-30B-A3B row's DeepEP
    listed as not modelled (no deepep dispatcher in this build); the 25.11 rows whose recipe layout
    differs from the table keep the table's (MBS 2 / VP 24 and MBS 4); recompute_modules as
    training.recompute_modules where the recipe also sets the selective granularity (26.02 GPT-OSS,
    25.09 DeepSeek-V3), recompute none where it sets only the modules (25.11 GPT-OSS)."""
    rows = {i: moe_runs._megatron_bridge(_record(f"moe_mbridge_{i}")) for i in (
        "2511_h100_qwen3_30b_a3b", "2511_h100_qwen3_235b_a22b", "2511_h100_gpt_oss_120b",
        "2602_h100_qwen3_30b_a3b", "2602_h100_qwen3_235b_a22b", "2602_h100_gpt_oss_120b")}
    for i, run in rows.items():
        assert run.scenario["training"]["grad_reduce_dtype"] == "bf16", i
        release = "tag v0.2.0" if i.startswith("2511") else "tag v0.3.0"
        assert any(release in a and "grad_reduce_in_fp32 False" in a for a in run.assumptions), i
        moe = run.scenario["parallelism"].get("moe", {})
        assert moe.get("overlap_a2a_1f1b", False) == moe.get("delay_wgrad_compute", False) == ("qwen3" in i), i
        assert not any("not modelled" in a and "overlap_moe_expert_parallel_comm" in a for a in run.assumptions), i
        assert any("'deepep'" in a for a in run.assumptions) == (i == "2602_h100_qwen3_30b_a3b"), i
    assert rows["2511_h100_qwen3_30b_a3b"].scenario["training"]["micro_batch"] == 2
    assert rows["2511_h100_qwen3_30b_a3b"].scenario["parallelism"]["virtual_stages"] == 24
    assert any("row's is kept" in a for a in rows["2511_h100_gpt_oss_120b"].assumptions)
    assert not any("row's is kept" in a for a in rows["2602_h100_gpt_oss_120b"].assumptions)
    ds = moe_runs._megatron_bridge(_record("moe_mbridge_2509_h100_deepseek_v3"))
    assert ds.scenario["parallelism"]["zero"] == {"overlap_comm": False}
    assert ds.scenario["parallelism"]["moe"]["overlap_a2a_1f1b"] is ds.scenario["parallelism"]["moe"]["delay_wgrad_compute"] is True
    assert ds.scenario["training"]["recompute"] == "selective"
    assert ds.scenario["training"]["recompute_modules"] == ["mla_up_proj", "mlp"]
    assert not any("not modelled" in a and "recompute_modules" in a for a in ds.assumptions)
    # 26.02 sets the granularity with the modules; 25.11 set only the modules, which Megatron-Core then ignores
    assert rows["2602_h100_gpt_oss_120b"].scenario["training"]["recompute"] == "selective"
    assert rows["2602_h100_gpt_oss_120b"].scenario["training"]["recompute_modules"] == ["layernorm", "moe_act"]
    assert rows["2511_h100_gpt_oss_120b"].scenario["training"]["recompute"] == "none"
    assert "recompute_modules" not in rows["2511_h100_gpt_oss_120b"].scenario["training"]
    assert any("c9dd0586" in a and "without recompute_granularity" in a for a in rows["2511_h100_gpt_oss_120b"].assumptions)
    assert any("run_script.py:101-102" in a for a in ds.assumptions)


def test_deepseek_v3_run_average_is_kept_with_its_arithmetic():
    """DeepSeek-V3's report: 180K H800 GPU hours per trillion tokens -> 1e12 / (180,000 x 3600)
    = 1543.2 tokens/s per GPU, the record's derived value; not simulated (in-house framework,
    DualPipe)."""
    r = _record("moe_deepseek_v3_report_h800")
    assert 1e12 / (r["measured"]["gpu_hours_per_trillion_tokens"] * 3600) == pytest.approx(1543.2, abs=0.05)
    assert r["derived"]["tokens_per_s_per_gpu"].startswith("1543.2")
