"""Megatron-Core's mixture-of-experts, multi-latent-attention and multi-token-prediction arguments.

Read at NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553. Most flags are generated from
config dataclasses (megatron/training/argument_utils.py, field ``foo_bar`` -> ``--foo-bar``):

- ``--num-experts`` (arguments.py:3518; 0 means none, arguments.py:1648-1649) -> ``model.experts``;
  ``--moe-router-topk`` (transformer_config.py:760, default 2) -> ``experts_per_token``;
  ``--moe-ffn-hidden-size`` (:740; default ``--ffn-hidden-size``, arguments.py:1650-1651) ->
  ``expert_ffn_hidden``; ``--moe-shared-expert-intermediate-size`` (:701, the total width of all
  shared experts) -> ``shared_experts`` = size / moe-ffn-hidden-size (dtsim's shared experts have
  the expert width, so a non-multiple is refused).
- ``--moe-layer-freq`` (arguments.py:3520, ``moe_freq_type`` :327, patterns evaluated by
  ``_eval_pattern`` :245): an integer N makes layers i with i % N == 0 MoE layers, a list gives 1
  (MoE) or 0 (dense) per layer, one per layer (gpt_layer_specs.py:647-656). Mapped to dtsim's
  ``moe_layers``: all MoE -> ``all``; k dense then MoE -> ``{first_dense: k}``; MoE at
  i % n == n-1 -> ``{every: n}``; any other pattern (an integer N > 1 among them) is refused.
  Megatron has no first-k-dense argument at this commit.
- ``--moe-expert-capacity-factor`` (:917) -> ``capacity_factor``; ``--moe-router-score-function``
  softmax | sigmoid (:808) -> ``router`` softmax-topk | sigmoid-topk (sqrtsoftplus is refused).
- ``--expert-model-parallel-size``, ``--expert-tensor-parallel-size`` (model_parallel_config.py:127,
  130) -> ``parallelism.ep``, ``etp``; ep must divide the experts (arguments.py:1655-1658).
- ``--moe-token-dispatcher-type`` (transformer_config.py:891, default allgather) -> ``moe.dispatcher``
  allgather | alltoall, and flex with the deepep backend (``--moe-flex-dispatcher-backend``, :898,
  default deepep; the deprecated ``--moe-enable-deepep``, :895, :1743-1752) -> deepep; hybridep and
  ncclep are refused. ``--moe-shared-expert-overlap`` (:717) -> ``moe.overlap_ep_comm``;
  ``--overlap-moe-expert-parallel-comm`` and ``--delay-wgrad-compute`` (model_parallel_config.py:343,
  348) -> ``moe.overlap_a2a_1f1b``, ``moe.delay_wgrad_compute``.
- ``--multi-latent-attention`` (transformer_config.py:288) -> ``attention: mla`` with ``--q-lora-rank``
  (default None: no query compression), ``--kv-lora-rank`` (32), ``--qk-head-dim`` (128),
  ``--qk-pos-emb-head-dim`` (64), ``--v-head-dim`` (128) (arguments.py:3547-3558).
- ``--mtp-num-layers`` (transformer_config.py:68) -> ``model.mtp_layers``;
  ``--pipeline-model-parallel-layout`` (arguments.py:3103) -> ``parallelism.pipeline_layout``.

Other MoE flags (load balancing, aux loss, grouped GEMM, permute fusion, router dtype, ...) are not
parsed here and so land in the importer's list of arguments read but not modelled.
"""

from __future__ import annotations

import argparse
import ast
import re
from typing import Any

from simulator.errors import ScenarioError

__all__ = ["add_moe_args", "moe_model", "moe_parallelism"]


def add_moe_args(p: argparse.ArgumentParser) -> None:
    """The MoE, MLA and MTP flags dtsim maps, added to the ``pretrain_gpt.py`` parser."""
    for name in ("num-experts", "moe-router-topk", "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size",
                 "expert-model-parallel-size", "expert-tensor-parallel-size", "q-lora-rank", "mtp-num-layers"):
        p.add_argument(f"--{name}", type=int, default=None)
    for name, default in (("kv-lora-rank", 32), ("qk-head-dim", 128), ("qk-pos-emb-head-dim", 64),
                          ("v-head-dim", 128)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--moe-layer-freq", default="1")
    p.add_argument("--moe-expert-capacity-factor", type=float, default=None)
    p.add_argument("--moe-router-score-function", choices=["softmax", "sigmoid", "sqrtsoftplus"], default="softmax")
    p.add_argument("--moe-token-dispatcher-type", choices=["allgather", "alltoall", "flex"], default="allgather")
    p.add_argument("--moe-flex-dispatcher-backend", choices=["deepep", "hybridep", "ncclep"], default="deepep")
    p.add_argument("--pipeline-model-parallel-layout", default=None)
    for name in ("moe-enable-deepep", "moe-shared-expert-overlap", "overlap-moe-expert-parallel-comm",
                 "delay-wgrad-compute", "multi-latent-attention"):
        p.add_argument(f"--{name}", action="store_true")


def _pattern(text: str, layers: int) -> list[int]:
    """``--moe-layer-freq`` as one 0/1 per layer (gpt_layer_specs.py:647-656)."""
    flag = f"--moe-layer-freq {text}"
    if "[" not in text:
        try:
            n = int(text)
        except ValueError:
            raise ScenarioError(f"{flag}: an integer or a Python list expression such as [0]*3+[1]*58") from None
        if n < 1:
            raise ScenarioError(f"{flag}: must be at least 1")
        return [1 if i % n == 0 else 0 for i in range(layers)]
    # the characters _eval_pattern allows (arguments.py:245-253); no ** so no huge powers
    if re.search(r"[^,\d\[\]()+*\s]", text) or "**" in text:
        raise ScenarioError(f"{flag}: only digits, commas, [ ] ( ) + and * are allowed")
    try:
        value = _expand(ast.parse(text, mode="eval").body, flag, limit=layers)
    except (SyntaxError, RecursionError, MemoryError):  # malformed, or nested past Python's parser
        raise ScenarioError(f"{flag}: not a list expression") from None
    if not isinstance(value, list) or any(v not in (0, 1) for v in value):
        raise ScenarioError(f"{flag}: must give a list of 0 (dense) and 1 (MoE) per layer")
    if len(value) != layers:
        raise ScenarioError(f"{flag}: gives {len(value)} layers, --num-layers is {layers} "
                            "(gpt_layer_specs.py:652)")
    return [int(v) for v in value]


def _expand(node: ast.expr, flag: str, *, limit: int) -> list[int]:
    """A list expression of Megatron's pattern grammar (lists of integers joined by + and
    repeated by * an integer), built without eval and refused as soon as it would hold more
    than ``limit`` entries (the layer count): no pattern can make dtsim allocate more."""
    if isinstance(node, ast.List):
        out = [e.value for e in node.elts if isinstance(e, ast.Constant) and type(e.value) is int]
        if len(out) != len(node.elts):
            raise ScenarioError(f"{flag}: a list must hold integers")
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        out = _expand(node.left, flag, limit=limit) + _expand(node.right, flag, limit=limit)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        lst, num = (node.left, node.right) if isinstance(node.right, ast.Constant) else (node.right, node.left)
        times = num.value if isinstance(num, ast.Constant) else None
        if not isinstance(times, int) or isinstance(times, bool):
            raise ScenarioError(f"{flag}: a list can only be repeated by an integer")
        part = _expand(lst, flag, limit=limit)
        if part and times > limit // len(part) + 1:
            raise ScenarioError(f"{flag}: gives more layers than --num-layers ({limit})")
        out = part * max(0, times)
    else:
        raise ScenarioError(f"{flag}: not a list expression")
    if len(out) > limit:
        raise ScenarioError(f"{flag}: gives more layers than --num-layers ({limit})")
    return out


def _moe_layers(text: str, layers: int) -> Any:
    pattern = _pattern(text, layers)
    if all(pattern):
        return "all"
    k = pattern.index(1) if 1 in pattern else layers
    if k < layers and all(pattern[k:]) and not any(pattern[:k]):
        return {"first_dense": k}
    for n in range(2, layers + 1):
        if pattern == [1 if i % n == n - 1 else 0 for i in range(layers)]:
            return {"every": n}
    raise ScenarioError(f"--moe-layer-freq {text}: MoE layers {[i for i, v in enumerate(pattern) if v]} fit none of "
                        "dtsim's moe_layers forms (all, first k dense, or layers i with i % n == n-1)")


def moe_model(a: argparse.Namespace, model: dict[str, Any], ignored: list[str]) -> dict[str, Any]:
    """The ``model`` fields of the MoE, MLA and MTP flags (the dense ``model`` already built)."""
    out: dict[str, Any] = {}
    experts = a.num_experts or 0
    if experts:
        topk = a.moe_router_topk if a.moe_router_topk is not None else 2
        if topk > experts:
            raise ScenarioError(f"--moe-router-topk {topk} exceeds --num-experts {experts}")
        width = a.moe_ffn_hidden_size or model["ffn_hidden"]
        out.update(experts=experts, experts_per_token=topk, expert_ffn_hidden=width,
                   moe_layers=_moe_layers(a.moe_layer_freq, model["layers"]))
        shared = a.moe_shared_expert_intermediate_size
        if shared is not None:
            if shared % width:
                raise ScenarioError(f"--moe-shared-expert-intermediate-size {shared} is not a multiple of the expert "
                                    f"width {width} (--moe-ffn-hidden-size): dtsim's shared experts have that width")
            out["shared_experts"] = shared // width
        if a.moe_expert_capacity_factor is not None:
            out["capacity_factor"] = a.moe_expert_capacity_factor
        if a.moe_router_score_function == "sqrtsoftplus":
            raise ScenarioError("--moe-router-score-function sqrtsoftplus is not modelled: use softmax or sigmoid")
        out["router"] = "sigmoid-topk" if a.moe_router_score_function == "sigmoid" else "softmax-topk"
    else:
        given = [f for f, v in (("--moe-router-topk", a.moe_router_topk), ("--moe-ffn-hidden-size",
                 a.moe_ffn_hidden_size), ("--moe-shared-expert-intermediate-size",
                 a.moe_shared_expert_intermediate_size), ("--moe-expert-capacity-factor",
                 a.moe_expert_capacity_factor)) if v is not None]
        ignored.extend(f"{f} (no --num-experts: a dense model)" for f in given)
    if a.multi_latent_attention:
        out.update(attention="mla", mla={
            "q_lora_rank": a.q_lora_rank, "kv_lora_rank": a.kv_lora_rank, "qk_nope_head_dim": a.qk_head_dim,
            "qk_rope_head_dim": a.qk_pos_emb_head_dim, "v_head_dim": a.v_head_dim})
    if a.mtp_num_layers:
        out["mtp_layers"] = a.mtp_num_layers
    return out


def _dispatcher(a: argparse.Namespace) -> str:
    if a.moe_token_dispatcher_type != "flex":
        if a.moe_enable_deepep:
            raise ScenarioError("--moe-enable-deepep needs --moe-token-dispatcher-type flex "
                                "(transformer_config.py:1744-1745)")
        return str(a.moe_token_dispatcher_type)
    if a.moe_enable_deepep and a.moe_flex_dispatcher_backend == "hybridep":
        raise ScenarioError("--moe-enable-deepep contradicts --moe-flex-dispatcher-backend hybridep "
                            "(transformer_config.py:1746-1747)")
    if not a.moe_enable_deepep and a.moe_flex_dispatcher_backend != "deepep":
        raise ScenarioError(f"--moe-flex-dispatcher-backend {a.moe_flex_dispatcher_backend} is not modelled: "
                            "dtsim's flex dispatcher is DeepEP (--moe-flex-dispatcher-backend deepep)")
    return "deepep"


def moe_parallelism(a: argparse.Namespace, experts: int) -> dict[str, Any]:
    """The ``parallelism`` fields of the expert-parallel, dispatcher and layout flags."""
    out: dict[str, Any] = {}
    ep = a.expert_model_parallel_size or 1
    if ep > 1:
        if not experts:
            raise ScenarioError(f"--expert-model-parallel-size {ep} needs --num-experts (arguments.py:1656)")
        if experts % ep:
            raise ScenarioError(f"--expert-model-parallel-size {ep} does not divide --num-experts {experts} "
                                "(arguments.py:1657)")
        out["ep"] = ep
    if a.expert_tensor_parallel_size is not None:
        out["etp"] = a.expert_tensor_parallel_size
    if experts:
        moe: dict[str, Any] = {"dispatcher": _dispatcher(a)}
        for flag, key in (("moe_shared_expert_overlap", "overlap_ep_comm"),
                          ("overlap_moe_expert_parallel_comm", "overlap_a2a_1f1b"),
                          ("delay_wgrad_compute", "delay_wgrad_compute")):
            if getattr(a, flag):
                if key == "overlap_ep_comm" and a.moe_shared_expert_intermediate_size is None:
                    continue  # only effective with shared experts (transformer_config.py:717-720)
                moe[key] = True
        out["moe"] = moe
    if a.pipeline_model_parallel_layout is not None:
        out["pipeline_layout"] = a.pipeline_model_parallel_layout
    return out
