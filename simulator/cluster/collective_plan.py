"""Collective plans as data: flows per phase, and the link loads they put on the graph.

A :class:`CollectivePlan` is a sequence of :class:`PhasePlan`; each phase is a set of
point-to-point :class:`Flow` that run together. Weights are bytes per byte of the
collective's size D (nccl-tests' convention). Built by
:class:`simulator.cluster.collectives.CollectivePlanner`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from simulator.catalog import NcclConstants, default_catalog
from simulator.cluster.graph import ClusterGraph
from simulator.cluster.links import LinkTable
from simulator.costs.collectives import PROTOCOLS, CollectiveShape, NcclModel, PhaseShape

__all__ = ["Flow", "PhasePlan", "CollectivePlan", "nccl_model"]


def nccl_model(constants: NcclConstants | None = None) -> NcclModel:
    """NCCL's cost model from its constants (default: the default catalog's ``nccl.yaml``)."""
    c = constants or default_catalog().nccl
    return NcclModel(
        base_latency={k: dict(v) for k, v in c.base_latency.items()},
        hop_latency={k: {a: dict(p) for a, p in v.items()} for k, v in c.hop_latency.items()},
        nvls_latency=c.nvls_latency,
        nvls_efficiency=c.nvls_efficiency,
        protocol_bandwidth={k: dict(v) for k, v in c.protocol_bandwidth.items()},
        ll_max_bytes=c.ll_max_bytes,
        ll_max_bus_bytes_per_s_one_node=dict(c.ll_max_bus_bandwidth_one_node),
        ll128_max_bytes=c.ll128_max_bytes,
        ring_plateau_factor=c.ring_plateau_factor,
        tree_correction={k: tuple(v) for k, v in c.tree_correction.items()},
        simple_step_bytes=c.simple_step_bytes,
        nvls_channels=c.nvls_channels,
    )


@dataclass(frozen=True, slots=True)
class Flow:
    src: int  # global GPU index
    dst: int
    weight: float  # bytes per byte of D


class _LinkWeights:
    """``PhasePlan.link_weights``: the tuple given, or, for a phase made by :meth:`PhasePlan.adopt`,
    the pairs of its arrays made on first read (a 16,384-GPU ring phase has ~2,000 of them, and
    the simulate path reads only the arrays: 0.035 s per fresh GPT-3 run)."""

    def __get__(self, obj: PhasePlan | None, owner: type | None = None) -> tuple[tuple[int, float], ...]:
        if obj is None:
            raise AttributeError("link_weights")
        found: tuple[tuple[int, float], ...] | None = obj.__dict__["_link_weights"]
        if found is None:
            ids, weights = obj.__dict__["_arrays"]
            found = obj.__dict__["_link_weights"] = tuple(zip(ids.tolist(), weights.tolist(), strict=True))
        return found

    def __set__(self, obj: PhasePlan, value: tuple[tuple[int, float], ...]) -> None:
        obj.__dict__["_link_weights"] = value


class _Flows:
    """``PhasePlan.flows``: the tuple given, or, for a phase made by :meth:`PhasePlan.moved`,
    its representative's flows moved, made on first read (a moved plan's flows are read only
    where it is the issuing group's: 20,628 flows made for nothing per fresh 16,384-GPU GPT-3 run)."""

    def __get__(self, obj: PhasePlan | None, owner: type | None = None) -> tuple[Flow, ...]:
        if obj is None:
            raise AttributeError("flows")
        found: tuple[Flow, ...] | None = obj.__dict__["_flows"]
        if found is None:
            base, shift = obj.__dict__["_moved_from"]
            found = obj.__dict__["_flows"] = tuple(Flow(f.src + shift, f.dst + shift, f.weight) for f in base)
        return found

    def __set__(self, obj: PhasePlan, value: tuple[Flow, ...]) -> None:
        obj.__dict__["_flows"] = value


@dataclass(frozen=True)
class PhasePlan:
    flows: tuple[Flow, ...]
    steps: int
    inter_steps: int
    link_weights: tuple[tuple[int, float], ...]  # (link id, bytes per byte of D); see _LinkWeights
    intra_class: str
    net_latency_s: float
    ppn: int
    nodes: int
    channels: int = 1
    channel_net_bytes_per_s: float = 0.0
    intra_latency_s: float = 0.0
    net_staged_bytes: float = 0.0
    net_staged_bytes_per_s: float = 0.0
    net_message_s: float = 0.0

    def seconds_per_byte(self, cluster: ClusterGraph) -> float:
        """Seconds per byte of D on the phase's slowest link (kept per cluster: a plan is asked
        again at every point of a sweep on its cluster)."""
        kept = self.__dict__.get("_seconds_per_byte")
        if kept is not None and kept[0] is cluster:
            return kept[1]
        links = cluster.links
        if isinstance(links, LinkTable) and len(self.arrays()[0]):  # the same divisions, without deriving each link
            ids, weights = self.arrays()
            value = float(np.max(weights / links.capacities(ids)))
        else:
            value = max((w / links[i].capacity_bytes_per_s for i, w in self.link_weights), default=0.0)
        self.__dict__["_seconds_per_byte"] = (cluster, value)
        return value

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Link ids and weights as arrays."""
        return self._arrays

    def adopt(self, ids: np.ndarray, weights: np.ndarray) -> PhasePlan:
        """This phase (built with empty ``link_weights``) with link ids ``ids`` (ascending,
        distinct) and weights ``weights`` as its arrays, ``link_weights`` their pairs, made on
        first read: the phase built with those pairs, to the bit. Returns the phase."""
        self.__dict__["_arrays"] = (ids, weights)
        if len(ids):
            self.__dict__["_link_weights"] = None
        return self

    def moved(self, flows: tuple[Flow, ...], shift: int) -> PhasePlan:
        """This phase (built with empty ``flows``) with ``flows`` moved by ``shift`` GPUs as its
        flows, made on first read: the phase built with them, to the bit. Returns the phase."""
        if flows:
            self.__dict__["_moved_from"] = (flows, shift)
            self.__dict__["_flows"] = None
        return self

    @cached_property
    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.link_weights:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        ids, w = zip(*self.link_weights, strict=True)
        return np.array(ids, dtype=np.int64), np.array(w, dtype=float)


# installed after the dataclass is made, so the field stays required (no class-level default);
# its generated __init__ stores the value through the descriptor (object.__setattr__)
setattr(PhasePlan, "link_weights", _LinkWeights())  # noqa: B010
setattr(PhasePlan, "flows", _Flows())  # noqa: B010


@dataclass(frozen=True)
class CollectivePlan:
    op: str
    algorithm: str
    gpus: tuple[int, ...]
    phases: tuple[PhasePlan, ...]
    ll128_ok: bool

    @property
    def nranks(self) -> int:
        return len(self.gpus)

    def shape(self, cluster: ClusterGraph) -> CollectiveShape:
        return CollectiveShape(
            op=self.op,
            algorithm=self.algorithm,
            nranks=self.nranks,
            ll128_ok=self.ll128_ok,
            protocols=tuple(cluster.node_type.nics.nccl_protocols or PROTOCOLS),
            gpu_architecture=cluster.gpu.architecture,
            phases=tuple(
                PhaseShape(p.seconds_per_byte(cluster), p.steps, p.inter_steps, p.intra_class, p.net_latency_s,
                           p.ppn, p.nodes, p.channels, p.channel_net_bytes_per_s, p.intra_latency_s,
                           p.net_staged_bytes, p.net_staged_bytes_per_s, p.net_message_s)
                for p in self.phases
            ),
        )
