"""The fp8 recipe model: casts as memory-bound kernels, the fp8 all-gather, memory, the profile defaults.

Every number is derived by hand in the test's docstring; no test asserts on wall time.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simulator
from simulator.catalog import default_catalog
from simulator.costs.fp8 import Fp8Casting, cast_kernels, weight_cache_bytes
from simulator.costs.memory import layer_activation_bytes, model_state_bytes_per_param
from simulator.scenario import Fp8Spec
from simulator.scenario.loader import scenario_from_mapping
from simulator.workload.activations import shard_of
from simulator.workload.data_parallel import Param, gathered_bytes_per_element
from simulator.workload.model import Shard, backward_of, block_forward, kernel_time_s, kernels_time_s
from simulator.workload.parallel import layer_steps
from simulator.workload.profile import compute_profile
from simulator.workload.steps import LayerSpec

H100 = compute_profile(default_catalog().gpu("h100-sxm"), None)


def _llama8b(precision: str = "fp8", nodes: int = 1, fp8: dict | None = None, framework: str = "generic"):
    training = {"micro_batch": 2, "global_batch": 16 * nodes, "precision": precision, "recompute": "selective"}
    if fp8 is not None:
        training["fp8"] = fp8
    return scenario_from_mapping({"framework": framework, "model": {"preset": "llama3-8b", "seq_len": 8192},
                                  "cluster": {"node": "dgx-h100", "nodes": nodes},
                                  "parallelism": {"sharding": "fsdp"}, "training": training})


def test_cast_of_a_4096_square_weight_on_h100():
    """Tensorwise forward cast of a 4096 x 4096 bf16 weight: amax reads 2 bytes per element,
    the cast reads 2 and writes 1: 4096^2 * (2 + 3) = 83,886,080 bytes. On an H100 (3.35e12 B/s
    at the profile's memory efficiency, 2 kernel launches): 83,886,080 / (3.35e12 * eff) + 2 launches."""
    n = 4096 * 4096
    kernels = cast_kernels(Fp8Casting("tensorwise"), "weight", n, "fwd")
    assert [(k.name, k.nbytes) for k in kernels] == [("amax_weight", 2 * n), ("cast_weight", 3 * n)]
    seconds = sum(kernel_time_s(H100, k, "fp8") for k in _as_kernels(kernels))
    rate = 3.35e12 * H100.memory_efficiency
    assert H100.memory_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert seconds == pytest.approx(5 * n / rate + 2 * H100.launch_overhead_s)


def _as_kernels(casts):
    from simulator.workload.model import Kernel

    return [Kernel(c.name, "cast", 0.0, c.nbytes) for c in casts]


def test_recipes_cast_bytes_per_element():
    """Bytes per element of each role, forward + backward (torchao roofline_utils.py:146-297):
    tensorwise input 2 + 4 = 6, weight 2 + 3 + 3 = 8, grad_output 6; rowwise 5 + 3 = 8, 3 + 4 + 3
    = 10, 8; delayed 4 each, no amax pass (the weight's once for both passes)."""
    expected = {"tensorwise": (6, 8, 6), "rowwise": (8, 10, 8), "delayed": (4, 4, 4)}
    for recipe, per_role in expected.items():
        c = Fp8Casting(recipe)
        got = tuple(sum(k.nbytes for phase in ("fwd", "bwd") for k in cast_kernels(c, role, 1.0, phase))
                    for role in ("input", "weight", "grad_output"))
        assert got == per_role, recipe


def test_fused_norm_drops_the_first_read_and_cached_weights_spread_over_the_step():
    """TE LayerNormLinear, delayed: the norm writes the fp8 input, so its cast moves only the two
    1-byte writes (4 - 2 = 2 per element); the cached weight cast (4 per element) over 8
    micro-batches is 0.5 per element per micro-batch; under an fp8 all-gather over 8 shards torchao
    casts 1/8 of the weight (5/8 forward) and transposes the gathered fp8 weight (2) in backward."""
    te = Fp8Casting("delayed", cached_weights=True, micro_batches=8, fused_norm_input=True)
    assert [k.nbytes for k in cast_kernels(te, "input", 1.0, "fwd", fused_read=True)] == [2.0]
    assert [k.nbytes for k in cast_kernels(te, "weight", 1.0, "fwd")] == [0.5]
    sharded = Fp8Casting("tensorwise", weight_shards=8)
    assert sum(k.nbytes for k in cast_kernels(sharded, "weight", 1.0, "fwd")) == pytest.approx(5 / 8)
    assert [(k.name, k.nbytes) for k in cast_kernels(sharded, "weight", 1.0, "bwd")] == [("transpose_weight", 2.0)]


def test_fp8_block_runs_linears_in_fp8_and_attention_in_bf16():
    """The four linears are fp8 GEMMs reading 1-byte operands: qkv of Llama 3 8B on one token
    batch of 8192 is [8192, 4096] x [4096, 6144]: (8192*4096 + 4096*6144) * 1 + 8192*6144 * 2
    bytes; their backward casts precede dgrad and wgrad; attention stays bf16."""
    sc = _llama8b()
    shard = Shard(batch=1, seq=8192, precision="fp8", fp8=Fp8Casting("tensorwise"))
    fwd = block_forward(sc.model, shard)
    gemms = {k.name: k for k in fwd if k.kind == "gemm"}
    assert {n: k.precision for n, k in gemms.items()} == dict.fromkeys(("qkv", "proj", "fc1", "fc2"), "fp8")
    assert gemms["qkv"].nbytes == (8192 * 4096 + 4096 * 6144) + 8192 * 6144 * 2
    assert [k.name for k in fwd[:3]] == ["ln1", "qkv.amax_input", "qkv.cast_input"]
    bwd = backward_of(fwd)
    names = [k.name for k in bwd]
    assert names.index("fc2.dgrad.amax_grad_output") < names.index("fc2.dgrad") < names.index("fc2.wgrad")
    assert all(k.kind != "cast" or k.of for k in bwd)
    steps = layer_steps(LayerSpec(sc.model, shard, "block", "fwd"))
    assert "qkv.fp8_cast" in [s.name for s in steps]  # the casts are tasks of their own


def _block_speedup(hidden: int, ffn: int, heads: int) -> float:
    sc = _llama8b()
    model = sc.model.model_copy(update={"hidden": hidden, "ffn_hidden": ffn, "heads": heads, "kv_heads": heads})
    times = []
    for precision in ("bf16", "fp8"):
        casting = Fp8Casting("tensorwise") if precision == "fp8" else None
        shard = Shard(batch=1, seq=4096, precision=precision, fp8=casting)
        kernels = block_forward(model, shard)
        times.append(kernels_time_s(H100, kernels + backward_of(kernels), precision))
    return times[0] / times[1]


def test_speedup_grows_with_width():
    """Casts grow with the GEMM operands (M*K, K*N) while the GEMM FLOPs grow with M*N*K: the
    wider the model, the smaller the casts' share, the larger the fp8 speed-up of a block."""
    speedups = [_block_speedup(h, int(3.5 * h), h // 128) for h in (1024, 2048, 4096, 8192, 16384)]
    assert speedups == sorted(speedups) and speedups[0] < 1.1 < speedups[-1]


def test_fp8_all_gather_halves_the_gemm_weight_bytes():
    """FSDP gathers a Llama 3 8B block in bf16 (2 bytes per element); with all_gather: fp8 the
    four GEMM weights (218,103,808 elements) move in 1 byte and the two RMSNorm weights (2 *
    4096) stay 2: (218,103,808 + 2 * 8192) / 218,112,000 bytes per element."""
    bf16, fp8 = _llama8b(fp8={"all_gather": "bf16"}), _llama8b(fp8={"all_gather": "fp8"})
    gemm = 4096 * 6144 + 4096 * 4096 + 2 * 4096 * 14336 + 14336 * 4096
    params = [Param("l0.ln1", 4096, 1), Param("l0.qkv", 4096 * 6144, 1), Param("l0.proj", 4096 * 4096, 1),
              Param("l0.ln2", 4096, 1), Param("l0.fc1", 2 * 4096 * 14336, 1), Param("l0.fc2", 14336 * 4096, 1)]
    assert gathered_bytes_per_element(bf16, params) == 2.0
    assert gathered_bytes_per_element(fp8, params) == pytest.approx((gemm + 2 * 8192) / (gemm + 8192))
    head = [Param("final_norm+output", 4096 + 4096 * 128256, 33)]
    assert gathered_bytes_per_element(fp8, head) == 2.0  # the LM head stays bf16 unless output_head
    assert gathered_bytes_per_element(_llama8b("bf16", fp8={"all_gather": "fp8"}), params) == 2.0


def test_fp8_all_gather_halves_fsdp_gather_traffic_in_the_program():
    """Summed over the simulated program, FSDP's block all-gathers move half the bytes (within
    the norms' share, 8192 / 218,112,000) with fp8 weights; the root unit's bf16 embedding and
    head do not change."""
    from simulator.workload.builder import build_workload

    def gathered(sc):
        profile = compute_profile(sc.cluster.gpu_spec, None)
        program = build_workload(sc, profile, gpus_per_node=8).build()
        return sum(t.comm.nbytes for t in program.tasks if t.comm is not None and t.comm.op == "all_gather"
                   and "u0" not in t.name and f"u{sc.model.layers + 1}" not in t.name)

    bf16, fp8 = gathered(_llama8b(fp8={"all_gather": "bf16"})), gathered(_llama8b(fp8={"all_gather": "fp8"}))
    assert fp8 / bf16 == pytest.approx(0.5, abs=1e-4)


def test_memory_per_recipe():
    """torchao keeps no fp8 weight copy (2 bytes of bf16 weight); TE caches the fp8 weight and
    its transpose (2 + 2 = 4), none with fp8 parameters (2); TE keeps its linears' inputs in fp8:
    the two norm outputs and fc2's input drop from 2 to 1 byte and proj's 1-byte input is added:
    s*b*(h*(-2 + 1) + F*(-1)) bytes less for one layer."""
    assert model_state_bytes_per_param("fp8", "adam", weight_cache_bytes(Fp8Casting("tensorwise"))).params == 2.0
    te = Fp8Casting("delayed", cached_weights=True)
    assert model_state_bytes_per_param("fp8", "adam", weight_cache_bytes(te)).params == 4.0
    te_fp8_params = Fp8Casting("delayed", cached_weights=True, weight_shards=8)
    assert model_state_bytes_per_param("fp8", "adam", weight_cache_bytes(te_fp8_params)).params == 2.0
    dims = dict(seq=8192, batch=1, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, mlp="swiglu",
                recompute="selective", flash_attention=True, dropout=False)
    saved = layer_activation_bytes(**dims) - layer_activation_bytes(**dims, fp8_inputs=True)
    assert saved == 8192 * (4096 * (2 - 1) + 14336)


def test_profile_defaults_and_explicit_fields():
    """torchtitan's profile: rowwise, bf16 all-gather, linears, the head in fp8 (float8.py:58, 61);
    a field the scenario gives wins; a bf16 run does not take the fp8 block from the profile."""
    tt = _llama8b(framework="torchtitan", fp8={"recipe": "tensorwise", "all_gather": "fp8"})
    assert (tt.training.fp8.recipe, tt.training.fp8.all_gather) == ("tensorwise", "fp8")
    assert tt.source_of("training.fp8.recipe") == "scenario"
    assert tt.training.fp8.output_head is True and tt.source_of("training.fp8.output_head") == "torchtitan"
    plain = _llama8b(framework="torchtitan")
    assert (plain.training.fp8.recipe, plain.training.fp8.all_gather) == ("rowwise", "bf16")
    assert _llama8b("bf16", framework="torchtitan").source_of("training.fp8.recipe") == "default"
    mcore = _llama8b(framework="megatron-core", fp8={"all_gather": "fp8"})
    assert (mcore.training.fp8.recipe, mcore.training.fp8.gemms) == ("delayed", "transformer-engine")
    assert shard_of(mcore).fp8 == Fp8Casting("delayed", cached_weights=True, micro_batches=1, weight_shards=8,
                                             fused_norm_input=True, saves_fp8_inputs=True)
    assert shard_of(_llama8b("bf16")).fp8 is None


def test_rules_name_the_field():
    with pytest.raises(simulator.ScenarioError, match="tensorwise"):
        Fp8Spec(recipe="rowwise", all_gather="fp8")
    with pytest.raises(simulator.ScenarioError, match="Transformer Engine"):
        Fp8Spec(recipe="delayed", gemms="linears")
    with pytest.raises(simulator.InfeasibleError, match="Blackwell"):
        _llama8b(fp8={"recipe": "mxfp8", "gemms": "transformer-engine"})


def test_fp8_run_is_faster_than_bf16_and_reports_casts():
    """Llama 3.1 8B, FSDP on 8 H100: fp8 (tensorwise, fp8 all-gather, head filtered) beats bf16;
    the step's compute includes fp8 cast tasks."""
    bf16 = simulator.simulate(_llama8b("bf16"))
    fp8 = simulator.simulate(_llama8b(fp8={"all_gather": "fp8"}))
    assert 1.1 < bf16.step_time_s / fp8.step_time_s < 1.6


@settings(deadline=None, max_examples=50)
@given(recipe=st.sampled_from(["tensorwise", "rowwise", "delayed", "blockwise", "mxfp8"]),
       role=st.sampled_from(["input", "weight", "grad_output"]),
       numel=st.floats(1.0, 1e10), shards=st.integers(1, 512), micro=st.integers(1, 64))
def test_cast_bytes_scale_with_the_tensor(recipe, role, numel, shards, micro):
    """Cast bytes are linear in the element count, never negative, at least one fp8 write per
    element for the activations and gradients (what the GEMM reads must be written), and the
    weight's never grow with sharding or caching."""
    c = Fp8Casting(recipe, cached_weights=micro > 1, micro_batches=micro, weight_shards=shards)
    one = sum(k.nbytes for p in ("fwd", "bwd") for k in cast_kernels(c, role, 1.0, p))
    many = sum(k.nbytes for p in ("fwd", "bwd") for k in cast_kernels(c, role, numel, p))
    assert many == pytest.approx(one * numel) and one > 0
    if role != "weight":
        assert one >= 1.0
    else:
        plain = sum(k.nbytes for p in ("fwd", "bwd") for k in cast_kernels(Fp8Casting(recipe), role, 1.0, p))
        assert one <= plain + 2.0  # the fp8 transpose (2) replaces the backward casts under an fp8 all-gather
