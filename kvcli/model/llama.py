"""The local Llama-style decoder: ``prefill(token_ids, past_kv) -> (logits, kv)``, in plain torch.

Architecture (Llama 3 / Qwen2 family, without biases): token embedding, ``layers`` blocks of
(RMSNorm -> grouped-query attention with rotary positions -> residual, RMSNorm -> SwiGLU MLP -> residual),
a final RMSNorm and an LM head (the embedding's matrix where the preset ties them, ``tie_embeddings``).
Attention after a cached prefix runs on unmasked fast kernels
(:func:`kvcli.model.attention.cached_prefix_attention`), reading the prefix's KV where it lies (``kv_for="new"``
copies none of it), so a suffix prefill costs what is left to compute. RoPE uses the
"rotate half" layout of Hugging Face's Llama code, so the weights of a real checkpoint would load without
permutation.

Weights are random but seeded (``torch.Generator``, normal with std 0.02, as a fresh Llama is initialised), so the
same preset, seed and dtype always give the same model, logits and KV. Real-model presets (``qwen2.5-0.5b``,
``llama-3-8b``) reproduce those models' shapes, so the KV bytes per token, the FLOPs and the chunk sizes are real;
their outputs are not those models' outputs.

KV layout everywhere in kvcli: ``[layers, 2, kv_heads, tokens, head_dim]`` (index 0 of dim 1 is K, 1 is V), in the
model's dtype, K after rotary embedding (as serving engines cache it).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from kvcli.errors import BadInputError, ModelFailure
from kvcli.model.attention import cached_prefix_attention, prefix_attention
from kvcli.model.presets import ModelConfig, ModelSpec, dtype_short, get_preset, model_id_for, parse_dtype


def token_tensor(token_ids, vocab: int, model_id: str, device: torch.device) -> torch.Tensor:
    """``token_ids`` (numpy array, torch tensor or list) checked and as an int64 ``[n]`` tensor on ``device``.

    Raises:
        BadInputError: not a non-empty 1-D integer sequence, or an id outside ``[0, vocab)``.
    """
    ids = token_ids.detach().cpu().numpy() if isinstance(token_ids, torch.Tensor) else np.asarray(token_ids)
    if ids.ndim != 1 or ids.size == 0:
        raise BadInputError(f"token_ids must be a non-empty 1-D sequence, got shape {ids.shape}")
    if ids.dtype.kind not in "iu":
        raise BadInputError(f"token_ids must be integers, got {ids.dtype}")
    if ids.min() < 0 or ids.max() >= vocab:
        raise BadInputError(f"token ids must be in [0, {vocab}) for {model_id}; got min {ids.min()}, max {ids.max()}")
    return torch.from_numpy(ids.astype(np.int64)).to(device)


def check_past_kv(past_kv: torch.Tensor, config: ModelConfig, dtype: torch.dtype, model_id: str) -> None:
    """Raise ModelFailure unless ``past_kv`` has ``config.kv_shape`` (``[layers, 2, kv_heads, tokens, head_dim]``;
    ``[layers, 1, 1, tokens, latent + rope]`` for latent attention) in ``dtype``."""
    layers, two, heads, _, dim = config.kv_shape(0)
    expected = (layers, two, heads, "tokens", dim)
    if past_kv.dim() != 5 or past_kv.shape[:3] != expected[:3] or past_kv.shape[4] != dim:
        raise ModelFailure(f"past_kv shape {tuple(past_kv.shape)} does not fit {model_id}: expected {expected}")
    if past_kv.dtype != dtype:
        raise ModelFailure(f"past_kv dtype {past_kv.dtype} does not match {model_id} ({dtype})")


def resolve_device(device: str) -> torch.device:
    """``"auto"`` (``"cuda"`` when available, else ``"cpu"``) or any torch device string, checked usable.

    Raises:
        BadInputError: not a device torch knows (``"gpu"``): the spelling is wrong.
        ModelFailure: a device this machine or this torch build cannot use (``"cuda"`` on a CPU-only torch or a
            machine without a GPU): the input is fine, the model cannot run here.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise BadInputError(f"unknown device {device!r} (use auto, cpu, cuda or cuda:N): "
                            f"{str(e).splitlines()[0]}") from None
    try:
        torch.empty(0, device=dev)
    except (RuntimeError, AssertionError) as e:
        cpu_only = dev.type == "cuda" and torch.version.cuda is None
        why = "this torch is a CPU-only build" if cpu_only else str(e).splitlines()[0]
        raise ModelFailure(f"device {device!r} cannot be used here: {why}; run with --device cpu") from None
    return dev


def available_bytes(device: torch.device) -> int:
    """Bytes free on ``device``: ``cudaMemGetInfo`` on a GPU, ``MemAvailable`` of /proc/meminfo on the CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on ``[heads, n, head_dim]`` with ``cos``/``sin`` ``[n, head_dim]`` (float32)."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


@dataclass
class _Block:
    """One decoder block's weights. Q, K, V and gate, up are fused: one GEMM each instead of three and two."""

    attn_norm: torch.Tensor  # [hidden]
    w_qkv: torch.Tensor  # [(heads + 2 * kv_heads) * head_dim, hidden]: Q rows, then K, then V
    w_o: torch.Tensor  # [hidden, heads * head_dim]
    mlp_norm: torch.Tensor  # [hidden]
    w_gate_up: torch.Tensor  # [2 * ffn, hidden]: gate rows, then up
    w_down: torch.Tensor  # [hidden, ffn]


class LocalModel:
    """A seeded Llama-style decoder on one device. Build it with :func:`build_model`.

    Attributes:
        config: the shapes (a preset).
        dtype: weights, activations and KV dtype.
        device: where it runs.
        model_id: names preset, seed and dtype, e.g. ``"kvcli/cpu@seed0:bf16"``; KV of two ids never mixes.
        kv_bytes_per_token: bytes of KV per token in ``dtype``.
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device, seed: int) -> None:
        self.config, self.dtype, self.device, self.seed = config, dtype, device, seed
        self.model_id = model_id_for(config.name, dtype, seed)
        layers, two, heads, _, dim = config.kv_shape(1)
        self.spec = ModelSpec(self.model_id, (layers, two, heads, dim), dtype)
        self.kv_bytes_per_token = config.kv_bytes_per_token(dtype)
        self._masked_attention = False  # True: the old explicit-mask attention (bench/bench_cached_attention.py)
        c = config
        # Drawn on the CPU in float32 in a fixed order, then cast and moved: the same seed gives the same weights
        # whatever the device. std 0.02 as a fresh Llama; norm weights 1.
        gen = torch.Generator().manual_seed(seed)

        def normal(*shape: int) -> torch.Tensor:
            return torch.randn(shape, generator=gen).mul_(0.02).to(device, dtype)

        def ones() -> torch.Tensor:
            return torch.ones(c.hidden, dtype=dtype, device=device)

        self.embed = normal(c.vocab, c.hidden)
        self.blocks = [_Block(ones(), normal((c.heads + 2 * c.kv_heads) * c.head_dim, c.hidden),
                              normal(c.hidden, c.heads * c.head_dim), ones(), normal(2 * c.ffn, c.hidden),
                              normal(c.hidden, c.ffn)) for _ in range(c.layers)]
        self.final_norm = ones()
        self.lm_head = self.embed if c.tie_embeddings else normal(c.vocab, c.hidden)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        self._inv_freq = inv_freq.float().to(device)

    def __repr__(self) -> str:
        return f"LocalModel({self.model_id}, {self.config.params():,} params, {self.device})"

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on CPU); call before reading a timer."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _token_tensor(self, token_ids) -> torch.Tensor:
        return token_tensor(token_ids, self.config.vocab, self.model_id, self.device)

    def _check_past(self, past_kv: torch.Tensor) -> None:
        check_past_kv(past_kv, self.config, self.dtype, self.model_id)

    def prefill(self, token_ids, past_kv: torch.Tensor | None = None, logits_for: str = "last",
                kv_for: str = "all") -> tuple[torch.Tensor, torch.Tensor]:
        """Run the new tokens through the model after an optional cached prefix. Mutates nothing.

        Args:
            token_ids: the ``n >= 1`` NEW token ids, 1-D (numpy uint32 array, torch tensor or list).
            past_kv: KV of the ``past`` tokens before them, ``[layers, 2, kv_heads, past, head_dim]`` in the
                model's dtype, on any device (it is copied to the model's device once); ``None`` for no prefix.
                The new tokens get RoPE positions ``past .. past + n - 1`` and attend to all past tokens.
            logits_for: ``"last"`` for the last token's logits only (what serving needs: the LM head is the
                costliest layer of a small model), ``"all"`` for every new token's (``n * vocab * 4`` bytes:
                1.6 GB for 4,096 tokens of a 100k vocabulary).
            kv_for: ``"all"``: the returned KV covers past and new tokens (``past_kv`` copied beside the new KV
                once the forward is done); ``"new"``: the new tokens' only, so nothing of the prefix is copied (a
                timed suffix prefill: the attention reads ``past_kv`` where it lies, as an engine reads its cache).

        Returns:
            ``(logits, kv)``: logits float32 ``[1, vocab]`` ("last") or ``[n, vocab]`` ("all"), on the model's
            device; kv ``[layers, 2, kv_heads, past + n, head_dim]`` (``kv_for="new"``: ``[layers, 2, kv_heads,
            n, head_dim]``) in the model's dtype, a fresh tensor (``past_kv`` is not modified).

        Raises:
            BadInputError: empty or non-1-D ``token_ids``, an id outside ``[0, vocab)``, a bad ``logits_for`` or
                ``kv_for``.
            ModelFailure: ``past_kv`` has the wrong shape or dtype for this model.
        """
        if logits_for not in ("last", "all"):
            raise BadInputError(f"logits_for must be 'last' or 'all', got {logits_for!r}")
        if kv_for not in ("all", "new"):
            raise BadInputError(f"kv_for must be 'all' or 'new', got {kv_for!r}")
        ids = self._token_tensor(token_ids)
        if past_kv is not None:
            self._check_past(past_kv)
        with torch.inference_mode():
            return self._forward(ids, past_kv, logits_for, kv_for)

    def _forward(self, ids: torch.Tensor, past_kv: torch.Tensor | None, logits_for: str, kv_for: str):
        c, n = self.config, ids.numel()
        past = 0 if past_kv is None else past_kv.shape[3]
        cached = past_kv.to(self.device) if past_kv is not None and past else None  # copied only from elsewhere
        kv = torch.empty(c.kv_shape(n), dtype=self.dtype, device=self.device)  # the new tokens'
        positions = torch.arange(past, past + n, device=self.device)
        angles = positions[:, None].float() * self._inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        q_rows, kv_rows = c.heads * c.head_dim, c.kv_heads * c.head_dim
        x = self.embed[ids]
        for layer, b in enumerate(self.blocks):
            qkv = F.linear(_rmsnorm(x, b.attn_norm, c.norm_eps), b.w_qkv)
            q = _rope(qkv[:, :q_rows].view(n, c.heads, c.head_dim).transpose(0, 1), cos, sin)
            k = qkv[:, q_rows:q_rows + kv_rows].view(n, c.kv_heads, c.head_dim).transpose(0, 1)
            kv[layer, 0] = _rope(k, cos, sin)
            kv[layer, 1] = qkv[:, q_rows + kv_rows:].view(n, c.kv_heads, c.head_dim).transpose(0, 1)
            # Query i (absolute position past + i) sees keys 0 .. past + i: causal, aligned to the lower right.
            if cached is None:
                att = prefix_attention(q, kv[layer, 0], kv[layer, 1], 0, _masked=self._masked_attention)
            elif self._masked_attention:
                att = prefix_attention(q, torch.cat((cached[layer, 0], kv[layer, 0]), dim=1),
                                       torch.cat((cached[layer, 1], kv[layer, 1]), dim=1), past, _masked=True)
            else:
                att = cached_prefix_attention(q, cached[layer, 0], cached[layer, 1], kv[layer, 0], kv[layer, 1])
            x = x + F.linear(att.transpose(0, 1).reshape(n, q_rows), b.w_o)
            gate, up = F.linear(_rmsnorm(x, b.mlp_norm, c.norm_eps), b.w_gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, b.w_down)
        rows = x[-1:] if logits_for == "last" else x
        logits = F.linear(_rmsnorm(rows, self.final_norm, c.norm_eps), self.lm_head).float()
        if cached is not None and kv_for == "all":
            kv = torch.cat((cached, kv), dim=3)
        return logits, kv


def build_model(preset: str = "cpu", dtype: str | None = None, device: str = "auto", seed: int = 0) -> LocalModel:
    """Build a seeded model of a preset's shapes. Building allocates all weights: nothing is built on import.

    Args:
        preset: a name in :data:`PRESETS`.
        dtype: ``"float32"/"fp32"``, ``"bfloat16"/"bf16"``, ``"float16"/"fp16"``; ``None`` for the preset's default.
        device: ``"auto"`` (``"cuda"`` when available, else ``"cpu"``), or any torch device string.
        seed: weight seed; the same (preset, dtype, seed) always gives the same weights.

    Raises:
        BadInputError: unknown preset, dtype or device.
        ModelFailure: the weights would not fit in the device's available memory.
    """
    config = get_preset(preset)
    torch_dtype = parse_dtype(dtype if dtype is not None else config.dtype)
    dev = resolve_device(device)
    # Weights in the target dtype plus one float32 matrix being drawn on the CPU, with 10 % headroom.
    need = config.params() * torch.empty((), dtype=torch_dtype).element_size()
    largest = config.vocab * config.hidden * 4
    available = available_bytes(dev)
    if (need + (largest if dev.type == "cpu" else 0)) * 1.1 > available:
        raise ModelFailure(f"model {preset} in {dtype_short(torch_dtype)} needs about {need / 2**30:.1f} GiB of "
                           f"weights but {dev.type} has {available / 2**30:.1f} GiB available; pick a smaller preset")
    return LocalModel(config, torch_dtype, dev, seed)
