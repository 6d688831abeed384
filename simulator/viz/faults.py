"""Figures of the ``faults`` section (``Result.faults``): the step-time distribution of
``sim.samples`` and the table of what was perturbed.

* :func:`samples_figure`: the sample step times sorted (an empirical quantile plot, seed in the
  hover) with the mean, p50 and p99 as horizontal lines, beside a bar of how often each rank
  was the slowest (the rank with the most compute, the one the others wait for);
* :func:`perturbations_figure`: one table row per straggler factor, the jitter, each perturbed
  link, and the ranks simulated individually.

Both read only the Result's numbers (:class:`~simulator.results.faults.FaultsSummary`).
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simulator.results.faults import rank_ranges
from simulator.units import MILLISECOND, format_time
from simulator.viz.style import TEMPLATE, colour

__all__ = ["samples_figure", "perturbations_figure", "perturbation_rows", "QUANTILE_LINES"]

# the distribution's summary lines: (trace name, StepSamples field, dash)
QUANTILE_LINES = (("mean", "mean_s", "solid"), ("p50", "p50_s", "dash"), ("p99", "p99_s", "dot"))


def samples_figure(result: Any) -> go.Figure | None:
    """The distribution of ``Result.faults.samples`` (None with fewer than two samples)."""
    s = result.faults.samples if result.faults is not None else None
    if s is None or s.samples < 2:
        return None
    fig = make_subplots(rows=1, cols=2, column_widths=[0.7, 0.3], horizontal_spacing=0.1,
                        subplot_titles=(f"step time of {s.samples} seeded iterations, sorted",
                                        "slowest rank (samples)"))
    order = sorted(range(s.samples), key=lambda i: (s.step_times_s[i], i))
    x = list(range(1, s.samples + 1))
    fig.add_trace(go.Scatter(
        x=x, y=[s.step_times_s[i] / MILLISECOND for i in order], mode="lines+markers", name="samples",
        marker={"color": colour("compute")}, line={"color": colour("compute"), "width": 1},
        customdata=[[s.seeds[i], s.slowest_rank[i]] for i in order],
        hovertemplate="%{y:.3f} ms (seed %{customdata[0]}, slowest rank %{customdata[1]})<extra></extra>",
    ), row=1, col=1)
    for name, field, dash in QUANTILE_LINES:
        value = getattr(s, field)
        fig.add_trace(go.Scatter(
            x=[x[0], x[-1]], y=[value / MILLISECOND] * 2, mode="lines", name=f"{name} {format_time(value)}",
            line={"dash": dash, "color": "#555"}, hovertemplate=f"{name} %{{y:.3f}} ms<extra></extra>",
        ), row=1, col=1)
    fig.add_trace(go.Bar(
        x=[f"rank {r}" for r in s.slowest_counts], y=list(s.slowest_counts.values()), name="slowest rank",
        marker={"color": colour("idle"), "line": {"color": "#555", "width": 1}}, showlegend=False,
        hovertemplate="%{x}: slowest in %{y} samples<extra></extra>",
    ), row=1, col=2)
    fig.update_xaxes(title="sample, fastest to slowest", row=1, col=1)
    fig.update_yaxes(title="step time (ms)", row=1, col=1)
    fig.update_yaxes(title="samples", row=1, col=2)
    fig.update_layout(
        template=TEMPLATE, height=420, margin={"l": 60, "r": 20, "t": 60, "b": 40}, legend={"title": None},
        meta={"note": "Each sample is one iteration with its own jitter seed (sim.samples); p50 and p99 are "
                      "numpy's linear-interpolation percentiles of the samples. The slowest rank of a sample "
                      "is the one with the most compute: the one every other rank waits for at its next "
                      "collective."},
    )
    return fig


def perturbation_rows(result: Any) -> list[tuple[str, str, str]]:
    """(what, where, effect) of each perturbation in ``Result.faults``, and the ranks simulated
    individually; empty without a ``faults`` section."""
    f = result.faults
    if f is None:
        return []
    by_factor: dict[float, list[int]] = {}
    for rank, factor in f.stragglers.items():
        by_factor.setdefault(factor, []).append(rank)
    rows = [("straggler", f"rank{'s' if len(r) > 1 else ''} {rank_ranges(r)}", f"compute x{factor:g}")
            for factor, r in by_factor.items()]
    if f.jitter_cv is not None:
        rows.append(("jitter", "every compute task", f"time x lognormal(mean 1, cv {f.jitter_cv:g})"))
    for link in f.links:
        effect = "failed, routed around" if link.bandwidth_factor == 0 else f"bandwidth x{link.bandwidth_factor:g}"
        if link.latency_add_s:
            effect += f", latency +{format_time(link.latency_add_s)}"
        entries = ", ".join(f"faults.links[{i}]" for i in link.faults)
        rows.append(("link", f"{link.label} ({link.kind}, {link.tier}; {entries})", effect))
    rows.append(("simulated individually", f"ranks {f.simulated_individually}", f.symmetry))
    return rows


def perturbations_figure(result: Any) -> go.Figure | None:
    """A table of :func:`perturbation_rows` (None without a ``faults`` section)."""
    rows = perturbation_rows(result)
    if not rows:
        return None
    columns = [list(c) for c in zip(*rows, strict=True)]
    fig = go.Figure(go.Table(
        columnwidth=[1, 3, 3],
        header={"values": ["perturbation", "where", "effect"], "align": "left", "fill_color": "#eee"},
        cells={"values": columns, "align": "left"},
    ))
    fig.update_layout(template=TEMPLATE, height=min(600, 80 + 28 * len(rows)),
                      margin={"l": 10, "r": 10, "t": 10, "b": 10})
    return fig
