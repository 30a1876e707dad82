"""A transformers config read into kvcli's :class:`~kvcli.model.presets.ModelConfig`: what sizes the cache and
the FLOPs of each architecture family.

Read as transformers reads it (the config object ``AutoConfig`` builds, its text config for a multimodal one):

- attention: ``num_attention_heads``, ``num_key_value_heads`` (grouped-query; ``num_attention_heads`` when
  absent), ``head_dim`` (``hidden_size / num_attention_heads`` when absent);
- the layer pattern: ``config.layer_types`` as the config class derives it (Qwen2/3: sliding layers only where
  ``use_sliding_window`` and ``i >= max_window_layers``; gpt-oss: alternating; Gemma 3: five local to one global;
  Qwen3-Next: three linear to one full; Jamba: ``attn_layer_period``), the names mapped by :data:`KINDS`. Mistral
  and Mixtral have no ``layer_types``: ``sliding_window`` set means every layer slides;
- latent attention: ``kv_lora_rank``, ``q_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
  ``v_head_dim`` (DeepSeek-V2/V3, Kimi-K2);
- experts: ``n_routed_experts``/``num_local_experts``/``num_experts``, ``num_experts_per_tok``,
  ``moe_intermediate_size`` (``intermediate_size`` when the model has no other, Mixtral and gpt-oss), shared
  experts ``n_shared_experts x moe_intermediate_size`` (DeepSeek) or ``shared_expert_intermediate_size`` with a
  gate (Qwen2-MoE, Qwen3-Next), the routed experts on a latent of ``moe_latent_size`` (Nemotron-H); dense
  layers: ``first_k_dense_replace`` (DeepSeek), ``mlp_only_layers`` and ``decoder_sparse_step`` (Qwen MoE);
- a linear layer's state: :func:`linear_state_elements`; its mixer's parameters: :func:`linear_mixer_params`; its
  shapes for the FLOPs: :func:`linear_mixer_shapes`;
- blocks of one mixer OR one MLP: a layer pattern with ``mlp`` or ``moe`` entries (Nemotron-H's
  ``layers_block_type``, from ``hybrid_override_pattern``: ``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E``
  experts): its mixer blocks hold no MLP, its ``moe`` blocks are the expert layers (the others dense), the shared
  expert is one MLP of ``moe_shared_expert_intermediate_size``;
- the MLP's matrices: SwiGLU (gate, up, down) except for the model types of :data:`UNGATED_MLP` (up and down);
  an attention output gate (Q projection of twice the width) for those of :data:`OUTPUT_GATE`;
- ``tie_word_embeddings``: the LM head is the embedding's matrix, counted once in the parameters.
"""
from __future__ import annotations

from typing import Any

from kvcli.errors import BadInputError
from kvcli.model.presets import FULL, GATED_DELTANET, LINEAR, MAMBA2, NO_MIXER, SLIDING, ModelConfig

#: transformers' layer-type names (``config.layer_types``, Nemotron-H's ``layers_block_type``, Jamba's
#: ``layers_block_type``) -> kvcli's kinds.
KINDS = {"full_attention": FULL, "attention": FULL, "sliding_attention": SLIDING, "linear_attention": LINEAR,
         "mamba": LINEAR, "mamba2": LINEAR, "mlp": NO_MIXER, "moe": NO_MIXER}


#: ``model_type`` -> the MLP (and every expert) is up and down only, no gate: Nemotron-H's squared-ReLU
#: ``NemotronHMLP`` and ``NemotronHExperts`` (``use_experts_implementation(has_gate=False)``).
UNGATED_MLP = frozenset({"nemotron_h"})
#: ``model_type`` -> the attention output is gated, ``o_proj(attn * sigmoid(gate))`` with ``q_proj`` of ``hidden x
#: 2 heads head_dim`` (transformers' ``Qwen3NextAttention``, and Qwen3.5's, the same module).
OUTPUT_GATE = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"})
#: Block types of a pattern whose blocks are one mixer or one MLP each (Nemotron-H).
_MLP_BLOCKS = frozenset({"mlp", "moe"})
#: Tokens per chunk of transformers' chunked Gated DeltaNet (``torch_chunk_gated_delta_rule``'s default, as the
#: FLA kernels' ``chunk_gated_delta_rule``).
GDN_CHUNK = 64


def _get(config: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return default


def layer_kinds(text: Any) -> tuple[str, ...]:
    """The kind of every layer (:data:`~kvcli.model.presets.FULL`, ``SLIDING``, ``LINEAR``, ``NO_MIXER``) of a
    transformers text config, from ``layer_types`` as the config class derives it (module docstring); ``()`` when
    every layer is full attention.

    Raises:
        BadInputError: a layer type kvcli does not know (the message lists them).
    """
    types = _get(text, "layer_types", "layers_block_type")
    layers = int(text.num_hidden_layers)
    if not types:
        slides = _get(text, "sliding_window") and getattr(text, "use_sliding_window", True)
        types = ["sliding_attention" if slides else "full_attention"] * layers
    unknown = sorted(set(types) - set(KINDS))
    if unknown:
        raise BadInputError(f"layer types {', '.join(unknown)} are not supported (kvcli knows "
                            f"{', '.join(KINDS)})")
    kinds = tuple(KINDS[t] for t in types)
    return () if set(kinds) == {FULL} else kinds


def linear_state_elements(text: Any) -> int:
    """Elements of one linear layer's state for one sequence, as vLLM allocates it
    (vllm/model_executor/layers/mamba/mamba_utils.py, ``MambaStateShapeCalculator``): a convolution state of
    ``conv_kernel - 1`` columns plus the temporal (SSM / recurrent) state.

    - Gated DeltaNet (Qwen3-Next): conv ``(2 * key_heads * key_dim + value_heads * value_dim) x (K - 1)``,
      recurrent ``value_heads x key_dim x value_dim``;
    - Mamba-2 (Nemotron-H, Granite 4, Bamba): with ``I = heads * head_dim``, conv ``(I + 2 * groups * d_state) x
      (K - 1)``, SSM ``heads x head_dim x d_state``;
    - Mamba (Jamba): with ``I = expand * hidden``, conv ``I x (K - 1)``, SSM ``I x d_state``.

    Returns 0 for a config without linear layers' fields.
    """
    kernel = int(_get(text, "linear_conv_kernel_dim", "conv_kernel", "mamba_d_conv", default=4))
    if getattr(text, "linear_key_head_dim", None):
        nk, dk = text.linear_num_key_heads, text.linear_key_head_dim
        nv, dv = text.linear_num_value_heads, text.linear_value_head_dim
        return (2 * nk * dk + nv * dv) * (kernel - 1) + nv * dk * dv
    heads = _get(text, "mamba_num_heads", "mamba_n_heads")
    d_state = int(_get(text, "ssm_state_size", "mamba_d_state", default=0))
    if heads:
        head_dim = int(_get(text, "mamba_head_dim", "mamba_d_head"))
        inner, groups = heads * head_dim, int(_get(text, "n_groups", "mamba_n_groups", default=1))
        return (inner + 2 * groups * d_state) * (kernel - 1) + heads * head_dim * d_state
    expand = _get(text, "mamba_expand", "expand")
    if expand:
        inner = int(expand) * int(text.hidden_size)
        return inner * (kernel - 1) + inner * d_state
    return 0


def linear_mixer_params(text: Any) -> int:
    """Parameters of one linear layer's mixer, as transformers builds it (every weight, bias and per-head vector;
    the layer's norm and MLP are not the mixer's). With ``K`` the convolution's kernel:

    - Gated DeltaNet (``Qwen3NextGatedDeltaNet``), ``Dk = key_heads * key_dim``, ``Dv = value_heads * value_dim``:
      ``in_proj_qkvz`` ``hidden x (2 Dk + 2 Dv)``, ``in_proj_ba`` ``hidden x 2 value_heads``, the depthwise
      convolution ``(2 Dk + Dv) x K`` (no bias), ``dt_bias`` and ``A_log`` ``value_heads`` each, the gated norm
      ``value_dim``, ``out_proj`` ``Dv x hidden``;
    - Mamba-2 (``NemotronHMamba2Mixer``, Granite 4, Bamba), ``I = heads * head_dim``, ``C = I + 2 groups d_state``:
      ``in_proj`` ``hidden x (I + C + heads)``, the convolution ``C x K`` (``+ C`` with ``use_conv_bias``),
      ``dt_bias``, ``A_log``, ``D`` ``heads`` each, the gated norm ``I``, ``out_proj`` ``I x hidden`` (biases
      ``I + C + heads`` and ``hidden`` with ``use_bias``);
    - Mamba (``JambaMambaMixer``), ``I = expand * hidden``, ``R = mamba_dt_rank``: ``in_proj`` ``hidden x 2I``,
      the convolution ``I x K`` (``+ I`` with ``mamba_conv_bias``), ``x_proj`` ``I x (R + 2 d_state)``,
      ``dt_proj`` ``R x I + I``, ``A_log`` ``I x d_state``, ``D`` ``I``, ``out_proj`` ``I x hidden`` (biases
      ``2I`` and ``hidden`` with ``mamba_proj_bias``), norms of ``R``, ``d_state``, ``d_state``.

    Returns 0 for a config without linear layers' fields.
    """
    hidden = int(text.hidden_size)
    kernel = int(_get(text, "linear_conv_kernel_dim", "conv_kernel", "mamba_d_conv", default=4))
    if getattr(text, "linear_key_head_dim", None):
        nv, dv = int(text.linear_num_value_heads), int(text.linear_value_head_dim)
        dk, d_v = int(text.linear_num_key_heads) * int(text.linear_key_head_dim), nv * dv
        return hidden * (2 * dk + 2 * d_v) + hidden * 2 * nv + (2 * dk + d_v) * kernel + 2 * nv + dv + d_v * hidden
    heads = _get(text, "mamba_num_heads", "mamba_n_heads")
    d_state = int(_get(text, "ssm_state_size", "mamba_d_state", default=0))
    if heads:
        inner = int(heads) * int(_get(text, "mamba_head_dim", "mamba_d_head"))
        conv = inner + 2 * int(_get(text, "n_groups", "mamba_n_groups", default=1)) * d_state
        bias = bool(_get(text, "use_bias", "mamba_proj_bias", default=False))
        conv_bias = bool(_get(text, "use_conv_bias", "mamba_conv_bias", default=True))
        projections = hidden * (inner + conv + heads) + inner * hidden + bias * (inner + conv + heads + hidden)
        return projections + conv * (kernel + conv_bias) + 3 * heads + inner
    expand = _get(text, "mamba_expand", "expand")
    if expand:
        inner, rank = int(expand) * hidden, int(text.mamba_dt_rank)
        bias = bool(_get(text, "mamba_proj_bias", default=False))
        conv_bias = bool(_get(text, "mamba_conv_bias", default=True))
        return (hidden * 2 * inner + inner * (kernel + conv_bias) + inner * (rank + 2 * d_state) + rank * inner
                + inner + inner * d_state + inner + inner * hidden + bias * (2 * inner + hidden) + rank + 2 * d_state)
    return 0


def linear_mixer_shapes(text: Any) -> dict[str, Any]:
    """The linear mixer's shapes that set its FLOPs (:class:`~kvcli.model.presets.ModelConfig`'s ``linear_*``
    fields): Gated DeltaNet (``linear_key_head_dim`` set: value heads and dims, key heads and dims, the
    convolution's kernel, chunks of :data:`GDN_CHUNK`) or Mamba-2 (``mamba_num_heads``/``mamba_n_heads`` set:
    heads and head dims, groups and state size, kernel, ``chunk_size``/``mamba_chunk_size``); ``{}`` for another
    (Jamba's Mamba: its mixer's FLOPs are not counted)."""
    kernel = int(_get(text, "linear_conv_kernel_dim", "conv_kernel", "mamba_d_conv", default=4))
    if getattr(text, "linear_key_head_dim", None):
        return {"linear_mixer": GATED_DELTANET, "linear_heads": int(text.linear_num_value_heads),
                "linear_head_dim": int(text.linear_value_head_dim), "linear_key_heads": int(text.linear_num_key_heads),
                "linear_key_dim": int(text.linear_key_head_dim), "linear_conv_kernel": kernel,
                "linear_chunk": GDN_CHUNK}
    heads = _get(text, "mamba_num_heads", "mamba_n_heads")
    if not heads:
        return {}
    return {"linear_mixer": MAMBA2, "linear_heads": int(heads),
            "linear_head_dim": int(_get(text, "mamba_head_dim", "mamba_d_head")),
            "linear_key_heads": int(_get(text, "n_groups", "mamba_n_groups", default=1)),
            "linear_key_dim": int(_get(text, "ssm_state_size", "mamba_d_state")), "linear_conv_kernel": kernel,
            "linear_chunk": int(_get(text, "chunk_size", "mamba_chunk_size", default=256))}


def _block_types(text: Any) -> list[str]:
    return list(_get(text, "layer_types", "layers_block_type", default=()) or ())


def _experts(text: Any) -> dict[str, Any]:
    experts = int(_get(text, "n_routed_experts", "num_local_experts", "num_experts", default=0) or 0)
    layers = int(text.num_hidden_layers)
    blocks = _block_types(text)
    one_per_block = bool(_MLP_BLOCKS & set(blocks))
    if one_per_block and "moe" not in blocks:
        return {}  # a Nemotron-H config carries n_routed_experts even when no block has experts
    if experts <= 1:
        return {}
    moe_ffn = int(_get(text, "moe_intermediate_size", "intermediate_size"))
    if one_per_block:  # one shared MLP of its own width, whatever n_shared_experts says
        shared = int(_get(text, "moe_shared_expert_intermediate_size", default=0) or 0)
        dense = tuple(i for i, block in enumerate(blocks) if block != "moe")
        latent = int(_get(text, "moe_latent_size", default=0) or 0)
    else:
        latent = 0
        shared = int(_get(text, "n_shared_experts", default=0) or 0) * moe_ffn
        shared = shared or int(_get(text, "shared_expert_intermediate_size", default=0) or 0)
        first_dense = int(_get(text, "first_k_dense_replace", default=0))
        step = int(_get(text, "decoder_sparse_step", default=1) or 1)
        only_mlp = set(_get(text, "mlp_only_layers", default=()) or ())
        dense = tuple(i for i in range(layers) if i < first_dense or i in only_mlp or (i + 1) % step)
    return {"experts": experts, "experts_per_token": int(text.num_experts_per_tok), "moe_ffn": moe_ffn,
            "shared_ffn": shared, "shared_gate": bool(getattr(text, "shared_expert_intermediate_size", 0)),
            "dense_layers": dense, "moe_latent": latent}


def _mla(text: Any) -> dict[str, Any]:
    if not getattr(text, "kv_lora_rank", None):
        return {}
    return {"kv_lora_rank": int(text.kv_lora_rank), "q_lora_rank": int(_get(text, "q_lora_rank", default=0)),
            "qk_nope_head_dim": int(text.qk_nope_head_dim), "qk_rope_head_dim": int(text.qk_rope_head_dim),
            "v_head_dim": int(text.v_head_dim)}


def shapes_from_config(name: str, text: Any, dtype: str) -> ModelConfig:
    """The :class:`ModelConfig` called ``name`` of transformers text config ``text`` (module docstring: what is
    read), with default dtype ``dtype`` (torch's name).

    Raises:
        BadInputError: a layer type kvcli does not know; a sliding layer without a window.
    """
    heads = int(text.num_attention_heads)
    rope: dict[str, Any] = getattr(text, "rope_parameters", None) or {}
    theta = float(rope.get("rope_theta") or _get(text, "rope_theta", default=10000.0))
    kinds = layer_kinds(text)
    model_type = str(getattr(text, "model_type", ""))
    return ModelConfig(
        name=name, layers=int(text.num_hidden_layers), hidden=int(text.hidden_size), heads=heads,
        kv_heads=int(_get(text, "num_key_value_heads", default=heads)),
        head_dim=int(_get(text, "head_dim", default=text.hidden_size // heads)),
        ffn=int(_get(text, "intermediate_size", default=0)), vocab=int(text.vocab_size), rope_theta=theta,
        norm_eps=float(_get(text, "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", default=1e-5)),
        dtype=dtype, context=int(_get(text, "max_position_embeddings", default=8192)), layer_types=kinds,
        sliding_window=int(_get(text, "sliding_window", default=0)) if SLIDING in kinds else 0,
        state_elements=linear_state_elements(text) if LINEAR in kinds else 0,
        linear_params=linear_mixer_params(text) if LINEAR in kinds else 0,
        attn_output_gate=model_type in OUTPUT_GATE, gated_mlp=model_type not in UNGATED_MLP,
        mixer_mlp=not (_MLP_BLOCKS & set(_block_types(text))),
        tie_embeddings=bool(_get(text, "tie_word_embeddings", default=False)),
        **(linear_mixer_shapes(text) if LINEAR in kinds else {}), **_mla(text), **_experts(text))
