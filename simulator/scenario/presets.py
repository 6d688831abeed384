"""Model presets: ``scenarios/models/<name>.yaml``, each citing its source.

A scenario names a preset (``model: gpt3-175b``) or starts from one and overrides fields
(``model: {preset: llama3-8b, seq_len: 4096}``). The preset file holds the same fields as
the ``model`` section plus ``name`` and ``source``. The files are read by a
:class:`~simulator.catalog.Catalog`; these functions take one (default: the default catalog).
"""

from __future__ import annotations

from typing import Any

from simulator.catalog import Catalog, default_catalog

__all__ = ["preset_names", "load_preset"]


def preset_names(catalog: Catalog | None = None) -> list[str]:
    return (catalog or default_catalog()).preset_names()


def load_preset(name: str, catalog: Catalog | None = None) -> tuple[dict[str, Any], Any, str]:
    """The preset's fields (a fresh dict), its round-trip YAML (for line numbers) and its path."""
    preset = (catalog or default_catalog()).preset(name)
    return preset.data, preset.root, preset.path
