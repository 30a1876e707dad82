"""A private local Redis Cluster for tests and benches (:func:`embedded_cluster`): its nodes are launched as the
embedded server is (:mod:`kvcli.store.launch`) and each is checked to be the process started for it
(:func:`kvcli.store.server.check_owner`).
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator

import redis
from redis.exceptions import RedisClusterException

from kvcli.errors import RedisFailure
from kvcli.store.launch import free_ports, launch, server_binary, stop, wait_until
from kvcli.store.server import check_owner


@contextlib.contextmanager
def embedded_cluster(primaries: int = 3, binary: str = "embedded", timeout: float = 30.0) -> Iterator[str]:
    """Start a private Redis Cluster of ``primaries`` primaries (no replicas) on free loopback ports, for tests and
    benches; yield the URL of its first node; stop every process and remove their dirs on exit.

    Each node is ``binary`` (:func:`~kvcli.store.launch.server_binary`) with ``--cluster-enabled yes`` and
    persistence off. No external tool: each node takes an equal range of the 16,384 slots with ``CLUSTER
    ADDSLOTSRANGE`` (Redis >= 7), the others ``CLUSTER MEET`` the first, and the cluster is ready when every node
    reports ``cluster_state:ok`` (a new primary waits ~2 s before it accepts writes). Each node is checked to be the
    process started for it (:func:`~kvcli.store.server.check_owner`) before any slot is assigned.

    Raises:
        RedisFailure: the binary is missing, cannot run a cluster, the cluster did not form within ``timeout``, or
            another process answered on a node's port.
    """
    path = server_binary(binary)
    root = tempfile.mkdtemp(prefix="kvcli-cluster-")
    procs: list[subprocess.Popen] = []
    clients: list[redis.Redis] = []
    dirs = [os.path.join(root, str(i)) for i in range(primaries)]
    try:
        ports = free_ports(2 * primaries)
        for i, node_dir in enumerate(dirs):
            os.mkdir(node_dir)
            procs.append(launch(path, node_dir, "--port", str(ports[i]), "--bind", "127.0.0.1", "--cluster-enabled",
                                "yes", "--cluster-port", str(ports[primaries + i]), "--cluster-config-file",
                                "nodes.conf", "--cluster-node-timeout", "5000"))
            clients.append(redis.Redis(host="127.0.0.1", port=ports[i], socket_connect_timeout=2))
        deadline = time.monotonic() + timeout
        wait_until(lambda: all(c.ping() for c in clients), deadline, procs, dirs, "the local cluster did not form")
        for c, p in zip(clients, procs):
            check_owner(c, p.pid)
        for i, c in enumerate(clients):
            c.execute_command("CLUSTER", "ADDSLOTSRANGE", i * 16384 // primaries, (i + 1) * 16384 // primaries - 1)
        for c in clients[1:]:
            c.execute_command("CLUSTER", "MEET", "127.0.0.1", ports[0], ports[primaries])

        def formed() -> bool:
            return all(b"cluster_state:ok" in c.execute_command("CLUSTER", "INFO")
                       and len(c.execute_command("CLUSTER", "SLOTS")) == primaries for c in clients)

        wait_until(formed, deadline, procs, dirs, "the local cluster did not form")
    except BaseException as exc:
        stop(procs, clients, root)
        if isinstance(exc, (redis.RedisError, RedisClusterException, OSError)):
            raise RedisFailure(f"cannot start a local Redis Cluster with {path}: {exc}") from None
        raise
    try:
        yield f"redis://127.0.0.1:{ports[0]}"
    finally:
        stop(procs, clients, root)
