"""Static images of figures (PNG, SVG) for viewers that run no JavaScript: GitHub's notebook
view, nbconvert, a paper.

plotly renders them through Kaleido (``kaleido>=1``, in the ``notebooks`` extra), which drives
a Chrome or Chromium installed on the machine. Where either is missing nothing is written and a
one-line note says why; the interactive figures are unaffected.

    figures = StaticFigures(ROOT / "notebooks" / "figures", prefix="01-quickstart")
    figures.add("breakdown", breakdown_figure(result))   # returns the figure (shown as usual)
    figures.save()                                       # one browser start for all of them
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

__all__ = ["static_renderer", "StaticFigures"]

_BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")


def _find_browser() -> str | None:
    """The Chrome or Chromium Kaleido would start (its own search), else one on the PATH."""
    found = None
    with contextlib.suppress(Exception):  # another choreographer version: fall back to the PATH
        from choreographer.browsers.chromium import Chromium

        found = Chromium.find_browser(skip_local=False)
    if found:
        return str(found)
    return next((path for name in _BROWSERS if (path := shutil.which(name))), None)


def static_renderer() -> str | None:
    """None when figures can be written as static images here, else why not (one line).
    ``DTSIM_STATIC_FIGURES=0`` turns writing off (``make notebooks`` sets it, so running the
    notebooks as tests neither starts a browser nor rewrites the committed images)."""
    if os.environ.get("DTSIM_STATIC_FIGURES", "").strip().lower() in ("0", "false", "no", "off"):
        return "DTSIM_STATIC_FIGURES=0"
    try:
        version = importlib.metadata.version("kaleido")
    except importlib.metadata.PackageNotFoundError:
        return "Kaleido is not installed (pip install 'kaleido>=1', or the notebooks extra)"
    if int(version.split(".")[0]) < 1:
        return f"Kaleido {version} is too old for this plotly (needs kaleido>=1)"
    if _find_browser() is None:
        return "Kaleido finds no Chrome or Chromium on this machine (install one, or run plotly_get_chrome)"
    return None


class StaticFigures:
    """The figures of one notebook, written together as ``folder/<prefix>-<name>.<format>``."""

    def __init__(self, folder: str | Path, prefix: str, formats: tuple[str, ...] = ("png",), scale: float = 1.0):
        self.folder = Path(folder)
        self.prefix = prefix
        self.formats = formats
        self.scale = scale
        self.figures: dict[str, go.Figure] = {}

    def add(self, name: str, fig: go.Figure) -> go.Figure:
        """Keep ``fig`` to be written as ``name``; returns it, so a cell still shows it."""
        self.figures[name] = fig
        return fig

    def paths(self) -> list[Path]:
        """The files :meth:`save` writes, in figure order, each format in turn."""
        return [self.folder / f"{self.prefix}-{name}.{fmt}" for fmt in self.formats for name in self.figures]

    def save(self) -> list[Path]:
        """Write every figure kept; prints what was written, or why nothing was. Returns the files."""
        why = static_renderer()
        if why is None and self.figures:
            self.folder.mkdir(parents=True, exist_ok=True)
            paths = self.paths()
            try:
                pio.write_images([fig for _ in self.formats for fig in self.figures.values()], paths,
                                 scale=self.scale)
            except Exception as exc:  # a browser that will not start, a sandbox: the figures stay interactive
                why = f"Kaleido failed: {type(exc).__name__}: {exc}".splitlines()[0]
            else:
                for path in paths:
                    print(f"static image: {self.folder.name}/{path.name}")
                return paths
        print(f"no static images written: {why or 'no figures'}")
        return []
