"""In-layer parallelisms: passes that rewrite one layer's steps, registered by mesh axis.

Each pass is a function ``(LayerSpec, steps) -> steps`` that regroups a layer's kernels and
inserts the collectives its axis needs (tensor/sequence parallelism: :mod:`.tensor`;
context parallelism: :mod:`.context`). :func:`layer_steps` starts from the layer with no
parallelism (:func:`~simulator.workload.steps.base_steps`) and applies the registered passes
in order. Adding one (e.g. an expert pass) is a module plus an entry in :data:`LAYER_PASSES`.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.workload.parallel import context, expert, tensor
from simulator.workload.steps import LayerSpec, Step, base_steps, split_casts

__all__ = ["LAYER_PASSES", "LayerPass", "layer_steps"]

LayerPass = Callable[[LayerSpec, list[Step]], list[Step]]

# applied in this order: tensor parallelism decides where its collectives sit, then context
# parallelism wraps the attention core of the result; expert parallelism puts the token
# dispatch and combine around an MoE layer's routed experts
LAYER_PASSES: dict[str, LayerPass] = {"tp": tensor.place, "cp": context.place, "ep": expert.place}


def layer_steps(spec: LayerSpec) -> list[Step]:
    """One layer's steps after every registered in-layer pass, fp8 casts split into steps of their own."""
    steps = base_steps(spec)
    for apply in LAYER_PASSES.values():
        steps = apply(spec, steps)
    return split_casts(steps)
