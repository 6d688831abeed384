"""Memory of an MoE layer's token dispatch beyond its stored activations (pure functions).

**Transient tensors** (:func:`dispatch_transient_bytes`). What the dispatch and combine of one
MoE layer allocate and free inside its forward, and mirror in its backward, on one rank;
Megatron-Core at d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/core/transformer/moe/
token_dispatcher.py (TD) and moe_utils.py. Tn: the tokens a rank routes, k: top-k, f: the busiest
EP rank's load factor, R = ``f x Tn x k`` the rows a rank receives, G = ``etp x R`` the rows its
routed experts see (after the expert-TP all-gather), L = E / ep its local experts.

``alltoall`` (MoEAlltoAllTokenDispatcher), forward:

1. ``permute`` (TD:671): the rank's tokens copied once per chosen expert, ``Tn x k`` rows;
2. the dispatch all-to-all (TD:705) into a new ``R``-row tensor (``all_to_all`` allocates its
   output, tensor_parallel/mappings.py:438-446; with one rank it returns its input, :435);
   the permuted tokens are freed once it is done;
3. expert-TP all-gather (TD:746, etp > 1): ``G`` rows;
4. with L > 1, ``sort_chunks_by_idxs`` (TD:782) copies them into local-expert order: the copy
   is the routed experts' fc1 input, which fc1 keeps for its weight gradient (a stored
   activation, :func:`~simulator.workload.activations.moe_layer_bytes`); the unsorted one is freed;
5. the combine mirrors it: the experts' fc2 output (``G`` rows, not saved), its copy back into
   rank order (TD:817, L > 1), the expert-TP reduce-scatter (TD:829, ``R`` rows), the combine
   all-to-all (TD:864, ``Tn x k`` rows) and ``unpermute`` (TD:891) into the layer's ``Tn`` rows.

None of these is saved for the backward (the permutations' backward needs only their index
maps). The largest set alive at once is on the combine side, where every stored tensor of the
layer is also alive: the fc2 output and its rank-order copy, ``2G`` rows (L > 1); with one local
expert the fc2 output and the reduce-scatter output, ``G + R`` (etp > 1), or the combine's input
and output, ``R + Tn x k`` (etp = 1). The backward runs the same tensors' gradients in the
opposite order (the combine's gradient is dispatched, the dispatch's combined), so its largest set
is the same.

``allgather`` (MoEAllGatherTokenDispatcher): every rank of the etp x ep group gathers all
``ep x etp x Tn`` tokens (TD:299), permutes the ``G`` rows routed to its experts (TD:323, kept as
fc1's input) and, on the way back, unpermutes the fc2 output into an ``ep x etp x Tn``-row tensor
(TD:346) which it reduce-scatters (TD:366): ``G + ep x etp x Tn`` rows at once.

``deepep`` (MoEFlexTokenDispatcher with DeepEP): DeepEP's dispatch (TD:1320) returns the tokens
the rank receives, each once (at most ``G`` rows; counted as ``G``, an upper bound: a token
reaches a rank for one or more of its experts), which ``permute`` (TD:1446) copies into expert
order (``G`` rows, kept); the combine side unpermutes the fc2 output (TD:1460) before DeepEP's
combine (TD:1379): ``2G`` rows at once.

The router's own tensors come beside them: its logits, scores and routing probabilities, each
``Tn x E`` (router.py:106-111, moe_utils.py ``topk_routing_with_score_function``: the probabilities
sparse over [tokens, experts]) in fp32 (``moe_router_dtype`` fp32, which DeepEP requires, TD:1315,
and the Megatron-Bridge DeepSeek-V3 bridge sets, deepseek_v3_bridge.py:75 at NVIDIA-NeMo/
Megatron-Bridge@067f987df), and the boolean routing map (``Tn x E`` bytes, kept by the dispatcher
until the combine, TD:643): ``Tn x E x 13`` bytes.

**DeepEP's buffers** (:func:`deepep_buffer_bytes`). Megatron-Core's ``get_buffer``
(megatron/core/transformer/moe/fused_a2a.py:36-69 at d98e8a6) creates one DeepEP ``Buffer`` for
the dispatcher's group, sized by the larger of DeepEP's dispatch and combine configs' hints for
``hidden_bytes = h x max(element size, 2)`` (:24-33: 2h for bf16 and fp8 tokens alike). DeepEP
(https://github.com/deepseek-ai/DeepEP at 0aaa6744c890c5af051f622252975c4393795000) allocates it
once at init, outside PyTorch's caching allocator: the NVLink buffer with ``cudaMalloc``
(csrc/deep_ep.cpp:54), a 32 MiB workspace (:67, ``NUM_WORKSPACE_BYTES`` csrc/kernels/configs.cuh:5)
and, when the group spans nodes, the RDMA buffer from NVSHMEM's symmetric heap (:239), which maps
physical memory in granules of ``NVSHMEM_CUMEM_GRANULARITY`` = 512 MiB (deep_ep/buffer.py:119).
The hints (csrc/config.hpp:51-103), with C = SMs / 2 channels, n = min(ranks, 8) NVLink peers,
r = max(ranks / 8, 1) RDMA ranks, 8-byte top-k indices (``TOPK_IDX_BITS`` 64), 128 top-k slots
and 128 scales, an 8-byte ``SourceMeta`` (csrc/kernels/internode.cu:17-42), and the config's NVL
and RDMA receive-chunk tokens N and M (deep_ep/buffer.py:230-287):

* NVL: ``C n (2r + 3) 4 + C n N (hidden_bytes + 8 + 128 x 8 + 128 x 4 + 128 x 4)``;
* RDMA (0 within one node): ``C r (2 x 8 + 2) 2 x 4 + 2 C r M (hidden_bytes + 8 + 128 x 8 +
  128 x 4 + 128 x 4 + 16)``;

each rounded up to 128 bytes.
"""

from __future__ import annotations

import math

__all__ = ["dispatch_transient_rows", "dispatch_transient_bytes", "router_bytes", "ROUTER_BYTES_PER_SCORE",
           "DEEPEP_DISPATCH_CONFIGS", "DEEPEP_COMBINE_CONFIGS", "DeepepBuffers", "deepep_nvl_hint",
           "deepep_rdma_hint", "deepep_buffer_bytes"]

# the router's logits, scores and probabilities in fp32 and its boolean routing map, per (token, expert)
ROUTER_BYTES_PER_SCORE = 3 * 4 + 1


def dispatch_transient_rows(*, tokens: float, top_k: int, experts: int, ep: int, etp: int, factor: float,
                            dispatcher: str) -> float:
    """Hidden-state rows the dispatch and combine of one MoE layer hold at once beyond the
    stored activations (module docstring)."""
    routed = tokens * top_k
    received = factor * routed
    gathered = etp * received
    if dispatcher == "allgather":
        return gathered + ep * etp * tokens
    if dispatcher == "deepep" or experts > ep:
        return 2.0 * gathered
    return gathered + received if etp > 1 else received + routed


def router_bytes(*, tokens: float, experts: int) -> float:
    """The router's transient tensors: ``Tn x E x 13`` bytes (module docstring)."""
    return tokens * experts * ROUTER_BYTES_PER_SCORE


def dispatch_transient_bytes(*, tokens: float, hidden: int, top_k: int, experts: int, ep: int, etp: int,
                             factor: float, dispatcher: str, act_bytes: int) -> float:
    """Transient bytes of one MoE layer's token dispatch on one rank: its largest set of
    dispatch / combine tensors (:func:`dispatch_transient_rows` x ``h x act_bytes``) and the
    router's tensors (:func:`router_bytes`).

    Mixtral 8x7B, ep 8, micro-batch 1, seq 4096, tp 1, top-2, h 4096, bf16, balanced (f = 1):
    one local expert, etp 1, so the combine's input and output, ``R + Tn x k = 8192 + 8192`` rows,
    ``16384 x 4096 x 2 = 134,217,728`` bytes, and the router's ``4096 x 8 x 13 = 425,984``."""
    rows = dispatch_transient_rows(tokens=tokens, top_k=top_k, experts=experts, ep=ep, etp=etp, factor=factor,
                                   dispatcher=dispatcher)
    return rows * hidden * act_bytes + router_bytes(tokens=tokens, experts=experts)


# DeepEP's recommended configs by group size: (NVL send, NVL receive, RDMA send, RDMA receive)
# chunk tokens (deep_ep/buffer.py:242-255 and :272-285 at 0aaa674; the SM count comes from Buffer.num_sms)
DEEPEP_DISPATCH_CONFIGS: dict[int, tuple[int, int, int, int]] = {
    2: (24, 256, 6, 128), 4: (6, 256, 6, 128), 8: (6, 256, 6, 128), 16: (36, 288, 20, 128),
    24: (32, 288, 8, 128), 32: (32, 288, 8, 128), 48: (32, 288, 8, 128), 64: (32, 288, 8, 128),
    96: (20, 480, 12, 128), 128: (20, 560, 12, 128), 144: (32, 720, 12, 128), 160: (28, 720, 12, 128)}
DEEPEP_COMBINE_CONFIGS: dict[int, tuple[int, int, int, int]] = {
    2: (10, 256, 6, 128), 4: (9, 256, 6, 128), 8: (4, 256, 6, 128), 16: (4, 288, 12, 128),
    24: (1, 288, 8, 128), 32: (1, 288, 8, 128), 48: (1, 288, 8, 128), 64: (1, 288, 8, 128),
    96: (1, 480, 8, 128), 128: (1, 560, 8, 128), 144: (2, 720, 8, 128), 160: (2, 720, 8, 128)}

_NVL_PEERS = 8  # NUM_MAX_NVL_PEERS, csrc/kernels/configs.cuh:3
_TOPK_IDX, _MAX_TOPK, _MAX_SCALES, _SOURCE_META = 8, 128, 128, 8
_WORKSPACE_BYTES = 32 * 2**20  # NUM_WORKSPACE_BYTES
_NVSHMEM_GRANULE = 2**29  # NVSHMEM_CUMEM_GRANULARITY set by deep_ep/buffer.py:119


def _align128(n: int) -> int:
    return (n + 127) // 128 * 128


def _aligned_rdma_recv(send: int, recv: int) -> int:
    """Config's constructor rounds the RDMA receive tokens up to a multiple of the send tokens (config.hpp:45)."""
    return math.ceil(recv / send) * send


def deepep_nvl_hint(hidden_bytes: int, ranks: int, sms: int, recv_tokens: int) -> int:
    """``Config::get_nvl_buffer_size_hint`` (module docstring)."""
    channels, nvl, rdma = sms // 2, min(ranks, _NVL_PEERS), max(ranks // _NVL_PEERS, 1)
    per_token = hidden_bytes + _SOURCE_META + _MAX_TOPK * _TOPK_IDX + _MAX_TOPK * 4 + _MAX_SCALES * 4
    return _align128(channels * nvl * (2 * rdma + 3) * 4 + channels * nvl * recv_tokens * per_token)


def deepep_rdma_hint(hidden_bytes: int, ranks: int, sms: int, recv_tokens: int) -> int:
    """``Config::get_rdma_buffer_size_hint`` (module docstring; 0 within one node)."""
    if ranks <= _NVL_PEERS:
        return 0
    channels, rdma = sms // 2, ranks // _NVL_PEERS
    per_token = hidden_bytes + _SOURCE_META + _MAX_TOPK * _TOPK_IDX + _MAX_TOPK * 4 + _MAX_SCALES * 4 + 16
    return _align128(channels * rdma * (_NVL_PEERS * 2 + 2) * 2 * 4 + 2 * channels * rdma * recv_tokens * per_token)


class DeepepBuffers(tuple[int, int, int]):
    """(NVLink buffer, RDMA buffer as NVSHMEM maps it, workspace) bytes of one DeepEP ``Buffer``."""

    @property
    def total(self) -> int:
        return sum(self)


def deepep_buffer_bytes(hidden: int, act_bytes: int, ranks: int, sms: int) -> DeepepBuffers:
    """The bytes DeepEP allocates once per rank for Megatron-Core's dispatcher group of
    ``ranks`` (module docstring); ``sms``: ``Buffer.num_sms`` (Megatron's
    ``moe_flex_dispatcher_num_sms``, default 20). Raises ``ValueError`` for a group size DeepEP
    has no config for (``get_dispatch_config`` asserts; callers check ``DEEPEP_DISPATCH_CONFIGS``).

    DeepSeek-V3 (h 7168, bf16: hidden_bytes 14,336) over 64 ranks with 20 SMs: 10 channels, 8
    NVLink peers, 8 RDMA ranks, receive tokens 288 (NVL) and 128 (RDMA) in both configs. NVL:
    ``10 x 8 x 19 x 4 + 10 x 8 x 288 x (14336 + 8 + 1024 + 512 + 512) = 6,080 + 23,040 x 16,392
    = 377,677,760``, aligned 377,677,824; RDMA: ``10 x 8 x 18 x 8 + 2 x 10 x 8 x 128 x 16,408 =
    11,520 + 336,035,840 = 336,047,360``, mapped as one 512 MiB granule (536,870,912); with the
    32 MiB workspace (33,554,432): 948,103,168 bytes (0.883 GiB)."""
    if ranks <= 1:
        return DeepepBuffers((0, 0, 0))
    if ranks not in DEEPEP_DISPATCH_CONFIGS:
        raise ValueError(f"DeepEP has no config for {ranks} ranks")
    hidden_bytes = hidden * max(act_bytes, 2)
    nvl = rdma = 0
    for config in (DEEPEP_DISPATCH_CONFIGS[ranks], DEEPEP_COMBINE_CONFIGS[ranks]):
        _, nvl_recv, rdma_send, rdma_recv = config
        nvl = max(nvl, deepep_nvl_hint(hidden_bytes, ranks, sms, nvl_recv))
        rdma = max(rdma, deepep_rdma_hint(hidden_bytes, ranks, sms, _aligned_rdma_recv(rdma_send, rdma_recv)))
    mapped = math.ceil(rdma / _NVSHMEM_GRANULE) * _NVSHMEM_GRANULE
    return DeepepBuffers((nvl, mapped, _WORKSPACE_BYTES))
