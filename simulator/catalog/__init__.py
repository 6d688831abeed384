"""Catalog stage: GPU, node-type, transport and NCCL data from ``topologies/``, model presets
from ``scenarios/models/`` and calibration profiles, held by an explicit :class:`Catalog`.

Load one with :meth:`Catalog.load` (``dirs=`` another data folder) or take the shipped one
with :func:`default_catalog`, and pass it on: ``load_scenario(path, catalog=...)``,
``Scenario.model_validate(mapping, context={"catalog": ...})``.
"""

from simulator.catalog.catalog import Catalog, CatalogDirs, Preset, default_catalog, forget_default_catalog
from simulator.catalog.frameworks import FrameworkProfile, FrameworkSetting, NotModelled
from simulator.catalog.hardware import (
    PCIE_X16_BYTES_PER_S,
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
)
from simulator.catalog.profiles import CommFit, CurveSpec, ProfileSpec

__all__ = [
    "Catalog",
    "CatalogDirs",
    "Preset",
    "FrameworkProfile",
    "FrameworkSetting",
    "NotModelled",
    "default_catalog",
    "forget_default_catalog",
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
    "CurveSpec",
    "CommFit",
    "ProfileSpec",
]
