"""An MoE layer under fp8 (issue 15, issue 12's recipes): the shared and routed experts' GEMMs
run as fp8 linears with their casts, the routed experts' weight casts counting every local
expert, the router bf16. Every number is derived by hand in the test's docstring.

The small MoE: hidden 512, 8 experts, top-2, one shared expert, expert FFN 256 (SwiGLU: fc1
[., 512] x [512, 2*256]), one micro-batch of 1024 tokens, tp 1, ep 4: E/ep = 2 local experts,
balanced routing: 1024 x 2 = 2048 routed rows."""

from __future__ import annotations

import pytest

from simulator.costs.fp8 import Fp8Casting
from simulator.scenario.spec import Scenario
from simulator.workload.data_parallel.base import gathered_bytes_per_element
from simulator.workload.data_parallel.buckets import Param
from simulator.workload.model import Kernel, Shard, backward_of
from simulator.workload.moe import MoeShape, expert_recipe, moe_mlp_forward

SMALL_MOE = {"name": "small-moe", "layers": 2, "hidden": 512, "heads": 4, "ffn_hidden": 1024, "seq_len": 1024,
             "vocab": 32000, "mlp": "swiglu", "norm": "rmsnorm", "position_embedding": "rotary", "bias": False,
             "dropout": False, "tied_embeddings": False, "experts": 8, "experts_per_token": 2, "shared_experts": 1,
             "expert_ffn_hidden": 256}


def _scenario(**fp8: object) -> Scenario:
    return Scenario.model_validate({"model": SMALL_MOE, "cluster": {"node": "dgx-h100", "nodes": 1},
                                    "parallelism": {"ep": 4, "sharding": "zero1"},
                                    "training": {"global_batch": 8, "precision": "fp8", "fp8": fp8}})


def _mlp(casting: Fp8Casting | None, recipe: str | None, edp: int = 2) -> list[Kernel]:
    shard = Shard(batch=1, seq=1024, precision="fp8" if casting else "bf16", fp8=casting)
    moe = MoeShape(ep=4, etp=1, factor=1.0, dispatcher="alltoall", overlap=False, expert_recipe=recipe, edp=edp)
    return moe_mlp_forward(_scenario().model, shard, moe)


def _casts(kernels: list[Kernel], *of: str) -> float:
    return sum(k.nbytes for k in kernels if k.kind == "cast" and k.of.split(".dgrad")[0].split(".wgrad")[0] in of)


def test_routed_expert_gemms_run_fp8_reading_every_local_weight() -> None:
    """experts.fc1 [2048, 512] x [512, 512] over 2 local weights: FLOPs 2*2048*512*512 =
    1,073,741,824 (as bf16); bytes: fp8 input 2048*512 = 1,048,576, fp8 weights 2*512*512 =
    524,288, bf16 output 2048*512*2 = 2,097,152: 3,670,016. experts.fc2 [2048, 256] x [256, 512]:
    FLOPs 536,870,912; bytes 524,288 + 2*256*512 = 262,144 + 2,097,152 = 2,883,584. Backward:
    fc1's dgrad reads the fp8 output gradient (1,048,576) and both weights (524,288) and writes
    the bf16 input gradient (2,097,152): 3,670,016; its wgrad reads the input and gradient
    (2 x 1,048,576) and writes both bf16 weight gradients (2 x 524,288 = 1,048,576): 3,145,728.
    bf16: fc1 moves (1,048,576 + 524,288 + 1,048,576) x 2 = 5,242,880 bytes, forward and both
    backward GEMMs alike. The router stays a bf16 GEMM with no casts."""
    fwd = _mlp(Fp8Casting("tensorwise"), "tensorwise")
    gemms = {k.name: k for k in fwd if k.kind == "gemm"}
    assert gemms["experts.fc1"].precision == "fp8" and gemms["experts.fc1"].groups == 2
    assert gemms["experts.fc1"].flops == 1_073_741_824 and gemms["experts.fc1"].nbytes == 3_670_016
    assert gemms["experts.fc2"].flops == 536_870_912 and gemms["experts.fc2"].nbytes == 2_883_584
    bwd = {k.name: k for k in backward_of(fwd) if k.kind == "gemm"}
    assert bwd["experts.fc1.dgrad"].nbytes == 3_670_016 and bwd["experts.fc1.wgrad"].nbytes == 3_145_728
    assert gemms["router"].precision == "bf16" and not any(k.of == "router" for k in fwd)
    bf16 = {k.name: k for k in _mlp(None, None) if k.kind == "gemm"}
    assert bf16["experts.fc1"].nbytes == 5_242_880 and bf16["experts.fc1"].precision == "bf16"
    assert {k.name: k.nbytes for k in backward_of(_mlp(None, None)) if k.name.startswith("experts.fc1.")} == {
        "experts.fc1.dgrad": 5_242_880, "experts.fc1.wgrad": 5_242_880}


def test_expert_casts_count_each_local_experts_weight() -> None:
    """Tensorwise (torchao, every micro-batch): input 6 bytes per element (amax 2, a cast to both
    layouts 4), weight 5 forward (amax 2, cast 3) and 3 backward, output gradient 6.
    Routed forward: inputs 2048*512 x 6 = 6,291,456 (fc1) + 2048*256 x 6 = 3,145,728 (fc2);
    weights over the 2 local experts 2*512*512 x 5 = 2,621,440 + 2*256*512 x 5 = 1,310,720:
    13,369,344 (one weight per GEMM would be 1,966,080 less). Routed backward: output gradients
    2048*512 x 6 = 6,291,456 for each of fc1 and fc2, weights 524,288 x 3 = 1,572,864 +
    262,144 x 3 = 786,432: 14,942,208. Shared expert (1024 tokens, F 256) forward: inputs
    1024*512 x 6 = 3,145,728 + 1024*256 x 6 = 1,572,864, weights 512*512 x 5 = 1,310,720 +
    256*512 x 5 = 655,360: 6,684,672 (its input cast reads the MoE pre-norm's bf16 output: no
    fused read)."""
    fwd = _mlp(Fp8Casting("tensorwise"), "tensorwise")
    assert _casts(fwd, "experts.fc1", "experts.fc2") == 13_369_344
    assert _casts(backward_of(fwd), "experts.fc1", "experts.fc2") == 14_942_208
    assert _casts(fwd, "shared.fc1", "shared.fc2") == 6_684_672
    assert {k.precision for k in fwd if k.kind == "gemm" and k.name.startswith("shared.fc")} == {"fp8"}


def test_te_expert_weights_cached_and_cast_on_the_expert_data_parallel_shard() -> None:
    """Delayed (TE): a weight cast writes both layouts, 2 + 1 + 1 = 4 bytes per element, cached
    for 4 micro-batches. Under an fp8 parameter gather (dense weight shards 8) the experts'
    weight is cast on its expert-data-parallel shard (edp 2): 4 / 2 / 4 = 0.5 byte per element
    forward, and the gathered fp8 weight transposed (1 + 1) / 4 = 0.5 backward. Routed weights
    2*512*512 + 2*256*512 = 786,432 elements: 393,216 bytes forward, 393,216 backward; inputs
    (2048*512 + 2048*256) x 4 = 6,291,456 forward. The shared expert's weights (393,216
    elements) use the dense shards: 4 / 8 / 4 = 0.125: 49,152."""
    te = Fp8Casting("delayed", cached_weights=True, micro_batches=4, weight_shards=8)
    fwd = _mlp(te, "delayed")
    weight = [k for k in fwd if k.kind == "cast" and k.name.endswith("_weight")]
    assert sum(k.nbytes for k in weight if k.of.startswith("experts.")) == 393_216
    assert sum(k.nbytes for k in weight if k.of.startswith("shared.")) == 49_152
    assert _casts(fwd, "experts.fc1", "experts.fc2") == 393_216 + 6_291_456
    bwd_weight = [k for k in backward_of(fwd) if k.kind == "cast" and k.name.endswith("_weight")]
    assert sum(k.nbytes for k in bwd_weight if k.of.startswith("experts.")) == 393_216


def test_routed_experts_follow_the_framework() -> None:
    """auto: fp8 under transformer-engine with the run's recipe; bf16 under torchao linears
    (no Float8GroupedExpertsConverter); experts: fp8 under linears is that converter, rowwise;
    bf16 keeps them bf16 under TE; a bf16 run has none. Routed experts in bf16 keep no casts."""
    assert expert_recipe(_scenario(gemms="transformer-engine", recipe="delayed")) == "delayed"
    assert expert_recipe(_scenario()) is None
    assert expert_recipe(_scenario(experts="fp8")) == "rowwise"
    assert expert_recipe(_scenario(gemms="transformer-engine", experts="bf16")) is None
    bf16_run = Scenario.model_validate({**_scenario().model_dump(), "training": {"global_batch": 8}})
    assert expert_recipe(bf16_run) is None
    fwd = _mlp(Fp8Casting("tensorwise"), None)
    assert {k.precision for k in fwd if k.kind == "gemm" and k.name.startswith("experts.fc")} == {"bf16"}
    assert _casts(fwd, "experts.fc1", "experts.fc2") == 0
    assert _casts(fwd, "shared.fc1", "shared.fc2") == 6_684_672


@pytest.mark.parametrize(("gemms", "expected"), [("transformer-engine", 1.0), ("linears", 1.5)])
def test_fp8_gather_of_expert_weights(gemms: str, expected: float) -> None:
    """With ``all_gather: fp8``: 100 shared-expert and 100 routed-expert elements. TE gathers
    both in fp8 (--fp8-param-gather): 1 byte each. torchao (tensorwise, experts: fp8) gathers
    the shared expert's Float8Linear weights in fp8, the grouped experts in bf16:
    (100 x 1 + 100 x 2) / 200 = 1.5."""
    sc = _scenario(gemms=gemms, all_gather="fp8", experts="fp8")
    params = [Param("l0.shared_experts", 100, 1), Param("l0.experts", 100, 1)]
    assert gathered_bytes_per_element(sc, params) == pytest.approx(expected)
