"""``dtsim import megatron`` with Megatron-Core's MoE, MLA and MTP arguments
(simulator/importers/megatron_moe.py), on two of Megatron-LM's own example command lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import simulator
from simulator.errors import ScenarioError
from simulator.importers import import_megatron, render

ROOT = Path(__file__).resolve().parents[1]


def _words(text: str) -> list[str]:
    """A command line as the shell splits it (no quoting in these)."""
    return text.split()


# NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553 examples/mixtral/train_mixtral_8x7b_distributed.sh:
# MODEL_ARGS, MOE_ARGS, DATA_ARGS, TRAINING_ARGS and MODEL_PARALLEL_ARGS in the order pretrain_gpt.py receives
# them (the tokenizer and data paths replaced by placeholders; LOGGING_ARGS left out).
MIXTRAL_8X7B = _words("""
--use-mcore-models --disable-bias-linear --seq-length 4096 --max-position-embeddings 32768 --num-layers 32
--hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --init-method-std 0.01 --attention-dropout 0.0
--hidden-dropout 0.0 --normalization RMSNorm --position-embedding-type rope --swiglu
--untie-embeddings-and-output-weights --group-query-attention --num-query-groups 8 --no-masked-softmax-fusion
--no-position-embedding --rotary-base 1000000
--num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2
--moe-grouped-gemm --moe-token-dispatcher-type alltoall --overlap-param-gather --overlap-grad-reduce
--tokenizer-type Llama2Tokenizer --tokenizer-model TOKENIZER_MODEL --data-path DATA_PATH --split 99990,8,2
--micro-batch-size 1 --global-batch-size 256 --lr 1e-4 --train-iters 500000 --lr-decay-iters 320000
--lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 0.1 --lr-warmup-iters 500 --clip-grad 1.0 --bf16
--tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --expert-model-parallel-size 8
--use-distributed-optimizer --sequence-parallel
""")

# NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553 examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh:
# PRETRAIN_ARGS (lines 28-135) with the script's defaults TP=1 EP=8 MBS=4 GBS=2048 and USE_MEGATRON_FSDP=0 (the
# Megatron-FSDP block is not imported), paths replaced by placeholders. One change: the script's
# --moe-flex-dispatcher-backend hybridep (line 94), which dtsim does not model, is deepep here.
DEEPSEEK_V3 = _words("""
--distributed-timeout-minutes 60 --tensor-model-parallel-size 1 --expert-model-parallel-size 8
--expert-tensor-parallel-size 1 --context-parallel-size 1 --use-distributed-optimizer --overlap-grad-reduce
--overlap-param-gather --use-mcore-models --sequence-parallel --use-flash-attn --disable-bias-linear
--micro-batch-size 4 --global-batch-size 2048 --train-samples 585937500 --exit-duration-in-mins 220
--no-check-for-nan-in-loss-and-grad --manual-gc --manual-gc-interval 10 --recompute-granularity selective
--recompute-modules mlp moe mla_up_proj layernorm --transformer-impl transformer_engine --seq-length 4096
--data-cache-path OUTPUT_PATH/cache --tokenizer-type HuggingFaceTokenizer --tokenizer-model deepseek-ai/DeepSeek-V3
--data-path DATA_PATH --split 99,1,0 --no-mmap-bin-files --no-create-attention-mask-in-dataloader --num-workers 6
--num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 --kv-channels 128
--max-position-embeddings 4096 --position-embedding-type rope --rotary-base 10000 --make-vocab-size-divisible-by 3232
--normalization RMSNorm --norm-epsilon 1e-6 --swiglu --untie-embeddings-and-output-weights --multi-latent-attention
--attention-dropout 0.0 --hidden-dropout 0.0 --clip-grad 1.0 --weight-decay 0.1 --qk-layernorm
--lr-decay-samples 584765624 --lr-warmup-samples 1536000 --lr-warmup-init 3.9e-7 --lr 3.9e-6 --min-lr 3.9e-7
--lr-decay-style cosine --adam-beta1 0.9 --adam-beta2 0.95 --num-experts 256 --moe-layer-freq [0]*3+[1]*58
--moe-ffn-hidden-size 2048 --moe-shared-expert-intermediate-size 2048 --moe-router-load-balancing-type seq_aux_loss
--moe-router-topk 8 --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep --moe-router-pre-softmax
--moe-grouped-gemm --moe-aux-loss-coeff 1e-4 --moe-router-group-topk 4 --moe-router-num-groups 8
--moe-router-topk-scaling-factor 2.5 --moe-router-score-function sigmoid --moe-router-enable-expert-bias
--moe-router-bias-update-rate 1e-3 --moe-router-dtype fp32 --moe-permute-fusion --moe-router-force-load-balancing
--q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64 --v-head-dim 128
--rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0 --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1
--eval-iters 32 --eval-interval 100 --auto-detect-ckpt-format --load OUTPUT_PATH/checkpoints
--save OUTPUT_PATH/checkpoints --save-interval 100 --dist-ckpt-strictness log_all --init-method-std 0.02
--log-timers-to-tensorboard --log-memory-to-tensorboard --log-num-zeros-in-grad --log-params-norm
--log-validation-ppl-to-tensorboard --log-throughput --log-interval 1 --logging-level 40
--tensorboard-dir OUTPUT_PATH/tensorboard --bf16 --enable-experimental
""")


def _cluster(nodes: int) -> dict:
    return {"cluster": {"node": "dgx-h100", "nodes": nodes}, "world": nodes * 8, "where": f"{nodes} x 8 dgx-h100"}


def _roundtrip(argv: list[str], nodes: int, tmp_path: Path) -> tuple[simulator.Scenario, list[str]]:
    imported = import_megatron(argv, **_cluster(nodes))
    path = tmp_path / "imported.yaml"
    path.write_text(render(imported))
    return simulator.load_scenario(path), imported.ignored


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "simulator.cli", "import", "megatron", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=120)


def test_mixtral_8x7b_example(tmp_path: Path) -> None:
    s, ignored = _roundtrip(MIXTRAL_8X7B, 4, tmp_path)
    m, p = s.model, s.parallelism
    assert (m.experts, m.experts_per_token, m.expert_ffn, m.shared_experts) == (8, 2, 14336, 0)
    assert (m.moe_layers, m.n_moe_layers, m.router, m.capacity_factor, m.attention) == ("all", 32, "softmax-topk",
                                                                                         None, "mha-gqa")
    assert (p.tp, p.pp, p.ep, p.expert_tp, s.dp, p.moe.dispatcher) == (1, 4, 8, 1, 8, "alltoall")
    for flag in ("--moe-router-load-balancing-type aux_loss", "--moe-aux-loss-coeff 1e-2", "--moe-grouped-gemm"):
        assert flag in ignored  # read, not modelled
    r = simulator.simulate(s)
    # per layer: q, o 4096^2 each + k, v 4096 x 1024 each (8 groups of 128) = 41,943,040; 8 experts x 3 x 4096 x
    # 14336 = 1,409,286,144; router 4096 x 8; two RMSNorms 2 x 4096: 1,451,270,144. x 32 layers, + untied
    # embedding and output 2 x 50,304 x 4096 (the GPT-2 vocabulary padded to 128) + the final norm 4096
    assert r.params == 32 * 1_451_270_144 + 2 * 50304 * 4096 + 4096 == 46_852_739_072
    # active: 6 of the 8 experts (6 x 3 x 4096 x 14336 = 1,056,964,608 a layer) not used by a token
    assert r.moe.params_active == r.params - 32 * 6 * 176_160_768
    assert r.step_time_s > 0 and not r.oom


def test_deepseek_v3_example(tmp_path: Path) -> None:
    s, ignored = _roundtrip(DEEPSEEK_V3, 32, tmp_path)
    m, p = s.model, s.parallelism
    assert (m.experts, m.experts_per_token, m.expert_ffn, m.shared_experts) == (256, 8, 2048, 1)
    assert (m.moe_layers.first_dense, m.n_moe_layers, m.router, m.mtp_layers) == (3, 58, "sigmoid-topk", 1)
    assert m.attention == "mla" and m.mla is not None
    assert (m.mla.q_lora_rank, m.mla.kv_lora_rank, m.mla.qk_nope_head_dim, m.mla.qk_rope_head_dim,
            m.mla.v_head_dim) == (1536, 512, 128, 64, 128)
    assert (p.tp, p.pp, p.ep, p.etp, s.dp, p.moe.dispatcher) == (1, 1, 8, 1, 256, "deepep")
    assert s.training.recompute_modules == ["mlp", "moe", "mla_up_proj", "layernorm"]
    for flag in ("--moe-router-dtype fp32", "--moe-permute-fusion", "--moe-router-load-balancing-type seq_aux_loss"):
        assert flag in ignored
    r = simulator.simulate(s)  # the script is meant for Megatron-FSDP: with the distributed optimizer alone
    assert r.step_time_s > 0 and r.oom  # every rank holds all 61 layers and does not fit in 80 GB


def test_moe_options_and_layer_forms(tmp_path: Path) -> None:
    """The --recompute-modules moe_act command of issue 15, the deprecated --moe-enable-deepep, the overlaps,
    a capacity factor, --moe-layer-freq as an int and as a list equal to dtsim's every: n."""
    base = ["--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024",
            "--vocab-size", "32000", "--micro-batch-size", "1", "--bf16", "--num-experts", "128",
            "--moe-router-topk", "4", "--moe-ffn-hidden-size", "256", "--expert-model-parallel-size", "8"]
    s, _ = _roundtrip([*base, "--recompute-granularity", "selective", "--recompute-modules", "layernorm", "moe_act",
                       "--moe-expert-capacity-factor", "1.25"], 1, tmp_path)
    assert s.training.recompute_modules == ["layernorm", "moe_act"] and s.model.capacity_factor == 1.25
    assert s.parallelism.moe.dispatcher == "allgather"  # Megatron-Core's default (transformer_config.py:891)
    s, _ = _roundtrip([*base, "--moe-token-dispatcher-type", "flex", "--moe-enable-deepep",
                       "--moe-shared-expert-intermediate-size", "512", "--moe-shared-expert-overlap",
                       "--moe-layer-freq", "[0,1]*2"], 1, tmp_path)
    assert (s.parallelism.moe.dispatcher, s.parallelism.moe.overlap_ep_comm, s.model.shared_experts) == ("deepep",
                                                                                                      True, 2)
    assert s.model.moe_layers.every == 2 and s.model.n_moe_layers == 2
    s, _ = _roundtrip([*base, "--moe-layer-freq", "1"], 1, tmp_path)
    assert s.model.moe_layers == "all"


@pytest.mark.parametrize(("extra", "names"), [
    (["--expert-model-parallel-size", "3"], "--expert-model-parallel-size 3 does not divide --num-experts 8"),
    (["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep"], "hybridep"),
    (["--moe-layer-freq", "2"], "--moe-layer-freq 2"),  # Megatron: layers 0, 2, ...: no dtsim form
    (["--moe-layer-freq", "[1]*31"], "--num-layers is 32"),
    (["--moe-layer-freq", "__import__('os')"], "--moe-layer-freq"),
    # hostile sizes are refused before anything is built: no eval, no 10^15-entry list
    (["--moe-layer-freq", "[1]*1000000000000000"], "gives more layers than --num-layers (32)"),
    (["--moe-layer-freq", "([1]*1000)*1000000"], "gives more layers than --num-layers (32)"),
    (["--moe-layer-freq", "(" * 5000 + "[1]" + ")" * 5000], "--moe-layer-freq"),
    (["--moe-layer-freq", "[1]+" * 3000 + "[1]"], "--moe-layer-freq"),
    (["--moe-shared-expert-intermediate-size", "20000"], "--moe-shared-expert-intermediate-size 20000"),
    (["--moe-router-topk", "9"], "--moe-router-topk 9"),
    (["--moe-router-score-function", "sqrtsoftplus"], "sqrtsoftplus"),
])
def test_contradictions_exit_2_with_one_line(tmp_path: Path, extra: list[str], names: str) -> None:
    with pytest.raises(ScenarioError):
        import_megatron([*MIXTRAL_8X7B, *extra], **_cluster(4))
    res = _cli("--node", "dgx-h100", "--nodes", "4", "--", *MIXTRAL_8X7B, *extra, cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], res.stderr
    assert res.stdout == ""


def test_pipeline_layout_mtp_and_1f1b_overlap(tmp_path: Path) -> None:
    """--pipeline-model-parallel-layout passes through (commas cosmetic, arguments.py:3103-3108) with its mtp
    layer; --overlap-moe-expert-parallel-comm with --delay-wgrad-compute set the combined 1F1B schedule."""
    args = ["--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024",
            "--vocab-size", "32000", "--micro-batch-size", "1", "--global-batch-size", "16", "--bf16",
            "--num-experts", "8", "--moe-router-topk", "2", "--expert-model-parallel-size", "4",
            "--pipeline-model-parallel-size", "2", "--mtp-num-layers", "1",
            "--pipeline-model-parallel-layout", "Et|t,t,t,m,L", "--moe-token-dispatcher-type", "alltoall"]
    s, _ = _roundtrip(args, 1, tmp_path)
    assert (s.parallelism.pipeline_layout, s.model.mtp_layers, s.parallelism.ep) == ("Et|t,t,t,m,L", 1, 4)
    s, _ = _roundtrip([*args[:-6], "--num-layers-per-virtual-pipeline-stage", "1", "--moe-token-dispatcher-type",
                       "alltoall", "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"], 1, tmp_path)
    p = s.parallelism
    assert (p.pp, p.virtual_stages, p.moe.overlap_a2a_1f1b, p.moe.delay_wgrad_compute) == (2, 2, True, True)
