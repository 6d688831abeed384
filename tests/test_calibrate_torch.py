"""dtsim calibrate on this machine's CPU with PyTorch (skipped without torch).

The quick CPU calibration runs once per module (about ten seconds); the tests check the file
it writes, that simulated compute with it is slower than with the built-in A100 tables (the
expected direction, on the simulator's own numbers), the closed loop, --comm 2 over gloo, and
the refusals. ``--threads 1`` keeps the timings steady on a shared CI machine; ``--force``
writes the profile however noisy a loaded machine makes it (what is asserted does not depend
on the load; the refusal itself is tested on injected timings in test_calibrate_noise.py).
"""

from __future__ import annotations

import importlib.util
import math
import statistics
from pathlib import Path

import pytest
from typer.testing import CliRunner

import simulator
from simulator.catalog import default_catalog
from simulator.cli import app
from simulator.scenario.calibration import load_profile_spec
from simulator.scenario.spec import ModelSpec
from simulator.workload.model import Shard, backward_of, block_forward, kernels_time_s
from simulator.workload.profile import compute_profile

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                       reason="needs torch: pip install torch==2.13.0 && pip install 'dtsim[calibrate]'"),
]

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.yaml"


def _calibrate(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["calibrate", *args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("calibrate") / "tmp.yaml"
    code, output = _calibrate("--device", "cpu", "--quick", "--dtype", "fp32", "--threads", "1", "--force",
                              "--out", str(out))
    assert code == 0, output
    assert "closed loop" in output and "error" in output
    return out


def test_quick_cpu_calibration_writes_a_valid_profile(cpu_profile: Path) -> None:
    spec = load_profile_spec(str(cpu_profile))
    assert spec.calibrated and spec.gpu is None and spec.device and spec.device.startswith("cpu")
    assert set(spec.peak_flops) == {"fp32"} and spec.peak_flops["fp32"] > 1e8
    assert spec.memory_bandwidth_bytes_per_s and spec.memory_bandwidth_bytes_per_s > 1e8
    # an empty op's launch cannot outlast the largest measured GEMM, which includes one (a bound that
    # holds however busy the machine is, both being measured under the same load)
    slowest_gemm = max(m["median_s"] for m in spec.metadata["measurements"]["gemm"])
    assert 0 < spec.launch_overhead_s < slowest_gemm
    for table in (spec.gemm, spec.attention_fwd, spec.attention_bwd):
        curve = table["fp32"]
        assert len(curve.log10_flops) >= 2 and all(0 < e <= 1 for e in curve.efficiency)
    meta = spec.metadata
    # the peak is the best GEMM rate measured: that GEMM has efficiency 1
    assert max(m["efficiency"] for m in meta["measurements"]["gemm"]) == pytest.approx(1.0, abs=1e-3)
    for key in ("device_name", "torch_version", "dtype", "threads", "date", "host"):
        assert meta[key] not in (None, ""), key
    assert meta["dtype"] == "fp32" and meta["threads"] == 1
    assert len(meta["measurements"]["gemm"]) >= 10
    assert all(m["median_s"] > 0 and m["p75_s"] >= m["p25_s"] for m in meta["measurements"]["gemm"])


def test_noise_verdict_follows_from_the_recorded_timings(cpu_profile: Path) -> None:
    """Whatever the load, the profile's noise verdict is the criterion applied to the timings it
    records: the median spread over the GEMM and attention timings, the block's spread."""
    from simulator.calibrate.timing import Timing, noise_problem

    meta = load_profile_spec(str(cpu_profile)).metadata
    measured = meta["measurements"]
    kernels = [Timing(**g) for g in ({k: m[k] for k in ("median_s", "p25_s", "p75_s", "samples")}
                                     for m in measured["gemm"])]
    kernels += [Timing(**a[part]) for a in measured["attention"] for part in ("forward", "forward_backward")]
    loop = load_profile_spec(str(cpu_profile)).closed_loop
    noise = meta["noise"]
    assert noise["kernel_spread_median"] == statistics.median(t.spread for t in kernels)
    assert noise["block_spread"] == pytest.approx(loop["measured_spread"], abs=1e-4)  # the loop's is rounded
    block = Timing(1.0, 0.0, noise["block_spread"], 1)  # (p75 - p25) / median = the block's spread
    assert noise["too_noisy"] == (noise_problem(kernels, block) is not None)
    assert noise.get("forced", False) == noise["too_noisy"]


def test_closed_loop_compares_a_real_block_with_the_simulator(cpu_profile: Path) -> None:
    loop = load_profile_spec(str(cpu_profile)).closed_loop
    assert loop["measured_s"] > 0 and loop["predicted_s"] > 0
    error = 100 * (loop["predicted_s"] - loop["measured_s"]) / loop["measured_s"]
    assert loop["error_pct"] == pytest.approx(error, abs=0.01)
    # its size depends on machine load (the block and the profile are measured at different
    # moments): only that it is the finite relative error above is asserted
    assert math.isfinite(loop["error_pct"])
    assert set(loop["predicted_by_kind_s"]) == {"gemm", "attention", "memory"}


def test_cpu_profile_makes_simulated_compute_slower_than_builtin_a100(cpu_profile: Path) -> None:
    a100 = default_catalog().gpus["a100-80gb"]
    builtin = compute_profile(a100, None)
    measured = compute_profile(a100, str(cpu_profile))
    model = ModelSpec.model_validate("gpt3-1.3b")
    for precision in ("fp32", "bf16"):
        forward = block_forward(model, Shard(batch=1, seq=2048, precision=precision))
        kernels = forward + backward_of(forward)
        gpu_s = kernels_time_s(builtin, kernels, precision)
        cpu_s = kernels_time_s(measured, kernels, precision)
        # this block runs 3 x 24 b s h^2 GEMM FLOPs and 3.5 x 4 b s^2 h / 2 attention FLOPs
        # (causal; FlashAttention's backward is 2.5x its forward) = 6.8e11 FLOPs: an A100 needs a
        # bit more than FLOPs / peak (312 TFLOP/s bf16, 19.5 fp32), a CPU at ~1e11 FLOP/s seconds
        flops = sum(k.flops for k in kernels)
        assert flops == pytest.approx(3 * 24 * 2048 * 2048**2 + 3.5 * 4 * 2048**2 * 2048 / 2, rel=1e-9)
        peak = a100.peak_flops_per_s(precision)  # type: ignore[arg-type]
        assert peak and flops / peak < gpu_s < 3 * flops / peak, (precision, gpu_s)
        assert cpu_s > 100 * gpu_s, (precision, cpu_s, gpu_s)
    plain = simulator.simulate(simulator.load_scenario(QUICKSTART))
    calibrated = simulator.simulate(simulator.load_scenario(QUICKSTART, overrides=[
        f"cluster.calibration={cpu_profile}", "cluster.calibration_other_device=true"]))
    assert calibrated.step_time_s > 100 * plain.step_time_s
    assert calibrated.calibration == str(cpu_profile) and plain.calibration.startswith("uncalibrated")


def test_run_uses_the_profile_from_the_cli(cpu_profile: Path) -> None:
    """A CPU profile on the quickstart's A100 cluster is refused (exit 2, naming the device and
    the override) until the user asks for it; then the summary names the device it was measured on."""
    refused = CliRunner().invoke(app, ["run", str(QUICKSTART), "--set", f"cluster.calibration={cpu_profile}"])
    assert refused.exit_code == 2 and "calibration_other_device" in refused.output, refused.output
    result = CliRunner().invoke(app, ["run", str(QUICKSTART), "--set", f"cluster.calibration={cpu_profile}",
                                      "--set", "cluster.calibration_other_device=true"])
    assert result.exit_code == 0, result.output
    assert "measured on cpu:" in " ".join(result.output.split())


def test_comm_2_with_gloo_fits_and_overrides_links(tmp_path: Path) -> None:
    """Two gloo processes measure the three collectives and the profile carries a fit of each.
    What the fit must satisfy whatever the machine's load: non-negative alpha and beta (the fit
    is constrained so), positive measured medians, and a profile that loads and replays. The
    replay arithmetic itself is pinned on fixed fits in tests/test_calibrate_comm_override.py;
    measured magnitudes (bandwidths, gloo against NVLink) are not asserted here, since they
    depend on how busy the machine is."""
    out = tmp_path / "comm.yaml"
    code, output = _calibrate("--device", "cpu", "--quick", "--threads", "1", "--comm", "2", "--force",
                              "--out", str(out))
    assert code == 0, output
    spec = load_profile_spec(str(out))
    assert set(spec.comm) == {"all_reduce", "all_gather", "reduce_scatter"}
    for fit in spec.comm.values():
        assert fit.ranks == 2 and fit.backend == "gloo"
        assert fit.alpha_s >= 0 and fit.beta_s_per_byte >= 0
    points = spec.metadata["measurements"]["comm"]
    assert {p["op"] for p in points} == set(spec.comm) and all(p["median_s"] > 0 for p in points)
    cluster = {"node": "dgx-a100", "nodes": 1, "gpus_per_node": 2, "calibration": str(out),
               "calibration_other_device": True}  # a CPU (gloo) profile replayed on A100s, on purpose
    seconds = simulator.simulate_collective(cluster, "all_reduce", 2**28, "ring")
    assert seconds > 0 and math.isfinite(seconds)


def test_low_precision_is_refused_on_a_cpu_without_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import simulator.calibrate.device as device

    monkeypatch.setattr(device, "cpu_flags", lambda: ("x86_64", {"avx2", "avx512f", "avx512bw"}))
    for dtype in ("bf16", "fp16"):
        code, output = _calibrate("--device", "cpu", "--dtype", dtype, "--quick", "--out", str(tmp_path / "x.yaml"))
        assert code == 2
        assert f"no native {dtype}" in output and "emulat" in output
    assert not (tmp_path / "x.yaml").exists()


def test_bad_requests_exit_2() -> None:
    import torch

    assert _calibrate("--device", "tpu")[0] == 2
    assert _calibrate("--device", "cpu", "--dtype", "fp64")[0] == 2
    assert _calibrate("--device", "cpu", "--scenario", "no/such/file.yaml")[0] == 2
    if not torch.cuda.is_available():
        code, output = _calibrate("--device", "cuda")
        assert code == 2 and "no CUDA device" in output
