"""inspect on damaged and unusual caches: parent links that loop, namespaces that are not UTF-8 text,
replay's metadata-only entries, a namespace shared by two models, cache salts, a prompt that hits entirely, and
a namespace that holds nothing for the model or chunk size asked about."""
from __future__ import annotations

import json
import signal

import numpy as np
import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.live.chunkmap import chunk_map
from kvcli.live.inspect import inspect_cache
from kvcli.live.warm import WarmConfig, make_stores, warm
from kvcli.model.costcurve import CostCurve
from kvcli.model.llama import build_model
from kvcli.model.presets import model_spec
from kvcli.replay.replayer import Replayer
from kvcli.replay.results import ReplayConfig
from kvcli.traces.request import Request

TINY = model_spec("tiny")


@pytest.fixture(scope="module")
def model():
    return build_model("tiny", device="cpu")


def req(tokens, rid="r", salt="") -> Request:
    return Request(rid, np.asarray(tokens, dtype=np.uint32), cache_salt=salt, source=f"test:{rid}")


def hashes(client, tokens, namespace="i", salt="", spec=TINY) -> list[str]:
    store = make_stores(client, spec, WarmConfig(namespace, (16,)))[0]
    return [h.hex() for h in store.chunk(np.asarray(tokens, dtype=np.uint32), salt).hashes]


class Overran(BaseException):
    """Raised by SIGALRM into a command that runs past its time (a BaseException: no handler of kvcli's takes it)."""


def inspect_json(url: str, *args: str) -> dict:
    """``kvcli inspect --json``, which must end within 60 s (a loop over parent links would not: SIGALRM stops it
    with :class:`Overran`, and the test fails)."""
    def overran(signum, frame):
        raise Overran("kvcli inspect ran for 60 s")

    previous = signal.signal(signal.SIGALRM, overran)
    signal.alarm(60)
    try:
        out = CliRunner().invoke(app, ["inspect", "--json", "--redis-url", url, *args])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert out.exit_code == 0 and out.exception is None and "Traceback" not in out.output, (out.output,
                                                                                             out.exception)
    return json.loads(out.stdout)


@pytest.mark.parametrize("source", [1, 2])
def test_parent_links_that_loop_end_the_walk(redis_url, redis_client, model, source):
    """COPY a child chunk's metadata and payload onto chunk 0's keys (REPLACE): chunk 0 now names itself (child 1)
    or chunk 1 (child 2) as its parent, a loop. inspect ends, and every chunk of the chain is unreachable."""
    warm(redis_client, [req(range(1, 49))], model, WarmConfig("i", (16,)))  # 3 chunks
    h = hashes(redis_client, range(1, 49))
    for kind in ("m", "p"):
        redis_client.copy(f"kvcli:v1:i:16:{kind}:{h[source]}", f"kvcli:v1:i:16:{kind}:{h[0]}", replace=True)
    (group,) = inspect_json(redis_url, "--verify")["groups"]
    assert sorted(group["integrity"]["unreachable"]) == sorted(h)
    assert (group["chunks"], group["metadata_entries"], group["payload_objects"]) == (3, 3, 3)
    m = chunk_map(redis_client, np.arange(1, 49), "i", 16, TINY.model_id, "cl100k_base")
    assert [r.status for r in m.rows] == ["token-mismatch", "unreachable", "unreachable"]


def test_a_namespace_that_is_not_utf8_is_another_key(redis_url, redis_client, model):
    warm(redis_client, [req(range(1, 33))], model, WarmConfig("i", (16,)))
    redis_client.set(b"kvcli:v1:\xff\xfe:16:m:" + b"0" * 32, b"x")
    redis_client.set(b"kvcli:v1:\xff\xfe:16:p:" + b"0" * 32, b"x")
    for args in ((), ("--namespace", "i")):
        doc = inspect_json(redis_url, *args)
        assert doc["keys"] == {"scanned": 6, "kvcli": 4, "route_index": 0, "other": 2}
        assert [(g["namespace"], g["chunks"]) for g in doc["groups"]] == [("i", 2)]


def test_replays_metadata_only_entries_are_not_unreachable(redis_client, model):
    """replay --namespace fleet --keep stores the chunks after fleet's prefix as metadata only, in its own
    namespace, where their parent is not: inspect does not call them unreachable (they have no payload to reach,
    and their prefix lives in fleet)."""
    warm(redis_client, [req(range(1, 33))], model, WarmConfig("fleet", (16,)))  # 2 chunks
    config = ReplayConfig(chunk_sizes=(16,), measure=0, payload="accounted", namespace="fleet", keep=True)
    replayer = Replayer(redis_client, None, CostCurve.from_tokens_per_second(1000.0), "cl100k_base", config,
                        spec=TINY)
    res = replayer.replay("t", [req(range(1, 65))]).per_chunk_size[0]
    assert (res.hit_tokens, res.metadata_entries, res.namespace_hit_chunks) == (32, 2, 2)
    groups = {g.namespace: g for g in inspect_cache(redis_client, verify=True).groups}
    own = groups[res.namespace]
    assert (own.metadata_entries, own.payload_objects, own.chunks) == (2, 0, 2)
    assert dict(own.issues) == {} and dict(groups["fleet"].issues) == {}


def test_a_namespace_shared_by_two_models_groups_payloads_by_model(redis_client):
    one, two = build_model("tiny", device="cpu", seed=0), build_model("tiny", device="cpu", seed=1)
    warm(redis_client, [req(range(1, 49))], one, WarmConfig("shared", (16,)))  # 3 chunks of model seed 0
    warm(redis_client, [req(range(1, 33))], two, WarmConfig("shared", (16,)))  # 2 chunks of model seed 1
    orphan = hashes(redis_client, range(1, 49), "shared")[2]
    redis_client.delete(f"kvcli:v1:shared:16:m:{orphan}")  # an orphan payload of seed 0: two models, so "?"
    groups = {g.model: g for g in inspect_cache(redis_client).groups}
    assert sorted(groups) == ["?", one.model_id, two.model_id]
    assert [(groups[m].metadata_entries, groups[m].payload_objects) for m in (one.model_id, two.model_id, "?")] \
        == [(2, 2), (2, 2), (0, 1)]
    assert groups["?"].issues["orphan_payloads"] == [orphan]


def test_inspect_tokens_uses_the_cache_salt(redis_url, redis_client, model, tmp_path):
    warm(redis_client, [req(range(1, 33), salt="t1")], model, WarmConfig("default", (16,)))
    tokens = tmp_path / "t.txt"
    tokens.write_text(" ".join(map(str, range(1, 41))))  # 40 tokens: 2 full chunks, 8 more
    base = ["inspect", "--tokens", str(tokens), "--model", "tiny", "--chunk-size", "16", "--json",
            "--redis-url", redis_url]
    reused = {}
    for salt in ("t1", "t2", None):
        res = CliRunner().invoke(app, base + (["--cache-salt", salt] if salt else []))
        assert res.exit_code == 0, res.output
        (m,) = json.loads(res.stdout)["chunk_maps"]
        reused[salt] = (m["hit_tokens"], m["prefill_tokens"])
    assert reused == {"t1": (32, 8), "t2": (0, 40), None: (0, 40)}


def test_a_prompt_that_hits_entirely_computes_its_last_token(redis_url, redis_client, model, tmp_path):
    """One rule everywhere: the engine computes the last token for the logits, so 32 of 32 cached is 31 reused."""
    warm(redis_client, [req(range(1, 33))], model, WarmConfig("default", (16,)))
    m = chunk_map(redis_client, np.arange(1, 33), "default", 16, TINY.model_id, "cl100k_base")
    assert [r.status for r in m.rows] == ["hit", "hit"]
    assert (m.hit_tokens, m.prefill_tokens, m.break_index) == (31, 1, None)
    tokens = tmp_path / "t.txt"
    tokens.write_text(" ".join(map(str, range(1, 33))))
    res = CliRunner().invoke(app, ["inspect", "--tokens", str(tokens), "--model", "tiny", "--chunk-size", "16",
                                   "--redis-url", redis_url])
    assert res.exit_code == 0, res.output
    assert ("32 tokens: 31 reused, 1 to prefill; no break (every chunk hits; the last token is computed again for "
            "the logits, as an engine does)") in " ".join(res.stdout.split())
    replay = Replayer(redis_client, None, CostCurve.from_tokens_per_second(1000.0), "cl100k_base",
                      ReplayConfig(chunk_sizes=(16,), measure=0, payload="accounted", namespace="default"), spec=TINY)
    res = replay.replay("t", [req(range(1, 33))]).per_chunk_size[0]
    assert (res.hit_tokens, res.chunks_hit, res.upper_bound_tokens) == (31, 2, 31)
    assert res.saved_prefill_seconds_estimated == pytest.approx(31 / 1000)


def test_inspect_prompt_warns_what_the_namespace_holds(redis_url, redis_client, model, tmp_path):
    warm(redis_client, [req(range(1, 49))], model, WarmConfig("fleet", (16,)))  # 3 chunks, model seed 0
    tokens = tmp_path / "t.txt"
    tokens.write_text(" ".join(map(str, range(1, 49))))
    base = ["inspect", "--tokens", str(tokens), "--model", "tiny", "--namespace", "fleet", "--redis-url", redis_url]
    holds = f"chunk size 16: 3 metadata, 3 payloads (model {TINY.model_id})"
    other_seed = model_spec("tiny", seed=1).model_id
    res = CliRunner().invoke(app, base + ["--seed", "1", "--chunk-size", "16"])
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == [
        f"warning: namespace 'fleet' holds nothing for model {other_seed} at chunk size 16 (another --seed, "
        f"--model, --dtype or chunk size, or a typo?); it holds: {holds}"]
    res = CliRunner().invoke(app, base + ["--chunk-size", "16,32", "--json"])
    assert res.exit_code == 0, res.output
    maps = json.loads(res.stdout)["chunk_maps"]
    assert [(m["chunk_size"], m["hit_tokens"], m["warning"]) for m in maps] == [
        (16, 47, ""),
        (32, 0, f"namespace 'fleet' holds nothing for model {TINY.model_id} at chunk size 32 (another --seed, "
                f"--model, --dtype or chunk size, or a typo?); it holds: {holds}")]
    res = CliRunner().invoke(app, base + ["--namespace", "flet", "--chunk-size", "16"])
    assert res.stderr.splitlines() == [
        f"warning: namespace 'flet' holds nothing for model {TINY.model_id} at chunk size 16 (another --seed, "
        f"--model, --dtype or chunk size, or a typo?); it holds: no kvcli keys"]


def test_replay_namespace_warns_what_it_holds(redis_client, model):
    warm(redis_client, [req(range(1, 49))], model, WarmConfig("fleet", (16,)))
    other = model_spec("tiny", seed=3)
    config = ReplayConfig(chunk_sizes=(16, 32), measure=0, payload="accounted", namespace="fleet")
    replayer = Replayer(redis_client, None, CostCurve.from_tokens_per_second(1000.0), "cl100k_base", config,
                        spec=other)
    result = replayer.replay("t", [req(range(1, 49))] * 2)
    holds = f"chunk size 16: 3 metadata, 3 payloads (model {TINY.model_id})"
    assert [n for n in result.notes if n.startswith("namespace")] == [
        f"namespace 'fleet' holds nothing for model {other.model_id} at chunk size {cs} (another --seed, --model, "
        f"--dtype or chunk size, or a typo?); it holds: {holds}" for cs in (16, 32)]
    same = Replayer(redis_client, None, CostCurve.from_tokens_per_second(1000.0), "cl100k_base", config, spec=TINY)
    result = same.replay("t", [req(range(1, 49))] * 2)
    rows = {r.chunk_size: r for r in result.per_chunk_size}
    assert (rows[16].hit_tokens, rows[16].namespace_hit_chunks, rows[32].hit_tokens) == (47 + 47, 6, 32)
    assert [n for n in result.notes if n.startswith("namespace")] == [
        f"namespace 'fleet' holds nothing for model {TINY.model_id} at chunk size 32 (another --seed, --model, "
        f"--dtype or chunk size, or a typo?); it holds: {holds}"]


def test_a_prompt_shorter_than_a_chunk_says_so(redis_url, tmp_path):
    """Eleven tokens at chunk size 16 have no full chunk to look up: the map says why its table is empty."""
    tokens = tmp_path / "t.txt"
    tokens.write_text(" ".join(map(str, range(1, 12))))
    res = CliRunner().invoke(app, ["inspect", "--tokens", str(tokens), "--model", "tiny", "--chunk-size", "4,16",
                                   "--redis-url", redis_url])
    assert res.exit_code == 0, res.output
    out = " ".join(res.stdout.split())
    assert ("11 tokens: 0 reused, 11 to prefill; no full chunk to look up (11 tokens, fewer than the chunk size 16: "
            "a partial chunk is never cached)") in out
    assert "11 tokens: 0 reused, 11 to prefill; breaks at chunk 0: missing" in out
