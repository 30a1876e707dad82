"""Why each request reused what it did: its prompt tokens split into the tokens a chunk-hash cache reused and the
tokens it lost, by cause, beside the request its best prefix came from.

Per request of ``n`` prompt tokens, in the order every command takes a trace (:mod:`kvcli.traces.order`), at one
chunk size ``cs``:

* ``B``, the **best prefix**: its longest common token prefix with any earlier request of the same cache salt and
  served model (:attr:`kvcli.traces.request.Request.hash_salt`; the token radix of replay's upper bound,
  :class:`kvcli.sim.upper_bound.RadixUpperBound`); ``B_any``, the same over earlier requests of *any* salt and model
  (only traces with two salts or models or more differ); the **predecessor**: the latest earlier
  request that shares ``B_any`` tokens.
* ``U = floor(B / cs) * cs``, the chunks an unlimited chunk-hash store holds for it (its run of chunk hits: every
  earlier request stored each of its full chunks, so a chunk is held iff an earlier prompt holds its whole prefix);
  ``C``, the run the replay's LRU holds at the capacity (:class:`kvcli.sim.lru.ChunkLru`, touched as replay
  touches it); ``F``, the run that is also unexpired at the TTL (expiry as :mod:`kvcli.sim.ttlcurve` rules it:
  a chunk lives ``ttl`` seconds from the write that stored it, or from its last request with ``refresh``; an absent
  chunk, evicted or expired, is written again). ``F <= C <= U <= B <= B_any <= n``.
* With a vLLM engine instead (``--gpu-blocks``: :mod:`kvcli.sim.scheduler` on :mod:`kvcli.sim.blockpool`),
  ``U = floor(reusable(B) / cs) * cs`` (the engine's hit ends on a block boundary at most ``n - 1`` tokens in) and
  ``F = C`` is the run the engine finds cached when it admits the request (its ``num_cached_tokens``). Every
  earlier prompt's blocks were cached by then (the scheduler admits a request only once the requests ahead of it
  have scheduled all of their prompt), so ``U - C`` is eviction, with requests in flight too.
* A request reuses ``reused = reusable(F)`` tokens, ``reusable(h) = min(h, n - 1)``
  (:func:`kvcli.store.hashing.reusable_tokens`: a fully cached prompt still computes its last token), and the rest
  is lost, each span to one cause:

  ============== =========================================================================================
  cause          tokens
  ============== =========================================================================================
  expiry         ``reusable(C) - reusable(F)``: held at the capacity, expired at the TTL
  eviction       ``reusable(A) - reusable(C)``: held by an unlimited store, evicted by the capacity (``A = U``
                 but with a hybrid model)
  chunk_boundary ``reusable(B) - reusable(U)``: the shared prefix ends inside a chunk (its partial chunk)
  hybrid_block   ``reusable(U) - reusable(A)``, with a hybrid model (``hybrid_block``): vLLM's attention block of
                 ``H`` tokens and its align mode resume a request only at ``A``, the longest multiple of ``H``
                 within ``B`` (at most ``n - 1`` tokens) where an earlier request of its salt and model left a Mamba
                 state (:mod:`kvcli.model.hybridblock`); ``C`` and ``F`` are then at most ``A``
  last_token     ``B - reusable(B)``: 1 when the whole prompt was seen before (the engine computes it again)
  cache_salt     ``B_any - B``: shared with an earlier request of another cache salt or model only
  divergence     ``n - B_any`` when the predecessor goes on past ``B_any``: the prompt differs from it there
  new            ``n - B_any`` otherwise: the prompt goes past the end of every earlier prompt it shares a prefix
                 with (a conversation's new turn; all of a first request), which no cache could have held
  ============== =========================================================================================

  so ``reused`` plus the causes is ``n`` for every request. Summed over a trace, ``reused`` is replay's hit tokens
  (less ``hybrid_block``, which replay's store, keeping a state at every chunk, does not lose) and ``reused +
  expiry + eviction + hybrid_block + chunk_boundary`` its token-granular upper bound (reusable(B)).

Where a prompt diverges, :mod:`kvcli.analysis.divergence` names the place: the message, its role and field (chat
traces), or the token position, with an excerpt of both prompts around the first difference.

Cost: one pass over the trace; the radix (4 bytes per distinct token); with a capacity, TTL or engine, each
request's chunk hashes (:mod:`kvcli.store.hashing`) and the LRU's, expiry's or engine's 16-byte keys; for text
traces, every request's token ids and messages are kept to show excerpts (4 bytes per token).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvcli.analysis.divergence import Site, locate
from kvcli.errors import BadInputError
from kvcli.model.hybridblock import DEFAULT_STEP_TOKENS, align_checkpoints
from kvcli.sim.lru import ChunkLru
from kvcli.sim.scheduler import EngineConfig, EngineRequest, EngineSim
from kvcli.sim.ttlcurve import RESOLUTION_SECONDS
from kvcli.sim.upper_bound import PrefixMatch, RadixUpperBound
from kvcli.store.hashing import PromptChunker, reusable_tokens
from kvcli.traces.request import ChatPrompt, Request

#: the causes of lost tokens, in the order reports list them (module docstring).
CAUSES = ("chunk_boundary", "hybrid_block", "eviction", "expiry", "last_token", "cache_salt", "divergence", "new")


@dataclass(frozen=True)
class ExplainConfig:
    """What the cache being explained is.

    Attributes:
        chunk_size: tokens per chunk.
        capacity_chunks: the LRU's capacity in chunks (None: unlimited).
        ttl: seconds a chunk lives (None: no expiry). ttl_refresh: from its last request, not its last write.
        model_id, tokenizer: the chunk hashes' root (:func:`kvcli.store.hashing.namespace_root`), as replay's.
        engine: a vLLM engine instead of an LRU (:class:`kvcli.sim.scheduler.EngineConfig`, block size = chunk
            size): its block pool holds the chunks, and a request reuses what the engine finds cached when it
            admits it. output_tokens: with an engine, the tokens every request generates (None: the trace's
            ``output_length``, 1 where it has none).
        hybrid_block: the attention block vLLM gives a hybrid model (:func:`kvcli.model.hybridblock.
            vllm_attention_block`, tokens), whose align mode resumes a request only where an earlier one left a
            Mamba state (:func:`kvcli.model.hybridblock.align_checkpoints`); None: no such limit (not a hybrid
            model, or an engine simulated with ``engine``). step_tokens: the tokens of one scheduler step, where
            a long prefill leaves its intermediate states.

    Raises:
        BadInputError: a chunk size < 1, a capacity < 0, a TTL <= 0, ``ttl_refresh`` without a TTL, an engine with
            a capacity or a TTL or another block size, or ``output_tokens`` < 1.
    """

    chunk_size: int
    capacity_chunks: int | None = None
    ttl: float | None = None
    ttl_refresh: bool = False
    model_id: str = ""
    tokenizer: str = ""
    engine: EngineConfig | None = None
    output_tokens: int | None = None
    hybrid_block: int | None = None
    step_tokens: int = DEFAULT_STEP_TOKENS

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise BadInputError(f"--chunk-size must be >= 1, got {self.chunk_size}")
        if self.capacity_chunks is not None and self.capacity_chunks < 0:
            raise BadInputError(f"capacity must be >= 0 chunks, got {self.capacity_chunks}")
        if self.ttl is not None and not self.ttl > 0:
            raise BadInputError(f"--ttl must be > 0 seconds, got {self.ttl}")
        if self.ttl_refresh and self.ttl is None:
            raise BadInputError("--ttl-refresh says when a chunk's life starts: it needs --ttl")
        if self.engine is not None and (self.capacity_chunks is not None or self.ttl is not None):
            raise BadInputError("--gpu-blocks is the engine's own capacity and vLLM expires nothing: give it without "
                                "--capacity-tokens, --capacity-bytes and --ttl")
        if self.engine is not None and self.engine.block_size != self.chunk_size:
            raise BadInputError(f"the engine's block size {self.engine.block_size} is not the chunk size "
                                f"{self.chunk_size}")
        if self.hybrid_block is not None and (self.hybrid_block < 1 or self.engine is not None):
            raise BadInputError(f"a hybrid block of {self.hybrid_block} tokens: it must be >= 1, and an engine "
                                "simulated with --gpu-blocks has its own block size")
        if self.output_tokens is not None and self.output_tokens < 1:
            raise BadInputError(f"--output-length must be >= 1 token (vLLM's max_tokens), got {self.output_tokens}")


@dataclass(frozen=True)
class Explanation:
    """One request explained (module docstring; every count in tokens).

    Attributes:
        index: its number in arrival order (0-based). id, source: the trace's id and ``file:line``.
        prompt_tokens: ``n``. reused_tokens: what it reused. best_prefix_tokens: ``B`` (same cache salt).
        best_prefix_tokens_any_salt: ``B_any``. predecessor: the index of the request that prefix came from (-1:
        none shares a token). first_divergent_token: ``B_any`` where the prompt diverges from the predecessor
        (None when it extends it or matches whole). lost_tokens_by_cause: tokens per :data:`CAUSES`.
        cache_salt: the request's salt. site: where it diverges (None: no divergence, or not located).
        reused_from_namespace_tokens: of ``reused_tokens``, those only the live namespace held (``--namespace``).
        timestamp: its arrival time, seconds from the trace's start (None: the trace gives none).
        model: the served model it names ("" for none; :attr:`kvcli.traces.request.Request.model`).
    """

    index: int
    id: str
    source: str
    prompt_tokens: int
    reused_tokens: int
    best_prefix_tokens: int
    best_prefix_tokens_any_salt: int
    predecessor: int
    first_divergent_token: int | None
    lost_tokens_by_cause: dict[str, int]
    cache_salt: str = ""
    site: Site | None = None
    reused_from_namespace_tokens: int = 0
    timestamp: float | None = None
    model: str = ""

    @property
    def upper_bound_tokens(self) -> int:
        """What an unlimited token-granular cache reuses: ``reused + chunk_boundary + hybrid_block + eviction +
        expiry``, which is
        ``reusable(B)`` (replay's upper bound, per request), or what a live namespace read beside gave when more."""
        lost = self.lost_tokens_by_cause
        return self.reused_tokens + lost["chunk_boundary"] + lost["hybrid_block"] + lost["eviction"] + lost["expiry"]


@dataclass
class SiteTotal:
    """Divergences at one place in a trace (:class:`~kvcli.analysis.divergence.Site` label).

    Attributes:
        label: the place. requests: requests that diverge there. tokens: their ``divergence`` tokens.
        example: the first such request's site (its excerpts). example_request: that request's id.
    """

    label: str
    requests: int = 0
    tokens: int = 0
    example: Site | None = None
    example_request: str = ""


@dataclass
class TraceExplanation:
    """A trace explained: totals by cause (tokens), the divergence sites, and each request.

    Attributes:
        requests: requests read. prompt_tokens, reused_tokens, upper_bound_tokens, reused_from_namespace_tokens:
            sums over them.
        lost_tokens_by_cause: tokens per :data:`CAUSES`. sites: divergence places by label.
        explained: every request's :class:`Explanation`, in arrival order (the ids of predecessors resolve here).
        reordered: requests out of timestamp order (0: taken in file order). skipped_empty: empty prompts (not
            requests: replay skips them too).
        chunk_states: for the requests :attr:`Explainer.watch` names (by index), per full chunk whether the
            cache held it (LRU, engine, or stored before when unlimited) and whether it was unexpired, when the
            request came (only with a capacity, TTL or engine).
        preemptions: with an engine, the requests it preempted until the last request was admitted.
            pinned_tokens: of ``reused_tokens``, those of blocks a running request held when the request came.
        models: requests per served model name the trace names (:attr:`kvcli.traces.request.Request.model`; none
            named: empty).
    """

    config: ExplainConfig
    requests: int = 0
    prompt_tokens: int = 0
    reused_tokens: int = 0
    upper_bound_tokens: int = 0
    reused_from_namespace_tokens: int = 0
    lost_tokens_by_cause: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))
    sites: dict[str, SiteTotal] = field(default_factory=dict)
    explained: list[Explanation] = field(default_factory=list)
    reordered: int = 0
    skipped_empty: int = 0
    chunk_states: dict[int, list[tuple[bool, bool]]] = field(default_factory=dict)
    preemptions: int = 0
    pinned_tokens: int = 0
    models: dict[str, int] = field(default_factory=dict)

    def top_sites(self, top: int) -> list[SiteTotal]:
        """The ``top`` divergence sites by lost tokens (ties: more requests, then the label)."""
        return sorted(self.sites.values(), key=lambda s: (-s.tokens, -s.requests, s.label))[:top]

    def matching(self, request: str) -> list[Explanation]:
        """The requests ``request`` names: those with that id, else the one at that source (``file:line``, the
        file as given or its name alone)."""
        by_id = [e for e in self.explained if e.id == request]
        return by_id or [e for e in self.explained if e.source == request or e.source.rsplit("/", 1)[-1] == request]

    def request(self, request: str) -> Explanation:
        """The explanation of the request ``request`` names (:meth:`matching`; the first when an id repeats).

        Raises:
            BadInputError: no request has that id or source.
        """
        found = self.matching(request)
        if not found:
            raise BadInputError(f"no request with id or source {request!r} in the trace (ids are the trace's id "
                                "field, else the reader's: --json lists them under per_request)")
        return found[0]


@dataclass(frozen=True)
class BlockHashes:
    """How the chunk map names blocks: ``hashes(prompt, cache_salt)`` -> one id per full chunk (``prompt``: token ids
    or a hash-id request's block keys, ``Request.prompt``); the scheme as reports name it, with the engine version
    it follows (``scheme``, e.g. ``"vllm-sha256@0.33.0 (vLLM 0.31.0 to 0.34.0 hash alike)"``), and as JSON
    (``described``: :meth:`kvcli.store.enginehash.HashScheme.as_json`)."""

    scheme: str
    hashes: Callable[[Any, str], list[str]]
    described: dict = field(default_factory=dict)


class _Expiry:
    """Chunk expiry for one TTL (the rules of :mod:`kvcli.sim.ttlcurve`): a chunk's time is its last write
    ("after write") or last request (``refresh``); it is present at ``now`` iff ``now - time <= ttl``, to the
    microsecond."""

    def __init__(self, ttl: float, refresh: bool) -> None:
        self.limit, self.refresh = ttl + RESOLUTION_SECONDS, refresh
        self.times: dict[bytes, float] = {}

    def present(self, hashes: list[bytes], now: float) -> list[bool]:
        times, limit = self.times, self.limit
        return [h in times and now - times[h] <= limit for h in hashes]

    def update(self, hashes: list[bytes], present: list[bool], now: float) -> None:
        """After a request at ``now``: absent chunks written; with ``refresh``, every chunk renewed."""
        times = self.times
        for h, here in zip(hashes, present):
            if self.refresh or not here:
                times[h] = now


#: the causes in the order their tokens lie along a prompt, after the reused ones (``new`` and ``divergence``
#: share the tail: a request has one of them).
TOKEN_ORDER = ("expiry", "eviction", "hybrid_block", "chunk_boundary", "last_token", "cache_salt", "divergence",
               "new")


def take_front(lost: dict[str, int], tokens: int, whole: bool = False) -> None:
    """Take ``tokens`` off ``lost`` (tokens per cause, changed in place) from the front of the prompt: the causes in
    :data:`TOKEN_ORDER`, each emptied before the next. With ``whole`` (the whole prompt is reusable now), the one
    token left is the last-token rule's."""
    for cause in TOKEN_ORDER:
        taken = min(tokens, lost[cause])
        lost[cause] -= taken
        tokens -= taken
    if whole:
        left = [c for c in TOKEN_ORDER if lost[c]]
        if left and left != ["last_token"]:
            lost[left[-1]] -= 1
            lost["last_token"] += 1


def _run(flags: Iterable[bool]) -> int:
    """Leading ``True`` flags."""
    k = 0
    for f in flags:
        if not f:
            break
        k += 1
    return k


class Explainer:
    """Explains a trace's requests one at a time, in arrival order (module docstring).

    Args:
        config: the cache. keep_text: keep each request's token ids and messages, so a divergence can be shown
            in the text (text traces). decode: token ids -> text, for excerpts of text prompts (None: token
            positions only). A hash-id request's site is its hash id, at its own block size (``request.blocks``);
            a request with token ids alone (text, and a Mooncake trace's text and delta rows) is sited by token.
        namespace_run: a live cache read beside the simulated one (``--namespace``): ``namespace_run(request)`` is
            the run of the request's chunks it holds from chunk 0 (:meth:`kvcli.store.chunkstore.ChunkStore.lookup`,
            read-only). A request then reuses the longer of the two runs; the tokens the live cache adds are
            ``reused_from_namespace`` and come off the causes in token order (:func:`take_front`).
        render: a chat prompt's token ids under the chat template without the generation prompt, to place a
            difference the template made in the message it renders (:func:`kvcli.analysis.divergence.locate`).
    """

    def __init__(self, config: ExplainConfig, keep_text: bool = False,
                 decode: Callable[[np.ndarray], str] | None = None,
                 namespace_run: Callable[[Request], int] | None = None,
                 render: Callable[[ChatPrompt], np.ndarray] | None = None) -> None:
        self.config, self.keep_text, self.decode = config, keep_text, decode
        self.namespace_run, self.render = namespace_run, render
        self.result = TraceExplanation(config)
        self._radix = RadixUpperBound()  # per cache salt: replay's upper bound
        self._blind: RadixUpperBound | None = None  # every salt as one, once a second salt appears
        self._first_salt: str | None = None
        needs_hashes = config.capacity_chunks is not None or config.ttl is not None or config.engine is not None
        self._chunker = PromptChunker(config.model_id, config.tokenizer, config.chunk_size) if needs_hashes else None
        self._hybrid = (PromptChunker(config.model_id, config.tokenizer, config.hybrid_block)
                        if config.hybrid_block is not None else None)
        self._states: set[bytes] = set()  # the hybrid engine's kept Mamba states: the hashes of their prefixes
        self._engine = EngineSim(config.engine) if config.engine is not None else None
        self._lru = ChunkLru(config.capacity_chunks) if config.capacity_chunks is not None else None
        self._expiry = _Expiry(config.ttl, config.ttl_refresh) if config.ttl is not None else None
        self._clock = 0.0
        self._tokens: list[np.ndarray | None] = []
        self._chats: list[ChatPrompt | None] = []
        self.watch: set[str] = set()  # request ids or sources whose per-chunk states to keep (result.chunk_states)

    def add(self, request: Request) -> Explanation | None:
        """Explain the next request (arrival order) and add it to :attr:`result` (None: an empty prompt, skipped
        and counted in ``skipped_empty``, as replay skips it).

        Raises:
            BadInputError: a TTL is set and the request has no timestamp (its file and line named).
        """
        cfg, res = self.config, self.result
        if not len(request.token_ids):  # as replay: an empty prompt is skipped, never a request
            res.skipped_empty += 1
            return None
        index, tokens, salt = res.requests, request.token_ids, request.hash_salt
        n, cs = len(tokens), cfg.chunk_size
        if self._first_salt is None:
            self._first_salt = salt
        elif salt != self._first_salt and self._blind is None:
            self._blind = self._radix.copy(self._first_salt)
        match = self._radix.match(tokens, salt, index)
        blind = self._blind.match(tokens, "", index) if self._blind is not None else match
        if blind.tokens == match.tokens:  # a request of its own salt shares as much: it is the predecessor
            blind = match
        b, b_any = match.tokens, blind.tokens
        unlimited = b // cs * cs
        held = expired_run = unlimited
        if self._engine is not None:
            unlimited = reusable_tokens(b, n) // cs * cs
            held = expired_run = self._admitted(request, index, n)
        elif self._chunker is not None:
            held, expired_run = self._cached(request, index, unlimited // cs)
        aligned = unlimited
        if self._hybrid is not None:
            aligned = min(unlimited, self._resumed(request, b, n))
            held, expired_run = min(held, aligned), min(expired_run, aligned)
        reuse = {h: reusable_tokens(h, n) for h in (b, unlimited, aligned, held, expired_run)}
        beyond = n - b_any
        diverges = blind.continues and beyond > 0
        lost = {"chunk_boundary": reuse[b] - reuse[unlimited], "hybrid_block": reuse[unlimited] - reuse[aligned],
                "eviction": reuse[aligned] - reuse[held],
                "expiry": reuse[held] - reuse[expired_run], "last_token": b - reuse[b], "cache_salt": b_any - b,
                "divergence": beyond if diverges else 0, "new": 0 if diverges else beyond}
        site = self._site(request, blind) if diverges else None
        reused, from_namespace = reuse[expired_run], 0
        if self.namespace_run is not None:
            live = self.namespace_run(request) * cs
            if reusable_tokens(live, n) > reused:
                from_namespace = reusable_tokens(live, n) - reused
                reused += from_namespace
                take_front(lost, from_namespace, whole=live >= n > 0)
        e = Explanation(index, request.id, request.source, n, reused, b, b_any, blind.predecessor,
                        b_any if diverges else None, lost, request.cache_salt, site, from_namespace, request.timestamp,
                        request.model)
        res.requests += 1
        res.prompt_tokens += n
        if request.model:
            res.models[request.model] = res.models.get(request.model, 0) + 1
        res.reused_tokens += e.reused_tokens
        res.reused_from_namespace_tokens += from_namespace
        res.upper_bound_tokens += e.upper_bound_tokens
        for cause, tokens_lost in lost.items():
            res.lost_tokens_by_cause[cause] += tokens_lost
        if site is not None and lost["divergence"]:
            total = res.sites.get(site.label)
            if total is None:
                total = res.sites[site.label] = SiteTotal(site.label, example=site, example_request=request.id)
            total.requests += 1
            total.tokens += lost["divergence"]
        res.explained.append(e)
        if self.keep_text:
            self._tokens.append(tokens)
            self._chats.append(request.chat)
        return e

    def _resumed(self, request: Request, shared: int, n: int) -> int:
        """The tokens a vLLM engine serving the hybrid model resumes the request from (align mode: the longest
        block boundary within the ``shared`` prefix where an earlier request of its salt and model left a Mamba
        state, at most ``n - 1`` tokens in), then the states this request leaves (``n`` prompt tokens)."""
        assert self._hybrid is not None and self.config.hybrid_block is not None
        block = self.config.hybrid_block
        hashes = self._hybrid.hashes(request.prompt, request.hash_salt)[0]
        resumed = 0
        for k in range(min(shared, n - 1) // block, 0, -1):
            if hashes[k - 1] in self._states:
                resumed = k * block
                break
        self._states.update(hashes[at // block - 1] for at in align_checkpoints(n, block, self.config.step_tokens))
        return resumed

    def _admitted(self, request: Request, index: int, n: int) -> int:
        """``C`` in tokens: the run the engine found cached when it admitted the request (``n`` prompt tokens), and
        the request given to the engine (:meth:`kvcli.sim.scheduler.EngineSim.admit`)."""
        assert self._chunker is not None and self._engine is not None
        cfg = self.config
        hashes = self._chunker.chunk(request.prompt, request.hash_salt).hashes
        out = cfg.output_tokens if cfg.output_tokens is not None else max(request.output_length or 1, 1)
        try:
            admission = self._engine.admit(EngineRequest(index, hashes, n, out, request.timestamp or 0.0))
        except BadInputError as err:
            raise BadInputError(f"{request.source or request.id}: {err}") from None
        self.result.preemptions = self._engine.preemptions
        self.result.pinned_tokens += admission.pinned_tokens
        if self.watch and self._watched(request):
            cs = cfg.chunk_size
            self.result.chunk_states[index] = [(k < admission.cached_tokens // cs, True) for k in range(len(hashes))]
        return admission.cached_tokens

    def _watched(self, request: Request) -> bool:
        return (request.id in self.watch or request.source in self.watch
                or request.source.rsplit("/", 1)[-1] in self.watch)

    def _cached(self, request: Request, index: int, unlimited: int) -> tuple[int, int]:
        """``(C, F)``: the run of chunks the LRU holds, and the run also unexpired, in tokens; then the request's
        chunks are touched (the LRU's and the expiry's). ``unlimited``: the unlimited store's run, chunks."""
        assert self._chunker is not None
        cs = self.config.chunk_size
        hashes = self._chunker.chunk(request.prompt, request.hash_salt).hashes
        lru, expiry = self._lru, self._expiry
        # held: in the LRU; an unlimited store holds a chunk iff an earlier request stored it (the unlimited run)
        in_lru = [h in lru for h in hashes] if lru is not None else [k < unlimited for k in range(len(hashes))]
        if expiry is not None:
            if request.timestamp is None:
                raise BadInputError(f"{request.source}: --ttl needs a timestamp on every request; this one has none")
            self._clock = max(self._clock, request.timestamp)
            fresh = expiry.present(hashes, self._clock)
            present = [a and b for a, b in zip(in_lru, fresh)]
        else:
            fresh, present = [True] * len(hashes), in_lru
        if self.watch and self._watched(request):
            self.result.chunk_states[index] = list(zip(in_lru, fresh))
        if expiry is not None:
            expiry.update(hashes, present, self._clock)
        if lru is not None:
            lru.store(hashes)
        return _run(in_lru) * cs, _run(present) * cs

    def _site(self, request: Request, blind: PrefixMatch) -> Site | None:
        # a hash-id request's own block size (a record's block_size can differ from the trace's declared one); a
        # row of token ids in a hash-id trace (Mooncake text and delta rows) has no hash id to name
        block = request.blocks.block_tokens if request.blocks is not None else None
        if not self.keep_text or blind.predecessor < 0:
            return locate(None, None, None, None, blind.tokens, None, block)
        return locate(request.chat, self._chats[blind.predecessor], request.token_ids,
                      self._tokens[blind.predecessor], blind.tokens, self.decode, block, render=self.render)
