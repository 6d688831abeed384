"""Prices of nodes and what a training run costs: ``topologies/prices.yaml``, token budgets.

Time to train a token budget at a simulated throughput, and its cost on ``nodes`` nodes::

    time_s   = tokens / tokens_per_s
    cost_usd = time_s / 3600 * nodes * usd_per_node_hour

The default token budget is the compute-optimal one of Hoffmann et al. 2022 ("Training
Compute-Optimal Large Language Models", the Chinchilla rule): about 20 tokens per parameter.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveFloat, ValidationError

from simulator.datadirs import topologies_dir
from simulator.errors import ScenarioError
from simulator.fields import Frozen
from simulator.units import parse_time
from simulator.yamlio import error_from_validation, load_yaml, to_plain

__all__ = ["NodePrice", "PriceTable", "load_prices", "chinchilla_tokens", "time_to_train_s", "training_cost_usd",
           "CHINCHILLA_TOKENS_PER_PARAM"]

CHINCHILLA_TOKENS_PER_PARAM = 20.0  # Hoffmann et al. 2022, compute-optimal tokens per parameter (rounded)
HOUR_S = parse_time("1h")


class NodePrice(Frozen):
    """What one node costs per hour, and where the figure comes from."""

    usd_per_hour: PositiveFloat = Field(description="US dollars per node-hour")
    kind: Literal["on-demand", "reserved", "spot", "estimate"] = Field(
        "on-demand", description="estimate: not a price anyone charges (e.g. owning a DGX, amortised)")
    date: str = Field(description="when the price was published or estimated")
    source: str = Field(description="where it comes from")


class PriceTable(Frozen):
    currency: Literal["USD"] = "USD"
    prices: dict[str, NodePrice] = Field(default_factory=dict, description="node type -> hourly price")

    def get(self, node: str) -> NodePrice | None:
        return self.prices.get(node)

    def merged(self, other: PriceTable) -> PriceTable:
        """This table with ``other``'s entries replacing or adding node types."""
        return PriceTable(currency=self.currency, prices={**self.prices, **other.prices})


def _read(path: Path) -> PriceTable:
    root = load_yaml(path)
    if not isinstance(root, dict):
        raise ScenarioError("a price table is a mapping with a 'prices' section", file=str(path), line=1)
    try:
        return PriceTable.model_validate(to_plain(root))
    except ValidationError as exc:
        raise error_from_validation(exc, root=root, file=str(path), model=PriceTable) from None


def load_prices(path: str | Path | None = None) -> PriceTable:
    """The shipped table (``topologies/prices.yaml``), with the entries of ``path`` on top."""
    table = _read(topologies_dir() / "prices.yaml")
    if path is not None:
        table = table.merged(_read(Path(path)))
    return table


def chinchilla_tokens(params: float) -> float:
    """Compute-optimal training tokens for a model of ``params`` parameters (20 per parameter)."""
    return CHINCHILLA_TOKENS_PER_PARAM * params


def time_to_train_s(tokens: float, tokens_per_s: float) -> float:
    """Seconds to process ``tokens`` at a steady ``tokens_per_s`` (no restarts, no evaluation)."""
    if tokens_per_s <= 0:
        raise ValueError("tokens_per_s must be positive")
    return tokens / tokens_per_s


def training_cost_usd(time_s: float, nodes: int, price: NodePrice) -> float:
    """Dollars for ``nodes`` nodes during ``time_s`` seconds at ``price`` per node-hour."""
    return time_s / HOUR_S * nodes * price.usd_per_hour
