"""The embedding table's dense gradient each micro-batch (``training.embedding_grad``): HBM bytes
per table element (simulator/costs/elementwise.py) and what the embedding's backward moves."""

import simulator
from simulator.costs.elementwise import embedding_grad_bytes_per_element
from simulator.workload.activations import shard_of
from simulator.workload.model import Shard, backward_of, embedding_forward

GPT_1P7B = {"layers": 24, "hidden": 2048, "heads": 16, "seq_len": 4096, "vocab": 131072}


def _scenario(framework: str | None, pp: int = 1) -> simulator.Scenario:
    spec = {"model": GPT_1P7B, "cluster": {"node": "dgx-h100", "nodes": 1},
            "parallelism": {"pp": pp, "dp": 8 // pp}, "training": {"global_batch": 64}}
    if framework:
        spec["framework"] = framework
    return simulator.Scenario.model_validate(spec)


def test_bytes_per_table_element():
    """bf16 tables (e = 2), fp32 main gradients (g = 4). dense: PyTorch's zeroed table gradient, e = 2;
    tied on the stage autograd adds the output layer's gradient to it, 3e more: 8. main-grad adds the
    hook's main_grad.add_ (g + e + g = 10): 12 untied; tied on the stage also the output layer's zeroed
    dummy (e) beside the sum: 2 + 6 + 2 + 10 = 20. fp32 tables (e = g = 4): 6*4 + 2*4 = 32 tied."""
    assert embedding_grad_bytes_per_element(2, "dense", main_grad_bytes=4, tied_here=False) == 2.0
    assert embedding_grad_bytes_per_element(2, "dense", main_grad_bytes=4, tied_here=True) == 8.0
    assert embedding_grad_bytes_per_element(2, "main-grad", main_grad_bytes=4, tied_here=False) == 12.0
    assert embedding_grad_bytes_per_element(2, "main-grad", main_grad_bytes=4, tied_here=True) == 20.0
    assert embedding_grad_bytes_per_element(4, "main-grad", main_grad_bytes=4, tied_here=True) == 32.0


def test_embedding_backward_moves_the_table_gradients():
    """The Megatron-Core README's 1.7B shape (h 2048, vocab 131072, seq 4096, learned positions, dropout),
    tp 1, micro-batch 1: the forward reads the token and position rows and writes the sum (3 x T x h x 2
    bytes) and the dropout mask (T x h): 50,331,648 + 8,388,608 = 58,720,256 bytes. Backward: twice that
    (117,440,512), the tied token table 131072 x 2048 x 20 = 5,368,709,120 and the position table
    4096 x 2048 x 12 = 100,663,296: 5,586,812,928. dense, untied (pp 2's first stage): 2 bytes per
    element of both tables: 117,440,512 + (268,435,456 + 8,388,608) x 2 = 671,088,640."""
    model = _scenario(None).model
    fwd = embedding_forward(model, Shard(batch=1, seq=4096, embedding_grad="main-grad", main_grad_bytes=4,
                                         tied_here=True))
    assert [k.nbytes for k in fwd] == [58_720_256]
    assert [k.nbytes for k in backward_of(fwd)] == [5_586_812_928]
    dense = embedding_forward(model, Shard(batch=1, seq=4096))
    assert [k.nbytes for k in backward_of(dense)] == [671_088_640]


def test_megatron_core_profile_sets_main_grad_and_the_stage_decides_the_tie():
    """megatron-core: main-grad with fp32 main gradients (bf16 run); tied on the stage only without
    pipeline parallelism (with pp the output layer's copy sits on the last stage). Other frameworks:
    dense."""
    mcore = _scenario("megatron-core")
    assert mcore.source_of("training.embedding_grad") == "megatron-core"
    shard = shard_of(mcore)
    assert (shard.embedding_grad, shard.main_grad_bytes, shard.tied_here) == ("main-grad", 4.0, True)
    assert shard_of(_scenario("megatron-core", pp=2)).tied_here is False
    assert shard_of(_scenario(None)).embedding_grad == "dense"
    assert shard_of(_scenario("torchtitan")).embedding_grad == "dense"
