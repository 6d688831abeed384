"""Network models by name: the registry behind the scenario's ``sim.network``.

The built-in keys are exactly the values of ``SimSpec.network``'s ``Literal`` (``flow``,
``analytical``); a test keeps the two equal. A new model is one module plus one call::

    from simulator.engine.network import PhasedNetwork, register_network_model

    class Instant(PhasedNetwork):          # every phase moves its bytes at once
        def move_bytes(self, load, bytes_done):
            self.account(load, load.bytes_per_flow)
            bytes_done()

    register_network_model("instant", Instant)

after which ``run_program(..., mode="instant")`` runs it (a scenario selects it once the
name is added to ``sim.network``'s ``Literal``).
"""

from __future__ import annotations

from simulator.engine.network.analytical import AnalyticalNetwork
from simulator.engine.network.base import NetworkFactory
from simulator.engine.network.flow import FlowNetwork

__all__ = ["NETWORK_MODELS", "register_network_model", "network_model"]

NETWORK_MODELS: dict[str, NetworkFactory] = {
    "flow": FlowNetwork,
    "analytical": AnalyticalNetwork,
}


def register_network_model(name: str, factory: NetworkFactory, *, replace: bool = False) -> None:
    """Make ``factory`` available as network model ``name``; refuses to shadow one silently."""
    if name in NETWORK_MODELS and not replace and NETWORK_MODELS[name] is not factory:
        raise ValueError(f"network model {name!r} is already registered (pass replace=True to override)")
    NETWORK_MODELS[name] = factory


def network_model(name: str) -> NetworkFactory:
    """The factory registered as ``name``."""
    try:
        return NETWORK_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown network model {name!r}; registered: {sorted(NETWORK_MODELS)}") from None
