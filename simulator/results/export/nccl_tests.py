"""nccl-tests' conventions and output layout, for ``dtsim collective``.

Everything here follows NVIDIA/nccl-tests at commit a0b82b22 (read, not copied):

* sizes: ``parsesize`` (``src/common.cu``) reads a number and at most one suffix letter,
  K, M or G in either case, as powers of 1024 ("We use the binary system"); anything else
  is invalid. The sweep starts at ``-b``, multiplies by ``-f`` when it is above 1, else adds
  ``-i`` (default 1 MiB), while the size stays at most ``-e`` (``TimeTest``).
* per collective (``src/<collective>.cu`` ``GetCollByteCount`` / ``GetBw``): the element
  count is size / type size; all-gather, reduce-scatter and all-to-all round each rank's
  share down to a multiple of 16 bytes' worth of elements; the printed size is the larger
  of the send and receive buffers; algbw = that size / time (GB/s = 1e9 B/s); busbw =
  algbw * 2(n-1)/n (all-reduce), (n-1)/n (all-gather, reduce-scatter, all-to-all), 1
  (broadcast, reduce, sendrecv); redop is "none" for all-gather, broadcast and all-to-all;
  root is -1 except for rooted collectives.
* layout (``src/util.cu`` ``writeResultHeader``, ``writeBenchmarkLinePreamble``,
  ``writeBenchmarkLineBody``, ``writeResultFooter``): header columns size, count, type,
  redop, root, then time (us), algbw, busbw, #wrong for out-of-place and again for in-place;
  numbers through ``getFloatStr`` (2, 1 or 0 decimals, whatever fits the column); #wrong
  "N/A" when data is not checked; footer "# Out of bounds values : 0 OK" and
  "# Avg bus bandwidth    : <mean busbw over every out-of-place and in-place entry>".
  The JSON records use ``-J``'s keys (size, count, type, redop, root, out_of_place/in_place
  with time, alg_bw, bus_bw, nwrong).
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from typing import Any

from simulator.costs.collectives import bus_bandwidth_factor
from simulator.errors import ScenarioError

__all__ = ["DTYPE_BYTES", "REDOPS", "TEST_NAMES", "NcclTestsRow", "parse_size", "size_sweep", "buffer_sizes",
           "redop_and_root", "make_row", "format_table", "format_csv", "format_json", "float_str"]

# nccl-tests' type names (src/common.cu test_typenames) and their sizes in bytes
DTYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2, "float": 4,
               "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}
REDOPS = ("sum", "prod", "max", "min", "avg", "mulsum")
# dtsim op -> the nccl-tests binary that measures it
TEST_NAMES = {"all_reduce": "all_reduce_perf", "all_gather": "all_gather_perf",
              "reduce_scatter": "reduce_scatter_perf", "all_to_all": "alltoall_perf", "broadcast": "broadcast_perf"}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(\S?)")
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def parse_size(text: str, what: str) -> int:
    """Bytes of an nccl-tests size ('8', '1M' = 1048576, '8G' = 8589934592): a number and
    optionally one letter K/M/G (powers of 1024), read as ``parsesize`` reads it (only the
    first letter after the number counts: '1MB' is 1 MiB there too)."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ScenarioError(f"invalid size specified for '{what}': {text!r} (a number of bytes, optionally with "
                            "K, M or G = powers of 1024, as nccl-tests)")
    return int(float(match.group(1)) * _UNITS[unit])


def size_sweep(min_bytes: int, max_bytes: int, step_factor: int, step_bytes: int) -> list[int]:
    """The sizes nccl-tests runs: from min, times the factor (if > 1) or plus the step, up to max."""
    if min_bytes > max_bytes:
        raise ScenarioError(f"invalid sizes for 'minbytes' and 'maxbytes': {min_bytes} > {max_bytes}")
    if step_factor <= 1 and step_bytes <= 0:
        raise ScenarioError("invalid step: -f must be above 1 or -i above 0 bytes")
    if step_factor > 1 and min_bytes <= 0:
        raise ScenarioError("invalid sizes: -b must be above 0 bytes when -f multiplies it")
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        size = size * step_factor if step_factor > 1 else size + step_bytes
    return sizes


def buffer_sizes(op: str, size: int, elt_bytes: int, nranks: int) -> tuple[int, int]:
    """(printed size in bytes, count column) of one nccl-tests line; the printed size is also
    dtsim's collective size D (all-reduce's vector, all-gather's output, reduce-scatter's
    input, what each rank sends in an all-to-all)."""
    count = size // elt_bytes
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        per_rank = (count // nranks) & ~(max(16 // elt_bytes, 1) - 1)
        return per_rank * nranks * elt_bytes, per_rank
    return count * elt_bytes, count


def redop_and_root(op: str, redop: str, root: int) -> tuple[str, int]:
    """The redop and root columns nccl-tests prints for ``op``."""
    reduces = op in ("all_reduce", "reduce_scatter")
    return (redop if reduces else "none"), (root if op == "broadcast" else -1)


@dataclass(frozen=True)
class NcclTestsRow:
    """One nccl-tests line (out-of-place and in-place are the same in the model)."""

    size_bytes: int
    count: int
    dtype: str
    redop: str
    root: int
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    algorithm: str
    protocol: str


def make_row(op: str, size: int, dtype: str, redop: str, root: int, nranks: int, time_s: float, how: str,
             ) -> NcclTestsRow:
    nbytes, count = buffer_sizes(op, size, DTYPE_BYTES[dtype], nranks)
    algbw = nbytes / time_s if time_s > 0 else 0.0
    shown_redop, shown_root = redop_and_root(op, redop, root)
    algorithm, _, protocol = how.partition("/")
    return NcclTestsRow(nbytes, count, dtype, shown_redop, shown_root, time_s, algbw,
                        algbw * bus_bandwidth_factor(op, nranks), algorithm, protocol)


def float_str(value: float, width: int) -> str:
    """A number in ``width`` characters as nccl-tests' ``getFloatStr``: 2 decimals if they fit,
    else 1, else 0, else scientific notation."""
    for decimals in (2, 1, 0):
        text = f"{value:{width}.{decimals}f}"
        if len(text) <= width:
            return text
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def average_busbw_gb_per_s(rows: list[NcclTestsRow]) -> float:
    """nccl-tests' "Avg bus bandwidth": the mean busbw of every out-of-place and in-place entry."""
    return sum(r.busbw_bytes_per_s for r in rows) / len(rows) / 1e9 if rows else 0.0


def format_table(rows: list[NcclTestsRow], header: list[str], test_name: str) -> str:
    """nccl-tests' stdout: ``header`` comment lines (without '# '), the table, the footer."""
    blank5 = ("", "", "", "", "")
    lines = [f"# {h}".rstrip() for h in header]
    lines.append("#")
    lines.append("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          "
                 .format(*blank5))
    cols = ("time", "algbw", "busbw", "#wrong")
    lines.append("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} "
                 .format("size", "count", "type", "redop", "root", *cols, *cols))
    units = ("(us)", "(GB/s)", "(GB/s)", "")
    lines.append("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} "
                 .format("(B)", "(elements)", "", "", "", *units, *units))
    for r in rows:
        body = f"  {float_str(r.time_s * 1e6, 7)}  {float_str(r.algbw_bytes_per_s / 1e9, 6)}" \
               f"  {float_str(r.busbw_bytes_per_s / 1e9, 6)}    N/A"
        lines.append(f"{r.size_bytes:12d}  {r.count:12d}  {r.dtype:>8}  {r.redop:>6}  {r.root:6d}{body}{body}")
    lines.append(f"# {'Out of bounds values':<20} : 0 OK")
    lines.append(f"# {'Avg bus bandwidth':<20} : {average_busbw_gb_per_s(rows):g} ")
    lines.append("#")
    lines.append(f"# Collective test concluded: {test_name}")
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ("size_bytes", "count", "type", "redop", "root", "time_us", "algbw_gb_per_s", "busbw_gb_per_s",
               "algorithm", "protocol")


def format_csv(rows: list[NcclTestsRow]) -> str:
    """One CSV row per size (GB/s = 1e9 B/s, as nccl-tests)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for r in rows:
        writer.writerow([r.size_bytes, r.count, r.dtype, r.redop, r.root, f"{r.time_s * 1e6:.6g}",
                         f"{r.algbw_bytes_per_s / 1e9:.6g}", f"{r.busbw_bytes_per_s / 1e9:.6g}", r.algorithm,
                         r.protocol])
    return out.getvalue()


def format_json(rows: list[NcclTestsRow], config: dict[str, Any]) -> str:
    """nccl-tests' ``-J`` records (time in us, bandwidths in GB/s) plus dtsim's algorithm and protocol."""
    def body(r: NcclTestsRow) -> dict[str, Any]:
        return {"time": r.time_s * 1e6, "alg_bw": r.algbw_bytes_per_s / 1e9, "bus_bw": r.busbw_bytes_per_s / 1e9,
                "nwrong": None}

    results = [{"size": r.size_bytes, "count": r.count, "type": r.dtype, "redop": r.redop, "root": f"{r.root:6d}",
                "algorithm": r.algorithm, "protocol": r.protocol, "out_of_place": body(r), "in_place": body(r)}
               for r in rows]
    doc = {"config": config, "results": results, "out_of_bounds": {"count": 0, "okay": True},
           "average_bus_bandwidth": {"bandwidth": average_busbw_gb_per_s(rows), "okay": "unchecked"}}
    return json.dumps(doc, indent=2) + "\n"
