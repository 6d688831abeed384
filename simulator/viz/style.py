"""Shared look of the figures: one colour map for every legend name of every figure.

A name means the same colour in every figure (``tp`` bars in the timeline and ``exposed tp``
in the breakdown are one orange), and no two names share a colour: row categories, the
breakdown's bubble and idle, and the memory categories each have their own. Pipeline
stages get evenly spaced colours of a sequential scale (:func:`stage_colours`), which none
of the named colours is taken from.
"""

from __future__ import annotations

from plotly.colors import sample_colorscale

__all__ = ["CATEGORY_COLOURS", "colour", "BUBBLE_COLOUR", "IDLE_COLOUR", "MEMORY_COLOURS", "TEMPLATE", "COLOURS",
           "comm_outline", "stage_colours"]

TEMPLATE = "plotly_white"

CATEGORY_COLOURS = {
    "compute": "#4c78a8",
    "tp": "#f58518",
    "cp": "#b279a2",
    "ep": "#17becf",
    "shard": "#e45756",
    "dp": "#54a24b",
    "pp": "#eeca3b",
    "offload": "#9d755d",
}
BUBBLE_COLOUR = "#bab0ac"
IDLE_COLOUR = "#e0e0e0"
MEMORY_COLOURS = {
    "params": "#2f4b7c",
    "grads": "#72b7b2",
    "optimizer": "#665191",
    "activations": "#d45087",
    "buffers": "#79706e",
    "other": "#d7b5a6",
}
# every named colour: one map, so figures cannot disagree
COLOURS: dict[str, str] = {**CATEGORY_COLOURS, "bubble": BUBBLE_COLOUR, "idle": IDLE_COLOUR, **MEMORY_COLOURS}
_FALLBACK = ("#ff9da6", "#a0cbe8", "#8cd17d", "#ffbe7d", "#499894")


def colour(name: str) -> str:
    """Colour of a legend name: a row category, ``exposed <category>`` (the category's
    colour), ``bubble``, ``idle`` or a memory category; unknown names get a stable fallback
    chosen by a hash of the name."""
    key = name.removeprefix("exposed ")
    if key in COLOURS:
        return COLOURS[key]
    return _FALLBACK[sum(map(ord, key)) % len(_FALLBACK)]


def comm_outline(category: str) -> str:
    """A darker shade of ``category``'s colour: the outline that separates back-to-back
    collectives on one lane (each bar one collective, launch to completion)."""
    hex_colour = colour(category).lstrip("#")
    red, green, blue = (int(hex_colour[i:i + 2], 16) * 3 // 5 for i in (0, 2, 4))
    return f"#{red:02x}{green:02x}{blue:02x}"


def stage_colours(n: int) -> list[str]:
    """``n`` distinct colours for pipeline stages 0 .. n-1: viridis from its dark end to 85%
    (its last yellows are unreadable on white)."""
    if n <= 1:
        return sample_colorscale("Viridis", [0.0])
    return sample_colorscale("Viridis", [0.85 * s / (n - 1) for s in range(n)])
