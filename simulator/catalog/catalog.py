"""The catalog: hardware data from ``topologies/`` and model presets from ``scenarios/models/``.

A :class:`Catalog` is an explicit object: it reads each file of its folders at most once,
on first use, and keeps what it read. Two catalogs over different folders coexist in one
process (a test, or a notebook comparing an edited GPU table with the shipped one).

:func:`default_catalog` returns the catalog of the shipped data folders
(:mod:`simulator.datadirs`). It is not a frozen global: each call compares the folders and
the modification times and sizes of their files with those the catalog was built from, and
builds a fresh catalog when anything changed, so a notebook sees an edited ``gpus.yaml``
without restarting.

Node files and calibration profiles named by a path outside the catalog folders are read
when asked for (node files each time; profiles again whenever the file changes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from simulator.catalog.frameworks import FrameworkProfile
from simulator.catalog.hardware import GpuSpec, NcclConstants, NodeTypeSpec, TransportSpec
from simulator.catalog.kernels import AttentionKernelsSpec
from simulator.catalog.profiles import ProfileSpec
from simulator.datadirs import models_dir, topologies_dir
from simulator.errors import ScenarioError
from simulator.fields import UNITS_REQUIRED, Frozen
from simulator.yamlio import error_from_validation, load_mapping, load_yaml, to_plain

__all__ = ["CatalogDirs", "Catalog", "Preset", "default_catalog", "forget_default_catalog"]


@dataclass(frozen=True)
class CatalogDirs:
    """The folders a catalog reads: ``topologies`` (gpus.yaml, nodes/, transports.yaml,
    nccl.yaml, calibration/) and ``models`` (model presets)."""

    topologies: Path
    models: Path

    @classmethod
    def default(cls) -> CatalogDirs:
        """The shipped folders (or those under ``DTSIM_DATA_DIR``)."""
        return cls(topologies_dir(), models_dir())

    @classmethod
    def under(cls, root: Path | str) -> CatalogDirs:
        """``root/topologies`` and ``root/scenarios/models``, the layout of a checkout."""
        root = Path(root)
        return cls(root / "topologies", root / "scenarios" / "models")

    @property
    def nodes(self) -> Path:
        return self.topologies / "nodes"

    @property
    def frameworks(self) -> Path:
        return self.topologies / "frameworks"

    @property
    def calibration(self) -> Path:
        return self.topologies / "calibration"

    @property
    def kernels(self) -> Path:
        return self.topologies / "kernels"

    def stamp(self) -> tuple[tuple[str, int, int], ...]:
        """(path, mtime in ns, size) of every YAML file the catalog may read, sorted."""
        files = [*self.topologies.rglob("*.yaml"), *self.models.glob("*.yaml")]
        out = []
        for path in files:
            try:
                stat = path.stat()
            except OSError:
                continue
            out.append((str(path), stat.st_mtime_ns, stat.st_size))
        return tuple(sorted(out))


@dataclass(frozen=True)
class Preset:
    """A model preset: its fields as plain data, the round-trip YAML (for line numbers) and its path."""

    data: dict[str, Any]
    root: Any
    path: str


def _validate(model: type[Frozen], data: Any, path: Path, root: Any, prefix: tuple[Any, ...] = (),
              units_required: bool = True) -> Any:
    """Validate one catalog file; a size, rate or time without a unit is an error (hand-written
    files), except in compute profiles (``units_required=False``), which ``dtsim calibrate``
    writes with SI numbers (seconds, bytes per second, FLOP/s)."""
    try:
        return model.model_validate(data, context={UNITS_REQUIRED: units_required})
    except ValidationError as exc:
        raise error_from_validation(exc, root=root, file=str(path), prefix=prefix, model=model) from None


class Catalog:
    """GPU specs, node types, transports, NCCL constants, presets and profiles of one set of folders.

    Build one with :meth:`load`; each file is read at most once per catalog (node files and
    profiles given by a path outside the folders excepted, see the module docstring).
    """

    def __init__(self, dirs: CatalogDirs) -> None:
        self.dirs = dirs
        self._stamp = dirs.stamp()
        self._gpus: dict[str, GpuSpec] | None = None
        self._transports: dict[str, TransportSpec] | None = None
        self._nccl: NcclConstants | None = None
        self._nodes: dict[str, NodeTypeSpec] = {}
        self._presets: dict[str, Preset] = {}
        self._frameworks: dict[str, FrameworkProfile] = {}
        self._profiles: dict[tuple[str, int, int], ProfileSpec] = {}
        self._attention: AttentionKernelsSpec | None = None

    @classmethod
    def load(cls, dirs: CatalogDirs | Path | str | None = None) -> Catalog:
        """A catalog of ``dirs``: a :class:`CatalogDirs`, a folder holding ``topologies/`` and
        ``scenarios/models/``, or None for the shipped data."""
        if dirs is None:
            dirs = CatalogDirs.default()
        elif not isinstance(dirs, CatalogDirs):
            dirs = CatalogDirs.under(dirs)
        return cls(dirs)

    def is_current(self) -> bool:
        """True while no file of the catalog's folders was added, removed or changed since it was built."""
        return self.dirs.stamp() == self._stamp

    def __repr__(self) -> str:
        return f"Catalog(topologies={str(self.dirs.topologies)!r}, models={str(self.dirs.models)!r})"

    # -- GPUs ---------------------------------------------------------------------------

    @property
    def gpus(self) -> dict[str, GpuSpec]:
        """GPU specs by name (``gpus.yaml``)."""
        if self._gpus is None:
            path = self.dirs.topologies / "gpus.yaml"
            root = load_yaml(path)
            self._gpus = {
                name: _validate(GpuSpec, {"name": name, **spec}, path, root, ("gpus", name))
                for name, spec in ((root or {}).get("gpus") or {}).items()
            }
        return self._gpus

    def gpu(self, name: str) -> GpuSpec:
        """The GPU ``name``; an unknown name is a :class:`ScenarioError` listing the known ones."""
        if name not in self.gpus:
            raise ScenarioError(f"unknown GPU {name!r} (known: {', '.join(sorted(self.gpus))})")
        return self.gpus[name]

    # -- node types ---------------------------------------------------------------------

    def node_type_names(self) -> list[str]:
        return sorted(p.stem for p in self.dirs.nodes.glob("*.yaml"))

    def node_type(self, name_or_path: str, base_dir: Path | None = None) -> NodeTypeSpec:
        """A node type by catalog name, or loaded from a YAML file path (relative to ``base_dir``)."""
        catalog_file = self.dirs.nodes / f"{name_or_path}.yaml"
        if catalog_file.is_file():
            if name_or_path not in self._nodes:
                self._nodes[name_or_path] = self._read_node_type(catalog_file)
            return self._nodes[name_or_path]
        if name_or_path.endswith((".yaml", ".yml")) or "/" in name_or_path:
            path = Path(name_or_path)
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            if path.is_file() or path.is_symlink() or path.exists():  # the reader says why a FIFO, loop, ... is refused
                return self._read_node_type(path)
            raise ScenarioError(f"node type file {str(path)!r} not found")
        known = ", ".join(self.node_type_names())
        raise ScenarioError(f"unknown node type {name_or_path!r} (known: {known}; or give a path to a node file)")

    def _read_node_type(self, path: Path) -> NodeTypeSpec:
        root = load_yaml(path)
        spec: NodeTypeSpec = _validate(NodeTypeSpec, root, path, root)
        if spec.gpu not in self.gpus:
            known = ", ".join(sorted(self.gpus))
            raise ScenarioError(f"unknown GPU {spec.gpu!r} (known: {known})", field="gpu", file=str(path))
        return spec

    # -- network ------------------------------------------------------------------------

    @property
    def transports(self) -> dict[str, TransportSpec]:
        """Transport specs by kind (``transports.yaml``)."""
        if self._transports is None:
            path = self.dirs.topologies / "transports.yaml"
            root = load_yaml(path)
            self._transports = {
                name: _validate(TransportSpec, spec, path, root, ("transports", name))
                for name, spec in ((root or {}).get("transports") or {}).items()
            }
        return self._transports

    def transport(self, kind: str) -> TransportSpec:
        specs = self.transports
        if kind not in specs:
            raise ScenarioError(f"unknown transport {kind!r} (known: {', '.join(sorted(specs))})")
        return specs[kind]

    @property
    def nccl(self) -> NcclConstants:
        """NCCL cost-model constants (``nccl.yaml``)."""
        if self._nccl is None:
            path = self.dirs.topologies / "nccl.yaml"
            root = load_yaml(path)
            self._nccl = _validate(NcclConstants, root, path, root)
        return self._nccl

    # -- model presets ------------------------------------------------------------------

    def preset_names(self) -> list[str]:
        return sorted(p.stem for p in self.dirs.models.glob("*.yaml"))

    def preset(self, name: str) -> Preset:
        """The preset ``name``; its ``data`` is a fresh dict on every call."""
        if name not in self._presets:
            path = self.dirs.models / f"{name}.yaml"
            if not path.is_file():
                known = ", ".join(self.preset_names())
                raise ScenarioError(f"unknown model preset {name!r} (known: {known})", field="model")
            root = load_mapping(path, "a model preset (layers, hidden, heads, ...)")
            self._presets[name] = Preset(to_plain(root), root, str(path))
        preset = self._presets[name]
        return Preset(dict(preset.data), preset.root, preset.path)

    # -- framework profiles -------------------------------------------------------------

    def framework_names(self) -> list[str]:
        """The framework profiles of ``topologies/frameworks/`` (``generic`` has none: it is dtsim's defaults)."""
        return sorted(p.stem for p in self.dirs.frameworks.glob("*.yaml"))

    def framework(self, name: str) -> FrameworkProfile:
        """The profile ``name``; an unknown name is a :class:`ScenarioError` naming ``framework``."""
        if name not in self._frameworks:
            path = self.dirs.frameworks / f"{name}.yaml"
            if not path.is_file():
                known = ", ".join(["generic", *self.framework_names()])
                raise ScenarioError(f"no profile for framework {name!r} (known: {known})", field="framework")
            root = load_mapping(path, "a framework profile (name, description, settings, not_modelled)")
            self._frameworks[name] = _validate(FrameworkProfile, to_plain(root), path, root)
        return self._frameworks[name]

    # -- kernel benchmark tables ----------------------------------------------------------

    @property
    def attention_kernels(self) -> AttentionKernelsSpec:
        """Published fused-attention speed per GPU and kernel (``kernels/attention.yaml``)."""
        if self._attention is None:
            path = self.dirs.kernels / "attention.yaml"
            root = load_yaml(path)
            self._attention = _validate(AttentionKernelsSpec, to_plain(root), path, root)
        return self._attention

    # -- calibration profiles -----------------------------------------------------------

    def builtin_profile_path(self, gpu: str) -> Path:
        return self.dirs.calibration / "builtin" / f"{gpu}.yaml"

    def profile(self, path: str | Path) -> ProfileSpec:
        """The compute profile at ``path``, read again whenever the file changes."""
        path = Path(path)
        try:
            stat = path.stat()
            key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
        except OSError:
            key = (str(path), -1, -1)  # load_yaml reports the missing file
        if key not in self._profiles:
            root = load_yaml(path)
            self._profiles = {k: v for k, v in self._profiles.items() if k[0] != key[0]}
            self._profiles[key] = _validate(ProfileSpec, to_plain(root), path, root, units_required=False)
        return self._profiles[key]


_default: Catalog | None = None


def default_catalog() -> Catalog:
    """The catalog of the shipped data, rebuilt when its folders or any of their files changed."""
    global _default
    dirs = CatalogDirs.default()
    if _default is None or _default.dirs != dirs or not _default.is_current():
        _default = Catalog(dirs)
    return _default


def forget_default_catalog() -> None:
    """Drop the default catalog; the next :func:`default_catalog` call reads the files again."""
    global _default
    _default = None
