"""JSON Schema of the scenario format (``dtsim schema``)."""

from __future__ import annotations

from typing import Any

from simulator.scenario.spec import Scenario

__all__ = ["scenario_json_schema"]


def scenario_json_schema() -> dict[str, Any]:
    schema = Scenario.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "dtsim scenario"
    schema["description"] = (
        "A distributed-training scenario: model, cluster, parallelism, training and sim sections. "
        "Quantities accept SI numbers or strings with units ('400Gbps', '80GiB', '2us'). "
        "model may also be a preset name (scenarios/models/). framework names a profile of defaults "
        "(topologies/frameworks/); fields the scenario gives always win over it."
    )
    model_ref = schema["properties"]["model"]
    schema["properties"]["model"] = {
        "anyOf": [{"type": "string", "description": "a preset name from scenarios/models/"}, model_ref]
    }
    return schema
