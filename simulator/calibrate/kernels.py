"""Kernel benchmarks with PyTorch: GEMMs, fused attention, memory-bound kernels, the
optimizer step, and the launch overhead. Each returns plain records; fitting is elsewhere.

Work is counted with the simulator's own conventions so a profile predicts what it measured:
a GEMM is ``2*m*n*k`` FLOPs; attention ``4*b*a*s^2*d`` halved when causal, its backward 2.5x
that (FlashAttention-2's convention, Dao 2023 §4.1, the simulator's ``FLASH_BWD_FLOP_RATIO``);
a memory-bound kernel moves the bytes :mod:`simulator.workload.model` charges for it
(layernorm reads and writes the activation: 2 elements each; a residual add reads two and
writes one; an activation function reads one and writes one; Adam moves 32 bytes per fp32
parameter, ``optimizer_kernel``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.calibrate.device import DeviceInfo, torch_dtype
from simulator.calibrate.shapes import AttentionShape, GemmShape
from simulator.calibrate.timing import KernelTimer, Timing
from simulator.costs.flops import attention_core_flops
from simulator.workload.model import FLASH_BWD_FLOP_RATIO, optimizer_kernel

__all__ = [
    "GemmPoint",
    "AttentionPoint",
    "MemoryPoint",
    "time_gemm",
    "time_attention",
    "memory_kernels",
    "time_memory_kernel",
    "time_launch",
]


@dataclass(frozen=True)
class GemmPoint:
    shape: GemmShape
    timing: Timing

    @property
    def flops(self) -> float:
        return self.shape.flops


@dataclass(frozen=True)
class AttentionPoint:
    """Forward alone and forward + backward of one attention call."""

    shape: AttentionShape
    forward: Timing
    forward_backward: Timing

    @property
    def forward_flops(self) -> float:
        s = self.shape
        return attention_core_flops(s.batch, s.heads, s.seq, s.seq, s.head_dim) * (0.5 if s.causal else 1.0)

    @property
    def backward_flops(self) -> float:
        return FLASH_BWD_FLOP_RATIO * self.forward_flops

    @property
    def backward_s(self) -> float:
        """Backward time: forward + backward minus forward (at least a tenth of the pair)."""
        return max(self.forward_backward.median_s - self.forward.median_s, 0.1 * self.forward_backward.median_s)


@dataclass(frozen=True)
class MemoryPoint:
    """A memory-bound kernel that moves ``nbytes`` per call."""

    name: str
    nbytes: float
    timing: Timing


def time_gemm(torch: Any, device: DeviceInfo, dtype: str, timer: KernelTimer, shape: GemmShape) -> GemmPoint:
    dt = torch_dtype(torch, dtype)
    a = torch.randn(shape.m, shape.k, device=device.torch_device, dtype=dt)
    b = torch.randn(shape.k, shape.n, device=device.torch_device, dtype=dt)
    out = torch.empty(shape.m, shape.n, device=device.torch_device, dtype=dt)
    timing = timer(lambda: torch.matmul(a, b, out=out))
    return GemmPoint(shape, timing)


def time_attention(torch: Any, device: DeviceInfo, dtype: str, timer: KernelTimer,
                   shape: AttentionShape) -> AttentionPoint:
    """``torch.nn.functional.scaled_dot_product_attention`` (the fused kernel PyTorch picks:
    FlashAttention / cuDNN / memory-efficient on GPUs, the flash CPU kernel on CPUs)."""
    import torch.nn.functional as F

    dt = torch_dtype(torch, dtype)
    size = (shape.batch, shape.heads, shape.seq, shape.head_dim)
    q, k, v = (torch.randn(size, device=device.torch_device, dtype=dt, requires_grad=True) for _ in range(3))
    grad = torch.randn(size, device=device.torch_device, dtype=dt)

    def forward() -> Any:
        return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal)

    def forward_backward() -> Any:
        return torch.autograd.grad(forward(), (q, k, v), grad)

    return AttentionPoint(shape, timer(forward), timer(forward_backward))


def memory_kernels(torch: Any, device: DeviceInfo, dtype: str, activations: list[tuple[int, int]],
                   stream_elements: int, optimizer_params: int) -> list[tuple[str, float, Any]]:
    """(name, bytes moved, callable) for each memory-bound kernel to time.

    ``activations``: (tokens, width) tensors to run copy / residual add / GELU / layernorm on
    (the block's own sizes); ``stream_elements``: one large copy and add into preallocated
    outputs, to stream from DRAM/HBM; ``optimizer_params``: fp32 parameters of one
    ``torch.optim.AdamW`` step (foreach; mixed precision keeps fp32 master weights, so the
    step runs in fp32 for every ``dtype``).
    """
    import torch.nn.functional as F

    dt = torch_dtype(torch, dtype)
    dev = device.torch_device
    e = torch.tensor([], dtype=dt).element_size()
    out: list[tuple[str, float, Any]] = []
    for tokens, width in activations:
        n = tokens * width
        x = torch.randn(tokens, width, device=dev, dtype=dt)
        y = torch.randn(tokens, width, device=dev, dtype=dt)
        z = torch.empty(tokens, width, device=dev, dtype=dt)
        tag = f"{tokens}x{width}"
        out += [
            (f"copy {tag}", 2.0 * n * e, lambda x=x, z=z: z.copy_(x)),
            (f"residual add {tag}", 3.0 * n * e, lambda x=x, y=y, z=z: torch.add(x, y, out=z)),
            (f"gelu {tag}", 2.0 * n * e, lambda x=x: F.gelu(x)),
            (f"layernorm {tag}", 2.0 * n * e, lambda x=x, w=width: F.layer_norm(x, (w,))),
        ]
    x = torch.randn(stream_elements, device=dev, dtype=dt)
    y = torch.randn(stream_elements, device=dev, dtype=dt)
    z = torch.empty(stream_elements, device=dev, dtype=dt)
    out += [
        (f"stream copy {stream_elements}", 2.0 * stream_elements * e, lambda: z.copy_(x)),
        (f"stream add {stream_elements}", 3.0 * stream_elements * e, lambda: torch.add(x, y, out=z)),
    ]
    params = [torch.zeros(optimizer_params, device=dev, dtype=torch.float32, requires_grad=True)]
    params[0].grad = torch.randn(optimizer_params, device=dev, dtype=torch.float32)
    adam = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    out.append((f"adamw step {optimizer_params} params", optimizer_kernel(optimizer_params, "fp32", "adam").nbytes,
                adam.step))
    return out


def time_memory_kernel(timer: KernelTimer, name: str, nbytes: float, fn: Any) -> MemoryPoint:
    return MemoryPoint(name, nbytes, timer(fn))


def time_launch(torch: Any, device: DeviceInfo, timer: KernelTimer) -> Timing:
    """Per-call time of a one-element add issued back to back: the eager launch overhead."""
    x = torch.ones(1, device=device.torch_device)
    y = torch.ones(1, device=device.torch_device)
    z = torch.empty(1, device=device.torch_device)
    return timer(lambda: torch.add(x, y, out=z))
