"""Writing a trace document: JSON, gzip-compressed when the path ends in ``.gz``."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

__all__ = ["dump_json"]


def dump_json(document: dict[str, Any], path: Path, *, compact: bool = True) -> None:
    """JSON (gzip when ``path`` ends in ``.gz``). ``compact=False`` keeps ``": "`` separators:
    HTA finds a file's rank with the pattern ``"rank":\\s+(\\d+)`` (hta/common/trace_file.py)."""
    text = json.dumps(document, separators=(",", ":") if compact else None, allow_nan=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8", compresslevel=6) as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
