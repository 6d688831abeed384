"""How the transformer layers are cut into (virtual) pipeline stages: ``parallelism.stage_layers``
(a count per stage) or an even split. A stage is one of the ``pp * virtual_stages`` virtual
stages in model order; pipeline rank ``p`` holds stages ``p, p + pp, ...``.
"""

from __future__ import annotations

import math

from simulator.errors import InfeasibleError

__all__ = ["stage_layer_counts"]


def stage_layer_counts(pp: int, virtual_stages: int, layers: int, stage_layers: list[int] | None) -> tuple[int, ...]:
    """Transformer layers of each virtual stage, in model order (``pp * virtual_stages`` entries).

    An even split when pp*v divides the layers; otherwise, as Llama 3 did for 126 layers
    on 16 stages, one layer fewer on the last (and then first) stage, which also carry the
    logits (and embedding); deficits beyond two layers need ``stage_layers``.
    """
    stages = pp * virtual_stages
    if stage_layers is not None:
        if len(stage_layers) != stages or sum(stage_layers) != layers:
            raise InfeasibleError(
                f"stage_layers needs one entry per (virtual) pipeline stage, pp*virtual_stages = {stages}, "
                f"summing to model.layers={layers}; got {len(stage_layers)} summing to {sum(stage_layers)}",
                field="parallelism.stage_layers",
            )
        return tuple(stage_layers)
    per = math.ceil(layers / stages)
    deficit = per * stages - layers
    if deficit == 0:
        return (per,) * stages
    if deficit <= 2 and stages >= 2 and per >= 2:
        counts = [per] * stages
        counts[-1] -= 1
        if deficit == 2:
            counts[0] -= 1
        return tuple(counts)
    raise InfeasibleError(
        f"pp*virtual_stages = {pp}*{virtual_stages} = {stages} does not divide model.layers={layers}; "
        "set parallelism.stage_layers to split them unevenly",
        field="parallelism.pp",
    )
