"""Bytes a prefill moves through device memory, per layer, by architecture family: the memory term of
:mod:`kvcli.model.roofline`.

A prefill of ``n`` new tokens after ``c`` cached ones, at ``b`` bytes per element (weights, a linear layer's state
and activations; the KV cache at its own element size, 1 byte for fp8 KV, else ``b``), moves per layer
(:func:`layer_bytes`) its token mixer's traffic, its MLP's weights, its norms (``hidden`` each: two, or one for a
block of one mixer or one MLP, :meth:`~kvcli.model.presets.ModelConfig.layer_norms`) and its activations in and
out (``2 * n * hidden``):

- full attention (grouped-query): the Q, K, V and output weights ``hidden * head_dim * (2 heads + 2 kv_heads)``
  (``3 heads`` with Qwen3-Next's output gate); the cached K and V read, ``c x 2 * kv_heads * head_dim``; the new
  ones written, ``n x`` the same;
- latent attention (MLA): the weights of :meth:`~kvcli.model.presets.ModelConfig.params` (Q LoRA or Q, the
  latent projection ``hidden x (kv_lora_rank + rope)``, the up-projection ``kv_lora_rank x heads x (nope + v)``,
  the output); the latent cache ``(c + n) x (kv_lora_rank + qk_rope_head_dim)``, read and written. The per-head K
  and V the up-projection makes of it are taken to stay on chip (a fused kernel); an engine that writes them out
  moves ``(c + n) x heads x (nope + v)`` more;
- sliding-window attention: as full attention, but the new queries read only the last ``min(c, W - 1)`` cached
  tokens (a query sees itself and the ``W - 1`` before it, transformers' rule: the first new token, at position
  ``c``, reaches back to ``c - W + 1``);
- a linear-attention / Mamba layer: its mixer's weights (``linear_params``,
  :func:`kvcli.model.hfconfig.linear_mixer_params`), the state it resumes from read once (``state_elements``,
  when ``c > 0``) and its state at the end written once; no KV;
- no mixer (Nemotron-H's MLP blocks): nothing beyond the MLP;
- the MLP: dense SwiGLU ``3 * hidden * ffn``; with experts, the router ``hidden * experts``, the shared experts
  ``3 * hidden * shared_ffn`` (and their gate, ``hidden``) and the routed experts the ``n`` tokens touch,
  :func:`expected_experts` of them, ``3 * hidden * moe_ffn`` each (``hidden``: the latent's width, plus its two
  projections ``2 * hidden * latent``, for experts on a latent). Without a gate (Nemotron-H) 2 matrices, not 3;
  none in a block of one mixer (Nemotron-H's Mamba and attention blocks).

The LM head reads its ``vocab x hidden`` weights (:func:`head_bytes`). A dense Llama moves
``hidden * head_dim * (2 heads + 2 kv_heads) + 3 hidden ffn + 2 hidden`` weights, ``(c + n) x 2 kv_heads
head_dim`` KV and ``2 n hidden`` activations per layer: the Llama formula, unchanged.
"""
from __future__ import annotations

import numpy as np

from kvcli.model.presets import FULL, LINEAR, SLIDING, ModelConfig


def expected_experts(experts: int, per_token: int, tokens) -> np.ndarray:
    """Distinct routed experts that ``tokens`` tokens touch in one layer, in expectation:
    ``E * (1 - (1 - k / E) ** t)`` for ``E = experts``, top-``k = per_token`` routing.

    Assumption: each token picks its ``k`` distinct experts uniformly at random, independently of the other tokens
    (the balanced load that routers are trained towards: Switch Transformer's auxiliary loss, Fedus et al. 2022,
    JMLR 23(120), section 2.2; DeepSeek-V3's bias-based balancing, arXiv:2412.19437, section 2.1.2). Then one
    token misses a given expert with probability ``1 - k / E``, all ``t`` miss it with ``(1 - k / E) ** t``, and
    linearity of expectation sums that over the ``E`` experts. For independent tokens this is the most the weights
    can cost: ``1 - (1 - p) ** t`` is concave in an expert's share ``p``, so any skew of the shares (which sum to
    ``k``) touches fewer experts on average. Group-limited routing (DeepSeek's ``topk_group``) is not modelled.
    ``t = 0``: 0; ``t = 1``: ``k``; large ``t``: ``E``.

    Returns:
        float64 of ``tokens``' shape.
    """
    t = np.asarray(tokens, dtype=np.float64)
    return experts * (1.0 - (1.0 - per_token / experts) ** t)


def attention_weight_elements(config: ModelConfig) -> int:
    """Weights of one attention layer's projections (Q, K, V and output, and the output gate's half of Q when
    :attr:`~kvcli.model.presets.ModelConfig.attn_output_gate`; MLA: Q LoRA or Q, latent, up-projection, output),
    elements."""
    g = config
    if g.is_mla:
        q = (g.hidden * g.q_lora_rank + g.q_lora_rank * g.heads * g.qk_head_dim if g.q_lora_rank
             else g.hidden * g.heads * g.qk_head_dim)
        return (q + g.hidden * (g.kv_lora_rank + g.qk_rope_head_dim)
                + g.kv_lora_rank * g.heads * (g.qk_nope_head_dim + g.v_head_dim) + g.heads * g.v_head_dim * g.hidden)
    return g.hidden * g.head_dim * ((3 if g.attn_output_gate else 2) * g.heads + 2 * g.kv_heads)


def mlp_weight_elements(config: ModelConfig, moe: bool, new_tokens) -> np.ndarray:
    """Weights one layer's MLP reads for ``new_tokens`` tokens, elements (module docstring; experts:
    :func:`expected_experts`). float64 of ``new_tokens``' shape."""
    g, n, m = config, np.asarray(new_tokens, dtype=np.float64), config.mlp_matrices
    if not moe:
        return m * g.hidden * g.ffn + 0.0 * n
    fixed = (g.hidden * g.experts + m * g.hidden * g.shared_ffn + (g.hidden if g.shared_gate else 0)
             + 2 * g.hidden * g.moe_latent)
    return fixed + expected_experts(g.experts, g.experts_per_token, n) * m * g.expert_width * g.moe_ffn


def mixer_elements(config: ModelConfig, kind: str, new_tokens, cached_tokens) -> np.ndarray:
    """Elements one layer's token mixer of ``kind`` moves besides its cache (module docstring): its weights, and a
    linear layer's state read and written. float64 of the broadcast shape."""
    g = config
    n, c = np.asarray(new_tokens, dtype=np.float64), np.asarray(cached_tokens, dtype=np.float64)
    if kind == LINEAR:
        return g.linear_params + g.state_elements * ((c > 0) + 1.0) + 0.0 * n  # read when resuming, written
    if kind not in (FULL, SLIDING):
        return 0.0 * (n + c)
    return attention_weight_elements(g) + 0.0 * (n + c)


def kv_elements(config: ModelConfig, kind: str, new_tokens, cached_tokens) -> np.ndarray:
    """Cache elements one attention layer of ``kind`` reads and writes (module docstring): the cached tokens it
    reads (a sliding layer: its window's ``min(c, W - 1)``) and the ``n`` new ones it writes, each
    :attr:`~kvcli.model.presets.ModelConfig.kv_elements_per_layer_token`; 0 for a layer without KV. float64 of the
    broadcast shape."""
    g = config
    n, c = np.asarray(new_tokens, dtype=np.float64), np.asarray(cached_tokens, dtype=np.float64)
    if kind not in (FULL, SLIDING):
        return 0.0 * (n + c)
    read = c if kind == FULL else np.minimum(c, g.sliding_window - 1)
    return (read + n) * g.kv_elements_per_layer_token


def layer_bytes(config: ModelConfig, kind: str, moe: bool, new_tokens, cached_tokens,
                element_bytes: int, kv_element_bytes: int | None = None) -> np.ndarray:
    """Bytes ONE layer of ``kind`` (:data:`~kvcli.model.presets.FULL`, ``SLIDING``, ``LINEAR``, ``NO_MIXER``),
    with experts when ``moe``, moves in a prefill of ``new_tokens`` after ``cached_tokens`` (numpy broadcasting):
    mixer (:func:`mixer_elements`) + MLP (:func:`mlp_weight_elements`, when the layer has one) + norms
    (:meth:`~kvcli.model.presets.ModelConfig.layer_norms` of ``hidden``) + activations ``2 * n * hidden``, times
    ``element_bytes``, plus its KV (:func:`kv_elements`) times ``kv_element_bytes`` (the KV
    cache's element size: 1 for fp8 KV, engines' ``--kv-cache-dtype fp8``; None: ``element_bytes``). float64."""
    n = np.asarray(new_tokens, dtype=np.float64)
    mlp = mlp_weight_elements(config, moe, n) if config.has_mlp(kind) else 0.0 * n
    elements = (mixer_elements(config, kind, n, cached_tokens) + mlp
                + config.layer_norms(kind) * config.hidden + 2.0 * n * config.hidden)
    kv_bytes = element_bytes if kv_element_bytes is None else kv_element_bytes
    return elements * element_bytes + kv_elements(config, kind, n, cached_tokens) * kv_bytes


def head_bytes(config: ModelConfig, element_bytes: int) -> int:
    """Bytes the LM head reads: its ``vocab x hidden`` weights."""
    return config.vocab * config.hidden * element_bytes
