"""kvcli.traces: every format on tiny hand-written files, gzip, auto-detection, errors, and the real samples."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from kvcli.errors import BadInputError
from kvcli.model.tokenize import get_tokenizer
from kvcli.traces.detect import FORMATS, detect_format, read_trace
from kvcli.traces.hashids import TraceFormat
from kvcli.traces.mooncake import mooncake_token_ids
from kvcli.traces.request import Request

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("cl100k_base")


def write_jsonl(path: Path, rows: list, compress: bool = False) -> Path:
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    if compress:
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def write_json(path: Path, value, compress: bool = False) -> Path:
    text = json.dumps(value, indent=2)
    path.write_bytes(gzip.compress(text.encode()) if compress else text.encode())
    return path


def bad_input(path: Path, fmt: str = "auto") -> BadInputError:
    with pytest.raises(BadInputError) as info:
        list(read_trace(path, fmt))
    return info.value


# ------------------------------------------------------------------------------------------------ native

def test_native_prompt_messages_and_token_ids(tmp_path, tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    path = write_jsonl(tmp_path / "t.jsonl", [
        {"id": "a", "prompt": "Summarize: <|endoftext|> done", "timestamp": 1.5, "session_id": "s",
         "cache_salt": "acme", "output_length": 7},
        "",
        {"messages": messages, "session_id": 12},
        {"token_ids": [1, 2, 4294967295]},
    ])
    reqs = list(read_trace(path))
    assert [r.id for r in reqs] == ["a", "t.jsonl:3", "t.jsonl:4"]
    assert [r.source for r in reqs] == [f"{path}:1", f"{path}:3", f"{path}:4"]
    a, b, c = reqs
    assert isinstance(a, Request)
    assert a.token_ids.tolist() == [9370, 5730, 553, 25, 83739, 8862, 728, 428, 91, 29, 2884]
    assert (a.timestamp, a.session_id, a.cache_salt, a.output_length) == (1.5, "s", "acme", 7)
    assert b.token_ids.tolist() == tok.encode_chat(messages, add_generation_prompt=True).tolist()
    assert (b.timestamp, b.session_id, b.cache_salt, b.output_length) == (None, "12", "", None)
    assert c.token_ids.tolist() == [1, 2, 4294967295]
    for r in reqs:
        assert r.token_ids.dtype == np.dtype("<u4") and r.token_ids.ndim == 1


def test_native_empty_prompts_are_yielded_empty(tmp_path):
    path = write_jsonl(tmp_path / "e.jsonl", [{"prompt": ""}, {"token_ids": []}])
    assert [len(r.token_ids) for r in read_trace(path)] == [0, 0]


def test_native_reader_is_lazy(tmp_path):
    path = write_jsonl(tmp_path / "lazy.jsonl", [{"token_ids": [1]}, "{not json"])
    it = read_trace(path)
    assert next(it).token_ids.tolist() == [1]
    with pytest.raises(BadInputError):
        next(it)


def test_bad_json_on_line_3_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"token_ids": [1]}, {"token_ids": [2]}, '{"token_ids": [3'])
    err = bad_input(path)
    assert str(err).startswith(f"{path}:3: invalid JSON")
    assert (err.path, err.line) == (str(path), 3)


@pytest.mark.parametrize("record, words", [
    ({"id": "x"}, "exactly one of prompt, messages, token_ids (found: none)"),
    ({"prompt": "a", "token_ids": [1]}, "(found: prompt, token_ids)"),
    ({"prompt": 5}, "prompt must be a string"),
    ({"messages": "hi"}, "messages must be a list"),
    ({"messages": [{"content": "no role"}]}, "role"),
    ({"token_ids": [1, 2.5]}, "token_ids[1] = 2.5 is not an integer in [0, 2**32)"),
    ({"token_ids": [1, -1]}, "token_ids[1] = -1"),
    ({"token_ids": [4294967296]}, "token_ids[0] = 4294967296"),
    ({"token_ids": ["7"]}, "token_ids[0] = '7'"),
    ({"token_ids": [1], "cache_salt": 3}, "cache_salt must be a string"),
    ({"token_ids": [1], "timestamp": "soon"}, "timestamp must be a finite number"),
    ({"token_ids": [1], "output_length": -2}, "output_length must be an integer >= 0"),
])
def test_native_bad_records(tmp_path, record, words):
    path = write_jsonl(tmp_path / "r.jsonl", [{"token_ids": [1]}, record])
    err = bad_input(path, "native")
    assert str(err).startswith(f"{path}:2: ")
    assert words in str(err)


def test_native_record_not_an_object(tmp_path):
    path = write_jsonl(tmp_path / "r.jsonl", [[1, 2]])
    assert str(bad_input(path, "native")) == f"{path}:1: expected a JSON object, got a list"


@pytest.mark.parametrize("fmt, record, words", [
    # a float where an id may be an integer: "not a number" would say 1.5 is no number
    ("native", {"token_ids": [1], "session_id": 1.5},
     "session_id must be a string or an integer, not 1.5 (a number with a fraction or an exponent)"),
    ("native", {"prompt": None}, "prompt must be a string (token ids go in token_ids, a list of integers), not null"),
    ("native", {"messages": "hi"}, "messages must be a list of chat messages, not a string"),
    ("native", {"token_ids": {"a": 1}}, "token_ids must be a list of integers, not an object"),
    ("native", {"messages": [None]}, "message 1: a message must be an object with role and content, not null"),
    ("native", {"messages": [{"role": "user", "content": 5}]},
     "message content must be a string, null or a list of parts, not a number"),
    ("native", {"messages": [{"role": "user", "content": "x"}], "tools": [[]]},
     "tools[0] must be an object like {'type': 'function', 'function': ...}, not a list"),
    # a request body's prompt may be token ids
    ("mooncake", {"payload": {"prompt": None}},
     "payload.prompt must be a string (text) or a list of token ids (integers in [0, 2**32)), not null"),
    ("mooncake", {"input_length": 4, "hash_ids": {"0": 1}}, "hash_ids must be a list of integers, not an object"),
    ("sharegpt", {"id": "c", "conversations": [{"from": "human", "value": True}]},
     "conversations[0].value must be a string or a list of content parts, not a boolean"),
])
def test_wrong_types_are_named_as_json_names_them(tmp_path, fmt, record, words):
    path = write_jsonl(tmp_path / "r.jsonl", [record])
    assert str(bad_input(path, fmt)) == f"{path}:1: {words}"


# ------------------------------------------------------------------------------------------------ mooncake

def test_mooncake_shared_block_gives_shared_tokens(tmp_path):
    path = write_jsonl(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 2500, "input_length": 1000, "output_length": 6, "hash_ids": [0, 2]},
    ])
    a, b = read_trace(path)
    assert (len(a.token_ids), len(b.token_ids)) == (700, 1000)
    assert a.token_ids[:512].tolist() == b.token_ids[:512].tolist()
    assert np.mean(a.token_ids[512:700] != b.token_ids[512:700]) > 0.99
    assert max(a.token_ids.max(), b.token_ids.max()) < 100256
    assert a.token_ids.dtype == np.dtype("<u4")
    assert (a.timestamp, b.timestamp) == (0.0, 2.5)
    assert (a.output_length, b.output_length) == (5, 6)
    assert (a.id, b.id) == ("m.jsonl:1", "m.jsonl:2")


def _splitmix64_reference(x: int) -> int:
    mask = 2**64 - 1
    z = (x + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_mooncake_token_ids_follow_the_documented_function():
    # SplitMix64 seeded with 0 first outputs 0xE220A8397B1DCDAF (Vigna's reference implementation)
    assert _splitmix64_reference(0) == 0xE220A8397B1DCDAF
    assert mooncake_token_ids([0], 1).tolist() == [((0xE220A8397B1DCDAF >> 32) * 100256) >> 32] == [88557]
    # An id from 2**54 (2**63 // 512) up is folded below it, as the reader folds it: key splitmix64(id) % 2**54.
    big, folded = 2**54 + 3, _splitmix64_reference(2**54 + 3) % 2**54
    ids = mooncake_token_ids([7, big], 600)
    expected = [((_splitmix64_reference(h * 512 + j) >> 32) * 100256) >> 32
                for h in (7, folded) for j in range(512)][:600]
    assert ids.tolist() == expected
    assert mooncake_token_ids([], 0).shape == (0,)
    with pytest.raises(BadInputError, match=r"3 hash_ids for input_length 512 at 512 tokens per id"):
        mooncake_token_ids([3, 4, 5], 512)


@pytest.mark.parametrize("record, words", [
    ({"input_length": 1025, "hash_ids": [0, 1]}, "2 hash_ids for input_length 1025 at 512 tokens per id"),
    ({"input_length": 512, "hash_ids": [0, 1]}, "expected ceil(512/512) = 1"),
    ({"input_length": -1, "hash_ids": [0]}, "input_length must be an integer >= 0"),
    ({"hash_ids": [0]}, "needs input_length"),
    ({"input_length": 10, "text_input": "a", "payload": {}}, "by one of messages, text_input, payload (found: "
                                                             "text_input, payload)"),
    ({"input_length": 10, "hash_ids": [0.5]}, "hash_ids[0] = 0.5"),
    ({"input_length": 10, "hash_ids": [0], "timestamp": -5}, "timestamp must be a finite number >= 0"),
])
def test_mooncake_bad_records(tmp_path, record, words):
    path = write_jsonl(tmp_path / "m.jsonl", [{"input_length": 1, "hash_ids": [0]}, record])
    err = bad_input(path, "mooncake")
    assert str(err).startswith(f"{path}:2: ")
    assert words in str(err)


# ------------------------------------------------------------------------------------------------ sharegpt

CONVERSATION = {"id": "c1", "conversations": [
    {"from": "human", "value": "Hi"},
    {"from": "gpt", "value": "Hello! How can I help?"},
    {"from": "human", "value": "Tell me a joke."},
    {"from": "gpt", "value": "Why did the chicken cross the road?"},
    {"from": "human", "value": "Why?"},
]}


def test_sharegpt_one_request_per_assistant_turn(tmp_path, tok):
    path = write_json(tmp_path / "s.json", [CONVERSATION, {"conversations": [{"from": "gpt", "value": "x"}]}])
    first, second, third = read_trace(path)
    turns = CONVERSATION["conversations"]
    assert first.token_ids.tolist() == tok.encode_chat([{"role": "user", "content": "Hi"}]).tolist()
    assert second.token_ids[:len(first.token_ids)].tolist() == first.token_ids.tolist()
    history = [{"role": "user" if t["from"] == "human" else "assistant", "content": t["value"]} for t in turns[:3]]
    assert second.token_ids.tolist() == tok.encode_chat(history).tolist()
    assert first.output_length == len(tok.encode("Hello! How can I help?"))
    assert second.output_length == len(tok.encode("Why did the chicken cross the road?"))
    assert (first.id, second.id, first.session_id) == ("c1:1", "c1:2", "c1")
    assert first.source == f"{path}:1"
    assert (third.id, third.session_id, third.source) == ("s.json#2:1", "s.json#2", f"{path}:2")
    assert third.token_ids.tolist() == tok.generation_prompt.tolist()


def test_sharegpt_tools_system_and_function_roles(tmp_path, tok):
    record = {"conversation_id": 9, "system": "Sys.", "tools": '[{"name": "f"}]', "conversations": [
        {"from": "human", "value": "Use f."},
        {"from": "function_call", "value": '{"name": "f", "arguments": {}}'},
        {"from": "observation", "value": '{"ok": true}'},
        {"from": "gpt", "value": "Done."},
    ]}
    call, answer = read_trace(write_json(tmp_path / "tools.json", record))
    head = [{"role": "system", "content": "Sys."},
            {"role": "system", "content": 'Tools available:\n[{"name": "f"}]'},
            {"role": "user", "content": "Use f."}]
    assert call.token_ids.tolist() == tok.encode_chat(head).tolist()
    rest = [{"role": "assistant", "content": '{"name": "f", "arguments": {}}'},
            {"role": "tool", "content": '{"ok": true}'}]
    assert answer.token_ids.tolist() == tok.encode_chat(head + rest).tolist()
    assert call.session_id == "9"
    # "[]" tools add nothing
    plain, = read_trace(write_json(tmp_path / "no_tools.json",
                                   {"tools": "[]", "conversations": CONVERSATION["conversations"][:2]}))
    assert plain.token_ids.tolist() == tok.encode_chat([{"role": "user", "content": "Hi"}]).tolist()


def test_sharegpt_jsonl_and_single_object(tmp_path):
    jsonl = write_jsonl(tmp_path / "s.jsonl", [CONVERSATION, CONVERSATION])
    assert [r.source.rsplit(":", 1)[1] for r in read_trace(jsonl)] == ["1", "1", "2", "2"]
    assert len(list(read_trace(write_json(tmp_path / "one.json", CONVERSATION)))) == 2


def test_sharegpt_unknown_speaker(tmp_path):
    bad = {"conversations": [{"from": "human", "value": "a"}, {"from": "robot", "value": "b"}]}
    err = bad_input(write_json(tmp_path / "s.json", [CONVERSATION, bad]))
    assert str(err).startswith(f"{tmp_path / 's.json'}:2: conversations[1].from = 'robot' is not one of human")


def test_sharegpt_content_parts_read_as_native_messages_read_them(tmp_path, tok):
    parts = [{"type": "text", "text": "Look at"}, {"type": "image_url", "image_url": {"url": "u"}},
             {"type": "text", "text": "this."}]
    answer = [{"type": "text", "text": "A cat."}]
    record = {"id": "p", "conversations": [{"from": "human", "value": parts}, {"from": "gpt", "value": answer},
                                           {"from": "human", "value": "And?"}, {"from": "gpt", "value": "No."}]}
    first, second = read_trace(write_json(tmp_path / "parts.json", [record]))
    native = write_jsonl(tmp_path / "n.jsonl", [
        {"messages": [{"role": "user", "content": parts}]},
        {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": answer},
                      {"role": "user", "content": "And?"}]}])
    assert [r.token_ids.tolist() for r in (first, second)] == [r.token_ids.tolist() for r in read_trace(native)]
    assert first.output_length == len(tok.encode("A cat."))
    bad = {"conversations": [{"from": "human", "value": [7]}, {"from": "gpt", "value": "x"}]}
    err = bad_input(write_json(tmp_path / "bad.json", [record, bad]))
    assert str(err).startswith(f"{tmp_path / 'bad.json'}:2: conversations[0].value: a content part must be an object")


# ------------------------------------------------------------------------------------------------ swe-agent

def traj(history: list) -> dict:
    return {"environment": "swe_main", "trajectory": [], "history": history, "info": {}}


def test_swe_agent_one_request_per_assistant_message(tmp_path, tok):
    calls = [{"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]
    history = [
        {"role": "system", "content": "You are an agent.", "agent": "main"},
        {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}], "agent": "main"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": calls, "agent": "main"},
        {"role": "tool", "content": "a.py", "tool_call_ids": ["call_1"], "agent": "main"},
        {"role": "assistant", "content": "submit", "agent": "main"},
    ]
    path = write_json(tmp_path / "run-1.traj", traj(history))
    a, b = read_trace(path)
    assert a.token_ids.tolist() == tok.encode_chat(history[:2]).tolist()
    assert b.token_ids.tolist() == tok.encode_chat(history[:4]).tolist()
    assert b.token_ids[:len(a.token_ids)].tolist() == a.token_ids.tolist()
    assert a.output_length == len(tok.encode('Let me look.\n[{"function":{"arguments":"{}","name":"ls"},'
                                             '"id":"call_1","type":"function"}]'))
    assert (a.id, b.id, a.session_id) == ("run-1:1", "run-1:2", "run-1")
    assert (a.source, b.source) == (f"{path}:3", f"{path}:5")


def test_swe_agent_demo_messages_are_context_and_agents_are_separate(tmp_path, tok):
    history = [
        {"role": "system", "content": "S", "agent": "primary"},
        {"role": "assistant", "content": "demo answer", "agent": "primary", "is_demo": True},
        {"role": "user", "content": "Q", "agent": "primary"},
        {"role": "user", "content": "sub task", "agent": "sub"},
        {"role": "assistant", "content": "sub answer", "agent": "sub"},
        {"role": "assistant", "content": "main answer", "agent": "primary"},
    ]
    sub, main = read_trace(write_json(tmp_path / "x.traj", traj(history)))
    assert sub.token_ids.tolist() == tok.encode_chat([history[3]]).tolist()
    assert main.token_ids.tolist() == tok.encode_chat(history[:3]).tolist()


def test_swe_agent_bad_history(tmp_path):
    err = bad_input(write_json(tmp_path / "x.traj", traj([{"role": "user", "content": "a"}, {"content": "b"}])))
    assert str(err).startswith(f"{tmp_path / 'x.traj'}:2: history[1]: ")
    err = bad_input(write_json(tmp_path / "y.traj", {"trajectory": []}))
    assert str(err) == (f"{tmp_path / 'y.traj'}: a swe-agent trajectory must be a JSON object with a 'history' "
                        "list of messages")


# ---------------------------------------------------------------------------------------- gzip, detection, errors

def test_gzip_by_magic_bytes_and_suffix(tmp_path):
    rows = [{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0]}]
    plain = list(read_trace(write_jsonl(tmp_path / "m.jsonl", rows)))
    for name in ("m.jsonl.gz", "m_compressed.jsonl"):
        path = write_jsonl(tmp_path / name, rows, compress=True)
        assert detect_format(path) == "mooncake"
        got = list(read_trace(path))
        assert [r.token_ids.tolist() for r in got] == [r.token_ids.tolist() for r in plain]
    traj_gz = write_json(tmp_path / "run.traj.gz", traj([{"role": "user", "content": "a"},
                                                          {"role": "assistant", "content": "b"}]), compress=True)
    assert detect_format(traj_gz) == "swe-agent"
    assert [r.session_id for r in read_trace(traj_gz)] == ["run"]


def test_detect_format_each(tmp_path):
    assert detect_format(write_jsonl(tmp_path / "n1.jsonl", ["", {"prompt": "a"}])) == "native"
    assert detect_format(write_jsonl(tmp_path / "n2.jsonl", [{"messages": []}])) == "native"
    assert detect_format(write_jsonl(tmp_path / "n3.jsonl", [{"token_ids": [1]}])) == "native"
    assert detect_format(write_jsonl(tmp_path / "m.jsonl", [{"input_length": 1, "hash_ids": [0]}])) == "mooncake"
    assert detect_format(write_json(tmp_path / "s.json", [CONVERSATION])) == "sharegpt"
    assert detect_format(write_json(tmp_path / "s1.json", CONVERSATION)) == "sharegpt"        # pretty object
    assert detect_format(write_jsonl(tmp_path / "s2.jsonl", [CONVERSATION])) == "sharegpt"    # JSONL
    assert detect_format(write_json(tmp_path / "t.json", traj([]))) == "swe-agent"             # no .traj suffix
    assert detect_format(tmp_path / "t.json") == "swe-agent"
    (tmp_path / "any.traj").write_text("{}")
    assert detect_format(tmp_path / "any.traj") == "swe-agent"


def test_undetectable_and_empty_files(tmp_path):
    path = write_jsonl(tmp_path / "u.jsonl", [{"text": "a"}])
    with pytest.raises(BadInputError, match=r"u\.jsonl:1: cannot detect the trace format .*\(text\)"):
        read_trace(path)
    (tmp_path / "empty.jsonl").write_text("\n  \n")
    with pytest.raises(BadInputError, match="empty file"):
        read_trace(tmp_path / "empty.jsonl")


def test_unknown_format_name(tmp_path):
    path = write_jsonl(tmp_path / "n.jsonl", [{"prompt": "a"}])
    with pytest.raises(BadInputError) as info:
        read_trace(path, "vllm")
    assert str(info.value) == ("unknown trace format 'vllm'; valid formats: auto, native, mooncake, sharegpt, "
                               "swe-agent, bailian, hash-ids, claude-code, ragpulse, openai-batch, gateway, lines")
    assert set(FORMATS) == {"native", "mooncake", "sharegpt", "swe-agent", "bailian", "hash-ids", "claude-code",
                            "ragpulse", "openai-batch", "gateway", "lines"}


def test_missing_file(tmp_path):
    path = tmp_path / "nope.jsonl"
    with pytest.raises(BadInputError) as info:
        read_trace(path)
    assert str(info.value) == f"{path}: file not found"
    assert info.value.line is None


def test_not_utf8_and_broken_gzip(tmp_path):
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n')
    assert str(bad_input(path, "native")).startswith(f"{path}:")
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(b'{"prompt": "a"}\n' * 100)[:-30])
    assert str(bad_input(broken, "native")).startswith(f"{broken}:")


# ------------------------------------------------------------------------------------------------ the real samples

# (file, format, requests, total prompt tokens), counted once with this reader and cl100k_base; see SOURCES.md.
SAMPLE_FILES = [
    ("mooncake_conversation_head1000.jsonl.gz", "mooncake", 1000, 13_732_944),
    ("sharegpt_multiturn.json", "sharegpt", 6, 4_324),
    ("sharegpt_single_turn.json", "sharegpt", 8, 8_221),
    ("glaive_toolcall_head30.json", "sharegpt", 101, 31_894),
    ("swe-agent_pydicom__pydicom-1458.traj", "swe-agent", 12, 124_352),
    ("swe-agent__test-repo-i1.traj", "swe-agent", 5, 53_236),
    ("swe-agent_6e44b9__sweagenttestrepo-1c2844.traj", "swe-agent", 4, 6_035),
    ("chat_shared_system.jsonl", "native", 24, 13_573),
    ("no_reuse.jsonl", "native", 10, 1_514),
    ("tokens_small.jsonl", "native", 6, 78),
    ("bailian_handmade.jsonl", "bailian", 12, 2_920),
    ("openai_batch_handmade.jsonl", "openai-batch", 6, 1_296),
    ("ragpulse_head60/0_trace.jsonl", "ragpulse", 60, 183_037),  # its component files beside it
    ("aiperf_agentic_code_3x5.jsonl", "mooncake", 15, 804_933),
    ("dynamo_exgentic_handmade.jsonl", "mooncake", 9, 46_350),
    ("customer_service_handmade.parquet", "mooncake", 5, 1_273),
]


def test_every_sample_file_is_listed():
    on_disk = {p.name for p in SAMPLES.iterdir() if p.suffix not in (".md", ".py")}
    assert on_disk == {name.split("/")[0] for name, *_ in SAMPLE_FILES}


@pytest.mark.parametrize("name, fmt, count, tokens", SAMPLE_FILES)
def test_sample_traces_parse(name, fmt, count, tokens):
    path = SAMPLES / name
    assert detect_format(path) == fmt
    reqs = list(read_trace(path))
    assert len(reqs) == count
    assert sum(len(r.token_ids) for r in reqs) == tokens
    assert len({r.id for r in reqs}) == count


def test_swe_agent_samples_match_recorded_output_tokens():
    # info.model_stats.tokens_received of the GPT-4 runs equals our cl100k count of the assistant messages
    assert sum(r.output_length for r in read_trace(SAMPLES / "swe-agent_pydicom__pydicom-1458.traj")) == 1369
    assert sum(r.output_length for r in read_trace(SAMPLES / "swe-agent__test-repo-i1.traj")) == 326


def test_tokens_small_is_hand_checkable():
    t1, t2, t3, t4, t5, t6 = read_trace(SAMPLES / "tokens_small.jsonl")
    assert t1.token_ids.tolist() == list(range(1, 17))
    assert t2.token_ids[:8].tolist() == t1.token_ids[:8].tolist() and t2.token_ids[8] != t1.token_ids[8]
    assert t3.token_ids[:16].tolist() == t1.token_ids.tolist() and len(t3.token_ids) == 20
    assert (t4.token_ids.tolist(), t4.cache_salt) == (t1.token_ids.tolist(), "other")
    assert len(t5.token_ids) == 0 and len(t6.token_ids) == 10


def test_chat_sample_turns_extend_each_other():
    by_session: dict[str, list] = {}
    for r in read_trace(SAMPLES / "chat_shared_system.jsonl"):
        by_session.setdefault(r.session_id, []).append(r)
    assert {s: len(v) for s, v in by_session.items()} == {s: 4 for s in
                                                          ("acme-1", "acme-2", "globex-1", "globex-2",
                                                           "public-1", "public-2")}
    for turns in by_session.values():
        for prev, nxt in zip(turns[:-1], turns[1:], strict=True):
            assert nxt.token_ids[:len(prev.token_ids)].tolist() == prev.token_ids.tolist()
    assert {r.cache_salt for r in by_session["acme-1"]} == {"acme"}
    assert {r.cache_salt for r in by_session["public-1"]} == {""}


def test_a_line_cut_short_names_its_column_and_a_request_prints_in_one_line(tmp_path):
    cut = tmp_path / "cut.jsonl"
    cut.write_text('{"token_ids": [1, 2]}\n{"token_ids":[1,2,3,\n')
    with pytest.raises(BadInputError, match=r"cut.jsonl:2: invalid JSON: Expecting value \(column 21\)"):
        list(read_trace(cut))
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps({"token_ids": list(range(100)), "id": "r1"}) + "\n")
    (first,) = list(read_trace(ok))
    assert repr(first) == ("Request('r1', 100 tokens [0, 1, 2, 3, ...], timestamp=None, session_id=None, "
                           f"cache_salt='', source='{tmp_path / 'ok.jsonl'}:1')")


def test_read_trace_on_a_directory_says_what_to_use(tmp_path):
    with pytest.raises(BadInputError, match="a directory: a reader reads one trace file"):
        read_trace(tmp_path)


def test_a_mooncake_trace_reads_the_same_with_or_without_hash_id_options(tmp_path):
    """One reader for every hash-id format: a declared option that changes nothing (the format's own unit) gives
    the same requests, large ids (folded from 2**54) and a record's cache_salt included."""
    path = write_jsonl(tmp_path / "m.jsonl", [
        {"timestamp": 5, "input_length": 600, "hash_ids": [1, 2**54 + 1], "cache_salt": "tenant-a"},
        {"timestamp": 9, "input_length": 512, "hash_ids": [2**64 - 1], "session_id": "s"},
    ])
    plain = list(read_trace(path))
    declared = list(read_trace(path, TraceFormat("mooncake", timestamp_unit="ms")))
    assert [(r.cache_salt, r.timestamp, r.session_id) for r in plain] == [("tenant-a", 0.005, None), ("", 0.009, "s")]
    for a, b in zip(plain, declared, strict=True):
        assert (a.id, a.cache_salt, a.timestamp, a.session_id) == (b.id, b.cache_salt, b.timestamp, b.session_id)
        assert np.array_equal(a.token_ids, b.token_ids)
    assert np.array_equal(plain[0].token_ids, mooncake_token_ids([1, 2**54 + 1], 600))
