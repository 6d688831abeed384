"""Which attention kernel a scenario runs: ``training.attention_kernel`` and the older
``training.flash_attention`` / ``training.flash_attention_version``, resolved and checked.

Precedence, highest first (the framework-profile rule of :mod:`simulator.scenario.framework`):

1. ``attention_kernel`` written in the scenario (file or ``--set``);
2. ``flash_attention: false`` (-> ``unfused``) or ``flash_attention_version`` written in the
   scenario (1 -> ``fa1``, 2 -> ``fa2``, 3 -> ``fa3``, triton -> ``triton-2023``);
3. ``attention_kernel`` from the framework profile;
4. the profile's or dtsim's ``flash_attention`` / ``flash_attention_version`` (default ``fa2``).

Both written in the scenario and disagreeing is an error naming ``training.attention_kernel``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from simulator.errors import InfeasibleError

__all__ = ["AttentionKernel", "ATTENTION_KERNELS", "FA_VERSION_KERNEL", "KERNEL_ARCHITECTURES", "effective_attention_kernel",
           "check_attention_kernel"]

# training.flash_attention_version -> kernel
FA_VERSION_KERNEL: dict[int | str, str] = {1: "fa1", 2: "fa2", 3: "fa3", "triton": "triton-2023"}

AttentionKernel = Literal["fa2", "fa3", "cudnn", "triton", "triton-2023", "fa1", "unfused"]
ATTENTION_KERNELS: tuple[str, ...] = AttentionKernel.__args__  # type: ignore[attr-defined]

# kernels that exist only on some architectures: FlashAttention-3 uses Hopper's WGMMA and TMA
# (Shah et al. 2024, §3); cuDNN's fused flash attention (Transformer Engine's FusedAttention,
# sub-backend F16_arbitrary_seqlen) and OpenAI Triton's fused-attention tutorial need sm80+
KERNEL_ARCHITECTURES: dict[str, tuple[str, ...]] = {
    "fa3": ("hopper",),
    "cudnn": ("ampere", "hopper"),
    "triton": ("ampere", "hopper"),
}


def _from_flash(flash: bool, version: int | str) -> str:
    return FA_VERSION_KERNEL[version] if flash else "unfused"


def effective_attention_kernel(training: Any, source: Callable[[str], str]) -> str:
    """The kernel ``training`` (a ``TrainingSpec``) runs; ``source(path)`` says where a
    setting came from (``Scenario.source_of``: ``scenario``, a framework name or ``default``)."""
    if training.attention_kernel is not None and source("training.attention_kernel") == "scenario":
        return str(training.attention_kernel)
    if "scenario" in (source("training.flash_attention"), source("training.flash_attention_version")):
        return _from_flash(training.flash_attention, training.flash_attention_version)
    if training.attention_kernel is not None:
        return str(training.attention_kernel)
    return _from_flash(training.flash_attention, training.flash_attention_version)


def check_attention_kernel(training: Any, source: Callable[[str], str], architecture: str, gpu_name: str) -> str:
    """The effective kernel, after checking it against the scenario's other attention fields
    and the GPU architecture; raises :class:`InfeasibleError` naming the field to change."""
    given = {p: source(f"training.{p}") == "scenario"
             for p in ("attention_kernel", "flash_attention", "flash_attention_version")}
    kernel = effective_attention_kernel(training, source)
    if given["attention_kernel"] and training.attention_kernel is not None:
        if given["flash_attention"] and training.flash_attention != (kernel != "unfused"):
            raise InfeasibleError(
                f"training.attention_kernel: {kernel} contradicts training.flash_attention: "
                f"{str(training.flash_attention).lower()} (give one of them)", field="training.attention_kernel")
        if (given["flash_attention_version"] and kernel != "unfused"
                and FA_VERSION_KERNEL[training.flash_attention_version] != kernel):
            raise InfeasibleError(
                f"training.attention_kernel: {kernel} contradicts training.flash_attention_version: "
                f"{training.flash_attention_version} (give one of them)", field="training.attention_kernel")
    needs = KERNEL_ARCHITECTURES.get(kernel)
    if needs and architecture not in needs:
        field = "training.attention_kernel" if training.attention_kernel == kernel else \
            "training.flash_attention_version"
        raise InfeasibleError(
            f"attention kernel {kernel} needs a {' or '.join(needs)} GPU ({gpu_name} is {architecture})", field=field)
    return kernel
