"""Run a replay's independent units (kvcli.replay.work) in worker processes (``--jobs``) or as Ray tasks
(``--ray``), each with its own Redis connection and, when it measures, its own model.

The parent prepares each trace once (validation, arrival order, calibration, measured picks, preflight, the
server's transfer rates: kvcli.replay.replayer), splits the stores into units (:func:`~kvcli.replay.work.plan_units`),
sends each unit with that preparation to a worker, which builds a :class:`~kvcli.replay.replayer.Replayer` on its
own connection and runs :meth:`~kvcli.replay.replayer.Replayer.replay_unit` (the code the single-process replay
runs), and merges the parts; savings, verdict, notes and the cleanup of the run's namespace stay in the parent.
With the same cost curve and rates, hit tokens, objects, bytes, estimates and the verdict are identical to one
process; timings are each worker's own.

Workers read the trace themselves (the reader must be picklable: kvcli.replay.runner's ``TraceSource``, or a list),
so on Ray every node needs the trace files at the same path, kvcli installed, and a Redis it can reach.

Interrupts: workers ignore SIGINT (the terminal sends it to the whole process group); on Ctrl-C, SIGTERM or an
error the parent terminates them (Ray: cancels the tasks) before it deletes the run's namespace. A parent that
dies without a word (SIGKILL, an OOM kill) takes its workers with it (:mod:`kvcli.replay.lifeline`).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Protocol

from kvcli.errors import BadInputError, KvcliError
from kvcli.model.presets import ModelConfig, ModelSpec
from kvcli.replay.lifeline import die_with_parent
from kvcli.replay.replayer import Replayer
from kvcli.replay.results import ReplayConfig
from kvcli.replay.work import Part, Work, plan_units
from kvcli.store.server import reply_timeout  # noqa: F401 - the workers' timeout, for the runner

POLL_SECONDS = 0.05
TERMINATE_SECONDS = 2.0  # a terminated worker's time to exit before it is killed (SIGKILL)
CLOSE_SECONDS = 10.0  # the longest wait for dead workers' connections to close before a cleanup that scans


def workers_quiet(client, setup: Setup) -> bool:
    """Wait (at most :data:`CLOSE_SECONDS`) until the server holds no connection of ``setup``'s workers
    (:func:`kvcli.store.cluster.wait_closed`): after a worker died, what it had sent may still be in the server's
    input buffer, and a SCAN of the run's namespace must start after it ran. Returns whether they closed (False
    without a name, or where ``CLIENT LIST`` is refused)."""
    from kvcli.store.cluster import wait_closed

    return setup.client_name is not None and wait_closed(client, setup.client_name, CLOSE_SECONDS)


class ModelChoice(Protocol):
    """What a worker reads of the model options (kvcli.replay.runner.ModelOptions; runner imports this module)."""

    @property
    def model(self) -> str: ...
    @property
    def dtype(self) -> str | None: ...
    @property
    def device(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def threads(self) -> int | None: ...


@dataclass(frozen=True)
class Setup:
    """What a worker needs to build its replayer: the Redis URL and reply timeout (seconds; None: the default),
    the model options (kvcli.replay.runner.ModelOptions: its model is built only when a unit measures), the
    tokenizer's name, the model's spec and shapes, the options, and the name the workers' connections give
    themselves (``CLIENT SETNAME``: the parent waits for them to close before a cleanup that scans, so nothing a dead
    worker sent lands after it). The cost curve never leaves the parent: the estimates are computed there, after
    the merge."""

    url: str
    timeout: float | None
    model_options: ModelChoice
    tokenizer: str
    spec: ModelSpec
    model_config: ModelConfig | None
    config: ReplayConfig
    client_name: str | None = None


_clients: dict = {}
_models: dict = {}


def run_unit(setup: Setup, work: Work, indices: tuple[int, ...], upper_bound: bool) -> Part:
    """Replay one unit in this process on its own connection (kept for the next unit of this worker) and model
    (built once per worker, only when the trace has measured requests).

    Raises:
        RedisFailure, BadInputError, ModelFailure: as :meth:`Replayer.replay_unit`.
    """
    key = (setup.url, setup.timeout, setup.client_name)
    if key not in _clients:
        _clients[key] = _connect(setup)
    options = setup.model_options
    model = None
    if work.measured:
        if options not in _models:
            import torch

            from kvcli.model.load import load_model

            if options.threads:
                torch.set_num_threads(options.threads)
            _models[options] = load_model(options.model, options.dtype, options.device, options.seed)
        model = _models[options]
    replayer = Replayer(_clients[key], model,
                        None,  # type: ignore[arg-type]  # no cost curve: a worker's replay_unit never reads it
                        setup.tokenizer, setup.config, spec=setup.spec, model_config=setup.model_config,
                        prefetch=False)  # the units share the cores: no child reading the trace ahead
    return replayer.replay_unit(work, indices, upper_bound)


def _connect(setup: Setup):
    """A worker's client for ``setup``'s server, under the replay's rule on failed calls
    (:func:`kvcli.store.calls.resend`): a connect that gets no reply (:class:`~kvcli.store.noreply.NoReply`: none
    within the reply timeout, or the connection kept dropping) is a failed call and is made again, so a stall that
    lands on a worker's connect costs the run what it costs on any other call.

    Raises:
        RedisUnavailable: ``final``, :data:`~kvcli.store.calls.MAX_FAILURES_IN_ROW` connects in a row got no reply.
        RedisFailure, BadInputError: as :func:`kvcli.store.server.connect`, for any other failure.
    """
    from kvcli.store.calls import failed_no_reply
    from kvcli.store.noreply import NoReply
    from kvcli.store.server import FaultCounts, connect

    faults = FaultCounts()
    while True:
        try:
            return connect(setup.url, setup.timeout, setup.client_name)
        except NoReply as exc:
            error = failed_no_reply(faults, exc)
            if error.final:
                raise error from None


def _worker_start() -> None:
    """A worker's first act: ignore SIGINT (a Ctrl-C is the parent's to handle) and die with the parent, however it
    ends (:func:`kvcli.replay.lifeline.die_with_parent`): a worker never writes to Redis for a replay that is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not die_with_parent():
        raise SystemExit(1)  # the parent is gone already


def _started() -> None:
    """A task that does nothing: submitted once per worker to start them all at once."""


def _local(replayer: Replayer, work: Work, plan, progress) -> list[Part]:
    (indices, upper), = plan
    return [replayer.replay_unit(work, indices, upper, None, progress)]


class ProcessUnits:
    """Units in up to ``jobs`` spawned worker processes (started at once, so their start overlaps the first trace's
    preparation, and kept for the next traces; :meth:`close` stops them). A trace with one unit runs in this
    process. A worker that dies (killed, out of memory) fails the run with a one-line error, never a hang."""

    def __init__(self, jobs: int, setup: Setup) -> None:
        if jobs < 1:
            raise BadInputError(f"--jobs must be >= 1, got {jobs}")
        units = len(setup.config.chunk_sizes) * len(setup.config.layouts)
        self.jobs, self.setup = min(jobs, units), setup  # a worker per unit at most
        self._pool: ProcessPoolExecutor | None = None
        self._start()  # now: the workers start (spawn, imports) while this process prepares the first trace

    def _start(self) -> ProcessPoolExecutor:
        """The worker pool, started now unless it is running."""
        if self._pool is None:
            workers = self.jobs
            self._pool = ProcessPoolExecutor(workers, multiprocessing.get_context("spawn"), _worker_start)
            # SIGINT blocked while the workers are spawned: they inherit the mask, so a Ctrl-C at any moment of
            # their start-up (imports) reaches only this process (no traceback from a worker); one that comes now
            # is delivered here when unblocked
            mask = getattr(signal, "pthread_sigmask", None)  # POSIX only
            blocked = mask(signal.SIG_BLOCK, {signal.SIGINT}) if mask else None
            try:
                for _ in range(workers):  # the executor starts a worker per waiting task
                    self._pool.submit(_started)
            finally:
                if mask:
                    mask(signal.SIG_SETMASK, blocked)
        return self._pool

    def run(self, replayer: Replayer, work: Work, progress: Callable[[int, int], None] | None) -> list[Part]:
        """The parts of ``work``'s units, in plan order. Raises what a unit raised, after stopping the workers.

        Raises:
            KvcliError: a worker process died.
        """
        plan = plan_units(work.stores, self.jobs, self.setup.config.upper_bound)
        if len(plan) == 1:
            return _local(replayer, work, plan, progress)
        pool = self._start()
        try:
            pending = [pool.submit(run_unit, self.setup, work, indices, upper) for indices, upper in plan]
            while not all(f.done() for f in pending):
                futures.wait(pending, timeout=POLL_SECONDS, return_when=futures.FIRST_EXCEPTION)
                if any(f.done() and f.exception() is not None for f in pending):
                    break
                _tick(progress, sum(f.done() for f in pending), len(pending), len(work.lengths))
            return [f.result() for f in pending]
        except BrokenProcessPool:
            self.close(terminate=True)
            raise KvcliError("a replay worker process died (killed, out of memory, or, from a Python script, one "
                             "without an `if __name__ == '__main__':` guard: each worker imports it again); rerun "
                             "with --jobs 1 (jobs=1) or fewer jobs") from None
        except BaseException:  # Ctrl-C, SIGTERM or a unit's error: no worker may write after the cleanup
            self.close(terminate=True)
            raise

    def quiet(self, client) -> bool:
        """:func:`workers_quiet` for these workers."""
        return workers_quiet(client, self.setup)

    def close(self, terminate: bool = False) -> None:
        """Stop the workers (at once with ``terminate``, else after their current unit)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if terminate:
            processes = list((getattr(pool, "_processes", None) or {}).values())  # no public way before 3.14
            for process in processes:
                process.terminate()
            for process in processes:
                process.join(TERMINATE_SECONDS)
                if process.is_alive():  # seen once: a worker stuck writing its result to a pipe nobody reads
                    process.kill()
                    process.join()
        pool.shutdown(wait=not terminate, cancel_futures=True)


class RayUnits:
    """Units as Ray tasks (one CPU each) on the cluster at ``address`` ("local": a new local instance, stopped by
    :meth:`close`; a Ray already initialized in this process is used as is). ``jobs``: units per trace (default:
    the cluster's CPUs).

    Raises:
        BadInputError: Ray is not installed (``pip install 'kvcli[ray]'``), or ``jobs`` < 1.
    """

    def __init__(self, address: str, jobs: int | None, setup: Setup) -> None:
        try:
            import ray
        except ImportError:
            raise BadInputError("--ray needs Ray, which is not installed: pip install 'kvcli[ray]'") from None
        if jobs is not None and jobs < 1:
            raise BadInputError(f"--jobs must be >= 1, got {jobs}")
        self.ray, self.setup, self._started, self.address = ray, setup, False, address
        if not ray.is_initialized():
            local = address == "local"
            env = {"env_vars": {"PYTHONPATH": _package_root()}} if local else None
            # a local instance is this run's own: its start-up notices (token authentication, ...) are not the
            # user's concern; a cluster's warnings are
            ray.init(address=None if local else address, include_dashboard=False, log_to_driver=False,
                     runtime_env=env, configure_logging=True,
                     # ray annotates an int, but takes a level's name too (its own default is "info")
                     logging_level="error" if local else "warning")  # type: ignore[arg-type]
            self._started = True
        self.jobs = jobs or max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._task = ray.remote(num_cpus=1, max_retries=0)(run_unit)

    def run(self, replayer: Replayer, work: Work, progress: Callable[[int, int], None] | None) -> list[Part]:
        """The parts of ``work``'s units, in plan order. Raises what a unit raised, after cancelling the tasks."""
        ray = self.ray
        plan = plan_units(work.stores, self.jobs, self.setup.config.upper_bound)
        setup, shared = ray.put(self.setup), ray.put(work)
        refs = [self._task.remote(setup, shared, indices, upper) for indices, upper in plan]
        try:
            pending = list(refs)
            while pending:
                _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_SECONDS)
                _tick(progress, len(refs) - len(pending), len(refs), len(work.lengths))
            return ray.get(refs)
        except ray.exceptions.RayTaskError as exc:  # the unit's own error, not Ray's wrapper and traceback
            self._cancel(refs)
            cause = getattr(exc, "cause", None)
            if isinstance(cause, KvcliError):
                raise cause from None
            raise KvcliError(f"a Ray task failed: {str(exc).strip().splitlines()[-1]}") from None
        except BaseException:
            self._cancel(refs)
            raise

    def _cancel(self, refs) -> None:
        for ref in refs:
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # already finished or gone
                pass

    def quiet(self, client) -> bool:
        """:func:`workers_quiet` for these tasks' workers."""
        return workers_quiet(client, self.setup)

    def close(self, terminate: bool = False) -> None:
        """Shut down the local Ray instance this object started (nothing otherwise)."""
        if self._started:
            self._started = False
            self.ray.shutdown()


def _tick(progress, done: int, units: int, requests: int) -> None:
    """Progress in requests, as the share of units done (workers do not report each request)."""
    if progress:
        progress(requests * done // units, requests)


def _package_root() -> str:
    """PYTHONPATH with the folder holding the kvcli package this process imported first (Ray's local workers
    import the same one)."""
    import kvcli

    root = os.path.dirname(os.path.dirname(os.path.abspath(kvcli.__file__)))
    return os.pathsep.join([root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def make_units(jobs: int | None, ray: str | None, setup: Setup, embedded: bool, runs_model: bool = True):
    """The runner of a replay's units: None (every store in this process) for one job (or one store) without Ray, else
    :class:`ProcessUnits` or :class:`RayUnits`. ``jobs`` None: :func:`default_jobs` of ``runs_model`` (whether the
    replay times the model: calibration or measured requests) (Ray: the cluster's CPUs).

    Raises:
        BadInputError: ``jobs`` < 1; Ray missing; a Ray cluster other than ``local`` with the embedded server
            (its machines cannot reach it: ``--redis-url`` is required).
    """
    if jobs is not None and jobs < 1:
        raise BadInputError(f"--jobs must be >= 1, got {jobs}")
    if ray is not None:
        if embedded and ray != "local":
            raise BadInputError(f"--ray {ray}: the cluster's machines cannot reach the embedded Redis server "
                                f"(a unix socket on this machine); give --redis-url (or REDIS_URL) of a server they "
                                f"can reach")
        return RayUnits(ray, jobs, setup)
    jobs = default_jobs(runs_model) if jobs is None else jobs
    stores = len(setup.config.chunk_sizes) * len(setup.config.layouts)
    return ProcessUnits(jobs, setup) if min(jobs, stores) > 1 else None


def default_jobs(runs_model: bool) -> int:
    """``--jobs``' default: the cores this process may use (capped later by the trace's units) for a replay that
    times no model, else 1.

    A replay that times the model (its calibration, measured requests' prefills) keeps one process: a second
    worker on the same cores would slow the prefills it times and so inflate the savings it measures (on this
    2-core machine, which also runs the Redis server, ``kvcli replay sample_traces/`` took 60.4 / 65.4 s with 1 job
    and 57.8 / 84.6 s with 2: no faster, and noisier). An index-only replay (``--prefill-tps``, ``--measure 0``) has
    no such timing to protect: ``kvcli replay sample_traces/ --payload accounted --measure 0 --prefill-tps 3000``
    took 13.1 / 13.9 s with 1 job and 12.2 / 12.5 s with 2, and the 7,500-request Mooncake cut at four chunk sizes
    1.21x less with 2 (docs/scale.md, bench/bench_jobs.py).
    """
    if runs_model:
        return 1
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def describe_units(units) -> str:
    """Where a replay's units ran, for the report's context."""
    if units is None:
        return "this process"
    if isinstance(units, RayUnits):
        return f"Ray ({units.address}), up to {units.jobs} tasks per trace"
    return f"up to {units.jobs} worker processes"
