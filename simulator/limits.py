"""Resource limits: one place that says how large an input dtsim accepts before it does any work.

Every input that can make dtsim use memory or time out of proportion to its size is checked
against a named limit here, before the work starts: one input file's bytes, a YAML
document's aliases, expanded size and nesting depth, the simulated cluster's GPUs and
nodes, the model's layers and sequence length, the tokens and sequences of one step, the
tasks and events of one simulation, the points of a sweep, the ranks ``--trace-ranks``
selects, and the size of the numbers a derived sweep expression builds. Exceeding one
raises :class:`LimitError` (a :class:`~simulator.errors.ScenarioError`, so the CLI prints one
line naming file, line, field and limit and exits 2).

The defaults are far above anything a real training run needs (the largest published
runs use about 10^5 GPUs and 10^8 tokens per step) and far below what exhausts a
workstation. Someone who really means a larger input raises a limit:

* ``DTSIM_LIMITS="world_size=262144,sweep_points=1000000"`` in the environment, or
* ``dtsim --limit world_size=262144 --limit sweep_points=1000000 run ...`` on the command
  line (which sets the same variable, so sweep worker processes inherit it), or
* ``with simulator.limits.raised(world_size=262144): ...`` from Python.

``dtsim --help`` and README.md ("Limits") list the same table as :data:`LIMITS`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

from simulator.errors import ScenarioError

__all__ = ["Limit", "LIMITS", "LimitError", "ENV_VAR", "get", "check", "check_sweep_points", "parse_assignments",
           "apply_assignments", "raised", "describe"]

ENV_VAR = "DTSIM_LIMITS"


@dataclass(frozen=True)
class Limit:
    """One limit: its name (what ``--limit NAME=N`` takes), default, unit and what it bounds."""

    name: str
    default: int
    unit: str
    what: str


LIMITS: dict[str, Limit] = {limit.name: limit for limit in (
    Limit("file_bytes", 16 * 2**20, "bytes", "size of one input file (scenario, cluster, node, sweep, calibration)"),
    Limit("yaml_aliases", 1_000, "aliases", "YAML alias references (*name) in one document"),
    Limit("yaml_nodes", 1_000_000, "values", "values in one YAML document once its aliases are expanded"),
    Limit("yaml_depth", 64, "levels", "nesting depth of YAML mappings and lists"),
    Limit("world_size", 131_072, "GPUs", "GPUs of one simulated cluster (run, topo, collective)"),
    Limit("nodes", 32_768, "nodes", "nodes of one simulated cluster (run, search --nodes, topo --nodes, collective --nodes)"),
    Limit("layers", 4_096, "layers", "transformer blocks of the model"),
    Limit("seq_len", 2**24, "tokens", "sequence length of the model"),
    Limit("global_batch", 2**24, "sequences", "sequences of one optimizer step"),
    Limit("tokens_per_step", 2**33, "tokens", "global batch x sequence length"),
    Limit("routing_draws", 65_536, "draws", "MoE routing-skew draws of one run (training.moe_routing.samples x seeds)"),
    Limit("tasks", 2_000_000, "tasks", "tasks of one simulated program (layers x micro-batches x simulated ranks)"),
    Limit("engine_events", 20_000_000, "events", "events the discrete-event engine processes in one run"),
    Limit("sim_samples", 1_000, "iterations", "seeded iterations of one run (sim.samples), each a whole simulation"),
    Limit("sweep_points", 100_000, "points", "points of one sweep (the product of its axes), counted before any is built"),
    Limit("trace_ranks", 131_072, "ranks", "ranks one --trace-ranks selection names, counted before any range is expanded"),
    Limit("goodput_trials", 100_000, "trials", "Monte-Carlo trials of one dtsim goodput run (--trials)"),
    Limit("goodput_events", 50_000_000, "failures", "failures all Monte-Carlo trials of dtsim goodput replay together "
          "(trials x expected failures per run), counted before any trial runs"),
    Limit("expression_bits", 1_024, "bits", "size of any number a derived sweep expression computes"),
)}


class LimitError(ScenarioError):
    """An input is larger than a resource limit; the message names the limit and how to raise it."""


_scoped: dict[str, int] = {}


def parse_assignments(text: str, *, source: str = ENV_VAR) -> dict[str, int]:
    """``"world_size=262144, sweep_points=1e6"`` -> {name: value}; unknown names and values
    that are not positive whole numbers raise :class:`~simulator.errors.ScenarioError`."""
    out: dict[str, int] = {}
    for part in text.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, raw = part.partition("=")
        name = name.strip()
        if not sep:
            raise ScenarioError(f"{source} {part!r}: expected NAME=N, e.g. world_size=262144")
        if name not in LIMITS:
            raise ScenarioError(f"{source} {part!r}: unknown limit {name!r} (known: {', '.join(LIMITS)})")
        try:
            number = float(raw.strip().replace("_", ""))
        except ValueError:
            number = float("nan")
        if not (number >= 1 and number < 2**63 and number == int(number)):
            raise ScenarioError(f"{source} {part!r}: the value must be a whole number >= 1")
        out[name] = int(number)
    return out


def _from_env() -> dict[str, int]:
    text = os.environ.get(ENV_VAR, "")
    return parse_assignments(text) if text.strip() else {}


def get(name: str) -> int:
    """The value of limit ``name`` now: a :func:`raised` scope, else ``DTSIM_LIMITS``, else the default."""
    if name in _scoped:
        return _scoped[name]
    env = _from_env()
    return env.get(name, LIMITS[name].default)


def apply_assignments(texts: list[str] | tuple[str, ...]) -> None:
    """``--limit NAME=N`` options: merged into ``DTSIM_LIMITS`` of this process (and so of the
    worker processes it starts)."""
    merged = _from_env()
    for text in texts:
        merged.update(parse_assignments(text, source="--limit"))
    if merged:
        os.environ[ENV_VAR] = ",".join(f"{k}={v}" for k, v in merged.items())


@contextlib.contextmanager
def raised(**values: int) -> Iterator[None]:
    """Within the block, use these limits (Python API; the environment is left alone)."""
    unknown = set(values) - set(LIMITS)
    if unknown:
        raise ScenarioError(f"unknown limit(s) {', '.join(sorted(unknown))} (known: {', '.join(LIMITS)})")
    saved = dict(_scoped)
    _scoped.update(values)
    try:
        yield
    finally:
        _scoped.clear()
        _scoped.update(saved)


def exceeded(name: str, value: int | float, *, what: str | None = None, field: str | None = None,
             file: str | None = None, line: int | None = None) -> LimitError:
    """The error for ``value`` over limit ``name`` (``what`` describes the value, default the limit's own words)."""
    limit = LIMITS[name]
    if isinstance(value, int):  # an int of thousands of digits is shown by its size (str() of it may refuse)
        shown = f"{value:,}" if value < 10**30 else f"about 10^{int(value.bit_length() * 0.30103)}"
    else:
        shown = f"{value:g}"
    return LimitError(
        f"{what or limit.what}: {shown} {limit.unit} exceeds the limit {name}={get(name):,}"
        f" (raise it with --limit {name}=N or {ENV_VAR}={name}=N)",
        field=field, file=file, line=line)


def check(name: str, value: int | float, *, what: str | None = None, field: str | None = None,
          file: str | None = None, line: int | None = None) -> None:
    """Raise :class:`LimitError` when ``value`` is over limit ``name``."""
    if value > get(name):
        raise exceeded(name, value, what=what, field=field, file=file, line=line)


def check_sweep_points(n: int, *, field: str | None = None, file: str | None = None, line: int | None = None) -> None:
    """A sweep of ``n`` points (the product of its axis lengths, computed without building any)."""
    check("sweep_points", n, what="points of this sweep (the product of its axis lengths)", field=field, file=file,
          line=line)


def describe() -> str:
    """The table of limits for ``dtsim --help`` and the docs: ``name=default unit: what``."""
    return "\n".join(f"{limit.name}={limit.default:_} {limit.unit}: {limit.what}" for limit in LIMITS.values())
