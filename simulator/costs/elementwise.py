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

The embedding table's gradient (:func:`embedding_grad_bytes_per_element`, per element of the
rank's ``V/t x h`` table, each micro-batch; ``g`` the main gradient's bytes):

* ``dense`` (every framework's ``nn.Embedding`` / ``F.embedding``): PyTorch's embedding backward
  allocates the whole table's gradient zeroed, then writes the rows of the batch's tokens
  (``embedding_backward_cuda_kernel``, ``at::zeros({num_weights, ...}, grad.options())``,
  aten/src/ATen/native/cuda/EmbeddingBackwardKernel.cu at
  pytorch/pytorch@01b9dc565e8cdd6fd13ad2ab8a80de76e192b880): ``e``. A tied output layer on the
  same stage hands autograd a second gradient of the table, which it adds to the first before
  the weight's accumulation (``accumulate``, ``old_var.add_(var)`` or ``old_var + var``: read two,
  write one, torch/csrc/autograd/input_buffer.cpp at
  pytorch/pytorch@4537ef6cfa516fa5b78089bc9efa0c3d5dff318b): ``3e`` more.
* ``main-grad`` (Megatron-Core's DDP, at NVIDIA/Megatron-LM@f2e5db402c44ae309aa6448bcb4ae87e8ae0f5f4):
  the parameter's hook adds its ``.grad`` into the fp32 main gradient (``param.main_grad.add_``,
  megatron/core/distributed/distributed_data_parallel.py:215-225): ``g + e + g``. The output
  layer accumulates its own weight gradient straight into the main gradient
  (``gradient_accumulation_fusion``, on by default: arguments.py:1163; tensor_parallel/layers.py:490-500)
  and hands autograd a dummy of the table's size, ``torch.empty`` (no traffic) unless the table
  is tied on the same stage, where it is ``torch.zeros`` (``zero_out_wgrad``, layers.py:503-522,
  set by models/common/language_module/language_module.py:63-67) so that the hook may add the
  sum: ``e`` more, beside the ``3e`` sum. Untied, or on a later pipeline stage, the output
  weight's hook adds nothing (``grad_added_to_main_grad``).

So per table element and micro-batch: dense ``e`` (``4e`` tied on the stage); main-grad
``2e + 2g`` (``6e + 2g`` tied on the stage: 20 bytes for bf16 with fp32 main gradients).
"""

from __future__ import annotations

__all__ = ["rmsnorm_bytes_per_element", "swiglu_bytes_per_element", "rotary_bytes_per_element",
           "cross_entropy_bytes_per_element", "embedding_grad_bytes_per_element", "EAGER_SAVED_FP32_BYTES"]

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


def embedding_grad_bytes_per_element(act_bytes: float, impl: str, *, main_grad_bytes: float, tied_here: bool) -> float:
    """HBM bytes per element of an embedding table's gradient each micro-batch (module docstring):
    ``impl`` is ``training.embedding_grad``; ``tied_here``: the table is also the output layer's
    weight on this pipeline stage; ``main_grad_bytes``: the main gradient's element (main-grad)."""
    e = act_bytes
    dense = e + (3.0 * e if tied_here else 0.0)
    if impl == "dense":
        return dense
    return dense + e + 2.0 * main_grad_bytes + (e if tied_here else 0.0)
