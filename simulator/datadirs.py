"""Where the shipped data lives: ``topologies/`` and ``scenarios/``.

In a checkout (editable install, or running from the source tree) these are the folders
beside ``simulator/``. A wheel carries copies under ``simulator/_data/``. Set
``DTSIM_DATA_DIR`` to a folder holding ``topologies/`` and ``scenarios/`` to use another
catalog.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path

__all__ = ["data_root", "topologies_dir", "models_dir", "scenarios_dir", "calibration_dir"]

_PACKAGE_DIR = Path(__file__).resolve().parent


@cache
def data_root() -> Path:
    """The folder that holds ``topologies/`` and ``scenarios/``."""
    override = os.environ.get("DTSIM_DATA_DIR")
    candidates = [Path(override)] if override else []
    candidates += [_PACKAGE_DIR.parent, _PACKAGE_DIR / "_data"]
    for candidate in candidates:
        if (candidate / "topologies").is_dir() and (candidate / "scenarios").is_dir():
            return candidate
    raise FileNotFoundError(
        "dtsim data folders (topologies/, scenarios/) not found; reinstall dtsim or set DTSIM_DATA_DIR"
    )


def topologies_dir() -> Path:
    return data_root() / "topologies"


def scenarios_dir() -> Path:
    return data_root() / "scenarios"


def models_dir() -> Path:
    return scenarios_dir() / "models"


def calibration_dir() -> Path:
    return topologies_dir() / "calibration"
