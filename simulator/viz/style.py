"""Shared look of the figures: one colour per row category / breakdown part."""

from __future__ import annotations

__all__ = ["CATEGORY_COLOURS", "colour", "BUBBLE_COLOUR", "IDLE_COLOUR", "MEMORY_COLOURS", "TEMPLATE"]

TEMPLATE = "plotly_white"

CATEGORY_COLOURS = {
    "compute": "#4c78a8",
    "tp": "#f58518",
    "cp": "#b279a2",
    "shard": "#e45756",
    "dp": "#54a24b",
    "pp": "#eeca3b",
    "offload": "#9d755d",
}
BUBBLE_COLOUR = "#bab0ac"
IDLE_COLOUR = "#e0e0e0"
MEMORY_COLOURS = {
    "params": "#4c78a8",
    "grads": "#72b7b2",
    "optimizer": "#54a24b",
    "activations": "#f58518",
    "buffers": "#b279a2",
    "other": "#bab0ac",
}
_FALLBACK = ("#ff9da6", "#9d755d", "#79706e", "#d67195", "#439894")


def colour(category: str) -> str:
    """Colour of a row category (stable for unknown ones: chosen by a hash of the name)."""
    if category in CATEGORY_COLOURS:
        return CATEGORY_COLOURS[category]
    return _FALLBACK[sum(map(ord, category)) % len(_FALLBACK)]
