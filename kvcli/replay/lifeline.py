"""A child process's tie to its parent: it dies when the parent does, however the parent ends (SIGKILL included).

Used by every process a replay starts: the child hashing the trace ahead (:mod:`kvcli.replay.prefetch`) and the
``--jobs`` workers (:mod:`kvcli.replay.parallel`). Two mechanisms, the second covering the first's gaps:

* on Linux the kernel sends the child SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``; strictly, when
  the parent *thread* that started it ends: kvcli starts its children from the main thread);
* a daemon thread in the child waits on the parent's sentinel (:func:`multiprocessing.parent_process`: a pipe the
  parent holds open while it lives; without one, ``os.getppid()`` is polled every :data:`POLL_SECONDS`) and kills
  the child when it closes. This also works where ``prctl`` does not (macOS).
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
from multiprocessing.connection import wait

POLL_SECONDS = 1.0  # how often a child without a parent sentinel checks its parent's pid


def die_with_parent() -> bool:
    """Tie this process to its parent (module docstring); call it first thing in the child.

    Returns:
        False when the parent is already gone (the caller should return at once), else True.
    """
    parent = multiprocessing.parent_process()
    expected = parent.pid if parent is not None and parent.pid is not None else os.getppid()
    _death_signal()
    if os.getppid() != expected:  # the parent died before the death signal was asked for
        return False
    sentinel = parent.sentinel if parent is not None else None
    threading.Thread(target=_watch, args=(sentinel, expected), daemon=True, name="kvcli-lifeline").start()
    return True


def _death_signal() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (prctl PR_SET_PDEATHSIG); nothing elsewhere."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _watch(sentinel, parent_pid: int) -> None:
    """Wait for the parent to die (its sentinel closes, or this process is given another parent), then SIGKILL
    this process: no cleanup runs in a child whose parent is gone."""
    if sentinel is not None:
        try:
            wait([sentinel])
        except OSError:  # the sentinel is unusable: fall back to the parent's pid
            pass
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    event = threading.Event()
    while os.getppid() == parent_pid:
        event.wait(POLL_SECONDS)
    os.kill(os.getpid(), signal.SIGKILL)
