"""Notebook figures people can read anywhere (issue 14 item 11): static PNG copies next to the
notebooks where Kaleido and a Chrome are available, and axes in the right binary/decimal units."""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

import pytest
from trace_checks import synthetic_result

from simulator.units import GiB
from simulator.viz import static
from simulator.viz.breakdown import breakdown_figure
from simulator.viz.collective import bus_bandwidth_figure
from simulator.viz.memory import memory_figure
from simulator.viz.static import StaticFigures, static_renderer
from simulator.viz.timeline import timeline_figure

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def test_bus_bandwidth_axes_are_binary_sizes_and_decimal_rates():
    """Ticks sit at the sizes measured, 2^20 = 1,048,576 B and 2^30 B, labelled 1 MiB and 1 GiB
    (plotly's own log ticks would say 1M and 1G at 1e6 and 1e9); 5e9 B/s is drawn as 5 GB/s
    (/ 1e9, nccl-tests' busbw unit), 50e9 B/s as 50."""
    fig = bus_bandwidth_figure({"ring": [(2**20, 5e9), (2**30, 50e9)]})
    assert list(fig.layout.xaxis.tickvals) == [1048576, 1073741824]
    assert list(fig.layout.xaxis.ticktext) == ["1 MiB", "1 GiB"]
    assert list(fig.data[0].y) == [5.0, 50.0]
    assert fig.layout.xaxis.title.text == "message size (binary: 1 MiB = 2^20 B)"
    assert fig.layout.yaxis.title.text == "bus bandwidth (GB/s, 1 GB/s = 1e9 B/s)"


def test_figures_the_notebooks_show_carry_their_units():
    """The synthetic run's rank 0 holds 1 GiB of parameters for its 5 ms step: the memory panel
    plots 1.0 on a GiB axis (2^30 B); time axes are in ms."""
    run = synthetic_result()
    memory = memory_figure(run)
    y_titles = [memory.layout[name].title.text for name in memory.layout if name.startswith("yaxis")]
    assert y_titles and set(y_titles) == {"GiB"}
    params = next(t for t in memory.data if t.name == "params")
    assert params.y[0] == 1.0 and params.y[0] * GiB == 2**30  # 1 GiB of parameters, drawn as 1.0
    assert timeline_figure(run).layout.xaxis.title.text == "time (ms)"
    assert breakdown_figure(run.result).layout.yaxis.title.text == "time (ms)"


def _notebook_figures(path: Path) -> tuple[str, list[str], list[str]]:
    text = path.read_text()
    prefix = re.search(r'StaticFigures\(.*?prefix="([^"]+)"\)', text, re.S).group(1)
    added = re.findall(r'figures\.add\("([^"]+)"', text)
    shown = re.findall(r"!\[[^\]]*\]\(figures/([^)]+)\.png\)", text)
    return prefix, added, shown


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.py")), ids=lambda p: p.name)
def test_every_notebook_figure_has_a_committed_static_copy_it_links(path: Path):
    """Each figure a notebook keeps is linked from its last markdown cell (what GitHub and
    nbconvert show) and its PNG is in notebooks/figures/."""
    prefix, added, shown = _notebook_figures(path)
    assert prefix == path.stem and added, path.name
    assert shown == [f"{prefix}-{name}" for name in added]
    for name in shown:
        png = NOTEBOOKS / "figures" / f"{name}.png"
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_static_images_are_written_when_a_renderer_is_available(tmp_path: Path, capsys: Any):
    """plotly's default page is 700 x 500 layout pixels: at scale 1 the PNG is 700 x 500."""
    why = static_renderer()
    if why is not None:
        pytest.skip(why)
    figures = StaticFigures(tmp_path / "figures", prefix="nb")
    fig = figures.add("busbw", bus_bandwidth_figure({"ring": [(2**20, 5e9), (2**30, 50e9)]}))
    assert fig is figures.figures["busbw"]
    assert figures.save() == [tmp_path / "figures" / "nb-busbw.png"]
    assert _png_size(tmp_path / "figures" / "nb-busbw.png") == (700, 500)
    assert "static image: figures/nb-busbw.png" in capsys.readouterr().out


def test_without_a_renderer_nothing_is_written_and_a_note_says_why(tmp_path: Path, monkeypatch: Any, capsys: Any):
    monkeypatch.setattr(static, "_find_browser", lambda: None)
    figures = StaticFigures(tmp_path / "figures", prefix="nb")
    figures.add("busbw", bus_bandwidth_figure({"ring": [(2**20, 5e9)]}))
    assert figures.save() == [] and not (tmp_path / "figures").exists()
    note = capsys.readouterr().out.strip()
    assert note.startswith("no static images written: Kaleido") and ("Chrome" in note or "not installed" in note)


def test_static_figures_off_writes_nothing_whatever_is_installed(tmp_path: Path, monkeypatch: Any, capsys: Any):
    """``make notebooks`` sets DTSIM_STATIC_FIGURES=0: even with a browser found, no image is
    written (tests never start a browser nor rewrite the committed PNGs) and the note says why."""
    monkeypatch.setattr(static, "_find_browser", lambda: "/usr/bin/chromium")
    monkeypatch.setenv("DTSIM_STATIC_FIGURES", "0")
    figures = StaticFigures(tmp_path / "figures", prefix="nb")
    figures.add("busbw", bus_bandwidth_figure({"ring": [(2**20, 5e9)]}))
    assert figures.save() == [] and not (tmp_path / "figures").exists()
    assert capsys.readouterr().out.strip() == "no static images written: DTSIM_STATIC_FIGURES=0"
