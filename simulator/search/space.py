"""The search space (step 1 of :mod:`simulator.search`, which lists what is enumerated and
what is left out): layouts of a scenario's model on its cluster, and their scenarios.
"""

from __future__ import annotations

import copy
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from simulator.catalog import Catalog, default_catalog
from simulator.scenario import Scenario
from simulator.scenario.parallelism import drop_foreign_options
from simulator.sweep import set_path

__all__ = ["Objective", "RECOMPUTE_ORDER", "SearchSpace", "Layout", "enumerate_layouts", "layout_scenario", "scenario_json"]

Objective = Literal["throughput", "cost", "time-to-train"]
RECOMPUTE_ORDER = ("none", "selective", "full")


@dataclass(frozen=True)
class SearchSpace:
    """Bounds of the enumeration (``None``: derived from the model and cluster, see the module
    docstring)."""

    nodes: tuple[int, ...] | None = None
    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    max_micro_batch: int = 8
    virtual_stages: tuple[int, ...] = (2, 4)
    shardings: tuple[str, ...] = ("none", "zero1", "zero2", "zero3", "fsdp", "hsdp", "mics")
    recompute: tuple[str, ...] = RECOMPUTE_ORDER
    min_tokens_per_cp_rank: int = 4096
    ep: tuple[int, ...] | None = None  # MoE models: expert-parallel sizes (default: powers of two dividing experts)
    etp: tuple[int, ...] | None = None  # MoE models: expert tensor-parallel sizes besides the default (= tp)


@dataclass(frozen=True)
class Layout:
    """A parallel layout without its recomputation policy."""

    nodes: int
    tp: int
    pp: int
    cp: int
    dp: int
    micro_batch: int
    schedule: str
    virtual_stages: int
    sharding: str
    shard_group_size: int | None
    ep: int = 1
    etp: int | None = None  # None: tp (Megatron-Core's default)

    def overrides(self, recompute: str) -> dict[str, Any]:
        """Scenario field -> value of this layout with ``recompute`` (``None``: the default)."""
        return {
            "cluster.nodes": self.nodes,
            "parallelism.tp": self.tp,
            "parallelism.pp": self.pp,
            "parallelism.cp": self.cp,
            "parallelism.dp": "auto",
            "parallelism.sequence_parallel": self.tp > 1,
            "parallelism.pipeline_schedule": self.schedule,
            "parallelism.virtual_stages": self.virtual_stages,
            "parallelism.stage_layers": None,
            "parallelism.pipeline_layout": None,
            "parallelism.sharding": self.sharding,
            "parallelism.shard_group_size": self.shard_group_size,
            "parallelism.offload_optimizer": False,
            "parallelism.ep": self.ep,
            "parallelism.etp": self.etp,
            "training.micro_batch": self.micro_batch,
            "training.recompute": recompute,
            # the base's Megatron-Core recompute_modules shape its selective policy only
            **({} if recompute == "selective" else {"training.recompute_modules": None}),
        }

    @property
    def label(self) -> str:
        """``"tp8 pp4 cp1 dp2 mb1 interleaved(v=2) zero1"``."""
        schedule = self.schedule if self.virtual_stages == 1 else f"{self.schedule}(v={self.virtual_stages})"
        sharding = self.sharding if self.shard_group_size is None else f"{self.sharding}(g={self.shard_group_size})"
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"cp{self.cp}", f"dp{self.dp}", f"mb{self.micro_batch}"]
        if self.ep > 1:
            parts.append(f"ep{self.ep}")
        if self.etp is not None:
            parts.append(f"etp{self.etp}")
        if self.pp > 1:
            parts.append(schedule)
        return " ".join([*parts, sharding])



def _powers_of_two(limit: int) -> list[int]:
    return [2**k for k in range(int(math.log2(max(1, limit))) + 1)]


def enumerate_layouts(base: Scenario, space: SearchSpace) -> Iterator[Layout]:
    """Every layout of the space for ``base``'s model and cluster (not yet validated)."""
    model, cluster, train = base.model, base.cluster, base.training
    gpn = cluster.gpus_in_node
    for nodes in space.nodes or (cluster.n_nodes,):
        world = nodes * gpn
        tps = space.tp or tuple(_powers_of_two(gpn))
        cps = space.cp or tuple(c for c in _powers_of_two(world) if model.seq_len // c >= space.min_tokens_per_cp_rank)
        pps = space.pp or tuple(_powers_of_two(min(world, model.layers)))
        for tp, cp, pp in itertools.product(tps, cps or (1,), pps):
            if world % (tp * cp * pp):
                continue
            dp = world // (tp * cp * pp)
            per_replica = train.global_batch // dp if train.global_batch % dp == 0 else 0
            mbs = space.micro_batch or tuple(m for m in _powers_of_two(space.max_micro_batch) if m <= per_replica)
            schedules = [("1f1b", 1)] + ([("interleaved", v) for v in space.virtual_stages] if pp > 1 else [])
            experts = itertools.product(*_expert_sizes(base, space, world, tp))
            for (ep, etp), mb, (schedule, v), sharding in itertools.product(experts, mbs, schedules, space.shardings):
                if sharding != "none" and dp * cp == 1:
                    continue  # nothing to shard over
                group: int | None = None
                if sharding in ("hsdp", "mics"):
                    group = gpn // (tp * cp) if gpn % (tp * cp) == 0 else 0
                    if not 1 < group < dp or dp % group:
                        continue  # one node's replicas must be a proper divisor of dp
                yield Layout(nodes, tp, pp, cp, dp, mb, schedule, v, sharding, group, ep, etp)


def _expert_sizes(base: Scenario, space: SearchSpace, world: int, tp: int) -> tuple[list[int], list[int | None]]:
    """ep and etp values to try: for an MoE model the powers of two up to the world size that
    divide its experts (``space.ep`` when given) and, besides the default etp (= tp), the
    powers of two up to one node (``space.etp``); ``([1], [None])`` for a dense model. The
    scenario's validation (:func:`~simulator.scenario.moe.check_experts`) drops what does not fold."""
    experts = base.model.experts if base.model.moe else 0
    if not experts:
        return [1], [None]
    eps = list(space.ep) if space.ep else [e for e in _powers_of_two(world) if experts % e == 0]
    gpn = base.cluster.gpus_in_node
    etps: list[int | None] = [None, *(e for e in (space.etp or _powers_of_two(gpn)) if e != tp)]
    return eps, etps


def scenario_json(scenario: Scenario) -> dict[str, Any]:
    """``scenario`` as a mapping of the fields it was given (a full dump would also carry what
    its framework profile filled in, e.g. both megatron-core's ``attention_kernel: cudnn`` and
    the default ``flash_attention_version``, which then contradict each other on validation)."""
    return scenario.model_dump(mode="json", by_alias=True, exclude_unset=True)


def layout_scenario(base_json: dict[str, Any], layout: Layout, recompute: str, catalog: Catalog | None = None) -> Scenario:
    """``base`` (as its JSON mapping) with the layout's fields set; raises ScenarioError."""
    data = copy.deepcopy(base_json)
    for path, value in layout.overrides(recompute).items():
        set_path(data, path, value)
    data["parallelism"] = drop_foreign_options(data["parallelism"])  # the base's options of another sharding
    # one catalog for the whole search: the default one re-stamps its folders on every validation
    return Scenario.model_validate(data, context={"catalog": catalog or default_catalog()})

