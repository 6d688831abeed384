"""YAML loading with line numbers and located errors, re-exported from :mod:`simulator.yamlio`
(it moved there so that :mod:`simulator.catalog` can read its files without importing the scenario)."""

from simulator.yamlio import (
    dotted,
    error_from_validation,
    exc_model,
    line_of,
    load_mapping,
    load_yaml,
    parse_yaml_text,
    to_plain,
)

__all__ = [
    "load_yaml",
    "load_mapping",
    "parse_yaml_text",
    "to_plain",
    "line_of",
    "error_from_validation",
    "exc_model",
    "dotted",
]
