"""The closed loop: a real PyTorch transformer block, timed forward + backward on the
device, against the simulator's prediction for the same block with the new profile.

The torch block follows :func:`simulator.workload.model.block_forward` kernel for kernel
(Megatron/GPT layout, pre-norm)::

    x -> norm1 -> qkv linear [h -> (a + 2*kv)*d] -> scaled_dot_product_attention (fused)
      -> proj linear [a*d -> h] -> dropout -> + x
      -> norm2 -> fc1 linear [h -> F] (2F for SwiGLU) -> GELU (SiLU-gate) -> fc2 [F -> h]
      -> dropout -> + residual

Backward computes the input gradient and every weight gradient (``torch.autograd.grad``
on the input and all parameters, so nothing accumulates between runs), as one micro-batch
of training does. The prediction is ``kernels_time_s(profile, block_forward + backward_of
(block_forward), dtype)``: the kernels the simulator would schedule for this block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.calibrate.device import DeviceInfo, torch_dtype
from simulator.calibrate.shapes import BlockShape
from simulator.calibrate.timing import KernelTimer, Timing
from simulator.costs.compute import ComputeProfile
from simulator.workload.model import Shard, backward_of, block_forward, kernel_time_s

__all__ = ["ClosedLoop", "build_block", "time_block", "predict_block", "closed_loop"]

DROPOUT_P = 0.1


@dataclass(frozen=True)
class ClosedLoop:
    """Measured vs predicted time of one block's forward + backward (seconds).

    ``error_pct`` = 100 * (predicted - measured) / measured (positive: the simulator is slow).
    ``predicted_by_kind_s``: the prediction split into gemm / attention / memory kernels.
    """

    block: BlockShape
    measured: Timing
    predicted_s: float
    predicted_by_kind_s: dict[str, float]

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted_s - self.measured.median_s) / self.measured.median_s

    def as_dict(self) -> dict[str, Any]:
        m = self.block.model
        return {
            "block": self.block.describe(),
            "source": self.block.source,
            "hidden": m.hidden, "heads": m.heads, "kv_heads": m.n_kv_heads, "ffn_hidden": m.ffn, "mlp": m.mlp,
            "micro_batch": self.block.batch, "seq_len": self.block.seq,
            "measured_s": self.measured.median_s,
            "measured_spread": round(self.measured.spread, 4),
            "predicted_s": self.predicted_s,
            "predicted_by_kind_s": self.predicted_by_kind_s,
            "error_pct": round(self.error_pct, 2),
        }


def build_block(torch: Any, shape: BlockShape, dtype: str, device: DeviceInfo) -> Any:
    """A ``torch.nn.Module`` for one block of ``shape.model`` on ``device`` in ``dtype``."""
    import torch.nn.functional as F
    from torch import nn

    m = shape.model
    d, heads, kv = m.head_dim, m.heads, m.n_kv_heads
    n_up = 2 if m.mlp == "swiglu" else 1

    def norm() -> Any:
        if m.norm == "rmsnorm" and hasattr(nn, "RMSNorm"):  # torch >= 2.4
            return nn.RMSNorm(m.hidden)
        return nn.LayerNorm(m.hidden, bias=m.bias)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = norm(), norm()
            self.qkv = nn.Linear(m.hidden, (heads + 2 * kv) * d, bias=m.bias)
            self.proj = nn.Linear(heads * d, m.hidden, bias=m.bias)
            self.fc1 = nn.Linear(m.hidden, n_up * m.ffn, bias=m.bias)
            self.fc2 = nn.Linear(m.ffn, m.hidden, bias=m.bias)
            self.drop = nn.Dropout(DROPOUT_P if m.dropout else 0.0)

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).split([heads * d, kv * d, kv * d], dim=-1)
            q = q.view(b, s, heads, d).transpose(1, 2)
            k = k.view(b, s, kv, d).transpose(1, 2)
            v = v.view(b, s, kv, d).transpose(1, 2)
            if kv < heads:  # grouped-query attention: each kv head serves heads/kv query heads
                k = k.repeat_interleave(heads // kv, dim=1)
                v = v.repeat_interleave(heads // kv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=m.causal)
            x = x + self.drop(self.proj(a.transpose(1, 2).reshape(b, s, heads * d)))
            u = self.fc1(self.norm2(x))
            if m.mlp == "swiglu":
                gate, up = u.chunk(2, dim=-1)
                act = F.silu(gate) * up
            else:
                act = F.gelu(u)
            return x + self.drop(self.fc2(act))

    return Block().to(device=device.torch_device, dtype=torch_dtype(torch, dtype)).train()


def time_block(torch: Any, shape: BlockShape, dtype: str, device: DeviceInfo, timer: KernelTimer) -> Timing:
    """Median forward + backward time of one block (input and weight gradients)."""
    block = build_block(torch, shape, dtype, device)
    dt = torch_dtype(torch, dtype)
    x = torch.randn(shape.batch, shape.seq, shape.model.hidden, device=device.torch_device, dtype=dt,
                    requires_grad=True)
    grad = torch.randn(shape.batch, shape.seq, shape.model.hidden, device=device.torch_device, dtype=dt)
    inputs = (x, *block.parameters())

    def step() -> Any:
        return torch.autograd.grad(block(x), inputs, grad)

    return timer(step)


def predict_block(profile: ComputeProfile, shape: BlockShape, dtype: str) -> dict[str, float]:
    """The simulator's time of the block's forward + backward kernels, by kernel kind."""
    forward = block_forward(shape.model, Shard(batch=shape.batch, seq=shape.seq, precision=dtype))
    by_kind: dict[str, float] = {}
    for kernel in forward + backward_of(forward):
        by_kind[kernel.kind] = by_kind.get(kernel.kind, 0.0) + kernel_time_s(profile, kernel, dtype)
    return by_kind


def closed_loop(torch: Any, shape: BlockShape, dtype: str, device: DeviceInfo, timer: KernelTimer,
                profile: ComputeProfile) -> ClosedLoop:
    measured = time_block(torch, shape, dtype, device, timer)
    by_kind = predict_block(profile, shape, dtype)
    return ClosedLoop(shape, measured, sum(by_kind.values()), by_kind)
