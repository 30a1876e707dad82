"""``kvcli audit`` on vLLM 0.32.0's recorded runs (tests/engine/fixtures/), the engine log readers, and bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.analysis.audit import audit_trace, capacity_tokens, join
from kvcli.cli.app import app
from kvcli.engine.reports import EngineReport, engine_row, read_engine_log
from kvcli.errors import BadInputError

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(folder: str, name: str) -> Path:
    path = FIXTURES / folder / name
    return path if path.exists() else Path(f"{path}.gz")


def run_audit(folder: str, run: str, blocks: int | None, events: bool):
    return audit_trace(fixture(folder, "trace.jsonl"), FIXTURES / folder / f"{run}.requests.jsonl", 32, blocks,
                       fixture(folder, f"{run}.events.jsonl") if events else None)


@pytest.mark.parametrize("events", [False, True])
@pytest.mark.parametrize("folder, run, blocks, exact, differ", [
    ("synthetic", "unbounded", None, 12, {"s04": (32, 63), "s13": (128, 159)}),
    ("synthetic", "bounded-10", 10, 14, {}),  # vLLM's pool simulated: its whole-last-block rule included
    ("chat", "unbounded", None, 24, {}),
    ("chat", "bounded-100", 100, 24, {}),
])
def test_recorded_runs_leave_nothing_unexplained(folder, run, blocks, exact, differ, events):
    """At the run's own capacity nothing differs where the engine's pool is simulated (``--gpu-blocks``); unbounded,
    explain's LRU rule differs only by the whole last block of a prompt held whole (31 tokens)."""
    audit = run_audit(folder, run, blocks, events)
    assert audit.joined_by == "id"
    assert audit.requests_exact == exact and audit.unexplained_tokens == 0
    got = {r.id: (r.engine_cached_tokens, r.predicted_cached_tokens) for r in audit.requests
           if r.difference_tokens}
    assert got == differ
    assert audit.causes() == ({"whole_last_block": -31 * len(differ)} if differ else {})
    if events:
        assert all(r.events_cached_tokens == r.engine_cached_tokens for r in audit.requests)
        assert audit.unplaced_batches == 0


def test_events_name_the_evictions_a_wrong_capacity_misses():
    """Audited as if unbounded, the 10-block run's losses are blocks the engine evicted, each by a named request."""
    audit = run_audit("synthetic", "bounded-10", None, True)
    assert (audit.requests_exact, audit.unexplained_tokens) == (7, 0)
    assert audit.causes() == {"evicted_by_engine": -416, "whole_last_block": -62}
    by = {r.id: (r.causes, r.evicted_by) for r in audit.requests if "evicted_by_engine" in r.causes}
    assert by["s09"] == ({"evicted_by_engine": -96}, ["s08"])
    assert by["s12"] == ({"evicted_by_engine": -64}, ["s07"])


def test_events_name_what_the_engine_kept_beyond_a_small_capacity():
    audit = run_audit("chat", "bounded-100", 60, True)
    assert (audit.requests_exact, audit.unexplained_tokens) == (13, 0)
    assert audit.causes() == {"kept_by_engine": 6176}


def test_without_events_a_capacity_difference_is_unexplained():
    audit = run_audit("synthetic", "bounded-10", None, False)
    assert audit.unexplained_tokens == 416 and audit.causes() == {"whole_last_block": -62}


def test_a_prompt_the_engine_counted_differently(tmp_path):
    rows = [json.loads(line) for line in (FIXTURES / "chat" / "unbounded.requests.jsonl").read_text().splitlines()]
    rows[1]["prompt_tokens"] += 1  # a BOS the trace lacks
    rows[1]["cached_tokens"] -= 32
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    audit = audit_trace(fixture("chat", "trace.jsonl"), log, 32)
    assert audit.unexplained_tokens == 0 and audit.causes() == {"prompt_differs": -32}


def test_openai_responses_join_by_order(tmp_path):
    rows = [json.loads(line) for line in (FIXTURES / "synthetic" / "unbounded.requests.jsonl").read_text().splitlines()]
    log = tmp_path / "responses.jsonl"
    log.write_text("".join(json.dumps({"id": f"chatcmpl-{i}", "usage": {
        "prompt_tokens": r["prompt_tokens"], "prompt_tokens_details": {"cached_tokens": r["cached_tokens"]}}}) + "\n"
        for i, r in enumerate(rows)))
    audit = audit_trace(fixture("synthetic", "trace.jsonl"), log, 32)
    assert audit.joined_by == "order" and audit.requests_exact == 12 and audit.unexplained_tokens == 0


def test_cli_json():
    result = CliRunner().invoke(app, [
        "audit", str(fixture("synthetic", "trace.jsonl")), "--engine-log",
        str(FIXTURES / "synthetic" / "bounded-10.requests.jsonl"), "--events",
        str(fixture("synthetic", "bounded-10.events.jsonl")), "--block-size", "32", "--gpu-blocks", "10", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    trace = doc["traces"][0]
    assert doc["capacity_tokens"] == 256
    assert (trace["requests_exact"], trace["unexplained_tokens"], len(trace["per_request"])) == (14, 0, 14)
    s04 = next(r for r in trace["per_request"] if r["id"] == "s04")
    assert (s04["engine_cached_tokens"], s04["predicted_cached_tokens"], s04["causes"]) == (32, 32, {})


ids = st.one_of(st.none(), st.text(min_size=1, max_size=8))
counts = st.integers(min_value=0, max_value=10**6)


@given(ids, counts, st.one_of(st.none(), counts), st.sampled_from(["request_id", "id"]),
       st.sampled_from(["num_cached_tokens", "cached_tokens"]))
def test_vllm_rows(rid, cached, uncached, id_key, key):
    prompt = None if uncached is None else cached + uncached  # an engine caches at most the prompt
    row = {key: cached, **({id_key: rid} if rid is not None else {}),
           **({"prompt_tokens": prompt} if prompt is not None else {})}
    assert engine_row(row) == EngineReport(rid, cached, prompt, "")


@given(ids, counts, counts, st.sampled_from(["bare", "response", "response_body", "text"]), ids)
def test_openai_and_gateway_rows(rid, cached, uncached, shape, row_id):
    prompt = cached + uncached
    body = {"usage": {"prompt_tokens": prompt, "prompt_tokens_details": {"cached_tokens": cached}},
            **({"id": rid} if rid is not None else {})}
    if shape == "bare":
        assert engine_row(body) == EngineReport(rid, cached, prompt, "")
        return
    row = {"response" if shape == "text" else shape: json.dumps(body) if shape == "text" else body,
           **({"request_id": row_id} if row_id is not None else {})}
    assert engine_row(row) == EngineReport(row_id if row_id is not None else rid, cached, prompt, "")


@pytest.mark.parametrize("line, message", [
    ("[1, 2]", "a row is a JSON object"),
    ('{"id": "a"}', "no cached token count"),
    ('{"id": "a", "num_cached_tokens": -1}', "num_cached_tokens is an integer >= 0"),
    ('{"id": "a", "usage": {"prompt_tokens": 3}}', "--enable-prompt-tokens-details"),
    ('{"response": "not json"}', "response holds text that is not JSON"),
    ("{not json", ""),
    ('{"id": "a", "num_cached_tokens": 126, "prompt_tokens": 125}', "126 cached tokens in a prompt of 125 tokens"),
    ('{"id": "a", "usage": {"prompt_tokens": 64, "prompt_tokens_details": {"cached_tokens": 96}}}',
     "96 cached tokens in a prompt of 64 tokens"),
])
def test_bad_lines_are_named(tmp_path, line, message):
    log = tmp_path / "log.jsonl"
    log.write_text('{"id": "ok", "num_cached_tokens": 0}\n' + line + "\n")
    with pytest.raises(BadInputError, match=f"log.jsonl:2: .*{message}"):
        read_engine_log(log)


def test_rows_that_join_neither_way():
    rows = [EngineReport("x", 0, None, "log.jsonl:1")]
    with pytest.raises(BadInputError, match="cannot join 2 requests with 1 engine rows: 0 ids match"):
        join(["a", "b"], rows)


def test_events_of_another_block_size_are_named():
    # the synthetic runs' first batch (line 2, after the header) stores blocks of 32 tokens
    with pytest.raises(BadInputError, match=r"unbounded\.events\.jsonl:2: the engine stored blocks of 32 tokens, "
                                            "but --block-size is 16"):
        audit_trace(fixture("synthetic", "trace.jsonl"), FIXTURES / "synthetic" / "unbounded.requests.jsonl", 16,
                    None, fixture("synthetic", "unbounded.events.jsonl"))


def test_events_without_batches(tmp_path):
    # what `kvcli events record` leaves when nothing was published: its header line alone
    events = tmp_path / "idle.jsonl"
    events.write_text('{"kvcli_kv_events": 1, "endpoint": "tcp://127.0.0.1:5557", "topic": "", '
                      '"replay_endpoint": null, "started_at": "2026-12-05T10:00:00Z"}\n')
    result = CliRunner().invoke(app, [
        "audit", str(fixture("synthetic", "trace.jsonl")), "--engine-log",
        str(FIXTURES / "synthetic" / "unbounded.requests.jsonl"), "--events", str(events), "--block-size", "32"])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"kvcli: error: {events}: no KV event batches: the engine published none while " \
        "it was recorded (a recording of this trace's run holds one batch per engine step that stored or removed " \
        "blocks)"


def test_gpu_blocks():
    assert capacity_tokens(None, 32) is None and capacity_tokens(10, 32) == 256
    with pytest.raises(BadInputError, match="--gpu-blocks must be > 2"):
        capacity_tokens(2, 32)
