"""``dtsim schema``: the JSON Schema of a dtsim file format, for editors and validators.

``--kind scenario`` (default) | ``model`` (a preset in scenarios/models/) | ``sweep`` | ``node``
(a node type file) | ``cluster`` (a file ``cluster.topology`` names). Node types, GPUs and model
presets are enums of the catalog in effect (``DTSIM_DATA_DIR`` or the shipped data).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from simulator.cli.common import fail

__all__ = ["schema", "SCHEMA_KINDS", "json_schema_of"]

# kind -> (module, function): imported when asked for
SCHEMA_KINDS: dict[str, tuple[str, str]] = {
    "scenario": ("simulator.scenario.schema", "scenario_json_schema"),
    "model": ("simulator.scenario.schema", "preset_json_schema"),
    "sweep": ("simulator.sweep.schema", "sweep_json_schema"),
    "node": ("simulator.scenario.schema", "node_json_schema"),
    "cluster": ("simulator.scenario.schema", "cluster_json_schema"),
}


def json_schema_of(kind: str) -> dict[str, Any]:
    """The JSON Schema of the file format ``kind`` (a key of :data:`SCHEMA_KINDS`)."""
    import importlib

    module, name = SCHEMA_KINDS[kind]
    make: Callable[[], dict[str, Any]] = getattr(importlib.import_module(module), name)
    return make()


def schema(
    kind: Annotated[str, typer.Option("--kind", help="scenario | model | sweep | node | cluster")] = "scenario",
    out: Annotated[Path | None, typer.Option("--out", help="write to a file instead of stdout")] = None,
) -> None:
    """Print the JSON Schema of a file format (default: the scenario file)."""
    from simulator.cli.common import check_output_file

    if kind not in SCHEMA_KINDS:
        fail(f"--kind {kind!r}: expected one of {', '.join(SCHEMA_KINDS)}")
    check_output_file(out, "--out")
    text = json.dumps(json_schema_of(kind), indent=2, ensure_ascii=False)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
    else:
        sys.stdout.write(text + "\n")
