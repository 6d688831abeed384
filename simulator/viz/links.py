"""Network load: a heatmap of link classes over time and the busiest links."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from simulator.results.link_load import LinkLoad
from simulator.results.simulation import Simulation
from simulator.units import MILLISECOND, GiB
from simulator.viz.style import TEMPLATE

__all__ = ["link_heatmap_figure", "top_links_figure"]


def _message_figure(title: str, message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(template=TEMPLATE, title=title, height=220, xaxis={"visible": False},
                      yaxis={"visible": False})
    return fig


def link_heatmap_figure(sim: Simulation, *, max_links: int = 32, bins: int = 200) -> go.Figure:
    """Utilisation (%) of the ``max_links`` busiest link classes (rows, busiest on top) in
    ``bins`` equal time bins over the step (columns); each cell is the exact time average of
    the piecewise-constant load (:meth:`LinkLoad.binned_utilisation`). Needs a result
    simulated with ``record_series=True``; otherwise the figure says so."""
    title = "Link utilisation over the iteration (busiest link classes)"
    load = LinkLoad.from_series(sim.series, sim.result.step_time_s)
    if load is None:
        return _message_figure(title, "link loads were not recorded (simulate with record_series=True)")
    chosen = load.busiest(max_links)
    if not chosen:
        return _message_figure(title, "no link carried traffic")
    edges = np.linspace(0.0, load.end_s, bins + 1)
    util = 100.0 * load.binned_utilisation(chosen, edges)
    centres_ms = (edges[:-1] + edges[1:]) / 2 / MILLISECOND
    labels = [f"{load.labels[c]} [{load.kinds[c]}]" for c in chosen]
    fig = go.Figure(go.Heatmap(
        z=util, x=centres_ms, y=labels, zmin=0.0, zmax=100.0, colorscale="Viridis",
        colorbar={"title": {"text": "%"}},
        hovertemplate="%{y}<br>%{x:.2f} ms: %{z:.1f}%<extra></extra>",
    ))
    fig.update_layout(template=TEMPLATE, title=title, height=160 + 22 * len(chosen),
                      xaxis={"title": "time (ms)"}, yaxis={"autorange": "reversed"},
                      margin={"l": 260, "r": 20, "t": 60, "b": 40})
    return fig


def top_links_figure(sim: Simulation, *, top: int = 10) -> go.Figure:
    """Mean utilisation (%) over the step of the ``top`` busiest link classes
    (``sim.result.links``), with the bytes one link of the class carried."""
    title = f"Top {top} busiest links (mean utilisation over the step)"
    links = list(sim.result.links)[:top]
    if not links:
        return _message_figure(title, "no link carried traffic")
    fig = go.Figure(go.Bar(
        x=[100.0 * link.utilisation for link in links], y=[f"{link.label} [{link.kind}]" for link in links],
        orientation="h", marker={"color": "#4c78a8"},
        text=[f"{link.bytes / GiB:.2f} GiB" for link in links], textposition="auto",
        hovertemplate="%{y}: %{x:.1f}% (%{text} per link)<extra></extra>",
    ))
    fig.update_layout(template=TEMPLATE, title=title, height=140 + 30 * len(links),
                      xaxis={"title": "mean utilisation (%)", "rangemode": "tozero"},
                      yaxis={"autorange": "reversed"}, margin={"l": 260, "r": 20, "t": 60, "b": 40})
    return fig
