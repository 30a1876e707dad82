"""What a replay produces: per chunk size accounting (:class:`ChunkSizeResult`), per trace (:class:`TraceResult`)
and its answer (:class:`Answer`, filled by :mod:`kvcli.replay.answer`), and the options that produced them
(:class:`ReplayConfig`); the capacity planner's options and result (:class:`PlanOptions`, :class:`PlanResult`, filled
by :mod:`kvcli.replay.planner`). Plain data, JSON-ready through ``to_dict``.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from kvcli.model.kvmemory import GpuTier
    from kvcli.sim.curve import CurveResult

from kvcli.errors import BadInputError
from kvcli.replay.bill import Prices, check_prices
from kvcli.replay.network import Overheads
from kvcli.replay.savings import Interval, Savings, Verdict
from kvcli.sim.blend import BlendReuse, check_recompute_fraction
from kvcli.sim.eviction import libcachesim
from kvcli.sim.tiers import TierSpec, check_tier_sizes, check_tiers
from kvcli.store.serde import check_kv_dtype
from kvcli.units import check_seed


@dataclass(frozen=True)
class PlanOptions:
    """What the planner runs (built at the CLI edge): ``tiers`` fastest first, ``optimal``, ``admit_after`` (1:
    store every new chunk), ``policies`` (beside LRU; empty: none), ``prices`` (None: no bill)."""

    tiers: tuple[TierSpec, ...] = ()
    optimal: bool = False
    admit_after: int = 1
    policies: tuple[str, ...] = ()
    prices: Prices | None = None

    def __post_init__(self) -> None:
        """Raises BadInputError (naming the option): ``admit_after`` < 1, two tiers of one name, a per-GB price of
        a tier not given, policies without libCacheSim installed (checked here, before any work)."""
        if isinstance(self.admit_after, bool) or not isinstance(self.admit_after, int) or self.admit_after < 1:
            raise BadInputError(f"--admit-after must be a count >= 1, got {self.admit_after!r}")
        check_tiers(self.tiers)
        check_prices(self.prices, [t.name for t in self.tiers])
        if self.policies:
            libcachesim()

    @property
    def wanted(self) -> bool:
        """Anything to run (the curve then keeps its chunk ids)."""
        return bool(self.tiers or self.optimal or self.admit_after > 1 or self.policies)


@dataclass
class PlanResult:
    """One chunk size's plan, JSON-ready through :meth:`to_dict` (capacities in chunks, tokens and payload bytes;
    seconds; $). Fields left empty were not asked for. ``optimal``: MIN's ``(hit chunks, whole-prompt hits)`` at
    every capacity (:func:`kvcli.sim.optimal.optimal_by_capacity`; None without ``--optimal``), written into the
    curve's points (:meth:`CurveResult.to_dict <kvcli.sim.curve.CurveResult.to_dict>`), not into :meth:`to_dict`."""

    chunk_size: int
    payload_bytes_per_chunk: int
    capacity_chunks: int
    capacity_source: str
    tiers: list[dict] = field(default_factory=list)
    tier_hit_tokens: int | None = None
    optimal: tuple[np.ndarray, np.ndarray] | None = None
    gap: dict | None = None
    admission: dict | None = None
    policies: list[dict] = field(default_factory=list)
    bill: dict | None = None
    slow_tiers: list[str] = field(default_factory=list)  # tiers whose loads cost more than their recompute
    memory_bytes: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """JSON-ready (without ``optimal``: the curve's points carry it)."""
        return {k: v for k, v in self.__dict__.items() if k != "optimal"}

    def optimal_hit_tokens(self, capacity_chunks: int) -> int:
        """MIN's hit tokens at ``capacity_chunks`` chunks (clipped to the distinct chunks: past them, unlimited).

        Raises:
            ValueError: the plan has no optimal bound (no ``--optimal``).
        """
        if self.optimal is None:
            raise ValueError("the plan has no optimal bound: it needs --optimal")
        hits, whole = self.optimal
        c = min(max(int(capacity_chunks), 0), len(hits) - 1)
        return int(hits[c]) * self.chunk_size - int(whole[c])



@dataclass(frozen=True)
class CapacityBasis:
    """What set a replay's cache capacity (:func:`kvcli.replay.runner.resolve_capacity`): ``kind`` "gpu tier" (the
    per-node GPU tier ``gpu_tier`` of the accelerator that prices the replay), "given" (``--capacity-tokens`` /
    ``--capacity-bytes`` / ``--capacity SIZE``) or "unlimited"; ``why``: in words, for the report."""

    kind: str
    why: str
    gpu_tier: GpuTier | None = None

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"kind": self.kind, "why": self.why,
                "gpu_tier": self.gpu_tier.to_dict() if self.gpu_tier is not None else None}


@dataclass(frozen=True)
class ReplayConfig:
    """Options of one replay (frozen; built at the CLI edge).

    Attributes:
        chunk_sizes: chunk sizes to compare (tokens), each in its own namespace (a size given twice counts once).
        payload: "real" (measured requests write and read real KV) or "accounted" (no payload is ever written).
        measure: requests per trace that run the model (None: all of them).
        measure_max_tokens: the most tokens of a measured prompt that run the model; longer prompts are measured on
            their first tokens (at most this many, fewer when ``measure_seconds`` does not allow it). None: 2,048
            for a count; with ``measure`` None (all), no limit and no budget (whole prompts).
        measure_seconds: model time per trace for measured requests (predicted from the cost curve).
        calibrate_seconds: model time per trace for extending the cost curve's calibration to its prompts.
        store_mode: "async" (stores off the request's path, as LMCache and vLLM's offloading connectors do) or
            "sync": which net benefit picks the chunk size. Both are reported.
        link_gbps / rtt_seconds: the network model (None for both: what was measured on the given server).
        allow_evictions: run even when the preflight says the server will evict keys (maybe other people's).
        capacity_tokens / capacity_bytes: LRU capacity per chunk size (None: unlimited).
        capacity: "auto" (without ``capacity_tokens`` / ``capacity_bytes``: :func:`kvcli.replay.runner.run_replay`
            gives the replay the per-node GPU tier of the accelerator that prices it, :mod:`kvcli.model.kvmemory`,
            and unlimited where no accelerator is named) or "unlimited" (no capacity, asked for).
        sizing: shares of the unlimited cache's hit tokens whose smallest LRU size the report gives per chunk size,
            with its bill (:func:`kvcli.replay.sizing.size_cache`), each in (0, 1]; empty: none.
        namespace: an existing namespace (e.g. one ``kvcli warm`` filled) whose chunks count as hits; it is only
            read, never written. None: a cold cache. Either way the run writes into a fresh namespace of its own.
        keep: keep the run's own namespace (its keys) on the server after the report; deleted by default.
        limit: replay only the first N requests of each trace (more than ``sys.maxsize``: kept as that many).
        memory_sample: keys per chunk size sampled with MEMORY USAGE.
        seed: seed for picking measured requests.
        upper_bound: compute the token-granular upper bound (a radix tree holding each distinct token run once,
            4 bytes per token).
        layouts: key layouts to replay through, side by side (kvcli.store.kvstore.LAYOUTS: "kvcli", "lmcache");
            the first one's results are the report's main table and recommendation.
        hit_curve: compute the hit-token curve over every capacity and a grid of TTLs (kvcli/sim/curve.py; its memory
            grows ~55-95 bytes per distinct chunk per chunk size).
        ttl_refresh: the TTL curve counts a chunk's life from its last access, not its last write.
        verify_sample: distinct chunks per chunk size whose checksum is verified when estimated requests hit
            them with a real payload (their payloads are read, outside the timings); a failure is a miss.
        pipeline: estimated requests per pipelined batch of an index-only store (accounted payloads, no read
            namespace: :mod:`kvcli.store.batch`, two round trips per batch, the same results); 1: one by one.
        priced: every prefill, a measured request's too, is priced by a cost given from outside (a profile
            measured on other hardware, a named accelerator's roofline) and every overhead from counts and rates
            (:func:`kvcli.replay.network.priced_overheads`), so the figures do not move with this machine's load;
            measured requests still run here, to check the KV path (real bytes retrieved, logits compared).
        kv_dtype: the payloads' dtype when it is not the model's (``--kv-dtype``: "fp8" or "float8_e4m3fn",
            kept as torch's name; :mod:`kvcli.store.serde`): every byte figure counts it, and measured requests'
            cached prefills run on the dequantized KV (``max_logit_diff``). None (or "auto"): the model's dtype.
        plan: the capacity planner's options (:mod:`kvcli.replay.planner`: tiers, optimal bound, admission,
            policies, prices); it runs on the curve's chunk ids after the replay.
        blend_recompute: ``--reuse blend``: beside each chunk size's prefix figure, the tokens reusable at any
            position (:mod:`kvcli.sim.blend`, one more pass over the trace after the replay), this share of them
            recomputed, in [0, 1]; None (``--reuse prefix``): not computed.
    """

    chunk_sizes: tuple[int, ...] = (16, 64, 256, 1024)
    payload: str = "real"
    measure: int | None = 2
    measure_max_tokens: int | None = None
    measure_seconds: float = 2.0
    calibrate_seconds: float = 4.0
    store_mode: str = "async"
    link_gbps: float | None = None
    rtt_seconds: float | None = None
    allow_evictions: bool = False
    capacity_tokens: int | None = None
    capacity_bytes: int | None = None
    capacity: str = "auto"
    sizing: tuple[float, ...] = (0.9, 0.95, 0.99)
    namespace: str | None = None
    keep: bool = False
    limit: int | None = None
    memory_sample: int = 200
    seed: int = 0
    upper_bound: bool = True
    layouts: tuple[str, ...] = ("kvcli",)
    hit_curve: bool = True
    ttl_refresh: bool = False
    verify_sample: int = 64
    pipeline: int = 256
    priced: bool = False
    kv_dtype: str | None = None
    plan: PlanOptions = PlanOptions()
    blend_recompute: float | None = None

    def __post_init__(self) -> None:
        """Check the options, alone and together; each message names the ``kvcli replay`` flag that sets them.

        Raises:
            BadInputError: an unknown payload or store mode; a seed outside ``[0, 2**63 - 1]``; a limit,
                measured-token cap, token capacity or pipeline below 1; a link speed that is not a positive number;
                a round trip or time budget that is not a number >= 0; ``ttl_refresh`` without ``hit_curve``; a
                ``--tier`` in tokens smaller than one chunk of a chunk size; the lmcache layout with a read namespace
                or a capacity; ``capacity`` neither "auto" nor "unlimited", or "unlimited" with a capacity; a sizing
                share outside (0, 1]; a ``blend_recompute`` outside [0, 1].
        """
        sizes = self.chunk_sizes
        if (not isinstance(sizes, (tuple, list)) or not sizes
                or not all(isinstance(cs, int) and not isinstance(cs, bool) and cs >= 1 for cs in sizes)):
            raise BadInputError(f"--chunk-sizes must be positive integers, got {sizes!r}")
        object.__setattr__(self, "chunk_sizes", tuple(dict.fromkeys(sizes)))  # a size given twice counts once
        object.__setattr__(self, "kv_dtype", check_kv_dtype(self.kv_dtype))
        check_seed(self.seed)
        if self.measure is not None and (isinstance(self.measure, bool) or not isinstance(self.measure, int)
                                         or self.measure < 0):
            raise BadInputError(f"--measure must be a count >= 0 or all (None), got {self.measure!r}")
        if self.payload not in ("real", "accounted"):
            raise BadInputError(f"--payload must be real or accounted, got {self.payload!r}")
        for flag, value in (("--limit", self.limit), ("--measure-max-tokens", self.measure_max_tokens),
                            ("--capacity-tokens", self.capacity_tokens), ("--pipeline", self.pipeline)):
            check_count(flag, value)
        if self.limit is not None and self.limit > sys.maxsize:  # longer than any trace: all of it (as route reads)
            object.__setattr__(self, "limit", sys.maxsize)
        check_positive("--link-gbps", self.link_gbps)
        # the round trip as given in ms, to the 15 significant digits a typed number has (the division is undone)
        rtt_ms = None if self.rtt_seconds is None else float(f"{self.rtt_seconds * 1e3:.15g}")
        for flag, seconds in (("--rtt-ms", rtt_ms), ("--measure-seconds", self.measure_seconds),
                              ("--calibrate-seconds", self.calibrate_seconds)):
            check_non_negative(flag, seconds)
        if self.capacity not in ("auto", "unlimited"):
            raise BadInputError(f"--capacity must be auto, unlimited or a size, got {self.capacity!r}")
        if self.capacity == "unlimited" and (self.capacity_tokens or self.capacity_bytes):
            raise BadInputError("--capacity unlimited and a capacity (--capacity-tokens, --capacity-bytes): give one")
        if not all(isinstance(f, (int, float)) and not isinstance(f, bool) and 0 < f <= 1 for f in self.sizing):
            raise BadInputError(f"--sizing takes shares of the unlimited hits in (0, 1], got "
                                f"{','.join(map(str, self.sizing))}")
        object.__setattr__(self, "sizing", tuple(sorted(set(self.sizing))))
        if self.blend_recompute is not None:
            object.__setattr__(self, "blend_recompute", check_recompute_fraction(self.blend_recompute))
        if self.store_mode not in ("async", "sync"):
            raise BadInputError(f"--store-mode must be async or sync, got {self.store_mode!r}")
        if self.ttl_refresh and not self.hit_curve:
            raise BadInputError("--ttl-refresh sets the TTL curve's expiry rule: it needs the curve (no --no-curve)")
        if self.plan.wanted and (not self.hit_curve or self.namespace is not None):
            raise BadInputError("--tier, --optimal, --admit-after and --policy run on the curve's chunk stream: they "
                                "need the curve (no --no-curve, no --namespace)")
        for cs in self.chunk_sizes:  # a tier in bytes is checked with the payload's size (Replayer.replay)
            check_tier_sizes(self.plan.tiers, cs)
        if "lmcache" in self.layouts and (self.namespace or self.capacity_tokens or self.capacity_bytes):
            raise BadInputError("--layout lmcache replays a cold cache without a capacity: drop --namespace, "
                                "--capacity-tokens and --capacity-bytes (LMCache's Redis backend leaves eviction "
                                "to the server)")


def check_count(flag: str, value: int | None) -> None:
    """Raise BadInputError naming ``flag`` unless ``value`` is None or >= 1."""
    if value is not None and value < 1:
        raise BadInputError(f"{flag} must be >= 1, got {value}")


def check_positive(flag: str, value: float | None) -> None:
    """Raise BadInputError naming ``flag`` unless ``value`` is None or a finite number > 0."""
    if value is not None and not 0 < value < float("inf"):
        raise BadInputError(f"{flag} must be a positive number, got {value}")


def check_non_negative(flag: str, value: float | None) -> None:
    """Raise BadInputError naming ``flag`` unless ``value`` is None or a finite number >= 0."""
    if value is not None and not 0 <= value < float("inf"):
        raise BadInputError(f"{flag} must be a number >= 0, got {value}")


TIMED_FIELDS = ("lookup_p50_seconds", "lookup_p99_seconds", "lookup_seconds", "transfer_seconds_measured",
                "transfer_seconds_estimated", "deserialize_seconds", "deserialize_seconds_estimated", "store_seconds",
                "store_seconds_estimated")
"""The :class:`ChunkSizeResult` fields timed on this machine's server: null in a priced replay's JSON."""


@dataclass
class ChunkSizeResult:
    """Everything measured for one chunk size (tokens, bytes, seconds, counts).

    Hit tokens are the tokens requests reuse (:func:`kvcli.store.hashing.reusable_tokens`: a prompt that hits
    entirely still computes its last token); ``hit_tokens_metadata_only`` is what the metadata alone would have
    counted (payloads missing, truncated or failing their checksum included). ``upper_bound_tokens`` is None when
    not computed; figures without a denominator or never measured are None (null in JSON, "–" in tables).
    ``short_requests`` / ``short_prompt_tokens``: prompts shorter than one chunk (they can never hit).
    ``blend``: with ``--reuse blend``, the tokens reusable at any position beside ``hit_tokens_unlimited`` (its
    prefix figure: :class:`kvcli.sim.blend.BlendReuse`; None otherwise).
    ``namespace_hit_chunks``: hit chunks the read namespace (``--namespace``) supplied. ``vanished_chunks``: chunks
    of the run a lookup missed after they had gone from the server, not evicted by the store's capacity
    (:meth:`kvcli.store.chunkstore.ChunkStore.vanished_chunks`; None: not known); above 0, or with
    ``redis_errors``, the hit figures are a lower bound (:attr:`understated`).
    """

    chunk_size: int
    namespace: str
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    hit_tokens_metadata_only: int = 0
    hit_tokens_unlimited: int = 0
    upper_bound_tokens: int | None = 0
    short_requests: int = 0
    short_prompt_tokens: int = 0
    namespace_hit_chunks: int = 0
    chunks_hit: int = 0
    objects_created: int = 0
    metadata_entries: int = 0
    chunks_written: int = 0
    payload_bytes_written: int = 0
    payload_bytes_accounted: int = 0
    header_bytes_written: int = 0
    metadata_bytes_written: int = 0
    serialized_bytes_read: int = 0
    redis_memory_bytes: int = 0
    redis_memory_sampled_keys: int = 0
    round_trips: int = 0
    round_trips_by_shard: dict[str, int] = field(default_factory=dict)  # {"host:port": round trips}
    lookups: int = 0
    lookup_p50_seconds: float | None = 0.0
    lookup_p99_seconds: float | None = 0.0
    evicted_chunks: int = 0
    materialized_chunks: int = 0
    checksum_failures: int = 0
    redis_retries: int = 0  # commands re-sent after a dropped connection (redis-py Retry)
    redis_errors: int = 0  # lookups/retrieves/stores that failed after retries: misses, nothing stored
    vanished_chunks: int | None = 0  # own chunks written again after they had gone (None: not known)
    redis_timeouts: int = 0  # replies that did not come within --redis-timeout
    redis_busy_retries: int = 0  # calls sent again after a BUSY reply (another client's long script)
    checksum_verified_chunks: int = 0
    measured_requests: int = 0
    full_prefill_seconds_measured: float = 0.0
    suffix_prefill_seconds_measured: float = 0.0
    saved_prefill_seconds_measured: float = 0.0
    saved_prefill_seconds_estimated: float = 0.0
    lookup_seconds: float = 0.0
    transfer_seconds_measured: float = 0.0
    transfer_seconds_estimated: float = 0.0
    deserialize_seconds: float = 0.0
    store_seconds: float = 0.0
    store_seconds_estimated: float = 0.0
    deserialize_seconds_estimated: float = 0.0
    hit_requests: int = 0
    store_requests: int = 0
    max_logit_diff: float = 0.0
    layout: str = "kvcli"
    lookup_round_trips: int = 0
    lookups_pipelined: int = 0  # lookups answered in pipelined batches (kvcli.store.batch)
    lookups_sampled: int = 0  # unpipelined lookups timed for latency besides them (lookup p50/p99 come from these)
    key_bytes_per_chunk: float = 0.0
    overheads: Overheads | None = None
    savings: Savings | None = None
    store_mode: str = "async"
    hit_curve: CurveResult | None = None  # hit tokens at every capacity and grid TTL (None: --no-curve)
    plan: PlanResult | None = None  # tiers, optimal bound, admission, policies, bill (None: not asked for)
    sizing: list[dict] | None = None  # the smallest LRU per --sizing share, and its bill (None: no curve)
    blend: BlendReuse | None = None  # reuse at any position beside the unlimited prefix figure (--reuse blend)

    @property
    def hit_token_ratio(self) -> float | None:
        """hit tokens / prompt tokens (None without prompt tokens)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def understated(self) -> str:
        """Why this chunk size's hit figures, and the savings built on them, are a lower bound, in words ("" when
        nothing says so): chunks of the run that vanished from the server and were written again
        (``vanished_chunks``), and Redis calls that failed after retries (``redis_errors``: a failed lookup is a
        miss whose request stores nothing)."""
        why = []
        if self.vanished_chunks:
            why.append(f"{self.vanished_chunks:,} of the run's chunks vanished from the server and were written again "
                       f"(deleted by another client, or evicted or expired by the server)")
        if self.redis_errors:
            why.append(f"{self.redis_errors:,} Redis call{'s' if self.redis_errors != 1 else ''} failed "
                       f"(a failed lookup is a miss that stores nothing)")
        return "; ".join(why)

    @property
    def saved_prefill_seconds(self) -> float:
        """Prefill compute saved, measured + estimated (seconds)."""
        if self.savings is not None:
            return self.savings.saved.value
        return self.saved_prefill_seconds_measured + self.saved_prefill_seconds_estimated

    @property
    def overhead_seconds(self) -> float:
        """Critical path + background (lookup, transfer, deserialize, serialize and store) seconds."""
        if self.overheads is not None:
            return self.overheads.critical + self.overheads.background
        return (self.lookup_seconds + self.transfer_seconds_measured + self.transfer_seconds_estimated
                + self.deserialize_seconds + self.deserialize_seconds_estimated + self.store_seconds
                + self.store_seconds_estimated)

    @property
    def net_benefit_seconds(self) -> float:
        """Saved prefill compute − overhead (seconds), for ``store_mode``: async leaves background stores out."""
        if self.savings is not None:
            return self.savings.net(self.store_mode).value
        return self.saved_prefill_seconds - self.overhead_seconds

    def to_dict(self) -> dict:
        """All fields plus the derived ratios and totals, JSON-ready; None where a figure was not computed or has
        no denominator, and for the figures timed on this machine (:data:`TIMED_FIELDS`) when the overheads are
        priced: then ``overheads`` holds what was priced, and nothing of this machine's timings is reported."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("overheads", "savings", "blend")}
        out["blend"] = None if self.blend is None else self.blend.to_dict()
        if self.overheads is not None and not self.overheads.timed:
            out.update(dict.fromkeys(TIMED_FIELDS))
        optimal = self.plan.optimal_hit_tokens if self.plan is not None and self.plan.optimal is not None else None
        out["hit_curve"] = self.hit_curve.to_dict(optimal) if self.hit_curve is not None else None
        out["plan"] = self.plan.to_dict() if self.plan is not None else None
        if self.savings is not None:
            out["savings"] = self.savings.to_dict()
        if self.overheads is not None:
            out["overheads"] = self.overheads.to_dict()
        upper, prompt = self.upper_bound_tokens, self.prompt_tokens
        out.update(hit_token_ratio=self.hit_token_ratio, saved_prefill_seconds=self.saved_prefill_seconds,
                   overhead_seconds=self.overhead_seconds, net_benefit_seconds=self.net_benefit_seconds,
                   loss_to_chunking_tokens=None if upper is None else upper - self.hit_tokens_unlimited,
                   upper_bound_ratio=upper / prompt if upper is not None and prompt else None,
                   hit_token_ratio_unlimited=self.hit_tokens_unlimited / prompt if prompt else None,
                   max_logit_diff=self.max_logit_diff if self.measured_requests else None,
                   metadata_bytes_per_chunk=(self.metadata_bytes_written / self.chunks_written
                                             if self.chunks_written else None),
                   lookup_round_trips_per_lookup=self.lookup_round_trips / self.lookups if self.lookups else None)
        return out


@dataclass(frozen=True)
class Pricing:
    """What priced a replay's prefill, as its answer says it: ``kind`` "timed" (calibrated and timed on this
    machine), "rate" (a flat ``--prefill-tps``), "roofline" (``--hardware``) or "profile" (``--prefill-profile``);
    ``label`` in words: this machine's device ("cpu", "cuda:0"), "3,000 tokens/s", "NVIDIA H100 SXM5 80GB";
    ``gpu_hour_usd``: ``--price gpu-hour`` ($ per accelerator-hour; None: not given)."""

    kind: str = "timed"
    label: str = "cpu"
    gpu_hour_usd: float | None = None

    @property
    def priced(self) -> bool:
        """Whether the prefill seconds are a serving accelerator's (every kind but "timed")."""
        return self.kind != "timed"


@dataclass(frozen=True)
class Answer:
    """A trace's answer, the first lines of its report (:func:`kvcli.replay.answer.answer_lines`), its stderr
    summary line and the ``answer`` object of its JSON (:meth:`to_dict`).

    Attributes:
        verdict: the verdict's kind (:class:`kvcli.replay.savings.Verdict`: "clear", "tie", "noise", "none"), or
            "empty" when no request had a prompt.
        chunk_size: the chunk size to use: the recommended one, or the tie's pick; None: do not cache.
        focus: the chunk size the figures are of (``chunk_size``, or the most hopeful when none pays off).
        tied: the sizes that tie (the tie's pick is the one that writes the fewest objects); ``sizes``: every
            chunk size compared.
        hit_token_ratio: at ``focus``. saved, share, net: prefill seconds saved, its share of the trace's prefill
            and the net benefit at ``focus``, with their 95% intervals (None without savings); ``store_mode``: the
            stores ``net`` assumes ("async", "sync").
        pricing: what priced the prefill. per_day: accelerator-seconds of prefill saved per day of this traffic
            (the trace repeating at its own rate), with its interval; usd_per_day: the same at ``pricing``'s
            gpu-hour price; None where there is no rate (no timestamps) or nothing prices it.
        cache_bytes: KV payload bytes an unbounded cache holds at ``focus`` (every distinct chunk; None unknown).
        capacity_text: the cache the answer assumes, in words; sizing_text: how big a cache must be (None: not
            computed); assumption: the one assumption that moves the answer most, in words.
    """

    verdict: str
    chunk_size: int | None
    focus: int | None
    tied: tuple[int, ...] = ()
    sizes: tuple[int, ...] = ()
    hit_token_ratio: float | None = None
    saved: Interval | None = None
    share: Interval | None = None
    net: Interval | None = None
    store_mode: str = "async"
    pricing: Pricing = Pricing()
    per_day: Interval | None = None
    usd_per_day: Interval | None = None
    cache_bytes: int | None = None
    capacity_text: str = ""
    sizing_text: str | None = None
    assumption: str = ""

    def to_dict(self) -> dict:
        """JSON-ready, unit-suffixed (intervals as ``{value, low, high}``)."""
        def iv(x: Interval | None) -> dict | None:
            return None if x is None else x.to_dict()

        return {"verdict": self.verdict, "chunk_size": self.chunk_size, "focus_chunk_size": self.focus,
                "tied_chunk_sizes": list(self.tied), "hit_token_ratio": self.hit_token_ratio,
                "saved_prefill_seconds": iv(self.saved), "saved_prefill_share": iv(self.share),
                "net_benefit_seconds": iv(self.net), "store_mode": self.store_mode,
                "pricing": {"kind": self.pricing.kind, "label": self.pricing.label,
                            "gpu_hour_usd": self.pricing.gpu_hour_usd},
                "accelerator_seconds_per_day": iv(self.per_day), "usd_per_day": iv(self.usd_per_day),
                "cache_payload_bytes": self.cache_bytes, "capacity_text": self.capacity_text,
                "sizing_text": self.sizing_text, "assumption": self.assumption}


@dataclass
class TraceResult:
    """One trace's replay: per chunk size results, the recommendation and run-level facts."""

    trace: str
    requests: int
    skipped_empty: int
    measured_requests: int
    payload: str
    per_chunk_size: list[ChunkSizeResult]
    used_memory_delta_bytes: int | None = 0  # None: INFO not permitted
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    by_layout: dict[str, list[ChunkSizeResult]] = field(default_factory=dict)
    verdict: Verdict | None = None
    store_mode: str = "async"
    calibration: dict = field(default_factory=dict)
    cost_curve: dict = field(default_factory=dict)
    preflight: dict = field(default_factory=dict)
    server_evicted_keys: int | None = None
    measure_tokens: int = 0
    measured: list[dict] = field(default_factory=list)
    span_seconds: float | None = None
    network: dict | None = None
    server_rates: dict = field(default_factory=dict)
    left_behind: str = ""  # the run's namespace could not be deleted: what was left and how to remove it
    answer: Answer | None = None  # the first lines of the report (kvcli.replay.answer); None: not made yet
    capacity: dict | None = None  # the cache the figures assume, what set it, and what unlimited would need
    pricing: dict | None = None  # how prefill and the overheads were found: priced (and at what) or timed here

    @property
    def recommended_chunk_size(self) -> int | None:
        """The recommended chunk size (:func:`kvcli.replay.savings.recommend`: it beats the runner-up by more
        than their intervals), or None: a tie, or nothing pays off."""
        if self.verdict is not None:
            return self.verdict.chunk_size
        rows = [r for r in self.per_chunk_size if r.requests and r.net_benefit_seconds > 0]
        return max(rows, key=lambda r: r.net_benefit_seconds).chunk_size if rows else None
