"""OpenAI-shaped traffic: Batch input files, request bodies and gateway logs render their prompt (messages and
tools) exactly as a native record does, under kvcli's ChatML and under a checkpoint's own chat template.

The hand-computed values use a word-level tokenizer (one token per word, built with the tokenizers library) and a
chat template that renders tools first, so every prompt's token count is its word count."""
from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.model.tokenize import get_tokenizer
from kvcli.traces.detect import detect_format, read_trace

WORDS = ("[UNK] TOOLS END system user assistant get_weather get_time be brief weather in paris rome london "
         "time").split()
TEMPLATE = ("{% if tools %}TOOLS {% for t in tools %}{{ t.function.name }} {% endfor %}END {% endif %}"
            "{% for m in messages %}{{ m.role }} {{ m.content }} END {% endfor %}"
            "{% if add_generation_prompt %}assistant{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
SYSTEM = {"role": "system", "content": "be brief"}
FAST = ["--payload", "accounted", "--measure", "0", "--prefill-tps", "1000", "--json"]


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory) -> str:
    """A tokenizer folder: one token per word of :data:`WORDS`, the chat template :data:`TEMPLATE`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]")
    fast.chat_template = TEMPLATE
    folder = tmp_path_factory.mktemp("words")
    fast.save_pretrained(str(folder))
    return str(folder)


def chat(city: str) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": f"weather in {city}"}]


def batch_line(i: int, city: str, tools=TOOLS) -> dict:
    body = {"model": "gpt-4o-mini", "messages": chat(city), "max_tokens": 50}
    if tools is not None:
        body["tools"] = tools
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def ids(path, tokenizer="cl100k_base", fmt="auto") -> list[list[int]]:
    return [r.token_ids.tolist() for r in read_trace(path, fmt, tokenizer)]


@pytest.mark.parametrize("tokenizer", ["cl100k_base", "words"])
def test_a_batch_line_gives_the_native_records_token_ids(tmp_path, word_tokenizer, tokenizer):
    tok = word_tokenizer if tokenizer == "words" else tokenizer
    batch = write_jsonl(tmp_path / "batch.jsonl", [batch_line(1, "paris"), batch_line(2, "rome", tools=None)])
    native = write_jsonl(tmp_path / "native.jsonl", [{"messages": chat("paris"), "tools": TOOLS},
                                                     {"messages": chat("rome")}])
    bodies = write_jsonl(tmp_path / "bodies.jsonl", [batch_line(1, "paris")["body"],
                                                     batch_line(2, "rome", tools=None)["body"]])
    assert detect_format(batch) == "openai-batch" and detect_format(native) == detect_format(bodies) == "native"
    assert ids(batch, tok) == ids(native, tok) == ids(bodies, tok)
    assert [r.id for r in read_trace(batch, "auto", tok)] == ["req-1", "req-2"]


def test_tools_render_as_the_checkpoints_template_renders_them(tmp_path, word_tokenizer):
    batch = write_jsonl(tmp_path / "batch.jsonl", [batch_line(1, "paris")])
    tok = get_tokenizer(word_tokenizer)
    # TOOLS get_weather END | system be brief END | user weather in paris END | assistant: 13 words, 13 tokens
    assert tok.decode(ids(batch, word_tokenizer)[0]) == ("TOOLS get_weather END system be brief END user weather in "
                                                         "paris END assistant")


def test_kvclis_own_rendering_puts_the_tools_after_the_system_prompt(tmp_path):
    batch = write_jsonl(tmp_path / "batch.jsonl", [batch_line(1, "paris")])
    tools_turn = {"role": "system", "content": "Tools available:\n" + json.dumps(TOOLS, ensure_ascii=False)}
    spelled = write_jsonl(tmp_path / "spelled.jsonl", [{"messages": [SYSTEM, tools_turn, chat("paris")[1]]}])
    assert ids(batch) == ids(spelled)


def test_batch_replay_hits_the_hand_computed_shared_prefix(tmp_path, redis_url, word_tokenizer):
    # Both prompts are 13 tokens; they share "TOOLS get_weather END system be brief END user weather in" (10), so
    # at chunk size 4 the second request hits its first two chunks: 8 tokens.
    batch = write_jsonl(tmp_path / "batch.jsonl", [batch_line(1, "paris"), batch_line(2, "rome")])
    native = write_jsonl(tmp_path / "native.jsonl", [{"messages": chat(c), "tools": TOOLS} for c in ("paris", "rome")])
    for trace in (batch, native):
        out = CliRunner().invoke(app, ["replay", trace, "--chunk-sizes", "4", "--tokenizer", word_tokenizer,
                                       "--redis-url", redis_url] + FAST)
        assert out.exit_code == 0, out.output
        row = json.loads(out.stdout)["traces"][0]["per_chunk_size"][0]
        assert (row["prompt_tokens"], row["hit_tokens"]) == (26, 8)


LITELLM_ROWS = [
    {"request_id": "a1", "call_type": "acompletion", "startTime": "2025-03-01T10:00:00.250000+00:00",
     "endTime": "2025-03-01T10:00:01Z", "model": "gpt-4o-mini", "session_id": "s1", "completion_tokens": 7,
     "messages": chat("paris"),
     "proxy_server_request": {"model": "gpt-4o-mini", "messages": chat("paris"), "tools": TOOLS}},
    {"request_id": "a2", "call_type": "acompletion", "startTime": "2025-03-01T10:00:02.750000+00:00",
     "endTime": "2025-03-01T10:00:03Z", "model": "gpt-4o-mini", "session_id": "s1", "completion_tokens": 9,
     "messages": chat("rome"), "proxy_server_request": {}},
]


def test_a_litellm_spend_log_reads_its_requests_times_and_sessions(tmp_path, word_tokenizer):
    log = write_jsonl(tmp_path / "spend.jsonl", LITELLM_ROWS)
    assert detect_format(log) == "gateway"
    got = list(read_trace(log, "auto", word_tokenizer))
    assert [(r.id, r.timestamp, r.session_id, r.output_length) for r in got] == [("a1", 0.0, "s1", 7),
                                                                                ("a2", 2.5, "s1", 9)]
    native = write_jsonl(tmp_path / "native.jsonl", [{"messages": chat("paris"), "tools": TOOLS},
                                                     {"messages": chat("rome")}])  # a2 kept no body: no tools
    assert [r.token_ids.tolist() for r in got] == ids(native, word_tokenizer)


def test_a_gateway_csv_with_json_cells_and_epoch_times(tmp_path, word_tokenizer):
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["request_id", "startTime", "proxy_server_request", "messages"])
    writer.writerow(["c1", "1740823200", json.dumps({"messages": chat("paris"), "tools": TOOLS}), ""])
    writer.writerow(["c2", "1740823201.5", "", json.dumps(chat("rome"))])
    log = tmp_path / "gateway.csv"
    log.write_text(buffer.getvalue())
    assert detect_format(log) == "gateway"
    got = list(read_trace(log, "auto", word_tokenizer))
    assert [(r.id, r.timestamp, r.source) for r in got] == [("c1", 0.0, f"{log}:2"), ("c2", 1.5, f"{log}:3")]
    assert [r.token_ids.tolist() for r in got] == ids(write_jsonl(tmp_path / "n.jsonl", [
        {"messages": chat("paris"), "tools": TOOLS}, {"messages": chat("rome")}]), word_tokenizer)
    ms = list(read_trace(log, read_format("gateway", "ms"), word_tokenizer))
    assert [r.timestamp for r in ms] == [0.0, 0.0015]


def read_format(name: str, unit: str):
    from kvcli.traces.hashids import TraceFormat

    return TraceFormat(name, timestamp_unit=unit)


@pytest.mark.parametrize("row, message", [
    ({"request_id": "x", "startTime": "yesterday", "proxy_server_request": {"messages": []}},
     "startTime = 'yesterday' is neither an ISO-8601 time nor an epoch number"),
    ({"request_id": "x", "startTime": 5, "proxy_server_request": {}, "messages": {}},
     "no request in this row: none of proxy_server_request, request_body, request holds a body with messages or "
     "prompt, and messages is empty"),
    ({"request_id": "x", "startTime": 5, "proxy_server_request": "{\"messages\": [", "messages": []},
     "proxy_server_request is not JSON"),
    ({"request_id": "x", "startTime": 5, "proxy_server_request": {"messages": chat("rome"), "tools": {"a": 1}}},
     "proxy_server_request: tools must be a list of tool objects, not an object"),
    # valid JSON, but no float holds it; the message quotes its first 37 characters
    ({"request_id": "x", "startTime": 10**400, "proxy_server_request": {"messages": chat("rome")}},
     "startTime must be finite, got 1" + "0" * 36 + "..."),
])
def test_bad_gateway_rows_are_one_line_errors_at_their_line(tmp_path, row, message):
    log = write_jsonl(tmp_path / "g.jsonl", [LITELLM_ROWS[0], row])
    with pytest.raises(BadInputError) as info:
        list(read_trace(log))
    assert str(info.value).startswith(f"{log}:2: {message}")


def test_a_gateway_epoch_number_outside_the_years_1_to_9999_is_one_error(tmp_path):
    """Epoch numbers from 0001-01-01T00:00:00Z (-62135596800 s) to before 10000-01-01T00:00:00Z (253402300800 s)
    are times; past either end, one error naming the row, as the same time as ISO-8601 cannot be written."""
    def row(start):
        return {"request_id": "a", "startTime": start, "proxy_server_request": {"messages": chat("rome")}}

    ends = write_jsonl(tmp_path / "ends.jsonl", [row(-62_135_596_800), row(253_402_300_799.5)])
    # 253402300799.5 - (-62135596800) = 315537897599.5 s after the first row
    assert [r.timestamp for r in read_trace(ends)] == [0.0, 315_537_897_599.5]
    words = "a time outside the years 1 to 9999, the range a Python datetime (and a Parquet timestamp column) holds"
    for bad_rows, line, said in (([row(-62_135_596_801)], 1, "-62135596801 is -62135596801"),
                                 ([row(0), row(253_402_300_800)], 2, "253402300800 is 253402300800"),
                                 ([row(-1e308), row(1e308)], 1, "-1e+308 is -1e+308")):
        log = write_jsonl(tmp_path / "g.jsonl", bad_rows)
        with pytest.raises(BadInputError) as info:
            list(read_trace(log))
        assert str(info.value) == f"{log}:{line}: startTime {said} s since the Unix epoch, {words}"
    # in ms (--timestamp-unit ms): 253402300800000 ms is 253402300800 s
    log = write_jsonl(tmp_path / "ms.jsonl", [row(253_402_300_800_000)])
    with pytest.raises(BadInputError) as info:
        list(read_trace(log, read_format("gateway", "ms")))
    assert str(info.value) == f"{log}:1: startTime 253402300800000 is 253402300800 s since the Unix epoch, {words}"


def test_bad_batch_lines_name_the_body(tmp_path):
    log = write_jsonl(tmp_path / "b.jsonl", [batch_line(1, "paris"), {"custom_id": "e", "body": {"input": "x"}}])
    with pytest.raises(BadInputError, match=r"b\.jsonl:2: body has neither messages \(a chat completion\) nor "
                                            r"prompt \(a completion\); its keys: input"):
        list(read_trace(log))


def test_an_ambiguous_first_record_is_refused_with_what_to_pass(tmp_path):
    both = write_jsonl(tmp_path / "both.jsonl", [{**batch_line(1, "paris"), "prompt": "hi"}])
    with pytest.raises(BadInputError) as info:
        detect_format(both)
    assert str(info.value) == (f"{both}:1: ambiguous trace format: the first record's keys (body, custom_id, method, "
                               "prompt, url) fit openai-batch and native; pass the format by name (--format "
                               "openai-batch or --format native; kvcli export: --input-format)")
    assert ids(both, fmt="native") == ids(write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi"}]))
    out = CliRunner().invoke(app, ["route", both, "--rate", "1", "--prefill-tps", "1000"])
    assert out.exit_code == 2 and out.stderr.startswith(f"kvcli: error: {both}:1: ambiguous trace format")


def test_replay_and_route_read_prompt_files_as_warm_does(tmp_path, redis_url):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the same long system prompt and then a question\n\n"
                       "the same long system prompt and then another question\n")
    assert detect_format(prompts) == "lines"
    out = CliRunner().invoke(app, ["replay", str(tmp_path), "--chunk-sizes", "4", "--redis-url", redis_url] + FAST)
    assert out.exit_code == 0, out.output
    trace = json.loads(out.stdout)["traces"][0]
    assert trace["trace"] == str(prompts) and trace["requests"] == 2
    routed = CliRunner().invoke(app, ["route", str(prompts), "--rate", "1", "--prefill-tps", "1000", "--json"])
    assert routed.exit_code == 0, routed.output
