"""``dtsim collective``'s reading of nccl-tests arguments and NCCL environment knobs.

nccl-tests names the collective by its binary (``all_reduce_perf``) and uses ``-o/--op`` for
the reduction (sum, prod, ...); dtsim's ``--op`` named the collective, so ``--op`` takes
either. Sizes: ``-b/-e/-i`` exactly as nccl-tests' ``parsesize``; ``--sizes START:END``
(dtsim's form, doubling) takes nccl-tests' bare K/M/G (powers of 1024) or dtsim's units
(``8B``, ``16GiB``, ``1MB`` = 10^6 B).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from simulator import units
from simulator.costs.nccl_env import NcclTuning
from simulator.errors import ScenarioError
from simulator.results.export.nccl_tests import DTYPE_BYTES, REDOPS, TEST_NAMES, parse_size, size_sweep

__all__ = ["COLLECTIVE_NAMES", "resolve_collective", "resolve_sizes", "resolve_tuning", "Knobs"]

# every name a user may give the collective: dtsim's op, nccl-tests' binary and its stem
COLLECTIVE_NAMES = {**{op: op for op in TEST_NAMES}, **{b: op for op, b in TEST_NAMES.items()},
                    **{b.removesuffix("_perf"): op for op, b in TEST_NAMES.items()}}
# NCCL variables dtsim honours; the others a user commonly sets for performance are noted
HONOURED = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_NVLS_ENABLE")
NOT_MODELLED = ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_NCHANNELS", "NCCL_MIN_NRINGS", "NCCL_MAX_NRINGS",
                "NCCL_NCHANNELS_PER_NET_PEER", "NCCL_BUFFSIZE", "NCCL_NTHREADS", "NCCL_P2P_DISABLE",
                "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE", "NCCL_NET_GDR_LEVEL", "NCCL_CROSS_NIC", "NCCL_CTA_POLICY")
_BARE = re.compile(r"^\s*[0-9]*\.?[0-9]+\s*[KkMmGg]?\s*$")


def resolve_collective(positional: str | None, op: str | None, dtype: str) -> tuple[str, str]:
    """(dtsim op, nccl-tests redop) from the positional name and ``--op``."""
    if dtype not in DTYPE_BYTES:
        raise ScenarioError(f"-d/--datatype {dtype!r}: expected one of {', '.join(DTYPE_BYTES)}")
    collective, redop = None, "sum"
    if positional is not None:
        if positional not in COLLECTIVE_NAMES:
            raise ScenarioError(f"collective {positional!r}: expected one of {', '.join(COLLECTIVE_NAMES)}")
        collective = COLLECTIVE_NAMES[positional]
    if op is not None:
        if op in REDOPS:
            redop = op
        elif op in COLLECTIVE_NAMES:
            if collective is not None and COLLECTIVE_NAMES[op] != collective:
                raise ScenarioError(f"--op {op!r} contradicts the collective {positional!r}")
            collective = COLLECTIVE_NAMES[op]
        else:
            raise ScenarioError(f"-o/--op {op!r}: expected a reduction ({', '.join(REDOPS)}) or a collective "
                                f"({', '.join(TEST_NAMES)})")
    return collective or "all_reduce", redop


def _dtsim_size(text: str) -> int:
    if _BARE.match(text):
        return parse_size(text, "sizes")
    try:
        size = units.parse_bytes(text)
    except units.UnitError as exc:
        raise ScenarioError(f"--sizes {text!r}: {exc}") from None
    if not math.isfinite(size) or size < 0:
        raise ScenarioError(f"--sizes {text!r}: a size is a finite number of bytes >= 0")
    return int(size)


def resolve_sizes(sizes: str | None, minbytes: str | None, maxbytes: str | None, stepbytes: str | None,
                  stepfactor: int | None) -> tuple[list[int], int, int, str]:
    """The sweep's sizes, its min and max, and nccl-tests' "step: N(factor|bytes)" text."""
    nccl_style = any(x is not None for x in (minbytes, maxbytes, stepbytes, stepfactor))
    if sizes is not None and nccl_style:
        raise ScenarioError("--sizes and -b/-e/-i/-f both given: use one or the other")
    if nccl_style:  # nccl-tests' defaults: 32M to 32M, step 1M, factor 1 (src/common.cu)
        lo = parse_size(minbytes, "minbytes") if minbytes is not None else 32 * 2**20
        hi = parse_size(maxbytes, "maxbytes") if maxbytes is not None else 32 * 2**20
        step = parse_size(stepbytes, "stepBytes") if stepbytes is not None else 2**20
        factor = stepfactor or 1
    else:
        start, _, end = (sizes or "8:16G").partition(":")
        lo = _dtsim_size(start)
        hi = _dtsim_size(end) if end else lo
        if lo <= 0:
            raise ScenarioError(f"--sizes {sizes!r}: need 0 < start <= end, e.g. 8:16G")
        step, factor = 0, 2
    text = f"{factor}(factor)" if factor > 1 else f"{step}(bytes)"
    return size_sweep(lo, hi, factor, step), lo, hi, text


@dataclass(frozen=True)
class Knobs:
    tuning: NcclTuning
    algorithm: str | None  # dtsim algorithm forced by --algorithm
    notes: tuple[str, ...]  # header lines: where each knob came from
    warnings: tuple[str, ...]  # knobs set but not modelled


def _dtsim_algorithm(name: str, known: tuple[str, ...]) -> str:
    lowered = name.lower()
    if lowered in known:
        return lowered
    raise ScenarioError(f"--algorithm {name!r}: expected one of {', '.join(known)}")


def resolve_tuning(environ: Mapping[str, str], env_options: list[str], algorithm: str | None,
                   protocol: str | None, known_algorithms: tuple[str, ...]) -> Knobs:
    """NCCL knobs from the environment, then ``--env K=V`` (wins), then ``--algorithm`` /
    ``--protocol`` (win over both)."""
    values: dict[str, tuple[str, str]] = {}  # name -> (value, source)
    warnings = [f"{k}={environ[k]} (environment) is not modelled by dtsim; ignored" for k in NOT_MODELLED
                if environ.get(k)]
    for k in HONOURED:
        if environ.get(k):
            values[k] = (environ[k], "environment")
    for item in env_options:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("NCCL_"):
            raise ScenarioError(f"--env {item!r}: expected NCCL_NAME=VALUE, e.g. --env NCCL_ALGO=Ring")
        if key in HONOURED:
            values[key] = (value, "--env")
        else:
            warnings.append(f"{key}={value} (--env) is not modelled by dtsim; ignored")
    if protocol is not None:
        values["NCCL_PROTO"] = (protocol, "--protocol")
    forced = _dtsim_algorithm(algorithm, known_algorithms) if algorithm is not None else None
    if forced is not None and "NCCL_ALGO" in values:
        warnings.append(f"NCCL_ALGO={values['NCCL_ALGO'][0]} ({values['NCCL_ALGO'][1]}) is overridden by "
                        f"--algorithm {forced}")
        del values["NCCL_ALGO"]
    try:
        tuning = NcclTuning.from_env({k: v for k, (v, _) in values.items()})
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None
    notes = [f"{k}={v} ({source})" for k, (v, source) in values.items()]
    if forced is not None:
        notes.append(f"algorithm {forced} (--algorithm)")
    return Knobs(tuning, forced, tuple(notes), tuple(warnings))
