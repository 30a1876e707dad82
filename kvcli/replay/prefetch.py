"""Read, cut and hash a trace ahead of the replay, in a child process: an index-only replay on two cores.

An index-only replay (``--payload accounted``, no request timed) spends most of its own time reading the trace,
tokenizing prompts and hashing their chunks (a hash-id trace's from its block keys, no token ids synthesized), work
that depends on the trace alone; the lookups, stores and accounting that follow depend on what earlier requests
stored, and stay in arrival order in the replaying process. :class:`Prefetch` moves the first part to a forked child
that runs ``PREFETCH_BATCH`` requests ahead: it reads the trace, computes each request's chunk hashes and token
digests for every store (:meth:`kvcli.store.hashing.PromptChunker.hashes`, the code the replay runs itself) and the
token-granular upper bound's radix match when asked, and sends them through a pipe a batch at a time (hashes and
digests joined: 24 bytes a chunk); the replay rebuilds each :class:`~kvcli.store.hashing.ChunkedPrompt` (without its
token ids, which stay in the child) and goes on as with prompts it hashed itself: the same hashes, so the same
results (a test replays sample traces both ways). The stores' hit curves (:class:`~kvcli.sim.curve.HitCurve`: a
function of the hashes, times and lengths alone, in trace order) are fed there too, off the replay's path, and come
back finished (:attr:`Prefetch.curves`) after the last batch.

When (:func:`can_prefetch`): a fork is available (POSIX; macOS's default start method is spawn, and a spawned
child would import everything again), this process may use two cores or more, the trace has at least
:data:`PREFETCH_MIN_REQUESTS` requests (a fork costs ~10-30 ms), nothing is measured (a timed request needs its
token ids here) and the replay runs in this process (a worker of ``--jobs`` already shares the cores). Hugging Face
tokenizers print a warning in a child forked after they ran threads: a replay that loaded them keeps the work here.

The child ignores SIGINT (a Ctrl-C is the replaying process's to handle) and is killed when the replay ends or
fails, or dies with it (SIGKILL, an OOM kill: see :func:`_produce`). An error in it (the trace changed since it
was validated, a disk error) comes back through the pipe and is raised in the replay as a one-line error.
"""
from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable, Generator, Iterable, Iterator

from kvcli.errors import BadInputError, KvcliError
from kvcli.replay.lifeline import die_with_parent
from kvcli.sim.upper_bound import UpperBound
from kvcli.store.hashing import ChunkedPrompt, PromptChunker, reusable_tokens

PREFETCH_BATCH = 256  # requests per message from the child
PREFETCH_MIN_REQUESTS = 512  # fewer: hashed in this process (a fork and a pipe cost more than they save)

# (request index, timestamp, prompt tokens, [ChunkedPrompt per store] or None, radix match tokens, request or None)
Item = tuple


def can_prefetch(requests: int, measured: bool, force: bool | None) -> bool:
    """Whether :class:`Prefetch` should hash the trace in a child (module docstring); ``force`` True or False
    overrides every rule but the platform's and a measured request's (tests)."""
    if measured or "fork" not in multiprocessing.get_all_start_methods():
        return False
    if force is not None:
        return force
    if "tokenizers" in sys.modules:
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores >= 2 and requests >= PREFETCH_MIN_REQUESTS and multiprocessing.parent_process() is None


class Prefetch:
    """Items for the first ``limit`` requests of ``reader()``, in order, hashed in a forked child (started here):
    ``(index, timestamp, tokens, prompts, match, None)``, ``prompts`` None for an empty prompt; with ``bound`` the
    token-granular upper bound (:class:`~kvcli.sim.upper_bound.UpperBound`) runs in the child, ``match`` its
    reusable tokens (else 0). ``curves()``: made in the child, per chunker an empty
    :class:`~kvcli.sim.curve.HitCurve` it feeds every non-empty request, or None; finished there with the payload
    bytes per chunk of ``payload_bytes`` (per chunker): after the last item :attr:`curves` holds, per chunker,
    ``(CurveResult, ChunkStream or None)`` or None. The bound and the curves live in the child alone (made there,
    their memory freed there before the results are sent).
    Iterate once; :meth:`close` always (it stops the child); :meth:`paused` around a timing.

    Raises (iterating):
        KvcliError: what the child raised reading or hashing the trace (BadInputError for bad input).
    """

    def __init__(self, reader: Callable[[], Iterable], limit: int, chunkers: list[PromptChunker], bound: bool,
                 curves: Callable[[], list] | None = None, payload_bytes: list[int] | None = None) -> None:
        context = multiprocessing.get_context("fork")
        self._receive, send = context.Pipe(duplex=False)
        self._child = context.Process(target=_produce, args=(send, self._receive, reader, limit, chunkers, bound,
                                                             curves, payload_bytes or [0] * len(chunkers)),
                                      daemon=True, name="kvcli-prefetch")
        gc.freeze()  # the objects so far out of the collector's reach in the child: its collections do not write to
        try:  # (and so copy) every page it shares with this process
            self._child.start()
        finally:
            gc.unfreeze()  # here they are collected as before
        send.close()
        self._sizes = [c.chunk_size for c in chunkers]
        self.curves: list = [None] * len(chunkers)

    def __iter__(self) -> Iterator[Item]:
        while True:
            try:
                message = self._receive.recv()
            except EOFError:
                raise KvcliError("the process reading the trace ahead of the replay died") from None
            if message is None:
                return
            if isinstance(message, tuple) and message[0] == "curves":
                self.curves = message[1]
                continue
            if isinstance(message, tuple):  # ("error", class, message)
                raise message[1](message[2])
            for index, stamp, n, joined, match in message:
                prompts = None if joined is None else [
                    ChunkedPrompt(None, cs, h, d) for cs, (h, d) in zip(self._sizes, joined)]
                yield index, stamp, n, prompts, match, None

    @contextlib.contextmanager
    def paused(self):
        """The child stopped (SIGSTOP) for the block, then resumed: a lookup timed inside does not share the CPU
        with it (on 2 cores it made the sampled lookups' p99 3-4x longer)."""
        pid = self._child.pid
        with contextlib.suppress(ProcessLookupError):  # done already (a zombie until joined: its pid stays)
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def close(self) -> None:
        """Stop the child (killed if still running) and close the pipe."""
        self._receive.close()
        if self._child.is_alive():
            self._child.kill()  # SIGKILL: also ends a stopped child
        self._child.join()


def _produce(send, receive, reader, limit: int, chunkers: list[PromptChunker], bound: bool,
             make_curves: Callable[[], list] | None, payload_bytes: list[int]) -> None:
    """The child: read, hash and send batches of :data:`PREFETCH_BATCH` items, then ``("curves", [(result,
    stream) or None per chunker])``, then None; an error as ``("error", class, message)``. Each curve is fed every
    non-empty request in order and finished for the prompt tokens of all of them (what each lane counts: every
    non-empty request, none measured where the trace is hashed here). It ends with its parent however that ends
    (even SIGKILL): its copy of the
    pipe's reading end is closed (a write then fails once the parent's is gone) and it is tied to the parent
    (:func:`kvcli.replay.lifeline.die_with_parent`: killed when the parent dies)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    receive.close()
    if not die_with_parent():  # the parent died already
        return
    radix = UpperBound() if bound else None
    curves = make_curves() if make_curves is not None else [None] * len(chunkers)
    batch: list = []
    prompt_tokens = 0
    try:
        for index, request in enumerate(reader()):
            if index >= limit:
                break
            n = request.prompt_tokens
            joined, match = None, 0
            if n:
                if radix is not None:
                    match = reusable_tokens(radix.match_request(request), n)
                joined = []
                for chunker, curve in zip(chunkers, curves):
                    hashes, digests = chunker.hashes(request.prompt, request.hash_salt)
                    joined.append((b"".join(hashes), b"".join(digests)))
                    if curve is not None:
                        curve.defer([(joined[-1][0], request.timestamp, n)])
                prompt_tokens += n
            batch.append((index, request.timestamp, n, joined, match))
            if len(batch) >= PREFETCH_BATCH:
                send.send(batch)
                batch = []
        if batch:
            send.send(batch)
        radix = None  # done with: its memory goes before the curves are finished
        finished: list = []
        for k, size in enumerate(payload_bytes):
            curve, curves[k] = curves[k], None  # each curve's state goes before the next one's result is made
            finished.append(None if curve is None else (curve.result(prompt_tokens, size), curve.stream()))
            del curve
        send.send(("curves", finished))
        send.send(None)
    except BrokenPipeError:  # the replay stopped reading: it ended or failed
        pass
    except Exception as exc:  # anything goes back as one line
        kind = type(exc) if isinstance(exc, KvcliError) else BadInputError if isinstance(exc, ValueError) else (
            KvcliError)
        try:
            send.send(("error", kind, str(exc)))
        except OSError:
            pass
    finally:
        send.close()


def hashed_here(reader: Callable[[], Iterable], limit: int, stores, radix, measured: set[int]
                ) -> Generator[Item, None, None]:
    """The items of :class:`Prefetch`, computed in this process: ``prompts`` None for an empty or a measured
    request (the replay hashes a measured one as it times it), ``request`` the request itself."""
    for index, request in enumerate(reader()):
        if index >= limit:
            return
        n = request.prompt_tokens
        match = reusable_tokens(radix.match_request(request), n) if (
            radix is not None and n) else 0
        prompts = [store.chunk(request.prompt, request.hash_salt) for store in stores] if (
            n and index not in measured) else None
        yield index, request.timestamp, n, prompts, match, request
