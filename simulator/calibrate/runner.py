"""One calibration from start to end: what ``dtsim calibrate`` runs.

    device + dtype check -> launch overhead -> GEMM sweep -> attention sweep
    -> the block's memory-bound ops, stream copy/add, optimizer step -> fit -> profile
    -> closed loop (real block vs the simulator with the new profile)
    -> [--comm N: collectives over N processes -> alpha-beta fits]

The caller gets a :class:`Calibration` (the profile mapping and the closed-loop result) and
writes it with :func:`simulator.calibrate.profile_file.write_profile`. Progress is reported
through an optional :class:`Progress` (the CLI draws a rich progress bar); nothing here
prints.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from simulator import __version__
from simulator.calibrate import comm as comm_mod
from simulator.calibrate.block import ClosedLoop, closed_loop
from simulator.calibrate.device import (
    DeviceInfo,
    check_dtype,
    cuda_native_bf16,
    import_torch,
    resolve_device,
)
from simulator.calibrate.kernels import (
    AttentionPoint,
    GemmPoint,
    MemoryPoint,
    stream_kernels,
    time_attention,
    time_block_ops,
    time_gemm,
    time_launch,
    time_memory_kernel,
)
from simulator.calibrate.profile_file import build_profile, validate_profile
from simulator.calibrate.shapes import attention_shapes, block_shape, gemm_shapes
from simulator.calibrate.timing import NOISY_BLOCK_SPREAD, NOISY_SPREAD, KernelTimer, Timing, noise_problem
from simulator.catalog import default_catalog
from simulator.workload.profile import profile_from_spec

__all__ = ["CalibrationOptions", "Calibration", "Progress", "run_calibration", "default_dtype", "default_out"]


class Progress(Protocol):
    """Receives the number of steps once, then one call per finished step."""

    def start(self, total: int) -> None: ...

    def step(self, label: str) -> None: ...


class _Silent:
    """The progress sink when the caller wants none: it ignores every report."""

    def start(self, total: int) -> None:
        """Ignore the step count."""

    def step(self, label: str) -> None:
        """Ignore the finished step."""


@dataclass(frozen=True)
class CalibrationOptions:
    """What ``dtsim calibrate`` was asked for (``dtype`` None: bf16 on a GPU that has it, else fp32)."""

    device: str = "auto"
    dtype: str | None = None
    scenario: Path | None = None
    quick: bool = False
    comm_ranks: int | None = None
    threads: int | None = None


@dataclass(frozen=True)
class Calibration:
    """A finished calibration: ``profile`` (a mapping in the profile file format),
    ``warnings`` about its quality (also in the profile's metadata) and ``noise``: why its
    timings are too noisy to keep (:func:`~simulator.calibrate.timing.noise_problem`), or
    None. ``dtsim calibrate`` writes a noisy profile only with ``--force``."""

    device: DeviceInfo
    dtype: str
    profile: dict[str, Any]
    closed_loop: ClosedLoop
    comm: comm_mod.CommMeasurement | None
    warnings: tuple[str, ...] = ()
    noise: str | None = None


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _quality_warnings(device: DeviceInfo, load_before: float | None, noise: str | None) -> list[str]:
    """Signs that the timings are not those of an idle device: a busy machine before the start
    (1-minute load average at least half the CPUs, CPU calibrations), or too noisy repeated
    runs (``noise``)."""
    out = []
    cpus = os.cpu_count() or 1
    if device.kind == "cpu" and load_before is not None and load_before >= 0.5 * cpus:
        out.append(f"the machine was busy when the calibration started (1-minute load {load_before:.1f} on {cpus} "
                   "CPUs): other processes share the cores, so timings are slow and noisy; calibrate on an idle "
                   "machine, or with fewer --threads")
    if noise is not None:
        out.append(f"timings were noisy: {noise}; the tables and the closed-loop error are uncertain")
    return out


def _noise_record(kernels: list[Timing], block: Timing) -> dict[str, Any]:
    """The figures the noise verdict rests on, for the profile's metadata."""
    return {"kernel_spread_median": statistics.median(t.spread for t in kernels) if kernels else None,
            "block_spread": block.spread, "kernel_threshold": NOISY_SPREAD,
            "block_threshold": NOISY_BLOCK_SPREAD}


def default_dtype(device: DeviceInfo, torch: Any) -> str:
    """bf16 on a GPU with bf16 tensor cores, else fp32."""
    if device.kind == "cuda" and cuda_native_bf16(torch, device):
        return "bf16"
    return "fp32"


def default_out(device: DeviceInfo, dtype: str) -> Path:
    """``<gpu>-<dtype>.yaml`` (``cpu-fp32.yaml`` on a CPU), the issue's naming of profiles."""
    name = device.catalog_gpu or ("cpu" if device.kind == "cpu" else "gpu")
    return Path(f"{name}-{dtype}.yaml")


def _metadata(torch: Any, device: DeviceInfo, dtype: str, options: CalibrationOptions) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "device_kind": device.kind,
        "device_name": device.name,
        "dtype": dtype,
        "torch_version": str(torch.__version__),
        "threads": device.threads,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "python": platform.python_version(),
        "dtsim_version": __version__,
        "quick": options.quick,
        "scenario": str(options.scenario) if options.scenario else None,
        "timing": ("torch.utils.benchmark.Timer.blocked_autorange, explicit num_threads" if device.kind == "cpu"
                   else "CUDA events around back-to-back calls after warm-up, torch.cuda.synchronize"),
    }
    if device.kind == "cuda":
        props = torch.cuda.get_device_properties(device.index or 0)
        meta.update(cuda_version=str(torch.version.cuda), compute_capability=f"{props.major}.{props.minor}",
                    catalog_gpu=device.catalog_gpu, memory_bytes=device.memory_bytes)
    if dtype == "fp32" and device.kind == "cuda":
        meta["tf32_matmul"] = bool(torch.backends.cuda.matmul.allow_tf32)
    return meta


def _stream_sizes(device: DeviceInfo, quick: bool) -> tuple[int, int]:
    """Elements of the reference stream (2^24 on a CPU, 64 MiB in fp32, past its caches; 2^28
    on a GPU, 1 GiB in fp32) and parameters of the optimizer step."""
    if device.kind == "cuda":
        return 2**28, 2**24 if quick else 2**26
    return 2**24, 2**22 if quick else 2**23


def run_calibration(options: CalibrationOptions, progress: Progress | None = None) -> Calibration:
    """Measure the device, fit the profile, run the closed loop (and --comm); see the module docstring.

    Raises :class:`~simulator.calibrate.device.CalibrationError` for a request that cannot run
    here (no torch, no such device, a dtype the device would emulate, too few GPUs for --comm),
    :class:`~simulator.errors.ScenarioError` for a bad ``--scenario`` file.
    """
    progress = progress or _Silent()
    load_before = _load_average()
    torch = import_torch()
    device = resolve_device(options.device, torch, options.threads)
    dtype = options.dtype or default_dtype(device, torch)
    check_dtype(device, dtype, torch)
    if options.comm_ranks is not None:
        comm_mod.check_ranks(options.comm_ranks, device, torch)  # before minutes of kernel timing
    if device.kind == "cpu" and device.threads:
        torch.set_num_threads(device.threads)
    if device.kind == "cuda":
        torch.cuda.set_device(device.index or 0)  # synchronize() and new tensors default to it
    if device.kind == "cuda" and dtype == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = False  # measure true fp32 (tf32 is its own precision)
    gpu = default_catalog().gpus.get(device.catalog_gpu) if device.catalog_gpu else None

    shape = block_shape(options.scenario, quick=options.quick, device=device.kind)
    given = options.scenario is not None
    gemm_list = gemm_shapes(shape, scenario_given=given, quick=options.quick, device=device.kind)
    attn_list = attention_shapes(shape, scenario_given=given, quick=options.quick, device=device.kind)
    stream, params = _stream_sizes(device, options.quick)
    mem_list = stream_kernels(torch, device, dtype, stream, params)
    comm_steps = 1 if options.comm_ranks else 0
    progress.start(1 + len(gemm_list) + len(attn_list) + 1 + len(mem_list) + 1 + comm_steps)

    timer = KernelTimer(torch, device, min_run_time_s=0.1 if options.quick else 0.5)
    launch = time_launch(torch, device, timer)
    progress.step("launch overhead")
    gemms: list[GemmPoint] = []
    for g in gemm_list:
        gemms.append(time_gemm(torch, device, dtype, timer, g))
        progress.step(f"GEMM {g.m}x{g.n}x{g.k}")
    attention: list[AttentionPoint] = []
    for a in attn_list:
        attention.append(time_attention(torch, device, dtype, timer, a))
        progress.step(f"attention b{a.batch} h{a.heads} s{a.seq} d{a.head_dim}")
    block_ops = time_block_ops(torch, device, dtype, timer, shape)
    progress.step("norm, dropout + residual, activation of the block")
    memory: list[MemoryPoint] = []
    for name, nbytes, fn in mem_list:
        memory.append(time_memory_kernel(timer, name, nbytes, fn))
        progress.step(name)
    del mem_list

    metadata = _metadata(torch, device, dtype, options)
    profile = build_profile(device=device, gpu=gpu, dtype=dtype, launch=launch, gemms=gemms, attention=attention,
                            block_ops=block_ops, memory=memory, metadata=metadata)
    compute = profile_from_spec(validate_profile(profile), gpu, "calibration")
    loop = closed_loop(torch, shape, dtype, device, timer, compute)
    profile["closed_loop"] = loop.as_dict()
    progress.step("closed loop: transformer block forward + backward")

    measurement = None
    if options.comm_ranks:
        measurement = comm_mod.measure_collectives(options.comm_ranks, device, quick=options.quick)
        profile["comm"] = comm_mod.fit_comm(measurement)
        profile["metadata"]["measurements"]["comm"] = [
            {"op": p.op, "nbytes": p.nbytes, **p.timing.as_dict()} for p in measurement.points]
        progress.step(f"collectives over {options.comm_ranks} processes ({measurement.backend})")
    kernels = [g.timing for g in gemms] + [t for a in attention for t in (a.forward, a.forward_backward)]
    noise = noise_problem(kernels, loop.measured)
    warnings = _quality_warnings(device, load_before, noise)
    profile["metadata"]["warnings"] = warnings
    profile["metadata"]["noise"] = {**_noise_record(kernels, loop.measured), "too_noisy": noise is not None}
    profile["metadata"]["load_average_at_start"] = load_before
    validate_profile(profile)
    return Calibration(device, dtype, profile, loop, measurement, tuple(warnings), noise)
