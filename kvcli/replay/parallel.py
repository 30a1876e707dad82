"""``--jobs N``: one trace's chunk sizes replayed in N processes at once, merged into the report ``--jobs 1`` gives.

Chunk sizes are independent: each has its own key prefix in the run's namespace and its own store, LRU and
counts. The parent plans the trace once (:meth:`Replayer.plan`: the namespace, and the measured requests when the
model runs), splits the chunk sizes over the jobs (each chunk size's work taken as ``1/chunk_size + 1/1024`` per
prompt token, greedily, largest first), and starts one process per job (``spawn``: a fresh interpreter, its own
connection from :func:`kvcli.store.server.connect`, its own model when it measures). Each job reads the trace
itself and replays its chunk sizes with :meth:`Replayer.run`; one of them also computes the token-granular upper
bound (the same for every chunk size). The parent then merges: chunk sizes in the order asked, the upper bound
copied to each, ``used_memory`` measured by the parent before the jobs start and after the last one ends, and
the notes computed from every job's measured prefills. Counts, hits, bytes and estimates are those of ``--jobs
1`` (a test checks it); timings are the jobs' own, taken while they share the machine.

The worker processes (:class:`Workers`) live for the whole run: a run over many traces starts them, and builds
each one's connection and model, once. A job's failure stops them; its error is raised in the parent (one line,
its exit code). Ctrl-C or SIGTERM in the parent stops every worker (SIGTERM, which a worker treats as Ctrl-C: a
write in flight completes first), waits for them, then the parent deletes the run's namespace.
"""
from __future__ import annotations

import multiprocessing
import queue
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from kvcli.errors import BadInputError, KvcliError, ModelFailure, RedisFailure
from kvcli.model.costcurve import CostCurve
from kvcli.model.presets import ModelSpec
from kvcli.replay.replayer import Replayer, ReplayPlan, notes_for
from kvcli.replay.results import ReplayConfig, TraceResult
from kvcli.store import cluster
from kvcli.store.namespace import purge


@dataclass(frozen=True)
class Job:
    """One worker's share of a trace: everything it needs, picklable (``spawn`` sends it to a new interpreter)."""

    url: str
    path: str
    fmt: str
    tokenizer: str
    config: ReplayConfig
    curve: CostCurve
    spec: ModelSpec
    plan: ReplayPlan
    chunk_sizes: tuple[int, ...]
    upper_bound: bool
    model: tuple | None  # (preset, dtype, device, seed) when the job runs the model
    threads: int | None


def split(chunk_sizes: tuple[int, ...], jobs: int) -> list[tuple[int, ...]]:
    """Chunk sizes over ``jobs`` groups, balanced by work ``1/cs + 1/1024`` (per token: per-chunk work plus a
    per-request part), largest first into the lightest group; each group in the order given. Empty groups dropped.
    """
    load = [0.0] * max(1, jobs)
    groups: list[list[int]] = [[] for _ in load]
    for cs in sorted(chunk_sizes, key=lambda c: -(1 / c)):
        i = min(range(len(load)), key=lambda j: (load[j], j))
        groups[i].append(cs)
        load[i] += 1 / cs + 1 / 1024
    order = {cs: i for i, cs in enumerate(chunk_sizes)}
    return [tuple(sorted(g, key=order.get)) for g in groups if g]


class Workers:
    """``jobs`` worker processes (``spawn``: fresh interpreters) kept for a whole run, so a run over many traces
    starts them, and builds each one's model and connection, once. Use as a context manager; :meth:`replay` one
    trace at a time. On an error or an interruption they are stopped (SIGTERM, which a worker treats as Ctrl-C:
    its write in flight completes first) before the run's namespace is deleted."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self._ctx = multiprocessing.get_context("spawn")
        self._done = self._ctx.Array("q", jobs, lock=False)
        self._results = self._ctx.Queue()
        self._inboxes = [self._ctx.Queue() for _ in range(jobs)]
        self._procs: list = []

    def __enter__(self) -> Workers:
        self._procs = [self._ctx.Process(target=_serve, args=(i, inbox, self._done, self._results), daemon=True)
                       for i, inbox in enumerate(self._inboxes)]
        for p in self._procs:
            p.start()
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is None:
            for inbox in self._inboxes:
                inbox.put(None)
            for p in self._procs:
                p.join(30)
        self._stop()
        return False

    def replay(self, replayer: Replayer, url: str, path: str, reader, fmt: str, tokenizer: str, model: tuple | None,
               threads: int | None, progress: Callable[[int, int | None], None] | None = None) -> TraceResult:
        """Replay one trace over the workers (see the module docstring); the parent's ``replayer`` plans it,
        measures ``used_memory`` and deletes the namespace at the end (unless ``keep``).

        Raises:
            KvcliError and its family: a job's error, re-raised here (the workers are stopped first).
        """
        cfg = replayer.config
        plan = replayer.plan(path, reader)
        groups = split(cfg.chunk_sizes, self.jobs)
        spec = ModelSpec(replayer.model_id, replayer.kv_shape, replayer.dtype)
        work = [Job(url, path, fmt, tokenizer, cfg, replayer.curve, spec, plan, group, cfg.upper_bound and i == 0,
                    model if plan.measured else None, threads) for i, group in enumerate(groups)]
        used_before = cluster.used_memory(replayer.client)
        t0 = time.perf_counter()
        try:
            for i, job in enumerate(work):
                self._done[i] = 0
                self._inboxes[i].put(job)
            parts = self._collect(len(work), progress, len(plan.lengths) if plan.lengths is not None else None)
        except BaseException:
            self._stop()
            cluster.drop_connections(replayer.client)
            if not cfg.keep:
                purge(replayer.client, plan.namespace)
            raise
        try:
            used_after = cluster.used_memory(replayer.client)
        finally:
            if not cfg.keep:
                purge(replayer.client, plan.namespace)
        return _merge(replayer, plan, parts, used_after - used_before, time.perf_counter() - t0)

    def _collect(self, count: int, progress, total) -> list[dict]:
        parts: dict[int, dict] = {}
        while len(parts) < count:
            try:
                index, kind, payload = self._results.get(timeout=0.2)
            except queue.Empty:
                dead = [p for i, p in enumerate(self._procs[:count]) if i not in parts and not p.is_alive()]
                if dead:
                    time.sleep(0.5)  # a result may still be in the pipe
                    if self._results.empty():
                        raise KvcliError(f"a replay job exited with code {dead[0].exitcode} and no result") from None
                if progress:
                    progress(min(self._done[:count]), total)
                continue
            if kind == "error":
                name, message = payload
                raise _ERRORS.get(name, KvcliError)(message)
            parts[index] = payload
        if progress:
            progress(min(self._done[:count]), total)
        return [parts[i] for i in range(count)]

    def _stop(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.terminate()  # SIGTERM: the worker treats it as Ctrl-C, after the write in flight
        for p in self._procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()


def _merge(replayer: Replayer, plan: ReplayPlan, parts: list[dict], used: int, seconds: float) -> TraceResult:
    by_size = {r.chunk_size: r for part in parts for r in part["result"].per_chunk_size}
    rows = [by_size[cs] for cs in replayer.config.chunk_sizes]
    first = parts[0]["result"]
    if replayer.config.upper_bound:  # computed by the first job: the same for every chunk size
        upper = first.per_chunk_size[0].upper_bound_tokens
        for r in rows:
            r.upper_bound_tokens = upper
    samples = [s for part in parts for s in part["samples"]]
    replayer.measured_samples.extend(samples)
    notes = notes_for(replayer.curve, samples, parts[0]["longest"], parts[0]["count"], len(plan.measured))
    return replace(first, per_chunk_size=rows, used_memory_delta_bytes=used, seconds=seconds, notes=notes)


_ERRORS = {c.__name__: c for c in (BadInputError, RedisFailure, ModelFailure, KvcliError)}


def _serve(index: int, inbox, done, results) -> None:
    """A worker process: replay each job from ``inbox`` until None, putting its part (or its error) on
    ``results``. Runs in a fresh interpreter (``spawn``); keeps its connection and model between jobs."""
    signal.signal(signal.SIGTERM, _interrupt)
    cache: dict = {}
    try:
        while (job := inbox.get()) is not None:
            try:
                results.put((index, "ok", _replay_part(index, job, done, cache)))
            except KvcliError as exc:  # sent as its nearest family member the parent re-raises (same exit code)
                family = next(c.__name__ for c in type(exc).__mro__ if c.__name__ in _ERRORS)
                results.put((index, "error", (family, str(exc))))
            except Exception as exc:  # a bug: its type and message, so the parent can say what failed
                results.put((index, "error", ("KvcliError", f"replay job failed: {type(exc).__name__}: {exc}")))
    except KeyboardInterrupt:
        pass
    finally:
        for client in cache.get("clients", {}).values():
            client.close()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _replay_part(index: int, job: Job, done, cache: dict) -> dict:
    from kvcli.store.server import connect
    from kvcli.traces.detect import read_trace

    clients = cache.setdefault("clients", {})
    client = clients.get(job.url) or clients.setdefault(job.url, connect(job.url))
    model = None
    if job.model is not None:
        models = cache.setdefault("models", {})
        model = models.get(job.model)
        if model is None:
            from kvcli.model.llama import build_model
            from kvcli.model.threads import choose_threads

            model = models[job.model] = build_model(*job.model)
            choose_threads(model, job.threads or 1)
    replayer = Replayer(client, model, job.curve, job.tokenizer, job.config, spec=job.spec)

    def step(n: int, _total) -> None:
        done[index] = n

    counts: dict = {}
    result = replayer.run(job.plan, lambda: read_trace(job.path, job.fmt, job.tokenizer), step, job.chunk_sizes,
                          job.upper_bound, stats=counts)
    return {"result": result, "samples": replayer.measured_samples, **counts}
