"""Reuse beyond a prefix: the prompt tokens a cache could reuse at any position, as CacheBlend does, beside the
prefix figure a command computes (``kvcli replay --reuse blend``, ``kvcli stats --reuse blend``). An analysis of
the trace's tokens; no store is asked.

Source: CacheBlend (Yao et al., "CacheBlend: Fast Large Language Model Serving for RAG with Cached Knowledge
Fusion", EuroSys 2025, arXiv:2405.16444) reuses the KV of a text chunk wherever the chunk recurs in a later input,
prefix or not, and recomputes the KV of a small share of its tokens (those whose KV deviates most, chosen at a check
layer) so that the chunk attends to what now precedes it. LMCache implements it ("Blending",
docs.lmcache.ai/kv_cache_optimizations/blending.html): the input's chunks are cut at a separator string, each
chunk's KV is stored from its own start, and ``LMCACHE_BLEND_RECOMPUTE_RATIOS`` sets the share recomputed, "0.15"
in that page and in its example ``examples/blend_kv_v1/blend.py`` (the value it falls back to when unset; the
config's own ``blend_recompute_ratios`` has no default). :data:`RECOMPUTE_FRACTION` is that 0.15.

Rules, per request in arrival order (the caller's order), of ``n`` prompt tokens:

* **Units**: the request's segments (:class:`kvcli.traces.request.Segment`: a RAGPulse hash id, where the reader
  gives them), else its full chunks of ``chunk_tokens`` from the prompt's start (replay: the chunk size; stats:
  :data:`CHUNK_TOKENS`, LMCache's default chunk size). A unit is **seen** when an earlier request of the same
  cache salt and served model (``Request.hash_salt``) had a unit of the same tokens, at any position (its tokens
  compared by a 128-bit BLAKE2b digest: two distinct units collide with probability about 2**-128 a pair).
* **Prefix tokens** ``P``: the caller's prefix figure for the request (replay: what the store reuses at that chunk
  size with unlimited capacity; stats: the token-granular shared prefix), taken as given.
* **Blend tokens**: the tokens of its seen units that lie in ``[P, n - 1)``: beyond the prefix, and never the last
  token (the engine computes it in any case, as :func:`kvcli.store.hashing.reusable_tokens` counts).
* **Recomputed** ``= fraction * blend``; **reusable** ``= P + blend``; **saved** ``= P + blend - recomputed`` (the
  prefix is reused as is; a blended unit recomputes its share).

What it does not model: capacity and time (every unit of every earlier request is kept: an unlimited cache, as
the prefix figures' own unlimited column), units shorter than LMCache's ``blend_min_tokens``, and the separator
tokens LMCache needs between chunks (the trace's prompts have none). Cost: one BLAKE2b digest per unit and a set
entry per distinct unit (~100 bytes), no Python loop over tokens.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from kvcli.errors import BadInputError
from kvcli.traces.request import Request

#: The share of blended (non-prefix) tokens CacheBlend recomputes: LMCache's ``LMCACHE_BLEND_RECOMPUTE_RATIOS``
#: as its Blending documentation and ``examples/blend_kv_v1/blend.py`` set it (module docstring).
RECOMPUTE_FRACTION = 0.15
#: Tokens per unit of a request without segments, where the command has no chunk size (stats): LMCache's default
#: ``chunk_size`` (256), which its blending example also sets.
CHUNK_TOKENS = 256
#: The kind of a chunk unit (a request without segments), and of tokens in no unit.
CHUNK_KIND, OTHER_KIND = "chunks", "other"


#: ``--reuse``: the prefix figures only, or beside them the reuse at any position.
REUSE_MODES = ("prefix", "blend")


def blend_fraction(reuse: str, recompute: float | None = None) -> float | None:
    """``--reuse`` with ``--blend-recompute``: None for ``prefix`` (no blend analysis), else the share of blended
    tokens recomputed (``recompute``, default :data:`RECOMPUTE_FRACTION`).

    Raises:
        BadInputError: an unknown mode; a share outside [0, 1]; a share given with ``prefix``.
    """
    if reuse not in REUSE_MODES:
        raise BadInputError(f"--reuse must be one of {', '.join(REUSE_MODES)}, got {reuse!r}")
    if reuse == "prefix":
        if recompute is not None:
            raise BadInputError("--blend-recompute applies with --reuse blend")
        return None
    return check_recompute_fraction(RECOMPUTE_FRACTION if recompute is None else recompute)


def check_recompute_fraction(value: float) -> float:
    """``value`` when it is a number in [0, 1]; else BadInputError naming ``--blend-recompute``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise BadInputError(f"--blend-recompute must be a number in [0, 1] (the share of blended tokens "
                            f"recomputed; CacheBlend in LMCache: {RECOMPUTE_FRACTION}), got {value!r}")
    return float(value)


@dataclass
class KindTokens:
    """One kind's tokens (a segment kind such as ``"passages_ids"``, :data:`CHUNK_KIND` or :data:`OTHER_KIND`):
    its prompt tokens, those inside the prefix figure, and its blend tokens."""

    prompt: int = 0
    prefix: int = 0
    blend: int = 0


@dataclass
class BlendReuse:
    """A trace's reuse beyond the prefix (module docstring), in tokens.

    Attributes:
        recompute_fraction: the share of blend tokens recomputed, in [0, 1].
        chunk_tokens: the unit of a request without segments, tokens.
        requests: requests counted; segmented_requests: those cut by their own segments.
        prompt_tokens, prefix_tokens, blend_tokens: sums over the requests.
        by_kind: the same three sums per kind (their sums are the totals), kinds in order of first sight.
    """

    recompute_fraction: float = RECOMPUTE_FRACTION
    chunk_tokens: int = CHUNK_TOKENS
    requests: int = 0
    segmented_requests: int = 0
    prompt_tokens: int = 0
    prefix_tokens: int = 0
    blend_tokens: int = 0
    by_kind: dict[str, KindTokens] = field(default_factory=dict)

    @property
    def recomputed_tokens(self) -> float:
        """``recompute_fraction * blend_tokens`` (a mean over the blended tokens: not rounded)."""
        return self.recompute_fraction * self.blend_tokens

    @property
    def reusable_tokens(self) -> int:
        """``prefix_tokens + blend_tokens``."""
        return self.prefix_tokens + self.blend_tokens

    @property
    def saved_tokens(self) -> float:
        """Prefill tokens not computed: ``prefix_tokens + blend_tokens - recomputed_tokens``."""
        return self.reusable_tokens - self.recomputed_tokens

    def ratio(self, tokens: float) -> float | None:
        """``tokens / prompt_tokens`` (None without prompt tokens)."""
        return tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def unit(self) -> str:
        """What the units were, in words."""
        chunks = f"full {self.chunk_tokens}-token chunks"
        if self.segmented_requests == self.requests and self.requests:
            return "the trace's segments (one per hash id or part)"
        if self.segmented_requests:
            return f"the trace's segments where a request has them ({self.segmented_requests:,}), else {chunks}"
        return chunks

    def line(self, prefix: str = "prefix") -> str:
        """The figures in words, e.g. ``"prefix 29.1% + blend 19.2% = 48.3% of 183,037 prompt tokens reusable; 15%
        of the blended recomputed: 45.4% saved; blend by kind: passages_ids 15.0%, history 4.2%"`` (``prefix``:
        what the prefix figure is called)."""
        def pct(tokens: float) -> str:
            share = self.ratio(tokens)
            return "–" if share is None else f"{100 * share:.1f}%"

        text = (f"{prefix} {pct(self.prefix_tokens)} + blend {pct(self.blend_tokens)} = {pct(self.reusable_tokens)} "
                f"of {self.prompt_tokens:,} prompt tokens reusable; {100 * self.recompute_fraction:g}% of the "
                f"blended recomputed: {pct(self.saved_tokens)} saved")
        kinds = sorted(((k.blend, kind) for kind, k in self.by_kind.items() if k.blend and kind != CHUNK_KIND),
                       reverse=True)
        if kinds:
            text += "; blend by kind: " + ", ".join(f"{kind} {pct(tokens)}" for tokens, kind in kinds)
        return text

    def to_dict(self) -> dict:
        """JSON-ready: the counts, the derived tokens and their ratios of the prompt tokens, and ``by_kind``."""
        return {"reuse": "blend", "recompute_fraction": self.recompute_fraction, "unit": self.unit,
                "chunk_tokens": self.chunk_tokens, "requests": self.requests,
                "segmented_requests": self.segmented_requests, "prompt_tokens": self.prompt_tokens,
                "prefix_tokens": self.prefix_tokens, "blend_tokens": self.blend_tokens,
                "reusable_tokens": self.reusable_tokens, "recomputed_tokens": self.recomputed_tokens,
                "saved_tokens": self.saved_tokens, "prefix_ratio": self.ratio(self.prefix_tokens),
                "blend_ratio": self.ratio(self.blend_tokens), "reusable_ratio": self.ratio(self.reusable_tokens),
                "saved_ratio": self.ratio(self.saved_tokens),
                "by_kind": {kind: {"prompt_tokens": k.prompt, "prefix_tokens": k.prefix, "blend_tokens": k.blend}
                            for kind, k in self.by_kind.items()}}


class BlendCounter:
    """The pass that fills a :class:`BlendReuse`: :meth:`add` each request, in arrival order, with its prefix
    figure. Holds one digest per distinct unit seen (per cache salt and served model)."""

    def __init__(self, recompute_fraction: float = RECOMPUTE_FRACTION, chunk_tokens: int = CHUNK_TOKENS) -> None:
        if type(chunk_tokens) is not int or chunk_tokens < 1:
            raise BadInputError(f"a blend unit must be an integer >= 1 tokens, got {chunk_tokens!r}")
        self.result = BlendReuse(check_recompute_fraction(recompute_fraction), chunk_tokens)
        self._seen: set[tuple[str, bytes]] = set()

    def add(self, request: Request, prefix_tokens: int, tokens: np.ndarray | None = None) -> int:
        """Count one request whose prefix figure is ``prefix_tokens`` (0 <= it <= its prompt tokens), then remember
        its units; returns its blend tokens. ``tokens``: its token ids when the caller has them at hand (a hash-id
        request's synthesized ones, which its ``token_ids`` would keep), else ``request.token_ids``.

        Raises:
            ValueError: ``prefix_tokens`` outside ``[0, prompt tokens]``.
        """
        tokens = np.ascontiguousarray(request.token_ids if tokens is None else tokens, dtype="<u4")
        n = len(tokens)
        if not 0 <= prefix_tokens <= n:
            raise ValueError(f"prefix tokens {prefix_tokens} outside [0, {n}]")
        out = self.result
        out.requests += 1
        out.prompt_tokens += n
        out.prefix_tokens += prefix_tokens
        if request.segments is not None:
            out.segmented_requests += 1
            units = [(s.start, s.end, s.kind) for s in request.segments]
        else:
            c = out.chunk_tokens
            units = [(k, k + c, CHUNK_KIND) for k in range(0, n - n % c, c)]
        digests = [(request.hash_salt, hashlib.blake2b(tokens[start:end].tobytes(), digest_size=16).digest())
                   for start, end, _ in units]
        low, high = prefix_tokens, max(prefix_tokens, n - 1)  # the blend range: beyond the prefix, not the last
        blend = covered = in_prefix = 0
        for (start, end, kind), digest in zip(units, digests):
            k = out.by_kind.setdefault(kind, KindTokens())
            k.prompt += end - start
            k.prefix += max(0, min(end, low) - start)
            covered += end - start
            in_prefix += max(0, min(end, low) - start)
            if digest in self._seen:
                tokens_in = max(0, min(end, high) - max(start, low))
                k.blend += tokens_in
                blend += tokens_in
        if covered < n:
            k = out.by_kind.setdefault(OTHER_KIND, KindTokens())
            k.prompt += n - covered
            k.prefix += prefix_tokens - in_prefix
        out.blend_tokens += blend
        self._seen.update(digests)
        return blend
