"""Attention of new tokens after a cached prefix, on fast kernels: ``prefix_attention(q, k, v) -> out``.

The problem. New query ``i`` (absolute position ``past + i``) must see keys ``0 .. past + i``: a causal mask aligned
to the lower right. PyTorch's ``is_causal=True`` is aligned to the upper left, so a cached prefix used to need an
explicit mask (``torch.nn.attention.bias.causal_lower_right``). On the CPU that mask is materialized and the
flash kernel then computes and masks every ``new x (past + new)`` score, instead of skipping the blocks above the
diagonal: a suffix prefill did more attention work than a full prefill of the whole prompt.

The fix (CPU). Split the keys in two and run the fast kernel, without a mask, on each:

- ``A``: all ``new`` queries over the ``past`` cached keys, unmasked (every cached key is visible to every query);
- ``B``: the ``new`` queries over the ``new`` keys, ``is_causal=True`` (a square block: upper left = lower right,
  so the kernel skips the blocks above the diagonal);

then merge the two partial softmaxes exactly with their log-sum-exps. For one query row with scores ``s_j``, split
into the key sets ``A`` and ``B``, let ``L_X = log sum_{j in X} exp(s_j)`` and ``o_X = sum_{j in X} exp(s_j - L_X) v_j``
(the attention output over ``X`` alone). Then ``L = log(exp(L_A) + exp(L_B))`` and::

    out = exp(L_A - L) * o_A + exp(L_B - L) * o_B

which is softmax attention over ``A u B`` exactly (no approximation). This is the rescaling step of the online
softmax (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax", arXiv:1805.02867), as used across
key blocks by FlashAttention-2 (Dao 2023, arXiv:2307.08691, section 3.1) and across key splits by Flash-Decoding's
"split-K" reduction (Dao, Haziza, Massa, Sizov 2023). The work done is ``new * past`` pairs for ``A`` plus about
``new**2 / 2`` for ``B``, the exact causal count (:func:`kvcli.model.flops.attention_pairs`), down from
``new * (past + new)`` for the masked kernel.

Each part's ``L`` comes from ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu``, the kernel that
``F.scaled_dot_product_attention`` itself runs on the CPU; it returns ``(output, logsumexp)`` (logsumexp float32,
``[batch, heads, rows]``) and handles grouped-query attention (fewer K/V heads) natively. It is a private ATen op:
if it is missing, or on other devices, :func:`prefix_attention` uses ``F.scaled_dot_product_attention`` with
``causal_lower_right``, which on CUDA dispatches to kernels that apply the lower-right mask natively.

Memory: both kernels are flash-style (blocked, ``O(rows)`` extra memory), so no chunking of query rows is needed; the
merge holds two outputs of ``q``'s size in float32.

Why not ``flex_attention``: on this 2-vCPU machine (torch 2.13, one thread, 4 heads / 2 KV heads / head_dim 32,
4,096 new after 4,096 cached) the compiled flex kernel took 0.24 s against 0.17 s for the split, after a 17 s
compile and a 1.3 s block-mask build per shape; uncompiled, it materializes the scores (5.6 s). It also needs a C++
compiler at run time.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_tokens: int | None = None,
                     scale: float | None = None, *, _masked: bool = False) -> torch.Tensor:
    """Softmax attention of ``new`` queries that follow ``past`` cached tokens (causal, aligned to the lower right).

    Query ``i`` (absolute position ``past + i``) attends to keys ``0 .. past + i``. Equivalent to
    ``F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(new, past + new), enable_gqa=True)``,
    computed on unmasked fast kernels (module docstring: the split and the log-sum-exp merge). Mutates nothing.

    Args:
        q: queries ``[q_heads, new, head_dim]`` or ``[batch, q_heads, new, head_dim]``, ``new >= 1``.
        k: keys ``[kv_heads, past + new, head_dim]`` (or with the batch dim), after rotary embedding; the first
            ``past`` rows are the cached prefix. ``q_heads`` must be a multiple of ``kv_heads`` (grouped-query
            attention: query head ``h`` uses K/V head ``h // (q_heads // kv_heads)``).
        v: values ``[kv_heads, past + new, v_dim]`` (or with the batch dim): ``v_dim`` may differ from ``head_dim``
            (latent attention: DeepSeek-V3's 128 value dims against 192 query/key dims).
        past_tokens: ``past``; ``None`` for ``k.shape[-2] - new`` (what a Hugging Face attention function gets:
            its key holds the cache and the new tokens).
        scale: score scale; ``None`` for ``1 / sqrt(head_dim)``.
        _masked: use an explicit boolean mask, on every device (kvcli's attention before this module; for
            benchmarks and tests only).

    Returns:
        ``[q_heads, new, v_dim]`` (or with the batch dim) in ``q``'s dtype, on ``q``'s device.

    Raises:
        ValueError: shapes that do not fit together (ranks, head counts, ``past + new != k.shape[-2]``).
    """
    unbatched = q.dim() == 3
    if unbatched:
        q, k, v = q[None], k[None], v[None]
    _check(q, k, v)
    new, total = q.shape[-2], k.shape[-2]
    past = total - new if past_tokens is None else past_tokens
    if past < 0 or past + new != total:
        raise ValueError(f"past_tokens {past} + new {new} must equal the key length {total}")
    v_dim = v.shape[-1]
    if v_dim < k.shape[-1]:  # the flash kernels need one head size: zero value columns change no weight
        v = F.pad(v, (0, k.shape[-1] - v_dim))
    out = _attend(q, k, v, past, scale, _masked)[..., :v_dim]
    return out[0] if unbatched else out


def cached_prefix_attention(q: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor, new_k: torch.Tensor,
                            new_v: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """:func:`prefix_attention` with the cached prefix's keys and values apart from the new tokens': the prefix is
    read where it lies, never copied beside the new keys (on the CPU both parts go straight to the split's two
    kernels, as a serving engine's attention reads its paged cache in place; elsewhere, or without the private CPU
    kernel, the two are concatenated first). Mutates nothing.

    Args:
        q: ``[q_heads, new, head_dim]`` or ``[batch, q_heads, new, head_dim]``, ``new >= 1``.
        past_k, past_v: ``[kv_heads, past, head_dim]`` / ``[kv_heads, past, v_dim]`` (or with the batch dim),
            ``past >= 1``, after rotary embedding. new_k, new_v: the same for the ``new`` tokens.
        scale: score scale; ``None`` for ``1 / sqrt(head_dim)``.

    Returns:
        ``[q_heads, new, v_dim]`` (or with the batch dim): query ``i`` attends the ``past`` keys and new keys
        ``0 .. i``.

    Raises:
        ValueError: shapes that do not fit together, or ``past == 0``.
    """
    unbatched = q.dim() == 3
    if unbatched:
        q, past_k, past_v, new_k, new_v = q[None], past_k[None], past_v[None], new_k[None], new_v[None]
    _check(q, past_k, past_v)
    _check(q, new_k, new_v)
    if past_k.shape[-2] == 0 or new_k.shape[-2] != q.shape[-2]:
        raise ValueError(f"expected past keys and one new key per query, got {past_k.shape[-2]} past and "
                         f"{new_k.shape[-2]} new keys for {q.shape[-2]} queries")
    v_dim = past_v.shape[-1]
    if q.device.type != "cpu" or _CPU_FLASH is None or v_dim != q.shape[-1]:
        out = prefix_attention(q, torch.cat((past_k, new_k), dim=-2), torch.cat((past_v, new_v), dim=-2),
                               past_k.shape[-2], scale)
    else:
        out = _merged(q, past_k, past_v, new_k, new_v, scale)
    return out[0] if unbatched else out


def _merged(q, past_k, past_v, new_k, new_v, scale: float | None) -> torch.Tensor:
    """The split's two CPU flash kernels (cached keys unmasked, new keys causal) merged by their log-sum-exps."""
    assert _CPU_FLASH is not None, "callers check for the CPU flash kernel"
    out_a, lse_a = _CPU_FLASH(q, past_k, past_v, scale=scale)
    out_b, lse_b = _CPU_FLASH(q, new_k, new_v, is_causal=True, scale=scale)
    # exp(L_A - L) with L = logaddexp(L_A, L_B) is sigmoid(L_A - L_B): one op, no overflow. Both L are finite: every
    # row sees all past keys in A and at least its own key in B.
    w_a = torch.sigmoid(lse_a - lse_b).unsqueeze(-1)
    return torch.lerp(out_b.float(), out_a.float(), w_a).to(q.dtype)


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"expected q [batch, q_heads, new, head_dim], k [batch, kv_heads, tokens, head_dim] and v "
                         f"[batch, kv_heads, tokens, v_dim] "
                         f"(or all without batch), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1] or q.shape[1] % k.shape[1]:
        raise ValueError(f"q {tuple(q.shape)} does not fit k {tuple(k.shape)}: batch and head_dim must match and "
                         f"q_heads must be a multiple of kv_heads")
    if q.shape[-2] == 0:
        raise ValueError("q has no rows (new tokens)")


def _attend(q, k, v, past: int, scale: float | None, masked: bool) -> torch.Tensor:
    new, total = q.shape[-2], k.shape[-2]
    if past == 0 or new == 1:
        # No prefix: one causal square. One row: it sees every key, no mask at all.
        return F.scaled_dot_product_attention(q, k, v, is_causal=new > 1 and past == 0, scale=scale,
                                              enable_gqa=True)
    if masked:  # kvcli's attention before the split: an explicit boolean mask
        mask = torch.arange(total, device=q.device)[None, :] <= torch.arange(past, total, device=q.device)[:, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    if q.device.type != "cpu" or _CPU_FLASH is None:
        # imported here: torch.nn.attention.bias loads torch._dynamo (seconds), which the CPU path never needs
        from torch.nn.attention.bias import causal_lower_right

        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(new, total), scale=scale,
                                              enable_gqa=True)
    return _merged(q, k[:, :, :past], v[:, :, :past], k[:, :, past:], v[:, :, past:], scale)


def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None,
                     window: int | None = None, sinks: torch.Tensor | None = None,
                     softcap: float | None = None) -> torch.Tensor:
    """Attention of ``new`` queries after ``past`` cached tokens with the options of today's models, computed
    directly (scores materialized in float32: for small models and for checking): query ``i`` (absolute position
    ``past + i``) attends keys ``past + i - window + 1 .. past + i`` (transformers' sliding-window rule; all
    earlier keys when ``window`` is None); ``softcap`` caps scores as ``softcap * tanh(s / softcap)`` (Gemma 2);
    ``sinks`` adds one learned logit per head to each softmax's denominator, with no value (gpt-oss's attention
    sinks, transformers' ``s_aux``). Mutates nothing.

    Args:
        q: ``[batch, q_heads, new, head_dim]``. k: ``[batch, kv_heads, past + new, head_dim]``. v: ``[batch,
            kv_heads, past + new, v_dim]``. sinks: ``[q_heads]`` or None. scale: None for ``head_dim ** -0.5``.

    Returns:
        ``[batch, q_heads, new, v_dim]`` in ``q``'s dtype.

    Raises:
        ValueError: shapes that do not fit together.
    """
    _check(q, k, v)
    new, total = q.shape[-2], k.shape[-2]
    groups = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(groups, dim=1)
    vf = v.float().repeat_interleave(groups, dim=1)
    scores = q.float() @ kf.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    rows = torch.arange(total - new, total, device=q.device)[:, None]
    cols = torch.arange(total, device=q.device)[None, :]
    visible = cols <= rows
    if window is not None:
        visible &= cols > rows - window
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        sink = sinks.float().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat((scores, sink), dim=-1)
    weights = torch.softmax(scores, dim=-1)[..., :total]
    return (weights @ vf).to(q.dtype)

