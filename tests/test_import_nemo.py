"""``dtsim import nemo`` on NeMo's own training configs, reproduced here with their citation.

The key fields of the written scenario are what the config says (checkable by hand); inputs the
scenario does not take are listed; contradictions exit 2 with one line naming the key.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import simulator
from simulator.errors import ScenarioError
from simulator.importers import import_nemo, render

ROOT = Path(__file__).resolve().parents[1]

# NVIDIA/NeMo-Framework-Launcher@26e42fa91d9e608897ce485b4911c263a4b57008
# launcher_scripts/conf/training/llama/llama3_1_70b.yaml: the trainer and the model keys the
# importer reads, with their values in that file (comments, data and checkpoint sections left out).
LLAMA31_70B = """\
trainer:
  num_nodes: 128
  devices: 8
  precision: bf16
  max_steps: 300000
model:
  mcore_gpt: true
  micro_batch_size: 1
  global_batch_size: 2048
  tensor_model_parallel_size: 4
  pipeline_model_parallel_size: 4
  virtual_pipeline_model_parallel_size: 10
  context_parallel_size: 2
  encoder_seq_length: 8192
  max_position_embeddings: ${.encoder_seq_length}
  num_layers: 80
  hidden_size: 8192
  ffn_hidden_size: 28672
  num_attention_heads: 64
  num_query_groups: 8
  hidden_dropout: 0.0
  attention_dropout: 0.0
  normalization: rmsnorm
  make_vocab_size_divisible_by: 128
  bias: false
  activation: fast-swiglu
  position_embedding_type: rope
  share_embeddings_and_output_weights: false
  tokenizer:
    library: huggingface
    type: meta-llama/Meta-Llama-3.1-70B
  megatron_amp_O2: true
  activations_checkpoint_granularity: null
  sequence_parallel: true
  fp8: false
  ub_tp_comm_overlap: true
  optim:
    name: mcore_distributed_optim
    overlap_grad_sync: true
    overlap_param_sync: true
"""

# NVIDIA/NeMo-Framework-Launcher@26e42fa9 launcher_scripts/conf/training/gpt3/175b.yaml (excerpt):
# the FFN width is written with NeMo's multiply resolver.
GPT3_175B = """\
trainer:
  num_nodes: 128
  devices: 8
  precision: bf16
model:
  micro_batch_size: 1
  global_batch_size: 2048
  tensor_model_parallel_size: 4
  pipeline_model_parallel_size: 8
  virtual_pipeline_model_parallel_size: 6
  encoder_seq_length: 2048
  num_layers: 96
  hidden_size: 12288
  ffn_hidden_size: ${multiply:4, ${.hidden_size}}
  num_attention_heads: 96
  make_vocab_size_divisible_by: 128
  tokenizer:
    library: 'megatron'
    type: 'GPT2BPETokenizer'
  sequence_parallel: true
  optim:
    name: mcore_distributed_optim
    bucket_cap_mb: 220
    overlap_grad_sync: true
    overlap_param_sync: true
"""


def _import(text: str, node: str, nodes: int, gpus: int, **kw) -> simulator.Scenario:
    imported = import_nemo(text, source="cfg.yaml", cluster={"node": node, "nodes": nodes}, world=nodes * gpus,
                           where=f"{nodes} x {gpus} {node}", **kw)
    return simulator.Scenario.model_validate(imported.scenario)


def test_llama31_70b_launcher_config() -> None:
    """tp 4 x pp 4 x cp 2 on 1,024 GPUs leaves dp = 1024 / 32 = 32; 2048 / (1 * 32) = 64
    micro-batches. The Llama 3.1 tokenizer's 128,256 tokens padded to a multiple of 128 * tp 4 = 512
    give ceil(128256 / 512) * 512 = 251 * 512 = 128,512. mcore_distributed_optim with both overlap
    flags is zero1 with overlapped reduce-scatter and parameter all-gather, fp32 gradients
    (grad_sync_dtype's default)."""
    s = _import(LLAMA31_70B, "dgx-h100", 128, 8)
    p, m, t = s.parallelism, s.model, s.training
    assert (p.tp, p.pp, p.cp, s.dp, s.micro_batches) == (4, 4, 2, 32, 64)
    assert (p.pipeline_schedule, p.virtual_stages) == ("interleaved", 10)
    assert p.sequence_parallel and p.tp_comm_overlap
    assert p.sharding == "zero1" and p.zero.overlap_comm and p.zero.overlap_param_gather
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.ffn_hidden, m.seq_len, m.vocab) == (
        80, 8192, 64, 8, 28672, 8192, 128512)
    assert (m.mlp, m.norm, m.position_embedding, m.tied_embeddings, m.bias, m.dropout) == (
        "swiglu", "rmsnorm", "rotary", False, False, False)
    assert (t.precision, t.recompute, t.grad_reduce_dtype, s.framework) == ("bf16", "none", "fp32", "nemo")


def test_multiply_resolver_and_gpt2_vocabulary() -> None:
    """``${multiply:4, ${.hidden_size}}`` = 4 * 12288 = 49,152; GPT-2 BPE's 50,257 tokens padded to
    a multiple of 128 * 4 = 512: ceil(50257 / 512) = 99, 99 * 512 = 50,688."""
    s = _import(GPT3_175B, "dgx-a100", 128, 8)
    assert (s.model.ffn_hidden, s.model.vocab, s.parallelism.virtual_stages) == (49152, 50688, 6)


def test_plain_optimizer_with_o2_overlaps_only_without_pipelining() -> None:
    """megatron_amp_O2 with fused_adam all-reduces fp32 gradients in 125 MiB chunks during the
    backward when pp = 1 and sequence parallelism is off; with pp = 2 after the backward."""
    base = GPT3_175B.replace("name: mcore_distributed_optim", "name: fused_adam").replace(
        "  sequence_parallel: true\n", "  sequence_parallel: false\n  megatron_amp_O2: true\n")
    flat = base.replace("pipeline_model_parallel_size: 8", "pipeline_model_parallel_size: 1").replace(
        "virtual_pipeline_model_parallel_size: 6", "virtual_pipeline_model_parallel_size: null")
    s = _import(flat, "dgx-a100", 128, 8)
    assert s.parallelism.sharding == "none" and s.parallelism.ddp.overlap
    assert s.parallelism.ddp.bucket_size_bytes == 125 * 2**20 and s.training.grad_reduce_dtype == "fp32"
    piped = _import(base, "dgx-a100", 128, 8)
    assert not piped.parallelism.ddp.overlap


def test_unused_keys_are_listed() -> None:
    imported = import_nemo(GPT3_175B, source="cfg.yaml", cluster={"node": "dgx-a100", "nodes": 128}, world=1024,
                           where="128 x 8")
    assert "model.optim.bucket_cap_mb" in imported.ignored
    assert "#   model.optim.bucket_cap_mb" in render(imported)


@pytest.mark.parametrize(("edit", "message"), [
    (("type: 'GPT2BPETokenizer'", "type: 'my-tokenizer'"), "--vocab-size"),
    (("global_batch_size: 2048", "global_batch_size: 2047"), "model.global_batch_size"),
    (("tensor_model_parallel_size: 4", "tensor_model_parallel_size: 5"), "model.tensor_model_parallel_size"),
    (("overlap_grad_sync: true", "overlap_grad_sync: false"), "model.optim.overlap_param_sync"),
    (("encoder_seq_length: 2048", "encoder_seq_length: ${.nope}"), "model.nope"),
    (("precision: bf16", "precision: 8"), "trainer.precision"),
])
def test_contradictions_name_the_key(edit: tuple[str, str], message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace(".", r"\.")):
        _import(GPT3_175B.replace(*edit), "dgx-a100", 128, 8)


def test_vocab_size_option_for_unknown_tokenizers() -> None:
    """32,000 tokens (e.g. a Llama 2 SentencePiece model) at tp 4: a multiple of 512 -> 32,256."""
    s = _import(GPT3_175B.replace("type: 'GPT2BPETokenizer'", "type: null"), "dgx-a100", 128, 8, vocab_size=32000)
    assert s.model.vocab == 32256


def test_cli_writes_a_scenario_that_runs(tmp_path: Path) -> None:
    (tmp_path / "cfg.yaml").write_text(LLAMA31_70B)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "simulator.cli", "import", "nemo", "cfg.yaml", "--node", "dgx-h100",
                          "--nodes", "128", "--out", "s.yaml"], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert simulator.load_scenario(tmp_path / "s.yaml").dp == 32
    res = subprocess.run([sys.executable, "-m", "simulator.cli", "import", "nemo", "cfg.yaml", "--node", "dgx-h100",
                          "--nodes", "99"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "does not divide the world size 792" in res.stderr and res.stdout == ""


def test_nemo1_fp8_without_fp8_params_gathers_bf16_and_reduces_fp32() -> None:
    """NeMo 1.x with ``fp8: true`` but no ``fp8_params`` all-gathers bf16 weights; a plain optimizer
    reduces fp32 gradients (fp32 main gradients under O2, fp32 parameters without it), so the
    nemo profile's NeMo 2 values do not leak in."""
    text = GPT3_175B.replace("name: mcore_distributed_optim", "name: fused_adam").replace(
        "  sequence_parallel: true\n", "  sequence_parallel: true\n  fp8: true\n")
    s = _import(text, "dgx-h100", 128, 8)
    assert (s.training.precision, s.training.fp8.all_gather, s.training.grad_reduce_dtype) == ("fp8", "bf16", "fp32")
    s = _import(text.replace("  fp8: true\n", "  fp8: true\n  fp8_params: true\n"), "dgx-h100", 128, 8)
    assert s.training.fp8.all_gather == "fp8"
