"""Which device to calibrate, what it is, and what it can run natively.

PyTorch is imported only through :func:`import_torch`, so ``import simulator.calibrate``
works without it. CPU capabilities come from the operating system (``/proc/cpuinfo`` on
Linux, ``sysctl`` on macOS), not from PyTorch: oneDNN reports bf16 "support" on every
AVX-512 CPU because it can emulate it, and calibrating emulation would measure the wrong
thing.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "INSTALL_HINT",
    "CalibrationError",
    "TorchMissingError",
    "DeviceInfo",
    "DTYPES",
    "import_torch",
    "parse_device",
    "resolve_device",
    "cpu_flags",
    "cpu_native_support",
    "check_dtype",
    "catalog_gpu_for",
    "torch_dtype",
    "cuda_native_bf16",
]

INSTALL_HINT = "pip install torch==2.13.0 && pip install 'dtsim[calibrate]'"
DTYPES = ("fp32", "bf16", "fp16")

DeviceKind = Literal["cpu", "cuda"]


class CalibrationError(Exception):
    """A calibration that cannot run as asked (one line for the user; the CLI exits 2)."""


class TorchMissingError(CalibrationError):
    """PyTorch is not installed (or does not import)."""


def import_torch() -> Any:
    """``import torch``, or :class:`TorchMissingError` saying how to install it."""
    try:
        import torch
    except ModuleNotFoundError:
        raise TorchMissingError(f"dtsim calibrate needs PyTorch, which is not installed; install it with: "
                                f"{INSTALL_HINT}") from None
    except ImportError as exc:
        raise TorchMissingError(f"PyTorch is installed but does not import ({exc}); reinstall it with: "
                                f"{INSTALL_HINT}") from None
    return torch


def torch_dtype(torch: Any, dtype: str) -> Any:
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]


@dataclass(frozen=True)
class DeviceInfo:
    """The device a calibration runs on.

    ``torch_device``: ``"cpu"`` or ``"cuda:N"``; ``name``: the CPU model or CUDA device name;
    ``threads``: intra-op threads on a CPU (None on a GPU); ``catalog_gpu``: the name of the
    matching GPU in ``topologies/gpus.yaml`` (None for a CPU or an unknown GPU);
    ``memory_bytes``: device memory (host RAM for a CPU, 0 when unknown).
    """

    kind: DeviceKind
    index: int | None
    name: str
    threads: int | None
    catalog_gpu: str | None
    memory_bytes: float = 0.0

    @property
    def torch_device(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index or 0}"


def parse_device(text: str) -> tuple[Literal["auto", "cpu", "cuda"], int | None]:
    """``auto`` | ``cpu`` | ``cuda`` | ``cuda:N`` -> (kind, index); :class:`CalibrationError` otherwise."""
    match = re.fullmatch(r"(auto|cpu|cuda)(?::(\d+))?", text.strip())
    if match is None or (match.group(2) is not None and match.group(1) != "cuda"):
        raise CalibrationError(f"--device {text!r}: expected auto, cpu, cuda or cuda:N")
    kind = match.group(1)
    index = int(match.group(2)) if match.group(2) is not None else None
    return kind, index  # type: ignore[return-value]


def resolve_device(text: str, torch: Any, threads: int | None = None) -> DeviceInfo:
    """The device ``text`` names, checked against what this machine has.

    ``auto`` is the first CUDA device when there is one, else the CPU. On a CPU the
    calibration uses ``threads`` intra-op threads (default: what PyTorch uses now).
    """
    kind, index = parse_device(text)
    if kind == "auto":
        kind, index = ("cuda", 0) if torch.cuda.is_available() else ("cpu", None)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise CalibrationError(f"--device {text}: no CUDA device is available (torch {torch.__version__}); "
                                   "use --device cpu")
        index = index or 0
        count = torch.cuda.device_count()
        if index >= count:
            raise CalibrationError(f"--device cuda:{index}: this machine has {count} CUDA device(s)")
        props = torch.cuda.get_device_properties(index)
        name = str(props.name)
        memory = float(props.total_memory)
        return DeviceInfo("cuda", index, name, None, catalog_gpu_for(name, memory), memory)
    if threads is not None and threads < 1:
        raise CalibrationError("--threads must be at least 1")
    return DeviceInfo("cpu", None, cpu_model_name(), threads or int(torch.get_num_threads()), None,
                      _host_memory_bytes())


def cpu_model_name() -> str:
    """The CPU model (``/proc/cpuinfo`` "model name", else the platform's processor string)."""
    text = _read("/proc/cpuinfo")
    for line in text.splitlines():
        if line.lower().startswith(("model name", "cpu model", "hardware")) and ":" in line:
            return line.split(":", 1)[1].strip()
    if platform.system() == "Darwin":
        brand = _sysctl("machdep.cpu.brand_string")
        if brand:
            return brand
    return platform.processor() or platform.machine() or "unknown CPU"


def _host_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _sysctl(key: str) -> str:
    try:
        out = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()


def cpu_flags() -> tuple[str, set[str]]:
    """(machine, feature flags) of this CPU: x86 ``flags`` / Arm ``Features`` of
    ``/proc/cpuinfo``; on macOS the ``hw.optional.arm.FEAT_*`` switches that are on."""
    machine = platform.machine().lower()
    flags: set[str] = set()
    for line in _read("/proc/cpuinfo").splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("flags", "features") and ":" in line:
            flags |= set(line.split(":", 1)[1].split())
    if not flags and platform.system() == "Darwin":
        for feature in ("FEAT_BF16", "FEAT_FP16"):
            if _sysctl(f"hw.optional.arm.{feature}") == "1":
                flags.add(feature.lower())
    return machine, flags


def cpu_native_support(dtype: str, machine: str, flags: set[str]) -> bool:
    """True when a CPU with these flags computes ``dtype`` natively (fp32 always).

    x86: bf16 needs AVX512_BF16 or AMX-BF16; fp16 needs AVX512_FP16 or AMX-FP16. Arm: bf16
    needs the BF16 extension (``bf16`` / ``FEAT_BF16``), fp16 half-precision arithmetic
    (``asimdhp`` / ``fphp`` / ``FEAT_FP16``). Anything else would be emulated in fp32.
    """
    if dtype == "fp32":
        return True
    lowered = {f.lower() for f in flags}
    if machine in ("x86_64", "amd64", "i386", "i686"):
        wanted = {"bf16": {"avx512_bf16", "amx_bf16"}, "fp16": {"avx512_fp16", "amx_fp16"}}[dtype]
    else:
        wanted = {"bf16": {"bf16", "feat_bf16"}, "fp16": {"asimdhp", "fphp", "feat_fp16"}}[dtype]
    return bool(lowered & wanted)


def check_dtype(device: DeviceInfo, dtype: str, torch: Any) -> None:
    """Refuse a ``dtype`` the device would only emulate (:class:`CalibrationError`)."""
    if dtype not in DTYPES:
        raise CalibrationError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    if dtype == "fp32":
        return
    if device.kind == "cpu":
        machine, flags = cpu_flags()
        if not cpu_native_support(dtype, machine, flags):
            need = "AVX512_BF16 or AMX" if dtype == "bf16" else "AVX512_FP16 or AMX-FP16"
            if machine not in ("x86_64", "amd64", "i386", "i686"):
                need = "the Arm BF16 extension" if dtype == "bf16" else "Arm half-precision arithmetic"
            raise CalibrationError(
                f"--dtype {dtype}: this CPU ({device.name}) has no native {dtype} arithmetic ({need}); "
                f"PyTorch would emulate it in fp32 and the profile would measure emulation. "
                f"Calibrate fp32 here, or {dtype} on a device that supports it")
        return
    if dtype == "bf16" and not cuda_native_bf16(torch, device):
        raise CalibrationError(f"--dtype bf16: {device.name} has no native bf16 (needs compute capability 8.0+); "
                               "PyTorch would emulate it")


def cuda_native_bf16(torch: Any, device: DeviceInfo) -> bool:
    """bf16 tensor cores: compute capability 8.0 or newer (``torch.cuda.is_bf16_supported``
    also counts emulation on older GPUs unless told not to)."""
    major, _ = torch.cuda.get_device_capability(device.index or 0)
    return bool(major >= 8)


# CUDA device names (torch.cuda.get_device_properties(i).name) -> catalog GPU names
_GPU_PATTERNS: tuple[tuple[str, str | None], ...] = (
    (r"\bH200\b", "h200"),
    (r"\bH100\b.*(SXM|HBM3)", "h100-sxm"),
    (r"\bA100\b", "a100"),  # 40 or 80 GB, told apart by memory
    (r"\bA10G\b", "a10g"),
    (r"\bV100\b", "v100"),  # 16 or 32 GB
)


def catalog_gpu_for(name: str, memory_bytes: float) -> str | None:
    """The catalog GPU a CUDA device name denotes (memory size tells A100/V100 variants
    apart), or None for a GPU the catalog lacks (its peak is then measured)."""
    for pattern, gpu in _GPU_PATTERNS:
        if re.search(pattern, name, flags=re.IGNORECASE):
            if gpu == "a100":
                return "a100-80gb" if memory_bytes > 48 * 2**30 else "a100-40gb"
            if gpu == "v100":
                return "v100-32gb" if memory_bytes > 20 * 2**30 else "v100-16gb"
            return gpu
    return None
