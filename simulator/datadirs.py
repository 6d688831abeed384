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

__all__ = ["data_root", "topologies_dir", "models_dir", "scenarios_dir", "calibration_dir", "model_fingerprint"]

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


@cache
def model_fingerprint() -> str:
    """SHA-256 of the simulator's code and shipped data (``simulator/**/*.py``, the node, GPU,
    transport, NCCL and calibration files, the model presets): results computed under one
    fingerprint are reproduced exactly under it, so caches key on it (a sweep's cache never
    serves a result of older code or data, whatever the version number says)."""
    import hashlib

    digest = hashlib.sha256()
    files = sorted(_PACKAGE_DIR.rglob("*.py")) + sorted(topologies_dir().rglob("*.yaml")) + sorted(
        models_dir().glob("*.yaml"))
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()

