"""Schemas of the hardware data in ``topologies/``: GPUs, node types, transports, NCCL constants.

The files are data: GPU specifications (``gpus.yaml``), node types (``nodes/*.yaml``),
transports (``transports.yaml``) and NCCL's cost-model constants (``nccl.yaml``). These
models define their format; :class:`simulator.catalog.Catalog` loads them and
``simulator.cluster`` builds graphs from them.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from simulator.fields import Bytes, FlopRate, Fraction, Frozen, Precision, Rate, Seconds

__all__ = [
    "PeakFlops",
    "NvlinkSpec",
    "GpuSpec",
    "IntraNodeSpec",
    "PcieSpec",
    "NicSpec",
    "NodeTypeSpec",
    "TransportSpec",
    "NcclConstants",
    "LinkKind",
    "TransportKind",
    "PCIE_X16_BYTES_PER_S",
]

TransportKind = Literal["infiniband", "efa", "ethernet-tcp"]
LinkKind = Literal["nvlink", "neuronlink", "pcie", "host", "infiniband", "efa", "ethernet-tcp"]

# One direction of a x16 link: 8/16/32 GT/s x 16 lanes x 128/130 encoding / 8 bits
# (PCIe 3.0/4.0/5.0 signalling rates; shared/REFERENCE.md §10.1).
PCIE_X16_BYTES_PER_S: dict[int, float] = {3: 15.75e9, 4: 31.5e9, 5: 63.0e9}


class PeakFlops(Frozen):
    """Dense tensor-core peak per precision in FLOP/s (``fp32`` is the non-tensor rate)."""

    fp32: FlopRate | None = None
    tf32: FlopRate | None = None
    fp16: FlopRate | None = None
    bf16: FlopRate | None = None
    fp8: FlopRate | None = None

    def of(self, precision: Precision) -> float | None:
        return getattr(self, precision)  # type: ignore[no-any-return]


class NvlinkSpec(Frozen):
    generation: int = Field(ge=1)
    links: int = Field(ge=1)
    bandwidth_bytes_per_s: Rate = Field(alias="bandwidth", description="one direction, all links of one GPU")
    nccl_efficiency: Fraction = Field(description="bus bandwidth NCCL reaches / line rate, large ring collectives")
    nvls: bool = Field(False, description="NVLink SHARP (in-switch reduction) supported")


class GpuSpec(Frozen):
    name: str
    full_name: str
    architecture: str
    memory_bytes: Bytes = Field(alias="memory")
    memory_bandwidth_bytes_per_s: Rate = Field(alias="memory_bandwidth")
    peak_flops: PeakFlops
    nvlink: NvlinkSpec | None = None
    pcie_generation: int = Field(4, ge=3, le=6)
    sm_count: int | None = None
    sources: list[str] = Field(min_length=1)

    def peak_flops_per_s(self, precision: Precision) -> float | None:
        return self.peak_flops.of(precision)


class IntraNodeSpec(Frozen):
    kind: Literal["nvswitch", "nvlink-mesh", "pcie", "torus"]
    nvls: bool = False
    link_bandwidth_bytes_per_s: Rate | None = Field(
        None, alias="link_bandwidth",
        description="nvlink-mesh: one NVLink brick, one direction; torus: one device-to-device link, one direction",
    )
    nvlink_pairs: list[tuple[int, int, int]] | None = Field(
        None, description="nvlink-mesh: [gpu_a, gpu_b, bricks] for every directly linked pair"
    )
    dims: tuple[int, ...] | None = Field(None, description="torus: devices along each dimension, e.g. [4, 4]")
    link_efficiency: Fraction | None = Field(
        None, description="torus: fraction of a link's line rate large collectives reach"
    )


class PcieSpec(Frozen):
    generation: int = Field(ge=3, le=6)
    switches: int = Field(ge=0, description="PCIe switches; 0 = GPUs and NICs hang off the CPU root ports")
    cpu_sockets: int = Field(1, ge=1)

    @property
    def x16_bytes_per_s(self) -> float:
        return PCIE_X16_BYTES_PER_S.get(self.generation, 63.0e9)


class NicSpec(Frozen):
    count: int = Field(ge=1)
    bandwidth_bytes_per_s: Rate = Field(alias="bandwidth", description="one NIC, one direction")
    transport: TransportKind
    efficiency: Fraction | None = Field(
        None, description="this node's NICs reach a different fraction of line rate than the transport's default "
        "(e.g. an older NIC generation)")
    nccl_protocols: list[Literal["LL", "LL128", "Simple"]] | None = Field(
        None, description="the NCCL protocols collectives may use on this node type when its network plugin "
        "restricts them (aws-ofi-nccl sets NCCL_PROTO=simple for the whole process where the EFA endpoint "
        "lacks 128-byte in-order delivery); null = every protocol")

    @field_validator("nccl_protocols")
    @classmethod
    def _simple_allowed(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and "Simple" not in value:
            raise ValueError("nccl_protocols must include Simple (NCCL always keeps it)")
        return value


class NodeTypeSpec(Frozen):
    name: str
    description: str = ""
    vendor: str = ""
    gpu: str
    gpus: int = Field(ge=1)
    intra_node: IntraNodeSpec
    pcie: PcieSpec
    nics: NicSpec
    host_memory_bytes: Bytes | None = Field(None, alias="host_memory")
    host_memory_bandwidth_bytes_per_s: Rate | None = Field(None, alias="host_memory_bandwidth")
    cpu_cores: int | None = None
    sources: list[str] = Field(min_length=1)

    @field_validator("intra_node")
    @classmethod
    def _mesh_needs_pairs(cls, value: IntraNodeSpec) -> IntraNodeSpec:
        if value.kind == "nvlink-mesh" and (not value.nvlink_pairs or value.link_bandwidth_bytes_per_s is None):
            raise ValueError("an nvlink-mesh node needs nvlink_pairs and link_bandwidth")
        if value.kind == "torus" and (not value.dims or value.link_bandwidth_bytes_per_s is None):
            raise ValueError("a torus node needs dims and link_bandwidth")
        return value

    @model_validator(mode="after")
    def _torus_holds_every_device(self) -> NodeTypeSpec:
        dims = self.intra_node.dims
        if self.intra_node.kind == "torus" and dims and math.prod(dims) != self.gpus:
            raise ValueError(f"intra_node.dims {dims} hold {math.prod(dims)} devices but the node has gpus: {self.gpus}")
        return self

    @property
    def network_bytes_per_s(self) -> float:
        return self.nics.count * self.nics.bandwidth_bytes_per_s


class TransportSpec(Frozen):
    efficiency: Fraction
    latency_s: Seconds = Field(alias="latency")
    switch_latency_s: Seconds = Field(alias="switch_latency")
    multipath: Literal["single", "spray", "ecmp"]
    per_flow_cap_bytes_per_s: Rate | None = Field(None, alias="per_flow_cap")
    flows_per_connection: int = Field(1, ge=1)
    staged_message_bytes: Bytes = Field(
        0.0, alias="staged_message",
        description="network messages up to this size are copied through host bounce buffers")
    staged_copy_bytes_per_s: Rate | None = Field(
        None, alias="staged_copy", description="copy rate of a staged message; null = no staging cost")
    sources: list[str] = Field(min_length=1)


class NcclConstants(Frozen):
    """NCCL cost-model constants (``topologies/nccl.yaml``); latencies in seconds."""

    base_latency: dict[str, dict[str, Seconds]]
    hop_latency: dict[str, dict[str, dict[str, Seconds]]]
    nvls_latency: Seconds
    nvls_efficiency: Fraction
    protocol_bandwidth: dict[str, dict[str, Fraction]]
    ll_max_bytes: Bytes
    ll128_max_bytes: Bytes
    ring_plateau_factor: float = Field(ge=1)
    tree_correction: dict[str, list[Fraction]]
    simple_step_bytes: Bytes
    overlap_compute_slowdown: float = Field(ge=0)
