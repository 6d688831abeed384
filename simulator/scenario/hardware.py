"""The hardware catalog's schemas and lookups, kept under their old names.

The schemas live in :mod:`simulator.catalog.hardware` and the data in a
:class:`~simulator.catalog.Catalog`. The functions below take that catalog as an argument
(default: :func:`~simulator.catalog.default_catalog`, which re-reads changed files); they
hold no data themselves. ``cache_clear`` on them (from when they were ``functools.cache``
functions) drops the default catalog.
"""

from __future__ import annotations

from pathlib import Path

from simulator.catalog import (
    PCIE_X16_BYTES_PER_S,
    Catalog,
    GpuSpec,
    IntraNodeSpec,
    LinkKind,
    NcclConstants,
    NicSpec,
    NodeTypeSpec,
    NvlinkSpec,
    PcieSpec,
    PeakFlops,
    TransportKind,
    TransportSpec,
    default_catalog,
    forget_default_catalog,
)

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
    "gpu_catalog",
    "node_type",
    "node_type_names",
    "transport",
    "nccl_constants",
    "PCIE_X16_BYTES_PER_S",
]


def gpu_catalog(catalog: Catalog | None = None) -> dict[str, GpuSpec]:
    """GPU specs by name."""
    return (catalog or default_catalog()).gpus


def node_type_names(catalog: Catalog | None = None) -> list[str]:
    return (catalog or default_catalog()).node_type_names()


def node_type(name_or_path: str, base_dir: Path | None = None, catalog: Catalog | None = None) -> NodeTypeSpec:
    """Look up a node type by catalog name, or load it from a YAML file path."""
    return (catalog or default_catalog()).node_type(name_or_path, base_dir)


def _load_node_type(path: Path, catalog: Catalog | None = None) -> NodeTypeSpec:
    return (catalog or default_catalog()).node_type(str(path))


def _transports(catalog: Catalog | None = None) -> dict[str, TransportSpec]:
    return (catalog or default_catalog()).transports


def transport(kind: str, catalog: Catalog | None = None) -> TransportSpec:
    """The transport ``kind`` (``infiniband``, ``efa``, ``ethernet-tcp``, ``pcie``)."""
    return (catalog or default_catalog()).transport(kind)


def nccl_constants(catalog: Catalog | None = None) -> NcclConstants:
    """NCCL cost-model constants (``topologies/nccl.yaml``)."""
    return (catalog or default_catalog()).nccl


for _fn in (gpu_catalog, _load_node_type, _transports, nccl_constants):
    _fn.cache_clear = forget_default_catalog  # type: ignore[union-attr]
