"""Model presets: ``scenarios/models/<name>.yaml``, each citing its source.

A scenario names a preset (``model: gpt3-175b``) or starts from one and overrides fields
(``model: {preset: llama3-8b, seq_len: 4096}``). The preset file holds the same fields as
the ``model`` section plus ``name`` and ``source``.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from simulator.datadirs import models_dir
from simulator.errors import ScenarioError
from simulator.scenario.yamlio import load_mapping, to_plain

__all__ = ["preset_names", "load_preset"]


def preset_names() -> list[str]:
    return sorted(p.stem for p in models_dir().glob("*.yaml"))


@cache
def _load(name: str) -> tuple[dict[str, Any], Any, str]:
    path = models_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ScenarioError(f"unknown model preset {name!r} (known: {', '.join(preset_names())})", field="model")
    root = load_mapping(path, "a model preset (layers, hidden, heads, ...)")
    return to_plain(root), root, str(path)


def load_preset(name: str) -> tuple[dict[str, Any], Any, str]:
    """The preset's fields (a fresh dict), its round-trip YAML (for line numbers) and its path."""
    data, root, path = _load(name)
    return dict(data), root, path
