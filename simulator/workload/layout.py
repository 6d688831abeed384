"""Where the model's layers and parameters live: pipeline chunks and per-stage parameter lists.

The model is cut into *units* executed in order: 0 = the embedding, ``layer + 1`` =
transformer block ``layer``, ``layers + 1`` = the final norm, output projection and loss.
A :class:`Chunk` is one virtual pipeline stage, a contiguous run of blocks plus the
embedding (first chunk) and the logits (last chunk); pipeline rank ``p`` holds chunks
``p, p + pp, ...`` (interleaved schedules). Multi-token prediction layer ``k`` (model
``mtp_layers``, on the last chunk) is two units: ``layers + 2 + 2k``, a block at layer index
``layers + k`` (its norms, 2h -> h projection and transformer layer), and ``layers + 3 + 2k``,
its final norm, output layer and loss, costed as the logits (Megatron-Core
multi_token_prediction.py:1157-1252 and process_mtp_loss :1012-1030, NVIDIA/Megatron-LM@d98e8a64);
they run after the last block, before the model's own logits.
Under DualPipe the model is held twice, once per
direction: chunks ``0 .. pp-1`` are the stages of the forward direction (stage ``s`` on rank
``s``), chunks ``pp .. 2pp-1`` the same stages again for the reverse direction (chunk ``pp + s``
on rank ``pp - 1 - s``), so each rank holds stage ``r`` and stage ``pp - 1 - r`` and twice a
1F1B rank's parameters (DeepSeek-V3 technical report, arXiv:2412.19437 §3.2.1 and Table 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import replace as _replace
from typing import Any, Literal

from simulator.costs.flops import ParamCounts, param_counts
from simulator.costs.moe import expert_params, moe_mlp_params
from simulator.scenario.spec import Scenario
from simulator.workload.data_parallel.buckets import Param

__all__ = ["Chunk", "ModelLayout", "UnitKind"]

UnitKind = Literal["embedding", "block", "logits"]


@dataclass(frozen=True)
class Chunk:
    """One virtual pipeline stage: a contiguous run of layers (plus embedding / logits)."""

    index: int
    layers: tuple[int, ...]
    embedding: bool
    logits: bool
    mtp: int = 0  # multi-token prediction layers (the last chunk only)


@dataclass
class ModelLayout:
    """The scenario's model cut into chunks, with the parameters each tensor-parallel rank holds."""

    scenario: Scenario
    counts: ParamCounts = field(init=False)
    chunks: list[Chunk] = field(init=False)
    _stage_params: dict[int, list[Param]] = field(init=False, default_factory=dict)
    _numel: dict[tuple[Any, ...], int] = field(init=False, default_factory=dict)
    _unit_params: dict[int, dict[int, list[Param]]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        m = self.scenario.model
        self.counts = param_counts(
            layers=m.layers, hidden=m.hidden, heads=m.heads, kv_heads=m.n_kv_heads, ffn_hidden=m.ffn,
            vocab=m.vocab, seq_len=m.seq_len, mlp=m.mlp, norm=m.norm, position_embedding=m.position_embedding,
            tied_embeddings=m.tied_embeddings, bias=m.bias, head_dim=m.head_dim,
        )
        if m.mla is not None:  # the MHA projections replaced by MLA's (scenario/moe.py MlaSpec)
            q, kv = m.mla.projection_params(m.hidden, m.heads)
            q_width = m.heads * m.head_dim
            mha = m.hidden * (q_width + 2 * m.n_kv_heads * m.head_dim) + q_width * m.hidden
            mla = q + kv + m.heads * m.mla.v_head_dim * m.hidden
            self.counts = _replace(self.counts, per_layer=self.counts.per_layer - mha + mla)
        if m.moe:
            total, active = moe_mlp_params(hidden=m.hidden, experts=m.experts, top_k=m.top_k, shared=m.shared_experts,
                                           expert_ffn=m.expert_ffn, mlp=m.mlp)
            dense = (3 if m.mlp == "swiglu" else 2) * m.hidden * m.ffn + (
                ((2 if m.mlp == "swiglu" else 1) * m.ffn + m.hidden) if m.bias else 0)
            self.counts = _replace(self.counts, moe_layers=m.n_moe_layers, moe_extra=total - dense,
                                   moe_active_extra=active - dense)
        counts = self.scenario.stage_layer_counts
        chunks, start = [], 0
        last = len(counts) - 1
        for i, n in enumerate(counts):
            chunks.append(Chunk(i, tuple(range(start, start + n)), i == 0, i == last, m.mtp_layers if i == last else 0))
            start += n
        if self.scenario.parallelism.pipeline_schedule == "dualpipe":  # the reverse direction's copy
            pp = len(counts)
            chunks += [Chunk(pp + c.index, c.layers, c.embedding, c.logits) for c in chunks]
        self.chunks = chunks

    # chunks and units ----------------------------------------------------------------------

    @property
    def dualpipe(self) -> bool:
        return self.scenario.parallelism.pipeline_schedule == "dualpipe"

    def chunk_of(self, pp_rank: int, local_chunk: int) -> Chunk:
        pp = self.scenario.parallelism.pp
        if self.dualpipe and local_chunk == 1:
            return self.chunks[2 * pp - 1 - pp_rank]
        return self.chunks[local_chunk * pp + pp_rank]

    def rank_of(self, chunk_index: int) -> int:
        """The pipeline rank holding chunk ``chunk_index`` (module docstring)."""
        pp = self.scenario.parallelism.pp
        if self.dualpipe and chunk_index >= pp:
            return 2 * pp - 1 - chunk_index
        return chunk_index % pp

    def chunks_of_stage(self, pp_rank: int) -> list[Chunk]:
        par = self.scenario.parallelism
        return [self.chunk_of(pp_rank, c) for c in range(2 if self.dualpipe else par.virtual_stages)]

    def units_of(self, chunk: Chunk) -> list[int]:
        """Units of a chunk in forward order: 0 = embedding, layer + 1, the multi-token prediction
        layers' pairs layers + 2 + 2k and layers + 3 + 2k, layers + 1 = logits."""
        layers = self.scenario.model.layers
        units = [0] if chunk.embedding else []
        units += [layer + 1 for layer in chunk.layers]
        units += [layers + 2 + u for u in range(2 * chunk.mtp)]
        if chunk.logits:
            units.append(layers + 1)
        return units

    def unit_kind(self, unit: int) -> tuple[UnitKind, int]:
        """(kind, layer index) of a unit; the layer is -1 for the embedding, ``layers`` for the
        logits; multi-token prediction layer k is a block at ``layers + k`` and logits at
        ``layers + 1 + k``."""
        layers = self.scenario.model.layers
        if unit == 0:
            return "embedding", -1
        if unit == layers + 1:
            return "logits", layers
        if unit > layers + 1:
            k, head = divmod(unit - layers - 2, 2)
            return ("logits", layers + 1 + k) if head else ("block", layers + k)
        return "block", unit - 1

    # parameters ----------------------------------------------------------------------------

    def chunk_params(self, chunk: Chunk) -> list[Param]:
        """Parameters one tensor-parallel rank holds for ``chunk``, in definition order.

        Column-parallel weights and biases (qkv, fc1) and row-parallel weights (proj, fc2)
        are split by tp; row-parallel biases and norms are replicated; embeddings are
        vocab-parallel. With tied embeddings the last pipeline stage keeps its own copy of the
        matrix for the output projection (Megatron).
        """
        m, t = self.scenario.model, self.scenario.parallelism.tp
        d = m.head_dim
        norm = (2 if m.norm == "layernorm" else 1) * m.hidden
        n_up = 2 if m.mlp == "swiglu" else 1
        qkv_width = (m.heads + 2 * m.n_kv_heads) * d
        bias = 1 if m.bias else 0
        params: list[Param] = []
        if chunk.embedding:
            params.append(Param("embedding", self.counts.embedding // t + self.counts.position, 0))
        for layer in chunk.layers + tuple(range(m.layers, m.layers + chunk.mtp)):  # MTP blocks after the last
            u = self.block_unit(layer)
            qkv, proj = (m.hidden * qkv_width + bias * qkv_width) // t, m.hidden * m.hidden // t + bias * m.hidden
            if m.mla is not None:  # down-projections and latent norms replicated, up / out split by heads
                qkv, proj = sum(m.mla.projection_params(m.hidden, m.heads, t)), m.heads * m.mla.v_head_dim * m.hidden // t
            params += [
                Param(f"l{layer}.ln1", norm, u),
                Param(f"l{layer}.qkv", qkv, u),
                Param(f"l{layer}.proj", proj, u),
                Param(f"l{layer}.ln2", norm, u),
            ]
            if m.is_moe_layer(layer):
                params += self._moe_params(layer)
                continue
            params += [
                Param(f"l{layer}.fc1", (n_up * m.hidden * m.ffn + bias * n_up * m.ffn) // t, u),
                Param(f"l{layer}.fc2", m.hidden * m.ffn // t + bias * m.hidden, u),
            ]
        for k in range(chunk.mtp):  # its two input norms and final norm, its 2h -> h projection (no bias)
            u = self.block_unit(m.layers + k)
            params += [Param(f"mtp{k}.norms", 3 * norm, u), Param(f"mtp{k}.eh_proj", 2 * m.hidden * m.hidden // t, u)]
        if chunk.mtp and not chunk.embedding:  # the stage's own embedding for MTP's inputs (gpt_model.py:173-174)
            params.append(Param("mtp.embedding", self.counts.embedding // t + self.counts.position, m.layers + 2))
        if chunk.logits:
            output = self.counts.output or (0 if chunk.embedding else self.counts.embedding)
            params.append(Param("final_norm+output", self.counts.final_norm + output // t, m.layers + 1))
        return params

    def block_unit(self, layer: int) -> int:
        """The unit of block ``layer``; indices from ``layers`` on are the multi-token prediction layers'."""
        layers = self.scenario.model.layers
        return layer + 1 if layer < layers else layers + 2 + 2 * (layer - layers)

    def _moe_params(self, layer: int) -> list[Param]:
        """One rank's share of an MoE layer's MLP: the router (replicated), the shared experts
        (split by tp, as Megatron-Core's SharedExpertMLP) and its ep rank's E/ep routed experts,
        each split by etp. Names ending in ``.experts`` are the expert-parallel parameters."""
        m, par = self.scenario.model, self.scenario.parallelism
        one, u = expert_params(m.hidden, m.expert_ffn, m.mlp), layer + 1
        out = [Param(f"l{layer}.router", m.hidden * m.experts, u)]
        if m.shared_experts:
            out.append(Param(f"l{layer}.shared_experts", m.shared_experts * one // par.tp, u))
        out.append(Param(f"l{layer}.experts", m.experts // par.ep * one // par.expert_tp, u))
        return out

    def expert_params_of_stage(self, pp_rank: int) -> float:
        """The routed-expert parameters one rank of ``pp_rank`` holds (sharded over expert data parallelism)."""
        return float(sum(p.numel for p in self.stage_params(pp_rank) if p.name.endswith(".experts")))

    def params_of_chunk(self, chunk: Chunk) -> float:
        """Elements of :meth:`chunk_params`, summed per kind of part (every dense layer holds
        the same parameters, every MoE layer too; the embedding and logits ends by which of them
        the chunk has): the search asks this of thousands of layouts."""
        m = self.scenario.model
        total = self._kind_numel(("ends", chunk.embedding, chunk.logits, chunk.mtp),
                                 Chunk(-1, (), chunk.embedding, chunk.logits, chunk.mtp))
        for layer in chunk.layers:
            moe = m.is_moe_layer(layer)
            total += self._kind_numel(("layer", moe), Chunk(-1, (layer,), False, False))
        return float(total)

    def _kind_numel(self, key: tuple[Any, ...], chunk: Chunk) -> int:
        found = self._numel.get(key)
        if found is None:
            found = self._numel[key] = sum(p.numel for p in self.chunk_params(chunk))
        return found

    def stage_params(self, pp_rank: int) -> list[Param]:
        found = self._stage_params.get(pp_rank)
        if found is None:
            found = self._stage_params[pp_rank] = [p for c in self.chunks_of_stage(pp_rank) for p in self.chunk_params(c)]
        return found

    def params_of_stage(self, pp_rank: int) -> float:
        return sum(self.params_of_chunk(c) for c in self.chunks_of_stage(pp_rank))

    def unit_params(self, stage: int, unit: int) -> list[Param]:
        """The parameters of ``unit`` in ``stage``, in stage order (grouped once per stage: the
        ZeRO-3 and FSDP emitters ask this for every gather; the list is shared, not to be changed)."""
        by_unit = self._unit_params.get(stage)
        if by_unit is None:
            by_unit = self._unit_params[stage] = {}
            for p in self.stage_params(stage):
                by_unit.setdefault(p.unit, []).append(p)
        return by_unit.get(unit, [])

    def unit_numel(self, stage: int, unit: int) -> float:
        found = self._numel.get(("unit", stage, unit))
        if found is None:
            found = self._numel["unit", stage, unit] = sum(p.numel for p in self.unit_params(stage, unit))
        return float(found)
