"""nccl-tests-style figure: a collective's bus bandwidth against message size.

Sizes are bytes in binary units (ticks at the sizes measured, written as ``format_bytes`` does:
1 MiB = 2^20 B), as nccl-tests' ``-b 1M -e 1G`` means them; bus bandwidth is in decimal GB/s
(1 GB/s = 1e9 B/s), the unit of nccl-tests' ``busbw`` column.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from simulator.units import GIGA, format_bytes
from simulator.viz.style import TEMPLATE

__all__ = ["bus_bandwidth_figure", "size_ticks", "SIZE_AXIS_TITLE", "BUSBW_AXIS_TITLE"]

SIZE_AXIS_TITLE = "message size (binary: 1 MiB = 2^20 B)"
BUSBW_AXIS_TITLE = "bus bandwidth (GB/s, 1 GB/s = 1e9 B/s)"


def size_ticks(sizes: Sequence[float]) -> tuple[list[float], list[str]]:
    """Tick positions and labels for byte sizes: the sizes themselves, labelled with binary prefixes."""
    values = sorted(set(sizes))
    return values, [format_bytes(v) for v in values]


def bus_bandwidth_figure(curves: Mapping[str, Sequence[tuple[float, float]]],
                         title: str = "bus bandwidth against message size") -> go.Figure:
    """One line per curve; ``curves``: name -> [(message bytes, bus bandwidth in B/s)]."""
    fig = go.Figure()
    sizes: list[float] = []
    for name, points in curves.items():
        sizes += [s for s, _ in points]
        fig.add_scatter(x=[s for s, _ in points], y=[bw / GIGA for _, bw in points], mode="lines+markers", name=name,
                        text=[format_bytes(s) for s, _ in points],
                        hovertemplate="%{text}: %{y:.1f} GB/s<extra>" + name + "</extra>")
    tickvals, ticktext = size_ticks(sizes)
    fig.update_layout(template=TEMPLATE, title=title,
                      xaxis={"title": SIZE_AXIS_TITLE, "type": "log", "tickvals": tickvals, "ticktext": ticktext},
                      yaxis={"title": BUSBW_AXIS_TITLE, "rangemode": "tozero"})
    return fig
