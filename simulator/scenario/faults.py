"""The ``faults`` section of a scenario: perturbations inside one iteration.

* ``stragglers``: ranks (or every rank of some nodes) whose compute runs ``slowdown`` times
  longer (a throttled or degraded GPU);
* ``jitter``: every compute task of every rank takes a random factor of its nominal time,
  drawn from a seeded lognormal distribution of mean 1 and coefficient of variation
  ``compute_cv`` (the same seed gives the same draws);
* ``links``: links chosen by a selector (:class:`LinkSelector`) run at ``bandwidth_factor``
  times their bandwidth with ``latency_add`` more latency; ``bandwidth_factor: 0`` is a failed
  link, routed around where the fabric has other paths.

The engine plays them out (simulator/engine/core.py: per-rank speed and per-task factors;
simulator/cluster/faults.py: the links), so their knock-on effects (a slow rank holding up its
data-parallel all-reduce, a slow stage stretching the pipeline bubble, a degraded NIC slowing
every ring through it) come from the discrete-event simulation itself. Symmetry reduction is
switched off where a perturbation makes ranks of a stage differ (simulator/workload/symmetry.py).
"""

from __future__ import annotations

import re

from pydantic import Field, NonNegativeInt, field_validator, model_validator

from simulator.fields import Frozen, Seconds

__all__ = ["FaultsSpec", "Straggler", "Jitter", "LinkFault", "LinkSelector", "parse_selector", "SELECTOR_KEYS"]

# selector keys: what each one matches (README "faults")
SELECTOR_KEYS: dict[str, str] = {
    "kind": "link kind: nvlink, neuronlink, pcie, host, infiniband, efa, ethernet-tcp",
    "tier": "link role: nvlink, torus, pcie, pcie-host, pcie-nic, host, nic-up, nic-down, leaf-up, spine-down",
    "node": "links inside node N or cabled to it (its NICs' cables)",
    "gpu": "links of local GPU I (on every node, or of node N with node=N)",
    "nic": "the cable of local NIC J to its switch (on every node, or node N with node=N)",
    "leaf": "links of leaf switch I (rail-optimised fabrics: leaf I of every rail)",
    "spine": "links of spine switch J",
    "rail": "links of rail R (rail-optimised fabrics)",
}
_INT_KEYS = frozenset({"node", "gpu", "nic", "leaf", "spine", "rail"})
_TERM = re.compile(r"^([a-z]+)=([A-Za-z0-9_.|-]+)$")

LinkSelector = dict[str, tuple[str | int, ...]]  # key -> accepted values (any of them)


def parse_selector(text: str) -> LinkSelector:
    """``"node=3 nic=0"`` -> {"node": (3,), "nic": (0,)}: whitespace-separated ``key=value``
    terms that must all hold; a value may list alternatives with ``|`` (``tier=nic-up|nic-down``).
    A bad term raises ValueError naming it and the keys known."""
    terms = text.split()
    if not terms:
        raise ValueError("empty selector; write key=value terms, e.g. 'node=3 nic=0'")
    out: LinkSelector = {}
    for term in terms:
        match = _TERM.match(term)
        if match is None:
            raise ValueError(f"cannot read {term!r}: write key=value (e.g. node=3), alternatives with | (tier=nic-up|nic-down)")
        key, raw = match.groups()
        if key not in SELECTOR_KEYS:
            raise ValueError(f"unknown key {key!r} in {term!r} (known: {', '.join(SELECTOR_KEYS)})")
        if key in out:
            raise ValueError(f"{key!r} given twice; list alternatives with | instead ({key}=a|b)")
        values: list[str | int] = []
        for v in raw.split("|"):
            if key in _INT_KEYS:
                if not v.isdigit():
                    raise ValueError(f"{key} takes whole numbers >= 0, got {v!r} in {term!r}")
                values.append(int(v))
            elif v:
                values.append(v)
        if not values:
            raise ValueError(f"no value in {term!r}")
        out[key] = tuple(values)
    return out


class Straggler(Frozen):
    """Ranks (or all ranks of nodes) whose compute runs ``slowdown`` times longer."""

    ranks: list[NonNegativeInt] | None = Field(None, description="global ranks that are slow")
    nodes: list[NonNegativeInt] | None = Field(None, description="nodes whose every GPU is slow")
    slowdown: float = Field(ge=1, description="compute takes this many times its nominal time (1.5 = 50% slower)")

    @model_validator(mode="after")
    def _one_target(self) -> Straggler:
        if (self.ranks is None) == (self.nodes is None):
            raise ValueError("give exactly one of ranks or nodes")
        if not (self.ranks or self.nodes):
            raise ValueError("the list of ranks or nodes is empty")
        return self


class Jitter(Frozen):
    """Random compute time: each compute task takes a lognormal factor (mean 1) of its time."""

    compute_cv: float = Field(ge=0, le=2, description="coefficient of variation of one compute task's time "
                              "(standard deviation / mean), e.g. 0.02; a fused run of n layers draws its "
                              "layers' sum (cv / sqrt(n))")
    seed: NonNegativeInt = Field(0, description="seed of the draws: the same seed gives the same iteration")


class LinkFault(Frozen):
    """Degraded or failed links, named by a selector."""

    select: str = Field(description="which links: whitespace-separated key=value terms that must all hold, "
                        "alternatives with |; keys: " + "; ".join(f"{k} ({v})" for k, v in SELECTOR_KEYS.items())
                        + ". Examples: 'node=3 nic=0' (NIC 0 of node 3, both directions), "
                        "'leaf=0 tier=leaf-up' (every spine uplink of leaf 0), 'node=1 gpu=2 kind=nvlink'")
    bandwidth_factor: float = Field(1.0, ge=0, le=1, description="fraction of the bandwidth left; 0 = the link "
                                    "failed (traffic is routed around it where the fabric has other paths)")
    latency_add: Seconds = Field(0.0, description="latency added to each selected link, e.g. '5 us'")

    @field_validator("select")
    @classmethod
    def _selector(cls, value: str) -> str:
        parse_selector(value)
        return value

    @property
    def selector(self) -> LinkSelector:
        return parse_selector(self.select)


class FaultsSpec(Frozen):
    """Perturbations of one iteration: slow ranks, random compute time, degraded or failed links."""

    stragglers: list[Straggler] = Field(default_factory=list, description="slow ranks or nodes")
    jitter: Jitter | None = Field(None, description="seeded random variation of every compute task's time")
    links: list[LinkFault] = Field(default_factory=list, description="degraded or failed links")

    @property
    def empty(self) -> bool:
        return not (self.stragglers or self.jitter or self.links)

    def slowdown_of(self, rank: int, gpus_per_node: int) -> float:
        """The compute slowdown of ``rank`` (stragglers naming it multiply)."""
        factor = 1.0
        for s in self.stragglers:
            if (s.ranks is not None and rank in s.ranks) or (s.nodes is not None and rank // gpus_per_node in s.nodes):
                factor *= s.slowdown
        return factor

    def check_ranges(self, world: int, n_nodes: int, gpus_per_node: int, nics: int) -> list[tuple[str, str]]:
        """(field, message) for every rank, node, GPU or NIC index outside the cluster."""
        bad: list[tuple[str, str]] = []
        for i, s in enumerate(self.stragglers):
            for name, values, bound in (("ranks", s.ranks, world), ("nodes", s.nodes, n_nodes)):
                for v in values or ():
                    if v >= bound:
                        bad.append((f"faults.stragglers[{i}].{name}", f"{v} is outside the cluster (0..{bound - 1})"))
        for i, link in enumerate(self.links):
            for key, bound in (("node", n_nodes), ("gpu", gpus_per_node), ("nic", nics)):
                for value in link.selector.get(key, ()):
                    if isinstance(value, int) and value >= bound:
                        bad.append((f"faults.links[{i}].select",
                                    f"{key}={value} is outside the cluster (0..{bound - 1})"))
        return bad
