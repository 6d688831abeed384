"""The sweep cache: one JSON file per finished point, written atomically.

The parent writes every finished point to ``OUT/cache/<key>.json`` at once, atomically (a
temporary file, then :func:`os.replace`), where ``key`` hashes the scenario's content hash,
the simulator version and the fingerprint of its code and data
(:func:`~simulator.sweep.worker.point_key`). A later run with the same output folder reads
those entries instead of simulating, so an interrupted sweep resumes where it stopped and
loses nothing.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simulator import __version__

__all__ = ["ResultCache", "atomic_write_text"]


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never
    a part: a uniquely named temporary file in the same folder, flushed to disk, then
    :func:`os.replace` (atomic on POSIX and Windows)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class ResultCache:
    """Finished points, one JSON file per key under ``folder``. Unreadable or foreign entries
    (an interrupted write from another tool, a different key inside) count as missing."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            entry = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("key") != key:
            return None
        return entry

    def put(self, key: str, outcome: Mapping[str, Any]) -> None:
        entry = {"key": key, "simulator_version": __version__, **outcome}
        atomic_write_text(self._path(key), json.dumps(entry, sort_keys=True))
