"""Scaling curves: throughput and scaling efficiency versus GPU count, with the ideal line.

Scaling efficiency of a point with ``N`` GPUs against the series' smallest run (``N0``
GPUs): ``efficiency = throughput_N / (N / N0 * throughput_N0)``; 1 is perfect linear
scaling. The functions take plain records (a sweep's table rows) so the sweep reuses them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from simulator.results.scaling import scaling_efficiency
from simulator.viz.style import TEMPLATE

__all__ = ["scaling_efficiency", "scaling_series", "scaling_figure", "out_of_memory"]

_PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2", "#72b7b2", "#eeca3b", "#9d755d")


def _number(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x > 0 else None


def out_of_memory(record: Mapping[str, Any]) -> bool:
    """True for a record of a run that does not fit (``oom`` true or ``fits`` false): its
    throughput is what it would reach if it fitted, so the figures leave it out."""
    return bool(record.get("oom")) or record.get("fits") is False


def scaling_series(records: Iterable[Mapping[str, Any]], *, gpus_key: str = "world_size",
                   throughput_key: str = "tokens_per_s",
                   series_key: str | None = None) -> dict[str, list[tuple[float, float, float]]]:
    """Records grouped into series (by ``series_key``; one series ``""`` without), each a list
    of ``(gpus, throughput, efficiency)`` sorted by GPU count. Records whose GPU count or
    throughput is missing, non-numeric or not positive (infeasible sweep points), and records
    that are out of memory (:func:`out_of_memory`), are skipped;
    for several records with one GPU count in a series, the highest throughput counts."""
    grouped: dict[str, dict[float, float]] = defaultdict(dict)
    for rec in records:
        n, t = _number(rec.get(gpus_key)), _number(rec.get(throughput_key))
        if n is None or t is None or out_of_memory(rec):
            continue
        key = "" if series_key is None else str(rec.get(series_key))
        grouped[key][n] = max(t, grouped[key].get(n, 0.0))
    out: dict[str, list[tuple[float, float, float]]] = {}
    for key in sorted(grouped):
        points = sorted(grouped[key].items())
        eff = scaling_efficiency([n for n, _ in points], [t for _, t in points])
        out[key] = [(n, t, e) for (n, t), e in zip(points, eff, strict=True)]
    return out


def scaling_figure(records: Iterable[Mapping[str, Any]], *, gpus_key: str = "world_size",
                   throughput_key: str = "tokens_per_s", series_key: str | None = None,
                   throughput_label: str = "tokens/s", title: str = "Scaling") -> go.Figure:
    """Two panels against GPU count (log2 axis): throughput per series with its ideal line
    (``throughput_N0 * N / N0``, dashed), and scaling efficiency (%) with 100 % dashed.
    ``records``: mappings such as sweep table rows or ``Result.model_dump()`` dicts; see
    :func:`scaling_series` for the keys and what is skipped. Out-of-memory records are not
    drawn; a note under the title counts them."""
    records = list(records)
    oom = sum(1 for rec in records if out_of_memory(rec))
    series = scaling_series(records, gpus_key=gpus_key, throughput_key=throughput_key, series_key=series_key)
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"throughput ({throughput_label})", "scaling efficiency"))
    all_gpus: set[float] = set()
    for k, (name, points) in enumerate(series.items()):
        shade = _PALETTE[k % len(_PALETTE)]
        label = name or throughput_label
        gpus = [n for n, _, _ in points]
        all_gpus.update(gpus)
        n0, t0 = points[0][0], points[0][1]
        fig.add_trace(go.Scatter(x=gpus, y=[t for _, t, _ in points], mode="lines+markers", name=label,
                                 legendgroup=label, line={"color": shade},
                                 hovertemplate="%{x} GPUs: %{y:,.0f} " + throughput_label + "<extra>" + label
                                               + "</extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=gpus, y=[t0 * n / n0 for n in gpus], mode="lines", name=f"{label} ideal",
                                 legendgroup=label, showlegend=False, line={"color": shade, "dash": "dash"},
                                 hovertemplate="ideal at %{x} GPUs: %{y:,.0f}<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=gpus, y=[100.0 * e for _, _, e in points], mode="lines+markers", name=label,
                                 legendgroup=label, showlegend=False, line={"color": shade},
                                 hovertemplate="%{x} GPUs: %{y:.1f}%<extra>" + label + "</extra>"), row=1, col=2)
    if all_gpus:
        fig.add_trace(go.Scatter(x=[min(all_gpus), max(all_gpus)], y=[100.0, 100.0], mode="lines", name="ideal",
                                 line={"color": "#555", "dash": "dash"}, hoverinfo="skip"), row=1, col=2)
    ticks = sorted(all_gpus)
    for col in (1, 2):
        fig.update_xaxes(type="log", title_text="GPUs", tickvals=ticks, ticktext=[f"{n:g}" for n in ticks],
                         row=1, col=col)
    fig.update_yaxes(title_text=throughput_label, rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="% of linear scaling", rangemode="tozero", row=1, col=2)
    fig.update_layout(template=TEMPLATE, title=title, height=420, margin={"l": 60, "r": 20, "t": 70, "b": 50})
    if oom:
        fig.add_annotation(text=f"{oom} out-of-memory point(s) not drawn: they do not fit, so their throughput "
                                "is not achievable", xref="paper", yref="paper", x=0, y=1.16, showarrow=False,
                           xanchor="left", font={"color": "#c00"})
    return fig
