"""Rank placement and process groups on a generic device mesh of named axes.

A :class:`Mesh` is an ordered list of named axes with sizes, innermost first, in
torchtitan's vocabulary (``tp``, ``cp``, ``ep``, ``pp``, ``dp_shard``, ``dp_replicate``). Ranks
are placed node-major (rank r on GPU r: node r // gpus_per_node) and a rank's coordinate on
each axis is a mixed-radix digit, the innermost axis varying fastest:

    rank = sum(coord[a] * stride[a]),  stride[a] = product of the sizes of the axes inside a

:data:`MESH_AXES` puts tp innermost, then cp, pp, and the data-parallel axes outermost
(Megatron-Core's default order "tp-cp-ep-dp-pp" keeps tp innermost too; we put pp inside dp
so that a pipeline's stages are consecutive nodes and each data-parallel replica is a
contiguous block of ranks). :data:`MEGATRON_AXES` (``parallelism.rank_order: tp-cp-dp-pp``)
is Megatron-Core's order, pp outermost (RankGenerator order "tp-cp-ep-dp-pp",
NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron/core/parallel_state.py:617 and 292,
initialize_model_parallel's default): each pipeline stage is a contiguous block of world/pp ranks. So a TP group is ``tp`` consecutive ranks (one node when tp <=
GPUs per node). The data-parallel axis is split as torchtitan splits it: ``dp_shard``
(MiCS / HSDP partition groups of ``shard_group_size`` consecutive dp indices) inside
``dp_replicate`` (the same index across partition groups, DeepSpeed
``_generate_mics_config``); without a group size ``dp_shard`` is the whole dp axis.

A *process group* is named and varies a set of axes (:data:`GROUPS`), its ranks in ascending
order. Context-parallel ranks hold the same parameters, so gradients are reduced over dp x
cp (Megatron's ``dp_cp`` group) and the ``dp_shard`` group includes the cp ranks
(torchtitan's ``dp_shard_cp`` mesh). The ``embedding`` group joins the first and last
pipeline stage, which both hold the tied embedding matrix; the ``dualpipe_mirror`` group joins
stage s and stage pp-1-s, which hold the same two chunks under DualPipe.

Expert parallelism is not an axis of its own: as in Megatron-Core (parallel_state.py:871-907
at d98e8a6, the expert RankGenerator with order tp-ep-dp-pp and the same pp groups as the
dense one), the ranks of a pipeline stage are folded a second time, innermost first, as
``etp x ep x edp``. A rank's index within its stage (its tp, cp and dp coordinates in mixed
radix, tp fastest) gives ``etp = i % etp``, ``ep = (i // etp) % ep``, ``edp = i // (etp*ep)``;
the ``ep`` group varies the second, the ``edp`` group (expert data parallelism, whose ranks
hold the same experts) the third. With etp = tp, an ep group of size <= GPUs per node / tp
stays inside a node.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from simulator.scenario.spec import Scenario

__all__ = ["Mesh", "Axis", "MESH_AXES", "MEGATRON_AXES", "GROUPS", "mesh_for"]

# the mesh axes, innermost first
MESH_AXES: tuple[str, ...] = ("tp", "cp", "pp", "dp_shard", "dp_replicate")
# the same axes in Megatron-Core's default order "tp-cp-ep-dp-pp" (parallelism.rank_order tp-cp-dp-pp)
MEGATRON_AXES: tuple[str, ...] = ("tp", "cp", "dp_shard", "dp_replicate", "pp")

# process groups by name: the axes each varies
GROUPS: dict[str, tuple[str, ...]] = {
    "tp": ("tp",),
    "cp": ("cp",),
    "tp_cp": ("tp", "cp"),
    "pp": ("pp",),
    "dp": ("dp_shard", "dp_replicate"),
    "dp_cp": ("cp", "dp_shard", "dp_replicate"),
    "dp_shard": ("cp", "dp_shard"),
    "dp_replicate": ("dp_replicate",),
    "world": MESH_AXES,
}

# the name of a process group: a key of GROUPS or of _SPECIAL_GROUPS
Axis = Literal["tp", "cp", "pp", "dp", "dp_cp", "dp_shard", "dp_replicate", "tp_cp", "embedding", "world", "ep", "edp",
               "etp", "tp_ep", "dualpipe_mirror"]


class Mesh:
    """Named axes with sizes (innermost first); coordinates and groups derived generically.

    Groups are cached per (rank, name), and shared by equal meshes (the last
    :data:`SHARED_MESHES` layouts of this process): strategies ask for the same groups many
    times, and the points of a sweep or search with one layout ask again.
    """

    def __init__(self, axes: Iterable[tuple[str, int]], *, ep: int = 1, etp: int = 1) -> None:
        self.ep, self.etp = int(ep), int(etp)
        self.axes: tuple[tuple[str, int], ...] = tuple((name, int(size)) for name, size in axes)
        names = [a for a, _ in self.axes]
        if len(set(names)) != len(names):
            raise ValueError(f"mesh axes repeat: {names}")
        if any(size < 1 for _, size in self.axes):
            raise ValueError(f"mesh axis sizes must be >= 1: {self.axes}")
        self.sizes: dict[str, int] = dict(self.axes)
        self.strides: dict[str, int] = {}
        stride = 1
        for name, size in self.axes:
            self.strides[name] = stride
            stride *= size
        self.world: int = stride
        if (self.world // self.sizes.get("pp", 1)) % (self.ep * self.etp):
            raise ValueError(f"ep*etp = {self.ep}*{self.etp} does not divide the ranks of a pipeline stage")
        self._groups = _shared_groups((self.axes, self.ep, self.etp))

    @classmethod
    def from_sizes(cls, *, tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1,
                   shard_group_size: int | None = None, ep: int = 1, etp: int | None = None,
                   order: tuple[str, ...] = MESH_AXES) -> Mesh:
        """The standard mesh (:data:`MESH_AXES`, or ``order``: :data:`MEGATRON_AXES`) from the
        scenario's sizes; ``dp`` splits into ``dp_shard = shard_group_size`` (default dp) inside
        ``dp_replicate = dp / dp_shard``."""
        shard = shard_group_size or dp
        if dp % shard:
            raise ValueError(f"shard_group_size {shard} does not divide dp {dp}")
        sizes = {"tp": tp, "cp": cp, "pp": pp, "dp_shard": shard, "dp_replicate": dp // shard}
        return cls(((name, sizes[name]) for name in order), ep=ep, etp=etp or tp)

    # sizes ---------------------------------------------------------------------------

    def size(self, name: str) -> int:
        """Size of an axis (1 for an axis this mesh lacks) or of a named group."""
        if name in self.sizes:
            return self.sizes[name]
        if name in GROUPS:
            return math.prod(self.sizes.get(a, 1) for a in GROUPS[name])
        return 1

    @property
    def tp(self) -> int:
        return self.size("tp")

    @property
    def cp(self) -> int:
        return self.size("cp")

    @property
    def pp(self) -> int:
        return self.size("pp")

    @property
    def dp(self) -> int:
        """Data-parallel replicas of the model (dp_shard x dp_replicate)."""
        return self.size("dp")

    @property
    def pp_outermost(self) -> bool:
        """Whether each pipeline stage is a contiguous block of ranks (pp the outermost axis
        of more than one stage), so that a data-parallel replica is not."""
        return self.pp > 1 and self.strides["pp"] * self.pp == self.world and self.dp > 1

    @property
    def slice_size(self) -> int:
        """Ranks of one data-parallel replica: the product of the axes inside the dp axes."""
        return self.world // self.dp

    # coordinates -----------------------------------------------------------------------

    def coord(self, rank: int, axis: str) -> int:
        return (rank // self.strides[axis]) % self.sizes[axis] if axis in self.sizes else 0

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinate of ``rank`` on every axis."""
        return {name: (rank // self.strides[name]) % size for name, size in self.axes}

    def moved(self, rank: int, **coords: int) -> int:
        """The rank with the given axes' coordinates replaced (the others kept)."""
        for axis, value in coords.items():
            stride = self.strides[axis]
            rank += (value - (rank // stride) % self.sizes[axis]) * stride
        return rank

    def with_stage(self, rank: int, stage: int) -> int:
        """The rank at pipeline stage ``stage`` with every other coordinate of ``rank``."""
        stride = self.strides["pp"]
        return rank + (stage - (rank // stride) % self.sizes["pp"]) * stride

    def stage(self, rank: int) -> int:
        """The pipeline stage of a rank."""
        return self.coord(rank, "pp")

    # groups ----------------------------------------------------------------------------

    def group(self, rank: int, name: str) -> tuple[int, ...]:
        """The ranks of ``rank``'s process group ``name`` (:data:`GROUPS`), ascending."""
        key = (rank, name)
        found = self._groups.get(key)
        if found is None:
            special = _SPECIAL_GROUPS.get(name)
            if name in GROUPS:
                found = self.varying(rank, GROUPS[name])
            elif special is not None:
                found = special(self, rank)
            else:
                raise ValueError(f"unknown process group {name!r} (known: {', '.join([*GROUPS, *_SPECIAL_GROUPS])})")
            self._groups[key] = found
        return found

    def varying(self, rank: int, axes: Iterable[str]) -> tuple[int, ...]:
        """Ranks that share ``rank``'s coordinates on every axis but ``axes``, ascending."""
        axes = sorted((a for a in axes if self.sizes.get(a, 1) > 1), key=self.strides.__getitem__, reverse=True)
        ranks = [rank - sum(self.coord(rank, a) * self.strides[a] for a in axes)]
        for a in axes:  # outermost first: a stride is at least the span of the axes inside it, so ranks stay ascending
            steps = range(0, self.sizes[a] * self.strides[a], self.strides[a])
            ranks = [r + d for r in ranks for d in steps]
        return tuple(ranks)

    @property
    def stage_representatives(self) -> tuple[int, ...]:
        """One rank per pipeline stage (every other coordinate 0)."""
        return tuple(p * self.strides["pp"] for p in range(self.pp)) if "pp" in self.sizes else (0,)

    def __repr__(self) -> str:
        return "Mesh(" + ", ".join(f"{n}={s}" for n, s in self.axes) + ")"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mesh) and (self.axes, self.ep, self.etp) == (other.axes, other.ep, other.etp)

    def __hash__(self) -> int:
        return hash((self.axes, self.ep, self.etp))

    # expert parallelism (module docstring) ----------------------------------------------

    def stage_ranks(self, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s pipeline stage, in stage-index order (tp fastest, then cp, dp)."""
        axes = [(a, s) for a, s in self.axes if a != "pp"]
        base = rank - sum(self.coord(rank, a) * self.strides[a] for a, _ in axes)
        out = [base]
        for a, size in axes:
            out = [r + i * self.strides[a] for i in range(size) for r in out]
        return tuple(out)

    def expert_group(self, rank: int, kind: str) -> tuple[int, ...]:
        """``rank``'s expert-parallel (``ep``), expert tensor-parallel (``etp``), expert
        tensor-and-expert-parallel (``tp_ep``, Megatron-Core's tp_ep group: etp x ep ranks) or
        expert data-parallel (``edp``) group, ascending."""
        stage = self.stage_ranks(rank)
        i = stage.index(rank)
        inner, outer = {"ep": (self.etp, self.ep), "etp": (1, self.etp), "tp_ep": (1, self.etp * self.ep),
                        "edp": (self.etp * self.ep, len(stage) // (self.etp * self.ep))}[kind]
        base = i - (i // inner) % outer * inner
        return tuple(sorted(stage[base + j * inner] for j in range(outer)))


# equal meshes share their groups: the last SHARED_MESHES layouts' groups are kept
SHARED_MESHES = 8
_GROUPS_BY_MESH: dict[object, dict[tuple[int, str], tuple[int, ...]]] = {}


_SHARED_LOCK = threading.Lock()


def _shared_groups(key: object) -> dict[tuple[int, str], tuple[int, ...]]:
    with _SHARED_LOCK:  # threads of one process (a thread-pool executor) may build meshes at once
        found = _GROUPS_BY_MESH.pop(key, None)  # re-inserted last: the dict's order is the recency
        if found is None:
            found = {}
            while len(_GROUPS_BY_MESH) >= SHARED_MESHES:
                _GROUPS_BY_MESH.pop(next(iter(_GROUPS_BY_MESH)))
        _GROUPS_BY_MESH[key] = found
        return found


def _embedding_group(mesh: Mesh, rank: int) -> tuple[int, ...]:
    first, last = mesh.moved(rank, pp=0), mesh.moved(rank, pp=mesh.pp - 1)
    return (first,) if first == last else (first, last)


def _dualpipe_mirror(mesh: Mesh, rank: int) -> tuple[int, ...]:
    """A rank and the rank of the mirrored pipeline stage pp-1-stage (DualPipe: the two hold the same stages)."""
    stage = mesh.stage(rank)
    return tuple(sorted({rank, mesh.moved(rank, pp=mesh.pp - 1 - stage)}))


# groups that are not a product of axes
_SPECIAL_GROUPS: Mapping[str, Callable[[Mesh, int], tuple[int, ...]]] = {
    "embedding": _embedding_group,
    "dualpipe_mirror": _dualpipe_mirror,
    "ep": lambda mesh, rank: mesh.expert_group(rank, "ep"),
    "edp": lambda mesh, rank: mesh.expert_group(rank, "edp"),
    "etp": lambda mesh, rank: mesh.expert_group(rank, "etp"),
    "tp_ep": lambda mesh, rank: mesh.expert_group(rank, "tp_ep"),
}


def mesh_for(scenario: Scenario) -> Mesh:
    """The mesh of a validated scenario's parallel layout."""
    par = scenario.parallelism
    return Mesh.from_sizes(tp=par.tp, cp=par.cp, pp=par.pp, dp=scenario.dp, shard_group_size=par.shard_group_size,
                           ep=par.ep, etp=par.expert_tp,
                           order=MEGATRON_AXES if par.rank_order == "tp-cp-dp-pp" else MESH_AXES)
