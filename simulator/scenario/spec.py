"""The scenario format (shared/CONTRACT.md): model + cluster + parallelism + training + sim.

Every model is closed (``extra="forbid"``), frozen, and validated field by field; the
cross-field rules at the end of :class:`Scenario` (the parallel layout must tile the
cluster, tp must divide the heads, the batch must split into micro-batches, ...) raise
:class:`~simulator.errors.InfeasibleError` naming the field to change.

Quantities are stored in SI units; files may write them with units (``"400Gbps"``).
"""

from __future__ import annotations

import hashlib
import json
import math
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PositiveInt, ValidationError, ValidationInfo, field_validator, model_validator

from simulator.errors import InfeasibleError, ScenarioError
from simulator.scenario import hardware
from simulator.scenario.fabric import FabricSpec, FatTreeFabric, TorusFabric, with_default_kind
from simulator.scenario.presets import load_preset
from simulator.scenario.types import Bytes, Frozen, Precision
from simulator.scenario.yamlio import error_from_validation, load_mapping, to_plain
from simulator.units import MiB

__all__ = [
    "ModelSpec",
    "FabricSpec",
    "ClusterSpec",
    "DdpOptions",
    "ZeroOptions",
    "FsdpOptions",
    "MicsOptions",
    "ParallelismSpec",
    "TrainingSpec",
    "SimSpec",
    "Scenario",
    "Sharding",
    "Recompute",
    "PipelineSchedule",
]

Sharding = Literal["none", "zero1", "zero2", "zero3", "fsdp", "hsdp", "mics"]
Recompute = Literal["none", "selective", "full"]
PipelineSchedule = Literal["gpipe", "1f1b", "interleaved"]


def _base_dir(info: ValidationInfo) -> Path:
    context = info.context or {}
    return Path(context.get("base_dir") or Path.cwd())


def _resolve_path(value: str, base: Path) -> str:
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else (base / path).resolve())


# ----------------------------------------------------------------------------------------
# model


class ModelSpec(Frozen):
    """A decoder (or encoder) transformer: the parallelism-agnostic shape of the network."""

    name: str | None = Field(None, description="free text, e.g. 'GPT-3 175B'")
    preset: str | None = Field(None, description="preset in scenarios/models/ that the fields below override")
    layers: PositiveInt = Field(description="transformer blocks")
    hidden: PositiveInt = Field(description="model width h")
    heads: PositiveInt = Field(description="attention heads a")
    kv_heads: PositiveInt | None = Field(None, description="key/value heads (GQA when < heads); default = heads")
    ffn_hidden: PositiveInt | None = Field(None, description="MLP inner width; default = 4 * hidden")
    seq_len: PositiveInt = Field(description="sequence length s in tokens")
    vocab: PositiveInt = Field(description="vocabulary size V")
    mlp: Literal["gelu", "swiglu"] = Field("gelu", description="gelu: 2 matrices; swiglu: 3 (gate, up, down)")
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position_embedding: Literal["learned", "rotary"] = Field(
        "learned", description="learned: a seq_len x hidden table; rotary: no parameters"
    )
    tied_embeddings: bool = Field(True, description="output projection shares the input embedding matrix")
    causal: bool = Field(True, description="causal (decoder) attention; false for BERT-style encoders")
    bias: bool = Field(True, description="linear layers and norms carry bias vectors")
    dropout: bool = Field(True, description="dropout after attention and MLP (stores 1-byte masks)")
    source: str | None = Field(None, description="citation for the architecture")

    @model_validator(mode="before")
    @classmethod
    def _resolve_preset(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = {"preset": value}
        if not isinstance(value, dict) or not value.get("preset"):
            return _fill_model_defaults(value)
        name = value["preset"]
        if not isinstance(name, str):
            raise ValueError("preset must be a preset name")
        data, root, path = load_preset(name)
        data.setdefault("preset", name)
        try:
            ModelSpec.model_validate(_fill_model_defaults({**data, "preset": None}))
        except ValidationError as exc:
            raise error_from_validation(exc, root=root, file=path, model=ModelSpec) from None
        overrides = {k: v for k, v in value.items() if k != "preset"}
        merged = {**data, **overrides, "preset": name}
        # an explicit override of heads without kv_heads keeps MHA semantics of the override
        return _fill_model_defaults(merged)

    @model_validator(mode="after")
    def _shapes(self) -> ModelSpec:
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} is not divisible by kv_heads={self.kv_heads}")
        return self

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def label(self) -> str:
        return self.name or self.preset or f"{self.layers}L-{self.hidden}h"


def _fill_model_defaults(value: Any) -> Any:
    if isinstance(value, dict):
        value = dict(value)
        if value.get("kv_heads") is None and "heads" in value:
            value["kv_heads"] = value["heads"]
        if value.get("ffn_hidden") is None and isinstance(value.get("hidden"), int):
            value["ffn_hidden"] = 4 * value["hidden"]
    return value


# ----------------------------------------------------------------------------------------
# cluster


class ClusterSpec(Frozen):
    """Which machines, how many, and how they are wired."""

    node: str | None = Field(None, description="a node type from topologies/nodes/ or a path to a node YAML file")
    nodes: PositiveInt | None = Field(None, description="number of nodes (required)")
    gpu: str | None = Field(None, description="override the node's GPU type")
    gpus_per_node: PositiveInt | None = Field(None, description="use only this many GPUs of each node")
    calibration: str | None = Field(None, description="compute/communication profile YAML (dtsim calibrate)")
    fabric: FabricSpec = Field(default_factory=FatTreeFabric)
    topology: str | None = Field(None, description="a cluster file holding these same keys instead")

    @field_validator("fabric", mode="before")
    @classmethod
    def _default_fabric_kind(cls, value: Any) -> Any:
        return with_default_kind(value)

    @model_validator(mode="before")
    @classmethod
    def _load_topology_file(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, dict):
            return value
        base = _base_dir(info)
        value = dict(value)
        if value.get("topology"):
            path = Path(_resolve_path(str(value["topology"]), base))
            root = load_mapping(path, "a cluster file (node, nodes, fabric, ...)")
            data = to_plain(root)
            if "topology" in data:
                raise ScenarioError("a cluster file cannot name another topology", field="topology", file=str(path))
            file_fabric = data.pop("fabric", {}) or {}
            for key in ("node", "calibration"):
                if isinstance(data.get(key), str) and not hardware_node_name(data[key], key):
                    data[key] = _resolve_path(data[key], path.parent)
            own_fabric = value.pop("fabric", {}) or {}
            value = {**data, **value, "topology": str(path), "fabric": {**file_fabric, **own_fabric}}
        for key in ("node", "calibration"):
            if isinstance(value.get(key), str) and not hardware_node_name(value[key], key):
                value[key] = _resolve_path(value[key], base)
        return value

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        if not self.node:
            raise ScenarioError("cluster.node is required (a node type such as 'p4d.24xlarge', or a file)",
                                field="cluster.node")
        if self.nodes is None:
            raise ScenarioError("required field is missing", field="cluster.nodes")
        try:
            node = self.node_type
        except ScenarioError as exc:
            raise ScenarioError(exc.message, field="cluster.node") from None
        gpus = hardware.gpu_catalog()
        if self.gpu is not None and self.gpu not in gpus:
            raise ScenarioError(f"unknown GPU {self.gpu!r} (known: {', '.join(sorted(gpus))})", field="cluster.gpu")
        if self.gpus_per_node is not None and self.gpus_per_node > node.gpus:
            raise ScenarioError(
                f"gpus_per_node={self.gpus_per_node} but a {node.name} node has {node.gpus} GPUs",
                field="cluster.gpus_per_node",
            )
        if self.calibration is not None and not Path(self.calibration).is_file():
            raise ScenarioError(f"calibration profile {self.calibration!r} not found", field="cluster.calibration")
        if isinstance(self.fabric, TorusFabric) and self.fabric.nodes != self.nodes:
            dims = " x ".join(str(d) for d in self.fabric.dims)
            raise ScenarioError(f"a {dims} torus holds {self.fabric.nodes} nodes but cluster.nodes = {self.nodes}; "
                                "the product of dims must equal the node count", field="cluster.fabric.dims")
        return self

    @cached_property
    def node_type(self) -> hardware.NodeTypeSpec:
        assert self.node is not None
        return hardware.node_type(self.node)

    @property
    def gpu_name(self) -> str:
        return self.gpu or self.node_type.gpu

    @property
    def gpu_spec(self) -> hardware.GpuSpec:
        return hardware.gpu_catalog()[self.gpu_name]

    @property
    def n_nodes(self) -> int:
        assert self.nodes is not None
        return self.nodes

    @property
    def gpus_in_node(self) -> int:
        return self.gpus_per_node or self.node_type.gpus

    @property
    def world_size(self) -> int:
        return self.n_nodes * self.gpus_in_node


def hardware_node_name(value: str, key: str) -> bool:
    """True when ``value`` is a catalog name rather than a path (only ``node`` has a catalog)."""
    if key != "node":
        return False
    return not (value.endswith((".yaml", ".yml")) or "/" in value)


# ----------------------------------------------------------------------------------------
# parallelism


class DdpOptions(Frozen):
    """PyTorch DistributedDataParallel (sharding: none)."""

    bucket_size_bytes: Bytes = Field(25 * MiB, alias="bucket_size", description="bucket_cap_mb (PyTorch default 25 MiB)")
    first_bucket_size_bytes: Bytes = Field(
        1 * MiB, alias="first_bucket_size", description="dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB)"
    )
    gradient_as_bucket_view: bool = Field(
        False, description="False (PyTorch default): buckets are copies, costing one more gradient-sized buffer"
    )
    overlap: bool = Field(
        True, description="start each bucket's all-reduce when its gradients are ready (PyTorch DDP, Megatron "
        "--overlap-grad-reduce); false: all-reduce after the whole backward (Megatron-LM before 2023)"
    )


class ZeroOptions(Frozen):
    """DeepSpeed ZeRO knobs (counts are in elements, as in DeepSpeed's config)."""

    reduce_bucket_size: PositiveInt = Field(500_000_000, description="elements per gradient reduction bucket")
    allgather_bucket_size: PositiveInt = Field(500_000_000, description="elements per stage-1/2 parameter all-gather")
    prefetch_bucket_size: PositiveInt = Field(50_000_000, description="stage3_prefetch_bucket_size (elements)")
    param_persistence_threshold: PositiveInt = Field(100_000, description="stage3: smaller params stay unpartitioned")
    max_live_parameters: PositiveInt = Field(1_000_000_000, description="stage3_max_live_parameters (elements)")
    overlap_comm: bool | None = Field(None, description="None = DeepSpeed default (True for stage 3 only)")
    gradient_reduction: Literal["allreduce", "reduce_scatter"] = Field(
        "allreduce", description="stage 1/2: DeepSpeed all-reduces multi-rank buckets (default); reduce_scatter is "
        "Megatron's distributed optimizer"
    )


class FsdpOptions(Frozen):
    """PyTorch FSDP knobs (sharding: fsdp / hsdp)."""

    reshard_after_forward: bool = Field(True, description="True: FULL_SHARD; False: SHARD_GRAD_OP")
    backward_prefetch: Literal["pre", "post", "none"] = Field("pre", description="BackwardPrefetch.BACKWARD_PRE default")
    forward_prefetch: bool = False
    limit_all_gathers: bool = Field(True, description="rate limiter: at most two FSDP units' parameters in flight")


class MicsOptions(Frozen):
    hierarchical_params_gather: bool = Field(
        False, description="mics_hierarchical_params_gather: inter-node all-gather, copy, intra-node all-gather"
    )


class ParallelismSpec(Frozen):
    """How the model is split: tensor, context, pipeline and data parallel sizes, and sharding."""

    tp: PositiveInt = Field(1, description="tensor-parallel size (Megatron), innermost rank axis")
    pp: PositiveInt = Field(1, description="pipeline stages")
    dp: PositiveInt | Literal["auto"] = Field("auto", description="data-parallel size; auto = world / (tp*pp*cp)")
    cp: PositiveInt = Field(1, description="context-parallel size (sequence split across ranks)")
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism (with tp > 1)")
    pipeline_schedule: PipelineSchedule = "1f1b"
    virtual_stages: PositiveInt = Field(1, description="model chunks per pipeline rank (interleaved only)")
    stage_layers: list[PositiveInt] | None = Field(
        None, description="explicit layers per (virtual) pipeline stage, first to last; default: even split"
    )
    sharding: Sharding = Field("none", description="none = DDP; zero1/2/3 = DeepSpeed; fsdp/hsdp = PyTorch; mics")
    shard_group_size: PositiveInt | None = Field(None, description="hsdp / mics: ranks holding one model replica")
    offload_optimizer: bool = Field(False, description="ZeRO-Offload: optimizer states and step on the CPU")
    tp_overlap: bool = Field(True, description="overlap the backward TP collective with the weight-gradient GEMM")
    tp_comm_overlap: bool = Field(
        False, description="Megatron-Core --tp-comm-overlap (Transformer Engine userbuffers): every TP all-gather "
        "and reduce-scatter pipelined with the GEMM it feeds or follows; needs sequence_parallel")
    ddp: DdpOptions = Field(default_factory=DdpOptions)
    zero: ZeroOptions = Field(default_factory=ZeroOptions)
    fsdp: FsdpOptions = Field(default_factory=FsdpOptions)
    mics: MicsOptions = Field(default_factory=MicsOptions)


class TrainingSpec(Frozen):
    micro_batch: PositiveInt = Field(description="sequences per micro-batch per data-parallel rank")
    global_batch: PositiveInt = Field(description="sequences per iteration, all data-parallel ranks together")
    precision: Precision = Field("bf16", description="compute precision; fp16/bf16/fp8 use fp32 master weights")
    recompute: Recompute = Field("none", description="activation recomputation (Korthikanti et al. 2022)")
    flash_attention: bool = Field(True, description="fused attention that never stores the s x s scores")
    flash_attention_version: Literal[1, 2, 3, "triton"] = Field(
        2, description="fused-attention kernel (speed): 1 (FlashAttention, 2022), 2 (FlashAttention-2, default), "
        "3 (FlashAttention-3, Hopper only), triton (the Triton FlashAttention of 2023, e.g. MPT's attn_impl: triton)"
    )
    optimizer: Literal["adam", "sgd"] = Field("adam", description="adam: K = 12 bytes/param of fp32 states")
    grad_reduce_dtype: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="dtype of gradient reductions; auto = the parameters' training dtype"
    )
    grad_clipping: bool = Field(True, description="gradient-norm all-reduce before the optimizer step")


class SimSpec(Frozen):
    network: Literal["flow", "analytical"] = Field(
        "flow", description="flow: max-min fair flows with contention; analytical: closed-form alpha-beta"
    )
    symmetry: Literal["auto", "off"] = Field("auto", description="auto: simulate identical ranks once")
    seed: int = Field(0, ge=0)
    overlap_slowdown: float | None = Field(
        None, ge=0, description="compute slows by this fraction while a collective of the same GPU is in flight; "
        "default: the measured average in topologies/nccl.yaml (0 = ideal overlap)")


# ----------------------------------------------------------------------------------------
# scenario


class Scenario(Frozen):
    """One training job on one cluster: the input of :func:`simulator.simulate`."""

    name: str | None = None
    model: ModelSpec
    cluster: ClusterSpec
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec)
    training: TrainingSpec
    sim: SimSpec = Field(default_factory=SimSpec)

    @model_validator(mode="after")
    def _layout(self) -> Scenario:
        model, par, train, cluster = self.model, self.parallelism, self.training, self.cluster
        world = cluster.world_size
        mp = par.tp * par.pp * par.cp
        where = f"{cluster.n_nodes} x {cluster.gpus_in_node} GPUs of {cluster.node_type.name}"
        if par.dp == "auto":
            if world % mp:
                raise InfeasibleError(
                    f"tp*pp*cp = {par.tp}*{par.pp}*{par.cp} = {mp} does not divide the world size {world} ({where})",
                    field="parallelism",
                )
        elif mp * par.dp != world:
            raise InfeasibleError(
                f"tp*pp*cp*dp = {par.tp}*{par.pp}*{par.cp}*{par.dp} = {mp * par.dp} != world size {world} ({where})",
                field="parallelism.dp",
            )
        if model.heads % par.tp:
            raise InfeasibleError(f"tp={par.tp} does not divide model.heads={model.heads}", field="parallelism.tp")
        if model.n_kv_heads % par.tp:
            raise InfeasibleError(
                f"tp={par.tp} does not divide model.kv_heads={model.n_kv_heads} (Megatron splits KV groups across tp)",
                field="parallelism.tp",
            )
        if model.ffn % par.tp:
            raise InfeasibleError(f"tp={par.tp} does not divide model.ffn_hidden={model.ffn}", field="parallelism.tp")
        dp = self.dp
        if train.global_batch % (train.micro_batch * dp):
            raise InfeasibleError(
                f"global_batch={train.global_batch} is not divisible by micro_batch*dp = "
                f"{train.micro_batch}*{dp} = {train.micro_batch * dp}",
                field="training.global_batch",
            )
        if par.cp > 1 and model.seq_len % (2 * par.cp):
            raise InfeasibleError(
                f"cp={par.cp} needs seq_len divisible by 2*cp (load-balanced causal split); seq_len={model.seq_len}",
                field="parallelism.cp",
            )
        if par.tp_comm_overlap and par.tp > 1 and not par.sequence_parallel:
            raise InfeasibleError(
                "tp_comm_overlap pipelines the sequence-parallel all-gathers and reduce-scatters with their GEMMs: "
                "it needs sequence_parallel: true (as Megatron-Core requires)",
                field="parallelism.tp_comm_overlap",
            )
        self._check_pipeline()
        self._check_sharding()
        if train.flash_attention_version == 3 and cluster.gpu_spec.architecture != "hopper":
            raise InfeasibleError(
                f"FlashAttention-3 needs a Hopper GPU ({cluster.gpu_spec.full_name} is {cluster.gpu_spec.architecture})",
                field="training.flash_attention_version",
            )
        peak = cluster.gpu_spec.peak_flops_per_s(train.precision)
        if peak is None:
            raise InfeasibleError(
                f"{cluster.gpu_spec.full_name} has no {train.precision} tensor cores", field="training.precision"
            )
        return self

    def _check_pipeline(self) -> None:
        par, m = self.parallelism, self.micro_batches
        if par.virtual_stages > 1 and par.pipeline_schedule != "interleaved":
            raise InfeasibleError(
                f"virtual_stages={par.virtual_stages} needs pipeline_schedule: interleaved",
                field="parallelism.virtual_stages",
            )
        if par.pipeline_schedule == "interleaved":
            if par.pp < 2 or par.virtual_stages < 2:
                raise InfeasibleError(
                    "the interleaved schedule needs pp >= 2 and virtual_stages >= 2",
                    field="parallelism.virtual_stages",
                )
            if m % par.pp:
                raise InfeasibleError(
                    f"the interleaved schedule needs the micro-batch count ({m} = global_batch / (micro_batch*dp)) "
                    f"to be a multiple of pp={par.pp}",
                    field="parallelism.pipeline_schedule",
                )
        _ = self.stage_layer_counts  # raises when the layers cannot be split

    def _check_sharding(self) -> None:
        par, dp = self.parallelism, self.dp
        if par.sharding in ("hsdp", "mics"):
            if par.shard_group_size is None:
                raise InfeasibleError(f"sharding: {par.sharding} needs shard_group_size", field="parallelism.shard_group_size")
            if dp % par.shard_group_size:
                raise InfeasibleError(
                    f"shard_group_size={par.shard_group_size} does not divide dp={dp}",
                    field="parallelism.shard_group_size",
                )
        elif par.shard_group_size is not None:
            raise InfeasibleError(
                f"shard_group_size only applies to sharding: hsdp or mics (sharding is {par.sharding})",
                field="parallelism.shard_group_size",
            )
        if par.pp > 1 and par.sharding in ("zero2", "zero3", "mics"):
            raise InfeasibleError(
                f"DeepSpeed does not combine {par.sharding} with pipeline parallelism (pp={par.pp}); "
                "use zero1 (Megatron distributed optimizer), fsdp or hsdp",
                field="parallelism.sharding",
            )
        if par.offload_optimizer and par.sharding in ("none", "hsdp"):
            raise InfeasibleError(
                "offload_optimizer (ZeRO-Offload) needs a ZeRO stage, fsdp or mics", field="parallelism.offload_optimizer"
            )

    # -- derived sizes ------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    @property
    def dp(self) -> int:
        par = self.parallelism
        if par.dp == "auto":
            return self.world_size // (par.tp * par.pp * par.cp)
        return par.dp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per pipeline per iteration: global_batch / (micro_batch * dp)."""
        return max(1, self.training.global_batch // (self.training.micro_batch * self.dp))

    @property
    def tokens_per_step(self) -> int:
        return self.training.global_batch * self.model.seq_len

    @cached_property
    def stage_layer_counts(self) -> tuple[int, ...]:
        """Transformer layers of each virtual stage, in model order (pp * virtual_stages entries).

        An even split when pp*v divides the layers; otherwise, as Llama 3 did for 126 layers
        on 16 stages, one layer fewer on the last (and then first) stage, which also carry the
        logits (and embedding); deficits beyond two layers need ``stage_layers``.
        """
        par, layers = self.parallelism, self.model.layers
        stages = par.pp * par.virtual_stages
        if par.stage_layers is not None:
            if len(par.stage_layers) != stages or sum(par.stage_layers) != layers:
                raise InfeasibleError(
                    f"stage_layers needs one entry per (virtual) pipeline stage, pp*virtual_stages = {stages}, "
                    f"summing to model.layers={layers}; got {len(par.stage_layers)} summing to {sum(par.stage_layers)}",
                    field="parallelism.stage_layers",
                )
            return tuple(par.stage_layers)
        per = math.ceil(layers / stages)
        deficit = per * stages - layers
        if deficit == 0:
            return (per,) * stages
        if deficit <= 2 and stages >= 2 and per >= 2:
            counts = [per] * stages
            counts[-1] -= 1
            if deficit == 2:
                counts[0] -= 1
            return tuple(counts)
        raise InfeasibleError(
            f"pp*virtual_stages = {par.pp}*{par.virtual_stages} = {stages} does not divide model.layers={layers}; "
            "set parallelism.stage_layers to split them unevenly",
            field="parallelism.pp",
        )

    def content_hash(self) -> str:
        """SHA-256 of the canonical JSON of this scenario (stable across runs and machines)."""
        payload = json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()

    @field_validator("name")
    @classmethod
    def _strip(cls, value: str | None) -> str | None:
        return value.strip() if isinstance(value, str) else value
