"""The KV of a hybrid model's prefix: per-token K/V of its attention layers plus its linear layers' states at
chunk boundaries (:class:`StatefulKV`), shared by the model side (which makes it) and the store (which cuts it
into chunk payloads and puts retrieved chunks back together).

A hybrid model (attention layers plus linear-attention / Mamba layers: Qwen3-Next's Gated DeltaNet, the Mamba-2 of
Nemotron-H, Granite 4 and Bamba) resumes a cached prefix of ``t`` tokens from the attention layers' K and V of
those ``t`` tokens and, for every linear layer, its constant-size state after token ``t``: a convolution state and
a recurrent state. That state exists
only where it was saved, so a prefix can resume only at a token count whose state is held: a chunk boundary.
vLLM's prefix caching for Mamba layers follows the same rule: with ``mamba_cache_mode="align"`` the state is kept at
block boundaries, and ``MambaManager.find_longest_cache_hit`` (vllm/v1/core/single_type_kv_cache_manager.py) takes
the deepest cached block whose state is held, its hit length a multiple of the block size.

A :class:`StatefulKV` slices along the token axis like the KV tensor it holds (``kv[:, :, :, a:b]``), so code
that cuts a dense model's ``[layers, 2, kv_heads, tokens, head_dim]`` KV into chunks cuts it the same way. This
module imports torch only when a function needs it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvcli.errors import KvcliError

if TYPE_CHECKING:
    import torch


class StatefulKV:
    """The attention layers' KV of ``tokens`` tokens and every linear layer's state after some of them.

    Attributes:
        kv: ``[attention_layers, 2, kv_heads, tokens, head_dim]``, as a dense model's KV.
        states: ``{t: state}`` for ``0 < t <= tokens``: the state of every linear layer after the first ``t``
            tokens of ``kv``, ``[linear_layers, state_elements]`` (per layer its flattened convolution state, then
            its flattened recurrent state: the model defines the layout, :mod:`kvcli.model.hf`). A state is the
            whole sequence's state, from the sequence's first token: only a slice that starts at token 0 of a
            sequence is a prefix a model can resume.

    Slicing: ``x[:, :, :, a:b]`` (a trailing ``:`` allowed) is the KV of tokens ``a .. b - 1`` with the states
    after ``a < t <= b``, renumbered ``t - a``; no other index is supported (TypeError). ``shape``, ``dtype`` and
    ``device`` are ``kv``'s.
    """

    __slots__ = ("kv", "states")

    def __init__(self, kv: torch.Tensor, states: dict[int, torch.Tensor]) -> None:
        self.kv, self.states = kv, states

    def __repr__(self) -> str:
        return f"StatefulKV(kv={tuple(self.kv.shape)}, states at {sorted(self.states)})"

    @property
    def shape(self):
        """``kv``'s shape: ``[attention_layers, 2, kv_heads, tokens, head_dim]``."""
        return self.kv.shape

    @property
    def dtype(self):
        """``kv``'s dtype."""
        return self.kv.dtype

    @property
    def device(self):
        """``kv``'s device."""
        return self.kv.device

    @property
    def tokens(self) -> int:
        """Tokens of ``kv``."""
        return int(self.kv.shape[3])

    @property
    def end_state(self) -> torch.Tensor | None:
        """The state after the last token (``[linear_layers, state_elements]``), or None when it was not saved."""
        return self.states.get(self.tokens)

    def __getitem__(self, index: Any) -> StatefulKV:
        full = slice(None)
        if not (isinstance(index, tuple) and len(index) in (4, 5) and all(i == full for i in index[:3])
                and isinstance(index[3], slice) and (len(index) == 4 or index[4] == full)):
            raise TypeError(f"StatefulKV takes [:, :, :, a:b] only, got {index!r}")
        start, stop, step = index[3].indices(self.tokens)
        if step != 1:
            raise TypeError("StatefulKV slices take no step")
        stop = max(start, stop)
        return StatefulKV(self.kv[:, :, :, start:stop], {t - start: s for t, s in self.states.items()
                                                         if start < t <= stop})

    def to(self, *args, **kwargs) -> StatefulKV:
        """Both parts moved or cast as ``torch.Tensor.to(*args, **kwargs)`` (the states keep their dtype when only
        a device is given)."""
        return StatefulKV(self.kv.to(*args, **kwargs), {t: s.to(*args, **kwargs) for t, s in self.states.items()})

    def cpu(self) -> StatefulKV:
        """Both parts on the CPU."""
        return StatefulKV(self.kv.cpu(), {t: s.cpu() for t, s in self.states.items()})


def resumable_tokens(kv, tokens: int) -> int:
    """The most tokens, at most ``tokens``, a prefix of ``kv`` can resume from: ``tokens`` for a plain KV tensor
    (attention resumes after any token); for a :class:`StatefulKV` the largest ``t <= tokens`` with a saved state
    (0 when there is none)."""
    if not isinstance(kv, StatefulKV):
        return tokens
    return max((t for t in kv.states if t <= tokens), default=0)


def concat_kv(parts: list):
    """Chunks' KV back to back along the token axis: ``torch.cat(parts, dim=3)`` for tensors; for
    :class:`StatefulKV` chunks, their KV concatenated and their states renumbered by the tokens before them.

    Raises:
        KvcliError: tensors and :class:`StatefulKV` mixed.
    """
    import torch

    stateful = [isinstance(p, StatefulKV) for p in parts]
    if not any(stateful):
        return torch.cat(parts, dim=3)
    if not all(stateful):
        raise KvcliError("cannot concatenate chunks with and without linear layers' states")
    states, offset = {}, 0
    for part in parts:
        states.update({offset + t: s for t, s in part.states.items()})
        offset += part.tokens
    return StatefulKV(torch.cat([p.kv for p in parts], dim=3), states)
