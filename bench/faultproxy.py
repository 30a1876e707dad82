"""A small TCP proxy that injects connection faults between a Redis client and server (loopback only, threads).

Used by ``bench/bench_faults.py`` and by the tests (the ``fault_proxy`` fixture in tests/conftest.py). The proxy
listens on a free port of 127.0.0.1 and forwards every connection to one target server. Faults are rules on what
a client sends: when a packet from a client contains every one of ``match`` (bytes), the rule's action applies to
that connection:

* ``drop``: close the connection (both sides) without forwarding the packet (the server never sees it);
* ``stall``: forward nothing more in either direction on that connection; the client waits for a reply that never
  comes until it gives up (its timeout) and closes;
* ``kill``: close the proxy itself, every connection and the listening port (a server that died: connections are
  refused from then on);
* ``on``: call a function (e.g. kill the real server, or send it ``CLIENT PAUSE``), then forward the packet.

``skip`` matches pass before a rule acts, then it acts ``times`` times (None: for good). ``match=()`` matches every
packet, so ``stall(times=None)`` is a server that stops answering, new connections included;
``stall(..., for_good=True)`` stalls one matching packet and everything after it, on every connection. Bounded in
time: the
proxy closes everything after ``max_seconds`` (or at :meth:`close`). Redis clients send each command (or
pipeline) in one write, so one packet holds a whole small command.
"""
from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Rule:
    action: str
    match: tuple[bytes, ...]
    skip: int
    times: int | None
    for_good: bool = False
    hook: Callable[[], None] | None = None
    fired: int = 0


class FaultProxy:
    """Forward ``127.0.0.1:port`` to ``target_host:target_port``; inject faults by rule (module docstring).

    Attributes:
        port: the proxy's listening port; ``url(...)`` builds a Redis URL on it.
        dropped / stalled: connections the rules dropped / stalled so far; fired: rule actions of any kind.
    """

    def __init__(self, target_host: str, target_port: int, max_seconds: float = 300.0) -> None:
        self.target = (target_host, target_port)
        self.deadline = time.monotonic() + max_seconds
        self.dropped = self.stalled = self.fired = 0
        self._rules: list[_Rule] = []
        self._all_stalled = False
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._closed = threading.Event()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="faultproxy-accept").start()

    # -- control ------------------------------------------------------------------------------------------------------
    def url(self, scheme: str = "redis", userinfo: str = "", path: str = "") -> str:
        """``redis://[userinfo@]127.0.0.1:port[path]``."""
        return f"{scheme}://{userinfo + '@' if userinfo else ''}127.0.0.1:{self.port}{path}"

    def drop(self, *match: bytes, skip: int = 0, times: int | None = 1) -> None:
        """Close the connection on a packet holding every ``match`` (after ``skip`` such packets), ``times`` times."""
        with self._lock:
            self._rules.append(_Rule("drop", match, skip, times))

    def stall(self, *match: bytes, skip: int = 0, times: int | None = 1, for_good: bool = False) -> None:
        """Stop forwarding on a connection once a packet holds every ``match``; ``for_good``: from then on, stall
        every packet of every connection (the server stopped answering) until :meth:`heal`."""
        with self._lock:
            self._rules.append(_Rule("stall", match, skip, times, for_good))

    def kill(self, *match: bytes, skip: int = 0) -> None:
        """Close the proxy and every connection on a packet holding every ``match`` (after ``skip`` such packets)."""
        with self._lock:
            self._rules.append(_Rule("kill", match, skip, 1))

    def on(self, *match: bytes, skip: int = 0, call: Callable[[], None]) -> None:
        """Call ``call()`` once, on a packet holding every ``match`` (after ``skip``), then forward the packet."""
        with self._lock:
            self._rules.append(_Rule("on", match, skip, 1, hook=call))

    def heal(self) -> None:
        """Remove every rule (connections already stalled stay stalled until their clients close them)."""
        with self._lock:
            self._rules.clear()
            self._all_stalled = False

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._closed.set()
        with self._lock:
            socks, self._socks = list(self._socks), set()
        for s in socks + [self._listener]:
            with contextlib.suppress(OSError):
                s.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------------------------------------------------
    def _done(self) -> bool:
        if time.monotonic() > self.deadline and not self._closed.is_set():
            self.close()
        return self._closed.is_set()

    def _accept(self) -> None:
        while not self._done():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.settimeout(None)  # blocking sends; receives wait in select() with a short timeout
            with self._lock:
                self._socks.update((client, server))
            state = {"stalled": False}
            threading.Thread(target=self._pump, args=(client, server, state, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, state, False), daemon=True).start()

    def _action(self, data: bytes) -> str:
        hook = None
        with self._lock:
            if self._all_stalled:
                return "stall"
            for rule in self._rules:
                if rule.times is not None and rule.fired >= rule.times:
                    continue
                if all(m in data for m in rule.match):
                    if rule.skip:
                        rule.skip -= 1
                        continue
                    rule.fired += 1
                    self.fired += 1
                    self._all_stalled = rule.for_good
                    if rule.action != "on":
                        return rule.action
                    hook = rule.hook
                    break
        if hook is not None:
            hook()
        return ""

    def _pump(self, src: socket.socket, dst: socket.socket, state: dict, from_client: bool) -> None:
        try:
            while not self._done():
                if not select.select([src], [], [], 0.1)[0]:
                    continue
                data = src.recv(1 << 16)
                if not data:
                    break
                if state["stalled"]:
                    continue  # swallow: nothing passes a stalled connection
                if from_client:
                    action = self._action(data)
                    if action == "drop":
                        self.dropped += 1
                        break
                    if action == "kill":
                        self.close()
                        break
                    if action == "stall":
                        self.stalled += 1
                        state["stalled"] = True
                        continue
                dst.sendall(data)
        except (OSError, ValueError):  # the other direction closed the sockets (ValueError: fd -1 in select)
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    s.close()
            with self._lock:
                self._socks.discard(src)
                self._socks.discard(dst)
