"""A trace's workload statistics: request and session counts, prompt-length percentiles, and the share of prompt
tokens inside a prefix shared with an earlier request, with the prefixes that share most.

Rules:

* Requests are taken in arrival order (:mod:`kvcli.traces.order`), the order every command uses.
* **Shared tokens** of a request: the longest common prefix, in tokens, of its prompt with any earlier request's
  of the same ``cache_salt``: exact at token granularity, over the token ids kvcli replays (a hash-id trace's are
  synthesized per block: two prompts share the tokens of their common blocks, and by chance rarely a token more).
  It is what an unlimited radix cache reuses
  (:class:`kvcli.sim.upper_bound.RadixUpperBound`, the same radix as replay's upper bound; edges compared with
  one vectorized ``!=``, never a Python loop over tokens); the share is their sum over all prompt tokens.
* **Top shared prefixes**: the radix's reused runs (:meth:`~kvcli.sim.upper_bound.RadixUpperBound.shared_segments`):
  a run is the tokens between two branch points of the prefix tree, reused whole by some number of later requests;
  its saved tokens are its length times those requests. The runs partition the shared tokens (their saved tokens
  sum to the trace's shared tokens), so a system prompt every request repeats is one run, saved once per
  request, and each conversation's history after it another.
* Percentiles: numpy's linear interpolation over the prompt lengths.
* **Blend** (with ``blend_recompute``): beside the shared prefix, the tokens reusable at any position, as
  CacheBlend reuses them, each request's shared tokens its prefix figure (:mod:`kvcli.sim.blend`: its segments, or
  its full 256-token chunks, seen in an earlier request, beyond the shared prefix; a share recomputed).

Cost: one pass over the trace; memory, the radix (4 bytes per distinct token) plus the requests as read (a text or
token-id trace's token ids; a hash-id trace's block keys, 8 bytes a block: its token ids are synthesized one request
at a time and dropped once inserted). **Bound:** the radix holds at most ``max_tokens`` distinct tokens
(:data:`MAX_TOKENS` unless raised; ``kvcli stats --max-tokens``): a request that could take it past them is refused
before its token ids are made, so a small hash-id file (an id stands for a block of up to 2**20 tokens) cannot make
stats hold more than ``4 * max_tokens`` bytes of tokens, plus one request's.
"""
from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from kvcli.errors import BadInputError
from kvcli.sim.blend import BlendCounter, BlendReuse
from kvcli.sim.upper_bound import RadixUpperBound
from kvcli.traces.order import arrival_order
from kvcli.traces.request import Request, split_hash_salt

#: the prompt-length percentiles reported.
PERCENTILES = (50, 90, 99)
#: The distinct prompt tokens stats holds by default (4 bytes each, 512 MiB): Mooncake's 12k-request conversation
#: trace needs about 100 million.
MAX_TOKENS = 1 << 27


def check_max_tokens(max_tokens: int) -> None:
    """Raise BadInputError (naming ``--max-tokens``) unless ``max_tokens`` is an integer >= 1."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadInputError(f"--max-tokens must be an integer >= 1, got {max_tokens!r}")


@dataclass(frozen=True)
class SharedPrefix:
    """One run of a shared prefix that later requests reuse whole (module docstring).

    Attributes:
        start: tokens before the run (0: the run starts the prompt). tokens: its length, tokens.
        requests: later requests that reuse it. saved_tokens: ``tokens * requests``.
        head: its first token ids (at most :data:`HEAD_TOKENS`), for the report to show as words.
        cache_salt: the tenant it belongs to. model: the served model its requests name ("" for none).
    """

    start: int
    tokens: int
    requests: int
    saved_tokens: int
    head: np.ndarray = field(repr=False)
    cache_salt: str = ""
    model: str = ""

    @property
    def end(self) -> int:
        """Tokens of the whole prefix up to the run's end."""
        return self.start + self.tokens


#: token ids of a prefix kept to show its first words.
HEAD_TOKENS = 24


@dataclass(frozen=True)
class TraceStats:
    """The statistics of one trace (module docstring).

    Attributes:
        requests: requests read. sessions: distinct session ids (None when no request has one).
        prompt_tokens: their prompt tokens. percentiles: ``{50: p50, 90: p90, 99: p99}`` prompt tokens (empty for
        no request); max_prompt_tokens, mean_prompt_tokens: tokens.
        shared_tokens: prompt tokens inside a prefix shared with an earlier request. reordered: requests out of
        timestamp order (0: taken as in the file). top: the shared prefixes with the most saved tokens, most first.
        blend: the reuse beyond the shared prefix (:class:`kvcli.sim.blend.BlendReuse`), None when not asked for.
        models: requests per served model name the trace names (none named: empty); requests of two models share
        no prefix (:attr:`kvcli.traces.request.Request.hash_salt`).
    """

    requests: int
    sessions: int | None
    prompt_tokens: int
    percentiles: dict[int, float]
    max_prompt_tokens: int
    mean_prompt_tokens: float
    shared_tokens: int
    reordered: int
    top: list[SharedPrefix]
    blend: BlendReuse | None = None
    models: dict[str, int] = field(default_factory=dict)

    @property
    def shared_token_ratio(self) -> float | None:
        """``shared_tokens / prompt_tokens``; None for no prompt tokens (no denominator: ``–`` in a table, ``null``
        in JSON, as every ratio kvcli reports)."""
        return self.shared_tokens / self.prompt_tokens if self.prompt_tokens else None


def trace_stats(requests: Iterable[Request], top: int = 10, max_tokens: int = MAX_TOKENS,
                blend_recompute: float | None = None) -> TraceStats:
    """The statistics of ``requests`` (one trace, in file order; taken in arrival order), with the ``top`` shared
    prefix runs by saved tokens (ties: the earlier start first, then depth-first order), holding at most
    ``max_tokens`` distinct prompt tokens (module docstring); with ``blend_recompute`` (a share in [0, 1]), the
    reuse beyond the shared prefix, that share of its tokens recomputed.

    Raises:
        BadInputError: as the trace's reader, when iteration reaches a bad record; a request that could take the
            distinct tokens held past ``max_tokens`` (naming its record and ``--max-tokens``).
    """
    check_max_tokens(max_tokens)
    requests = list(requests)
    order = arrival_order([r.timestamp for r in requests])
    ordered = requests if order is None else [requests[i] for i in order.tolist()]
    radix = RadixUpperBound()
    blend = None if blend_recompute is None else BlendCounter(blend_recompute)
    lengths = np.fromiter((r.prompt_tokens for r in ordered), dtype=np.int64, count=len(ordered))
    shared_total = held = 0
    for request, length in zip(ordered, lengths.tolist()):
        if held + length > max_tokens:
            raise BadInputError(f"{request.source or request.id}: {length:,} prompt tokens after {held:,} distinct "
                                f"ones held would pass --max-tokens {max_tokens:,} (stats holds each distinct token "
                                "once, 4 bytes); raise --max-tokens to read this trace")
        # a hash-id request's tokens are made here and dropped after (its own token_ids would keep them)
        tokens = request.token_ids if request.blocks is None else request.blocks.token_ids()
        shared = radix.match_and_insert(tokens, request.hash_salt)
        if blend is not None:
            blend.add(request, shared, tokens)
        shared_total += shared
        held += length - shared
    ranked = heapq.nsmallest(top, enumerate(radix.shared_segments()),
                             key=lambda e: (-len(e[1].tokens) * e[1].reused, e[1].start, e[0]))
    sessions = {r.session_id for r in requests if r.session_id is not None}
    return TraceStats(
        requests=len(requests), sessions=len(sessions) if sessions else None, prompt_tokens=int(lengths.sum()),
        percentiles={p: float(np.percentile(lengths, p)) for p in PERCENTILES} if len(lengths) else {},
        max_prompt_tokens=int(lengths.max()) if len(lengths) else 0,
        mean_prompt_tokens=float(lengths.mean()) if len(lengths) else 0.0, shared_tokens=shared_total,
        reordered=0 if order is None else int(np.count_nonzero(order != np.arange(len(order)))),
        top=[SharedPrefix(s.start, len(s.tokens), s.reused, len(s.tokens) * s.reused, s.tokens[:HEAD_TOKENS].copy(),
                          *split_hash_salt(s.cache_salt)) for _, s in ranked],
        blend=None if blend is None else blend.result,
        models=dict(Counter(r.model for r in requests if r.model)))
