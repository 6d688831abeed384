"""The ``model`` section: a transformer's shape, given directly or as a preset with overrides.

Presets are files in ``scenarios/models/`` read through a :class:`~simulator.catalog.Catalog`.
:func:`resolve_model` merges a preset with its overrides into plain data; data naming every
field (what :func:`resolve_model` and ``model_dump`` produce) validates without any file.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, ValidationError, ValidationInfo, model_validator

from simulator.catalog import Catalog
from simulator.fields import Frozen
from simulator.scenario.moe import MlaSpec, MoeLayers, Router, is_moe_layer
from simulator.scenario.resolve import catalog_in
from simulator.yamlio import error_from_validation

__all__ = ["ModelSpec", "resolve_model", "is_resolved_model"]


class ModelSpec(Frozen):
    """A decoder (or encoder) transformer: the parallelism-agnostic shape of the network."""

    name: str | None = Field(None, description="free text, e.g. 'GPT-3 175B'")
    preset: str | None = Field(None, description="preset in scenarios/models/ that the fields below override")
    layers: PositiveInt = Field(description="transformer blocks")
    hidden: PositiveInt = Field(description="model width h")
    heads: PositiveInt = Field(description="attention heads a")
    kv_heads: PositiveInt | None = Field(None, description="key/value heads (GQA when < heads); default = heads")
    head_width: PositiveInt | None = Field(
        None, alias="head_dim",
        description="width of each attention head in elements (Hugging Face head_dim, Megatron kv_channels); "
                    "default = hidden / heads. Wider heads (Qwen3: 32 x 128 on a 2,048 hidden) widen Q, K, V "
                    "and the output projection's input")
    ffn_hidden: PositiveInt | None = Field(None, description="MLP inner width; default = 4 * hidden")
    seq_len: PositiveInt = Field(description="sequence length s in tokens")
    vocab: PositiveInt = Field(description="vocabulary size V")
    mlp: Literal["gelu", "swiglu"] = Field("gelu", description="gelu: 2 matrices; swiglu: 3 (gate, up, down)")
    norm: Literal["layernorm", "rmsnorm"] = Field(
        "layernorm", description="layernorm: scale and shift (2 x hidden parameters); rmsnorm: scale only")
    position_embedding: Literal["learned", "rotary"] = Field(
        "learned", description="learned: a seq_len x hidden table; rotary: no parameters"
    )
    tied_embeddings: bool = Field(True, description="output projection shares the input embedding matrix")
    causal: bool = Field(True, description="causal (decoder) attention; false for BERT-style encoders")
    bias: bool = Field(True, description="linear layers and norms carry bias vectors")
    dropout: bool = Field(True, description="dropout after attention and MLP (stores 1-byte masks)")
    source: str | None = Field(None, description="citation for the architecture")
    experts: NonNegativeInt = Field(0, description="routed experts per MoE layer (0 = a dense model)")
    experts_per_token: PositiveInt | None = Field(None, description="top-k: routed experts each token goes to")
    shared_experts: NonNegativeInt = Field(0, description="experts every token goes to (DeepSeek, Qwen2-MoE)")
    expert_ffn_hidden: PositiveInt | None = Field(
        None, description="each expert's FFN width (a shared expert has the same width); default ffn_hidden")
    moe_layers: MoeLayers = Field(
        "all", description="which layers are MoE: all | {every: n} (layers i with i % n == n-1, the last of every n; "
        "Megatron-Core's integer moe_layer_freq n makes layers i % n == 0 MoE instead, gpt_layer_specs.py:647-650 at "
        "NVIDIA/Megatron-LM@d98e8a6) | {first_dense: k} (the first k layers dense, DeepSeek style); the others are dense MLPs")
    capacity_factor: PositiveFloat | None = Field(
        None, description="expert capacity = ceil(tokens x top-k / experts x factor); tokens above it are dropped "
        "(Megatron-Core get_capacity); null = dropless")
    router: Router = Field("softmax-topk", description="softmax-topk (Mixtral, Qwen) | sigmoid-topk (DeepSeek-V3)")
    attention: Literal["mha-gqa", "mla"] = Field(
        "mha-gqa", description="mha-gqa: query, key and value projections of heads / kv_heads heads; mla: multi-head "
        "latent attention (DeepSeek-V2/V3) with the ranks of the mla block")
    mla: MlaSpec | None = Field(None, description="multi-head latent attention's ranks (attention: mla only)")
    mtp_layers: NonNegativeInt = Field(
        0, description="multi-token prediction layers trained beside the model on the last pipeline stage "
        "(Megatron-Core mtp_num_layers; DeepSeek-V3 trained with 1): each two norms, a 2h -> h projection, one "
        "block like the last layer, a final norm and the shared output layer and loss again; that stage also "
        "holds the embedding. The model FLOPs behind TFLOP/s and MFU count the main model only")

    @model_validator(mode="before")
    @classmethod
    def _resolve_preset(cls, value: Any, info: ValidationInfo) -> Any:
        """A preset name or ``{preset: ..., overrides}`` is merged with the preset file of the
        catalog in the validation context (or the default catalog); data that already names
        every field is used as is, without reading anything."""
        if is_resolved_model(value):
            return _fill_model_defaults(value)
        return resolve_model(value, catalog_in(info))

    @model_validator(mode="after")
    def _shapes(self) -> ModelSpec:
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not divisible by heads={self.heads}")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} is not divisible by kv_heads={self.kv_heads}")
        if (self.attention == "mla") != (self.mla is not None):
            raise ValueError("attention: mla and the mla block go together")
        if self.experts:
            if self.experts_per_token is None:
                raise ValueError("a model with experts needs experts_per_token (top-k)")
            if self.experts_per_token > self.experts:
                raise ValueError(f"experts_per_token={self.experts_per_token} exceeds experts={self.experts}")
        elif self.experts_per_token is not None or self.shared_experts or self.capacity_factor is not None:
            raise ValueError("experts_per_token, shared_experts and capacity_factor need experts > 0")
        return self

    @property
    def moe(self) -> bool:
        """True for a mixture-of-experts model."""
        return self.experts > 0

    @property
    def top_k(self) -> int:
        return self.experts_per_token or 0

    @property
    def expert_ffn(self) -> int:
        return self.expert_ffn_hidden or self.ffn

    def is_moe_layer(self, layer: int) -> bool:
        """Whether 0-based ``layer`` has routed experts instead of a dense MLP."""
        return self.moe and is_moe_layer(self.moe_layers, layer)

    @property
    def n_moe_layers(self) -> int:
        return sum(1 for i in range(self.layers) if self.is_moe_layer(i))

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def head_dim(self) -> int:
        """Per-head width: ``head_dim`` when the model gives it, else hidden / heads."""
        return self.head_width or self.hidden // self.heads

    @property
    def label(self) -> str:
        return self.name or self.preset or f"{self.layers}L-{self.hidden}h"


def _fill_model_defaults(value: Any) -> Any:
    if isinstance(value, dict):
        value = dict(value)
        # a model dumped by field name (model_dump()) comes back under the file's key: head_width -> head_dim
        for name, field in ModelSpec.model_fields.items():
            if field.alias and name in value:
                written = value.pop(name)
                if value.get(field.alias) is None:
                    value[field.alias] = written
        if value.get("kv_heads") is None and "heads" in value:
            value["kv_heads"] = value["heads"]
        if value.get("ffn_hidden") is None and isinstance(value.get("hidden"), int):
            value["ffn_hidden"] = 4 * value["hidden"]
    return value


def is_resolved_model(value: Any) -> bool:
    """True when ``value`` needs no preset file: not a preset name, and either without a
    preset or naming every field (then the preset has nothing left to contribute)."""
    if not isinstance(value, dict):
        return not isinstance(value, str)
    if not value.get("preset"):
        return True
    return all((field.alias or name) in value for name, field in ModelSpec.model_fields.items())


def resolve_model(value: Any, catalog: Catalog) -> Any:
    """Merge a preset (``"gpt3-175b"`` or ``{preset: llama3-8b, seq_len: 4096}``) with its
    overrides into plain data; the preset file itself is validated first, so an error in it
    names that file. Values that are not presets pass through."""
    if isinstance(value, str):
        value = {"preset": value}
    if not isinstance(value, dict) or not value.get("preset"):
        return _fill_model_defaults(value)
    name = value["preset"]
    if not isinstance(name, str):
        raise ValueError("preset must be a preset name")
    preset = catalog.preset(name)
    data = preset.data
    data.setdefault("preset", name)
    try:
        ModelSpec.model_validate(_fill_model_defaults({**data, "preset": None}))
    except ValidationError as exc:
        raise error_from_validation(exc, root=preset.root, file=preset.path, model=ModelSpec) from None
    overrides = {k: v for k, v in value.items() if k != "preset"}
    # an explicit override of heads without kv_heads keeps MHA semantics of the override
    merged = _fill_model_defaults({**data, **overrides, "preset": name})
    # every field written out (defaults too): the result is resolved data (is_resolved_model)
    defaults = {f.alias or k: f.default for k, f in ModelSpec.model_fields.items()
                if not f.is_required() and (f.alias or k) not in merged}
    return {**merged, **defaults}
