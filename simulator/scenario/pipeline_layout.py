"""How the transformer layers are cut into (virtual) pipeline stages.

Three ways, in order of precedence: ``parallelism.pipeline_layout`` (Megatron-Core's
``pipeline_model_parallel_layout`` string), ``parallelism.stage_layers`` (a count per
stage) or an even split. A stage is one of the ``pp * virtual_stages`` virtual stages in
model order; pipeline rank ``p`` holds stages ``p, p + pp, ...`` (Megatron-Core
PipelineParallelLayerLayout.__init__: ``layout[vpp_rank * pp + pp_rank]``,
NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553
megatron/core/transformer/pipeline_parallel_layer_layout.py:49-55). The embedding sits on
the first stage and the output layer and loss on the last, so a stage holding one of them
may hold no transformer layer.

The layout string (same file, ``parse_str_to_list``, :283-321): stages separated by ``|``,
``E`` the embedding, ``t`` a transformer layer, ``L`` the loss (final norm, output layer,
loss), ``m`` a multi-token-prediction layer (as many as ``model.mtp_layers``; dtsim keeps them
on the last stage, where Megatron-Core puts them without a layout); ``(...)*n`` repeats a group and ``x*n`` a
character n times; commas are cosmetic. ``Et|(tt|)*30L`` is 32 stages: the embedding and
one layer, thirty stages of two layers, then the loss alone.
"""

from __future__ import annotations

import math
import re

from simulator.errors import InfeasibleError, ScenarioError

__all__ = ["parse_layout", "stage_layer_counts"]

LAYOUT_FIELD = "parallelism.pipeline_layout"
_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_CHAR = re.compile(r"(.)\*(\d+)")
_MAX_CHARS = 1_000_000  # far beyond any model's layers and stages


def parse_layout(text: str) -> list[str]:
    """The stages of a Megatron-Core layout string, each a string of ``E``/``t``/``m``/``L``."""
    def repeat(group: re.Match[str]) -> str:
        if len(group.group(1)) * int(group.group(2)) > _MAX_CHARS:
            raise ScenarioError(f"pipeline_layout {text!r} expands to over {_MAX_CHARS:,} characters",
                                field=LAYOUT_FIELD)
        return group.group(1) * int(group.group(2))

    expanded = text.replace(",", "").replace(" ", "")
    while _GROUP.search(expanded):  # innermost groups first
        expanded = _GROUP.sub(repeat, expanded)
    expanded = _CHAR.sub(repeat, expanded)
    bad = sorted(set(expanded) - set("EtmL|"))
    if bad:
        raise ScenarioError(
            f"pipeline_layout {text!r}: unknown character(s) {''.join(bad)!r} after expanding repeats; "
            "known: E (embedding), t (transformer layer), m (multi-token prediction), L (loss), | (next stage)",
            field=LAYOUT_FIELD,
        )
    return expanded.split("|")


def _layout_counts(text: str, stages: int, layers: int, mtp_layers: int) -> tuple[int, ...]:
    parsed = parse_layout(text)
    if len(parsed) != stages:
        raise InfeasibleError(
            f"pipeline_layout {text!r} has {len(parsed)} stages; pp*virtual_stages = {stages}", field=LAYOUT_FIELD)
    joined = "".join(parsed)
    if joined.count("E") != 1 or not parsed[0].startswith("E"):
        raise InfeasibleError(
            f"pipeline_layout {text!r}: the embedding (E) must appear once, first in the first stage",
            field=LAYOUT_FIELD)
    if joined.count("L") != 1 or not parsed[-1].endswith("L"):
        raise InfeasibleError(
            f"pipeline_layout {text!r}: the loss (L) must appear once, last in the last stage", field=LAYOUT_FIELD)
    mtp = joined.count("m")
    if mtp != mtp_layers:
        raise InfeasibleError(f"pipeline_layout {text!r} places {mtp} multi-token-prediction layers (m); "
                              f"model.mtp_layers={mtp_layers}", field=LAYOUT_FIELD)
    if mtp and not re.fullmatch(r"t*m+L", parsed[-1]):
        raise InfeasibleError(f"pipeline_layout {text!r}: dtsim places the multi-token-prediction layers (m) on the "
                              "last stage, after its transformer layers and before the loss", field=LAYOUT_FIELD)
    counts = tuple(stage.count("t") for stage in parsed)
    if sum(counts) != layers:
        raise InfeasibleError(
            f"pipeline_layout {text!r} places {sum(counts)} transformer layers (t); model.layers={layers}",
            field=LAYOUT_FIELD)
    _no_empty_stage(counts, LAYOUT_FIELD)
    return counts


def _no_empty_stage(counts: tuple[int, ...], field: str) -> None:
    """Only the first stage (embedding) and the last (loss) may hold no transformer layer."""
    empty = [i for i, n in enumerate(counts) if n == 0 and 0 < i < len(counts) - 1]
    if empty:
        raise InfeasibleError(
            f"virtual stage {empty[0]} holds no transformer layer; only the first (embedding) and the last "
            "(loss) stage may be without one", field=field)


def stage_layer_counts(pp: int, virtual_stages: int, layers: int, stage_layers: list[int] | None,
                       pipeline_layout: str | None, mtp_layers: int = 0) -> tuple[int, ...]:
    """Transformer layers of each virtual stage, in model order (``pp * virtual_stages`` entries).

    Without a layout or ``stage_layers``: an even split when pp*v divides the layers;
    otherwise, as Llama 3 did for 126 layers on 16 stages, one layer fewer on the last (and
    then first) stage, which also carry the logits (and embedding); deficits beyond two
    layers need ``stage_layers`` or ``pipeline_layout``.
    """
    stages = pp * virtual_stages
    if pipeline_layout is not None:
        if stage_layers is not None:
            raise ScenarioError("give either stage_layers or pipeline_layout, not both", field=LAYOUT_FIELD)
        return _layout_counts(pipeline_layout, stages, layers, mtp_layers)
    if stage_layers is not None:
        if len(stage_layers) != stages or sum(stage_layers) != layers:
            raise InfeasibleError(
                f"stage_layers needs one entry per (virtual) pipeline stage, pp*virtual_stages = {stages}, "
                f"summing to model.layers={layers}; got {len(stage_layers)} summing to {sum(stage_layers)}",
                field="parallelism.stage_layers",
            )
        counts = tuple(stage_layers)
        _no_empty_stage(counts, "parallelism.stage_layers")
        return counts
    per = math.ceil(layers / stages)
    deficit = per * stages - layers
    if deficit == 0:
        return (per,) * stages
    if deficit <= 2 and stages >= 2 and per >= 2:
        counts_list = [per] * stages
        counts_list[-1] -= 1
        if deficit == 2:
            counts_list[0] -= 1
        return tuple(counts_list)
    raise InfeasibleError(
        f"pp*virtual_stages = {pp}*{virtual_stages} = {stages} does not divide model.layers={layers}; "
        "set parallelism.stage_layers or parallelism.pipeline_layout to split them unevenly",
        field="parallelism.pp",
    )
