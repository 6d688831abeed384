"""Accuracy against published training runs (issue 7): fails loudly when it regresses.

Thresholds are the current honest errors rounded up a little (they are deterministic, so the
margin only absorbs floating-point differences between machines). Tighten them when the
model improves; never loosen them to make a change pass: find what the change broke.
Every record is described only by what its source states plus its framework's profile
(``simulator/validation/records.py``). Current (docs/validation.md): LLM Foundry 6.3% MAPE
(worst 24.2%, MPT-760M at 512 tokens), Megatron-Core 8.9% (worst +30.7%, 32B at tp 8, pp 1,
dp 48: with micro-batch 1, dtsim's default as the README states none, its fp32 reduce-scatter
overlaps only the last of 4 backwards, as Megatron's code does; +10.9% at micro-batch 2, +2.6% at 4,
the table in docs/validation.md; 1.7B -14.7% and 7.1B -10.9% too fast at any micro-batch), SC'21 7.7%
(worst 11.8%, every record too fast; both Megatron sources cost the op-by-op vocab-parallel loss,
``training.cross_entropy: megatron``), torchtitan 7.3% (worst 24.7%,
Llama 3.1 8B with cp 8 at 262k tokens: the 8B cp 4/8 rows stay 21-25% too fast under the modelled
ring, their exchange hidden on NVLink), nccl-tests >= 1 MiB 5.7% (18.4%). Peak memory (torchtitan,
the only source publishing it, its caching allocator's reserved peak): 3.6% MAPE, worst -10.7%
(405B 1F1B at 8k tokens, H200 8B at 64 GPUs) since a block forward's working set under
recomputation is held and cached (6.1%, worst -15.5%, the 70B rows, before; earlier 8.1%, worst -21.9%
(405B, Table 5 second row), every record low). dtsim's allocations replayed through the caching
allocator model (``simulator/costs/allocator.py``: segment rounding, per-stream caches, best fit
with splitting) with FSDP2's flat all-gather output beside its copied-out parameters, the loss
forward's logits and fp32 copy, and what eager and compiled blocks keep under the op policy: the
8B rows sat within -1.7..-5.0%, the 70B (-15.5%, -10.2%), pipelined 405B (-8.1..-21.9%) and H200
(compiled loss, -9.9%, -12.0%) rows low; with the forward working set every record is within
-10.7..+0.9% (docs/validation.md). (11.7%, -24.1% before those
three.) The memory ceiling rose from (12.5%, 21%) once, when the
mapper stopped discarding the float8 section of torchtitan's configs: the 405B config's float8
all-gather (and the December 2024 code's bf16 output head) now apply as the runs had them, and
the 405B rows' underestimate turned out larger than the wrong mapping showed. Attention is timed per kernel from published
benchmarks (topologies/kernels/attention.yaml); the host issue model (``simulator/costs/host.py``,
10 us per launched op) moves none of them by 0.01 points: every record's kernels outlast their
issue time, so what remains of their errors is not the host's launch overhead.
"""

from __future__ import annotations

import pytest

from simulator.validation.runner import Validation, validate

pytestmark = pytest.mark.slow

# source: (MAPE ceiling, worst-record ceiling)
THRESHOLDS = {
    "llm-foundry": (0.065, 0.245),
    # megatron-core: 8.4% / 31.0% with Megatron's gradient-buffer passes (zeroing, per-bucket NaN norm and 1/dp
    # scaling) and the embedding table's dense gradient added into the main gradient each micro-batch (1.7B
    # -13.2% -> -11.5%, 7.1B -9.1% -> -8.3%, 32B +30.7% -> +31.0%); the 32B row (tp 8, pp 1, dp 48) is the
    # unstated micro-batch: +31.0% at 1, about +11% at 2 and +4% at 4
    "megatron-core": (0.085, 0.315),
    "megatron-sc21": (0.080, 0.120),
    "torchtitan": (0.075, 0.250),
    # mixture of experts (issue 15, open): the 7 Megatron-Bridge H100 rows, all on the analytical network (one
    # method for the source), each with its container's performance recipe (moe_recipes.py), Megatron-Core's rank
    # order (the nemo profile's rank_order tp-cp-dp-pp: EP 8 in one DGX, EP 32 on 4 whole nodes, instead of
    # strided over 2 and 16), the routed and shared experts' GEMMs in fp8 under Transformer Engine, the DeepEP
    # dispatcher where the recipe enables it (Qwen3-30B-A3B 26.02, DeepSeek-V3), DeepSeek-V3 by its recipe's
    # pipeline layout with MLA under tp 2 and fp8, and the recipes' combined-1F1B all-to-all overlap with delayed
    # weight gradients (overlap_a2a_1f1b, delay_wgrad_compute: Qwen3 and DeepSeek-V3 rows): gpt-oss-120b -32.6% /
    # -20.0% (false OOM), qwen3-30b-a3b -65.8% / -61.0%, qwen3-235b-a22b +8.7% / +6.3% (26.02 / 25.11), deepseek-v3
    # +11.3%: MAPE (32.6 + 65.8 + 8.7 + 20.0 + 61.0 + 6.3 + 11.3) / 7 = 29.4%, worst 65.8%. With the overlap alone
    # 29.7%, worst 65.4%; without it 31.1%, worst 61.5% (qwen3-30b -61.5% / -56.0%, qwen3-235b +16.1% / +13.1%,
    # deepseek-v3 +18.6%): the overlap brings the rows that were too slow closer and takes the too-fast
    # Qwen3-30B-A3B further. Before the rank order 25.8% over 6, worst 37.0%: the cross-node all-to-alls of the
    # strided placement hid the MoE layers' missing costs (not modelled: the dropless dispatcher's host
    # synchronisation before each all-to-all, per-kernel host launch costs)
    "moe": (0.300, 0.665),
}
# from 1 MiB: 5.7% MAPE, worst -18.2% at 16 MiB (tree/Simple too fast at 8 and 16 MiB; the issue asks 10%)
COLLECTIVES = (0.060, 0.185)
# below 1 MiB: 1.4% MAPE, worst -6.1% at 2 KiB (tree/Simple; EFA's latency and staged copy are fitted
# to the 12 sizes below 32 KiB, docs/validation.md); the issue asks 25%
COLLECTIVES_SMALL = (0.020, 0.065)
# peak memory where the source publishes it (torchtitan's max_reserved): (MAPE ceiling, worst-record ceiling)
MEMORY = {"torchtitan": (0.040, 0.11)}


@pytest.fixture(scope="module")
def validation() -> Validation:
    return validate()


def test_every_source_is_validated(validation):
    summary = validation.summary()["per_source"]
    assert set(summary) == set(THRESHOLDS)
    assert summary["megatron-sc21"]["records"] == 10 and summary["megatron-core"]["records"] == 9
    assert summary["llm-foundry"]["records"] >= 60 and summary["moe"]["records"] == 7
    assert summary["torchtitan"]["records"] == 20


@pytest.mark.parametrize("source", sorted(THRESHOLDS))
def test_source_error_within_threshold(validation, source):
    stats = validation.summary()["per_source"][source]
    mape_ceiling, worst_ceiling = THRESHOLDS[source]
    worst = max(validation.by_source()[source], key=lambda r: abs(r.error))
    assert stats["mape"] <= mape_ceiling, f"{source} MAPE {stats['mape']:.1%} > {mape_ceiling:.1%}"
    assert stats["max_abs_error"] <= worst_ceiling, (
        f"{source} worst {worst.record.id} {worst.error:+.1%} beyond {worst_ceiling:.1%}")


def test_fp8_speedup_of_paired_runs(validation):
    """torchtitan's Llama 3.1 8B runs with and without float8 linears (8 and 128 H100, FSDP, torch.compile):
    measured speed-ups 8532/6667 = 1.280 and 8380/6514 = 1.286 tokens/s; the issue's target is 10%, the
    current honest error about 4%."""
    pairs = validation.fp8_pairs()
    assert sorted((p.bf16.record.id, p.fp8.record.id) for p in pairs) == [
        ("torchtitan_h100_202412_t1_1", "torchtitan_h100_202412_t1_2"),
        ("torchtitan_h100_202412_t3_8", "torchtitan_h100_202412_t3_9")]
    assert [round(p.measured_speedup, 3) for p in sorted(pairs, key=lambda p: p.bf16.record.id)] == [1.280, 1.286]
    assert all(abs(p.error) <= 0.045 for p in pairs), [(p.fp8.record.id, p.error) for p in pairs]


@pytest.mark.parametrize("source", sorted(MEMORY))
def test_peak_memory_within_threshold(validation, source):
    """dtsim's reserved peak (its allocations replayed through the caching allocator model)
    against the published reserved peak: torchtitan 3.6% MAPE, worst -10.7% (405B 1F1B at 8k
    tokens; H200 8B at 64 GPUs), since a block forward's working set under recomputation is held
    (its segments stay cached: 70B -15.5% -> -6.3%, -10.2% -> -0.4%; 6.1% MAPE, worst -15.5%
    before), and torch.distributed.pipelining's per-micro-batch buffers and kept outputs and the
    CP all-gather's backward memory are modelled (8.1% MAPE, worst -21.9% before those)."""
    stats = validation.summary()["per_source"][source]
    mape_ceiling, worst_ceiling = MEMORY[source]
    assert stats["memory_records"] == 20
    assert stats["memory_mape"] <= mape_ceiling, f"{source} memory MAPE {stats['memory_mape']:.1%}"
    assert stats["memory_max_abs_error"] <= worst_ceiling, stats


def test_small_collectives_follow_nccl_tests(validation):
    stats = validation.summary()["collectives"]["small"]
    assert stats["points"] == 17  # 8 B .. 512 KiB, doubling
    assert stats["mape"] <= COLLECTIVES_SMALL[0] and stats["max_abs_error"] <= COLLECTIVES_SMALL[1], stats


def test_collectives_follow_nccl_tests(validation):
    stats = validation.summary()["collectives"]
    assert stats["points"] == 12
    assert stats["mape"] <= COLLECTIVES[0] and stats["max_abs_error"] <= COLLECTIVES[1], stats


# records that trained but are predicted out of memory, each with its reason; any other is a failure
KNOWN_FALSE_OOM = {
    # 64 H100, pp 4, ep 8, micro-batch 4, no recomputation stated: 1F1B keeps 4 micro-batches of
    # 4 x 4096 tokens on stage 0 (72 GiB of activations); the NeMo recipe's recompute settings are
    # not in the table (issue 15 open)
    "moe_mbridge_2511_h100_gpt_oss_120b",
}


def test_no_published_run_is_predicted_out_of_memory(validation):
    """Every record trained for real: an OOM verdict would be a memory-model error. The dense
    sources have none; the one MoE row listed above is the only known one."""
    assert {r.record.id for r in validation.records if r.oom} == KNOWN_FALSE_OOM


def test_records_not_simulated_are_named_with_the_reason():
    """The public set holds 102 training records: the SC'21 (10), Megatron-Core (9 of 11), LLM
    Foundry (61) and torchtitan (20: 18 from the December 2024 H100 tables, 2 H200 runs) mappers
    take 100. Not simulated, with their reason: the two Megatron-Core strong-scaling rows (their
    layout is not stated): 100 + 2 = 102. The project's copy adds 9 mixture-of-experts records
    (source moe, issue 15): its 7 Megatron-Bridge H100 rows are simulated (DeepSeek-V3's 61
    layers over pp 8 x vp 4 by its recipe's pipeline layout); Megatron-Core's one-line Mixtral
    figure and DeepSeek-V3's run average stay listed with their reason."""
    from simulator.validation.records import _data, load_records, unmapped_records, unmapped_summary

    total = len(_data()["training_records"])
    mapped, unmapped = len(load_records()), unmapped_records()
    moe = {i: why for i, why in unmapped.items() if i.startswith("moe_")}
    assert (total, mapped + len(unmapped), len(unmapped) - len(moe)) == (111, 111, 2)
    strong = {i: why for i, why in unmapped.items() if i.startswith("mcore")}
    assert sorted(strong) == ["mcore_h100_strong_gpt3_177b_4608gpu", "mcore_h100_strong_gpt3_177b_96gpu"]
    assert all("layout not stated" in why for why in strong.values())
    # the Megatron-Bridge rows are all simulated; 2 moe records are not stated as runs
    assert "not stated" in moe.pop("moe_mcore_v08_mixtral_8x7b") and "DualPipe" in moe.pop(
        "moe_deepseek_v3_report_h800")
    assert moe == {}, moe
    assert unmapped_summary().startswith(f"{len(unmapped)} training records")


def test_mappers_set_only_stated_facts():
    """No mapper sets the knobs its source is silent on: Megatron-Core's micro-batch, precision
    and recomputation are dtsim's defaults, and sequence parallelism and the distributed
    optimizer come only from what the stated overlap flags require."""
    from simulator.validation.records import load_records

    for record in load_records():
        if record.source == "megatron-core":
            assert set(record.scenario["training"]) == {"global_batch"}, record.id
            par = record.scenario["parallelism"]
            assert par.get("sequence_parallel", False) == (par["tp"] > 1), record.id
        assert record.scenario["framework"] != "generic" and record.stated, record.id
