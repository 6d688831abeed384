"""Compute (and communication) profiles: the schemas and loading, kept under their old names.

The schemas live in :mod:`simulator.catalog.profiles`; :meth:`simulator.catalog.Catalog.profile`
reads a profile file (again whenever it changes). Built-in profiles live in
``topologies/calibration/builtin/<gpu>.yaml``; a scenario selects a measured one with
``cluster.calibration: PATH``.
"""

from __future__ import annotations

from pathlib import Path

from simulator.catalog import Catalog, CommFit, CurveSpec, ProfileSpec, default_catalog

__all__ = ["CurveSpec", "CommFit", "ProfileSpec", "load_profile_spec", "builtin_profile_path"]


def builtin_profile_path(gpu: str, catalog: Catalog | None = None) -> Path:
    return (catalog or default_catalog()).builtin_profile_path(gpu)


def load_profile_spec(path: str | Path, catalog: Catalog | None = None) -> ProfileSpec:
    """The profile at ``path`` (read again when the file changes)."""
    return (catalog or default_catalog()).profile(path)
