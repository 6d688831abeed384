"""Kernel benchmarks with PyTorch: GEMMs, fused attention, memory-bound kernels, the
optimizer step, and the launch overhead. Each returns plain records; fitting is elsewhere.

Work is counted with the simulator's own conventions so a profile predicts what it measured:
a GEMM is ``2*m*n*k`` FLOPs; attention ``4*b*a*s^2*d`` halved when causal, its backward 2.5x
that (FlashAttention-2's convention, Dao 2023 §4.1, the simulator's ``FLASH_BWD_FLOP_RATIO``);
a memory-bound kernel moves the bytes :mod:`simulator.workload.model` charges for it (the
block's norms, dropout + residual adds and activation function take their byte counts from
``block_forward`` itself, their backward twice that; a copy moves 2 elements, an add 3; Adam
32 bytes per fp32 parameter, ``optimizer_kernel``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.calibrate.device import DeviceInfo, torch_dtype
from simulator.calibrate.shapes import AttentionShape, BlockShape, GemmShape
from simulator.calibrate.timing import KernelTimer, Timing
from simulator.costs.flops import attention_core_flops
from simulator.workload.model import FLASH_BWD_FLOP_RATIO, Shard, block_forward, optimizer_kernel

__all__ = [
    "GemmPoint",
    "AttentionPoint",
    "MemoryPoint",
    "BlockOpPoint",
    "time_gemm",
    "time_attention",
    "stream_kernels",
    "time_memory_kernel",
    "time_block_ops",
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


@dataclass(frozen=True)
class BlockOpPoint:
    """One memory-bound op of the block (``ln``, ``residual``, ``act``), timed forward alone and
    forward + backward; ``count``: how often the block runs it; bytes as the simulator counts
    them (backward: twice the forward, ``backward_of``)."""

    name: str
    count: int
    forward_bytes: float
    forward: Timing
    forward_backward: Timing

    @property
    def backward_bytes(self) -> float:
        return 2.0 * self.forward_bytes

    @property
    def backward_s(self) -> float:
        """Backward time: forward + backward minus forward (at least a tenth of the pair)."""
        return max(self.forward_backward.median_s - self.forward.median_s, 0.1 * self.forward_backward.median_s)


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


def stream_kernels(torch: Any, device: DeviceInfo, dtype: str, stream_elements: int,
                   optimizer_params: int) -> list[tuple[str, float, Any]]:
    """(name, bytes moved, callable) of the reference memory-bound kernels: a copy and an add
    of ``stream_elements`` into preallocated outputs (large enough to stream from DRAM/HBM),
    and one ``torch.optim.AdamW`` step (foreach) over ``optimizer_params`` fp32 parameters
    (mixed precision keeps fp32 master weights, so the step runs in fp32 for every ``dtype``).
    """
    dt = torch_dtype(torch, dtype)
    dev = device.torch_device
    e = torch.tensor([], dtype=dt).element_size()
    x = torch.randn(stream_elements, device=dev, dtype=dt)
    y = torch.randn(stream_elements, device=dev, dtype=dt)
    z = torch.empty(stream_elements, device=dev, dtype=dt)
    params = [torch.zeros(optimizer_params, device=dev, dtype=torch.float32, requires_grad=True)]
    params[0].grad = torch.randn(optimizer_params, device=dev, dtype=torch.float32)
    adam = torch.optim.AdamW(params, lr=1e-4, foreach=True)
    return [
        (f"stream copy {stream_elements}", 2.0 * stream_elements * e, lambda: z.copy_(x)),
        (f"stream add {stream_elements}", 3.0 * stream_elements * e, lambda: torch.add(x, y, out=z)),
        (f"adamw step {optimizer_params} params", optimizer_kernel(optimizer_params, "fp32", "adam").nbytes,
         adam.step),
    ]


def _block_op(torch: Any, shape: BlockShape, dtype: str, device: DeviceInfo, kind: str) -> tuple[Any, Any]:
    """(forward, forward + backward) callables of one memory-bound op of the block."""
    import torch.nn.functional as F
    from torch import nn

    from simulator.calibrate.block import DROPOUT_P

    m = shape.model
    dt, dev = torch_dtype(torch, dtype), device.torch_device
    tokens = shape.batch * shape.seq
    width = {"ln": m.hidden, "residual": m.hidden, "act": (2 if m.mlp == "swiglu" else 1) * m.ffn}[kind]
    x = torch.randn(tokens, width, device=dev, dtype=dt, requires_grad=True)
    y = torch.randn(tokens, width, device=dev, dtype=dt, requires_grad=True)
    grad_width = m.ffn if kind == "act" else width
    grad = torch.randn(tokens, grad_width, device=dev, dtype=dt)
    inputs: tuple[Any, ...] = (x,)
    if kind == "ln":
        norm = (nn.RMSNorm(width) if m.norm == "rmsnorm" and hasattr(nn, "RMSNorm")
                else nn.LayerNorm(width, bias=m.bias)).to(device=dev, dtype=dt)
        inputs = (x, *norm.parameters())

        def forward() -> Any:
            return norm(x)
    elif kind == "residual":
        inputs = (x, y)

        def forward() -> Any:
            return x + F.dropout(y, DROPOUT_P if m.dropout else 0.0, training=True)
    elif m.mlp == "swiglu":
        def forward() -> Any:
            gate, up = x.chunk(2, dim=-1)
            return F.silu(gate) * up
    else:
        def forward() -> Any:
            return F.gelu(x)

    def forward_backward() -> Any:
        return torch.autograd.grad(forward(), inputs, grad)

    return forward, forward_backward


def time_block_ops(torch: Any, device: DeviceInfo, dtype: str, timer: KernelTimer,
                   shape: BlockShape) -> list[BlockOpPoint]:
    """Time the block's memory-bound ops (norm, dropout + residual add, activation) as the
    torch block runs them, with the bytes and multiplicities of ``block_forward``."""
    kernels = [k for k in block_forward(shape.model, Shard(batch=shape.batch, seq=shape.seq, precision=dtype))
               if k.kind == "memory"]
    out = []
    for kind in ("ln", "residual", "act"):
        same = [k for k in kernels if k.name.rstrip("12") == kind]
        if not same:
            continue
        forward, forward_backward = _block_op(torch, shape, dtype, device, kind)
        out.append(BlockOpPoint(kind, len(same), same[0].nbytes, timer(forward), timer(forward_backward)))
    return out


def time_memory_kernel(timer: KernelTimer, name: str, nbytes: float, fn: Any) -> MemoryPoint:
    return MemoryPoint(name, nbytes, timer(fn))


def time_launch(torch: Any, device: DeviceInfo, timer: KernelTimer) -> Timing:
    """Per-call time of a one-element add issued back to back: the eager launch overhead."""
    x = torch.ones(1, device=device.torch_device)
    y = torch.ones(1, device=device.torch_device)
    z = torch.empty(1, device=device.torch_device)
    return timer(lambda: torch.add(x, y, out=z))
