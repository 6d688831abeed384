"""``dtsim import``: each importer on a real published config, reproduced here with its citation.

The written YAML must load with :func:`simulator.load_scenario`, the key fields must be what
the config says (checkable by hand), unused inputs must be listed, and contradictions must
exit 2 with one line naming the argument (through the CLI, in a subprocess).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import simulator
from simulator.errors import ScenarioError
from simulator.importers import import_deepspeed, import_megatron, import_torchtitan, render

ROOT = Path(__file__).resolve().parents[1]

# NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553 examples/gpt3/train_gpt3_175b_distributed.sh:
# the GPT-3 175B recipe (Narayanan et al., SC'21): GPT_MODEL_ARGS, TRAINING_ARGS, MODEL_PARALLEL_ARGS,
# DATA_ARGS and EVAL_AND_LOGGING_ARGS in the order pretrain_gpt.py receives them (the script's $1..$5 paths
# replaced by placeholders).
GPT3_175B = [
    "--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96", "--seq-length", "2048",
    "--max-position-embeddings", "2048", "--attention-backend", "auto",
    "--micro-batch-size", "1", "--global-batch-size", "1536",
    "--step-batch-size-schedule", "0:16 2.4B:320 4.8B:624 7.2B:928 9.6B:1232 12B:1536",
    "--train-iters", "500000", "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95",
    "--init-method-std", "0.006", "--clip-grad", "1.0", "--fp16", "--lr", "6.0e-5", "--lr-decay-style", "cosine",
    "--min-lr", "6.0e-6", "--lr-warmup-fraction", ".001", "--lr-decay-iters", "430000",
    "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "16",
    "--data-path", "DATA_PATH", "--vocab-file", "gpt2-vocab.json", "--merge-file", "gpt2-merges.txt",
    "--split", "949,50,1",
    "--log-interval", "100", "--save-interval", "10000", "--eval-interval", "1000", "--save", "CKPT",
    "--load", "CKPT", "--eval-iters", "10", "--tensorboard-dir", "TB",
]

# pytorch/torchtitan@4a950eaabff274567873322c206ddb481dae3567 torchtitan/models/llama3/train_configs/llama3_8b.toml
# (the last commit with TOML job files), verbatim but for blank lines
LLAMA3_8B_TOML = """\
# NOTE: this toml config is a preset for 64 A100 GPUs.

[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"

[profiling]
enable_profiling = true
save_traces_folder = "profile_trace"
profile_freq = 100

[metrics]
log_freq = 10
enable_tensorboard = true
save_tb_folder = "tb"

[model]
name = "llama3"
flavor = "8B"
hf_assets_path = "./assets/hf/Llama-3.1-8B"
# converters = ["float8"]

[optimizer]
name = "AdamW"
lr = 3e-4
eps = 1e-8

[lr_scheduler]
warmup_steps = 200  # lr scheduler warm up

[training]
local_batch_size = 1
seq_len = 8192
max_norm = 1.0  # grad norm clipping
steps = 1000
dataset = "c4"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
context_parallel_degree = 1

[checkpoint]
enable = false
folder = "checkpoint"
interval = 500
last_save_model_only = true
export_dtype = "float32"
async_mode = "disabled" # ["disabled", "async", "async_with_pinned_mem"]

[compile]
enable=false
components = ["model", "loss"]

[activation_checkpoint]
mode = "selective"  # ["none", "selective", "full"]
selective_ac_option = "op"  # "int" = ac every positive int layer or 'op', ac based on ops policy

[quantize.linear.float8]
enable_fsdp_float8_all_gather = false
precompute_float8_dynamic_scale_for_fsdp = false
filter_fqns = ["output"]

[validation]
enable = false
dataset = "c4_validation"
freq = 500
steps = 1200 # Recommend value for c4_validation with world-size=8 and seq_len=8192
"""

# the same commit, torchtitan/models/llama3/train_configs/llama3_405b.toml ("a preset for 128 H100 GPUs"):
# the sections the importer reads, verbatim
LLAMA3_405B_TOML = """\
[model]
name = "llama3"
flavor = "405B"
hf_assets_path = "./assets/hf/Llama-3.1-405B"
converters = ["float8"]

[training]
local_batch_size = 2
seq_len = 8192
max_norm = 1.0  # grad norm clipping
steps = 3000
dataset = "c4"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 8  # 8-way TP
enable_async_tensor_parallel = true
pipeline_parallel_degree = 1
context_parallel_degree = 1

[activation_checkpoint]
mode = "full" # ["none", "selective", "full"]

[compile]
enable=true
components = ["model", "loss"]

[quantize.linear.float8]
enable_fsdp_float8_all_gather = true
precompute_float8_dynamic_scale_for_fsdp = true
filter_fqns = ["output"]
"""

# microsoft/DeepSpeed@38327e07f6cd39b63418f60cedd1651b0be3e7c3 docs/_tutorials/zero.md, "Training a 10B Parameter
# GPT-2 model" (ZeRO stage 2, lines 87-97): its zero_optimization block verbatim; the batch and bf16 keys are
# those of docs/_pages/config-json.md (train_batch_size 32 is its documented example value, lines 12-16).
DS_ZERO2 = {
    "train_batch_size": 32,
    "train_micro_batch_size_per_gpu": 1,
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 2,
        "contiguous_gradients": True,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": 5e8,
        "allgather_bucket_size": 5e8,
    },
}
# the same tutorial, "Training trillion-scale models with ZeRO-Infinity" (lines 129-147), verbatim
DS_ZERO3_OFFLOAD_BLOCK = {
    "stage": 3,
    "contiguous_gradients": True,
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
    "stage3_prefetch_bucket_size": 1e7,
    "stage3_param_persistence_threshold": 1e5,
    "reduce_bucket_size": 1e7,
    "sub_group_size": 1e9,
    "offload_optimizer": {"device": "cpu"},
    "offload_param": {"device": "cpu"},
}
# a Llama-3-8B-style Hugging Face config.json (the LlamaConfig keys), written for this test
HF_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 8192, "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0, "torch_dtype": "bfloat16",
}


def _roundtrip(imported, tmp_path: Path) -> simulator.Scenario:
    path = tmp_path / "imported.yaml"
    path.write_text(render(imported))
    return simulator.load_scenario(path)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "simulator.cli", "import", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def _cluster(node: str, nodes: int, gpus: int) -> dict:
    return {"cluster": {"node": node, "nodes": nodes}, "world": nodes * gpus, "where": f"{nodes} x {gpus} {node}"}


def test_megatron_gpt3_175b_recipe(tmp_path: Path) -> None:
    imported = import_megatron(GPT3_175B, **_cluster("dgx-a100", 16, 8))
    s = _roundtrip(imported, tmp_path)
    assert s.framework == "megatron-core"
    assert (s.parallelism.tp, s.parallelism.pp, s.dp) == (8, 16, 1)
    assert (s.training.global_batch, s.training.micro_batch, s.training.precision) == (1536, 1, "fp16")
    m = s.model
    assert (m.layers, m.hidden, m.heads, m.seq_len, m.ffn, m.mlp) == (96, 12288, 96, 2048, 4 * 12288, "gelu")
    assert m.vocab == 51200  # 50,257 padded to a multiple of 128 * tp 8
    assert (m.tied_embeddings, m.bias, m.position_embedding) == (True, True, "learned")
    assert s.parallelism.sharding == "none" and s.training.recompute == "none"
    assert "--lr 6.0e-5" in imported.ignored and "--train-iters 500000" in imported.ignored
    assert any(i.startswith("--step-batch-size-schedule") for i in imported.ignored)
    assert any("--vocab-size" in n for n in imported.notes)
    assert "--lr 6.0e-5" in render(imported).split("name:")[0]  # listed in the header


def test_megatron_core_flags(tmp_path: Path) -> None:
    args = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--group-query-attention",
            "--num-query-groups", "8", "--ffn-hidden-size", "14336", "--seq-length", "8192",
            "--max-position-embeddings", "8192", "--vocab-size", "128256", "--swiglu", "--normalization", "RMSNorm",
            "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
            "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
            "--num-layers-per-virtual-pipeline-stage", "4", "--context-parallel-size", "2", "--sequence-parallel",
            "--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap",
            "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16", "--recompute-activations",
            "--hidden-dropout", "0", "--attention-dropout", "0"]
    s = _roundtrip(import_megatron(args, **_cluster("dgx-h100", 2, 8)), tmp_path)
    m, p = s.model, s.parallelism
    assert (m.kv_heads, m.ffn, m.vocab, m.mlp, m.norm, m.position_embedding) == (8, 14336, 128256, "swiglu",
                                                                                  "rmsnorm", "rotary")
    assert (m.tied_embeddings, m.bias, m.dropout) == (False, False, False)
    assert (p.tp, p.pp, p.cp, s.dp, p.virtual_stages, p.pipeline_schedule) == (2, 2, 2, 2, 4, "interleaved")
    assert p.sequence_parallel and p.tp_comm_overlap and p.sharding == "zero1"
    assert p.zero.gradient_reduction == "reduce_scatter" and p.zero.overlap_comm and p.zero.overlap_param_gather
    assert (s.training.precision, s.training.recompute) == ("bf16", "selective")


def test_megatron_recompute_modules(tmp_path: Path) -> None:
    """--recompute-modules is read under selective granularity (training.recompute_modules) and listed
    as ignored without it (Megatron-Core reads it only then)."""
    shape = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
             "--micro-batch-size", "1", "--global-batch-size", "64", "--bf16"]
    selective = import_megatron([*shape, "--recompute-granularity", "selective", "--recompute-modules", "core_attn",
                                 "mlp"], **_cluster("dgx-h100", 1, 8))
    s = _roundtrip(selective, tmp_path)
    assert (s.training.recompute, s.training.recompute_modules) == ("selective", ["core_attn", "mlp"])
    assert not any("recompute-modules" in i for i in selective.ignored)
    alone = import_megatron([*shape, "--recompute-modules", "mlp"], **_cluster("dgx-h100", 1, 8))
    assert alone.scenario["training"]["recompute"] == "none" and "recompute_modules" not in alone.scenario["training"]
    assert any(i.startswith("--recompute-modules") for i in alone.ignored)


def test_megatron_legacy_flags_select_megatron_lm(tmp_path: Path) -> None:
    args = ["--num-layers", "24", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--model-parallel-size", "2", "--batch-size", "4",
            "--checkpoint-activations", "--fp16"]
    imported = import_megatron(args, **_cluster("dgx-a100", 1, 8))
    s = _roundtrip(imported, tmp_path)
    assert s.framework == "megatron-lm" and s.parallelism.tp == 2 and s.training.recompute == "full"
    assert s.training.global_batch == 16  # micro-batch 4 * dp 4 (no --global-batch-size)


def test_torchtitan_llama3_8b(tmp_path: Path) -> None:
    imported = import_torchtitan(LLAMA3_8B_TOML, source="llama3_8b.toml", **_cluster("dgx-a100", 8, 8))
    s = _roundtrip(imported, tmp_path)
    assert s.framework == "torchtitan" and s.model.preset == "llama3-8b" and s.model.seq_len == 8192
    assert (s.parallelism.sharding, s.parallelism.tp, s.dp) == ("fsdp", 1, 64)
    assert (s.training.micro_batch, s.training.global_batch) == (1, 64)  # local 1 x 64 shards
    # selective_ac_option = "op": torchtitan's op policy; the loss runs eagerly in fp32 (compile off)
    assert (s.training.precision, s.training.recompute) == ("bf16", "selective-op")
    assert s.training.cross_entropy == "eager-fp32"
    assert "optimizer.lr" in imported.ignored and "activation_checkpoint.selective_ac_option" not in imported.ignored
    assert "quantize.linear.float8.enable_fsdp_float8_all_gather" in imported.ignored
    assert "model.name" not in imported.ignored and "training.seq_len" not in imported.ignored


def test_torchtitan_llama3_405b_fp8(tmp_path: Path) -> None:
    imported = import_torchtitan(LLAMA3_405B_TOML, source="llama3_405b.toml", **_cluster("p5.48xlarge", 16, 8))
    s = _roundtrip(imported, tmp_path)
    assert s.model.preset == "llama3-405b" and (s.parallelism.tp, s.dp) == (8, 16)
    assert s.parallelism.sequence_parallel and s.parallelism.sharding == "fsdp"
    assert (s.training.micro_batch, s.training.global_batch) == (2, 32)
    assert (s.training.precision, s.training.recompute) == ("fp8", "full")
    # [quantize.linear.float8]: no recipe_name (torchao's tensorwise), fp8 FSDP all-gather, the output head filtered
    fp8 = s.training.fp8
    assert (fp8.recipe, fp8.gemms, fp8.all_gather, fp8.output_head) == ("tensorwise", "linears", "fp8", False)
    assert not any("float8" in path for path in imported.ignored)
    assert not any("without recipe" in n for n in imported.notes)
    assert s.parallelism.tp_comm_overlap and s.training.compile  # enable_async_tensor_parallel, [compile] enable
    assert "parallelism.enable_async_tensor_parallel" not in imported.ignored and "compile.enable" not in imported.ignored
    assert "compile.components" in imported.ignored


def test_torchtitan_hsdp_and_pipeline(tmp_path: Path) -> None:
    toml = ('[model]\nname = "llama3"\nflavor = "70B"\n[training]\nlocal_batch_size = 8\nseq_len = 4096\n'
            'global_batch_size = 64\n[parallelism]\ndata_parallel_replicate_degree = 2\ntensor_parallel_degree = 8\n'
            'pipeline_parallel_degree = 2\npipeline_parallel_microbatch_size = 2\n[activation_checkpoint]\n'
            'mode = "none"\n')
    s = _roundtrip(import_torchtitan(toml, source="job.toml", **_cluster("dgx-h100", 8, 8)), tmp_path)
    assert (s.parallelism.sharding, s.parallelism.shard_group_size, s.dp) == ("hsdp", 2, 4)
    assert (s.training.micro_batch, s.training.global_batch, s.model.seq_len) == (2, 64, 4096)
    assert s.training.recompute == "none"


def test_torchtitan_older_keys() -> None:
    toml = ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nbatch_size = 2\nseq_len = 8192\n'
            '[float8]\nenable_float8_linear = true\n[parallelism]\ncontext_parallel_degree = 2\n')
    imported = import_torchtitan(toml, source="old.toml", **_cluster("dgx-h100", 1, 8))
    sc = imported.scenario
    assert sc["training"]["micro_batch"] == 2 and sc["training"]["global_batch"] == 8  # 2 x dp 4
    assert sc["training"]["precision"] == "fp8" and sc["parallelism"]["cp"] == 2
    # no float8 options: torchao's tensorwise recipe, bf16 all-gather, the output head converted too
    assert sc["training"]["fp8"] == {"recipe": "tensorwise", "gemms": "linears", "all_gather": "bf16",
                                     "output_head": True}
    assert any("parallel_dims.py" in n for n in imported.notes)


def test_torchtitan_rowwise_recipe_keeps_bf16_all_gather() -> None:
    toml = ('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["float8"]\n[quantize.linear.float8]\n'
            'recipe_name = "rowwise_with_gw_hp"\nfilter_fqns = ["lm_head", "attention.wk"]\n')
    imported = import_torchtitan(toml, source="job.toml", **_cluster("dgx-h100", 1, 8))
    assert imported.scenario["training"]["fp8"] == {"recipe": "rowwise", "gemms": "linears", "all_gather": "bf16",
                                                    "output_head": False}
    assert any("rowwise_with_gw_hp" in n for n in imported.notes) and any("attention.wk" in n for n in imported.notes)


def test_megatron_fp8_recipe_and_param_gather(tmp_path: Path) -> None:
    args = ["--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "2048",
            "--max-position-embeddings", "2048", "--micro-batch-size", "1", "--global-batch-size", "8", "--bf16",
            "--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-param-gather",
            "--use-distributed-optimizer"]
    imported = import_megatron(args, **_cluster("dgx-h100", 1, 8))
    s = _roundtrip(imported, tmp_path)
    fp8 = s.training.fp8
    assert s.training.precision == "fp8"
    assert (fp8.recipe, fp8.gemms, fp8.all_gather, fp8.output_head) == ("tensorwise", "transformer-engine", "fp8", False)
    assert not any("fp8" in flag for flag in imported.ignored) and not any("without recipe" in n for n in imported.notes)
    default = import_megatron([a for a in args if a not in ("--fp8-recipe", "tensorwise", "--fp8-param-gather")],
                              **_cluster("dgx-h100", 1, 8))
    assert default.scenario["training"]["fp8"]["recipe"] == "delayed"  # transformer_config.py:594
    assert default.scenario["training"]["fp8"]["all_gather"] == "bf16"
    with pytest.raises(simulator.ScenarioError, match="custom"):
        import_megatron([*args, "--fp8-recipe", "custom"], **_cluster("dgx-h100", 1, 8))


def test_torchtitan_december_2024_key_locations() -> None:
    """pytorch/torchtitan@9dec370 files keep tensor_parallel_degree and compile in [training] and
    the pipeline/context degrees and enable_async_tensor_parallel in [experimental]: 70B on 32
    GPUs with tp 8 leaves dp = 32 / 8 = 4, global batch = 8 x 4 = 32."""
    toml = ('[model]\nname = "llama3"\nflavor = "70B"\n[training]\nbatch_size = 8\nseq_len = 8192\n'
            'tensor_parallel_degree = 8\ncompile = true\n[experimental]\ncontext_parallel_degree = 1\n'
            'pipeline_parallel_degree = 1\nenable_async_tensor_parallel = true\n')
    sc = import_torchtitan(toml, source="old.toml", **_cluster("dgx-h100", 4, 8)).scenario
    assert sc["parallelism"]["tp"] == 8 and sc["parallelism"]["tp_comm_overlap"]
    assert sc["training"]["compile"] is True and sc["training"]["global_batch"] == 32


def test_deepspeed_zero2_tutorial(tmp_path: Path) -> None:
    imported = import_deepspeed(json.dumps(DS_ZERO2), json.dumps(HF_LLAMA), ds_source="ds.json",
                                hf_source="config.json", **_cluster("p4d.24xlarge", 4, 8))
    s = _roundtrip(imported, tmp_path)
    assert s.framework == "deepspeed" and s.parallelism.sharding == "zero2"
    z = s.parallelism.zero
    assert (z.reduce_bucket_size, z.allgather_bucket_size, z.overlap_comm) == (500_000_000, 500_000_000, True)
    assert (s.training.micro_batch, s.training.global_batch, s.training.precision) == (1, 32, "bf16")
    m = s.model
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.seq_len, m.vocab) == (32, 4096, 32, 8, 14336, 8192,
                                                                                   128256)
    assert (m.mlp, m.norm, m.position_embedding, m.tied_embeddings, m.bias, m.dropout) == (
        "swiglu", "rmsnorm", "rotary", False, False, False)
    assert "zero_optimization.reduce_scatter" in imported.ignored
    assert "zero_optimization.contiguous_gradients" in imported.ignored


def test_deepspeed_zero3_offload(tmp_path: Path) -> None:
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "fp16": {"enabled": True},
          "zero_optimization": DS_ZERO3_OFFLOAD_BLOCK}
    imported = import_deepspeed(json.dumps(ds), json.dumps(HF_LLAMA), ds_source="ds.json", hf_source="config.json",
                                seq_len=4096, **_cluster("p4d.24xlarge", 2, 8))
    s = _roundtrip(imported, tmp_path)
    z = s.parallelism.zero
    assert s.parallelism.sharding == "zero3" and s.parallelism.offload_optimizer
    assert (z.prefetch_bucket_size, z.param_persistence_threshold, z.max_live_parameters, z.reduce_bucket_size) == (
        10_000_000, 100_000, 1_000_000_000, 10_000_000)
    assert (s.training.global_batch, s.training.precision, s.model.seq_len) == (2 * 4 * 16, "fp16", 4096)
    assert "zero_optimization.offload_param.device" in imported.ignored


@pytest.mark.parametrize("ds", [
    {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1},
    {"train_batch_size": 32, "bf16": {"enabled": True}, "fp16": {"enabled": True}},
])
def test_deepspeed_contradictions(ds: dict) -> None:
    with pytest.raises(ScenarioError):
        import_deepspeed(json.dumps(ds), json.dumps(HF_LLAMA), ds_source="ds.json", hf_source="config.json",
                         **_cluster("p4d.24xlarge", 4, 8))


def test_cli_writes_file_and_stdout(tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(LLAMA3_8B_TOML)
    res = _cli("torchtitan", "job.toml", "--node", "dgx-a100", "--nodes", "8", "--out", "s.yaml", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    text = (tmp_path / "s.yaml").read_text()
    assert text.startswith("# Imported by `dtsim import` from job.toml") and "#   optimizer.lr" in text
    assert simulator.load_scenario(tmp_path / "s.yaml").dp == 64
    res = _cli("megatron", "--node", "dgx-a100", "--nodes", "16", "--", *GPT3_175B, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "framework: megatron-core" in res.stdout and "pp: 16" in res.stdout


@pytest.mark.parametrize(("args", "names"), [
    (["megatron", "--node", "dgx-a100", "--nodes", "8", "--", *GPT3_175B], "--pipeline-model-parallel-size"),
    (["megatron", "--node", "dgx-a100", "--nodes", "16", "--", *GPT3_175B, "--tensor-model-parallel-size", "5"],
     "--tensor-model-parallel-size"),
    (["megatron", "--node", "dgx-a100", "--nodes", "32", "--", *GPT3_175B, "--global-batch-size", "1537"],
     "--global-batch-size"),
    (["torchtitan", "bad.toml", "--node", "dgx-a100", "--nodes", "1"], "not valid TOML"),
    (["torchtitan", "missing.toml", "--node", "dgx-a100", "--nodes", "1"], "missing.toml"),
    (["deepspeed", "bad.json", "--model", "config.json", "--node", "dgx-a100", "--nodes", "1"], "not valid JSON"),
])
def test_cli_contradictions_exit_2_with_one_line(tmp_path: Path, args: list[str], names: str) -> None:
    (tmp_path / "bad.toml").write_text("[training\nseq_len = 1\n")
    (tmp_path / "bad.json").write_text("{\"train_batch_size\": 8,}")
    (tmp_path / "config.json").write_text(json.dumps(HF_LLAMA))
    res = _cli(*args, cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0], res.stderr
    assert res.stdout == ""


def test_torchtitan_loss_compiled_only_in_files_of_that_era() -> None:
    """torchtitan compiles the loss with the model from February 2025 on: a compiled file with
    ``local_batch_size`` (June 2025 on) gets the fused loss; a December 2024 file (``batch_size``,
    no ``[compile]``) keeps the eager fp32 loss."""
    toml = '[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 2\nseq_len = 8192\ncompile = true\n'
    new = import_torchtitan(toml, source="job.toml", **_cluster("dgx-h100", 1, 8)).scenario["training"]
    old = import_torchtitan(toml.replace("local_batch_size", "batch_size"), source="job.toml",
                            **_cluster("dgx-h100", 1, 8)).scenario["training"]
    assert (new["cross_entropy"], old["cross_entropy"]) == ("fused", "eager-fp32")
