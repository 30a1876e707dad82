"""vLLM's scheduler over its block pool, step by step: which prompt blocks each request finds cached when the engine
admits it (vLLM's ``num_cached_tokens``), with requests in flight, pinned blocks and preemption.

The rules, as vLLM 0.32.0's synchronous scheduler keeps them (``vllm/v1/core/sched/scheduler.py``: ``schedule``,
``update_from_output``; the block accounting in ``vllm/v1/core/kv_cache_manager.py``: ``get_computed_blocks``,
``allocate_slots``, and ``vllm/v1/core/single_type_kv_cache_manager.py``), on the pool of
:mod:`kvcli.sim.blockpool`:

* **A step** has a token budget (``max_num_batched_tokens``). Running requests come first, in admission order,
  each given its remaining tokens (a decode step: 1) up to the budget left (chunked prefill). Then, when no
  request was preempted in the step, waiting requests are admitted first come first served while fewer than
  ``max_num_seqs`` run and budget is left; the first that cannot be admitted stops admission.
* **Admission** looks the prompt up once: the longest run of cached blocks from block 0, at most
  ``(num_tokens - 1) // block_size`` blocks (the last token is always computed, so a fully cached prompt of whole
  blocks computes its last block again). That run is the request's cached tokens. The request is admitted only
  if the blocks of its whole sequence so far fit in the free queue (``scheduler_reserve_full_isl``; its hits that
  wait in the free queue count against it).
* **Blocks** are allocated for the tokens a step schedules: ``ceil((computed + scheduled) / block_size)`` held in
  all. The full blocks among them are cached at once (when scheduled, not when computed): a request admitted
  later in the same step already hits them. A prefix its owner has not yet scheduled would be no hit, but the
  budget goes to running requests first and a chunk cut short leaves none, so no request is admitted while an
  earlier one has prompt tokens left to schedule: with requests in flight too, every earlier prompt's blocks have
  been cached by the time a request is looked up, and what it misses was evicted.
* **Output tokens** need blocks too: a request that generates ``L`` tokens holds ``ceil((P + L - 1) /
  block_size)`` blocks at the end (its last token is never fed back), while it runs and so pinned. A full block
  of output tokens is cached under a key of its own (the generated tokens are not known here, so no other prompt
  hits it) and takes a place in the free queue when freed.
* **A request that cannot get its blocks** preempts the last running request (FCFS), which frees all of its
  blocks and goes back to the head of the waiting queue (possibly itself). Only the first admission sets the
  cached tokens (vLLM records them once).
* **After the step** every scheduled request whose prompt is done gets one output token; a request with all of
  its output tokens frees its blocks (:meth:`kvcli.sim.blockpool.BlockPool.free`), in the order they were
  scheduled.

Time, the one part kvcli models rather than takes from vLLM: requests arrive at their timestamps (or all at 0:
``at_once``, an offline batch) and join the waiting queue at the first step that starts at or after that; a step
takes ``step_seconds + scheduled tokens / prefill_tokens_per_second``; an idle engine waits for the next arrival.
With ``max_num_seqs = 1`` one request runs at a time and time changes nothing.

Not modelled: speculative decoding, KV connectors and offloading, LoRA, multimodal inputs, priority scheduling,
``long_prefill_token_threshold``, a watermark, ``max_model_len`` (every request must fit the pool), stop strings
or EOS before the output length, async scheduling (vLLM's CPU backend runs the synchronous scheduler), and a later
prompt that holds a previous request's generated tokens (its output blocks never hit).

Use: :meth:`EngineSim.admit` takes requests in arrival order and runs the engine until each is admitted, so a
caller explains request ``i`` before it reads request ``i + 1`` (admission is first come first served, so later
requests cannot change an earlier one's figures).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field

from kvcli.errors import BadInputError
from kvcli.sim.blockpool import BlockPool

DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # vLLM 0.32.0's SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS
DEFAULT_STEP_SECONDS = 0.02
DEFAULT_PREFILL_TOKENS_PER_SECOND = 10_000.0


#: the largest ``num_gpu_blocks`` simulated (2**24): the block pool keeps every block (~130 bytes each, ~2 GiB at
#: this bound), and no engine holds that many (an H200's 141 GB at 16 tokens a block and 8 KB of KV a token, a very
#: small model's, is ~1.1 M blocks)
MAX_GPU_BLOCKS = 1 << 24


@dataclass(frozen=True)
class EngineConfig:
    """The engine whose prefix cache is simulated (module docstring).

    Attributes:
        num_gpu_blocks: vLLM's ``num_gpu_blocks`` (its log's KV cache size in blocks, or
            ``num_gpu_blocks_override``), the null block included. block_size: tokens per block.
        max_num_seqs: requests running at once (1: one at a time). max_num_batched_tokens: tokens per step.
        step_seconds: a step's fixed time (a decode step), seconds. prefill_tokens_per_second: what each scheduled
            token adds to it. at_once: every request arrives at time 0 (an offline batch), timestamps ignored.

    Raises:
        BadInputError: fewer than 2 blocks or more than :data:`MAX_GPU_BLOCKS`, a block size, ``max_num_seqs`` or
            ``max_num_batched_tokens`` < 1, a step time < 0, or a prefill rate <= 0.
    """

    num_gpu_blocks: int
    block_size: int
    max_num_seqs: int = 1
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    step_seconds: float = DEFAULT_STEP_SECONDS
    prefill_tokens_per_second: float = DEFAULT_PREFILL_TOKENS_PER_SECOND
    at_once: bool = False

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 2:
            raise BadInputError(f"--gpu-blocks must be >= 2 (block 0 is vLLM's null block), got {self.num_gpu_blocks}")
        if self.num_gpu_blocks > MAX_GPU_BLOCKS:
            raise BadInputError(f"--gpu-blocks must be <= {MAX_GPU_BLOCKS:,} (the simulated pool keeps each block: "
                                f"~130 bytes apiece), got {self.num_gpu_blocks:,}; a pool that never fills evicts "
                                f"nothing: leave --gpu-blocks out for an unlimited cache")
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise BadInputError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not self.step_seconds >= 0:
            raise BadInputError(f"--step-seconds must be >= 0, got {self.step_seconds}")
        if not self.prefill_tokens_per_second > 0:
            raise BadInputError(f"--prefill-tokens-per-second must be > 0, got {self.prefill_tokens_per_second}")

    @property
    def kv_blocks(self) -> int:
        """Blocks that hold KV: all but the null block."""
        return self.num_gpu_blocks - 1


@dataclass(frozen=True)
class EngineRequest:
    """One request as the engine sees it.

    Attributes:
        index: its number in arrival order (0-based). keys: one key per full block of its prompt
            (``prompt_tokens // block_size`` of them), chained over the prefix and salted (kvcli's chunk hashes).
        prompt_tokens: ``P``. output_tokens: ``L >= 1``, the tokens it generates. arrival: seconds.
    """

    index: int
    keys: Sequence[Hashable]
    prompt_tokens: int
    output_tokens: int = 1
    arrival: float = 0.0


@dataclass(frozen=True)
class Admission:
    """What one request found when the engine first admitted it.

    Attributes:
        index: the request's. cached_tokens: the run of cached blocks it reused, tokens (a multiple of the block
            size; vLLM's ``num_cached_tokens``). pinned_tokens: of those, the tokens of blocks a running request
            held (no capacity could have evicted them). step: the engine step that admitted it (0-based). time:
            that step's start, seconds.
    """

    index: int
    cached_tokens: int
    pinned_tokens: int
    step: int
    time: float


@dataclass(eq=False)
class _Seq:
    """A request inside the engine: its blocks and progress (tokens)."""

    request: EngineRequest
    blocks: list[int] = field(default_factory=list)
    cached: int = 0  # blocks of ``blocks`` cached so far
    computed: int = 0
    outputs: int = 0
    admitted: bool = False

    @property
    def num_tokens(self) -> int:
        return self.request.prompt_tokens + self.outputs

    def key(self, j: int) -> Hashable:
        keys = self.request.keys
        return keys[j] if j < len(keys) else ("output", self.request.index, j)


@dataclass
class _Step:
    budget: int
    scheduled: list[tuple[_Seq, int]] = field(default_factory=list)
    preempted: bool = False


class EngineSim:
    """vLLM's scheduler and block pool, run over requests given in arrival order (module docstring). Source:
    ``Scheduler.schedule`` and ``update_from_output`` in ``vllm/v1/core/sched/scheduler.py``,
    ``KVCacheManager.get_computed_blocks`` and ``allocate_slots`` in ``vllm/v1/core/kv_cache_manager.py``, vLLM
    0.32.0.

    Attributes:
        config: the engine. pool: its :class:`~kvcli.sim.blockpool.BlockPool`. steps: steps run. clock: the time
            of the next step, seconds. preemptions: requests preempted so far.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.pool = BlockPool(config.num_gpu_blocks)
        self.steps, self.clock, self.preemptions = 0, 0.0, 0
        self._inbox: deque[EngineRequest] = deque()  # given, not yet arrived
        self._waiting: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._loop = self._run()

    def admit(self, request: EngineRequest) -> Admission:
        """Give the engine the next request (arrival order) and run it until that request is admitted.

        Raises:
            BadInputError: the request's tokens (prompt and output but the last) need more blocks than the pool's
                ``num_gpu_blocks - 1`` (vLLM would refuse it: its ``max_model_len`` fits the pool); the message
                leaves naming the request to the caller.
        """
        cfg, n = self.config, request.prompt_tokens + request.output_tokens - 1
        if -(-n // cfg.block_size) > cfg.kv_blocks:
            raise BadInputError(
                f"{request.prompt_tokens:,} prompt and {request.output_tokens:,} output tokens need "
                f"{-(-n // cfg.block_size):,} blocks of {cfg.block_size}, but {cfg.num_gpu_blocks:,} GPU blocks hold "
                f"{cfg.kv_blocks:,} (block 0 is the null block): vLLM would refuse the request")
        self._inbox.append(request)
        for admission in self._loop:
            if admission.index == request.index:
                return admission
        raise AssertionError("the engine's loop never ends")

    # -- the step loop --------------------------------------------------------------------------------------------

    def _run(self) -> Iterator[Admission]:
        """Steps forever, yielding each first admission. It runs only inside :meth:`admit`, so the inbox holds the
        request being admitted whenever the loop looks at it."""
        while True:
            if not self._running and not self._waiting:
                self.clock = max(self.clock, self._arrival(self._inbox[0]))
            step = _Step(self.config.max_num_batched_tokens)
            self._schedule_running(step)
            if not step.preempted:
                yield from self._schedule_waiting(step)
            self._finish(step)

    def _arrival(self, request: EngineRequest) -> float:
        return 0.0 if self.config.at_once else request.arrival

    def _schedule_running(self, step: _Step) -> None:
        i = 0
        while i < len(self._running) and step.budget > 0:
            seq = self._running[i]
            new = min(seq.num_tokens - seq.computed, step.budget)
            while not self._allocate(seq, new):
                victim = self._running.pop()
                self._preempt(victim)
                step.preempted = True
                if victim is seq:
                    return
            step.scheduled.append((seq, new))
            step.budget -= new
            i += 1

    def _schedule_waiting(self, step: _Step) -> Iterator[Admission]:
        bs, pool = self.config.block_size, self.pool
        while step.budget > 0:
            if not self._waiting:
                if not self._inbox or self._arrival(self._inbox[0]) > self.clock:
                    return
                self._waiting.append(_Seq(self._inbox.popleft()))
            if len(self._running) >= self.config.max_num_seqs:
                return
            seq = self._waiting[0]
            hits = pool.cached_run([seq.key(j) for j in range((seq.num_tokens - 1) // bs)])
            pinned = len(hits) - pool.evictable(hits)
            new = min(seq.num_tokens - len(hits) * bs, step.budget)
            if not self._allocate(seq, new, hits, must_fit=True):
                return
            self._waiting.popleft()
            self._running.append(seq)
            seq.computed = len(hits) * bs
            step.scheduled.append((seq, new))
            step.budget -= new
            if not seq.admitted:
                seq.admitted = True
                yield Admission(seq.request.index, len(hits) * bs, pinned * bs, self.steps, self.clock)

    def _allocate(self, seq: _Seq, new: int, hits: Sequence[int] = (), must_fit: bool = False) -> bool:
        """vLLM's ``allocate_slots`` for ``new`` tokens after ``hits`` (a waiting request's cached blocks): False,
        changing nothing, when the free queue is short."""
        pool, bs = self.pool, self.config.block_size
        held = len(seq.blocks) + len(hits)
        computed = seq.computed + len(hits) * bs
        evictable = pool.evictable(hits)
        if must_fit and max(-(-seq.num_tokens // bs) - held, 0) + evictable > pool.free_blocks:
            return False
        need = max(-(-(computed + new) // bs) - held, 0)
        if need + evictable > pool.free_blocks:
            return False
        if hits:
            pool.touch(hits)
            seq.blocks.extend(hits)
            seq.cached = len(seq.blocks)
        seq.blocks.extend(pool.allocate(need))
        full = min(computed + new, seq.num_tokens) // bs
        for j in range(seq.cached, full):
            pool.cache(seq.blocks[j], seq.key(j))
        seq.cached = max(seq.cached, full)
        return True

    def _preempt(self, seq: _Seq) -> None:
        self.pool.free(seq.blocks)
        seq.blocks, seq.cached, seq.computed = [], 0, 0
        self._waiting.appendleft(seq)
        self.preemptions += 1

    def _finish(self, step: _Step) -> None:
        """The step runs: progress, the clock, one output token for each request past its prompt, and the frees
        of those done."""
        cfg = self.config
        for seq, new in step.scheduled:
            seq.computed += new
        tokens = sum(new for _, new in step.scheduled)
        self.clock += cfg.step_seconds + tokens / cfg.prefill_tokens_per_second
        self.steps += 1
        for seq, _ in step.scheduled:
            if seq.computed < seq.num_tokens:
                continue  # a prefill chunk: no token sampled
            seq.outputs += 1
            if seq.outputs >= seq.request.output_tokens:
                self.pool.free(seq.blocks)
                self._running.remove(seq)
