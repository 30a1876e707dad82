"""--tokenizer PATH / the checkpoint's own tokenizer: kvcli.model.hf_tokenizer and the trace readers with it.

The reference for every rendering is the tokenizer's own ``apply_chat_template(messages,
add_generation_prompt=True, tokenize=True)``, loaded independently with ``AutoTokenizer``: what a serving engine
prefills.
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcli.errors import BadInputError
from kvcli.model.hf_offline import transformers
from kvcli.model.hf_tokenizer import HFTokenizer, engine_message
from kvcli.model.tokenize import get_tokenizer
from kvcli.traces.detect import read_trace

SYSTEM = {"role": "system", "content": "You are terse."}
REFUSING_TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' and loop.previtem is defined and "
                     "loop.previtem['role'] == 'user' %}{{ raise_exception('roles must alternate') }}{% endif %}"
                     "{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}")


@pytest.fixture(scope="module")
def tok(tiny_checkpoint) -> HFTokenizer:
    return get_tokenizer(tiny_checkpoint)


@pytest.fixture(scope="module")
def reference(tiny_checkpoint):
    return transformers().AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)


def rendered(reference, messages) -> list[int]:
    return list(reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))


def tokenizer_copy(tiny_checkpoint, tmp_path, template: str | None) -> str:
    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{tiny_checkpoint}/{name}", folder / name)
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    return str(folder)


def test_identity_is_the_vocabulary_not_the_folder(tiny_checkpoint, tok, reference, tmp_path):
    assert isinstance(tok, HFTokenizer) and get_tokenizer(tiny_checkpoint) is tok
    assert tok.name.startswith("hf-tokenizer@") and len(tok.name) == len("hf-tokenizer@") + 16
    assert tok.n_vocab == len(reference)
    other = get_tokenizer(tokenizer_copy(tiny_checkpoint, tmp_path, None))
    assert other is not tok and other.name == tok.name  # same vocabulary elsewhere: same chunk hashes
    assert get_tokenizer("cl100k_base").name == "cl100k_base"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant", "tool"]),
    "content": st.lists(st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
        ["\n", " ", "<|eot_id|>", "<|begin_of_text|>", "def f():\n    return 1"]), max_size=4).map("".join)}),
    min_size=1, max_size=5))
def test_messages_render_as_the_tokenizers_own_template(tok, reference, messages):
    ids = tok.encode_chat(messages)
    assert ids.dtype == np.dtype("<u4")
    assert ids.tolist() == rendered(reference, messages)


def test_no_messages_render_to_no_tokens(tok):
    ids = tok.encode_chat([])
    assert ids.shape == (0,) and ids.dtype == np.dtype("<u4")


def test_prompt_text_gets_the_tokenizers_special_tokens(tok, reference):
    text = "Prefix caching reuses the KV cache."
    assert tok.encode_prompt(text).tolist() == reference(text)["input_ids"]
    assert tok.encode_prompt(text).tolist() == [reference.bos_token_id] + tok.encode(text).tolist()
    assert reference.bos_token_id not in tok.encode(text).tolist()


def test_native_trace_uses_the_template_and_completion_prompts(tmp_path, tiny_checkpoint, tok, reference):
    messages = [SYSTEM, {"role": "user", "content": "What is a KV cache?"}]
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"messages": messages}) + "\n" + json.dumps({"prompt": "Hello world"}) + "\n")
    chat, text = list(read_trace(trace, tokenizer=tiny_checkpoint))
    assert chat.token_ids.tolist() == rendered(reference, messages)
    assert text.token_ids.tolist() == reference("Hello world")["input_ids"]


def test_sharegpt_turns_render_their_whole_prefix(tmp_path, tok, reference):
    turns = [("human", "Hi there"), ("gpt", "  Hello! How can I help?  "), ("human", "Explain prefix caching."),
             ("gpt", "It reuses KV."), ("human", "Thanks"), ("gpt", "You are welcome.")]
    trace = tmp_path / "s.json"
    trace.write_text(json.dumps([{"id": "c1", "system": "You are terse.",
                                  "conversations": [{"from": f, "value": v} for f, v in turns]}]))
    requests = list(read_trace(trace, tokenizer=tok))
    messages = [SYSTEM] + [{"role": "user" if f == "human" else "assistant", "content": v} for f, v in turns]
    assert [r.id for r in requests] == ["c1:1", "c1:2", "c1:3"]
    for k, request in zip((2, 4, 6), requests):
        assert request.token_ids.tolist() == rendered(reference, messages[:k])
        assert request.output_length == len(reference.encode(messages[k]["content"], add_special_tokens=False))
    # This Llama-3-style template renders an answered turn as its generation prompt plus the answer, so each
    # turn's prompt starts with the previous one: a template property, not something kvcli forces.
    for a, b in zip(requests, requests[1:]):
        assert b.token_ids[:len(a.token_ids)].tolist() == a.token_ids.tolist()


def test_swe_agent_history_per_agent_and_demos(tmp_path, tok, reference):
    history = [
        {"role": "system", "content": "You are an agent.", "agent": "main"},
        {"role": "user", "content": "demo task", "agent": "main", "is_demo": True},
        {"role": "assistant", "content": "demo answer", "agent": "main", "is_demo": True},
        {"role": "user", "content": "Fix the bug.", "agent": "main", "message_type": "observation"},
        {"role": "assistant", "content": "ls", "agent": "main", "thought": "look", "action": "ls"},
    ]
    trace = tmp_path / "run.traj"
    trace.write_text(json.dumps({"history": history}))
    (call,) = list(read_trace(trace, tokenizer=tok))
    engine = [{"role": m["role"], "content": m["content"]} for m in history[:4]]
    assert call.token_ids.tolist() == rendered(reference, engine)
    assert call.output_length == len(reference.encode("ls", add_special_tokens=False))


def test_a_template_that_refuses_is_a_located_bad_input(tmp_path, tiny_checkpoint):
    folder = tokenizer_copy(tiny_checkpoint, tmp_path, REFUSING_TEMPLATE)
    tok = get_tokenizer(folder)
    assert tok.encode_chat([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]).size > 0
    trace = tmp_path / "s.json"
    trace.write_text(json.dumps([{"id": "c1", "conversations": [
        {"from": "human", "value": "a"}, {"from": "human", "value": "b"}, {"from": "gpt", "value": "c"}]}]))
    with pytest.raises(BadInputError) as info:
        list(read_trace(trace, tokenizer=tok))
    message = str(info.value)
    assert message.startswith(f"{trace}:1: message 3: the chat template of {folder} refuses these messages: ")
    assert "roles must alternate" in message and "\n" not in message


def test_a_tokenizer_without_template_cannot_render_messages(tmp_path, tiny_checkpoint):
    tok = get_tokenizer(tokenizer_copy(tiny_checkpoint, tmp_path, None))
    assert tok.chat_template is None
    assert tok.encode("plain text still works").size > 0
    with pytest.raises(BadInputError, match="has no chat template"):
        tok.encode_chat([SYSTEM])


def test_engine_message_normalization_follows_vllm():
    message = {"role": "assistant", "agent": "main", "content": [{"type": "text", "text": "a"}, "b"],
               "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
                              {"type": "function", "function": {"name": "g", "arguments": "not json"}}]}
    out = engine_message(message)
    assert out == {"role": "assistant", "content": "a\nb",
                   "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
                                  {"type": "function", "function": {"name": "g", "arguments": {}}}]}
    assert message["tool_calls"][0]["function"]["arguments"] == "{\"x\": 1}"  # the input is not modified
    assert engine_message({"role": "assistant", "content": "x", "tool_calls": []}) == {"role": "assistant",
                                                                                       "content": "x"}


@pytest.mark.parametrize("setup, message", [(None, "no such tokenizer folder"),
                                            ("empty", "no tokenizer in this folder")])
def test_unusable_tokenizer_folders_are_one_line_bad_input(tmp_path, setup, message):
    folder = tmp_path / "nothing"
    if setup:
        folder.mkdir()
    with pytest.raises(BadInputError, match=message) as info:
        get_tokenizer(str(folder))
    assert "\n" not in str(info.value)
