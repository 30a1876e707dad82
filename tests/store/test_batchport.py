"""kvcli.store.batchport: the batcher (kvcli/store/batch.py) reaches its store through :class:`BatchPort` alone and
uses every member the port lists; :class:`ChunkStore`'s public surface is what a library user needs."""
from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import torch

from kvcli.store import batch
from kvcli.store.batchport import BatchPort
from kvcli.store.chunkstore import ChunkStore
from kvcli.store.records import StoreConfig

PORT = {name for name in vars(BatchPort) if not name.startswith("_")}

# what a library user drives a store with (docs/library.md), and what replay and warm read of it (KVStore)
PUBLIC = {"layout", "client", "config", "stats", "prefix", "written", "chunker", "expected", "meta_key",
          "payload_key", "written_keys", "chunk", "shard_trips", "check_value_size", "lookup", "retrieve", "verify",
          "store", "capacity_chunks", "key_pattern", "value_bytes", "key_bytes_per_chunk", "accounted",
          "resident_chunks", "vanished_chunks", "batch_port"}


def _annotation(arg: ast.arg) -> str:
    return arg.annotation.id if isinstance(arg.annotation, ast.Name) else ""


def _is_self_port(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "port" and isinstance(node.value, ast.Name)
            and node.value.id == "self")


def store_uses(source: str) -> tuple[set[str], set[str], list[str]]:
    """What a batcher's ``source`` uses of its store: ``(store members, port members, other uses of a store)``.

    A store is a parameter named ``store`` or annotated ``ChunkStore``; the port is a parameter annotated
    ``BatchPort``, ``self.port``, or a name assigned from ``self.port``. A store may be checked with ``isinstance``
    and asked for its port; anything else done with it (passed on, kept as ``self.store``) is an other use.
    """
    store_members: set[str] = set()
    port_members: set[str] = set()
    other: list[str] = []
    for func in (n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        args = func.args.posonlyargs + func.args.args + func.args.kwonlyargs
        stores = {a.arg for a in args if a.arg == "store" or _annotation(a) == "ChunkStore"}
        ports = {a.arg for a in args if _annotation(a) == "BatchPort"}
        for node in ast.walk(func):
            if isinstance(node, ast.Assign):
                targets = [t for target in node.targets
                           for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                ports |= {t.id for t, v in zip(targets, values) if isinstance(t, ast.Name) and _is_self_port(v)}
        seen_as_base: set[int] = set()
        for node in ast.walk(func):
            if (isinstance(node, ast.Attribute) and node.attr == "store" and isinstance(node.value, ast.Name)
                    and node.value.id == "self"):
                other.append(f"{func.name}:{node.lineno}: self.store")
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                if node.value.id in stores:
                    store_members.add(node.attr)
                    seen_as_base.add(id(node.value))
                elif node.value.id in ports:
                    port_members.add(node.attr)
            elif isinstance(node, ast.Attribute) and _is_self_port(node.value):
                port_members.add(node.attr)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
                  and isinstance(node.args[0], ast.Name) and node.args[0].id in stores):
                seen_as_base.add(id(node.args[0]))
        other += [f"{func.name}:{node.lineno}: {node.id}" for node in ast.walk(func)
                  if isinstance(node, ast.Name) and node.id in stores and isinstance(node.ctx, ast.Load)
                  and id(node) not in seen_as_base]
    return store_members, port_members, other


def test_the_batcher_reaches_its_store_through_the_port_alone():
    source = inspect.getsource(batch)
    store_members, port_members, other = store_uses(source)
    assert store_members == {"batch_port"} and other == []
    assert port_members == PORT  # no member beyond the port's, and none the port lists in vain
    assert "connection_pool" not in source  # its own connection: BatchPort.new_connection


def test_the_check_can_fail():
    source = ("def f(store: ChunkStore, port: BatchPort):\n"
              "    keep(store)\n"
              "    return store.meta_head, port.stats, port.client.connection_pool\n"
              "class B:\n"
              "    def g(self):\n"
              "        port, st = self.port, None\n"
              "        return port.cluster, self.port.elsewhere, self.store\n")
    assert store_uses(source) == ({"meta_head"}, {"stats", "client", "cluster", "elsewhere"},
                                  ["f:2: store", "g:7: self.store"])


def test_the_stores_public_surface_is_a_library_users():
    init = ast.parse(textwrap.dedent(inspect.getsource(ChunkStore.__init__)))
    attributes = {node.attr for node in ast.walk(init) if isinstance(node, ast.Attribute)
                  and isinstance(node.value, ast.Name) and node.value.id == "self" and isinstance(node.ctx, ast.Store)}
    members = {name for name in vars(ChunkStore) if not name.startswith("_")}
    public = {name for name in members | attributes if not name.startswith("_")}
    assert public == PUBLIC
    assert public & PORT <= {"config", "stats", "written", "client", "shard_trips"}  # the port's, besides


@pytest.mark.single_server
def test_the_port_is_the_stores_own_state(redis_client):
    store = ChunkStore(redis_client, StoreConfig("p", 4, "m", "raw", (2, 2, 2, 3), torch.float32,
                                                 payload="accounted"))
    port = store.batch_port()
    assert {name for name in dir(type(port)) if not name.startswith("_")} == PORT
    assert (port.config, port.stats, port.written, port.client) == (store.config, store.stats, store.written,
                                                                     store.client)
    assert port.meta_head + "ab" == store.meta_key(bytes.fromhex("ab"))
    assert port.payload_head + "ab" == store.payload_key(bytes.fromhex("ab"))
    assert port.scripted and not port.cluster
    conn = port.new_connection()  # the batcher's own, a new one each time
    try:
        assert conn is not port.new_connection()
        conn.send_command("PING")
        assert conn.read_response() in (b"PONG", "PONG", True)
    finally:
        conn.disconnect()
