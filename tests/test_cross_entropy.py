"""The loss kernels by implementation (``training.cross_entropy``): HBM bytes per logits element
(simulator/costs/elementwise.py) and what the logits layer emits."""

import simulator
from simulator.costs.elementwise import cross_entropy_bytes_per_element
from simulator.costs.memory import loss_workspace_bytes
from simulator.workload.activations import shard_of
from simulator.workload.model import Shard, backward_of, logits_forward


def test_bytes_per_logits_element():
    """Megatron's op-by-op loss, bf16 logits (e = 2): forward .float() 2 + 4, max 4, -= max 4 + 4,
    exp 4 + 4, sum 4, div_ 4 + 4 = 38; backward mul_ 4 + 4 and the cast back 4 + 2 = 14.
    fp32 logits (e = 4) have no casts: 32 and 8. fused: e + 8 = 10 forward, twice that back."""
    assert cross_entropy_bytes_per_element(2, "megatron") == (38.0, 14.0)
    assert cross_entropy_bytes_per_element(4, "megatron") == (32.0, 8.0)
    assert cross_entropy_bytes_per_element(2, "fused") == (10.0, 20.0)
    assert cross_entropy_bytes_per_element(2, "eager-fp32") == (10.0, 20.0)


def test_logits_layer_emits_the_loss_bytes():
    """GPT 1.7B shape of the Megatron-Core README (h 2048, vocab 131072, seq 4096), tp 2, micro-batch 1:
    T = 4096 tokens, V/t = 65536 columns, 268,435,456 logits elements per rank. megatron: forward
    38 x that = 10,200,547,328 bytes, backward 14 x = 3,758,096,384; fused: 10 x and 20 x."""
    model = simulator.Scenario.model_validate({
        "model": {"layers": 24, "hidden": 2048, "heads": 16, "seq_len": 4096, "vocab": 131072},
        "cluster": {"node": "dgx-h100", "nodes": 1}, "training": {"global_batch": 8}}).model
    elements = 4096 * 65536
    for impl, fwd, bwd in (("megatron", 38, 14), ("fused", 10, 20)):
        kernels = logits_forward(model, Shard(batch=1, seq=4096, tp=2, cross_entropy=impl))
        loss = {k.name: k.nbytes for k in kernels}["cross_entropy"]
        loss_bwd = {k.name: k.nbytes for k in backward_of(kernels)}["cross_entropy.bwd"]
        assert (loss, loss_bwd) == (fwd * elements, bwd * elements)
    assert elements * 38 == 10_200_547_328 and elements * 14 == 3_758_096_384


def test_megatron_profiles_pick_the_unfused_loss_with_fused_memory():
    """Both Megatron profiles set cross_entropy: megatron (cross_entropy_loss_fusion off by default);
    its backward writes the gradient over the kept softmax like the fused kernel: no workspace."""
    for framework in ("megatron-core", "megatron-lm"):
        scenario = simulator.Scenario.model_validate({
            "framework": framework, "model": {"preset": "gpt3-1.3b"}, "cluster": {"node": "dgx-h100", "nodes": 1},
            "training": {"global_batch": 8}})
        assert scenario.training.cross_entropy == "megatron" and shard_of(scenario).cross_entropy == "megatron"
        assert scenario.source_of("training.cross_entropy") == framework
    assert loss_workspace_bytes(tokens=4096, vocab=131072, cross_entropy="megatron") == 0.0
