"""dtsim calibrate without PyTorch: fits, shapes, device parsing, profiles of non-catalog
devices, the no-torch path of the CLI, and the import rule (torch only in calibrate/)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator.calibrate.device import (
    INSTALL_HINT,
    CalibrationError,
    catalog_gpu_for,
    cpu_native_support,
    parse_device,
)
from simulator.calibrate.fit import compute_seconds, efficiency_curve, fit_alpha_beta
from simulator.calibrate.shapes import BlockShape, GemmShape, block_shape, gemm_shapes, scaled_down
from simulator.cli import app
from simulator.costs.compute import ComputeProfile
from simulator.scenario.calibration import ProfileSpec
from simulator.scenario.spec import ModelSpec
from simulator.workload.model import Shard, backward_of, block_forward
from simulator.workload.profile import profile_from_spec

ROOT = Path(__file__).resolve().parents[1]


# -- fits -------------------------------------------------------------------------------


def test_efficiency_curve_bins_by_quarter_decade_and_takes_the_median() -> None:
    # 1e6 and 1.5e6 FLOPs share the first bin (log10 6.0 and 6.176 < 6.25): mean x, median y
    points = [(1e6, 0.2), (1.5e6, 0.4), (1e8, 0.7), (1e8, 0.9), (1e8, 0.8)]
    curve = efficiency_curve(points)
    assert curve["log10_flops"] == [round((6.0 + math.log10(1.5e6)) / 2, 3), 8.0]
    assert curve["efficiency"] == [0.3, 0.8]


def test_efficiency_curve_clamps_to_the_unit_interval() -> None:
    curve = efficiency_curve([(1e5, 1e-7), (1e9, 1.3)])
    assert curve["efficiency"] == [1e-4, 1.0]
    with pytest.raises(ValueError):
        efficiency_curve([(0.0, 0.5)])


def test_compute_seconds_subtracts_the_launch_but_keeps_half() -> None:
    assert compute_seconds(10e-6, 4e-6) == pytest.approx(6e-6)
    assert compute_seconds(5e-6, 4e-6) == pytest.approx(2.5e-6)  # t - launch = 1 us < t/2


def test_alpha_beta_fit_recovers_an_exact_line() -> None:
    alpha, beta = 25e-6, 1 / 40e9  # 25 us, 40 GB/s
    sizes = [2.0**e for e in range(10, 28, 2)]
    fit = fit_alpha_beta(sizes, [alpha + n * beta for n in sizes])
    assert fit == pytest.approx((alpha, beta), rel=1e-9)


def test_alpha_beta_fit_never_returns_a_negative_latency() -> None:
    sizes = [1e3, 1e6, 1e9]
    times = [n * 1e-9 - 1e-6 if n > 1e3 else 1e-7 for n in sizes]  # a line with a negative intercept
    alpha, beta = fit_alpha_beta(sizes, times)
    assert alpha == 0.0 and beta > 0


# -- device -----------------------------------------------------------------------------


def test_parse_device() -> None:
    assert parse_device("auto") == ("auto", None)
    assert parse_device("cpu") == ("cpu", None)
    assert parse_device("cuda:3") == ("cuda", 3)
    for bad in ("gpu", "cpu:0", "cuda:x", ""):
        with pytest.raises(CalibrationError):
            parse_device(bad)


def test_cpu_native_low_precision_from_flags() -> None:
    assert cpu_native_support("fp32", "x86_64", set())
    assert cpu_native_support("bf16", "x86_64", {"avx2", "avx512f", "avx512_bf16"})
    assert not cpu_native_support("bf16", "x86_64", {"avx2", "avx512f", "avx512bw"})  # oneDNN would emulate
    assert cpu_native_support("bf16", "x86_64", {"amx_bf16"})
    assert not cpu_native_support("fp16", "x86_64", {"avx512_bf16"})
    assert cpu_native_support("fp16", "x86_64", {"avx512_fp16"})
    assert cpu_native_support("bf16", "aarch64", {"asimd", "bf16"})
    assert cpu_native_support("fp16", "aarch64", {"asimdhp"})
    assert not cpu_native_support("bf16", "arm64", {"feat_fp16"})


def test_cuda_names_map_to_the_catalog() -> None:
    gib = 2**30
    assert catalog_gpu_for("NVIDIA H200", 141 * gib) == "h200"
    assert catalog_gpu_for("NVIDIA H100 80GB HBM3", 80 * gib) == "h100-sxm"
    assert catalog_gpu_for("NVIDIA H100 PCIe", 80 * gib) is None  # not in the catalog: peak measured
    assert catalog_gpu_for("NVIDIA A100-SXM4-80GB", 80 * gib) == "a100-80gb"
    assert catalog_gpu_for("NVIDIA A100-SXM4-40GB", 40 * gib) == "a100-40gb"
    assert catalog_gpu_for("Tesla V100-SXM2-32GB", 32 * gib) == "v100-32gb"
    assert catalog_gpu_for("NVIDIA A10G", 23 * gib) == "a10g"


# -- shapes -----------------------------------------------------------------------------


def test_scaled_down_keeps_head_dim_gqa_ratio_and_ffn_ratio() -> None:
    model = ModelSpec.model_validate("llama3-8b")  # h 4096, 32 heads of 128, 8 kv heads, ffn 14336
    small = scaled_down(BlockShape(model, 2, model.seq_len, "test"), 1024, 512, 1024)
    m = small.model
    assert (m.hidden, m.head_dim, m.heads, m.n_kv_heads) == (1024, 128, 8, 2)
    assert m.ffn == round(14336 / 4 / 64) * 64 == 3584
    assert (small.seq, small.batch) == (512, 2)
    assert m.mlp == "swiglu"


def test_scenario_gemm_shapes_are_the_simulators_own() -> None:
    shape = block_shape(ROOT / "scenarios" / "quickstart.yaml", quick=True, device="cpu")
    assert shape.batch * shape.seq <= 512 and shape.model.hidden <= 256
    shapes = gemm_shapes(shape, scenario_given=True, quick=True, device="cpu")
    forward = block_forward(shape.model, Shard(batch=shape.batch, seq=shape.seq))
    for kernel in forward + backward_of(forward):
        if kernel.kind == "gemm" and kernel.mnk is not None:
            assert GemmShape(*(round(v) for v in kernel.mnk)) in shapes
    assert shapes == sorted(shapes, key=lambda g: (g.flops, g))


# -- profiles of devices outside the catalog -------------------------------------------


def _cpu_profile(**extra: object) -> ProfileSpec:
    curve = {"log10_flops": [6, 9], "efficiency": [0.5, 1.0]}
    data = {"gpu": None, "device": "cpu: test", "calibrated": True, "memory_bandwidth": "20GB/s",
            "memory_efficiency": 0.5, "launch_overhead": "2us", "peak_flops": {"fp32": "100GFLOPS"},
            "gemm": {"fp32": curve}, "attention_fwd": {"fp32": curve}, "attention_bwd": {"fp32": curve}, **extra}
    return ProfileSpec.model_validate(data)


def test_a_cpu_profile_uses_its_own_peak_for_every_precision() -> None:
    profile = profile_from_spec(_cpu_profile(), None, "cpu.yaml")
    assert isinstance(profile, ComputeProfile)
    for precision in ("fp32", "tf32", "bf16", "fp16", "fp8"):
        assert profile.peak(precision) == 100e9
    assert profile.memory_bytes_per_s == 10e9
    # a 1e9-FLOP GEMM at efficiency 1: 10 ms + 2 us launch (operands far below the memory time)
    assert profile.gemm_efficiency(1e9, "bf16") == 1.0


def test_a_profile_without_gpu_or_peaks_is_rejected() -> None:
    from simulator.errors import ScenarioError

    with pytest.raises(ScenarioError, match="peak_flops"):
        profile_from_spec(_cpu_profile(peak_flops={}), None, "cpu.yaml")


# -- without torch ----------------------------------------------------------------------


def test_without_torch_calibrate_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ModuleNotFoundError
    result = CliRunner().invoke(app, ["calibrate", "--device", "cpu", "--quick"])
    assert result.exit_code == 2
    assert INSTALL_HINT in " ".join(result.stderr.split())
    assert "not installed" in result.stderr
    # ... and everything else still works
    run = CliRunner().invoke(app, ["run", str(ROOT / "scenarios" / "quickstart.yaml"), "--quiet"])
    assert run.exit_code == 0, run.output


def test_import_simulator_and_calibrate_do_not_import_torch() -> None:
    code = "import sys, simulator, simulator.calibrate, simulator.cli; sys.exit(int('torch' in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr


def test_torch_is_imported_only_in_calibrate() -> None:
    for path in (ROOT / "simulator").rglob("*.py"):
        if "calibrate" in path.relative_to(ROOT / "simulator").parts:
            continue
        text = path.read_text()
        assert "import torch" not in text and "from torch" not in text, path


# -- CUDA device logic, with a stand-in for torch.cuda (no GPU in CI) -------------------


class _FakeCuda:
    def __init__(self, names: list[str], capability: tuple[int, int]) -> None:
        self.names, self.capability = names, capability

    def is_available(self) -> bool:
        return bool(self.names)

    def device_count(self) -> int:
        return len(self.names)

    def get_device_properties(self, index: int) -> object:
        from types import SimpleNamespace

        return SimpleNamespace(name=self.names[index], total_memory=141 * 2**30, major=self.capability[0],
                               minor=self.capability[1])

    def get_device_capability(self, index: int) -> tuple[int, int]:
        return self.capability


def _fake_torch(names: list[str], capability: tuple[int, int] = (9, 0)) -> object:
    from types import SimpleNamespace

    return SimpleNamespace(cuda=_FakeCuda(names, capability), __version__="fake", get_num_threads=lambda: 4)


def test_cuda_devices_resolve_to_catalog_gpus_and_default_to_bf16() -> None:
    from simulator.calibrate.device import check_dtype, resolve_device
    from simulator.calibrate.runner import default_dtype, default_out

    torch = _fake_torch(["NVIDIA H200", "NVIDIA H200"])
    device = resolve_device("auto", torch)
    assert (device.kind, device.index, device.catalog_gpu, device.torch_device) == ("cuda", 0, "h200", "cuda:0")
    assert resolve_device("cuda:1", torch).torch_device == "cuda:1"
    assert default_dtype(device, torch) == "bf16"
    assert str(default_out(device, "bf16")) == "h200-bf16.yaml"
    check_dtype(device, "bf16", torch)
    with pytest.raises(CalibrationError, match="2 CUDA device"):
        resolve_device("cuda:2", torch)
    volta = _fake_torch(["Tesla V100-SXM2-32GB"], (7, 0))
    v100 = resolve_device("cuda", volta)
    assert v100.catalog_gpu == "v100-32gb" and default_dtype(v100, volta) == "fp32"
    with pytest.raises(CalibrationError, match="no native bf16"):
        check_dtype(v100, "bf16", volta)
    check_dtype(v100, "fp16", volta)
    none = _fake_torch([])
    assert resolve_device("auto", none).kind == "cpu"
    with pytest.raises(CalibrationError, match="no CUDA device"):
        resolve_device("cuda", none)


def test_comm_ranks_are_checked_before_any_timing() -> None:
    from simulator.calibrate.comm import check_ranks
    from simulator.calibrate.device import resolve_device

    torch = _fake_torch(["NVIDIA H200"])
    gpu = resolve_device("cuda", torch)
    with pytest.raises(CalibrationError, match="needs 2 GPUs"):
        check_ranks(2, gpu, torch)
    assert check_ranks(2, resolve_device("auto", _fake_torch([])), torch) == "gloo"
    assert check_ranks(2, resolve_device("cuda", _fake_torch(["NVIDIA H200"] * 8)), _fake_torch(["x"] * 8)) == "nccl"
    with pytest.raises(CalibrationError, match="at least 2"):
        check_ranks(1, gpu, torch)


def test_set_paths_are_relative_to_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import simulator

    profile = tmp_path / "cpu.yaml"
    profile.write_text((ROOT / "topologies" / "calibration" / "builtin" / "a100-40gb.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    sc = simulator.load_scenario(ROOT / "scenarios" / "quickstart.yaml", overrides=["cluster.calibration=cpu.yaml"])
    assert sc.cluster.calibration == str(profile)
    # a path that does not exist from here keeps the scenario-relative meaning (and its error)
    from simulator.errors import ScenarioError

    with pytest.raises(ScenarioError, match=r"scenarios/nope\.yaml"):
        simulator.load_scenario(ROOT / "scenarios" / "quickstart.yaml", overrides=["cluster.calibration=nope.yaml"])
