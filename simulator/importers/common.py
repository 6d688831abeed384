"""What the config importers share: the imported result, the layout checks and the YAML writer.

Every importer is a pure function from a framework's own configuration (command-line
arguments, a TOML or JSON text) to an :class:`Imported`: the scenario mapping, the inputs it
did not use (unknown to dtsim or not modelled) and notes on what it assumed. Contradictions
in the input raise :class:`~simulator.errors.ScenarioError` naming the framework's argument
or key, so ``dtsim import`` exits 2 with one line.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import ScenarioError

__all__ = ["Imported", "Layout", "check_layout", "render", "positive_int"]


@dataclass
class Imported:
    """A scenario mapping written from a framework config, with what was left out."""

    scenario: dict[str, Any]
    source: str
    ignored: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Layout:
    """Parallel sizes and batch, each with the name the framework gives it (for messages)."""

    world: int
    where: str
    tp: tuple[int, str]
    pp: tuple[int, str]
    cp: tuple[int, str]
    micro: tuple[int, str]
    global_batch: tuple[int, str] | None
    heads: tuple[int, str]
    kv_heads: tuple[int, str]


def positive_int(value: Any, name: str) -> int:
    """``value`` as a positive int (JSON numbers such as ``5e8`` included), else an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise ScenarioError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_layout(lay: Layout) -> tuple[int, int]:
    """(dp, global batch) of a layout, or a ScenarioError naming the contradicting argument:
    tp*pp*cp must divide the world, tp the heads and KV heads, micro-batch*dp the global batch."""
    (tp, tp_name), (pp, pp_name), (cp, cp_name) = lay.tp, lay.pp, lay.cp
    mp = tp * pp * cp
    if lay.world % mp:
        raise ScenarioError(f"{tp_name} * {pp_name} * {cp_name} = {tp}*{pp}*{cp} = {mp} does not divide the world "
                            f"size {lay.world} ({lay.where})")
    heads, heads_name = lay.heads
    kv, kv_name = lay.kv_heads
    if heads % tp:
        raise ScenarioError(f"{tp_name} = {tp} does not divide {heads_name} = {heads}")
    if kv % tp:
        raise ScenarioError(f"{tp_name} = {tp} does not divide {kv_name} = {kv}")
    dp = lay.world // mp
    micro, micro_name = lay.micro
    if lay.global_batch is None:
        return dp, micro * dp
    gb, gb_name = lay.global_batch
    if gb % (micro * dp):
        raise ScenarioError(f"{gb_name} = {gb} is not divisible by {micro_name} * data-parallel size = "
                            f"{micro}*{dp} = {micro * dp}")
    return dp, gb


def _comment(text: str) -> list[str]:
    return [f"#   {line}" if line else "#" for line in text.splitlines()] or ["#"]


def render(imported: Imported) -> str:
    """The scenario as YAML with a comment header naming the source, what was ignored and the notes."""
    from ruamel.yaml import YAML

    header = [f"# Imported by `dtsim import` from {imported.source}"]
    if imported.ignored:
        header.append("# Ignored (unknown to dtsim or not modelled):")
        header += [f"#   {item}" for item in imported.ignored]
    else:
        header.append("# Ignored: nothing")
    if imported.notes:
        header.append("# Notes:")
        for note in imported.notes:
            header += _comment(f"- {note}")
    yaml = YAML()
    yaml.default_flow_style = False
    yaml.width = 4096
    out = io.StringIO()
    yaml.dump(imported.scenario, out)
    return "\n".join(header) + "\n" + out.getvalue()
