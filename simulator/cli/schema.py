"""``dtsim schema``: the JSON Schema of the scenario format."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["schema"]


def schema(
    out: Annotated[Path | None, typer.Option("--out", help="write to a file instead of stdout")] = None,
) -> None:
    """Print the JSON Schema of the scenario format."""
    from simulator.cli.common import check_output_file
    from simulator.scenario import scenario_json_schema

    check_output_file(out, "--out")
    text = json.dumps(scenario_json_schema(), indent=2)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    else:
        sys.stdout.write(text + "\n")
