"""Context parallelism (ring attention, Megatron-Core CP): the key/value exchange around
each block's attention core.

Before its attention core each rank gathers the other ranks' keys and values, (cp-1)/cp of
the sequence, in a ring of point-to-point steps overlapped with the core's blocks; backward
gathers them again and reduce-scatters their gradients. Modelled as an all-gather (and a
reduce-scatter) of the sequence's K and V over the cp group, overlapped with the compute
step holding the attention core. Registered as the ``cp`` pass of
:mod:`simulator.workload.parallel`.
"""

from __future__ import annotations

from simulator.scenario.spec import ModelSpec
from simulator.workload.model import Shard
from simulator.workload.steps import CommStep, ComputeStep, LayerSpec, Step

__all__ = ["place", "kv_bytes"]


def kv_bytes(model: ModelSpec, shard: Shard) -> float:
    """Keys and values of the whole sequence on one TP rank: 2 * b * s * (kv/t) * d * e."""
    return 2.0 * shard.batch * shard.seq * model.n_kv_heads / shard.tp * model.head_dim * shard.elem


def place(spec: LayerSpec, steps: list[Step]) -> list[Step]:
    """Insert the K/V all-gather before (and the gradient reduce-scatter after) the compute
    step that holds a block's attention core; other layers and cp = 1 are left alone."""
    if spec.shard.cp == 1 or spec.kind != "block":
        return steps
    out: list[Step] = []
    kv = kv_bytes(spec.model, spec.shard)
    for step in steps:
        holds_core = isinstance(step, ComputeStep) and any(
            k.kind == "attention" or k.name.startswith(("scores", "softmax", "attn_v")) for k in step.kernels)
        if holds_core:
            out.append(CommStep("cp.kv.allgather", "all_gather", kv, overlap=True, axis="cp"))
            if spec.phase == "bwd":
                out.append(step)
                out.append(CommStep("cp.dkv.reduce_scatter", "reduce_scatter", kv, overlap=False, axis="cp"))
                continue
        out.append(step)
    return out
