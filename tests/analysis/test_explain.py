"""kvcli explain: each request's tokens split by cause, counted by hand on small traces, and the totals against a
real replay (its hit tokens and upper bound) on every sample trace."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.analysis.explain import CAUSES, ExplainConfig, Explainer
from kvcli.analysis.workload import explain_config, explain_traces
from kvcli.cli.app import app
from kvcli.model.presets import model_spec
from kvcli.store.enginehash import block_hashes
from kvcli.store.hashing import PromptChunker
from kvcli.traces.detect import read_trace
from kvcli.traces.request import Request

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def run(*args, code: int = 0):
    out = CliRunner().invoke(app, [str(a) for a in args])
    assert out.exit_code == code, out.output
    return out


def tok(a: int, b: int) -> list[int]:
    """tok(a..b), both ends included."""
    return list(range(a, b + 1))


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def explain(requests: list[Request], **config) -> list:
    ex = Explainer(ExplainConfig(**config))
    return [ex.add(r) for r in requests]


def req(rid: str, tokens: list[int], **kw) -> Request:
    return Request(rid, np.array(tokens, dtype="<u4"), **kw)


def causes(**nonzero: int) -> dict[str, int]:
    return {c: nonzero.get(c, 0) for c in CAUSES}


def test_a_divergence_inside_a_chunk_by_hand(tmp_path):
    # R2 = tok(1..40) + [999] + tok(42..100): it shares 40 tokens with R1; at chunk 16 two whole chunks (32) are
    # reused, the 8 shared tokens of chunk 2 are lost to the boundary, the 60 from token 40 on to the divergence
    trace = write(tmp_path / "t.jsonl", [{"id": "r1", "token_ids": tok(1, 100)},
                                         {"id": "r2", "token_ids": tok(1, 40) + [999] + tok(42, 100)}])
    out = run("explain", trace, "--chunk-size", 16, "--json")
    (t,) = json.loads(out.stdout)["traces"]
    r1, r2 = t["per_request"]
    assert r1["lost_tokens_by_cause"] == causes(new=100) and r1["predecessor"] is None
    assert (r2["reused_tokens"], r2["best_prefix_tokens"], r2["predecessor"], r2["first_divergent_token"]) == (
        32, 40, "r1", 40)
    assert r2["lost_tokens_by_cause"] == causes(chunk_boundary=8, divergence=60)
    assert r2["divergence_site"] == "token 40"
    assert (t["reused_tokens"], t["upper_bound_tokens"], t["prompt_tokens"]) == (32, 40, 200)
    assert t["top_divergence_sites"][0]["site"] == "token 40" and t["top_divergence_sites"][0][
        "divergence_tokens"] == 60


def test_a_hash_id_divergence_is_named_by_the_records_own_block_size(tmp_path):
    # hash-ids records with block_size 4 (none declared on the command line): r2 shares hash id 1 (4 tokens) and
    # differs from hash_ids[1] on; its synthesized tokens differ from r1's from token 4 (first tokens unequal)
    trace = write(tmp_path / "h.jsonl", [
        {"timestamp": 0, "block_size": 4, "input_length": 8, "hash_ids": [1, 2]},
        {"timestamp": 1, "block_size": 4, "input_length": 8, "hash_ids": [1, 3]}])
    (t,) = json.loads(run("explain", trace, "--chunk-size", 4, "--json").stdout)["traces"]
    assert t["per_request"][1]["divergence_site"] == "hash_ids[1]"
    assert (t["reused_tokens"], t["upper_bound_tokens"]) == (4, 4)


def test_a_mooncake_text_row_is_sited_by_token_not_by_a_hash_id_it_does_not_have(tmp_path):
    # Mooncake rows that give their prompt as text (payload) have no hash_ids: the site is a token position. cl100k
    # encodes "word", " word" and " other" as one token each: the prompts are 1 + 39 and 1 + 19 + 20 tokens, the
    # second differs from token 20 on; at chunk 16 one chunk is reused, 4 tokens lost to the boundary, 20 diverge.
    trace = write(tmp_path / "m.jsonl", [
        {"timestamp": 0, "payload": {"model": "m", "prompt": "word" + " word" * 39}},
        {"timestamp": 1, "payload": {"model": "m", "prompt": "word" + " word" * 19 + " other" * 20}}])
    (t,) = json.loads(run("explain", trace, "--format", "mooncake", "--chunk-size", 16, "--json").stdout)["traces"]
    r2 = t["per_request"][1]
    assert (r2["prompt_tokens"], r2["reused_tokens"], r2["divergence_site"]) == (40, 16, "token 20")
    assert r2["lost_tokens_by_cause"] == causes(chunk_boundary=4, divergence=20)
    # a text trace: its excerpts decode tokens 20 - 12 = 8 to 20 + 12 = 32 of each prompt, " word" x 12 then
    # " other" x 12 (132 characters) and " word" x 24 (120); they first differ at character 5 x 12 + 1 = 61 ("o"
    # against "w"), cut to characters 61 - 24 = 37 to 61 + 24 = 85, "…" where cut
    ours, theirs = " word" * 12 + " other" * 12, " word" * 24
    assert (r2["divergence_ours"], r2["divergence_predecessor"]) == ("…" + ours[37:85] + "…",
                                                                     "…" + theirs[37:85] + "…")
    # character 37 is the "o" of the 8th " word" (5 x 7 + 2); 60 to 85: " other" x 4 and the next space
    assert r2["divergence_ours"] == "…ord word word word word other other other other …"


def test_a_changing_date_in_the_system_prompt_is_named_with_both_dates(tmp_path):
    # cl100k ChatML, each piece encoded on its own: "<|im_start|>system\n" is 8 tokens; the two system texts
    # "You are a support agent for Acme. Today is 2026-11-0[12]. Answer briefly." are 22 tokens each and share
    # their first 17 ("You", " are", ..., "-", then "01" vs "02"), so b diverges from a at token 8 + 17 = 25.
    # b: 8 + 22 + 6 (footer) + 8 (user header) + 5 ("Where is my order?") + 6 + 8 (generation prompt) = 63 tokens.
    # At chunk 4: 24 reused, 1 lost to the boundary, 63 - 25 = 38 to the divergence.
    system = "You are a support agent for Acme. Today is 2026-11-0{}. Answer briefly."
    records = [{"id": k, "messages": [{"role": "system", "content": system.format(d)},
                                      {"role": "user", "content": "Where is my order?"}]} for k, d in (("a", 1),
                                                                                                        ("b", 2))]
    trace = write(tmp_path / "dates.jsonl", records)
    (t,) = json.loads(run("explain", trace, "--chunk-size", 4, "--json").stdout)["traces"]
    a, b = t["per_request"]
    assert a["lost_tokens_by_cause"] == causes(new=63)
    assert (b["prompt_tokens"], b["reused_tokens"], b["best_prefix_tokens"], b["first_divergent_token"]) == (
        63, 24, 25, 25)
    assert b["lost_tokens_by_cause"] == causes(chunk_boundary=1, divergence=38)
    assert b["divergence_site"] == "messages[0] (system) content"
    assert "2026-11-02" in b["divergence_ours"] and "2026-11-01" in b["divergence_predecessor"]
    (site,) = t["top_divergence_sites"]
    assert (site["message_index"], site["role"], site["field"], site["divergence_tokens"]) == (0, "system",
                                                                                              "content", 38)
    text = run("explain", trace, "--chunk-size", 4).stdout
    assert "messages[0] (system) content" in text and "2026-11-02" in text


def test_eviction_by_the_capacity_by_hand():
    # capacity 1 chunk of 4: r2's chunk evicts r1's, so r3 (r1's first chunk again) finds nothing held
    got = explain([req("r1", tok(1, 5)), req("r2", tok(11, 15)), req("r3", tok(1, 4) + [99])], chunk_size=4,
                  capacity_chunks=1)
    assert got[2].lost_tokens_by_cause == causes(eviction=4, divergence=1) and got[2].reused_tokens == 0
    unlimited = explain([req("r1", tok(1, 5)), req("r2", tok(11, 15)), req("r3", tok(1, 4) + [99])], chunk_size=4)
    assert unlimited[2].reused_tokens == 4 and unlimited[2].lost_tokens_by_cause == causes(divergence=1)


def test_expiry_after_write_by_hand():
    # chunks a = tok(1..4), b = tok(5..8); [a] at 0 s, [a, b, +1] at 2 s and at 3 s. TTL 1 s: a expired at 2 s
    # (written at 0) and is written again, so at 3 s a and b are both fresh: 0 then 8 reused. TTL 2 s: a hits at
    # 2 s (4 reused) but, not rewritten, has expired by 3 s: 4 then 0.
    def trace():
        return [req("r1", tok(1, 4), timestamp=0.0), req("r2", tok(1, 9), timestamp=2.0),
                req("r3", tok(1, 9), timestamp=3.0)]

    one = explain(trace(), chunk_size=4, ttl=1.0)
    assert [e.reused_tokens for e in one] == [0, 0, 8]
    assert one[1].lost_tokens_by_cause == causes(expiry=4, new=5)
    two = explain(trace(), chunk_size=4, ttl=2.0)
    assert [e.reused_tokens for e in two] == [0, 4, 0]
    assert two[2].lost_tokens_by_cause == causes(expiry=8, last_token=1)
    refresh = explain(trace(), chunk_size=4, ttl=2.0, ttl_refresh=True)  # a renewed at 2 s: alive at 3 s
    assert [e.reused_tokens for e in refresh] == [0, 4, 8]


def test_the_last_token_and_another_cache_salt_by_hand():
    got = explain([req("r1", tok(1, 8)), req("r2", tok(1, 8))], chunk_size=4)
    assert got[1].reused_tokens == 7 and got[1].lost_tokens_by_cause == causes(last_token=1)
    salted = explain([req("r1", tok(1, 8), cache_salt="x"), req("r2", tok(1, 9), cache_salt="y"),
                      req("r3", tok(1, 9), cache_salt="x")], chunk_size=4)
    assert salted[1].lost_tokens_by_cause == causes(cache_salt=8, new=1) and salted[1].predecessor == 0
    # r3 (salt x) shares 8 with r1 (its salt) and 9 with r2 (another salt): the 9th token is lost to the salt
    assert salted[2].reused_tokens == 8 and salted[2].lost_tokens_by_cause == causes(cache_salt=1)
    # where its own salt shares as much as any, the predecessor is of its own salt (whose chunks it reused), not
    # the later request of another salt
    own = explain([req("r1", tok(1, 8), cache_salt="x"), req("r2", tok(1, 8), cache_salt="y"),
                   req("r3", tok(1, 4) + [60], cache_salt="x")], chunk_size=4)
    assert own[2].predecessor == 0 and own[2].reused_tokens == 4 and own[2].lost_tokens_by_cause == causes(
        divergence=1)


def test_every_request_adds_up_to_its_prompt_tokens_on_every_sample():
    for cfg in (ExplainConfig(16), ExplainConfig(64, capacity_chunks=40)):
        for t in explain_traces([SAMPLES], "auto", None, cfg):
            for e in t.explanation.explained:
                assert e.reused_tokens + sum(e.lost_tokens_by_cause.values()) == e.prompt_tokens, (t.name, e.id)


def samples_with_a_mooncake_cut(folder: Path, requests: int) -> Path:
    """``folder`` holding every sample trace, the Mooncake sample cut to its first ``requests`` requests (same
    name; at chunk size 16 the whole sample is 672,682 chunks, most of a replay of every sample)."""
    for path in SAMPLES.iterdir():
        if path.name == "mooncake_conversation_head1000.jsonl.gz":
            lines = gzip.decompress(path.read_bytes()).splitlines(keepends=True)[:requests]
            (folder / path.name).write_bytes(gzip.compress(b"".join(lines)))
        else:
            (folder / path.name).symlink_to(path)
    return folder


@pytest.mark.single_server
def test_the_totals_are_replays_hit_tokens_and_upper_bound_on_every_sample(redis_url, tmp_path):
    samples = samples_with_a_mooncake_cut(tmp_path, 300)
    # in this process (--jobs 1): test_parallel checks that worker processes give the same report
    out = run("replay", samples, "--chunk-sizes", "16,256", "--measure", "0", "--prefill-tps", 1000, "--payload",
              "accounted", "--no-curve", "--json", "--jobs", 1, "--redis-url", redis_url)
    rows = {(t["trace"], r["chunk_size"]): r for t in json.loads(out.stdout)["traces"] for r in t["per_chunk_size"]}
    assert len({trace for trace, _ in rows}) == 15
    for cs in (16, 256):
        for t in explain_traces([samples], "auto", None, ExplainConfig(cs)):
            x, row = t.explanation, rows[(t.name, cs)]
            faults = {k: row[k] for k in ("redis_errors", "redis_timeouts", "redis_retries", "redis_busy_retries")}
            assert (x.reused_tokens, x.upper_bound_tokens) == (row["hit_tokens"], row["upper_bound_tokens"]), (
                t.name, cs, faults)
            assert x.reused_tokens + sum(x.lost_tokens_by_cause[c] for c in ("chunk_boundary", "eviction",
                                                                            "expiry")) == x.upper_bound_tokens


@pytest.mark.single_server
def test_the_capacity_is_replays_lru_chunk_for_chunk(redis_url):
    trace = SAMPLES / "mooncake_conversation_head1000.jsonl.gz"
    out = run("replay", trace, "--chunk-sizes", "512", "--capacity-tokens", 400_000, "--measure", "0",
              "--prefill-tps", 1000, "--payload", "accounted", "--no-curve", "--json", "--redis-url", redis_url)
    (row,) = json.loads(out.stdout)["traces"][0]["per_chunk_size"]
    (t,) = explain_traces([trace], "auto", None, explain_config(512, capacity_tokens=400_000))
    x = t.explanation
    assert x.config.capacity_chunks == 400_000 // 512
    assert x.reused_tokens == row["hit_tokens"] and x.lost_tokens_by_cause["eviction"] > 0
    assert x.reused_tokens + x.lost_tokens_by_cause["eviction"] + x.lost_tokens_by_cause["chunk_boundary"] == (
        row["upper_bound_tokens"])


def test_a_ttl_on_the_grid_equals_the_ttl_curve():
    from kvcli.sim.curve import HitCurve
    from kvcli.store.hashing import PromptChunker
    from kvcli.traces.detect import read_trace

    trace = SAMPLES / "mooncake_conversation_head1000.jsonl.gz"
    (t,) = explain_traces([trace], "auto", None, ExplainConfig(512, ttl=50.0))
    curve, chunker = HitCurve(512, False), PromptChunker("m", "t", 512)
    for r in read_trace(trace):
        curve.defer([(chunker.chunk(r.token_ids, r.cache_salt).hashes, r.timestamp, len(r.token_ids))])
    got = curve.result(1, 1)
    assert got.ttl_seconds is not None and got.ttl_hit_chunks is not None
    ttl_hit_tokens = int(got.ttl_hit_chunks[list(got.ttl_seconds).index(50.0)]) * 512
    # the curve counts whole chunks: a prompt cached whole (a multiple of 512) reuses one token less here
    whole = sum(1 for e in t.explanation.explained if e.prompt_tokens and e.prompt_tokens % 512 == 0
                and e.reused_tokens == e.prompt_tokens - 1)
    assert t.explanation.reused_tokens + whole == ttl_hit_tokens
    assert t.explanation.lost_tokens_by_cause["expiry"] > 0


def test_the_request_map_names_chunks_by_the_engines_hashes(tmp_path):
    trace = write(tmp_path / "t.jsonl", [{"id": "r1", "token_ids": tok(1, 100)},
                                         {"id": "r2", "token_ids": tok(1, 40) + [999] + tok(42, 100)}])
    out = run("explain", trace, "--chunk-size", 16, "--request", "r2", "--hash", "vllm", "--json")
    (t,) = json.loads(out.stdout)["traces"]
    chunks = t["request"]["chunks"]
    ours = block_hashes("vllm", np.array(tok(1, 40) + [999] + tok(42, 100), "<u4"), 16)
    theirs = block_hashes("vllm", np.array(tok(1, 100), "<u4"), 16)
    assert [c["hash"] for c in chunks] == ours + [None] and [c["predecessor_hash"] for c in chunks] == theirs + [None]
    assert [c["tokens_by_cause"] for c in chunks[:4]] == [{"reused": 16}, {"reused": 16},
                                                          {"chunk_boundary": 8, "divergence": 8}, {"divergence": 16}]
    assert chunks[0]["hash"] == chunks[0]["predecessor_hash"] and chunks[2]["hash"] != chunks[2]["predecessor_hash"]
    text = " ".join(run("explain", trace, "--chunk-size", 16, "--request", "r2", "--hash", "vllm").stdout.split())
    assert "chunk map of r2" in text and "best prefix 40 tokens from r1" in text and ours[0][:16] in text


def test_the_request_map_names_the_engine_version_it_hashes_as(tmp_path):
    trace = write(tmp_path / "t.jsonl", [{"id": "r1", "token_ids": tok(1, 40)},
                                         {"id": "r2", "token_ids": tok(1, 40), "cache_salt": "t"}])
    out = run("explain", trace, "--chunk-size", 16, "--request", "r2", "--hash", "vllm@0.28.0", "--hash-seed", "0",
              "--json")
    request = json.loads(out.stdout)["traces"][0]["request"]
    assert request["block_hashes"] == {"scheme": "vllm-sha256@0.28.0", "engine": "vllm", "algorithm": "sha256",
                                       "version": "0.28.0", "hashes_as": "0.13.0 to 0.28.0"}
    ours = block_hashes("vllm-sha256@0.28.0", np.array(tok(1, 40), "<u4"), 16, cache_salt="t", hash_seed="0")
    assert [c["hash"] for c in request["chunks"]] == ours + [None]
    assert ours != block_hashes("vllm", np.array(tok(1, 40), "<u4"), 16, cache_salt="t", hash_seed="0")
    text = " ".join(run("explain", trace, "--chunk-size", 16, "--request", "r2", "--hash", "vllm@0.28.0",
                        "--hash-seed", "0").stdout.split())
    assert "block hashes: vllm-sha256@0.28.0 (vLLM 0.13.0 to 0.28.0 hash alike)" in text
    plain = json.loads(run("explain", trace, "--chunk-size", 16, "--request", "r2", "--hash", "vllm",
                           "--json").stdout)["traces"][0]["request"]
    assert plain["block_hashes"]["scheme"] == "vllm-sha256@0.33.0"


def test_a_hash_id_request_map_names_chunks_by_the_store_keys(tmp_path):
    """A hash-id request's chunk map gives the hashes replay and warm store it under (from its block keys), and an
    engine scheme hashes its synthesized token ids. Block size 8, chunk size 4: r2 shares r1's first block."""
    trace = write(tmp_path / "h.jsonl", [{"timestamp": 0, "block_size": 8, "input_length": 16, "hash_ids": [1, 2]},
                                         {"timestamp": 1, "block_size": 8, "input_length": 12, "hash_ids": [1, 3]}])
    (r1, r2) = read_trace(trace)
    out = run("explain", trace, "--chunk-size", 4, "--request", r2.id, "--json")
    chunks = json.loads(out.stdout)["traces"][0]["request"]["chunks"]
    spec = model_spec()
    chunker = PromptChunker(spec.model_id, "cl100k_base", 4)
    assert [c["hash"] for c in chunks] == chunker.chunk(r2.prompt).hexes
    assert [c["hash"] for c in chunks][:2] == chunker.chunk(r1.prompt).hexes[:2]
    assert [c["predecessor_hash"] for c in chunks] == chunker.chunk(r1.prompt).hexes[:3]
    out = run("explain", trace, "--chunk-size", 4, "--request", r2.id, "--hash", "sglang", "--json")
    chunks = json.loads(out.stdout)["traces"][0]["request"]["chunks"]
    assert [c["hash"] for c in chunks] == block_hashes("sglang", r2.token_ids, 4)


@pytest.mark.parametrize("args, message", [
    (["--request", "nope"], "no request with id or source 'nope'"),
    (["--hash", "vllm-xxhash"], "--hash vllm-xxhash"),
    (["--hash", "nonsense"], "--hash nonsense"),
    (["--hash", "vllm@0.9.2"], "builtin hash()"),
    (["--hash", "vllm@9.0.0"], "newer than the newest version kvcli checked"),
    (["--ttl", "5"], "--ttl needs a timestamp"),
    (["--chunk-size", "0"], "--chunk-size must be a positive integer, got '0'"),
    (["--ttl-refresh"], "it needs --ttl"),
    (["--hash", "vllm", "--hash-seed", "abc"], "PYTHONHASHSEED must be 'random' or an integer"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, args, message):
    trace = write(tmp_path / "t.jsonl", [{"id": "r1", "token_ids": tok(1, 20)}])
    out = run("explain", trace, *args, code=2)
    last = out.output.strip().splitlines()[-1]
    assert last.startswith("kvcli: error:") and message in out.output, out.output


def _lcp(a: list[int], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2), max_size=7), st.sampled_from(["", "x"])), max_size=12))
def test_the_radix_names_the_latest_request_of_the_longest_prefix(prompts):
    # brute force: B = the longest common prefix with an earlier prompt of the same salt; the predecessor is the
    # latest of those sharing B that goes on past it, else the latest sharing it
    from kvcli.sim.upper_bound import RadixUpperBound

    radix = RadixUpperBound()
    for i, (tokens, salt) in enumerate(prompts):
        got = radix.match(np.array(tokens, "<u4"), salt, i)
        earlier = [(j, _lcp(tokens, t)) for j, (t, s) in enumerate(prompts[:i]) if s == salt]
        best = max((k for _, k in earlier), default=0)
        assert got.tokens == best
        if best == 0:
            assert (got.predecessor, got.continues) == (-1, False)
            continue
        sharing = [j for j, k in earlier if k == best]
        longer = [j for j in sharing if len(prompts[j][0]) > best]
        assert (got.predecessor, got.continues) == ((max(longer), True) if longer else (max(sharing), False))


@pytest.mark.single_server
def test_a_live_namespace_read_beside_adds_its_chunks_and_takes_them_off_the_causes(tmp_path, redis_url,
                                                                                     monkeypatch):
    # the namespace holds tok(1..40)'s 2 full chunks of 16 (warmed); r1 = tok(1..40) + [7] is the first request, so
    # every token would be new, but 32 of them come from the namespace: reused 32 (all from it), new 9
    warmed = write(tmp_path / "w.jsonl", [{"token_ids": tok(1, 40)}])
    run("warm", warmed, "--redis-url", redis_url, "--namespace", "fleet", "--chunk-sizes", 16)
    trace = write(tmp_path / "t.jsonl", [{"id": "r1", "token_ids": tok(1, 40) + [7]},
                                         {"id": "r2", "token_ids": tok(1, 20) + [5, 5]}])
    out = run("explain", trace, "--chunk-size", 16, "--namespace", "fleet", "--redis-url", redis_url, "--json")
    (t,) = json.loads(out.stdout)["traces"]
    r1, r2 = t["per_request"]
    assert (r1["reused_tokens"], r1["reused_from_namespace_tokens"]) == (32, 32)
    assert r1["lost_tokens_by_cause"] == causes(new=9)
    # r2 shares 20 with r1 (16 reusable by the trace's own cache); the namespace holds chunk 0 too: nothing added
    assert (r2["reused_tokens"], r2["reused_from_namespace_tokens"]) == (16, 0)
    assert r2["lost_tokens_by_cause"] == causes(chunk_boundary=4, divergence=2)
    assert t["reused_from_namespace_tokens"] == 32 and t["reused_tokens"] == 48
    # replay reading the namespace the same way: the same hit tokens and upper bound
    replayed = json.loads(run("replay", trace, "--chunk-sizes", 16, "--namespace", "fleet", "--measure", 0,
                              "--prefill-tps", 1000, "--payload", "accounted", "--no-curve", "--json",
                              "--redis-url", redis_url).stdout)["traces"][0]["per_chunk_size"][0]
    assert (t["reused_tokens"], t["upper_bound_tokens"]) == (replayed["hit_tokens"], replayed["upper_bound_tokens"])
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert run("explain", trace, "--namespace", "fleet", code=2).output.strip().endswith("(or set REDIS_URL)")


def test_take_front_empties_the_causes_in_token_order():
    from kvcli.analysis.explain import take_front

    lost = causes(chunk_boundary=3, divergence=10)
    take_front(lost, 5)
    assert lost == causes(divergence=8)
    whole = causes(eviction=4, new=5)
    take_front(whole, 8, whole=True)  # the whole prompt reusable: the one token left is the last token's
    assert whole == causes(last_token=1)


COUNTING_TEMPLATE = ("{{ 'Turns: ' ~ (messages|length) ~ '\\n' }}{% for m in messages %}{{ m['role'] + ': ' "
                     "+ m['content'] + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}"
                     "{% endif %}")
TAGGING_TEMPLATE = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}{% if m['role'] == 'system' and "
                    "messages|length > 2 %}{{ ' [multi-turn]' }}{% endif %}{{ '\\n' }}{% endfor %}"
                    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")


@pytest.mark.parametrize("template", [COUNTING_TEMPLATE, TAGGING_TEMPLATE], ids=["header", "inside-system"])
def test_a_difference_the_template_makes_is_placed_in_the_message_it_renders(tiny_checkpoint, tmp_path, template):
    # equal messages, but the template renders the first ones differently once the conversation grows: a turn
    # count in a header before every message, or a tag inside the system message; either way the first differing
    # token lies in messages[0]'s rendering, not in messages[2] (the first message the predecessor lacks)
    import shutil

    from kvcli.model.hf_offline import transformers

    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{tiny_checkpoint}/{name}", folder / name)
    (folder / "chat_template.jinja").write_text(template)
    turn = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]
    longer = [*turn, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "and again"}]
    trace = write(tmp_path / "t.jsonl", [{"id": "m1", "messages": turn}, {"id": "m2", "messages": longer}])
    reference = transformers().AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    a, b = (list(reference.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False))
            for m in (turn, longer))
    first = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    (t,) = json.loads(run("explain", trace, "--chunk-size", 4, "--tokenizer", folder, "--json").stdout)["traces"]
    m2 = t["per_request"][1]
    assert m2["first_divergent_token"] == first and m2["predecessor"] == "m1"
    assert m2["divergence_site"] == "messages[0] (system) template"


def test_a_repeated_id_is_mapped_by_its_source_and_said(tmp_path):
    trace = write(tmp_path / "t.jsonl", [{"id": "p1", "token_ids": tok(1, 8)}, {"id": "p2", "token_ids": tok(1, 9)},
                                         {"id": "p1", "token_ids": tok(1, 6) + [0]}])
    out = run("explain", trace, "--chunk-size", 4, "--request", "p1", "--json")
    assert "id 'p1' names 2 requests" in out.stderr and "--request" in out.stderr
    assert json.loads(out.stdout)["traces"][0]["request"]["prompt_tokens"] == 8  # the first
    third = json.loads(run("explain", trace, "--chunk-size", 4, "--request", "t.jsonl:3", "--json").stdout)
    request = third["traces"][0]["request"]
    assert (request["prompt_tokens"], request["reused_tokens"], request["predecessor"]) == (7, 4, "p2")
    assert request["lost_tokens_by_cause"] == causes(chunk_boundary=2, divergence=1)


@pytest.mark.parametrize("command", [["explain", "-"], ["stats", "-"]])
def test_a_trace_on_stdin_is_named_stdin_in_errors_and_sources(command):
    bad = CliRunner().invoke(app, command, input='{"prompt": "a"}\nnot json\n')
    assert bad.exit_code == 2
    assert bad.stderr.strip() == "kvcli: error: <stdin>:2: invalid JSON: Expecting value (column 1)"
    if command[0] == "explain":
        text = (SAMPLES / "chat_shared_system.jsonl").read_text()
        out = CliRunner().invoke(app, [*command, "--request", "acme-1-t2"], input=text)
        assert out.exit_code == 0, out.output
        assert out.stdout.startswith("request acme-1-t2 (<stdin>:5): ") and "from acme-1-t1 (<stdin>:1)" in out.stdout
        assert "kvcli-stdin" not in out.output
