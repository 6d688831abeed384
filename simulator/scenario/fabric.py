"""The scale-out network between nodes: one model per fabric kind, a union tagged by ``kind``.

Each kind holds only its own fields plus the link overrides every fabric shares
(``transport``, ``nic_bandwidth``, ``latency``, ``efficiency``). A field of another kind is an
error naming the field and the kinds it belongs to. Without ``kind`` a fabric is a fat tree,
so ``fabric: {oversubscription: 2}`` keeps its old meaning.

Adding a fabric touches two places: its model here (and in :data:`FabricSpec`), and its
builder/router registered in :mod:`simulator.cluster.fabrics`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, get_args

from pydantic import Field, PositiveInt

from simulator.catalog import TransportKind
from simulator.fields import Fraction, Frozen, Rate, Seconds

__all__ = [
    "FabricKind",
    "FabricBase",
    "FatTreeFabric",
    "RailOptimizedFabric",
    "SingleSwitchFabric",
    "TorusFabric",
    "FabricSpec",
    "FABRIC_SPECS",
    "with_default_kind",
]

FabricKind = Literal["fat-tree", "rail-optimized", "single-switch", "torus"]
DEFAULT_KIND = "fat-tree"


class FabricBase(Frozen):
    """Fields every fabric kind accepts: overrides of the node type's NICs and transport."""

    transport: TransportKind | None = Field(None, description="override the node type's NIC transport")
    nic_bandwidth_bytes_per_s: Rate | None = Field(
        None, alias="nic_bandwidth", description="bandwidth of ONE NIC, one direction (not of the node: a node has nics.count of them), "
        "overriding the node type's, with a unit, e.g. '400Gbps' (bits) or '50GB/s' (bytes)"
    )
    latency_s: Seconds | None = Field(None, alias="latency", description="override the transport's message latency")
    efficiency: Fraction | None = Field(None, description="override the transport's large-message efficiency")

    @classmethod
    def foreign_field_hint(cls, name: str) -> str | None:
        """When ``name`` is a field of other fabric kinds: a sentence saying which."""
        owners = [kind for kind, model in FABRIC_SPECS.items() if model is not cls and _has_field(model, name)]
        if not owners:
            return None
        own = get_args(cls.model_fields["kind"].annotation)
        return f"{name!r} is a field of {' and '.join(owners)} fabrics, not of {', '.join(own)}"

    @property
    def label(self) -> str:
        """Short text for cluster descriptions (``fat-tree``, ``fat-tree 4:1``, ``torus 4x4``)."""
        return str(getattr(self, "kind"))  # noqa: B009 - every subclass declares kind


def _has_field(model: type[Frozen], name: str) -> bool:
    return any(name in (field, info.alias) for field, info in model.model_fields.items())


class _LeafSpineFields(FabricBase):
    """Two-level Clos geometry shared by fat-tree and rail-optimized fabrics."""

    oversubscription: float = Field(1.0, ge=1.0, description="leaf downlink / uplink capacity (1 = non-blocking)")
    switch_radix: int = Field(64, ge=4, description="ports per switch; half face down on leaves")
    nodes_per_leaf: PositiveInt | None = Field(None, description="default: (switch_radix / 2) / NICs per node")
    spines: PositiveInt | None = Field(None, description="spine switches; default: the leaf's uplink port count")

    @property
    def label(self) -> str:
        kind = str(getattr(self, "kind"))  # noqa: B009
        return kind + (f" {self.oversubscription:g}:1" if self.oversubscription != 1 else "")


class FatTreeFabric(_LeafSpineFields):
    """fat-tree: leaf/spine Clos, every NIC of a node on its leaf (the default)."""

    kind: Literal["fat-tree"] = Field("fat-tree", description="the fabric model; a fabric without kind is a fat tree")


class RailOptimizedFabric(_LeafSpineFields):
    """rail-optimized: NIC i of every node on rail-leaf i; spines join the rails."""

    kind: Literal["rail-optimized"] = Field(description="the fabric model")


class SingleSwitchFabric(FabricBase):
    """single-switch: every NIC on one non-blocking switch (small clusters, idealised fabrics)."""

    kind: Literal["single-switch"] = Field(description="the fabric model")


class TorusFabric(FabricBase):
    """torus: nodes at the points of a 2D or 3D grid, each linked to its neighbours along every
    dimension with wraparound; NICs attach to their node's torus router; dimension-order routing."""

    kind: Literal["torus"] = Field(description="the fabric model")
    dims: tuple[PositiveInt, ...] = Field(
        min_length=2, max_length=3, description="nodes along each dimension, e.g. [4, 4]; the product is cluster.nodes"
    )
    link_bandwidth_bytes_per_s: Rate | None = Field(
        None, alias="link_bandwidth",
        description="one torus link, one direction; default: the node's NIC bandwidth over its 2 x len(dims) ports",
    )

    @property
    def nodes(self) -> int:
        return math.prod(self.dims)

    @property
    def label(self) -> str:
        return "torus " + "x".join(str(d) for d in self.dims)


FABRIC_SPECS: dict[str, type[FabricBase]] = {
    "fat-tree": FatTreeFabric,
    "rail-optimized": RailOptimizedFabric,
    "single-switch": SingleSwitchFabric,
    "torus": TorusFabric,
}

FabricSpec = Annotated[
    FatTreeFabric | RailOptimizedFabric | SingleSwitchFabric | TorusFabric,
    Field(discriminator="kind", description="the scale-out network; kind picks the model (default fat-tree)"),
]


def with_default_kind(value: Any) -> Any:
    """A fabric mapping without ``kind`` is a fat tree (the format's default)."""
    if isinstance(value, dict) and "kind" not in value:
        return {**value, "kind": DEFAULT_KIND}
    return value

