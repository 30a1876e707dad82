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

Hybrid models (attention layers beside linear layers, the ``model_type``s in :data:`RESUMABLE`: Qwen3-Next's Gated
DeltaNet; Nemotron-H's, Granite 4's and Bamba's Mamba-2): the cache is transformers' ``DynamicCache(config=...)``,
which holds a ``DynamicLayer`` (K and V) per attention layer, a ``LinearAttentionLayer`` per linear layer with a
``conv_states`` ``[1, conv_channels, K]`` and a ``recurrent_states`` that a resumed forward continues from, and a
``DummyLayer`` (nothing) per block without a token mixer (Nemotron-H's MLP and expert blocks, skipped by kvcli's
layer mapping: attention layer ``j`` of the payload is the ``j``-th attention block, linear layer ``j`` the
``j``-th linear block). Per linear layer (:func:`linear_state_layout`): Gated DeltaNet's conv channels are ``2
key_heads key_dim + value_heads value_dim`` and its recurrent state ``[value_heads, key_dim, value_dim]``
(``Qwen3NextGatedDeltaNet``); Mamba-2's conv channels are ``I + 2 groups d_state`` (x, B and C before the
convolution, ``I = heads head_dim``) and its SSM state ``[heads, head_dim, d_state]`` (``mamba2_chunk_scan``'s
final state in modeling_nemotron_h.py, modeling_granitemoehybrid.py, modeling_bamba.py). ``past_kv`` and the
returned ``kv`` are :class:`kvcli.prefixkv.StatefulKV`: the attention layers' K/V ``[attention_layers, 2, kv_heads,
tokens, head_dim]`` and states ``[linear_layers, state_elements]``, one row per linear layer: its convolution
state's last ``K - 1`` columns (``[conv_channels, K - 1]``, C order; transformers' cache keeps ``K`` columns, the
first of which a resumed forward never reads: the causal convolution of a new token reads the ``K - 1`` inputs
before it, as vLLM's conv state of ``K - 1`` columns holds) then its recurrent state, flattened, in the model's
dtype (transformers carries the recurrent state in float32 inside a forward; a bf16 model's stored state is
rounded to bf16 once, as vLLM's default state dtype, the model's, is). A cached prefix is restored through the
cache's public API (``update`` for K/V, ``update_conv_state`` and ``update_recurrent_state`` for the state after
its last token). Every forward gets ``position_ids`` ``past .. past + n - 1`` (Bamba's model numbers positions
from 0 otherwise, whatever the cache holds). States at chunk boundaries: the prompt runs as one forward per segment
between consecutive multiples of each of :attr:`HFModel.state_chunk_sizes` (each segment resuming from the cache
the previous one left) and the states are read after each segment; with no chunk sizes it runs as one forward,
the state read after its last token only. Segmenting changes no logit beyond float rounding
(tests/model/test_hybrid.py and tests/model/test_mamba_hybrid.py bound it). Jamba's Mamba layers are refused
(:data:`UNRESUMABLE`).

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
import math

import torch

from kvcli.errors import BadInputError, ModelFailure
from kvcli.model import attention
from kvcli.model.checkpoint import Checkpoint, read_checkpoint
from kvcli.model.hf_offline import one_line, transformers
from kvcli.model.llama import available_bytes, check_past_kv, resolve_device, token_tensor
from kvcli.model.presets import FULL, GATED_DELTANET, LINEAR, MAMBA2, NO_MIXER, SLIDING, dtype_short
from kvcli.prefixkv import StatefulKV

ATTENTION_NAME = "kvcli_prefix"
#: transformers ``model_type``s whose linear layers kvcli resumes from a stored state: their cache keeps one
#: convolution state and one recurrent state per linear layer (Qwen3-Next's Gated DeltaNet; Nemotron-H's, Granite
#: 4's and Bamba's Mamba-2), read and written through the cache's public ``get/update_conv_state`` and
#: ``get/update_recurrent_state``, and a forward of any length continues from both.
RESUMABLE = frozenset({"qwen3_next", "nemotron_h", "granitemoehybrid", "bamba"})
#: ``model_type`` -> why transformers' forward cannot resume its linear layers from a cached state (the refusal
#: says so).
UNRESUMABLE = {"jamba": "transformers' Mamba scan (JambaMambaMixer's mamba_selective_scan) starts every forward of "
                        "more than one token from a zero SSM state, so a suffix prefilled after a cached prefix "
                        "ignores the prefix's state; only one-token decode steps read it"}
#: how a model kvcli cannot run is still priced: bytes and FLOPs from its config, prefill from one of the sources
PRICE_WITHOUT_RUNNING = ("price its bytes and FLOPs without running it: kvcli replay --measure 0 --payload accounted "
                         "with --hardware GPU, --prefill-tps N or --prefill-profile FILE")


def linear_state_layout(config) -> tuple[tuple[int, int], tuple[int, ...]]:
    """One linear layer's state as transformers' cache holds it: ``((conv_channels, K), recurrent_shape)``, the
    convolution state ``[1, conv_channels, K]`` and the recurrent state ``[1, *recurrent_shape]`` (float32 inside a
    forward), for a :class:`~kvcli.model.presets.ModelConfig` with a counted linear mixer.

    - Gated DeltaNet (transformers' ``Qwen3NextGatedDeltaNet``): conv channels ``2 key_heads key_dim + value_heads
      value_dim``, recurrent ``[value_heads, key_dim, value_dim]``;
    - Mamba-2 (``NemotronHMamba2Mixer``, ``GraniteMoeHybridMambaLayer``, ``BambaMixer``: ``mamba2_chunk_scan``'s
      ``final_state``, ``bchpn``): conv channels ``I + 2 groups d_state`` (``I = heads head_dim``; x, B and C before
      the convolution), recurrent ``[heads, head_dim, d_state]``.

    The stored row keeps ``K - 1`` of the ``K`` columns: ``conv_channels (K - 1) + prod(recurrent_shape)`` elements,
    ``config.state_elements`` (vLLM's ``MambaStateShapeCalculator``, vllm/model_executor/layers/mamba/mamba_utils.py).

    Raises:
        ModelFailure: a linear mixer kvcli has no layout for (Jamba's Mamba: ``linear_mixer`` ``""``).
    """
    c, kernel = config, config.linear_conv_kernel
    if c.linear_mixer == GATED_DELTANET:
        conv = 2 * c.linear_key_heads * c.linear_key_dim + c.linear_heads * c.linear_head_dim
        recurrent: tuple[int, ...] = (c.linear_heads, c.linear_key_dim, c.linear_head_dim)
    elif c.linear_mixer == MAMBA2:
        conv = c.linear_heads * c.linear_head_dim + 2 * c.linear_key_heads * c.linear_key_dim
        recurrent = (c.linear_heads, c.linear_head_dim, c.linear_key_dim)
    else:
        raise ModelFailure(f"{c.name}: kvcli has no state layout for its linear layers' mixer")
    if conv * (kernel - 1) + math.prod(recurrent) != c.state_elements:
        raise ModelFailure(f"{c.name}: a linear layer's state of {conv} x ({kernel} - 1) + "
                           f"{' x '.join(map(str, recurrent))} elements is not the config's {c.state_elements}")
    return (conv, kernel), recurrent


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
        checkpoint: the folder's :class:`~kvcli.model.checkpoint.Checkpoint`. module: the transformers model, in
            eval mode, its parameters frozen (``requires_grad`` False).
        config: its shapes (:class:`~kvcli.model.presets.ModelConfig`; ``config.vocab`` is the embedding size).
        dtype, device, model_id, spec, kv_bytes_per_token: as LocalModel's (``kv_bytes_per_token``: the attention
            layers' only; a hybrid model's chunk also carries ``config.state_bytes``).
        state_chunk_sizes: a hybrid model's prefill saves the linear layers' state at every multiple of each of
            these chunk sizes (tokens; set it to the store's chunk sizes); ``()``: only after the last token, in one
            forward (module docstring).
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
        self.state_chunk_sizes: tuple[int, ...] = ()
        kinds = self.config.kinds
        self._attention = [i for i, kind in enumerate(kinds) if kind in (FULL, SLIDING)]
        self._linear = [i for i, kind in enumerate(kinds) if kind == LINEAR]
        if self._linear:
            self._conv, self._recurrent = linear_state_layout(self.config)

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

    def prefill(self, token_ids, past_kv: torch.Tensor | StatefulKV | None = None, logits_for: str = "last",
                kv_for: str = "all") -> tuple[torch.Tensor, torch.Tensor | StatefulKV]:
        """Run the new tokens through the checkpoint after an optional cached prefix. Mutates nothing.

        Args:
            token_ids: the ``n >= 1`` NEW token ids, 1-D (numpy, torch or list), each in ``[0, config.vocab)``.
            past_kv: ``config.kv_shape(past)`` (``[layers, 2, kv_heads, past, head_dim]``; latent attention:
                ``[layers, 1, 1, past, latent + rope]``) in the model's dtype, any device; a hybrid model's: a
                :class:`~kvcli.prefixkv.StatefulKV` of that KV with the state after its last token; None: no
                prefix.
            logits_for: ``"last"`` (the last token's logits only, as serving) or ``"all"``.
            kv_for: ``"all"`` (the returned KV covers past and new tokens) or ``"new"`` (the new tokens' only: the
                prefix is not gathered out of the cache again; transformers' ``DynamicCache`` still concatenates
                each layer's cached K/V with the new ones inside the forward, a copy an engine's paged cache does
                not make).

        Returns:
            ``(logits, kv)``: float32 logits ``[1, vocab]`` or ``[n, vocab]`` on the model's device; kv
            ``config.kv_shape(past + n)`` (``kv_for="new"``: ``config.kv_shape(n)``) in the model's dtype (a fresh
            tensor); a hybrid model's: a :class:`~kvcli.prefixkv.StatefulKV` of it with the states after every
            token count that is a multiple of one of :attr:`state_chunk_sizes` in ``(past, past + n)``, after
            ``past + n``, and ``past_kv``'s (``kv_for="new"``: those after ``past``, numbered from it).

        Raises:
            BadInputError: bad ``token_ids``, ``logits_for`` or ``kv_for``. ModelFailure: ``past_kv`` of the
                wrong shape or dtype, or a hybrid model's without the state after its last token; the model's cache
                is not one K and V per layer of the expected shape.
        """
        if logits_for not in ("last", "all"):
            raise BadInputError(f"logits_for must be 'last' or 'all', got {logits_for!r}")
        if kv_for not in ("all", "new"):
            raise BadInputError(f"kv_for must be 'all' or 'new', got {kv_for!r}")
        ids = token_tensor(token_ids, self.config.vocab, self.model_id, self.device)[None]
        if self._linear:
            return self._prefill_hybrid(ids, past_kv, logits_for, kv_for == "new")
        if isinstance(past_kv, StatefulKV):
            raise ModelFailure(f"{self.model_id} has no linear layers: its past_kv is a KV tensor, not a StatefulKV")
        cache = self._cache_class()
        if past_kv is not None:
            check_past_kv(past_kv, self.config, self.dtype, self.model_id)
            cache = self._cache_class(ddp_cache_data=[self._cache_layer(layer) for layer in past_kv.to(self.device)])
        past = 0 if past_kv is None else past_kv.shape[3]
        start = past if kv_for == "new" else 0
        with torch.inference_mode():
            out = self.module(input_ids=ids, use_cache=True, logits_to_keep=1 if logits_for == "last" else 0,
                              **{self._cache_arg: cache})
            kv = torch.stack([self._payload(layer.keys[0][:, start:], layer.values[0][:, start:])
                              for layer in cache.layers])
        self._check_kv(kv, past + ids.shape[1] - start)
        return out.logits[0].float(), kv

    def _check_kv(self, kv: torch.Tensor, total: int) -> None:
        c = self.config
        if tuple(kv.shape) != c.kv_shape(total):
            raise ModelFailure(f"{self.model_id}: the model's KV cache is {tuple(kv.shape)}, not "
                               f"{c.kv_shape(total)} {_LAYOUT[c.is_mla]}")

    def _prefill_hybrid(self, ids: torch.Tensor, past_kv, logits_for: str, new_only: bool
                        ) -> tuple[torch.Tensor, StatefulKV]:
        """:meth:`prefill` of a hybrid model (module docstring): the cache restored from ``past_kv``'s K/V and end
        state, then one forward per segment between state boundaries; ``new_only``: ``kv_for="new"``."""
        cache = self._cache_class(config=self.module.config)
        past, states = 0, {}
        if past_kv is not None:
            self._check_state(past_kv)
            past, states = past_kv.tokens, dict(past_kv.states)
            kv = past_kv.kv.to(self.device)
            for j, layer in enumerate(self._attention):
                cache.update(*self._cache_layer(kv[j]), layer)
            self._restore(cache, past_kv.end_state.to(self.device))
        total = past + ids.shape[1]
        cuts = sorted({total}.union(*(range((past // cs + 1) * cs, total, cs) for cs in self.state_chunk_sizes)))
        logits, start = [], past
        with torch.inference_mode():
            for cut in cuts:
                positions = torch.arange(start, cut, device=self.device)[None]
                out = self.module(input_ids=ids[:, start - past:cut - past], position_ids=positions, use_cache=True,
                                  logits_to_keep=1 if logits_for == "last" else 0, **{self._cache_arg: cache})
                logits.append(out.logits[0])
                states[cut] = self._snapshot(cache)
                start = cut
            first = past if new_only else 0
            kv = torch.stack([self._payload(cache.layers[i].keys[0][:, first:], cache.layers[i].values[0][:, first:])
                              for i in self._attention])
        self._check_kv(kv, total - first)
        states = {t - first: s for t, s in states.items() if t > first}
        return (logits[-1] if logits_for == "last" else torch.cat(logits)).float(), StatefulKV(kv, states)

    def _check_state(self, past_kv) -> None:
        """Raise ModelFailure unless ``past_kv`` is a StatefulKV of the model's KV shape and dtype with the
        state after its last token, ``[linear_layers, state_elements]`` in the model's dtype."""
        state = past_kv.end_state if isinstance(past_kv, StatefulKV) else None
        if state is None:
            raise ModelFailure(f"{self.model_id}: resuming a cached prefix of {past_kv.shape[3]} tokens needs the "
                               "linear layers' state after its last token, which this past_kv does not hold")
        check_past_kv(past_kv.kv, self.config, self.dtype, self.model_id)
        if tuple(state.shape) != self.config.state_shape or state.dtype != self.dtype:
            raise ModelFailure(f"{self.model_id}: the linear layers' state is {tuple(state.shape)} {state.dtype}, "
                               f"not {self.config.state_shape} {self.dtype}")

    def _snapshot(self, cache) -> torch.Tensor:
        """Every linear layer's state in ``cache`` now, ``[linear_layers, state_elements]`` in the model's dtype
        (module docstring: the layout)."""
        return torch.stack([torch.cat((cache.get_conv_state(i)[0, :, 1:].reshape(-1),
                                       cache.get_recurrent_state(i)[0].reshape(-1).to(self.dtype)))
                            for i in self._linear])

    def _restore(self, cache, state: torch.Tensor) -> None:
        """Put :meth:`_snapshot`'s ``state`` into a fresh ``cache``, as the state after the cached prefix: the
        convolution state in the model's dtype, the recurrent state in float32 (as transformers computes it)."""
        (channels, kernel), conv = self._conv, self._conv[0] * (self._conv[1] - 1)
        for row, i in zip(state, self._linear):
            cache.update_conv_state(row[:conv].view(1, channels, kernel - 1), i, conv_kernel_size=kernel)
            cache.update_recurrent_state(row[conv:].view(1, *self._recurrent).float(), i)


_LAYOUT = {False: "[layers, 2, kv_heads, tokens, head_dim]", True: "[layers, 1, 1, tokens, latent + rope]"}


def _check_runnable(checkpoint: Checkpoint, path: str) -> None:
    """Refuse a model with layers the cached path cannot resume: linear attention / Mamba layers outside
    :data:`RESUMABLE` (Jamba: :data:`UNRESUMABLE` says why), blocks with no token mixer in a model without linear
    layers (kvcli skips MLP-only blocks in a hybrid cache only), and a model without any attention layer.

    Raises:
        BadInputError: one line naming the layers, the state a boundary would hold and what to run instead.
    """
    shapes = checkpoint.shapes
    model_type = checkpoint.hf_config.model_type
    if shapes.count(LINEAR) and model_type not in RESUMABLE:
        why = f" ({UNRESUMABLE[model_type]})" if model_type in UNRESUMABLE else ""
        raise BadInputError(f"cannot run a checkpoint with {shapes.count(LINEAR)} of its {shapes.layers} layers "
                            "linear-attention / Mamba: resuming them from a cached prefix needs each one's "
                            f"convolution and recurrent state ({shapes.state_elements:,} elements per layer) restored "
                            f"into transformers' cache, which kvcli does for {', '.join(sorted(RESUMABLE))} only, not "
                            f"{model_type}{why}; {PRICE_WITHOUT_RUNNING}", path=path)
    if shapes.count(NO_MIXER) and not shapes.count(LINEAR):
        raise BadInputError(f"cannot run a checkpoint with {shapes.count(NO_MIXER)} blocks of its {shapes.layers} "
                            "that have no token mixer (MLP-only) and no linear-attention / Mamba layer: kvcli skips "
                            f"MLP-only blocks in a hybrid model's cache only; {PRICE_WITHOUT_RUNNING}", path=path)
    if not shapes.attention_layers:
        raise BadInputError(f"cannot run a checkpoint whose {shapes.layers} layers are all linear attention: "
                            "transformers' cache counts a prompt's positions on its attention layers; "
                            f"{PRICE_WITHOUT_RUNNING}", path=path)


def load_checkpoint(path: str, dtype: str | None = None, device: str = "auto") -> HFModel:
    """Load checkpoint folder ``path`` with transformers, offline, with kvcli's attention, on ``device``.

    Args:
        path: a local Hugging Face checkpoint folder (``config.json`` and weights).
        dtype: ``"float32"/"bfloat16"/"float16"`` (and short forms); None for the checkpoint's own dtype.
        device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ...

    Returns:
        An :class:`HFModel`; its module in eval mode with every parameter frozen (``requires_grad`` False).

    Raises:
        BadInputError: not a supported checkpoint folder (:func:`read_checkpoint`); linear-attention or Mamba
            layers of a model type outside :data:`RESUMABLE`, or MLP-only blocks in a model without them; no
            weights (a config-only folder); bad dtype or device.
        ModelFailure: the weights would not fit in the device's free memory; transformers cannot load them
            (missing or mismatched weights, custom code); one line each.
    """
    checkpoint = read_checkpoint(path)
    _check_runnable(checkpoint, path)
    if not checkpoint.weight_bytes:
        raise BadInputError(f"a config with no weights, nothing to run: {PRICE_WITHOUT_RUNNING}", path=path)
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
    # Only forwards run, so no parameter needs a gradient. Frozen, no submodule call receives a tensor that requires
    # one (transformers passes the conv weight of a linear-attention or Mamba layer to its kernel wrapper module):
    # torch's ModuleTracker, inside FlopCounterMode, hooks the gradient of each such argument, which fails under
    # prefill's inference_mode, where no autograd graph is built.
    return HFModel(checkpoint, module.to(dev).eval().requires_grad_(False), torch_dtype, dev)
