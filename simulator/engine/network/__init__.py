"""Network models: one protocol (:mod:`.base`), one module per model, one registry (:mod:`.registry`).

* ``flow`` (:mod:`.flow`): max-min fair sharing of link bandwidth, rates recomputed when a
  phase starts or ends.
* ``analytical`` (:mod:`.analytical`): each phase at its closed-form alone rate.
"""

from __future__ import annotations

from simulator.engine.lowering import PhaseLoad
from simulator.engine.network.analytical import AnalyticalNetwork
from simulator.engine.network.base import (
    NetworkFactory,
    NetworkModel,
    PhasedNetwork,
    Series,
    at_end_of_instant,
    call_soon,
)
from simulator.engine.network.flow import FlowNetwork
from simulator.engine.network.registry import NETWORK_MODELS, network_model, register_network_model

__all__ = [
    "NetworkModel", "NetworkFactory", "PhasedNetwork", "PhaseLoad", "Series", "FlowNetwork", "AnalyticalNetwork",
    "NETWORK_MODELS", "network_model", "register_network_model", "call_soon", "at_end_of_instant",
]
