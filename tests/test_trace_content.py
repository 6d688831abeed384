"""What the slices of a Perfetto trace say: every kernel slice its FLOPs, bytes, kernel shapes
and layer; every collective its algorithm, protocol and bytes; fused runs of layers expanded
with each slice's own layer number and a duration that follows its kernels.

Runs: GPT-3 XL (24 layers, hidden 2048, ffn 8192, 2048 tokens per sequence) on 4 x p4d
(8 A100 per NVSwitch node). ``FUSED``: tp 8 x pp 2 x dp 2 with full recomputation; tensor
parallelism inside a node with no other group sharing it, so each pass of a stage's 12
layers is one fused task. ``UNFUSED``: tp 2 x pp 2 x dp 8 (data-parallel peers share nodes),
one task per step and collective.
"""

from __future__ import annotations

from typing import Any

import pytest

import simulator
from simulator.results.export import trace_document

QUICKSTART = "scenarios/quickstart.yaml"
FUSED = ["parallelism.tp=8", "parallelism.pp=2", "training.recompute=full"]
UNFUSED = ["parallelism.tp=2", "parallelism.pp=2"]
LAYER_PHASES = ("fwd", "bwd", "recompute")


def _slices(overrides: list[str]) -> tuple[Any, dict[int, list[dict[str, Any]]]]:
    sim = simulator.run_simulation(simulator.load_scenario(QUICKSTART, overrides=overrides))
    doc = trace_document(sim)
    by_rank: dict[int, list[dict[str, Any]]] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["cat"] != "user_annotation":
            by_rank.setdefault(e["pid"], []).append(e)
    return sim, by_rank


@pytest.fixture(scope="module")
def fused() -> tuple[Any, dict[int, list[dict[str, Any]]]]:
    return _slices(FUSED)


@pytest.fixture(scope="module")
def unfused() -> tuple[Any, dict[int, list[dict[str, Any]]]]:
    return _slices(UNFUSED)


def test_the_fused_run_is_fused(fused: Any, unfused: Any) -> None:
    assert sum(1 for r in fused[0].rows if r.info is not None and r.info.fused is not None) > 0
    assert sum(1 for r in unfused[0].rows if r.info is not None and r.info.fused is not None) == 0
    assert sorted(fused[1]) == [0, 8] and sorted(unfused[1]) == [0, 2]  # stage 0 and stage 1 stand-ins


@pytest.mark.parametrize("run", ["fused", "unfused"])
def test_every_kernel_slice_carries_flops_bytes_shapes_and_layer(run: str, request: pytest.FixtureRequest) -> None:
    """Each compute slice lists its kernels (the optimizer step its one memory-bound kernel);
    the slice's FLOPs and bytes are their sums, a layer pass's slice names its layer (-1: the
    embedding, 24: the output layer), a memory-bound kernel's shape is the tensor it sweeps, and
    a GEMM's shape MxNxK gives its FLOPs, 2*M*N*K (e.g.
    the forward's QKV GEMM with tp 8 on 4 x 2048 tokens: M = 8192, N = 3*2048/8 = 768,
    K = 2048)."""
    _, by_rank = request.getfixturevalue(run)
    gemms = 0
    for slices in by_rank.values():
        compute = [e for e in slices if e["cat"] == "compute"]
        assert {e["args"]["phase"] for e in compute} >= {"fwd", "bwd", "optimizer"}
        for e in compute:
            args = e["args"]
            if args["phase"] in LAYER_PHASES:
                assert isinstance(args["layer"], int) and -1 <= args["layer"] <= 24, e
            kernels = args["kernels"]
            assert kernels, e
            assert args["flops"] == pytest.approx(sum(k["flops"] for k in kernels), rel=1e-12)
            assert args["bytes"] == pytest.approx(sum(k["bytes"] for k in kernels), rel=1e-12) and args["bytes"] > 0
            for k in kernels:
                assert k["bytes"] > 0 and k["modelled_us"] > 0
                if k["kind"] == "gemm":
                    m, n, kk = (float(v) for v in k["shape"].split("x"))
                    assert k["flops"] == pytest.approx(2 * m * n * kk, rel=1e-9)
                    gemms += 1
                if k["kind"] == "attention":
                    assert k["shape"].startswith("seq 2048, head_dim 128")
                if k["kind"] in ("memory", "cast"):  # the tensor it sweeps
                    assert k["shape"].endswith(" elements") and k["shape"] != " elements", k
                assert k["shape"], k
    assert gemms > 0
    if run == "fused":
        kernels = [k for e in by_rank[0] if e["name"] == "block0.attn" for k in e["args"]["kernels"]]
        qkv = next(k for k in kernels if k["name"] == "qkv")
        assert qkv["shape"] == "8192x768x2048"
        # the first norm sweeps the block input [tokens, hidden]: sequence parallel with tp 8 holds
        # 8192 / 8 = 1024 of the 4 x 2048 tokens, else all 8192, each 2048 wide
        ln1 = next(k for k in kernels if k["name"] == "ln1")
        assert ln1["shape"] in ("8192x2048 elements", "1024x2048 elements"), ln1


@pytest.mark.parametrize("run", ["fused", "unfused"])
def test_every_collective_names_its_algorithm_protocol_and_bytes(run: str, request: pytest.FixtureRequest) -> None:
    """Tensor-parallel slices included: the tuner's choice, never null. A forward TP all-reduce
    of a block carries the layer's output, 4 x 2048 tokens x 2048 x 2 bytes = 33,554,432 bytes."""
    _, by_rank = request.getfixturevalue(run)
    tp = 0
    for slices in by_rank.values():
        for e in slices:
            if e["cat"] == "compute":
                continue
            args = e["args"]
            assert args["algorithm"] and args["protocol"], e
            assert args["bytes"] > 0, e
            if e["cat"] == "tp" and args.get("phase") == "fwd" and 0 <= args["layer"] < 24 and args["op"] == "all_reduce":
                assert args["bytes"] == 4 * 2048 * 2048 * 2
                tp += 1
    assert tp > 0


def test_fused_backward_slices_carry_their_own_layers(fused: Any) -> None:
    """Stage 0 holds the embedding and layers 0-11, stage 1 layers 12-23 and the output layer
    (24): each micro-batch's backward has slices of every one of its layers, and each slice's
    layer is the one its name says (recompute.block7.attn: layer 7, phase recompute)."""
    expected = {0: {-1, *range(12)}, 8: {*range(12, 24), 24}}
    for rank, slices in fused[1].items():
        back = [e for e in slices if e["args"].get("phase") in ("bwd", "recompute") and e["args"].get("micro_batch") == 0]
        assert {e["args"]["layer"] for e in back} == expected[rank]
        for e in back:
            name = e["name"].removeprefix("recompute.")
            if name.startswith("block"):
                assert int(name.split(".")[0].removeprefix("block")) == e["args"]["layer"]
                assert (e["args"]["phase"] == "recompute") == e["name"].startswith("recompute.")


def test_fused_slice_durations_follow_their_kernels(fused: Any) -> None:
    """Inside one fused task every compute slice lasts its kernels' modelled time times the
    task's stretch (the task's duration over its inner timeline's length), so slices differ as
    their kernels do: a block forward's attention slice (LN, QKV, attention, projection) against
    its MLP slice (LN, fc1, GELU, fc2) is the ratio of their kernel times, not 1. A slice beside
    an overlapped collective (the backward's wgrad GEMMs beside the TP all-reduce) runs at
    least that long: it is slowed while the collective runs."""
    sim, by_rank = fused
    tasks = {(r.rank, r.name, r.info.mb): r for r in sim.rows if r.info is not None and r.info.fused is not None}
    checked = slowed = 0
    for rank, slices in by_rank.items():
        for e in slices:
            if e["cat"] != "compute" or "fused" not in e["args"]:
                continue
            task = tasks[(rank, e["args"]["fused"], e["args"]["micro_batch"])]
            stretch = task.duration_s / task.info.fused.nominal_s
            kernels_us = sum(k["modelled_us"] for k in e["args"]["kernels"]) * stretch
            if "wgrad" in e["name"]:
                assert e["dur"] >= kernels_us - 2e-3
                slowed += e["dur"] > kernels_us + 1e-3
            else:
                assert e["dur"] == pytest.approx(kernels_us, abs=5e-3)  # ends round to the ns, offsets scale
                checked += 1
    assert checked > 0 and slowed > 0
    fwd = {e["name"]: e for e in by_rank[0] if e["args"].get("phase") == "fwd" and e["args"].get("micro_batch") == 0}
    attn, mlp = fwd["block3.attn"], fwd["block3.mlp"]
    ratio = sum(k["modelled_us"] for k in attn["args"]["kernels"]) / sum(k["modelled_us"] for k in mlp["args"]["kernels"])
    assert attn["dur"] / mlp["dur"] == pytest.approx(ratio, rel=1e-5)
    assert abs(ratio - 1) > 0.1
