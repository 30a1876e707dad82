"""Model presets and what the store needs of a model without its weights: shapes, dtype, model id.

Presets reproduce real models' shapes (KV bytes per token, FLOPs) with seeded random weights (:mod:`kvcli.model.llama`).
Importing this module does not import torch (``kvcli route --prefill-tps`` never needs it): dtypes are known by name
here, and torch is imported only where a torch dtype is made (:func:`parse_dtype`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvcli.errors import BadInputError
from kvcli.units import dtype_bytes, dtype_key, torch_dtype

if TYPE_CHECKING:
    import torch

# dtype names accepted -> torch's name (kvcli.units sizes them); torch's name -> the short name model ids use
DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16"}
_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def dtype_short(dtype: torch.dtype | str) -> str:
    """The short name of a dtype (torch's or a name) as model ids spell it: ``torch.bfloat16`` -> ``"bf16"``.
    Raises BadInputError for a dtype kvcli does not support."""
    name = DTYPE_NAMES.get(dtype_key(dtype).lower())
    if name is None:
        raise BadInputError(f"unknown dtype {dtype_key(dtype)!r}; valid: {', '.join(DTYPE_NAMES)}")
    return _SHORT[name]


#: Layer kinds of :attr:`ModelConfig.layer_types`, transformers' names: attention over every earlier token, over
#: the last ``sliding_window`` tokens, a linear-attention / Mamba mixer with a constant-size state, or no token
#: mixer at all (Nemotron-H's MLP-only layers: neither cache nor state).
FULL, SLIDING, LINEAR, NO_MIXER = "full_attention", "sliding_attention", "linear_attention", "mlp"
#: :attr:`ModelConfig.linear_mixer`: the linear mixers whose FLOPs are counted, and ``""`` (not counted).
GATED_DELTANET, MAMBA2 = "gated_deltanet", "mamba2"
LINEAR_MIXERS = ("", GATED_DELTANET, MAMBA2)


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of a decoder. ``dtype`` is the preset's default dtype name; ``context`` the longest prompt the model
    is made for, tokens (a checkpoint's ``max_position_embeddings``; a preset: its real model's): the default
    length ``kvcli profile`` times prefills up to.

    The defaults describe a Llama-style decoder (grouped-query attention in every layer, one SwiGLU MLP). The
    other fields, read from a config by :mod:`kvcli.model.hfconfig`:

    - ``layer_types``: one of :data:`FULL`, :data:`SLIDING`, :data:`LINEAR`, :data:`NO_MIXER` per layer (``()``:
      all full), as transformers' ``config.layer_types``; ``sliding_window``: tokens a sliding layer attends
      (``W``; the token itself and the ``W - 1`` before it, transformers' rule).
    - latent attention (MLA, DeepSeek-V2/V3, Kimi-K2) when ``kv_lora_rank > 0``: ``q_lora_rank`` (0: one Q
      projection), ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``; the cache holds the latent and the
      decoupled RoPE key, ``kv_lora_rank + qk_rope_head_dim`` elements per layer and token (vLLM's MLA cache).
    - mixture of experts when ``experts > 0``: ``experts_per_token`` routed experts of ``moe_ffn`` each, shared
      experts of ``shared_ffn`` in all (0: none), ``shared_gate`` (a sigmoid gate ``hidden -> 1`` on the shared
      output, Qwen2-MoE/Qwen3-Next), ``dense_layers``, the layers that keep a dense MLP of ``ffn``, and
      ``moe_latent`` (0: none): the routed experts work on a latent of that width, projected down from ``hidden``
      before them and back up after (Nemotron-H's ``moe_latent_size``, ``fc1_latent_proj`` and
      ``fc2_latent_proj``).
    - ``state_elements``: elements of one linear layer's state per sequence (vLLM's conv state plus temporal
      state, :func:`kvcli.model.hfconfig.linear_state_elements`); ``linear_params``: parameters of one linear
      layer's mixer (its projections, convolution and per-head vectors,
      :func:`kvcli.model.hfconfig.linear_mixer_params`).
    - ``tie_embeddings``: the LM head is the token embedding's matrix (transformers' ``tie_word_embeddings``:
      small models such as Qwen2.5-0.5B and Llama 3.2 1B), so it is stored and counted once.
    - ``attn_output_gate``: the attention output is gated, ``o_proj(attn * sigmoid(gate))``, the gate made by a
      Q projection of twice the width (Qwen3-Next's ``Qwen3NextAttention``: ``q_proj`` ``hidden x 2 heads
      head_dim``).
    - ``gated_mlp``: the MLP (dense, routed and shared experts alike) is SwiGLU, three matrices (gate, up,
      down); ``False``: up and down only (Nemotron-H's squared ReLU, ``NemotronHMLP`` and ``NemotronHExperts``).
      ``mixer_mlp``: a layer with a token mixer also has an MLP; ``False``: each block is one mixer OR one MLP
      (Nemotron-H: ``layers_block_type`` ``mamba``/``attention`` blocks hold no MLP, ``mlp``/``moe`` blocks,
      :data:`NO_MIXER`, nothing else).
    - the linear mixer's shapes, for its FLOPs (:mod:`kvcli.model.flops`): ``linear_mixer`` ``"gated_deltanet"``
      (Qwen3-Next) or ``"mamba2"`` (Nemotron-H, Granite 4, Bamba), ``""`` when not counted (Jamba's Mamba);
      ``linear_heads`` x ``linear_head_dim`` (Gated DeltaNet: value heads and dims; Mamba-2: heads and head
      dims), ``linear_key_heads`` x ``linear_key_dim`` (Gated DeltaNet: key heads and dims; Mamba-2: groups and
      state size), ``linear_conv_kernel`` (the causal convolution's width) and ``linear_chunk`` (tokens per chunk
      of the chunked scan).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    dtype: str = "bfloat16"
    context: int = 8192
    layer_types: tuple[str, ...] = ()
    sliding_window: int = 0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    experts: int = 0
    experts_per_token: int = 0
    moe_ffn: int = 0
    shared_ffn: int = 0
    shared_gate: bool = False
    dense_layers: tuple[int, ...] = ()
    state_elements: int = 0
    linear_params: int = 0
    attn_output_gate: bool = False
    gated_mlp: bool = True
    mixer_mlp: bool = True
    linear_mixer: str = ""
    linear_heads: int = 0
    linear_head_dim: int = 0
    linear_key_heads: int = 0
    linear_key_dim: int = 0
    linear_conv_kernel: int = 0
    linear_chunk: int = 0
    moe_latent: int = 0
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.layer_types and len(self.layer_types) != self.layers:
            raise BadInputError(f"{self.name}: {len(self.layer_types)} layer types for {self.layers} layers")
        if SLIDING in self.layer_types and self.sliding_window <= 0:
            raise BadInputError(f"{self.name}: sliding-attention layers without a sliding window")
        if self.linear_mixer not in LINEAR_MIXERS:
            raise BadInputError(f"{self.name}: unknown linear mixer {self.linear_mixer!r}; valid: "
                                f"{', '.join(repr(m) for m in LINEAR_MIXERS)}")

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kind of every layer (:data:`FULL`, :data:`SLIDING`, :data:`LINEAR`, :data:`NO_MIXER`)."""
        return self.layer_types or (FULL,) * self.layers

    def count(self, kind: str) -> int:
        """Layers of ``kind`` (:data:`FULL`, :data:`SLIDING`, :data:`LINEAR`, :data:`NO_MIXER`)."""
        return self.kinds.count(kind)

    @property
    def attention_layers(self) -> int:
        """Layers that keep a KV cache: full and sliding attention (linear layers keep a state instead)."""
        return self.count(FULL) + self.count(SLIDING)

    @property
    def is_mla(self) -> bool:
        """Latent attention (its cache: latent plus RoPE key, one of them per layer and token)."""
        return self.kv_lora_rank > 0

    @property
    def qk_head_dim(self) -> int:
        """Elements per query/key head in the score: ``qk_nope_head_dim + qk_rope_head_dim`` (MLA), else
        ``head_dim``."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def value_dim(self) -> int:
        """Elements per value head: ``v_head_dim`` (MLA), else ``head_dim``."""
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def kv_elements_per_layer_token(self) -> int:
        """Cache elements of one attention layer for one token: ``kv_lora_rank + qk_rope_head_dim`` (MLA), else
        ``2 * kv_heads * head_dim`` (one K and one V per KV head)."""
        return self.kv_lora_rank + self.qk_rope_head_dim if self.is_mla else 2 * self.kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype: torch.dtype | str) -> int:
        """Bytes a stored chunk holds per token, every attention layer:
        ``attention_layers * kv_elements_per_layer_token * element_size`` (``2 * layers * kv_heads * head_dim *
        element_size`` for a Llama); ``dtype`` a torch dtype or its name. Raises BadInputError for an unknown
        dtype."""
        return self.attention_layers * self.kv_elements_per_layer_token * _element_bytes(dtype)

    def cached_prefix_bytes(self, tokens: int, dtype: torch.dtype | str) -> int:
        """Bytes an engine must keep to resume from a cached prefix of ``tokens`` tokens: full-attention layers
        ``tokens`` each, sliding layers ``min(tokens, sliding_window)`` each (older tokens are out of every later
        query's window), per layer-token :attr:`kv_elements_per_layer_token` elements, plus one state of every
        linear layer (:meth:`state_bytes`, the state at the prefix's end). vLLM's hybrid allocator keeps one
        block table per group of layers this way (vllm/v1/core/single_type_kv_cache_manager.py). Raises
        BadInputError for an unknown dtype or ``tokens < 0``."""
        if tokens < 0:
            raise BadInputError(f"tokens must be >= 0, got {tokens}")
        layer_tokens = self.count(FULL) * tokens + self.count(SLIDING) * min(tokens, self.sliding_window)
        return layer_tokens * self.kv_elements_per_layer_token * _element_bytes(dtype) + self.state_bytes(dtype)

    def state_bytes(self, dtype: torch.dtype | str) -> int:
        """Bytes of the state of every linear layer for one sequence at one point (constant in its length):
        ``linear layers * state_elements * element_size``; 0 without linear layers."""
        return self.count(LINEAR) * self.state_elements * _element_bytes(dtype)

    @property
    def state_shape(self) -> tuple[int, ...]:
        """``(linear layers, state_elements)``: the state a stored chunk of a hybrid model carries at its end
        (:attr:`state_bytes` in all); ``()`` without linear layers."""
        return (self.count(LINEAR), self.state_elements) if self.count(LINEAR) else ()

    def kv_shape(self, tokens: int) -> tuple[int, int, int, int, int]:
        """Shape of the KV of ``tokens`` tokens: ``(attention_layers, 2, kv_heads, tokens, head_dim)``; for MLA
        ``(layers, 1, 1, tokens, kv_lora_rank + qk_rope_head_dim)`` (latent then RoPE key, concatenated)."""
        if self.is_mla:
            return (self.attention_layers, 1, 1, tokens, self.kv_elements_per_layer_token)
        return (self.attention_layers, 2, self.kv_heads, tokens, self.head_dim)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) has experts rather than the dense MLP."""
        return self.experts > 0 and layer not in self.dense_layers

    def layer_classes(self) -> tuple[tuple[str, bool, int], ...]:
        """The distinct layers, ``(kind, has experts, how many)`` in order of first appearance: layers of one class
        have the same FLOPs and bytes, so a cost sums over classes rather than layers. A Llama: ``((FULL, False,
        layers),)``."""
        counts: dict[tuple[str, bool], int] = {}
        for layer, kind in enumerate(self.kinds):
            key = (kind, self.is_moe_layer(layer))
            counts[key] = counts.get(key, 0) + 1
        return tuple((kind, moe, count) for (kind, moe), count in counts.items())

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one MLP (and of one expert): 3 for SwiGLU (gate, up, down), 2 without the gate
        (:attr:`gated_mlp` ``False``)."""
        return 3 if self.gated_mlp else 2

    @property
    def expert_width(self) -> int:
        """The width a routed expert reads and writes: :attr:`moe_latent` when the experts work on a latent,
        else ``hidden``."""
        return self.moe_latent or self.hidden

    def has_mlp(self, kind: str) -> bool:
        """Whether a layer of ``kind`` has an MLP: a :data:`NO_MIXER` layer always, a mixer layer unless the
        blocks are one mixer or one MLP each (:attr:`mixer_mlp` ``False``, Nemotron-H)."""
        return kind == NO_MIXER or self.mixer_mlp

    def layer_norms(self, kind: str) -> int:
        """Norm vectors (``hidden`` each) of one layer of ``kind``: one before its mixer (none for
        :data:`NO_MIXER`) and one before its MLP (when it has one): 2 for a Llama layer, 1 for a Nemotron-H
        block."""
        return (kind != NO_MIXER) + self.has_mlp(kind)

    def params(self) -> int:
        """Number of parameters (embedding and LM head counted separately unless :attr:`tie_embeddings`; every expert
        counted; a linear layer's mixer as :attr:`linear_params`; the layers' norms (:meth:`layer_norms`) and the
        final one of ``hidden`` each; biases and per-head Q/K norms left out). Equals ``sum(p.numel())`` of
        transformers' model for a Llama and a Nemotron-H without biases (tests/model/test_flops.py)."""
        q = (self.hidden * self.q_lora_rank + self.q_lora_rank * self.heads * self.qk_head_dim if self.q_lora_rank
             else self.hidden * self.heads * self.qk_head_dim)
        if self.is_mla:
            kv = (self.hidden * (self.kv_lora_rank + self.qk_rope_head_dim)
                  + self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim))
        else:
            kv = 2 * self.hidden * self.kv_heads * self.head_dim
        gate = self.hidden * self.heads * self.head_dim if self.attn_output_gate else 0
        attn = q + kv + gate + self.heads * self.value_dim * self.hidden
        m = self.mlp_matrices
        moe = self.experts * m * self.expert_width * self.moe_ffn + m * self.hidden * self.shared_ffn \
            + self.hidden * self.experts + (self.hidden if self.shared_gate else 0) \
            + 2 * self.hidden * self.moe_latent
        mlps = sum((moe if self.is_moe_layer(i) else m * self.hidden * self.ffn) if self.has_mlp(kind) else 0
                   for i, kind in enumerate(self.kinds))
        norms = sum(self.layer_norms(kind) for kind in self.kinds) + 1
        return self.attention_layers * attn + self.count(LINEAR) * self.linear_params + mlps \
            + norms * self.hidden + (1 if self.tie_embeddings else 2) * self.vocab * self.hidden


def _element_bytes(dtype: torch.dtype | str) -> int:
    return dtype_bytes(DTYPE_NAMES.get(dtype_key(dtype).lower(), dtype))


PRESETS: dict[str, ModelConfig] = {c.name: c for c in (
    # 1,024 KV bytes per token in fp32; for tests.
    ModelConfig("tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=32, ffn=128, vocab=100352,
                dtype="float32"),
    # The default for replays on a 2-vCPU machine, in fp32 because every CPU computes it natively: a 1,024-token
    # prefill takes ~1.1 s of CPU time on an AVX2-only AMD EPYC, where bf16 is emulated and takes ~5.9 s (15x its
    # ~0.4 s on AVX512-BF16). 8,192 KV bytes/token: 2 MiB per 256-token chunk. --dtype bfloat16 gives a
    # serving-like KV size where the CPU has bf16 instructions. The LM head is tied to the embedding, as small
    # models tie it: 205 MB less to draw and hold (the KV does not depend on it).
    ModelConfig("cpu", layers=8, hidden=512, heads=8, kv_heads=2, head_dim=64, ffn=1408, vocab=100352,
                dtype="float32", tie_embeddings=True),
    ModelConfig("qwen2.5-0.5b", layers=24, hidden=896, heads=14, kv_heads=2, head_dim=64, ffn=4864,
                vocab=151936, rope_theta=1e6, norm_eps=1e-6, context=32768, tie_embeddings=True),
    ModelConfig("llama-3.2-1b", layers=16, hidden=2048, heads=32, kv_heads=8, head_dim=64, ffn=8192,
                vocab=128256, context=131072, tie_embeddings=True),
    ModelConfig("llama-3-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336,
                vocab=128256),
)}


def get_preset(name: str) -> ModelConfig:
    """The preset called ``name``. Raises BadInputError listing the valid names: these presets, the config-only
    ones (:mod:`kvcli.model.configs`, read as checkpoint folders before a name gets here) and a folder."""
    try:
        return PRESETS[name]
    except KeyError:
        from kvcli.model.configs import SOURCES

        raise BadInputError(f"unknown model preset {name!r}; valid: {', '.join(PRESETS)}; config only (shapes, "
                            f"no weights: --measure 0 --payload accounted): {', '.join(SOURCES)}; or a checkpoint "
                            f"folder") from None


def check_dtype(name: str) -> str:
    """``"float32"/"fp32"``, ``"bfloat16"/"bf16"``, ``"float16"/"fp16"`` -> torch's name (``"bfloat16"``), without
    importing torch. Raises BadInputError."""
    try:
        torch_name = DTYPE_NAMES[name.lower()]
    except (KeyError, AttributeError):
        raise BadInputError(f"unknown dtype {name!r}; valid: {', '.join(DTYPE_NAMES)}") from None
    return torch_name


def parse_dtype(name: str):
    """``"float32"/"fp32"``, ``"bfloat16"/"bf16"``, ``"float16"/"fp16"`` -> torch dtype (imports torch). Raises
    BadInputError."""
    return torch_dtype(check_dtype(name))


def model_id_for(preset: str, dtype, seed: int) -> str:
    """The model id a built model carries, e.g. ``"kvcli/cpu@seed0:bf16"``: part of every chunk hash's root, so
    KV of two ids never mixes. Known without building the model (for accounted replays and dry runs)."""
    return f"kvcli/{preset}@seed{seed}:{dtype_short(dtype)}"


@dataclass(frozen=True)
class ModelSpec:
    """What the store needs of a model, without its weights: id, per-token KV shape, dtype (a torch dtype, or
    torch's name for it, e.g. ``"bfloat16"``: :func:`model_spec` gives the name, so nothing imports torch for it;
    :func:`kvcli.units.torch_dtype` turns either into a torch dtype). ``state_shape``: a hybrid model's
    ``(linear_layers, state_elements)``, the state a chunk carries at its end beside its KV; ``()`` without linear
    layers."""

    model_id: str
    kv_shape: tuple[int, int, int, int]  # (attention layers, 2, kv_heads, head_dim)
    dtype: object
    state_shape: tuple[int, ...] = ()


def model_spec(preset: str = "cpu", dtype: str | None = None, seed: int = 0) -> ModelSpec:
    """The spec of ``build_model(preset, dtype, seed=seed)`` (same ``model_id``) from its shapes alone.

    Raises:
        BadInputError: unknown preset or dtype.
    """
    config = get_preset(preset)
    name = check_dtype(dtype if dtype is not None else config.dtype)
    layers, two, heads, _, dim = config.kv_shape(1)
    return ModelSpec(model_id_for(config.name, name, seed), (layers, two, heads, dim), name)
