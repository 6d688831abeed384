"""The ``training.fp8`` block: how an fp8 run quantizes (read only when ``precision: fp8``).

Three independent choices, each a plain name:

* ``recipe``: how scales are found. ``tensorwise`` (dynamic per-tensor scaling: an amax pass,
  then the cast; torchao's default recipe, Transformer Engine's Float8CurrentScaling),
  ``rowwise`` (torchao: one scale per row, its CUTLASS rowwise GEMM), ``delayed`` (Transformer
  Engine DelayedScaling: the scale comes from the amax history, the cast records the new amax
  as it goes, so no extra pass), ``blockwise`` (1x128 activation and 128x128 weight blocks,
  DeepSeek-V3 style), ``mxfp8`` (32-element blocks with e8m0 scales in hardware: Blackwell).
* ``gemms``: which multiplies run in fp8 and with which kernels. ``linears``: torchao
  ``Float8Linear`` swapped for the block's ``nn.Linear`` modules (QKV, attention output,
  MLP up/gate/down), each cast a kernel of its own; ``transformer-engine``: TE
  ``LayerNormLinear`` / ``Linear`` layers in Megatron-Core (the same four GEMMs, the QKV and
  MLP-up input casts fused into the norm, fp8 weights cached across micro-batches). Attention
  stays bf16 in both (TE's fp8 dot-product attention is not modelled).
* ``all_gather``: the dtype of the sharded-parameter all-gather (FSDP / ZeRO-3 / the
  distributed optimizer's parameter gather) for the fp8 GEMM weights: ``fp8`` moves 1 byte
  per element instead of 2 (torchtitan ``enable_fsdp_float8_all_gather``, Megatron
  ``--fp8-param-gather``).

``output_head`` puts the LM head (the ``output`` linear) in fp8 too. ``experts`` says whether an
MoE layer's routed experts' grouped GEMMs run in fp8: ``auto`` follows the framework, fp8 under
Transformer Engine (Megatron-Core's TE spec builds them as ``TEGroupedMLP`` with
``TEColumnParallelGroupedLinear`` / ``TERowParallelGroupedLinear``, which run under the fp8
autocast: megatron/core/extensions/transformer_engine_spec_provider.py:75-85 at d98e8a6),
bf16 under torchao ``linears`` (torchtitan converts ``GroupedExperts`` only when
``Float8GroupedExpertsConverter`` is configured beside ``Float8LinearConverter``:
torchtitan/components/quantization/float8.py:216-265 at b5bcd76); ``fp8`` under ``linears`` is
that converter (dynamic rowwise scaling, whatever ``recipe`` says, and bf16 all-gathers). The costs these choices
imply live in :mod:`simulator.costs.fp8`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from simulator.errors import ScenarioError
from simulator.fields import Frozen

__all__ = ["Fp8Spec", "Fp8Recipe", "Fp8Gemms", "Fp8AllGather", "Fp8Experts"]

Fp8Recipe = Literal["tensorwise", "rowwise", "delayed", "blockwise", "mxfp8"]
Fp8Gemms = Literal["linears", "transformer-engine"]
Fp8AllGather = Literal["bf16", "fp8"]
Fp8Experts = Literal["auto", "fp8", "bf16"]


class Fp8Spec(Frozen):
    """How an fp8 run quantizes its GEMMs (module docstring); ignored unless ``precision: fp8``."""

    recipe: Fp8Recipe = Field(
        "tensorwise", description="scaling recipe: tensorwise (dynamic per-tensor, torchao's default) | rowwise "
        "(torchao rowwise) | delayed (Transformer Engine amax history) | blockwise (1x128 / 128x128 blocks) | "
        "mxfp8 (Blackwell MX blocks)")
    gemms: Fp8Gemms = Field(
        "linears", description="which GEMMs run in fp8 and how: linears (torchao Float8Linear on the block's "
        "linears, separate cast kernels) | transformer-engine (TE LayerNormLinear/Linear: input casts fused into "
        "the norms, fp8 weights cached across micro-batches); attention stays bf16")
    all_gather: Fp8AllGather = Field(
        "bf16", description="dtype of the sharded-parameter all-gather for the fp8 GEMM weights (fsdp, zero3, mics, "
        "the zero1 parameter gather): fp8 moves 1 byte per element instead of 2")
    output_head: bool = Field(
        False, description="run the LM head (output projection) in fp8 too (torchao without filter_fqns "
        "['output']); Megatron-Core keeps it bf16")
    experts: Fp8Experts = Field(
        "auto", description="an MoE layer's routed experts: fp8 grouped GEMMs (each local expert's weight cast) | "
        "bf16 | auto (fp8 under transformer-engine, TEGroupedMLP; bf16 under linears, as torchtitan without "
        "Float8GroupedExpertsConverter); shared experts follow gemms, the router stays bf16")

    @property
    def routed_experts_fp8(self) -> bool:
        """Whether the routed experts' grouped GEMMs run in fp8 (``experts`` resolved)."""
        return self.experts == "fp8" or (self.experts == "auto" and self.gemms == "transformer-engine")

    @model_validator(mode="after")
    def _check(self) -> Fp8Spec:
        if self.all_gather == "fp8" and self.gemms == "linears" and self.recipe != "tensorwise":
            raise ScenarioError(
                f"torchao all-gathers fp8 weights only with tensorwise scaling (recipe is {self.recipe}); "
                "set training.fp8.all_gather: bf16 or recipe: tensorwise", field="training.fp8.all_gather")
        if self.gemms == "linears" and self.recipe == "delayed":
            raise ScenarioError(
                "delayed scaling is Transformer Engine's recipe (torchao's Float8Linear scales dynamically): "
                "use gemms: transformer-engine or recipe: tensorwise", field="training.fp8.recipe")
        if self.gemms == "transformer-engine" and self.output_head and self.recipe != "mxfp8":
            raise ScenarioError(
                "Megatron-Core runs the LM head in fp8 only under the mxfp8 recipe (fp8_output_proj)",
                field="training.fp8.output_head")
        return self
