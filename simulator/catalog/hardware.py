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
    deepep_efficiency: Fraction | None = Field(
        None, description="bandwidth DeepEP's normal dispatch / combine kernels reach over NVLink / line rate, "
        "measured (null: as nccl_efficiency)")


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
    """How the GPUs of a node are connected."""

    kind: Literal["nvswitch", "nvlink-mesh", "pcie", "torus"] = Field(
        description="nvswitch: every GPU's NVLinks on NVSwitches; nvlink-mesh: GPU-to-GPU NVLink bricks "
        "(nvlink_pairs); pcie: through PCIe switches and CPUs only; torus: a device-to-device grid (dims)")
    nvls: bool = Field(False, description="the NVSwitches do NVLink SHARP (in-switch reduction)")
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
    """The PCIe tree of a node (x16 links of the generation's rate)."""

    generation: int = Field(ge=3, le=6, description="PCIe generation (3: 15.75 GB/s, 4: 31.5 GB/s, 5: 63 GB/s per "
                            "x16 link and direction)")
    switches: int = Field(ge=0, description="PCIe switches; 0 = GPUs and NICs hang off the CPU root ports")
    cpu_sockets: int = Field(1, ge=1, description="CPU sockets (PCIe root complexes)")

    @property
    def x16_bytes_per_s(self) -> float:
        return PCIE_X16_BYTES_PER_S.get(self.generation, 63.0e9)


class NicSpec(Frozen):
    """The scale-out NICs of a node."""

    count: int = Field(ge=1, description="NICs per node")
    bandwidth_bytes_per_s: Rate = Field(alias="bandwidth", description="one NIC, one direction")
    transport: TransportKind = Field(description="the transport the NICs speak (topologies/transports.yaml)")
    efficiency: Fraction | None = Field(
        None, description="this node's NICs reach a different fraction of line rate than the transport's default "
        "(e.g. an older NIC generation)")
    nccl_protocols: list[Literal["LL", "LL128", "Simple"]] | None = Field(
        None, description="the NCCL protocols collectives may use on this node type when its network plugin "
        "restricts them (aws-ofi-nccl sets NCCL_PROTO=simple for the whole process where the EFA endpoint "
        "lacks 128-byte in-order delivery); null = every protocol")
    transport_variant: str | None = Field(
        None, description="the topologies/transports.yaml entry whose parameters this node's NICs take where they "
        "differ from their transport's (p5.48xlarge's EFAv2: efa-v2); null = the transport's own entry")

    @field_validator("nccl_protocols")
    @classmethod
    def _simple_allowed(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and "Simple" not in value:
            raise ValueError("nccl_protocols must include Simple (NCCL always keeps it)")
        return value


class NodeTypeSpec(Frozen):
    """A node type: its GPUs, their interconnect, PCIe, NICs and host."""

    name: str = Field(description="the node type's name (what cluster.node gives)")
    description: str = Field("", description="free text")
    vendor: str = Field("", description="free text, e.g. AWS, NVIDIA")
    gpu: str = Field(description="GPU type (topologies/gpus.yaml)")
    gpus: int = Field(ge=1, description="GPUs per node")
    intra_node: IntraNodeSpec = Field(description="how the GPUs are connected")
    pcie: PcieSpec = Field(description="the PCIe tree")
    nics: NicSpec = Field(description="the scale-out NICs")
    host_memory_bytes: Bytes | None = Field(None, alias="host_memory", description="host DRAM")
    host_memory_bandwidth_bytes_per_s: Rate | None = Field(
        None, alias="host_memory_bandwidth",
        description="host DRAM bandwidth; default: 204.8 GB/s per CPU socket (8 channels of DDR4-3200)")
    cpu_cores: int | None = Field(None, description="CPU cores (informative)")
    sources: list[str] = Field(min_length=1, description="where every number above comes from")

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
    message_s: Seconds = Field(
        0.0, alias="message_cost", description="time a GPU's network proxy spends on each message it posts; "
        "the messages of one GPU take turns (charged where the chunking is NCCL's NVLSTree's)")
    ll128: bool = Field(False, description="NCCL's LL128 protocol may cross this transport (its 128-byte stores "
                        "arrive whole and in order)")
    sources: list[str] = Field(min_length=1)


class NcclConstants(Frozen):
    """NCCL cost-model constants (``topologies/nccl.yaml``); latencies in seconds."""

    base_latency: dict[str, dict[str, Seconds]]
    hop_latency: dict[str, dict[str, dict[str, Seconds]]]
    nvls_latency: Seconds
    nvls_efficiency: Fraction
    protocol_bandwidth: dict[str, dict[str, Fraction]]
    ll_max_bytes: Bytes
    ll_max_bus_bandwidth_one_node: dict[str, Rate] = Field(default_factory=dict)
    ll128_max_bytes: Bytes
    ring_plateau_factor: float = Field(ge=1)
    tree_correction: dict[str, list[Fraction]]
    simple_step_bytes: Bytes
    nvls_channels: int = Field(16, ge=1)
    overlap_compute_slowdown: float = Field(ge=0)
