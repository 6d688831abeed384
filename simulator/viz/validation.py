"""Predicted versus measured step time (plotly), for ``docs/validation.html``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["validation_figure", "write_validation_html"]


def validation_figure(validation: Any, names: dict[str, str], colours: dict[str, str]) -> Any:
    """Scatter of every record (``validation.records``), one trace per source, with y = x."""
    import plotly.graph_objects as go

    fig = go.Figure()
    by_source: dict[str, list[Any]] = {}
    for r in validation.records:
        by_source.setdefault(r.record.source, []).append(r)
    values = [v for r in validation.records for v in (r.record.measured_step_s, r.predicted_step_s)]
    lo, hi = min(values) / 1.5, max(values) * 1.5
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="y = x",
                             line={"dash": "dash", "color": "#888"}, hoverinfo="skip"))
    for source, rows in sorted(by_source.items()):
        fig.add_trace(go.Scatter(
            x=[r.record.measured_step_s for r in rows], y=[r.predicted_step_s for r in rows], mode="markers",
            name=names.get(source, source), marker={"color": colours.get(source), "size": 8},
            text=[f"{r.record.id}<br>{r.record.gpus} GPUs<br>error {100 * r.error:+.1f}%" for r in rows],
            hovertemplate="%{text}<br>measured %{x:.3f} s<br>predicted %{y:.3f} s<extra></extra>"))
    fig.update_xaxes(type="log", title="measured step time (s)")
    fig.update_yaxes(type="log", title="predicted step time (s)")
    fig.update_layout(title="dtsim against published training runs", template="plotly_white", height=600)
    return fig


def write_validation_html(validation: Any, path: Path, names: dict[str, str], colours: dict[str, str]) -> Path:
    """An interactive page; plotly.js comes from its CDN to keep the file small in the repository."""
    validation_figure(validation, names, colours).write_html(str(path), include_plotlyjs="cdn", full_html=True,
                                                                div_id="dtsim-validation")
    return path
