"""Layers per (virtual) pipeline stage: Megatron-Core layout strings and ``stage_layers``
(scenario/pipeline_layout.py), and the chunks the workload cuts from them."""

from __future__ import annotations

import copy

import pytest

import simulator
from simulator.errors import InfeasibleError, ScenarioError
from simulator.scenario.pipeline_layout import parse_layout, stage_layer_counts
from simulator.scenario.spec import Scenario
from simulator.workload.layout import ModelLayout

# GPT-3 XL: 24 layers, hidden 2048, vocabulary 50257, learned positions (context 2048), tied embeddings
GPT3_XL = {"model": "gpt3-1.3b", "cluster": {"node": "p4d.24xlarge", "nodes": 1},
           "parallelism": {"pp": 2, "pipeline_schedule": "interleaved", "virtual_stages": 2},
           "training": {"micro_batch": 1, "global_batch": 16, "precision": "bf16"}}


def _gpt3_xl(**parallelism: object) -> Scenario:
    data = copy.deepcopy(GPT3_XL)
    data["parallelism"].update(parallelism)
    return Scenario.model_validate(data)


def test_the_deepseek_v3_h100_recipe_layout_by_hand() -> None:
    """Megatron-Bridge's H100 DeepSeek-V3 layout 'Et|(tt|)*30mL' (pp 8, vp 4): the group 'tt|'
    repeated 30 times between 'Et|' and 'mL' gives 1 + 30 + 1 = 32 stages and 1 + 30*2 + 0 = 61
    transformer layers, the last stage holding the MTP layer and the loss. Rank p holds stages p, p+8, p+16, p+24: rank 0
    1+2+2+2 = 7, ranks 1-6 4*2 = 8, rank 7 2+2+2+0 = 6 (7 + 6*8 + 6 = 61)."""
    stages = parse_layout("Et|(tt|)*30mL")
    assert stages == ["Et"] + ["tt"] * 30 + ["mL"]
    counts = stage_layer_counts(8, 4, 61, None, "Et|(tt|)*30mL", 1)
    assert counts == (1,) + (2,) * 30 + (0,)
    per_rank = [sum(counts[r::8]) for r in range(8)]
    assert per_rank == [7, 8, 8, 8, 8, 8, 8, 6]


def test_commas_and_single_character_repeats() -> None:
    """Megatron-Core's docstring example 'Ettt|(tt|)*29,m|L': the comma is cosmetic, so
    [Ettt] + 29 x [tt] + [m] + [L], 32 stages; 'E|t*3|t*2L' is [E], [ttt], [ttL]; nested groups
    expand innermost first: 'E|((t|)*2)*2L' is E|t|t|t|t|L."""
    assert parse_layout("Ettt|(tt|)*29,m|L") == ["Ettt"] + ["tt"] * 29 + ["m", "L"]
    assert parse_layout("E|t*3|t*2L") == ["E", "ttt", "ttL"]
    assert parse_layout("E|((t|)*2)*2L") == ["E", "t", "t", "t", "t", "L"]
    assert stage_layer_counts(3, 1, 5, None, "E|t*3|t*2L") == (0, 3, 2)


@pytest.mark.parametrize(("layout", "error", "says"), [
    ("Et|(tt|)*30mL", InfeasibleError, "places 1 multi-token-prediction layers (m); model.mtp_layers=0"),
    ("Et|(tt|)*29L", InfeasibleError, "31 stages"),
    ("Ex|(tt|)*30L", ScenarioError, "unknown character"),
    ("E(t|)*99999999999L", ScenarioError, "expands to over 1,000,000 characters"),
    ("t|E(tt|)*29t|L", InfeasibleError, "embedding (E)"),
    ("Et|(tt|)*30|L", InfeasibleError, "33 stages"),
    ("Et|(tt|)*29ttL|", InfeasibleError, "loss (L)"),
    ("Et|(tt|)*29t|L", InfeasibleError, "places 60 transformer layers"),
    ("Et|(tt|)*14|(tt|)*14ttt|tL", InfeasibleError, "virtual stage 15 holds no transformer layer"),
])
def test_bad_layouts_name_the_field(layout: str, error: type[Exception], says: str) -> None:
    with pytest.raises(error) as err:
        stage_layer_counts(8, 4, 61, None, layout)
    assert err.value.field == "parallelism.pipeline_layout" and says in str(err.value)  # type: ignore[attr-defined]


def test_stage_layers_may_leave_only_the_end_stages_empty() -> None:
    with pytest.raises(InfeasibleError) as err:
        _gpt3_xl(stage_layers=[8, 0, 8, 8])
    assert err.value.field == "parallelism.stage_layers" and "virtual stage 1" in str(err.value)
    with pytest.raises(ScenarioError) as both:
        _gpt3_xl(stage_layers=[0, 8, 8, 8], pipeline_layout="E|t*8|t*8|t*8L")
    assert both.value.field == "parallelism.pipeline_layout"


def test_embedding_and_loss_stages_hold_what_the_layout_says() -> None:
    """'E|t*8|t*8|t*8L' on pp 2 x vp 2: rank 0 holds stages 0 and 2 (the embedding, 8 layers),
    rank 1 stages 1 and 3 (16 layers, the final norm and the output layer). A GPT-3 XL layer
    is 12h^2 + 13h = 12*2048^2 + 13*2048 = 50,358,272 parameters; the embedding 50257*2048 +
    2048*2048 positions = 107,120,640; the last stage's final layernorm (2*2048) and its own
    copy of the tied output matrix 50257*2048 = 102,930,432. Rank 0: 107,120,640 + 8*50,358,272
    = 509,986,816; rank 1: 16*50,358,272 + 102,930,432 = 908,662,784. stage_layers [0, 8, 8, 8]
    is the same split."""
    layout = ModelLayout(_gpt3_xl(pipeline_layout="E|t*8|t*8|t*8L"))
    assert [layout.params_of_stage(p) for p in (0, 1)] == [509_986_816, 908_662_784]
    first, last = layout.chunks[0], layout.chunks[-1]
    assert (first.layers, first.embedding, last.layers, last.logits) == ((), True, tuple(range(16, 24)), True)
    assert ModelLayout(_gpt3_xl(stage_layers=[0, 8, 8, 8])).chunks == layout.chunks


def test_multi_token_prediction_sits_on_the_last_stage() -> None:
    """model.mtp_layers 1 with 'E|t*8|t*8|t*8mL': the last chunk runs blocks 16-23 (units 17-24),
    the MTP block (unit 24 + 2 = 26, a block at layer index 24) and its logits (unit 27, at
    25), then the model's logits (unit 25). Rank 1 gains the MTP block 50,358,272, its three
    layernorms 3*2*2048 = 12,288, its 2h -> h projection 2*2048*2048 = 8,388,608 and its own
    embedding 107,120,640: 908,662,784 + 165,879,808 = 1,074,542,592; rank 0 keeps 509,986,816.
    The extra block and output layer on the last stage lengthen the step."""
    data = copy.deepcopy(GPT3_XL)
    data["model"] = {"preset": "gpt3-1.3b", "mtp_layers": 1}
    data["parallelism"]["pipeline_layout"] = "E|t*8|t*8|t*8mL"
    layout = ModelLayout(Scenario.model_validate(data))
    assert layout.units_of(layout.chunks[-1]) == [*range(17, 25), 26, 27, 25]
    assert (layout.unit_kind(26), layout.unit_kind(27)) == (("block", 24), ("logits", 25))
    assert [layout.params_of_stage(p) for p in (0, 1)] == [509_986_816, 1_074_542_592]
    assert sum(p.numel for p in layout.stage_params(1)) == 1_074_542_592
    with_mtp = simulator.simulate(layout.scenario).step_time_s
    without = simulator.simulate(_gpt3_xl(pipeline_layout="E|t*8|t*8|t*8L")).step_time_s
    assert with_mtp > without
    data["parallelism"]["pipeline_layout"] = "E|t*8|t*8m|t*8L"
    with pytest.raises(InfeasibleError) as err:
        Scenario.model_validate(data)
    assert err.value.field == "parallelism.pipeline_layout" and "last stage" in str(err.value)
