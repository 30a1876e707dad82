"""Exact prefill FLOPs from a model's shapes: ``prefill_flops(config, new_tokens, cached_tokens)``.

Accounting: every matrix multiply of an ``[m, k]`` by a ``[k, n]`` matrix costs ``2 * m * k * n`` FLOPs (one
multiply-add is 2 FLOPs), the standard "2 x parameters x tokens" accounting of Kaplan et al. 2020, "Scaling Laws
for Neural Language Models" (arXiv:2001.08361), Table 1, and of Hoffmann et al. 2022 (Chinchilla, arXiv:2203.15556),
Appendix F. As there, only matrix multiplies count: embeddings (a gather) cost 0, and norms, rotary embedding,
softmax, SiLU and residual adds (``O(hidden)`` per token, under 1 % of a block) are left out. This is also what
``torch.utils.flop_counter.FlopCounterMode`` counts (``mm``, ``bmm``, attention), so the two agree exactly on
kvcli's forward pass (tests/test_flops.py).

Per new token, for a Llama-style decoder (:class:`~kvcli.model.presets.ModelConfig`: ``layers``, ``hidden``,
``heads``, ``kv_heads``, ``head_dim``, ``ffn``, ``vocab``):

- Q, K, V projections: ``2 * hidden * (heads + 2 * kv_heads) * head_dim`` per layer (grouped-query attention: K and
  V have ``kv_heads`` heads);
- output projection: ``2 * heads * head_dim * hidden`` per layer;
- SwiGLU MLP, three matrices (gate, up, down): ``2 * 3 * hidden * ffn`` per layer;
- attention: per (query, key) pair and query head, ``2 * head_dim`` for the score ``q . k`` and ``2 * head_dim``
  for the weighted sum of values, so ``4 * heads * head_dim`` per pair per layer. Causal attention after ``c``
  cached tokens: new token ``i`` (0-based) sees ``c + i + 1`` keys, so ``n`` new tokens make
  ``n * c + n * (n + 1) / 2`` pairs (:func:`attention_pairs`), counted exactly rather than Kaplan's
  ``n_ctx / 2`` average;
- LM head: ``2 * hidden * vocab`` per row of logits computed: 1 row for a prefill that returns the last token's
  logits (what serving needs), ``n`` for all.

Other architectures (the fields of :class:`~kvcli.model.presets.ModelConfig`), each as its transformers forward
computes it:

- sliding-window layers: new token ``i`` sees ``min(c + i + 1, W)`` keys (:func:`window_pairs`);
- latent attention (MLA, DeepSeek-V2/V3 ``DeepseekV3Attention``), in ``"qkv"``: queries ``2 * hidden * q_lora_rank
  + 2 * q_lora_rank * heads * (nope + rope)`` (or ``2 * hidden * heads * (nope + rope)`` without a Q LoRA), the
  latent ``2 * hidden * (kv_lora_rank + rope)`` per new token, and the up-projection of the latent to per-head K
  and V, ``2 * kv_lora_rank * heads * (nope + v)``, per token of the past AND of the new ones (the cache holds
  the latent, so every prefill expands the cached prefix again, as vLLM's MLA prefill does for its context);
  attention ``2 * heads * (nope + rope + v)`` per pair; output ``2 * heads * v * hidden``;
- mixture of experts, in ``"mlp"``, per token of an expert layer: the router ``2 * hidden * experts``, the
  ``experts_per_token`` routed experts ``2 * 3 * hidden * moe_ffn`` each, the shared experts
  ``2 * 3 * hidden * shared_ffn`` and their gate ``2 * hidden`` (when the model has one): only the active
  experts compute (transformers runs each expert on the tokens routed to it);
- linear-attention / Mamba layers: their MLP counts, their mixer does not (a lower bound: the projections and the
  scan of a Gated DeltaNet or Mamba block are left out; Nemotron-H's blocks, one mixer or one MLP each, are
  counted as if every block had an MLP). Exact for every other family above.

Saved prefill FLOPs of a cache hit of ``c`` tokens on a prompt of ``p``: ``prefill_flops(cfg, p, 0) -
prefill_flops(cfg, p - c, c)`` (:func:`saved_prefill_flops`).
"""
from __future__ import annotations

from typing import cast

import numpy as np

from kvcli.errors import BadInputError
from kvcli.model.presets import FULL, SLIDING, ModelConfig


def _counts(new_tokens, cached_tokens) -> tuple[np.ndarray, np.ndarray]:
    n = np.asarray(new_tokens, dtype=np.float64)
    c = np.asarray(cached_tokens, dtype=np.float64)
    if (n < 0).any() or (c < 0).any():
        raise BadInputError("token counts must be >= 0")
    return n, c


def attention_pairs(new_tokens, cached_tokens=0) -> np.ndarray:
    """(query, key) pairs of causal attention for ``new_tokens`` after ``cached_tokens``, per head and layer:
    ``n * c + n * (n + 1) / 2`` (new token ``i`` sees ``c + i + 1`` keys). Vectorized (numpy broadcasting);
    float64, exact below ``2**53``.

    Raises:
        BadInputError: a negative count.
    """
    n, c = _counts(new_tokens, cached_tokens)
    return n * c + n * (n + 1) / 2


def window_pairs(new_tokens, cached_tokens, window: int) -> np.ndarray:
    """(query, key) pairs of sliding-window attention for ``new_tokens`` after ``cached_tokens``, per head and
    layer: new token ``i`` sees ``min(c + i + 1, window)`` keys, so ``S(c + n) - S(c)`` with ``S(m) = sum_{k<=m}
    min(k, W)`` (``m (m + 1) / 2`` up to ``W``, then ``W`` more per token). Vectorized; float64.

    Raises:
        BadInputError: a negative count.
    """
    n, c = _counts(new_tokens, cached_tokens)
    w = float(window)

    def upto(m: np.ndarray) -> np.ndarray:
        return np.where(m <= w, m * (m + 1) / 2, w * (w + 1) / 2 + (m - w) * w)

    return upto(c + n) - upto(c)


def prefill_flops_breakdown(config: ModelConfig, new_tokens, cached_tokens=0,
                            logits_for: str = "last") -> dict[str, np.ndarray]:
    """FLOPs of a prefill of ``new_tokens`` after ``cached_tokens``, by part (module docstring: the formulas).

    Args:
        config: the model's shapes.
        new_tokens: tokens computed, ``>= 0`` (int or numpy array).
        cached_tokens: tokens before them whose KV is reused, ``>= 0`` (broadcast with ``new_tokens``).
        logits_for: ``"last"`` (one row of logits when ``new_tokens >= 1``) or ``"all"`` (one per new token), as
            :meth:`kvcli.model.llama.LocalModel.prefill`.

    Returns:
        ``{"qkv", "out_proj", "mlp", "attention", "lm_head"}`` -> FLOPs summed over layers, float64 arrays of the
        broadcast shape (exact integers below ``2**53`` = 9.0e15; float64 so that sums over a trace cannot
        overflow).

    Raises:
        BadInputError: a negative count or a bad ``logits_for``.
    """
    if logits_for not in ("last", "all"):
        raise BadInputError(f"logits_for must be 'last' or 'all', got {logits_for!r}")
    n, c = _counts(new_tokens, cached_tokens)
    out = {"qkv": 0.0 * n, "out_proj": 0.0 * n, "mlp": 0.0 * n, "attention": 0.0 * n}
    for kind, moe, count in config.layer_classes():
        for part, flops in _layer_parts(config, kind, moe, n, c).items():
            out[part] = out[part] + count * flops
    out["lm_head"] = lm_head_flops(config, n, logits_for)
    return {k: np.broadcast_to(v, np.broadcast(n, c).shape).copy() for k, v in out.items()}


def layer_flops(config: ModelConfig, kind: str, moe: bool, new_tokens, cached_tokens=0) -> np.ndarray:
    """FLOPs of ONE layer of ``kind`` (:data:`~kvcli.model.presets.FULL`, ``SLIDING``, ``LINEAR``, ``NO_MIXER``),
    with experts when ``moe``, for a prefill of ``new_tokens`` after ``cached_tokens``: its share of
    :func:`prefill_flops_breakdown` (QKV, output, MLP, attention; a linear mixer counts 0). Vectorized; float64.

    Raises:
        BadInputError: a negative count.
    """
    n, c = _counts(new_tokens, cached_tokens)
    return cast(np.ndarray, sum(_layer_parts(config, kind, moe, n, c).values()))


def lm_head_flops(config: ModelConfig, new_tokens, logits_for: str = "last") -> np.ndarray:
    """FLOPs of the LM head: ``2 * hidden * vocab`` per row of logits (one row when ``logits_for`` is
    ``"last"`` and ``new_tokens >= 1``, else one per new token). Vectorized; float64."""
    n = np.asarray(new_tokens, dtype=np.float64)
    return 2.0 * config.hidden * config.vocab * (np.minimum(n, 1) if logits_for == "last" else n)


def _layer_parts(g: ModelConfig, kind: str, moe: bool, n: np.ndarray, c: np.ndarray) -> dict[str, np.ndarray]:
    mlp = _mlp_flops(g, moe) * n
    if kind == FULL:
        pairs = attention_pairs(n, c)
    elif kind == SLIDING:
        pairs = window_pairs(n, c, g.sliding_window)
    else:  # a linear layer or none: its mixer is not counted
        return {"qkv": 0.0 * n, "out_proj": 0.0 * n, "mlp": mlp, "attention": 0.0 * n}
    return {"qkv": _qkv_flops(g, n, c), "out_proj": 2.0 * g.heads * g.value_dim * g.hidden * n, "mlp": mlp,
            "attention": 2.0 * g.heads * (g.qk_head_dim + g.value_dim) * pairs}


def _qkv_flops(g: ModelConfig, n: np.ndarray, c: np.ndarray) -> np.ndarray:
    if not g.is_mla:
        return 2.0 * g.hidden * (g.heads + 2 * g.kv_heads) * g.head_dim * n
    q = (2.0 * g.hidden * g.q_lora_rank + 2.0 * g.q_lora_rank * g.heads * g.qk_head_dim if g.q_lora_rank
         else 2.0 * g.hidden * g.heads * g.qk_head_dim)
    latent = 2.0 * g.hidden * (g.kv_lora_rank + g.qk_rope_head_dim)
    up = 2.0 * g.kv_lora_rank * g.heads * (g.qk_nope_head_dim + g.v_head_dim)
    return (q + latent) * n + up * np.where(n > 0, n + c, 0.0)  # no forward, no expansion


def _mlp_flops(g: ModelConfig, moe: bool) -> float:
    if not moe:
        return 2.0 * 3 * g.hidden * g.ffn
    return (2.0 * g.hidden * g.experts + 2.0 * 3 * g.hidden * g.moe_ffn * g.experts_per_token
            + 2.0 * 3 * g.hidden * g.shared_ffn + (2.0 * g.hidden if g.shared_gate else 0.0))


def prefill_flops(config: ModelConfig, new_tokens, cached_tokens=0, logits_for: str = "last") -> np.ndarray:
    """Total FLOPs of a prefill of ``new_tokens`` after ``cached_tokens``: the sum of
    :func:`prefill_flops_breakdown` (projections, MLP, causal attention pairs, LM head rows; embeddings 0).

    Example: the ``tiny`` preset, 4 new tokens, none cached: 2 layers x (QKV 131,072 + output 65,536 +
    MLP 196,608 + attention 5,120) + LM head 12,845,056 = 13,641,728.

    Returns:
        FLOPs, float64 of the broadcast shape of ``new_tokens`` and ``cached_tokens``.

    Raises:
        BadInputError: a negative count or a bad ``logits_for``.
    """
    # sum() starts from int 0, which mypy keeps in the type; 0 + array is an array
    return cast(np.ndarray, sum(prefill_flops_breakdown(config, new_tokens, cached_tokens, logits_for).values()))


def saved_prefill_flops(config: ModelConfig, prompt_tokens, hit_tokens) -> np.ndarray:
    """FLOPs a cache hit of ``hit_tokens`` saves on a prompt of ``prompt_tokens`` (last-row logits):
    ``prefill_flops(config, prompt, 0) - prefill_flops(config, prompt - hit, hit)``. Vectorized; float64.

    Raises:
        BadInputError: a negative count, or ``hit_tokens > prompt_tokens``.
    """
    p, h = _counts(prompt_tokens, hit_tokens)
    if (h > p).any():
        raise BadInputError("hit_tokens must be <= prompt_tokens")
    return prefill_flops(config, p, 0) - prefill_flops(config, p - h, h)
