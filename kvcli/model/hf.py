"""A local Hugging Face checkpoint as kvcli's model: ``prefill(token_ids, past_kv) -> (logits, kv)``.

The architecture and weights are transformers' own (``AutoModelForCausalLM.from_pretrained(folder,
local_files_only=True)``), on ``--device``, in ``--dtype`` or the checkpoint's. The interface is
:class:`kvcli.model.llama.LocalModel`'s: ``.prefill``, ``.spec``, ``.config`` (shapes, ``.vocab``),
``.model_id``, ``.dtype``, ``.device``, ``.kv_bytes_per_token``, ``.synchronize()``.

A cached prefix goes through the library's cache object: ``past_kv`` ``[layers, 2, kv_heads, past, head_dim]``
becomes a ``DynamicCache`` (one K and one V ``[1, kv_heads, past, head_dim]`` per layer; K after rotary
embedding, as transformers and serving engines cache it), the new tokens get positions ``past .. past + n - 1``
from the cache's length, and the returned ``kv`` is read back from that cache (past and new tokens). Every layer
keeps every token, sliding ones too (a full ``DynamicLayer`` each): the stored chunks serve any later hit length.

Latent attention (DeepSeek-V2/V3): transformers' ``DeepseekV3Attention`` caches, per layer, the normalized latent
``[1, 1, tokens, kv_lora_rank]`` as "keys" and the RoPE'd shared key ``[1, 1, tokens, qk_rope_head_dim]`` as
"values", and expands them to per-head K and V (``kv_b_proj``) at every forward. kvcli's payload is the two
concatenated, ``[layers, 1, 1, tokens, kv_lora_rank + qk_rope_head_dim]``: the bytes vLLM's MLA cache holds. What
differs from an engine: the expansion runs on the cached tokens at every prefill (vLLM's prefill does so for its
context too; its decode absorbs ``kv_b_proj`` into the query instead), and the latent is stored in the model's
dtype.

Attention is kvcli's, registered with transformers' ``AttentionInterface`` as ``"kvcli_prefix"`` (the model is
loaded with ``attn_implementation="kvcli_prefix"``). transformers builds no mask for an implementation it has
no mask function for, so the registered function gets queries of the ``n`` new tokens and keys of all
``past + n`` tokens of one sequence, and applies the causal rule itself: new token ``i`` attends keys
``0 .. past + i``. It calls :func:`prefix_attention` (looked up at every call, so tests can spy on it), or, for a
layer with a sliding window, attention sinks (gpt-oss) or soft-capping, :func:`kvcli.model.attention.
banded_attention`, which applies the window (keys ``past + i - W + 1 .. past + i``) itself.
"""
from __future__ import annotations

import inspect

import torch

from kvcli.errors import BadInputError, ModelFailure
from kvcli.model import attention
from kvcli.model.checkpoint import Checkpoint, read_checkpoint
from kvcli.model.hf_offline import one_line, transformers
from kvcli.model.llama import available_bytes, check_past_kv, resolve_device, token_tensor
from kvcli.model.presets import FULL, SLIDING, ModelConfig, dtype_short

ATTENTION_NAME = "kvcli_prefix"


def prefix_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     scale: float | None = None) -> torch.Tensor:
    """Causal attention of ``n`` new queries over ``past + n`` keys, for transformers' attention interface:
    :func:`kvcli.model.attention.prefix_attention` (the cached prefix unmasked plus a causal block over the new
    keys, merged by log-sum-exp, on the fast kernels) with ``past = key length - n``.

    Args:
        query: ``[batch, heads, n, head_dim]``. key, value: ``[batch, kv_heads, past + n, head_dim]``
            (``heads`` a multiple of ``kv_heads``: grouped-query attention). scale: softmax scale (None:
            ``head_dim ** -0.5``).

    Returns:
        ``[batch, heads, n, v_dim]``: query ``i`` attends keys ``0 .. past + i``.
    """
    return attention.prefix_attention(query, key, value, None, scale)


def _kvcli_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function signature: returns ``([batch, n, heads, v_dim], None)``. A sliding
    window, attention sinks (``s_aux``) or soft-capping go to :func:`kvcli.model.attention.banded_attention`;
    plain causal attention to :func:`prefix_attention`."""
    if attention_mask is not None:
        raise ModelFailure("this model asks for an attention mask, which kvcli's cached-prefix attention does not "
                           "implement")
    window, sinks, softcap = kwargs.get("sliding_window"), kwargs.get("s_aux"), kwargs.get("softcap")
    if window or sinks is not None or softcap:
        out = attention.banded_attention(query, key, value, scaling, window or None, sinks, softcap or None)
    else:
        out = prefix_attention(query, key, value, scaling)
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """Register ``"kvcli_prefix"`` with transformers' ``AttentionInterface`` (idempotent)."""
    transformers().AttentionInterface.register(ATTENTION_NAME, _kvcli_attention)


class HFModel:
    """A Hugging Face checkpoint on one device, with :class:`~kvcli.model.llama.LocalModel`'s interface. Build it
    with :func:`load_checkpoint`.

    Attributes:
        checkpoint: the folder's :class:`~kvcli.model.checkpoint.Checkpoint`. module: the transformers model.
        config: its shapes (:class:`~kvcli.model.presets.ModelConfig`; ``config.vocab`` is the embedding size).
        dtype, device, model_id, spec, kv_bytes_per_token: as LocalModel's.
    """

    def __init__(self, checkpoint: Checkpoint, module, dtype: torch.dtype, device: torch.device) -> None:
        self.checkpoint, self.module, self.dtype, self.device = checkpoint, module, dtype, device
        self.config = checkpoint.shapes
        self.spec = checkpoint.spec(dtype_short(dtype))
        self.model_id = self.spec.model_id
        self.kv_bytes_per_token = self.config.kv_bytes_per_token(dtype)
        params = inspect.signature(module.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5
        self._cache_class = transformers().DynamicCache

    def __repr__(self) -> str:
        return f"HFModel({self.model_id}, {self.checkpoint.path}, {self.device})"

    def synchronize(self) -> None:
        """Wait for queued device work (a no-op on CPU); call before reading a timer."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _cache_layer(self, layer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer of kvcli's payload as the ``(keys, values)`` pair transformers' cache holds for it."""
        if self.config.is_mla:  # [1, 1, tokens, latent + rope] -> the latent and the RoPE key, [1, 1, tokens, *]
            return layer[:, :, :, :self.config.kv_lora_rank], layer[:, :, :, self.config.kv_lora_rank:]
        return layer[0][None], layer[1][None]

    def _payload(self, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """One layer of transformers' cache (``[kv_heads, tokens, *]`` each) as kvcli's payload layer."""
        if self.config.is_mla:
            return torch.cat((keys, values), dim=-1)[None]
        return torch.stack((keys, values))

    def prefill(self, token_ids, past_kv: torch.Tensor | None = None,
                logits_for: str = "last") -> tuple[torch.Tensor, torch.Tensor]:
        """Run the new tokens through the checkpoint after an optional cached prefix. Mutates nothing.

        Args:
            token_ids: the ``n >= 1`` NEW token ids, 1-D (numpy, torch or list), each in ``[0, config.vocab)``.
            past_kv: ``config.kv_shape(past)`` (``[layers, 2, kv_heads, past, head_dim]``; latent attention:
                ``[layers, 1, 1, past, latent + rope]``) in the model's dtype, any device; None: no prefix.
            logits_for: ``"last"`` (the last token's logits only, as serving) or ``"all"``.

        Returns:
            ``(logits, kv)``: float32 logits ``[1, vocab]`` or ``[n, vocab]`` on the model's device; kv
            ``config.kv_shape(past + n)`` in the model's dtype (a fresh tensor).

        Raises:
            BadInputError: bad ``token_ids`` or ``logits_for``. ModelFailure: ``past_kv`` of the wrong shape or
                dtype; the model's cache is not one K and V per layer of the expected shape.
        """
        if logits_for not in ("last", "all"):
            raise BadInputError(f"logits_for must be 'last' or 'all', got {logits_for!r}")
        ids = token_tensor(token_ids, self.config.vocab, self.model_id, self.device)[None]
        cache = self._cache_class()
        if past_kv is not None:
            check_past_kv(past_kv, self.config, self.dtype, self.model_id)
            cache = self._cache_class(ddp_cache_data=[self._cache_layer(layer) for layer in past_kv.to(self.device)])
        with torch.inference_mode():
            out = self.module(input_ids=ids, use_cache=True, logits_to_keep=1 if logits_for == "last" else 0,
                              **{self._cache_arg: cache})
            kv = torch.stack([self._payload(layer.keys[0], layer.values[0]) for layer in cache.layers])
        c, total = self.config, ids.shape[1] + (0 if past_kv is None else past_kv.shape[3])
        if tuple(kv.shape) != c.kv_shape(total):
            raise ModelFailure(f"{self.model_id}: the model's KV cache is {tuple(kv.shape)}, not "
                               f"{c.kv_shape(total)} {_LAYOUT[c.is_mla]}")
        return out.logits[0].float(), kv


_LAYOUT = {False: "[layers, 2, kv_heads, tokens, head_dim]", True: "[layers, 1, 1, tokens, latent + rope]"}


def _check_runnable(shapes: ModelConfig, path: str) -> None:
    """Refuse a model with layers the cached path cannot resume (linear attention / Mamba; no mixer at all):
    resuming one from a cached prefix needs the layer's state (convolution and recurrent/SSM state) at the chunk
    boundary where the hit ends, saved beside the chunk's KV, and kvcli's chunk payload holds per-token KV only.

    Raises:
        BadInputError: one line naming the layers, the state a boundary would hold and what to run instead.
    """
    kinds = sorted(set(shapes.kinds) - {FULL, SLIDING})
    if kinds:
        counts = ", ".join(f"{shapes.count(k)} {k}" for k in kinds)
        raise BadInputError(f"cannot run a checkpoint with {counts} of its {shapes.layers} layers: resuming them "
                            f"from a cached prefix needs each one's convolution and recurrent state "
                            f"({shapes.state_elements:,} elements per layer) saved at every stored chunk boundary "
                            "beside the chunk's KV, and kvcli's chunk payload holds per-token KV only; price its "
                            "bytes and FLOPs without running it (--measure 0 --payload accounted)", path=path)


def load_checkpoint(path: str, dtype: str | None = None, device: str = "auto") -> HFModel:
    """Load checkpoint folder ``path`` with transformers, offline, with kvcli's attention, on ``device``.

    Args:
        path: a local Hugging Face checkpoint folder (``config.json`` and weights).
        dtype: ``"float32"/"bfloat16"/"float16"`` (and short forms); None for the checkpoint's own dtype.
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ...

    Raises:
        BadInputError: not a supported checkpoint folder (:func:`read_checkpoint`); linear-attention or Mamba
            layers; no weights (a config-only folder); bad dtype or device.
        ModelFailure: the weights would not fit in the device's free memory; transformers cannot load them
            (missing or mismatched weights, custom code); one line each.
    """
    checkpoint = read_checkpoint(path)
    _check_runnable(checkpoint.shapes, path)
    if not checkpoint.weight_bytes:
        raise BadInputError("this folder holds a config and no weights: price it without running it (--measure 0 "
                            "--payload accounted)", path=path)
    torch_dtype = checkpoint.dtype(dtype)
    dev = resolve_device(device)
    need = checkpoint.shapes.params() * torch.empty((), dtype=torch_dtype).element_size()
    if need * 1.1 > available_bytes(dev):
        raise ModelFailure(f"checkpoint {path} in {dtype_short(torch_dtype)} needs about {need / 2**30:.1f} GiB but "
                           f"{dev.type} has {available_bytes(dev) / 2**30:.1f} GiB available")
    register_attention()
    try:
        module, info = transformers().AutoModelForCausalLM.from_pretrained(
            checkpoint.path, local_files_only=True, dtype=torch_dtype, attn_implementation=ATTENTION_NAME,
            output_loading_info=True)
    except Exception as exc:  # OSError (no weights), ValueError (custom code, bad shapes), RuntimeError
        raise ModelFailure(f"cannot load checkpoint {path}: {one_line(exc)}") from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:
        raise ModelFailure(f"checkpoint {path} lacks {len(missing)} weights (e.g. {missing[0]}); they would be "
                           "random")
    return HFModel(checkpoint, module.to(dev).eval(), torch_dtype, dev)
