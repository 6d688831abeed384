"""Activation memory of one micro-batch on one rank, by unit, as the workload allocates it.

The sizes come from the pure formulas of :mod:`simulator.costs.memory` (Korthikanti et al.
2022); this module only binds them to a scenario's shapes and parallel layout, once, so the
workload builder and the memory pre-estimate use the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.costs.memory import (
    backward_workspace_bytes,
    embedding_activation_bytes,
    layer_activation_bytes,
    logits_activation_bytes,
)
from simulator.scenario.spec import Scenario
from simulator.workload.model import Shard

__all__ = ["ActivationSizes", "shard_of"]


def shard_of(scenario: Scenario) -> Shard:
    """What one rank holds of one micro-batch under the scenario's layout."""
    par, train = scenario.parallelism, scenario.training
    return Shard(batch=train.micro_batch, seq=scenario.model.seq_len, tp=par.tp, cp=par.cp,
                 sequence_parallel=par.sequence_parallel and par.tp > 1, precision=train.precision,
                 attention_kernel=scenario.attention_kernel)


@dataclass(frozen=True)
class ActivationSizes:
    """Bytes one rank stores per micro-batch (``per_layer`` under the recompute policy,
    ``full_layer`` without it), and the transient ``backward_workspace`` of one block."""

    per_layer: float
    full_layer: float
    backward_workspace: float
    embedding: float
    logits: float

    @classmethod
    def of(cls, scenario: Scenario) -> ActivationSizes:
        m, par, train = scenario.model, scenario.parallelism, scenario.training
        shard = shard_of(scenario)

        def layer(recompute: str) -> float:
            return layer_activation_bytes(
                seq=m.seq_len, batch=train.micro_batch, hidden=m.hidden, heads=m.heads, kv_heads=m.n_kv_heads,
                ffn_hidden=m.ffn, mlp=m.mlp, tp=par.tp, cp=par.cp, sequence_parallel=shard.sequence_parallel,
                recompute=recompute, flash_attention=shard.flash, dropout=m.dropout,
                act_bytes=shard.elem,
            )

        full = layer("none")
        workspace = backward_workspace_bytes(
            tokens=shard.tokens, hidden=m.hidden, ffn_hidden=m.ffn, mlp=m.mlp, tp=shard.tp, act_bytes=shard.elem,
            recomputed_layer_bytes=full if train.recompute == "full" else 0.0)
        embedding = embedding_activation_bytes(seq=m.seq_len, batch=train.micro_batch, hidden=m.hidden, tp=par.tp,
                                               cp=par.cp, sequence_parallel=shard.sequence_parallel,
                                               dropout=m.dropout, act_bytes=shard.elem)
        logits = logits_activation_bytes(seq=m.seq_len, batch=train.micro_batch, hidden=m.hidden, vocab=m.vocab,
                                         tp=par.tp, cp=par.cp, sequence_parallel=shard.sequence_parallel,
                                         act_bytes=shard.elem)
        return cls(layer(train.recompute), full, workspace, embedding, logits)

    def stored(self, kind: str) -> float:
        """Bytes a unit of ``kind`` stores for its backward."""
        return {"embedding": self.embedding, "logits": self.logits, "block": self.per_layer}[kind]
