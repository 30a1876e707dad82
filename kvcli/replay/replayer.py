"""Replay a trace through the chunk-hash KV-cache store, one namespace per chunk size, and account what it saves.

Per request, in arrival order (timestamps when every request has one, stable; else file order: the order every
command uses, kvcli.traces.order), for every chunk size: lookup (one round trip: metadata, and the length of every
real payload), retrieve the hit run's KV (one more), prefill only the missed suffix with the real model, store the
new full chunks (one pipelined round trip).

Before anything is written: the trace is validated (a trace file of :data:`STREAM_BYTES` or more replayed without a
model is instead checked as the replay reads it, in the one pass that hashes it: a bad record then ends the run and
its keys are deleted; a file that turns out not to be in arrival order is replayed again, ordered), the cost curve is
extended to cover its prompt lengths
(:class:`~kvcli.model.calibration.Calibration`, within ``calibrate_seconds``), and the server's memory is checked
(:mod:`kvcli.store.preflight`, the same preflight as warm): a run that would make an evicting server go over
maxmemory is refused unless ``allow_evictions``. The server's ``evicted_keys`` delta is reported; an evicted
chunk (metadata or payload: the lookup checks both) is a miss.

Measured vs estimated: ``measure`` requests (spread evenly over the trace) run the model on their first ``L``
tokens, ``L`` the longest length the ``measure_seconds`` budget allows (:func:`~kvcli.replay.measure.measure_length`,
at most ``measure_max_tokens``; shorter prompts run whole; with ``measure`` None every request runs whole): their
full prefill is timed once, and per chunk size the cached path (lookup + transfer + deserialize + suffix prefill,
plus the store) is timed for real, with the largest logit difference against the full prefill recorded. The other
requests, and the rest of a truncated prompt, are estimated: the lookup and metadata writes are real, payload bytes
are accounted, not written, prefill times come from the cost curve and transfer times from chunk SET/GET timings
calibrated on the same server (or the network model, :mod:`kvcli.replay.network`). When a measured request hits
chunks whose payload was only accounted, their KV is taken from its own full prefill and written first, untimed
("materialized"), so the timed retrieve reads real bytes. Savings, intervals and the recommendation:
:mod:`kvcli.replay.savings`.

``payload="accounted"`` writes no payload at all (index and metadata only): traces whose KV would never fit the
server replay in seconds; measured requests then use their own prefix KV and an estimated transfer time.

Hit tokens never exceed the prompt: only full chunks hit. A request needs at least one token of compute for its
logits, so a prompt that hits entirely reuses ``len - 1`` tokens (vLLM recomputes the last token): hit tokens,
timings and the upper bound all count :func:`kvcli.store.hashing.reusable_tokens`.

Hits of estimated requests are what an engine could load: the lookup checks every real payload's presence and
length in its one round trip; the checksums of up to ``verify_sample`` distinct real-payload chunks per chunk size
are verified (their payloads read, outside the timings), and a chunk that fails is a miss from then on.

Parallel: each store's replay depends on no other store's (its own prefix, LRU and counts), so the stores split
into units (:mod:`kvcli.replay.work`) that :meth:`Replayer.replay_unit` runs (:mod:`kvcli.replay.unit`: the
per-request loop, with one :class:`~kvcli.replay.lane.Lane` per store holding its accounting), in this process or,
with ``units`` set, in worker processes or Ray tasks (:mod:`kvcli.replay.parallel`); everything before
(validation, calibration, measured picks, preflight, transfer rates) and after (merge, savings, verdict, notes,
cleanup) runs here once.

Faults: the stores absorb a Redis call that fails after retries (:mod:`kvcli.store.chunkstore`: the request is a
miss at that chunk size and stores nothing; counted per chunk size) until the server is taken as gone. The run's
own calls (INFO and DBSIZE, CONFIG GET, the sentinel's SET and DEL, the transfer calibration, the read of each
store's Redis memory, the cleanup's UNLINKs) count towards the same rule and are sent again after a failed attempt
(:func:`kvcli.store.calls.resend`), so a stall ends the run or not by its length in reply timeouts, whichever call
it lands on. After a
dropped connection or a timeout they check that the server is still the one the run started on, holding the run's
sentinel key (:mod:`kvcli.store.runmark`); when it is not (restarted, replaced, flushed) the run stops (exit 3).
The run's own namespace is deleted at the end, and also after an error, Ctrl-C or SIGTERM ("deleting namespace X…"):
on a given server, the keys its stores recorded as they wrote them (:mod:`kvcli.store.written`); when that deletion
fails or is interrupted again, what was left and the command that removes it are said.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np
import redis
from redis.cluster import RedisCluster

from kvcli.errors import BadInputError, KvcliError, RedisFailure
from kvcli.model.costcurve import PrefillCost, PrefillSample
from kvcli.model.hybridblock import vllm_attention_block
from kvcli.model.presets import ModelConfig, ModelSpec
from kvcli.replay.measure import (
    calibrate_transfer,
    curve_check,
    measure_length,
    pick_measured,
    ping_seconds,
)
from kvcli.replay.network import (
    PRICED_LINK,
    DeviceRates,
    Link,
    ServerRates,
    overheads,
    priced_overheads,
    repeat_spread,
)
from kvcli.replay.notes import hybrid_note, namespace_misses, replay_notes
from kvcli.replay.plan import replay_preflight, room
from kvcli.replay.results import CapacityBasis, ChunkSizeResult, ReplayConfig, TraceResult
from kvcli.replay.savings import DRAWS, TimedSavings, recommend, summarize
from kvcli.replay.sizing import capacity_record, size_cache
from kvcli.replay.unit import Unordered, replay_stores
from kvcli.replay.work import Part, Work, merge_logs, merge_parts, merged_samples
from kvcli.sim.blend import BlendCounter
from kvcli.sim.tiers import check_tier_sizes
from kvcli.store.calls import resend
from kvcli.store.cluster import drop_connections
from kvcli.store.kvstore import KVStore, make_store, purge_run
from kvcli.store.lmcache import lmcache_layouts
from kvcli.store.namespace import contents
from kvcli.store.preflight import Preflight, ServerMemory, evicted_since, server_memory
from kvcli.store.records import StoreConfig
from kvcli.store.runmark import RunMark, delete_sentinel, mark_run, write_sentinel
from kvcli.store.server import INFO_REFUSED
from kvcli.store.written import WrittenChunks
from kvcli.traces.order import arrival_order, order_note
from kvcli.traces.request import Request, models_note

if TYPE_CHECKING:
    from kvcli.model.calibration import Calibration

PRICED_MEASURE_TOKENS = 1024  # tokens a measured request runs in a priced replay, unless --measure-max-tokens
STREAM_BYTES = 1 << 20  # a trace file this large or larger, replayed without a model, is checked as it is read


class Replayer:
    """Replays traces through one store (:class:`~kvcli.store.kvstore.KVStore`) per layout and chunk size on one
    Redis server.

    Args:
        client: a redis-py client.
        model: the local model (``prefill``, ``spec``), or None when nothing is measured (then ``spec`` names
            the model id, per-token KV shape and dtype the store accounts for).
        curve: the prefill cost curve when it is fixed (e.g. a flat ``--prefill-tps`` rate); with ``calibration``
            it is replaced, per trace, by the calibration's fit after covering the trace. The measured requests'
            single timings are kept in ``measured_samples`` to check it, not fitted (one noisy timing per point
            would drag the fit around: on a shared machine a single timing can include a stall of a few hundred
            milliseconds).
        tokenizer: tokenizer name (part of the hash root).
        config: the replay's options.
        spec: the model's id, per-token KV shape and dtype when ``model`` is None (else the model's own).
        calibration: the pool of timed prefills that covers each trace (None: ``curve`` as given).
        model_config: the model's shapes, for exact FLOPs (default: the model's; None without a model: no FLOPs).
        notify: gets one line at a time for the user (the cleanup after an interruption, what was left); None:
            nothing said.
        phase: told each phase of a trace as it begins (reading, calibrating prefill further, replaying, cleaning
            up: :meth:`kvcli.replay.events.ReplayEvents.phase`); None: nothing told.
        remedy: ``remedy(namespace)``: how to remove what a run left in ``namespace``, for the notes (default:
            the ``kvcli purge`` command for it).
        units: where a trace's units run (:func:`kvcli.replay.parallel.make_units`'s worker processes or Ray
            tasks); None: every store in this process.
        prefetch: hash the trace in a child process (:mod:`kvcli.replay.prefetch`): None when it pays, True
            whenever it can, False never (e.g. a worker process: the cores are shared).
        device: host <-> device rates of the serving device, which a ``config.priced`` replay needs (its
            overheads priced from counts and rates: :func:`kvcli.replay.network.priced_overheads`).
        own_server: ``client`` is kvcli's embedded server, private to this command: a trace's cleanup empties it
            (:func:`kvcli.store.kvstore.purge_run`) instead of deleting the keys the run recorded.
        capacity: what set ``config``'s capacity (:func:`kvcli.replay.runner.resolve_capacity`), for each trace's
            capacity record; None: the capacity given, or none.
        cost_source: what prices the prefill, in words, for each trace's pricing record ("" : said from
            ``config.priced``).
    """

    def __init__(self, client: redis.Redis | RedisCluster, model, curve: PrefillCost, tokenizer: str,
                 config: ReplayConfig, spec: ModelSpec | None = None, calibration: Calibration | None = None,
                 model_config: ModelConfig | None = None, *, notify: Callable[[str], None] | None = None,
                 remedy: Callable[[str], str] | None = None, units=None, prefetch: bool | None = None,
                 device: DeviceRates | None = None, phase: Callable[[str], None] | None = None,
                 own_server: bool = False, capacity: CapacityBasis | None = None, cost_source: str = "") -> None:
        self.client, self.model, self.curve, self.tokenizer, self.config = client, model, curve, tokenizer, config
        self.own_server = own_server
        given = config.capacity_tokens or config.capacity_bytes
        self.capacity = capacity or CapacityBasis("given" if given else "unlimited",
                                                  "--capacity-tokens / --capacity-bytes" if given else "none given")
        self.cost_source = cost_source
        self.calibration = calibration
        self.model_config = model_config or (model.config if model is not None else None)
        spec = model.spec if model is not None else spec
        assert spec is not None, "a Replayer without a model needs its spec"
        self.model_id, self.kv_shape, self.dtype = spec.model_id, spec.kv_shape, spec.dtype
        self.state_shape = spec.state_shape
        if model is not None and spec.state_shape:  # a hybrid model: its state at every boundary of every store
            model.state_chunk_sizes = tuple(config.chunk_sizes)
        self.measured_samples: list[PrefillSample] = []  # timings of real requests: for checking the curve
        self._samples_seen = 0
        self.notify = notify
        self.phase: Callable[[str], None] = phase or (lambda text: None)
        self.remedy: Callable[[str], str] = remedy or _purge_remedy
        self.units = units
        self.prefetch = prefetch
        self.device = device
        self._degraded: list[str] = []  # what could not be read (INFO, MEMORY USAGE), for the notes
        self._rates: dict[tuple, ServerRates] = {}  # transfer costs measured this run, by store shape
        self._recorded = False  # the trace's stores' records of what they wrote are whole (:meth:`_cleanup`)

    # -- public ---------------------------------------------------------------------------------------------------
    def replay(self, name: str, requests: list[Request] | Callable[[], Iterable[Request]],
               progress: Callable[[int, int | None], None] | None = None, *, outline_first: bool = False
               ) -> TraceResult:
        """Replay one trace. ``requests`` is a list or a zero-argument callable returning a fresh iterator (the
        trace is read twice: once to validate it and choose measured requests, before anything is written, then
        to replay it; once where :meth:`_streams`, unless ``outline_first``). ``progress(done, total)`` is called
        after each request (``total`` None while a trace checked as it is read is read).

        Raises:
            BadInputError: a token id is outside the model's vocabulary (before any write); a priced replay
                (``config.priced``) without the device's rates.
            ChunkTooLargeError: a chunk's value exceeds the server's proto-max-bulk-len (before any write).
            BadInputError: a ``--tier`` smaller than one chunk of a chunk size (before any write).
            RedisFailure: the server failed, or the run would make it evict keys and ``allow_evictions`` is off
                (before any write).
            ModelFailure: the model failed.
        """
        cfg = self.config
        if cfg.priced and self.device is None:
            raise BadInputError("a priced replay needs the serving device's rates (a profile or --hardware)")
        reader = functools.partial(iter, requests) if isinstance(requests, list) else requests
        lengths: np.ndarray | None = None  # None: checked as the replay reads it (_streams), known after it
        notes: list[str] = []
        if outline_first or not self._streams(reader):
            self.phase(f"reading {name}")
            lengths, order, models = self._validate(reader, name)
            notes += [n for n in (order_note(order, name) if order is not None else None, models_note(models)) if n]
            if order is not None:  # not in arrival order: held in memory and taken in timestamp order
                reader, lengths = _reordered(reader, order), lengths[order]
        coverage = self._cover(lengths) if lengths is not None else {}  # a streamed trace: no model to calibrate
        measured = (pick_measured(lengths, cfg.measure if self.model is not None else 0, cfg.seed)
                    if lengths is not None else set())
        measure_tokens = self._measure_tokens(lengths, measured) if lengths is not None else 0
        namespace = f"replay-{int(time.time())}-{os.getpid()}-{os.urandom(3).hex()}"
        mark = resend(self.client, lambda: mark_run(self.client, namespace, cfg.chunk_sizes[0]))  # the run's server
        stores = [self._make_store(namespace, cs, layout, mark) for layout in cfg.layouts for cs in cfg.chunk_sizes]
        for store in stores:
            resend(self.client, store.check_value_size)
            check_tier_sizes(cfg.plan.tiers, store.config.chunk_size, store.config.payload_bytes)
        check = self._preflight(stores, reader, lengths, measured, measure_tokens)
        count = (f"{len(lengths):,} request{'s' if len(lengths) != 1 else ''}" if lengths is not None
                 else "its requests, checked as they are read,")
        self.phase(f"replaying {name}: {count} x {len(stores)} store{'s' if len(stores) != 1 else ''}")
        self._recorded = self.units is None  # a worker's record comes back with its part (_run)
        try:
            resend(self.client, lambda: write_sentinel(self.client, mark))
            result = self._run(name, reader, lengths, measured, measure_tokens, stores, check, progress, notes,
                               mark)
        except Unordered:  # read once, it was not in arrival order: again, with its order read first
            left = self._cleanup(namespace, stores, interrupted=False, mark=mark) if not cfg.keep else ""
            result = self.replay(name, requests, progress, outline_first=True)
            result.notes += [left] if left else []
            return result
        except BaseException:  # also on Ctrl-C, SIGTERM or an error: the run's namespace is its own
            if not cfg.keep:
                self._cleanup(namespace, stores, interrupted=True, mark=mark)
            raise
        if not cfg.keep:
            self.phase(f"cleaning up: deleting namespace {namespace}")
            result.left_behind = self._cleanup(namespace, stores, interrupted=False, mark=mark)
            result.notes += [result.left_behind] if result.left_behind else []
        else:
            resend(self.client, lambda: delete_sentinel(self.client, mark))  # the chunks are kept, not the sentinel
            kept = f"namespace {namespace} kept (--keep)"
            if "kvcli" in cfg.layouts:
                kept += f": its kvcli-layout keys: {self.remedy(namespace)}"
            for layout in lmcache_layouts(cfg.layouts):
                kept += (f"; its {layout}-layout keys (model names {namespace}/<chunk size>/...): remove them with "
                         f"kvcli purge --namespace {namespace} --layout {layout} --yes (and this run's --redis-url)")
            result.notes.append(kept)
        result.calibration = coverage
        # read after the cleanup: a server over maxmemory evicts on any command, reads included
        result.server_evicted_keys = evicted_since(self.client, check, self._memory())
        if result.server_evicted_keys:
            result.notes.append(f"the server evicted {result.server_evicted_keys:,} keys during this replay "
                                f"(whoever's): evicted chunks counted as misses, other data on the server may be gone")
        return result

    def _cover(self, lengths: np.ndarray) -> dict:
        """Extend the calibration to the trace's prompt lengths (95th percentile), within the time budget."""
        if self.calibration is None:
            return {}
        target = int(np.percentile(lengths[lengths > 0], 95)) if (lengths > 0).any() else 1
        if target > self.calibration.longest_tokens:
            self.phase(f"calibrating prefill up to {target:,} tokens (the trace's 95th-percentile prompt)")
        coverage = self.calibration.cover(target, self.config.calibrate_seconds)
        self.curve = self.calibration.curve()
        return coverage.to_dict()

    def _measure_tokens(self, lengths: np.ndarray, measured: set[int]) -> int:
        """Tokens of each measured prompt that run the model: with ``measure`` None, every prompt whole (or up to
        ``measure_max_tokens`` when set); else the budget's length (:func:`measure_length`; 0 with none)."""
        cfg = self.config
        if not measured:
            return 0
        longest = int(max(lengths[i] for i in measured))
        if cfg.measure is None:
            return min(longest, cfg.measure_max_tokens or longest)
        if cfg.priced:  # the cost prices another machine: no budget in this one's seconds to size the runs by
            return min(longest, cfg.measure_max_tokens or PRICED_MEASURE_TOKENS)
        return measure_length(self.curve, longest, len(measured), len(cfg.chunk_sizes), cfg.measure_seconds,
                              cfg.measure_max_tokens or 2048)

    def _preflight(self, stores, reader, lengths, measured, measure_tokens) -> Preflight:
        """The server's memory against what this trace's replay will write (:mod:`kvcli.replay.plan`); refuse
        when it would make the server evict keys, unless allowed. ``lengths`` None: the trace's count not known
        yet (every request, or ``--limit``'s)."""
        cfg = self.config
        heads = [min(int(lengths[i]), measure_tokens) for i in measured] if cfg.payload == "real" else []
        limit = len(lengths) if lengths is not None else (cfg.limit if cfg.limit is not None else sys.maxsize)
        check = replay_preflight(self.client, stores, reader, limit, heads,
                                 probes=not cfg.priced and cfg.link_gbps is None,  # as _transfer_rates times
                                 mem=self._memory())
        if check.evicts and not cfg.allow_evictions:
            raise RedisFailure(f"replay refused: {check.message}. Keys that are not kvcli's could be evicted; use "
                               f"--allow-evictions to run anyway (evicted chunks then count as misses), a server "
                               f"with room, or --capacity-bytes to bound what the replay keeps")
        return check

    def _link(self, measured_gbps: float) -> Link | None:
        """The network model when ``link_gbps`` or ``rtt_seconds`` is set; the other one measured on the server
        (``measured_gbps``: Gbit/s of the largest chunk's reads). A priced replay always has one, and nothing of it
        measured: what is not given is :data:`kvcli.replay.network.PRICED_LINK`'s."""
        cfg = self.config
        if cfg.priced:
            return Link(cfg.link_gbps if cfg.link_gbps is not None else PRICED_LINK.gbps,
                        cfg.rtt_seconds if cfg.rtt_seconds is not None else PRICED_LINK.rtt_seconds)
        if cfg.link_gbps is None and cfg.rtt_seconds is None:
            return None
        rtt = (cfg.rtt_seconds if cfg.rtt_seconds is not None
               else resend(self.client, lambda: ping_seconds(self.client), name="PING"))
        return Link(cfg.link_gbps if cfg.link_gbps is not None else measured_gbps, rtt)

    def _cleanup(self, namespace: str, stores: list[KVStore], interrupted: bool, mark: RunMark | None = None) -> str:
        """Delete the run's namespace; "" when done, else what was left and how to remove it (said at once after
        an interruption or an error; a second Ctrl-C or SIGTERM during the deletion propagates after saying it).
        A first one during the deletion at the end of a run goes on deleting as after any interruption, then
        propagates.

        The keys go by the stores' records of what they wrote (:mod:`kvcli.store.written`) and the sentinel of
        ``mark``, where those records are whole: the stores ran in this process, or every worker's part came back
        (:meth:`_run` merged their records); else (a worker's record was lost with it) by a SCAN of the server
        (:func:`kvcli.store.kvstore.purge_run`)."""
        say = self.notify or (lambda line: None)
        if interrupted:
            say(f"deleting namespace {namespace}…")
            drop_connections(self.client)  # a connection may hold half a command or an unread reply
        whole = self._recorded and mark is not None
        if not whole and self.units is not None:  # a dead worker's last batch may still be queued on the server:
            self.units.quiet(self.client)  # the scan starts once its connections are gone
        try:
            resend(self.client, lambda: purge_run(  # the deletion gets tries of its own, after what ended the run
                self.client, namespace, self.config.layouts, own_server=self.own_server,
                stores=stores if whole else None, keys=[mark.sentinel] if mark is not None else []), fresh=True)
            return ""
        except KeyboardInterrupt:
            if interrupted:  # a second signal: say what is left, and stop
                say(self._left(namespace, stores, "interrupted again"))
                raise
            self._cleanup(namespace, stores, interrupted=True, mark=mark)  # the first signal: the deletion goes on
            raise
        except KvcliError as exc:
            left = self._left(namespace, stores, str(exc))
            if interrupted:
                say(left)
            return left

    def _left(self, namespace: str, stores: list[KVStore], why: str) -> str:
        """What a cleanup that stopped (``why``) left, and how to remove it."""
        refused = any(word in why.lower() for word in ("permission", "noperm", "can't run this command"))
        keys = sum(store.stats.objects_created for store in stores) if self.units is None else 0
        if keys:  # this process's stores counted them
            what = f"about {keys:,} keys this run wrote (counted when it stopped) are left"
        else:  # worker processes wrote them (their counts died with them), or the transfer calibration's probes
            what = "the keys this run wrote are left"
        left = f"namespace {namespace} was not deleted ({why}): {what}; {self.remedy(namespace)}"
        return left + ("; run it as a user allowed SCAN and UNLINK" if refused else "")

    def _transfer_rates(self, store: KVStore) -> ServerRates:
        """This server's chunk SET/GET and (de)serialize costs for ``store``'s chunk value, measured once per run
        (:func:`~kvcli.replay.measure.calibrate_transfer`, ~0.5 s a store) and shared by every trace that has a store
        of the same layout, chunk size and value size; only what the overheads use. A priced replay uses none of
        it (its overheads come from counts and rates given: :func:`kvcli.replay.network.priced_overheads`): zeros,
        nothing measured. With ``--link-gbps`` the link prices every transfer: (de)serialization is measured, no
        SET or GET (:attr:`ServerRates.wire` False)."""
        if self.config.priced:
            return ServerRates(0.0, 0.0, wire=False)
        wire = self.config.link_gbps is None
        key = (type(store).__name__, store.config.chunk_size, store.value_bytes, wire)
        if key not in self._rates:
            mem = self._memory()
            self._rates[key] = resend(self.client, lambda: calibrate_transfer(self.client, store, room(mem), wire),
                                      name="SET or MGET (the transfer calibration's)")
        return self._rates[key]

    def _run(self, name, reader, lengths, measured, measure_tokens, stores, check, progress, notes,
             mark: RunMark | None = None) -> TraceResult:
        cfg = self.config
        rates = [self._transfer_rates(store) for store in stores]
        big = max(range(len(stores)), key=lambda i: stores[i].value_bytes)
        measured_gbps = (stores[big].value_bytes * 8 / rates[big].get_seconds / 1e9
                         if rates[big].get_seconds > 0 else 10.0)  # used only without --link-gbps: then measured
        link = self._link(measured_gbps)
        self._degraded = []
        used_before = self._used_memory()
        t0 = time.perf_counter()
        streamed = lengths is None
        work = Work(name, reader, np.zeros(0, np.int64) if lengths is None else lengths, measured, measure_tokens,
                    stores[0].config.namespace, tuple((s.layout, s.config.chunk_size) for s in stores), rates,
                    check.evicts, mark, streamed=streamed, limit=self.config.limit)
        if self.units is None:  # in this process, one unit holding every store
            parts = [self.replay_unit(work, tuple(range(len(stores))), True, stores, progress)]
        else:  # worker processes or Ray tasks (kvcli.replay.parallel), the same replay_unit in each
            parts = self.units.run(self, work, progress)
        for part in parts:  # the records of what each unit's stores wrote, for the cleanup
            for i, written in zip(part.indices, part.written):
                if written is not stores[i].written:  # a unit with stores of its own (a worker's)
                    stores[i].written.merge(written)
        self._recorded = True
        if streamed:  # checked as it was read: its lengths come back with the one unit
            lengths = parts[0].lengths
            assert lengths is not None, "a trace checked as it is read comes back with its lengths"
            if not len(lengths):
                raise BadInputError("the trace holds no requests", path=name)
            check_prompts(lengths, name)
        results, ledgers, skipped, span = merge_parts(parts, len(stores), cfg.upper_bound)
        if cfg.blend_recompute is not None:
            self._blend(name, results, parts, reader, len(lengths), cfg.blend_recompute)
        self.measured_samples += merged_samples(parts)
        self._degraded += [note for part in parts for note in part.degraded]
        measured_log = merge_logs(parts)
        used_after = self._used_memory()
        requests = len(lengths) - skipped
        delta = None if used_before is None or used_after is None else used_after - used_before
        by_layout = {layout: [r for r in results if r.layout == layout] for layout in cfg.layouts}
        main = by_layout[cfg.layouts[0]]
        result = TraceResult(name, requests, skipped, len(measured),
                             _payload_label(cfg.payload, len(measured), requests), main,
                             delta, time.perf_counter() - t0, by_layout=by_layout)
        result.span_seconds = span
        self._savings(result, stores, results, ledgers, rates, link)
        result.capacity = capacity_record(self.capacity, [
            (r, s.config.payload_bytes, getattr(s, "capacity_chunks", None))
            for r, s in zip(results, stores) if r.layout == cfg.layouts[0]])
        result.pricing = self._pricing(main)
        result.preflight = check.to_dict()
        result.measure_tokens = measure_tokens
        result.measured = measured_log
        result.network = link.to_dict() if link else None
        result.server_rates = ({} if cfg.priced else  # timed on this server: a priced replay reports none of it
                               {s.config.chunk_size: dataclasses.asdict(r) for s, r in zip(stores, rates)})
        result.cost_curve = self.curve.to_dict()
        result.notes = (notes + self._notes(result, lengths, measured, measure_tokens) + self._degraded
                        + _capacity_notes(stores, cfg))
        return result

    def _blend(self, name: str, results: list[ChunkSizeResult], parts: list[Part], reader, requests: int,
               fraction: float) -> None:
        """``--reuse blend``: each store's reuse at any position beside its prefix figure, the tokens it reuses with
        unlimited capacity request by request (:class:`kvcli.sim.blend.BlendCounter` at its chunk size, ``fraction``
        of the blended tokens recomputed), in one more pass over the trace in the replay's order."""
        self.phase(f"{name}: reuse at any position (CacheBlend), one more pass over the trace")
        reach: dict[int, np.ndarray] = {}
        for part in parts:
            reach.update(zip(part.indices, part.reach))
        counters = [BlendCounter(fraction, r.chunk_size) for r in results]
        for index, request in enumerate(itertools.islice(reader(), requests)):
            if not request.prompt_tokens:
                continue  # an empty prompt: skipped, as the replay skips it
            tokens = request.token_ids if request.blocks is None else request.blocks.token_ids()
            for i, counter in enumerate(counters):
                counter.add(request, int(reach[i][index]), tokens)
        for result, counter in zip(results, counters):
            result.blend = counter.result

    def replay_unit(self, work: Work, indices: tuple[int, ...], upper_bound: bool,
                    stores: list[KVStore] | None = None,
                    progress: Callable[[int, int | None], None] | None = None) -> Part:
        """Replay the whole trace through the stores ``indices`` of ``work.stores`` (made here on this replayer's
        client unless given) and return their picklable results (:class:`~kvcli.replay.work.Part`); with
        ``upper_bound``, this unit also runs the token-granular upper bound's radix tree (exactly one unit does).
        Used in this process and in each worker (kvcli.replay.parallel): one implementation,
        :func:`kvcli.replay.unit.replay_stores`.

        Raises:
            RedisFailure: the server failed. BadInputError: the trace changed since it was validated.
            ModelFailure: the model failed.
        """
        if stores is None:
            stores = [self._make_store(work.namespace, work.stores[i][1], work.stores[i][0], work.mark)
                      for i in indices]
        return replay_stores(work, indices, stores, upper_bound, self.client, self.model, self.config,
                             self.prefetch, progress)

    def _savings(self, result: TraceResult, stores, results, ledgers, rates, link) -> None:
        """Overheads and savings with intervals of every store (all layouts), and the verdict on the first
        layout's (:mod:`kvcli.replay.savings`). A priced replay's overheads come from counts and the network model,
        with no spread of their own (nothing in them is timed)."""
        cfg = self.config
        draws = self.curve.draws(DRAWS, cfg.seed)
        for i, (store, res, ledger, rate) in enumerate(zip(stores, results, ledgers, rates)):
            spread = None
            if self.device is not None and cfg.priced and link is not None:
                res.overheads = priced_overheads(res, store.value_bytes, link, self.device)
                spread = 0.0
            else:
                res.overheads = overheads(res, store.value_bytes, rate, link)
            res.savings = summarize(ledger, self.curve, res.overheads.critical, res.overheads.background,
                                    self.curve.residuals, self.model_config, cfg.seed, draws, stream=i,
                                    overhead_spread=spread, overhead_floor=repeat_spread(rate))
            res.saved_prefill_seconds_estimated = res.savings.saved_estimated
            if res.hit_curve is not None and cfg.sizing:
                res.sizing = size_cache(res.hit_curve, cfg.sizing, self.curve, draws, result.span_seconds,
                                        cfg.plan.prices)
            if res.plan is not None:
                from kvcli.replay.planner import price_plan, tier_load_seconds  # only where a plan was asked for

                device = self.device if cfg.priced else None
                price_plan(res.plan, res.savings.saved, res.hit_tokens, functools.partial(
                    tier_load_seconds, value_bytes=store.value_bytes, rate=rate, link=link, device=device),
                    result.span_seconds, cfg.plan.prices)
            # asynchronous stores only while the server and link keep up with them over the trace's span
            late = (cfg.store_mode == "async" and result.span_seconds is not None
                    and res.overheads.background > result.span_seconds)
            res.store_mode = "sync" if late else cfg.store_mode
        result.store_mode = cfg.store_mode
        # each with its savings: the loop above set every store's (the filter only narrows the type)
        rows = [(r, r.savings) for r in result.per_chunk_size if r.requests and r.savings is not None]
        modes = {r.store_mode for r, _ in rows} or {cfg.store_mode}
        result.verdict = recommend({r.chunk_size: s.net(r.store_mode) for r, s in rows},
                                   modes.pop() if len(modes) == 1 else "mixed",
                                   {r.chunk_size: s.net_draws(r.store_mode) for r, s in rows},
                                   None if cfg.priced else {r.chunk_size: TimedSavings(
                                       s.saved, s.draws_saved, s.beyond_share or 0.0, _typical(s, r.store_mode))
                                       for r, s in rows}).understated([r.chunk_size for r, _ in rows if r.understated])

    def _pricing(self, rows: list[ChunkSizeResult]) -> dict:
        """How a trace's prefill and overheads were found (JSON-ready): ``mode`` "priced" (from counts, rates and a
        cost given from outside: nothing here timed decides a figure) or "timed here"; ``prefill`` and
        ``overheads`` in words; ``prefill_tokens_per_second``: the trace's prompt tokens over its whole prefill time
        as the cost prices it (a priced replay: the flat ``--prefill-tps`` that gives the same total)."""
        cfg = self.config
        totals = [(r.prompt_tokens, r.savings.trace_prefill.value) for r in rows
                  if r.savings is not None and r.savings.trace_prefill.value > 0]
        rate = totals[0][0] / totals[0][1] if totals else None  # the same in every row
        prefill = self.cost_source or ("priced from outside" if cfg.priced else "the cost curve calibrated here")
        overheads = next((r.overheads.source for r in rows if r.overheads is not None), None)
        return {"mode": "priced" if cfg.priced else "timed here", "prefill": prefill, "overheads": overheads,
                "prefill_tokens_per_second": rate}

    def _memory(self) -> ServerMemory:
        """The server's memory and counters (:func:`~kvcli.store.preflight.server_memory`), read again after an
        attempt that got no reply, by the rule on failed calls (:func:`~kvcli.store.calls.resend`).

        Raises:
            RedisUnavailable: the read that made the third failed call in a row (``final``).
            RedisFailure: INFO or DBSIZE failed otherwise.
        """
        return resend(self.client, functools.partial(server_memory, self.client))

    def _used_memory(self) -> int | None:
        """The server's used_memory (bytes), or None (with a note, once) when this user may not run INFO."""
        used = self._memory().used_memory  # summed over the primaries of a cluster
        if used is None:
            note = f"used_memory not read: {INFO_REFUSED}"
            self._degraded += [] if note in self._degraded else [note]
        return used

    def _notes(self, result: TraceResult, lengths: np.ndarray, measured: set[int], measure_tokens: int) -> list[str]:
        """:func:`kvcli.replay.notes.replay_notes` of the main layout's results, with what the read namespace holds
        when a chunk size took nothing from it, and the check of the prefills measured since the last trace."""
        cfg, found = self.config, None
        if cfg.namespace and namespace_misses(result.per_chunk_size):
            found = resend(self.client, functools.partial(contents, self.client, cfg.namespace))
        check = curve_check(self.curve, self.measured_samples[self._samples_seen:])
        self._samples_seen = len(self.measured_samples)
        notes = replay_notes(cfg, result.per_chunk_size, result.span_seconds, lengths, measured, measure_tokens,
                             check, self.curve.longest_full_tokens, self.model_id, found)
        spec = ModelSpec(self.model_id, self.kv_shape, self.dtype, self.state_shape)
        blocks = {cs: block for cs in cfg.chunk_sizes if (block := vllm_attention_block(spec, cs)) is not None}
        hybrid = hybrid_note(blocks, lengths)
        return notes + ([hybrid] if hybrid else [])

    # -- passes ---------------------------------------------------------------------------------------------------
    def _streams(self, reader) -> bool:
        """Whether the trace is checked as the replay reads it (one pass, the one that hashes it: the read-ahead
        child's, :mod:`kvcli.replay.prefetch`) rather than outlined first: nothing measured or checked against a
        vocabulary (no model), every store replayed in this process, and a trace file (``reader.path``, with an
        ``outline``) of at least :data:`STREAM_BYTES` (a smaller one is outlined in a moment, which gives the
        progress bar its count)."""
        path = getattr(reader, "path", None)
        if self.model is not None or self.units is not None or getattr(reader, "outline", None) is None or not path:
            return False
        try:
            return os.path.getsize(path) >= STREAM_BYTES
        except OSError:  # the outline says what is wrong with it, naming the file
            return False

    def _validate(self, reader, name: str) -> tuple[np.ndarray, np.ndarray | None, dict[str, int]]:
        """Prompt lengths ``[requests]`` (tokens, file order), the arrival order (None: file order) and the requests
        per served model the trace names (:attr:`kvcli.traces.request.Request.model`). Without a
        model (no vocabulary to check the ids against), from the reader's ``outline()`` where it has one (lengths
        and times, the same checks, no token ids: :func:`kvcli.traces.detect.outline_trace`)."""
        lengths, stamps = [], []
        models: dict[str, int] = {}
        vocab = self.model.config.vocab if self.model is not None else None
        outline = getattr(reader, "outline", None) if vocab is None else None
        limit = self.config.limit
        if outline is not None:
            for request in itertools.islice(outline(), limit):
                lengths.append(request.prompt_tokens)
                stamps.append(request.timestamp)
                if request.model:
                    models[request.model] = models.get(request.model, 0) + 1
        else:
            for request in itertools.islice(reader(), limit):
                tokens = request.token_ids
                if vocab is not None and len(tokens) and int(tokens.max()) >= vocab:
                    raise BadInputError(f"token id {int(tokens.max())} is outside the model's vocabulary of "
                                        f"{vocab}", *_where(request))
                lengths.append(len(tokens))
                stamps.append(request.timestamp)
                if request.model:
                    models[request.model] = models.get(request.model, 0) + 1
        if not lengths:
            raise BadInputError("the trace holds no requests", path=name)
        check_prompts(lengths, name)
        return np.asarray(lengths, dtype=np.int64), arrival_order(stamps), models

    def _make_store(self, namespace: str, chunk_size: int, layout: str = "kvcli", mark: RunMark | None = None
                    ) -> KVStore:
        cfg = self.config
        store = make_store(layout, self.client, StoreConfig(
            namespace=namespace, chunk_size=chunk_size, model_id=self.model_id, tokenizer=self.tokenizer,
            kv_shape=self.kv_shape, dtype=self.dtype, payload=cfg.payload, capacity_tokens=cfg.capacity_tokens,
            capacity_bytes=cfg.capacity_bytes, read_namespace=cfg.namespace, kv_dtype=cfg.kv_dtype,
            state_shape=self.state_shape),
            tolerate_unavailable=True, mark=mark)
        if self.own_server:  # kvcli's embedded server is emptied whole at the end: no record of the writes needed
            store.written = WrittenChunks(keep=False)
        return store

def check_prompts(lengths: Iterable[int], name: str) -> None:
    """Refuse a trace none of whose requests has a prompt (``lengths``: each request's prompt tokens, read as they
    come): nothing to replay, so nothing to load a model or write for.

    Raises:
        BadInputError: (exit 2, naming ``name``) every request's prompt is empty.
    """
    count = prompts = 0
    for n in lengths:
        count += 1
        prompts += n > 0
    if count and not prompts:
        raise BadInputError(f"no prompt to replay: every request{'' if count == 1 else f' of {count:,}'} is empty",
                            path=name)


def _typical(savings, store_mode: str) -> float:
    """The overheads timed in a net benefit of ``store_mode``, without the blocks of requests a stall inflated."""
    critical, background = savings.typical_overheads or (savings.critical, savings.background)
    return critical + (background if store_mode == "sync" else 0.0)


def _purge_remedy(namespace: str) -> str:
    """How to remove what a run left in ``namespace`` when the replayer was given no ``remedy``."""
    return f"remove them with: kvcli purge --namespace {namespace} --yes"


def _capacity_notes(stores, cfg: ReplayConfig) -> list[str]:
    """What a ``--capacity-tokens`` / ``--capacity-bytes`` holds at each chunk size (the smaller when both are
    given), and a chunk size at which it holds no chunk (nothing can hit there)."""
    if not (cfg.capacity_tokens or cfg.capacity_bytes):
        return []
    given = " and ".join(part for part in (f"{cfg.capacity_tokens:,} tokens" if cfg.capacity_tokens else "",
                                           f"{cfg.capacity_bytes:,} bytes" if cfg.capacity_bytes else "") if part)
    held = {s.config.chunk_size: s.capacity_chunks for s in stores  # kvcli's layout (LMCache's has no capacity)
            if getattr(s, "capacity_chunks", None) is not None}
    sizes = "; ".join(f"{chunks:,} chunks at chunk size {cs}" for cs, chunks in held.items())
    notes = [f"capacity {given}{' (the smaller applies)' if cfg.capacity_tokens and cfg.capacity_bytes else ''}: "
             f"{sizes}"]
    notes += [f"chunk size {cs}: the capacity holds no chunk: nothing can hit" for cs, chunks in held.items()
              if chunks == 0]
    return notes


def _reordered(reader, order: np.ndarray):
    """A reader that yields the trace's first ``len(order)`` requests in ``order`` (held in memory); picklable when
    ``reader`` is (worker processes read the trace themselves)."""
    return functools.partial(_read_reordered, reader, order)


def _read_reordered(reader, order: np.ndarray):
    held = list(itertools.islice(reader(), len(order)))
    return (held[i] for i in order.tolist())


def _payload_label(mode: str, measured: int, requests: int) -> str:
    if mode == "accounted":
        return "accounted: index and metadata only, payload bytes counted"
    if measured >= requests:
        return "real"
    return f"real for {measured} measured requests, accounted for {requests - measured} estimated"


def _where(request: Request) -> tuple[str | None, int | None]:
    path, _, line = request.source.rpartition(":")
    return (path, int(line)) if line.isdigit() else (request.source or None, None)


