"""Closed-form collective costs and NCCL-style algorithm/protocol choice (pure functions).

A collective is described by its *shape* (what :mod:`simulator.cluster.collectives` derives
from the group's placement on the graph): per phase, the seconds per byte of the busiest
link (the alpha-beta model's beta over the route's bottleneck), the number of sequential
steps and how many of them cross the network. Costing follows NCCL's own model
(``src/graph/tuning.cc``; shared/REFERENCE.md §1.10.4):

    time = latency(algorithm, protocol) + sum over phases of nbytes * beta_phase / f

with ``f`` the protocol's bandwidth fraction (LL 0.5, LL128 0.92, Simple 1) times, for
trees, NCCL's size-dependent tree correction. Latency:

* ring:  base + (steps - inter) * hop_intra + inter * (hop_net + transport latency);
  x1.4 for multi-node Simple all-reduce (NCCL's "plateau" factor, sm80+);
* tree:  base + 2 * ((ppn - 1) * hop_intra + ceil(log2 nodes) * (hop_net + transport)),
  plus the pipeline fill across the network: a tree forwards a Simple step (512 KiB)
  only once it has it, so each of the 2*levels network hops adds one step time,
  ``min(D / channels, step) / channel bandwidth``;
* nvls:  NCCL's NVLS latency (25 us);
* nvls_tree: the NVLS latency plus 2 * ceil(log2 nodes) * (hop_net + transport) for the tree
  across the nodes (NCCL's NVLSTree: intraLat + 2 * log2(nNodes) * interLat), and the tree's
  pipeline fill (Simple only);
* direct (p2p, all-to-all) and deepep (DeepEP's dispatch / combine, Simple only): base + one hop.

"transport" is the transport's per-message latency plus, where the transport stages small
messages through host buffers (EFA below 32 KiB), the copy of one network message
(:func:`staged_copy_s`); a message is one channel's NCCL step (:func:`net_message_bytes`),
with NCCL's channel count for the size (:func:`channels_used`). Inside one node ring LL
runs at no more than NCCL's LL bus-bandwidth ceiling for the GPU generation
(:func:`ll_bound_s`), and is offered at any size. Only the protocols the node
type allows are offered (``CollectiveShape.protocols``: Simple on p4d/p4de).

The textbook ring formula of shared/REFERENCE.md §1.2 is the special case of one phase:
``2(N-1)*alpha + 2(N-1)/N * D / B`` for all-reduce (``tests/test_collectives.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = [
    "NcclModel",
    "PhaseShape",
    "CollectiveShape",
    "Choice",
    "ring_all_reduce_time_s",
    "collective_latency_s",
    "pipeline_fill_s",
    "bandwidth_factor",
    "collective_time_s",
    "protocols_for",
    "choose_algorithm",
    "bus_bandwidth_factor",
    "channels_used",
    "net_message_bytes",
    "staged_copy_s",
    "nvls_tree_chunk_bytes",
    "message_bound_s",
    "ll_ceiling_bytes_per_s",
    "ll_bound_s",
    "PROTOCOLS",
]

PROTOCOLS = ("LL", "LL128", "Simple")


@dataclass(frozen=True)
class NcclModel:
    """NCCL's cost-model constants (seconds), as loaded from ``topologies/nccl.yaml``."""

    base_latency: dict[str, dict[str, float]]
    hop_latency: dict[str, dict[str, dict[str, float]]]
    nvls_latency: float
    nvls_efficiency: float
    protocol_bandwidth: dict[str, dict[str, float]]
    ll_max_bytes: float
    ll128_max_bytes: float
    ring_plateau_factor: float
    tree_correction: dict[str, tuple[float, ...]]
    simple_step_bytes: float = 512 * 1024
    nvls_channels: int = 16
    ll_max_bus_bytes_per_s_one_node: dict[str, float] = field(default_factory=dict)  # by GPU architecture


@dataclass(frozen=True)
class PhaseShape:
    """One phase of a collective on a concrete placement.

    ``seconds_per_byte``: max over links of (bytes crossing the link per byte of the
    collective's size D) / link capacity, i.e. the phase's bandwidth time per byte when it
    runs alone. ``steps``: sequential steps; ``inter_steps`` of them cross the network.
    """

    seconds_per_byte: float
    steps: int
    inter_steps: int
    intra_class: str  # "nvlink" | "pcie"
    net_latency_s: float
    ppn: int
    nodes: int
    channels: int = 1
    channel_net_bytes_per_s: float = 0.0  # network bandwidth of one channel (trees' pipeline fill)
    intra_latency_s: float = 0.0  # measured extra latency per intra-node step (dtsim calibrate --comm)
    net_staged_bytes: float = 0.0  # network messages up to this size are staged through host buffers
    net_staged_bytes_per_s: float = 0.0  # copy rate of a staged message (0: no staging cost)
    net_message_s: float = 0.0  # a GPU's network proxy time per message it posts (0: none)


@dataclass(frozen=True)
class CollectiveShape:
    op: str  # all_reduce | all_gather | reduce_scatter | all_to_all | broadcast | p2p
    algorithm: str  # ring | tree | nvls | hierarchical | direct | chain
    nranks: int
    phases: tuple[PhaseShape, ...]
    ll128_ok: bool = True  # every hop can use LL128 (NVLink, or InfiniBand)
    protocols: tuple[str, ...] = PROTOCOLS  # protocols the node type lets NCCL use (NCCL_PROTO)
    gpu_architecture: str = ""  # volta | ampere | hopper | ... (NCCL's single-node LL ceiling)

    @property
    def nodes(self) -> int:
        return max(p.nodes for p in self.phases)


@dataclass(frozen=True)
class Choice:
    shape: CollectiveShape
    protocol: str
    time_s: float
    latency_s: float


def ring_all_reduce_time_s(nranks: int, nbytes: float, alpha_s: float, bandwidth_bytes_per_s: float) -> float:
    """Textbook ring all-reduce: 2(N-1)*alpha + 2(N-1)/N * D / B (Thakur et al. 2005)."""
    n = nranks
    if n <= 1:
        return 0.0
    return ring_steps("all_reduce", n) * alpha_s + wire_factor("all_reduce", n) * nbytes / bandwidth_bytes_per_s


def _family(algorithm: str) -> str:
    return "tree" if algorithm in ("tree", "nvls_tree") else "ring"


# NCCL's per-thread work before it adds threads and channels, and its most threads per
# channel (NVIDIA/nccl v2.20.3-1 src/include/comm.h:35-37 NCCL_{LL,LL128,SIMPLE}_THREAD_THRESHOLD;
# src/include/device.h NCCL_{LL,LL128,SIMPLE}_MAX_NTHREADS)
_THREAD_THRESHOLD_BYTES = {"LL": 8, "LL128": 8, "Simple": 64}
_MAX_THREADS = {"LL": 512, "LL128": 640, "Simple": 512}


def channels_used(algorithm: str, protocol: str, nranks: int, channels: int, nbytes: float) -> int:
    """Channels NCCL runs a message on: it drops channels while the message is smaller than
    channels x threads x the protocol's per-thread threshold (x ranks for ring LL)
    (v2.20.3-1 src/enqueue.cc:1553-1557 getChannnelThreadInfo, src/graph/tuning.cc:380-384)."""
    per_channel = _MAX_THREADS[protocol] * _THREAD_THRESHOLD_BYTES[protocol]
    if algorithm == "ring" and protocol == "LL":
        per_channel *= nranks
    return max(1, min(channels, int(nbytes // per_channel)))


def net_message_bytes(model: NcclModel, shape: CollectiveShape, phase: PhaseShape, protocol: str,
                      nbytes: float) -> float:
    """Bytes of one network message (one NCCL step of one channel): a tree sends each
    channel's share, a ring each rank's slice of it, a point-to-point send or a pipelined
    broadcast the whole message, all up to the protocol's step (NCCL_BUFFSIZE / NCCL_STEPS)."""
    step = model.simple_step_bytes if protocol == "Simple" else model.simple_step_bytes / 8
    nc = channels_used(shape.algorithm, protocol, shape.nranks, phase.channels, nbytes)
    if shape.op == "p2p" or shape.algorithm == "chain":
        share = nbytes
    elif shape.algorithm == "tree":
        share = nbytes / nc
    else:
        share = nbytes / (shape.nranks * nc)
    return min(step, share)


def staged_copy_s(phase: PhaseShape, message_bytes: float) -> float:
    """Time to copy one network message through the transport's host bounce buffers: messages up
    to ``net_staged_bytes`` are copied at ``net_staged_bytes_per_s``; larger ones take a DMA
    path whose fixed cost equals the copy of the largest staged message (the threshold sits
    where both paths cost the same), so the cost saturates there."""
    if phase.net_staged_bytes_per_s <= 0:
        return 0.0
    return min(message_bytes, phase.net_staged_bytes) / phase.net_staged_bytes_per_s


def nvls_tree_chunk_bytes(model: NcclModel, nbytes: float, heads: int) -> float:
    """NVLSTree's chunk for an all-reduce of ``nbytes``: NCCL's Simple step (512 KiB, the most
    aws-ofi-nccl's NCCL_NVLSTREE_MAX_CHUNKSIZE=524288 allows: src/platform-aws.c at v1.8.1-aws),
    halved to 256, 128, 64 and 32 KiB while the message is below 32, 16, 4 and 1 rounds of every
    channel's heads (NVIDIA/nccl v2.20.3-1 src/enqueue.cc:1712-1722; NVLS channels 16 by
    default, src/transport/nvls.cc:231)."""
    chunk = model.simple_step_bytes
    ops = model.nvls_channels * heads
    for rounds, cap in ((32, 262144.0), (16, 131072.0), (4, 65536.0), (1, 32768.0)):
        if nbytes < rounds * ops * chunk and chunk > cap:
            chunk = cap
    return chunk


def message_bound_s(model: NcclModel, shape: CollectiveShape, protocol: str, nbytes: float) -> float:
    """What the network proxies' message rate adds over the transfer running alone (at the
    protocol's bandwidth factor, as :func:`collective_time_s`): a GPU posts
    the bytes it sends across nodes one message (one channel's step, :func:`net_message_bytes`;
    NVLSTree's chunk, :func:`nvls_tree_chunk_bytes`) after another at ``net_message_s`` each,
    so the collective takes at least that long. A tree (and NVLSTree) GPU sends D/ppn per tree
    level, a ring's 2(N-1)/N D/ppn (all-reduce); 0 for other algorithms and for transports
    without a message cost."""
    if shape.algorithm not in ("ring", "tree", "nvls_tree"):
        return 0.0
    extra = 0.0
    factor = bandwidth_factor(model, shape.algorithm, protocol, nbytes)
    for p in shape.phases:
        if p.net_message_s <= 0 or p.nodes <= 1:
            continue
        if shape.algorithm == "ring":
            sent = wire_factor(shape.op, shape.nranks) * nbytes / p.ppn
        else:
            sent = math.ceil(math.log2(p.nodes)) * nbytes / p.ppn
        if shape.algorithm == "nvls_tree":
            message = nvls_tree_chunk_bytes(model, nbytes, p.ppn)
        else:
            message = net_message_bytes(model, shape, p, protocol, nbytes)
        extra = max(extra, math.ceil(sent / message) * p.net_message_s - p.seconds_per_byte * nbytes / factor)
    return max(0.0, extra)


def ll_ceiling_bytes_per_s(model: NcclModel, shape: CollectiveShape) -> float:
    """LL's bus-bandwidth ceiling: inside one node NCCL caps ring LL at ``llMaxBw`` of the GPU
    generation (v2.23.4-1 src/graph/tuning.cc:86-90, 151-152, 187); 0 (no ceiling modelled,
    LL offered only up to ``ll_max_bytes``) across nodes, where NCCL keys it by CPU vendor."""
    if shape.nodes != 1:
        return 0.0
    return model.ll_max_bus_bytes_per_s_one_node.get(shape.gpu_architecture, 0.0)


def ll_bound_s(model: NcclModel, shape: CollectiveShape, protocol: str, nbytes: float) -> float:
    """What LL's ceiling adds over the transfer running alone: a ring LL collective moves
    ``wire_factor * D`` bus bytes at no more than :func:`ll_ceiling_bytes_per_s` (NCCL's busBw to
    algBw ratio nRanks / nsteps, tuning.cc:223, is 1 / wire_factor); 0 for other algorithms
    and protocols, and where no ceiling applies."""
    cap = ll_ceiling_bytes_per_s(model, shape)
    if protocol != "LL" or shape.algorithm != "ring" or cap <= 0:
        return 0.0
    transfer = sum(p.seconds_per_byte for p in shape.phases) * nbytes / bandwidth_factor(model, "ring", "LL", nbytes)
    return max(0.0, wire_factor(shape.op, shape.nranks) * nbytes / cap - transfer)


def _phase_latency(model: NcclModel, algorithm: str, protocol: str, phase: PhaseShape,
                   message_bytes: float = 0.0) -> float:
    fam = _family(algorithm)
    intra = model.hop_latency[phase.intra_class][fam][protocol] + phase.intra_latency_s
    net = model.hop_latency["net"][fam][protocol] + phase.net_latency_s + staged_copy_s(phase, message_bytes)
    if algorithm in ("tree", "nvls_tree"):
        levels = math.ceil(math.log2(phase.nodes)) if phase.nodes > 1 else 0
        if algorithm == "nvls_tree":
            return model.nvls_latency + 2 * levels * net
        return 2 * ((phase.ppn - 1) * intra + levels * net)
    if algorithm == "nvls":
        return model.nvls_latency
    return (phase.steps - phase.inter_steps) * intra + phase.inter_steps * net


def pipeline_fill_s(model: NcclModel, shape: CollectiveShape, protocol: str, nbytes: float) -> float:
    """Trees across nodes: one step per network hop before the pipeline runs full."""
    if shape.algorithm not in ("tree", "nvls_tree"):
        return 0.0
    fill = 0.0
    step = model.simple_step_bytes if protocol == "Simple" else model.simple_step_bytes / 8
    for p in shape.phases:
        if p.nodes > 1 and p.channel_net_bytes_per_s > 0:
            levels = math.ceil(math.log2(p.nodes))
            fill += 2 * levels * min(nbytes / p.channels, step) / p.channel_net_bytes_per_s
    return fill


def collective_latency_s(model: NcclModel, shape: CollectiveShape, protocol: str, nbytes: float = 0.0) -> float:
    """Latency part of the model for one call (base + per-hop terms + tree fill), seconds."""
    if shape.op in ("d2h", "h2d"):
        return model.hop_latency["pcie"]["ring"]["Simple"]  # a cudaMemcpyAsync over PCIe
    if shape.nranks <= 1:
        return 0.0
    fam = _family(shape.algorithm)
    base = 0.0 if shape.algorithm == "nvls_tree" else model.base_latency[fam][protocol]
    calls = len(shape.phases) if shape.algorithm == "hierarchical" else 1
    latency = base * calls + sum(
        _phase_latency(model, shape.algorithm, protocol, p, net_message_bytes(model, shape, p, protocol, nbytes))
        for p in shape.phases)
    if shape.algorithm == "nvls":
        latency = model.nvls_latency
    if shape.op == "all_reduce" and shape.algorithm == "ring" and protocol == "Simple" and shape.nodes > 1:
        latency *= model.ring_plateau_factor
    return (latency + pipeline_fill_s(model, shape, protocol, nbytes) + message_bound_s(model, shape, protocol, nbytes)
            + ll_bound_s(model, shape, protocol, nbytes))


def bandwidth_factor(model: NcclModel, algorithm: str, protocol: str, nbytes: float) -> float:
    """Fraction of link capacity the protocol delivers (bytes on the wire per byte = 1/f)."""
    if algorithm in ("nvls", "nvls_tree"):
        return 1.0  # the flows carry NVLS's measured efficiency
    factor = model.protocol_bandwidth[_family(algorithm)][protocol]
    if algorithm == "tree":
        table = model.tree_correction[protocol]
        index = int(math.log2(max(nbytes, 64.0) / 64.0))
        if index < len(table):
            factor *= table[index]
    return factor


def collective_time_s(model: NcclModel, shape: CollectiveShape, protocol: str, nbytes: float) -> float:
    """Time of the collective running alone on its links."""
    if (shape.nranks <= 1 and shape.op not in ("d2h", "h2d")) or nbytes <= 0:
        return 0.0
    factor = bandwidth_factor(model, shape.algorithm, protocol, nbytes)
    transfer = sum(p.seconds_per_byte for p in shape.phases) * nbytes / factor
    return collective_latency_s(model, shape, protocol, nbytes) + transfer


def protocols_for(model: NcclModel, shape: CollectiveShape, nbytes: float,
                  enabled: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """Protocols NCCL would consider: LL for small messages (at any size inside one node, where
    its ceiling is modelled: :func:`ll_bound_s`), LL128 where 128-byte stores are
    atomic (NVLink, InfiniBand) and the message is not huge, Simple always; only those the
    node type allows (``shape.protocols``: NCCL_PROTO as the network plugin sets it), and of
    those only the ones ``enabled`` (the user's ``NCCL_PROTO``) names."""
    if shape.algorithm in ("nvls", "nvls_tree") or shape.algorithm.startswith("deepep") or shape.op in ("d2h", "h2d"):
        options = ["Simple"]  # DeepEP runs its own kernels, not NCCL's LL / LL128 protocols
    else:
        options = []
        if nbytes <= model.ll_max_bytes or ll_ceiling_bytes_per_s(model, shape) > 0:
            options.append("LL")
        if shape.ll128_ok and nbytes <= model.ll128_max_bytes:
            options.append("LL128")
        options.append("Simple")
    allowed = [p for p in options if p in shape.protocols or p == "Simple"]
    return tuple(p for p in allowed if enabled is None or p in enabled)


def choose_algorithm(model: NcclModel, shapes: list[CollectiveShape], nbytes: float,
                     protocols: tuple[str, ...] | None = None) -> Choice:
    """The (algorithm, protocol) pair of least modelled time, as NCCL's tuner picks it;
    ``protocols`` restricts the protocols (``NCCL_PROTO``)."""
    best: Choice | None = None
    for shape in shapes:
        for protocol in protocols_for(model, shape, nbytes, protocols):
            t = collective_time_s(model, shape, protocol, nbytes)
            if best is None or t < best.time_s:
                best = Choice(shape, protocol, t, collective_latency_s(model, shape, protocol, nbytes))
    if best is None:
        raise ValueError("no collective algorithm applies")
    return best


def wire_factor(op: str, nranks: int) -> float:
    """Bytes one rank sends per byte of the collective's size D, bandwidth-optimally
    (shared/REFERENCE.md §1.7; nccl-tests doc/PERFORMANCE.md): all-reduce 2(N-1)/N,
    all-gather, reduce-scatter and all-to-all (N-1)/N (0 on one rank), point-to-point,
    broadcast and host copies 1."""
    n = nranks
    if op == "all_reduce":
        return 2 * (n - 1) / n if n > 1 else 0.0
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n if n > 1 else 0.0
    return 1.0


def ring_steps(op: str, nranks: int) -> int:
    """Steps of a ring over N ranks: 2(N-1) for all-reduce (reduce-scatter then all-gather),
    N-1 for all-gather, reduce-scatter and all-to-all."""
    return 2 * (nranks - 1) if op == "all_reduce" else nranks - 1


def bus_bandwidth_factor(op: str, nranks: int) -> float:
    """nccl-tests busbw = algbw * factor (doc/PERFORMANCE.md): the wire factor, 1 on one rank."""
    return 1.0 if nranks <= 1 else wire_factor(op, nranks)
