"""NCCL's tuning environment (``NCCL_ALGO``, ``NCCL_PROTO``) as dtsim's tuner restriction.

NCCL reads both variables with one list syntax (NVIDIA/nccl ``src/graph/tuning.cc``
``parseList``, commit 5067397c): entries separated by ``;``; each entry is an optional
``function:`` prefix (Broadcast, Reduce, AllGather, ReduceScatter, AllReduce; only the first
entry may omit it, and then applies to every function) followed by a comma list of names, or
``^`` and a list to enable everything *but* those; names compare case-insensitively; an
unknown name or prefix is an error (``ncclInvalidUsage``). Algorithms: Tree, Ring,
CollNetDirect, CollNetChain, NVLS, NVLSTree, PAT; protocols: LL, LL128, Simple
(``src/init.cc``). When the enabled set leaves a function no algorithm/protocol pair, NCCL
fails the call ("No algorithm/protocol available for function ... NCCL_ALGO was set to ...",
``src/enqueue.cc``); dtsim does the same (:class:`ValueError`), never a silent answer.

dtsim models Ring (``ring``; broadcast's ring is ``chain``), Tree (``tree``), NVLS inside one
NVSwitch node (``nvls``) and NVLSTree across NVSwitch nodes (``nvls_tree``); CollNet and PAT are
not modelled. All-to-all is NCCL
send/receive, which neither variable affects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["NcclTuning", "NCCL_FUNCTIONS", "NCCL_ALGORITHMS", "NCCL_PROTOCOLS", "UNMODELLED_ALGORITHMS"]

# NCCL function name -> dtsim op
NCCL_FUNCTIONS = {"broadcast": "broadcast", "reduce": "reduce", "allgather": "all_gather",
                  "reducescatter": "reduce_scatter", "allreduce": "all_reduce"}
# NCCL algorithm name (lower case) -> its spelling in NCCL
NCCL_ALGORITHMS = {"tree": "Tree", "ring": "Ring", "collnetdirect": "CollNetDirect",
                   "collnetchain": "CollNetChain", "nvls": "NVLS", "nvlstree": "NVLSTree", "pat": "PAT"}
NCCL_PROTOCOLS = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
UNMODELLED_ALGORITHMS = ("CollNetDirect", "CollNetChain", "PAT")


def _parse_list(var: str, text: str, names: dict[str, str]) -> dict[str, frozenset[str]]:
    """``parseList``'s semantics: per dtsim op, the enabled names (NCCL spelling)."""
    everything = frozenset(names.values())
    enabled = dict.fromkeys(NCCL_FUNCTIONS.values(), everything)
    for i, entry in enumerate(text.split(";")):
        if not entry:
            continue
        prefix, sep, items = entry.partition(":")
        if not sep:
            if i:
                raise ValueError(f"{var}={text}: every entry but the first needs a function prefix (e.g. allreduce:ring)")
            prefix, items = "", entry
        ops = list(NCCL_FUNCTIONS.values())
        if prefix:
            if prefix.lower() not in NCCL_FUNCTIONS:
                raise ValueError(f"{var}={text}: unknown function {prefix!r} (known: Broadcast, Reduce, AllGather, "
                                 "ReduceScatter, AllReduce)")
            ops = [NCCL_FUNCTIONS[prefix.lower()]]
        exclude = items.startswith("^")
        chosen = set()
        for name in (items[1:] if exclude else items).split(","):
            if name.lower() not in names:
                raise ValueError(f"{var}={text}: unknown name {name!r} (known: {', '.join(names.values())})")
            chosen.add(names[name.lower()])
        for op in ops:
            enabled[op] = everything - chosen if exclude else frozenset(chosen)
    return enabled


@dataclass(frozen=True)
class NcclTuning:
    """What ``NCCL_ALGO`` / ``NCCL_PROTO`` leave the tuner: per op, the enabled NCCL algorithm
    and protocol names (None: the variable is unset). ``algo`` and ``proto`` keep the text as
    the user wrote it, for messages."""

    algo: str | None = None
    proto: str | None = None
    nvls_enable: bool = True  # NCCL_NVLS_ENABLE=0 takes NVLS out of the tuner's choice

    def __post_init__(self) -> None:
        self._algorithms()  # raise on bad syntax now, not at the first collective
        self._protocols()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NcclTuning:
        """The tuning an environment sets (empty values count as unset, as ``ncclGetEnv``)."""
        nvls = (env.get("NCCL_NVLS_ENABLE") or "1").strip()
        if nvls not in ("0", "1", "2"):
            raise ValueError(f"NCCL_NVLS_ENABLE={nvls}: expected 0 or 1")
        return cls(env.get("NCCL_ALGO") or None, env.get("NCCL_PROTO") or None, nvls != "0")

    def _algorithms(self) -> dict[str, frozenset[str]] | None:
        return None if self.algo is None else _parse_list("NCCL_ALGO", self.algo, NCCL_ALGORITHMS)

    def _protocols(self) -> dict[str, frozenset[str]] | None:
        return None if self.proto is None else _parse_list("NCCL_PROTO", self.proto, NCCL_PROTOCOLS)

    def algorithms(self, op: str) -> frozenset[str] | None:
        """dtsim algorithms ``NCCL_ALGO`` enables for ``op`` (None: no restriction; all-to-all,
        point-to-point and host copies are never restricted)."""
        table = self._algorithms()
        if table is None or op not in table:
            return None
        out = set()
        for name in table[op]:
            if name == "Ring":
                out.add("chain" if op == "broadcast" else "ring")
            elif name in ("Tree", "NVLS"):
                out.add(name.lower())
            elif name == "NVLSTree":
                out.add("nvls_tree")
        return frozenset(out)

    def unmodelled(self, op: str) -> tuple[str, ...]:
        """Algorithms ``NCCL_ALGO`` enables for ``op`` that dtsim does not model (for a note)."""
        table = self._algorithms()
        if table is None or op not in table:
            return ()
        return tuple(a for a in UNMODELLED_ALGORITHMS if a in table[op])

    def protocols(self, op: str) -> tuple[str, ...] | None:
        """Protocols ``NCCL_PROTO`` enables for ``op`` (None: no restriction)."""
        table = self._protocols()
        if table is None or op not in table:
            return None
        return tuple(p for p in NCCL_PROTOCOLS.values() if p in table[op])

    def describe(self) -> str:
        """``NCCL_ALGO=... NCCL_PROTO=...`` as set (empty when neither is)."""
        nvls = None if self.nvls_enable else "0"
        pairs = (("NCCL_ALGO", self.algo), ("NCCL_PROTO", self.proto), ("NCCL_NVLS_ENABLE", nvls))
        return " ".join(f"{k}={v}" for k, v in pairs if v)
