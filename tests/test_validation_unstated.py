"""Settings a source leaves unstated (Record.unstated): the record re-simulated at their other
values, reported beside the mapped error (docs/validation.md)."""

from simulator.validation.records import load_records
from simulator.validation.report import _unstated_table
from simulator.validation.runner import Validation, validate_record, validate_unstated, with_setting


def _mcore() -> dict:
    return {r.id: r for r in load_records() if r.source == "megatron-core"}


def test_with_setting_sets_a_dotted_path_on_a_copy():
    record = _mcore()["mcore_h100_weak_32b"]
    changed = with_setting(record, "training.micro_batch", 4)
    assert changed.scenario["training"]["micro_batch"] == 4 and "micro_batch" not in record.scenario["training"]
    assert changed.scenario["training"]["global_batch"] == 192 and changed.measured_step_s == record.measured_step_s
    assert changed.unstated == {}  # the probe itself probes nothing further


def test_megatron_core_probes_the_micro_batches_that_divide_each_rank_share():
    """The README states no micro-batch (Megatron requires --micro-batch-size). Every weak-scaling
    row puts 192 / 48 = 4 (1.7B-32B) up to 3072 / 48 = 64 (462B) sequences on each data-parallel
    rank: micro-batches 2 and 4 divide them all."""
    records = _mcore()
    assert len(records) == 9
    for r in records.values():
        per_rank = r.scenario["training"]["global_batch"] // r.scenario["parallelism"]["dp"]
        assert r.unstated == {"training.micro_batch": [2, 4]} and per_rank % 4 == 0
    assert records["mcore_h100_weak_32b"].scenario["training"]["global_batch"] // 48 == 4


def test_one_micro_batch_per_rank_hides_more_of_the_32b_gradient_reduction():
    """32B (tp 8, pp 1, dp 48): at micro-batch 1 the fp32 reduce-scatter may start only in the last
    of 4 backwards and the parameter all-gather overlaps only the first of 4 forwards; at
    micro-batch 4 there is one micro-batch, whose whole backward and forward they overlap, so less
    data-parallel time is exposed (Megatron's no_sync: schedules.py:390-391 at f2e5db40)."""
    record = _mcore()["mcore_h100_weak_32b"]
    mapped = validate_record(record)
    probes = validate_unstated(record)
    assert [(path, value) for path, value, _ in probes] == [("training.micro_batch", 2), ("training.micro_batch", 4)]
    exposed = [mapped.breakdown["exposed dp"]] + [res.breakdown["exposed dp"] for _, _, res in probes]
    assert exposed[0] > exposed[1] > exposed[2] > 0
    table = _unstated_table(Validation(records=[mapped], unstated={record.id: probes}), [mapped])
    assert "| record | as mapped | `training.micro_batch = 2` | `training.micro_batch = 4` |" in table
    assert any(line.startswith("| `mcore_h100_weak_32b` |") for line in table)
