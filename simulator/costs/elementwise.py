"""HBM bytes of a block's elementwise and normalization ops: fused kernels or eager PyTorch.

A fused kernel (Megatron/Apex/Transformer Engine, or the Triton kernels torch.compile's
Inductor generates: it fuses chains of pointwise ops and the reductions that feed them into
one kernel, "TorchInductor ... fuses pointwise, reduction and scatter operations", Ansel et
al., ASPLOS'24, "PyTorch 2", §4) reads each input once and writes each output once. Eager
PyTorch runs one kernel per op: every intermediate is written to HBM and read back. Byte
counts per element, with ``e`` the activation's bytes (2 for bf16) and fp32 intermediates,
follow the op sequence of torchtitan's pure-PyTorch model code at
pytorch/torchtitan@9dec370ad26b5f8e9a7333a0e36165018262644b:

* RMSNorm (``torchtitan/models/norms.py:96-101``): ``x.float()`` (read e, write 4),
  ``pow(2)`` (4 + 4), ``mean(-1)`` (read 4), ``x * rsqrt(...)`` (4 + 4), ``type_as`` (4 + e),
  ``* weight`` (e + e): ``28 + 4e``; fused: ``2e``.
* SwiGLU (``torchtitan/models/llama/model.py:252-253``) per FFN element: ``silu`` (e + e),
  ``* w3(x)`` (e + e + e): ``5e``; fused: ``3e`` (read gate and up, write the product).
* rotary (``model.py:108-113``) per query/key element: ``float()`` (e + 4), complex multiply
  (4 + 4; the frequency table is small), ``type_as`` (4 + e): ``16 + 2e``; fused: ``2e``.

What eager autograd keeps for the backward beyond the fused kernel's tensors, per element,
when the op is not recomputed. Autograd saves an op's input only for the gradient that needs
it (PyTorch tools/autograd/derivatives.yaml: ``pow.Tensor_Scalar`` saves ``self``; ``rsqrt``
its ``result``; ``mul.Tensor`` saves ``other`` for ``self``'s gradient and ``self`` for
``other``'s, each only when that gradient is required):

* RMSNorm: ``pow`` and ``x * rsqrt(...)`` save the fp32 ``x.float()`` (4 per element); the
  multiply by the weight saves the 16-bit normalized tensor (e); the 16-bit input itself is
  no longer kept (``float()`` saves nothing): ``4 + e - e`` = 4 beyond the fused kernel's
  input and output.
* rotary: ``xq_ * freqs_cis`` saves only ``freqs_cis`` (the query needs ``other``; the
  frequencies need no gradient), so the fp32 complex query and key are not kept: 0.
* SwiGLU saves its two inputs and the SiLU output either way.

Checked on torch 2.13 (CPU) with ``torch.autograd.graph.saved_tensors_hooks`` over a
torchtitan-shaped bf16 block: the saved fp32 tensors are the two norms' ``x.float()`` and
``rsqrt`` outputs, the complex tensors only the frequency table.

The loss (:func:`cross_entropy_bytes_per_element`, per element of the rank's ``T x V/t`` logits):

* ``fused`` / ``eager-fp32``: read the 16-bit logits, write and read back an fp32 value
  (``e + 8``); the backward twice that.
* ``megatron``: Megatron's vocab-parallel cross entropy without ``--cross-entropy-loss-fusion``
  (off by default) runs op by op inside its autograd Function (megatron/core/tensor_parallel/
  cross_entropy.py at NVIDIA/Megatron-LM@f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4: forward
  :120-185 through :27-77; the same ops at d98e8a64ddf34856e74b24714e3bedb2f5a39553, and in
  megatron/mpu/cross_entropy.py at 6985e58938d40ad91ac07b0fddcfad8132e1447e after
  ``output.float()``, megatron/model/gpt_model.py:56): ``.float()`` (e + 4), ``max`` (read 4),
  in-place ``-= max`` (4 + 4), ``exp`` in place (4 + 4), ``sum`` (read 4), ``div_`` (4 + 4):
  ``e + 36``; the backward (:190-210, :113) ``grad_input.mul_(grad_output)`` (4 + 4) and the
  cast of the fp32 gradient it returns to the 16-bit logits' dtype (autograd casts a returned
  gradient to its input's dtype; 4 + e): ``e + 12``. The per-token gathers and all-reduces
  touch ``T`` values, not ``T x V``. fp32 logits skip both casts.
"""

from __future__ import annotations

__all__ = ["rmsnorm_bytes_per_element", "swiglu_bytes_per_element", "rotary_bytes_per_element",
           "cross_entropy_bytes_per_element", "EAGER_SAVED_FP32_BYTES"]

EAGER_SAVED_FP32_BYTES = 4.0  # the fp32 copy eager RMSNorm keeps per element (see above)


def rmsnorm_bytes_per_element(act_bytes: float, *, eager: bool) -> float:
    """HBM bytes of an RMSNorm forward per element: ``28 + 4e`` eager, ``2e`` fused."""
    return 28.0 + 4.0 * act_bytes if eager else 2.0 * act_bytes


def swiglu_bytes_per_element(act_bytes: float, *, eager: bool) -> float:
    """HBM bytes of SiLU(gate) * up per FFN element: ``5e`` eager, ``3e`` fused."""
    return 5.0 * act_bytes if eager else 3.0 * act_bytes


def rotary_bytes_per_element(act_bytes: float, *, eager: bool) -> float:
    """HBM bytes of the rotary embedding per query/key element: ``16 + 2e`` eager, ``2e`` fused."""
    return 16.0 + 2.0 * act_bytes if eager else 2.0 * act_bytes


def cross_entropy_bytes_per_element(act_bytes: float, impl: str) -> tuple[float, float]:
    """(forward, backward) HBM bytes of the loss per logits element (module docstring);
    ``impl`` is ``training.cross_entropy``."""
    if impl == "megatron":
        cast = 0.0 if act_bytes == 4 else act_bytes + 4
        return cast + 32.0, cast + 8.0
    forward = act_bytes + 8.0
    return forward, 2 * forward
