"""What a replay produces: per chunk size accounting (:class:`ChunkSizeResult`), per trace (:class:`TraceResult`),
and the options that produced them (:class:`ReplayConfig`). Plain data, JSON-ready through ``to_dict``.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReplayConfig:
    """Options of one replay (frozen; built at the CLI edge).

    Attributes:
        chunk_sizes: chunk sizes to compare (tokens), each in its own namespace.
        payload: "real" (measured requests write and read real KV) or "accounted" (no payload is ever written).
        measure: requests per trace that run the model (None: all of them).
        measure_max_tokens: longest prompt picked for measuring (tokens); longer ones are estimated.
        capacity_tokens / capacity_bytes: LRU capacity per chunk size (None: unlimited).
        namespace: an existing namespace (e.g. one ``kvcli warm`` filled) whose chunks count as hits; it is only
            read, never written. None: a cold cache. Either way the run writes into a fresh namespace of its own.
        keep: keep the run's own namespace (its keys) on the server after the report; deleted by default.
        limit: replay only the first N requests of each trace.
        memory_sample: keys per chunk size sampled with MEMORY USAGE.
        seed: seed for picking measured requests.
        upper_bound: compute the token-granular upper bound (a radix tree holding each distinct token run once,
            4 bytes per token: the one part of a replay whose memory grows with the trace).
        pipeline: estimated requests per pipelined round trip (kvcli.store.batch: the same results, two round
            trips per batch; lookup latency from sampled unpipelined lookups); 1: one request at a time.
    """

    chunk_sizes: tuple[int, ...] = (16, 64, 256, 1024)
    payload: str = "real"
    measure: int | None = 2
    measure_max_tokens: int = 512
    capacity_tokens: int | None = None
    capacity_bytes: int | None = None
    namespace: str | None = None
    keep: bool = False
    limit: int | None = None
    memory_sample: int = 200
    seed: int = 0
    upper_bound: bool = True
    pipeline: int = 256


@dataclass
class ChunkSizeResult:
    """Everything measured for one chunk size (tokens, bytes, seconds, counts)."""

    chunk_size: int
    namespace: str
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    hit_tokens_unlimited: int = 0
    upper_bound_tokens: int = 0
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
    lookup_p50_seconds: float = 0.0
    lookup_p99_seconds: float = 0.0
    lookups_pipelined: int = 0  # answered in batches: their latency is the sampled lookups' (lookups_sampled)
    lookups_sampled: int = 0
    evicted_chunks: int = 0
    materialized_chunks: int = 0
    checksum_failures: int = 0
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
    max_logit_diff: float = 0.0

    @property
    def hit_token_ratio(self) -> float:
        """hit tokens / prompt tokens."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def saved_prefill_seconds(self) -> float:
        """Prefill compute saved, measured + estimated (seconds)."""
        return self.saved_prefill_seconds_measured + self.saved_prefill_seconds_estimated

    @property
    def overhead_seconds(self) -> float:
        """Lookup + transfer + deserialize + store (management) seconds."""
        return (self.lookup_seconds + self.transfer_seconds_measured + self.transfer_seconds_estimated
                + self.deserialize_seconds + self.store_seconds + self.store_seconds_estimated)

    @property
    def net_benefit_seconds(self) -> float:
        """Saved prefill compute − lookup, transfer and management overhead (seconds): the design notes' goal."""
        return self.saved_prefill_seconds - self.overhead_seconds

    def to_dict(self) -> dict:
        """All fields plus the derived ratios and totals, JSON-ready."""
        out = dict(self.__dict__)
        out.update(hit_token_ratio=self.hit_token_ratio, saved_prefill_seconds=self.saved_prefill_seconds,
                   overhead_seconds=self.overhead_seconds, net_benefit_seconds=self.net_benefit_seconds,
                   loss_to_chunking_tokens=self.upper_bound_tokens - self.hit_tokens_unlimited,
                   upper_bound_ratio=self.upper_bound_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
                   hit_token_ratio_unlimited=(self.hit_tokens_unlimited / self.prompt_tokens
                                              if self.prompt_tokens else 0.0))
        return out


@dataclass
class TraceResult:
    """One trace's replay: per chunk size results, the recommendation and run-level facts."""

    trace: str
    requests: int
    skipped_empty: int
    measured_requests: int
    payload: str
    per_chunk_size: list[ChunkSizeResult]
    used_memory_delta_bytes: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def recommended_chunk_size(self) -> int | None:
        """The chunk size with the largest net benefit; None when no chunk size has a positive net benefit."""
        rows = [r for r in self.per_chunk_size if r.requests and r.net_benefit_seconds > 0]
        return max(rows, key=lambda r: r.net_benefit_seconds).chunk_size if rows else None
