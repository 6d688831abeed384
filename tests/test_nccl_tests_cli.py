"""``dtsim collective`` speaks nccl-tests (issue 14 item 5): its flags and size suffixes, its
table (parsed here the way scripts parse ``all_reduce_perf`` output), NCCL's tuning variables,
and an error, not an answer, for an algorithm the topology cannot run.

nccl-tests facts are from NVIDIA/nccl-tests a0b82b22 (``src/common.cu`` ``parsesize`` and the
size loop, ``src/util.cu`` the layout, ``src/<collective>.cu`` the counts and busbw factors)."""

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import simulator
from simulator.costs.nccl_env import NcclTuning
from simulator.errors import ScenarioError
from simulator.results.export.nccl_tests import buffer_sizes, float_str, parse_size, size_sweep
from simulator.run import collective_choice

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30


def dtsim(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``dtsim collective ...`` in a fresh process, with no NCCL_* variable but ``env``'s."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    base["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "simulator.cli", "collective", *args], cwd=ROOT,
                          env={**base, **(env or {})}, capture_output=True, text=True, timeout=300)


@pytest.fixture
def inproc(cli, monkeypatch):
    """``dtsim collective ...`` in this process (faster), with only ``env``'s NCCL_* variables."""
    def invoke(*args: str, env: dict[str, str] | None = None):
        for key in [k for k in os.environ if k.startswith("NCCL_")]:
            monkeypatch.delenv(key)
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        return cli("collective", *args)

    return invoke


def parse_nccl_tests(text: str) -> tuple[list[dict], float | None]:
    """A parser written against nccl-tests' printed layout, as cluster scripts do: skip '#'
    lines (after srun's "N: " rank prefix), split data lines on blanks: size, count, type,
    redop, root, then time/algbw/busbw/#wrong out-of-place and in-place; the average from
    "# Avg bus bandwidth : X"."""
    rows, avg = [], None
    for raw in text.splitlines():
        line = re.sub(r"^\d+:\s", "", raw)
        if line.lstrip().startswith("#"):
            found = re.match(r"#\s*Avg bus bandwidth\s*:\s*(\S+)", line)
            if found:
                avg = float(found.group(1))
            continue
        f = line.split()
        if len(f) < 13 or not f[0].isdigit():
            continue
        rows.append({"size": int(f[0]), "count": int(f[1]), "type": f[2], "redop": f[3], "root": int(f[4]),
                     "time_us": float(f[5]), "algbw": float(f[6]), "busbw": float(f[7]), "wrong": f[8],
                     "ip_time_us": float(f[9]), "ip_algbw": float(f[10]), "ip_busbw": float(f[11])})
    return rows, avg


# Real nccl-tests output (all_reduce_perf, 2 x p4de.24xlarge = 16 ranks) as printed in
# aws-samples/awsome-distributed-training micro-benchmarks/nccl-tests/README.md ("Results",
# commit 0162aacd), three lines of it: the parser must read the real thing too.
REAL_SAMPLE = """\
0: #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
0: #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
0:            8             2     float     sum      -1    164.3    0.00    0.00      0    163.3    0.00    0.00      0
0:   1073741824     268435456     float     sum      -1    26217   40.96   76.79      0    26194   40.99   76.86      0
0:   2147483648     536870912     float     sum      -1    51406   41.78   78.33      0    51406   41.77   78.33      0
"""


# -- sizes ------------------------------------------------------------------------------


def test_sizes_follow_nccl_tests_parsesize():
    """K/M/G are powers of 1024 and only the first letter counts (parsesize's "%lf %1s")."""
    assert parse_size("8", "minbytes") == 8
    assert parse_size("1K", "minbytes") == 1024
    assert parse_size("1M", "minbytes") == 1048576  # 1024**2
    assert parse_size("8G", "maxbytes") == 8589934592  # 8 * 1024**3
    assert parse_size("0.5m", "minbytes") == 524288  # 0.5 * 1048576
    assert parse_size("1MB", "minbytes") == 1048576  # 'M' read, 'B' ignored, as nccl-tests does
    for bad in ("8B", "1X", "abc", "-1"):
        with pytest.raises(ScenarioError, match="invalid size specified for 'minbytes'"):
            parse_size(bad, "minbytes")


def test_size_sweep_multiplies_by_the_factor_or_adds_the_step():
    """-b 8 -e 128M -f 2: 8 * 2**k <= 2**27 for k = 0..24 (25 sizes); -b 1M -e 3M -i 1M: 1M, 2M, 3M."""
    sweep = size_sweep(8, 128 * 2**20, 2, 0)
    assert len(sweep) == 25 and sweep[0] == 8 and sweep[-1] == 134217728
    assert size_sweep(2**20, 3 * 2**20, 1, 2**20) == [1048576, 2097152, 3145728]
    with pytest.raises(ScenarioError, match="minbytes"):
        size_sweep(2**21, 2**20, 2, 0)


def test_a_size_range_with_nccl_suffixes():
    """--sizes 1M:1G doubles from 2**20 to 2**30: 11 sizes."""
    from simulator.cli.nccl_args import resolve_sizes

    sweep, lo, hi, step = resolve_sizes("1M:1G", None, None, None, None)
    assert sweep == [2**k for k in range(20, 31)] and (lo, hi, step) == (1048576, 1073741824, "2(factor)")
    assert resolve_sizes("8B:1KiB", None, None, None, None)[0] == [8, 16, 32, 64, 128, 256, 512, 1024]
    assert resolve_sizes(None, "8", "8G", None, 2)[0][-1] == 8589934592


def test_counts_follow_each_collectives_buffer_rule():
    """all_gather 1 MiB float on 8 ranks: 262144 elements, 32768 per rank, size 32768*8*4 =
    1048576. alltoall 1000 B double on 3 ranks: 125 elements, 41 per rank rounded down to a
    multiple of 16/8 = 2 -> 40, size 40*3*8 = 960. all_reduce 1000 B bfloat16: 500 elements."""
    assert buffer_sizes("all_gather", 2**20, 4, 8) == (1048576, 32768)
    assert buffer_sizes("all_to_all", 1000, 8, 3) == (960, 40)
    assert buffer_sizes("all_reduce", 1000, 2, 8) == (1000, 500)


def test_numbers_fit_the_columns_as_nccl_tests_prints_them():
    """getFloatStr: 2 decimals if they fit, else 1, else 0, else scientific."""
    assert float_str(148.0, 7) == " 148.00"
    assert float_str(13552.34, 7) == "13552.3"
    assert float_str(123456.7, 7) == " 123457"
    assert float_str(12345678.9, 6) == " 1e+07"


# -- the table --------------------------------------------------------------------------


def test_the_parser_reads_real_nccl_tests_output():
    """16 ranks: busbw = algbw * 2*15/16 = 1.875 algbw; algbw = size / time: 2147483648 B /
    51406 us = 41.775 GB/s (printed 41.78), busbw 41.78 * 1.875 = 78.34 (printed 78.33)."""
    rows, _ = parse_nccl_tests(REAL_SAMPLE)
    assert [r["size"] for r in rows] == [8, 1073741824, 2147483648]
    for r in rows[1:]:
        assert r["busbw"] == pytest.approx(r["algbw"] * 1.875, abs=0.02)
        assert r["algbw"] == pytest.approx(r["size"] / (r["time_us"] * 1e3), abs=0.01)


def test_cli_prints_nccl_tests_table_that_its_parser_reads():
    """all_reduce_perf -b 8 -e 128M -f 2 -g 8 on one p4d.24xlarge: 25 rows 8 B .. 128 MiB,
    count = size / 4 (float), redop sum, root -1, busbw = algbw * 2*7/8 = 1.75 algbw, in-place
    = out-of-place, the average the mean busbw, the 1 MiB time the model's own."""
    out = dtsim("all_reduce_perf", "--node", "p4d.24xlarge", "-b", "8", "-e", "128M", "-f", "2", "-g", "8")
    assert out.returncode == 0, out.stderr
    rows, avg = parse_nccl_tests(out.stdout)
    assert [r["size"] for r in rows] == [8 * 2**k for k in range(25)]
    for r in rows:
        assert (r["count"], r["type"], r["redop"], r["root"], r["wrong"]) == (r["size"] // 4, "float", "sum", -1, "N/A")
        assert r["busbw"] == pytest.approx(r["algbw"] * 1.75, abs=0.02)
        assert (r["ip_time_us"], r["ip_busbw"]) == (r["time_us"], r["busbw"])
    assert avg == pytest.approx(sum(r["busbw"] for r in rows) / 25, abs=0.01)
    mib = next(r for r in rows if r["size"] == 2**20)
    model = simulator.simulate_collective({"node": "p4d.24xlarge", "nodes": 1}, "all_reduce", 2**20)
    assert mib["time_us"] == pytest.approx(model * 1e6, abs=0.006)
    assert "# Collective test starting: all_reduce_perf" in out.stdout
    header = [line for line in out.stdout.splitlines() if "algbw" in line]
    assert header[0].split() == ["#", "size", "count", "type", "redop", "root"] + \
        ["time", "algbw", "busbw", "#wrong"] * 2


@pytest.mark.parametrize(("name", "factor", "redop"), [
    ("all_gather_perf", 7 / 8, "none"), ("reduce_scatter", 7 / 8, "sum"),
    ("alltoall_perf", 7 / 8, "none"), ("broadcast_perf", 1.0, "none"),
])
def test_busbw_factor_per_collective_in_csv(inproc, name, factor, redop):
    """busbw / algbw on 8 ranks: (n-1)/n = 0.875 for all-gather, reduce-scatter, all-to-all;
    1 for broadcast (nccl-tests GetBw); algbw = size / time."""
    out = inproc(name, "--node", "dgx-a100", "-b", "1M", "-e", "4M", "-f", "2", "--format", "csv")
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [int(r["size_bytes"]) for r in rows] == [2**20, 2**21, 2**22]
    for r in rows:
        algbw = float(r["algbw_gb_per_s"])
        assert float(r["busbw_gb_per_s"]) == pytest.approx(algbw * factor, rel=1e-5)
        assert algbw == pytest.approx(int(r["size_bytes"]) / float(r["time_us"]) / 1e3, rel=1e-5)
        assert r["redop"] == redop and r["root"] == ("0" if name == "broadcast_perf" else "-1")


def test_json_carries_nccl_tests_records(inproc):
    """-J's keys: size, count, type, redop, root, out_of_place/in_place {time, alg_bw, bus_bw,
    nwrong}; bfloat16 1 KiB: 512 elements."""
    out = inproc("--node", "dgx-h100", "-b", "1K", "-e", "1K", "-d", "bfloat16", "--format", "json")
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    (rec,) = doc["results"]
    assert (rec["size"], rec["count"], rec["type"], rec["redop"]) == (1024, 512, "bfloat16", "sum")
    oop = rec["out_of_place"]
    assert oop["bus_bw"] == pytest.approx(oop["alg_bw"] * 1.75) and oop["nwrong"] is None
    assert doc["average_bus_bandwidth"]["bandwidth"] == pytest.approx(oop["bus_bw"])


def test_older_dtsim_options_still_work(inproc):
    out = inproc("--node", "p4d.24xlarge", "--op", "all_gather", "--sizes", "1MiB", "--format", "csv")
    assert out.exit_code == 0, out.output
    (row,) = csv.DictReader(io.StringIO(out.stdout))
    assert row["size_bytes"] == "1048576" and row["redop"] == "none"


# -- NCCL's knobs -----------------------------------------------------------------------


def test_nccl_algo_forces_the_algorithm_and_changes_the_time():
    """One dgx-h100, 1 GiB all-reduce: the tuner takes NVLS; NCCL_ALGO=Ring (environment or
    --env) gives ring, at the model's forced-ring time, slower than NVLS."""
    spec = {"node": "dgx-h100", "nodes": 1}
    args = ("--node", "dgx-h100", "-b", "1G", "-e", "1G", "--format", "csv")
    (free,) = csv.DictReader(io.StringIO(dtsim(*args).stdout))
    (ring,) = csv.DictReader(io.StringIO(dtsim(*args, env={"NCCL_ALGO": "Ring"}).stdout))
    (flag,) = csv.DictReader(io.StringIO(dtsim(*args, "--env", "NCCL_ALGO=ring").stdout))
    assert (free["algorithm"], ring["algorithm"], flag["algorithm"]) == ("nvls", "ring", "ring")
    assert float(ring["time_us"]) > float(free["time_us"])
    assert ring == flag
    forced = simulator.simulate_collective(spec, "all_reduce", GiB, "ring")
    assert float(ring["time_us"]) == pytest.approx(forced * 1e6, rel=1e-5)


def test_nccl_proto_forces_the_protocol(inproc):
    """8 B on a dgx-a100: the tuner takes LL; NCCL_PROTO=Simple gives Simple and a longer
    latency (NCCL's Simple base latency 8.4 us > LL's 6.6 us, topologies/nccl.yaml)."""
    args = ("--node", "dgx-a100", "-b", "8", "-e", "8", "--format", "csv")
    (free,) = csv.DictReader(io.StringIO(inproc(*args).stdout))
    (simple,) = csv.DictReader(io.StringIO(inproc(*args, env={"NCCL_PROTO": "Simple"}).stdout))
    assert (free["protocol"], simple["protocol"]) == ("LL", "Simple")
    assert float(simple["time_us"]) > float(free["time_us"])


@pytest.mark.parametrize("knob", [("--env", "NCCL_ALGO=NVLS"), ("--algorithm", "nvls")])
def test_nvls_without_nvswitch_sharp_is_an_error(knob):
    """p4d.24xlarge has NVSwitch but no NVLink SHARP (A100): NVLS cannot run -> exit 2, one line."""
    out = dtsim("--node", "p4d.24xlarge", "-b", "1M", "-e", "1M", *knob)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "NVLS needs NVLink SHARP" in out.stderr


@pytest.mark.parametrize(("args", "message"), [
    (("--env", "NCCL_ALGO=Bogus"), "unknown name 'Bogus'"),
    (("--env", "NCCL_PROTO=LL", "--nodes", "2", "-b", "1G", "-e", "1G"), "NCCL_PROTO=LL: no enabled protocol"),
    (("-d", "float32"), "-d/--datatype 'float32'"),
    (("-b", "8X"), "invalid size specified for 'minbytes'"),
])
def test_bad_knobs_and_flags_are_one_line_errors(inproc, args, message):
    out = inproc("--node", "dgx-a100", *args)
    assert out.exit_code == 2 and message in out.output.replace("\n", " ")


def test_unmodelled_knob_is_noted_not_silently_ignored(inproc):
    out = inproc("--node", "dgx-a100", "-b", "1M", "-e", "1M", "--format", "csv", env={"NCCL_MAX_NCHANNELS": "2"})
    assert out.exit_code == 0 and "NCCL_MAX_NCHANNELS=2 (environment) is not modelled" in out.stderr


def test_nccl_list_syntax():
    """NCCL's parseList: a first entry for every function, 'function:' entries after it, '^'
    excludes (src/graph/tuning.cc)."""
    t = NcclTuning("ring;allreduce:tree")
    assert t.algorithms("all_gather") == {"ring"} and t.algorithms("all_reduce") == {"tree"}
    assert t.algorithms("broadcast") == {"chain"} and t.algorithms("all_to_all") is None
    assert NcclTuning("^NVLS").algorithms("all_reduce") == {"ring", "tree", "nvls_tree"}  # NVLSTree is its own name
    assert NcclTuning("^NVLS,NVLSTree").algorithms("all_reduce") == {"ring", "tree"}
    assert NcclTuning(proto="^LL").protocols("all_reduce") == ("LL128", "Simple")
    with pytest.raises(ValueError, match="every entry but the first"):
        NcclTuning("Ring;Tree")
    tree = collective_choice({"node": "p4d.24xlarge", "nodes": 2}, "all_reduce", 2**20, tuning=NcclTuning("Tree"))
    assert tree.startswith("tree/")


def test_nvls_enable_zero_leaves_ring_and_protocol_flag_sets_nccl_proto(inproc):
    """NCCL_NVLS_ENABLE=0 on one dgx-h100: 1 GiB all-reduce by ring (NVLS otherwise, above);
    --protocol Simple and --protocol LL128 at 1 MiB on a dgx-a100 run those protocols."""
    args = ("--node", "dgx-h100", "-b", "1G", "-e", "1G", "--format", "csv")
    (row,) = csv.DictReader(io.StringIO(inproc(*args, env={"NCCL_NVLS_ENABLE": "0"}).stdout))
    assert row["algorithm"] == "ring"
    small = ("--node", "dgx-a100", "-b", "1M", "-e", "1M", "--format", "csv")
    (simple,) = csv.DictReader(io.StringIO(inproc(*small, "--protocol", "Simple").stdout))
    (ll128,) = csv.DictReader(io.StringIO(inproc(*small, "--protocol", "LL128").stdout))
    assert (simple["protocol"], ll128["protocol"]) == ("Simple", "LL128")
