"""The ``reliability`` section of a scenario: how often the job is interrupted, what a
checkpoint costs and how the job comes back (read by ``dtsim goodput`` and the sweep's
goodput metrics, never by the step simulation).

The default failure rates are those of the Llama 3 405B pre-training run (Dubey et al. 2024,
"The Llama 3 Herd of Models", arXiv 2407.21783, §3.3.4 and Table 5): 466 job interruptions in
a 54-day snapshot (1,296 h) on 16,384 H100 GPUs in 2,048 eight-GPU servers with one 400 Gb/s
NIC per GPU, 47 planned and 419 unexpected. Table 5's root-cause counts, grouped by what fails:

======================  ===========================================================  =====  ==========================
class                   Table 5 categories (count)                                   sum    mean time between failures
======================  ===========================================================  =====  ==========================
per GPU (hardware)      faulty GPU 148, GPU HBM3 72, GPU SRAM 19, GPU system           268  1,296 h x 16,384 / 268
                        processor 17, silent data corruption 6, GPU thermal                  = 79,230 h
                        interface + sensor 6
per node (hardware)     host maintenance 32, SSD 3, power supply 3, server chassis 2,   46  1,296 h x 2,048 / 46
                        IO expansion board 2, CPU 2, system memory 2                         = 57,700 h
per NIC link            network switch/cable 35, NIC 7                                  42  1,296 h x 16,384 / 42
                                                                                             = 505,600 h
per node (software)     software bug 54, NCCL watchdog timeouts 7, dependency 2         63  1,296 h x 2,048 / 63
                                                                                             = 42,130 h
per job (planned)       planned interruptions (maintenance, upgrades)                   47  1,296 h / 47 = 27.57 h
======================  ===========================================================  =====  ==========================

The paper does not say how the 54 days split between 16,384 GPUs and fewer ("up to"): the
rates above assume 16,384 throughout, so they are lower bounds of the per-component rate.
Kokolis et al. 2024 ("Revisiting Reliability in Large-Scale Machine Learning Research
Clusters", arXiv 2410.21680, HPCA 2025) model a job's failures the same way, as the sum of
independent per-node rates (so the job's mean time to failure falls as 1 / size), and name the
effective training time ratio (ETTR) this section's results report.

Hardware failures take a node out: the job waits ``requeue_time`` for a replacement unless a
hot spare is free (``hot_spares``), or with ``elastic`` goes on at a reduced data-parallel
size until the node is back after ``repair_time``. Software failures and planned
interruptions only restart the job. Checkpoint storage defaults to Llama 3's: Tectonic at
2 TB/s sustained (paper §3.3.1); the restart time is not stated there (see ``restart_time``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, WithJsonSchema, field_validator

from simulator.fields import Bytes, Duration, Frozen, Rate
from simulator.units import parse_count

__all__ = ["ReliabilitySpec", "CheckpointSpec", "LLAMA3_SOURCE"]

LLAMA3_SOURCE = ("Dubey et al. 2024, 'The Llama 3 Herd of Models' (arXiv 2407.21783), Table 5: 419 unexpected and "
                 "47 planned interruptions in 54 days on 16,384 H100 (2,048 nodes, one NIC per GPU)")

_HOUR = 3600.0
# a count of tokens: a number, or a string with a suffix k M B(illion) G T P (simulator.units.parse_count)
TokenCount = Annotated[PositiveFloat, WithJsonSchema({"anyOf": [
    {"type": "number", "exclusiveMinimum": 0},
    {"type": "string", "pattern": r"^\s*[0-9][0-9_,]*(\.[0-9]*)?([eE][+-]?[0-9]+)?\s*[kMBGTP]?\s*$",
     "description": "a count with a suffix: k M B (billions) G T P, e.g. '15T', '405B'"}]})]
_SNAPSHOT_H = 54 * 24  # the 54-day snapshot, hours


class CheckpointSpec(Frozen):
    """What a checkpoint holds, where it goes, how fast and how often."""

    size: Bytes | None = Field(
        None, description="bytes of one checkpoint; default: the model's parameters plus optimizer states "
        "(simulator/costs/memory.py: 2 + 12 bytes per parameter for mixed-precision Adam)")
    write_bandwidth_per_node: Rate | None = Field(
        None, description="one node's write bandwidth to the checkpoint store (shared filesystem or object "
        "store), e.g. '25GB/s'; default: no per-node cap (the store's bandwidth binds)")
    read_bandwidth_per_node: Rate | None = Field(
        None, description="one node's read bandwidth from the store at a restart; default: no per-node cap")
    storage_write_bandwidth: Rate | None = Field(
        2e12, description="the store's total write bandwidth; default 2 TB/s (Llama 3's Tectonic, sustained, "
        "paper §3.3.1); null: no cap")
    storage_read_bandwidth: Rate | None = Field(
        2e12, description="the store's total read bandwidth; default 2 TB/s (as write); null: no cap")
    asynchronous: bool = Field(
        False, description="asynchronous checkpointing: training stops only while each GPU copies its shard to "
        "host memory (snapshot_bandwidth) and the write to the store overlaps the following steps; a "
        "checkpoint is usable only once written, so a failure loses that much more work")
    snapshot_bandwidth: Rate | None = Field(
        None, description="device-to-host copy bandwidth per GPU for asynchronous checkpoints; default: a "
        "PCIe x16 link of the node's generation (topologies/nodes/)")
    interval: Duration | None = Field(
        None, description="time between checkpoints (rounded up to whole steps); default: the optimum of "
        "interval_rule")
    interval_rule: Literal["daly", "young"] = Field(
        "daly", description="the optimal interval: daly (Daly 2006, higher-order) or young (Young 1974, "
        "sqrt(2 C M))")


class ReliabilitySpec(Frozen):
    """Failure rates, restart costs and checkpointing of a training run (``dtsim goodput``)."""

    gpu_mtbf: Duration = Field(
        _SNAPSHOT_H * 16384 / 268 * _HOUR, description="mean time between hardware failures of one GPU; "
        "default 79,230 h (Llama 3 Table 5: 268 GPU failures in 54 days x 16,384 GPUs)")
    node_mtbf: Duration = Field(
        _SNAPSHOT_H * 2048 / 46 * _HOUR, description="mean time between hardware failures of one node outside "
        "its GPUs (host, power, SSD, CPU, memory); default 57,700 h (Llama 3 Table 5: 46 in 54 days x 2,048 nodes)")
    link_mtbf: Duration = Field(
        _SNAPSHOT_H * 16384 / 42 * _HOUR, description="mean time between failures of one scale-out NIC link "
        "(NIC, cable, switch port); default 505,600 h (Llama 3 Table 5: 42 in 54 days x 16,384 links)")
    software_mtbf: Duration = Field(
        _SNAPSHOT_H * 2048 / 63 * _HOUR, description="mean time between software failures per node (bugs, "
        "NCCL watchdog timeouts, dependencies): the job restarts, no node is replaced; default 42,130 h "
        "(Llama 3 Table 5: 63 in 54 days x 2,048 nodes)")
    planned_mtbf: Duration | None = Field(
        _SNAPSHOT_H / 47 * _HOUR, description="mean time between planned interruptions of the job "
        "(maintenance, upgrades), each after a checkpoint; default 27.57 h (Llama 3: 47 in 54 days); null: none")
    restart_time: Duration = Field(
        600.0, description="from a failure to training again, checkpoint read excluded: detection, teardown, "
        "re-launch, initialisation; default 10 min, an assumption (the Llama 3 paper gives no figure; Daly "
        "2006's worked examples use R = 10 min)")
    requeue_time: Duration = Field(
        0.0, description="extra wait for a replacement node after a hardware failure when no hot spare is free; "
        "default 0 (the scheduler has healthy nodes at once)")
    hot_spares: NonNegativeInt = Field(
        0, description="spare nodes kept ready (and paid for): a hardware failure takes one instead of waiting "
        "requeue_time")
    repair_time: Duration = Field(
        24 * _HOUR, description="how long a node taken out by a hardware failure stays out (decides whether a "
        "spare is free and, with elastic, how long dp stays reduced); default 24 h, an assumption")
    elastic: bool = Field(
        False, description="after a hardware failure with no spare free, continue at reduced data parallelism "
        "(the replicas of the lost node drop out) until the node is back, instead of waiting requeue_time")
    tokens: TokenCount | None = Field(
        None, description="training tokens of the whole run for the sweep's goodput metrics, e.g. 15T or 2e12; "
        "default 20 per parameter (Hoffmann et al. 2022)")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    source: str = Field(LLAMA3_SOURCE, description="where the failure rates come from (free text)")

    @field_validator("tokens", mode="before")
    @classmethod
    def _count(cls, value: object) -> object:
        return parse_count(value) if isinstance(value, str) else value  # type: ignore[arg-type]
