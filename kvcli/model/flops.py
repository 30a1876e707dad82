"""Exact prefill FLOPs from a model's shapes: ``prefill_flops(config, new_tokens, cached_tokens)``.

Accounting: every matrix multiply of an ``[m, k]`` by a ``[k, n]`` matrix costs ``2 * m * k * n`` FLOPs (one
multiply-add is 2 FLOPs), the standard "2 x parameters x tokens" accounting of Kaplan et al. 2020, "Scaling Laws
for Neural Language Models" (arXiv:2001.08361), Table 1, and of Hoffmann et al. 2022 (Chinchilla, arXiv:2203.15556),
Appendix F. As there, only matrix multiplies count: embeddings (a gather) cost 0, and norms, rotary embedding,
softmax, SiLU and residual adds (``O(hidden)`` per token, under 1 % of a block) are left out. This is also what
``torch.utils.flop_counter.FlopCounterMode`` counts (``mm``, ``bmm``, convolutions, attention), so the two agree
exactly on kvcli's forward pass and on transformers' for the hybrid families (tests/model/test_flops.py).

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
  experts compute (transformers runs each expert on the tokens routed to it). Experts on a latent
  (``moe_latent``, Nemotron-H): the experts' ``hidden`` is the latent's width, plus ``2 * 2 * hidden * latent``
  for the projections down to it and back;
- the output gate of Qwen3-Next's attention (``Qwen3NextAttention``: ``q_proj`` makes query and gate, ``attn *
  sigmoid(gate)`` before ``o_proj``), in ``"qkv"``: ``2 * hidden * heads * head_dim`` more per token;
- an MLP without gate (Nemotron-H's squared ReLU, ``NemotronHMLP``, and its experts): 2 matrices, not 3; blocks of
  one mixer OR one MLP (Nemotron-H, ``mixer_mlp`` False): a Mamba or attention block has no MLP, an ``mlp`` /
  ``moe`` block nothing else;
- linear-attention / Mamba layers (:func:`linear_channels`), as transformers' torch path computes them (what runs
  without the fla / mamba_ssm kernels, on a CPU) and ``FlopCounterMode`` counts them:

  - ``"linear_proj"``: the input projection(s) and ``out_proj``, ``2 * hidden * (in + out)`` per token;
  - ``"linear_conv"``: the depthwise causal convolution of ``C`` channels and width ``K``, counted by torch as
    ``2 * C * K`` per output position, over ``n + K - 1`` positions without a state (``F.conv1d`` pads ``K - 1``
    on both sides), ``n + 2K - 1`` after a cached prefix (the ``K`` columns of conv state come first), ``2`` for
    one token after a prefix (``causal_conv1d_update``);
  - ``"linear_scan"``: the chunked scan's matrix products over ``m = ceil(n / Q)`` chunks of ``Q`` tokens
    (``linear_chunk``; the last chunk padded). Gated DeltaNet (``torch_chunk_gated_delta_rule``), per chunk and
    value head, with key dim ``dk`` and value dim ``dv``: ``k_beta @ k^T`` and ``q @ k^T`` ``2 * 2 * Q * Q * dk``,
    the reads of the state ``2 * 2 * Q * dk * dv``, ``attn @ v_new`` ``2 * Q * Q * dv``, the state update
    ``2 * dk * Q * dv``. Mamba-2 (``mamba2_chunk_scan``'s einsums), with ``H`` heads of ``P`` dims and state size
    ``N``: ``2 * H * (m * (Q*Q*N + Q*Q*P + 2*Q*P*N) + (m + 1)**2 * P * N)`` (C.B, its product with x, the chunk
    states, the state passing between the ``m + 1`` chunk boundaries, and C times the states). One token after
    a prefix takes the recurrent step: Gated DeltaNet's is elementwise (0), Mamba-2's ``2 * H * P * N`` (the
    ``bmm`` of ``mamba2_selective_state_update``).

  Left out, as the counter leaves them out: the gates and decays (sigmoid, softplus, exp), the gated norms, the
  D skip, the padding's elementwise work, and the Gated DeltaNet's two unit-triangular solves per chunk and head
  (``torch.linalg.solve_triangular``, about ``Q * Q * (dk + dv)`` multiply-adds, which FlopCounterMode does not
  count). Jamba's Mamba mixer (``linear_mixer`` ``""``) counts 0: a lower bound.

Saved prefill FLOPs of a cache hit of ``c`` tokens on a prompt of ``p``: ``prefill_flops(cfg, p, 0) -
prefill_flops(cfg, p - c, c)`` (:func:`saved_prefill_flops`).
"""
from __future__ import annotations

from typing import cast

import numpy as np

from kvcli.errors import BadInputError
from kvcli.model.presets import FULL, GATED_DELTANET, LINEAR, MAMBA2, SLIDING, ModelConfig


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
        ``{"qkv", "out_proj", "mlp", "attention", "linear_proj", "linear_conv", "linear_scan", "lm_head"}`` ->
        FLOPs summed over layers (the three ``linear_*`` parts: the linear mixers'), float64 arrays of the
        broadcast shape (exact integers below ``2**53`` = 9.0e15; float64 so that sums over a trace cannot
        overflow).

    Raises:
        BadInputError: a negative count or a bad ``logits_for``.
    """
    if logits_for not in ("last", "all"):
        raise BadInputError(f"logits_for must be 'last' or 'all', got {logits_for!r}")
    n, c = _counts(new_tokens, cached_tokens)
    out = {part: 0.0 * n for part in _PARTS}
    for kind, moe, count in config.layer_classes():
        for part, flops in _layer_parts(config, kind, moe, n, c).items():
            out[part] = out[part] + count * flops
    out["lm_head"] = lm_head_flops(config, n, logits_for)
    return {k: np.broadcast_to(v, np.broadcast(n, c).shape).copy() for k, v in out.items()}


def layer_flops(config: ModelConfig, kind: str, moe: bool, new_tokens, cached_tokens=0) -> np.ndarray:
    """FLOPs of ONE layer of ``kind`` (:data:`~kvcli.model.presets.FULL`, ``SLIDING``, ``LINEAR``, ``NO_MIXER``),
    with experts when ``moe``, for a prefill of ``new_tokens`` after ``cached_tokens``: its share of
    :func:`prefill_flops_breakdown` (QKV, output, MLP, attention, or a linear mixer's projections, convolution
    and scan). Vectorized; float64.

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


_PARTS = ("qkv", "out_proj", "mlp", "attention", "linear_proj", "linear_conv", "linear_scan")


def _layer_parts(g: ModelConfig, kind: str, moe: bool, n: np.ndarray, c: np.ndarray) -> dict[str, np.ndarray]:
    out = {part: 0.0 * (n + c) for part in _PARTS}
    out["mlp"] = _mlp_flops(g, moe) * n if g.has_mlp(kind) else 0.0 * n
    if kind == LINEAR:
        out.update(_linear_parts(g, n, c))
        return out
    if kind == FULL:
        pairs = attention_pairs(n, c)
    elif kind == SLIDING:
        pairs = window_pairs(n, c, g.sliding_window)
    else:  # no token mixer
        return out
    out.update(qkv=_qkv_flops(g, n, c), out_proj=2.0 * g.heads * g.value_dim * g.hidden * n,
               attention=2.0 * g.heads * (g.qk_head_dim + g.value_dim) * pairs)
    return out


def _qkv_flops(g: ModelConfig, n: np.ndarray, c: np.ndarray) -> np.ndarray:
    if not g.is_mla:
        gate = g.heads if g.attn_output_gate else 0  # the output gate: Q projection of twice the width
        return 2.0 * g.hidden * (g.heads + gate + 2 * g.kv_heads) * g.head_dim * n
    q = (2.0 * g.hidden * g.q_lora_rank + 2.0 * g.q_lora_rank * g.heads * g.qk_head_dim if g.q_lora_rank
         else 2.0 * g.hidden * g.heads * g.qk_head_dim)
    latent = 2.0 * g.hidden * (g.kv_lora_rank + g.qk_rope_head_dim)
    up = 2.0 * g.kv_lora_rank * g.heads * (g.qk_nope_head_dim + g.v_head_dim)
    return (q + latent) * n + up * np.where(n > 0, n + c, 0.0)  # no forward, no expansion


def _mlp_flops(g: ModelConfig, moe: bool) -> float:
    m = g.mlp_matrices
    if not moe:
        return 2.0 * m * g.hidden * g.ffn
    return (2.0 * g.hidden * g.experts + 2.0 * m * g.expert_width * g.moe_ffn * g.experts_per_token
            + 2.0 * m * g.hidden * g.shared_ffn + (2.0 * g.hidden if g.shared_gate else 0.0)
            + 2.0 * 2 * g.hidden * g.moe_latent)


def linear_channels(config: ModelConfig) -> tuple[int, int, int]:
    """``(in_proj outputs, out_proj inputs, conv channels)`` of one linear mixer (:attr:`~kvcli.model.presets.
    ModelConfig.linear_mixer`), per token: Gated DeltaNet ``(2 Dk + 2 Dv + 2 value_heads, Dv, 2 Dk + Dv)`` with
    ``Dk = key_heads * key_dim``, ``Dv = value_heads * value_dim`` (``in_proj_qkvz`` and ``in_proj_ba``); Mamba-2
    ``(I + C + heads, I, C)`` with ``I = heads * head_dim``, ``C = I + 2 groups state`` (``in_proj``: gate, x B C,
    dt); ``(0, 0, 0)`` for a mixer not counted."""
    g = config
    if g.linear_mixer == GATED_DELTANET:
        dk, dv = g.linear_key_heads * g.linear_key_dim, g.linear_heads * g.linear_head_dim
        return 2 * dk + 2 * dv + 2 * g.linear_heads, dv, 2 * dk + dv
    if g.linear_mixer == MAMBA2:
        inner = g.linear_heads * g.linear_head_dim
        conv = inner + 2 * g.linear_key_heads * g.linear_key_dim
        return inner + conv + g.linear_heads, inner, conv
    return 0, 0, 0


def _linear_parts(g: ModelConfig, n: np.ndarray, c: np.ndarray) -> dict[str, np.ndarray]:
    proj_in, proj_out, channels = linear_channels(g)
    k, q = g.linear_conv_kernel, g.linear_chunk
    step = (c > 0) & (n == 1)  # one token resumed from a state: the recurrent step, not the chunked scan
    # the causal conv's output length: the new tokens and K - 1 padded both sides (no state); after the K-token
    # state, K + n inputs; one stepped token: K + 1 inputs, no padding, 2 outputs
    length = np.where(n == 0, 0.0, np.where(step, 2.0, np.where(c > 0, n + 2 * k - 1, n + k - 1)))
    chunks = np.ceil(n / q) if q else 0.0 * n
    h, v, kd = g.linear_heads, g.linear_head_dim, g.linear_key_dim
    if g.linear_mixer == GATED_DELTANET:
        per_chunk = 2.0 * h * q * (2 * q * kd + 3 * kd * v + q * v)
        scan = np.where(step, 0.0, chunks * per_chunk)
    elif g.linear_mixer == MAMBA2:
        chunked = 2.0 * h * (chunks * (q * q * kd + q * q * v + 2 * q * v * kd) + (chunks + 1) ** 2 * v * kd)
        scan = np.where(step, 2.0 * h * v * kd, np.where(n > 0, chunked, 0.0))
    else:
        scan = 0.0 * n
    return {"linear_proj": 2.0 * g.hidden * (proj_in + proj_out) * n, "linear_conv": 2.0 * channels * k * length,
            "linear_scan": scan}


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
