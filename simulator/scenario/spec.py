"""The scenario format (shared/CONTRACT.md): model + cluster + parallelism + training + sim.

Every model is closed (``extra="forbid"``), frozen, and validated field by field; the
cross-field rules at the end of :class:`Scenario` (the parallel layout must tile the
cluster, tp must divide the heads, the batch must split into micro-batches, ...) raise
:class:`~simulator.errors.InfeasibleError` naming the field to change.

Quantities are stored in SI units; files may write them with units (``"400Gbps"``).
The ``model`` and ``parallelism`` sections live in their own modules and are re-exported here.

Validation reads no file once references are resolved: :mod:`simulator.scenario.loader`
resolves model presets and the cluster's node type, GPU, cluster file and calibration path
first (:mod:`simulator.scenario.resolve`), and a mapping given straight to
``Scenario.model_validate`` is resolved the same way, through the catalog given as
``context={"catalog": ...}`` or the default one.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Any

from pydantic import Field, PositiveInt, SerializeAsAny, ValidationInfo, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from simulator.catalog import GpuSpec, NodeTypeSpec
from simulator.errors import InfeasibleError, ScenarioError
from simulator.fields import Frozen
from simulator.scenario.attention import check_attention_kernel, effective_attention_kernel
from simulator.scenario.fabric import FabricSpec, FatTreeFabric, TorusFabric, with_default_kind
from simulator.scenario.faults import FaultsSpec
from simulator.scenario.fp8 import Fp8Spec
from simulator.scenario.framework import GENERIC, Framework, apply_framework, framework_settings, source_of
from simulator.scenario.model import ModelSpec
from simulator.scenario.moe import check_experts
from simulator.scenario.parallelism import (
    DdpOptions,
    FsdpOptions,
    MicsOptions,
    ParallelismSpec,
    PipelineSchedule,
    Sharding,
    ZeroOptions,
    check_dualpipe,
)
from simulator.scenario.pipeline_layout import stage_layer_counts
from simulator.scenario.reliability import ReliabilitySpec
from simulator.scenario.resolve import base_dir_in, catalog_in, is_catalog_name, is_resolved_cluster, resolve_cluster
from simulator.scenario.training import Recompute, SimSpec, TrainingSpec, check_recompute_modules

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
    "Fp8Spec",
    "SimSpec",
    "FaultsSpec",
    "ReliabilitySpec",
    "Scenario",
    "Sharding",
    "Recompute",
    "PipelineSchedule",
]



# ----------------------------------------------------------------------------------------
# cluster


class ClusterSpec(Frozen):
    """Which machines, how many, and how they are wired."""

    node: str | None = Field(None, description="a node type from topologies/nodes/ or a path to a node YAML file")
    nodes: PositiveInt | None = Field(None, description="number of nodes (required)")
    gpu: str | None = Field(None, description="override the node's GPU type")
    gpus_per_node: PositiveInt | None = Field(None, description="use only this many GPUs of each node")
    calibration: str | None = Field(None, description="compute/communication profile YAML (dtsim calibrate); "
                                   "refused unless measured on the cluster's GPU (see calibration_other_device)")
    calibration_other_device: bool = Field(
        False, description="apply a calibration profile measured on another device than the cluster's GPU "
        "(e.g. a CPU profile, to see the job on that CPU)")
    fabric: SerializeAsAny[FabricSpec] = Field(default_factory=FatTreeFabric)
    topology: str | None = Field(None, description="a cluster file holding these same keys instead")

    node_type: SkipJsonSchema[NodeTypeSpec] = Field(
        exclude=True, description="the node type spec: resolved from node (not written in files)")
    gpu_spec: SkipJsonSchema[GpuSpec] = Field(
        exclude=True, description="the GPU spec: resolved from gpu or the node type (not written in files)")

    @field_validator("fabric", mode="before")
    @classmethod
    def _default_fabric_kind(cls, value: Any) -> Any:
        return with_default_kind(value)

    @model_validator(mode="before")
    @classmethod
    def _resolve(cls, value: Any, info: ValidationInfo) -> Any:
        """Resolve names and paths through the context's catalog (no-op on resolved data)."""
        if is_resolved_cluster(value):
            return value
        return resolve_cluster(value, catalog_in(info), base_dir_in(info))

    @model_validator(mode="after")
    def _check(self) -> ClusterSpec:
        if self.nodes is None:
            raise ScenarioError("required field is missing", field="cluster.nodes")
        node = self.node_type
        if self.gpus_per_node is not None and self.gpus_per_node > node.gpus:
            raise ScenarioError(
                f"gpus_per_node={self.gpus_per_node} but a {node.name} node has {node.gpus} GPUs",
                field="cluster.gpus_per_node",
            )
        if isinstance(self.fabric, TorusFabric) and self.fabric.nodes != self.nodes:
            dims = " x ".join(str(d) for d in self.fabric.dims)
            raise ScenarioError(f"a {dims} torus holds {self.fabric.nodes} nodes but cluster.nodes = {self.nodes}; "
                                "the product of dims must equal the node count", field="cluster.fabric.dims")
        return self

    def __hash__(self) -> int:
        # the resolved specs hold lists; the written fields (and the node and GPU they name) identify a cluster
        return hash(self.model_dump_json())

    @property
    def gpu_name(self) -> str:
        return self.gpu or self.node_type.gpu

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
    return is_catalog_name(value, key)


# ----------------------------------------------------------------------------------------
# scenario


class Scenario(Frozen):
    """One training job on one cluster: the input of :func:`simulator.simulate`."""

    name: str | None = Field(None, description="free text naming the run in the summary, report and traces")
    framework: Framework = Field(
        GENERIC, description="the training framework whose defaults apply (topologies/frameworks/<name>.yaml, each "
        "value cited there): generic (dtsim's defaults) | megatron-core | nemo | megatron-lm | deepspeed | "
        "pytorch-fsdp | torchtitan | llm-foundry. Explicit scenario fields (and --set) always win over the profile; "
        "the profile wins over dtsim's defaults")
    model: ModelSpec
    cluster: ClusterSpec
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec)
    training: TrainingSpec
    sim: SimSpec = Field(default_factory=SimSpec)
    faults: FaultsSpec = Field(default_factory=FaultsSpec, description="perturbations inside the iteration: "
                               "stragglers, compute jitter, degraded or failed links (simulator/scenario/faults.py)")
    reliability: ReliabilitySpec | None = Field(
        None, description="failure rates, checkpointing and restarts of the whole run (dtsim goodput; "
        "simulator/scenario/reliability.py); an empty mapping takes the Llama 3 defaults. The step simulation "
        "never reads it")

    settings_source: SkipJsonSchema[dict[str, str]] = Field(
        default_factory=dict, exclude=True, description="where each setting of the framework profile came from: "
        "dotted path -> the framework's name, 'scenario' or 'default' (resolved, not written in files)")

    @model_validator(mode="before")
    @classmethod
    def _apply_framework(cls, value: Any, info: ValidationInfo) -> Any:
        """Put the framework profile's values under the mapping (no-op once applied)."""
        if isinstance(value, dict):
            return apply_framework(value, lambda: catalog_in(info))
        return value

    def source_of(self, path: str) -> str:
        """Where the effective value at the dotted ``path`` came from: the framework's name (its
        profile), ``"scenario"`` (the file or ``--set``) or ``"default"`` (dtsim's default)."""
        return source_of(self, path)

    @property
    def attention_kernel(self) -> str:
        """The attention kernel the scenario runs (:mod:`simulator.scenario.attention`)."""
        return effective_attention_kernel(self.training, self.source_of)

    def framework_settings(self) -> list[tuple[str, Any, str]]:
        """(path, effective value, source) of the profile's settings that differ from ``generic``."""
        return framework_settings(self)

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
        check_experts(model, par, train, self.world_size)
        check_recompute_modules(model, par, train)
        check_attention_kernel(train, self.source_of, cluster.gpu_spec.architecture, cluster.gpu_spec.full_name)
        peak = cluster.gpu_spec.peak_flops_per_s(train.precision)
        if peak is None:
            raise InfeasibleError(
                f"{cluster.gpu_spec.full_name} has no {train.precision} tensor cores", field="training.precision"
            )
        if train.precision == "fp8" and train.fp8.recipe == "mxfp8" and cluster.gpu_spec.architecture != "blackwell":
            raise InfeasibleError(f"mxfp8 scales blocks in the tensor cores of Blackwell GPUs ({cluster.gpu_spec.full_name} "
                                  f"is {cluster.gpu_spec.architecture})", field="training.fp8.recipe")
        for where, message in self.faults.check_ranges(world, cluster.n_nodes, cluster.gpus_in_node,
                                                       cluster.node_type.nics.count):
            raise ScenarioError(message, field=where)
        jitter = self.faults.jitter
        if self.sim.samples > 1 and (jitter is None or jitter.compute_cv == 0):
            raise InfeasibleError(f"sim.samples: {self.sim.samples} iterations differ only in their jitter draws; "
                                  "set faults.jitter.compute_cv > 0 (or samples: 1)", field="sim.samples")
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
        if par.pipeline_schedule == "dualpipe":
            check_dualpipe(par, m)
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

    @property
    def edp(self) -> int:
        """Expert data-parallel size: world / (pp * ep * etp) (Megatron-Core parallel_state.py:880)."""
        par = self.parallelism
        return self.world_size // (par.pp * par.ep * par.expert_tp)

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
        """Transformer layers of each virtual stage, in model order (pp * virtual_stages entries):
        from ``pipeline_layout``, ``stage_layers`` or an even split (scenario/pipeline_layout.py)."""
        par = self.parallelism
        return stage_layer_counts(par.pp, par.virtual_stages, self.model.layers, par.stage_layers,
                                  par.pipeline_layout, self.model.mtp_layers)

    def content_hash(self) -> str:
        """SHA-256 of the canonical JSON of this scenario (stable across runs and machines)."""
        data = self.model_dump(mode="json", by_alias=True)
        if data.get("framework") == GENERIC:
            del data["framework"]  # a generic scenario keeps the hash it had before frameworks existed
        if self.faults.empty:
            del data["faults"]  # so does a scenario without faults
        if self.sim.samples == 1:
            del data["sim"]["samples"]  # and one of one sample
        if data.get("reliability") is None:
            data.pop("reliability", None)  # likewise a scenario without a reliability section
        payload = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()

    @field_validator("name")
    @classmethod
    def _strip(cls, value: str | None) -> str | None:
        return value.strip() if isinstance(value, str) else value
