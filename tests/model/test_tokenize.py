"""kvcli.model.tokenize: offline cl100k_base, ordinary-text encoding, and the chat template's prefix guarantees."""
from __future__ import annotations

import json

import numpy as np
import pytest

from kvcli.errors import BadInputError
from kvcli.model.tokenize import encode_chat, get_tokenizer, render_chat
from kvcli.model.tokenizer_base import message_text

# Token ids below were read off tiktoken's cl100k_base once and are fixed facts of that vocabulary.
USER_HEADER = [27, 91, 318, 5011, 91, 29, 882, 198]            # "<|im_start|>user\n"
SYSTEM_HEADER = [27, 91, 318, 5011, 91, 29, 9125, 198]         # "<|im_start|>system\n"
GENERATION_PROMPT = [27, 91, 318, 5011, 91, 29, 78191, 198]    # "<|im_start|>assistant\n"
FOOTER = [27, 91, 318, 6345, 91, 397]                          # "<|im_end|>\n"
YOU_ARE_TERSE = [2675, 527, 51637, 13]                         # "You are terse."
SYSTEM = {"role": "system", "content": "You are terse."}


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("cl100k_base")


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


def test_tokenizer_is_offline_cl100k_and_cached(tok):
    assert tok.name == "cl100k_base"
    assert tok.n_vocab == 100_277
    assert get_tokenizer("cl100k_base") is tok
    assert get_tokenizer(tok) is tok


def test_special_token_text_is_plain_text(tok):
    ids = tok.encode("Summarize: <|endoftext|> done")
    assert ids.dtype == np.dtype("<u4") and ids.ndim == 1
    assert ids.tolist() == [9370, 5730, 553, 25, 83739, 8862, 728, 428, 91, 29, 2884]
    assert 100257 not in ids.tolist()  # the real <|endoftext|> id


def test_empty_text_is_empty_array(tok):
    ids = tok.encode("")
    assert ids.shape == (0,) and ids.dtype == np.dtype("<u4")


def test_unknown_tokenizer_is_one_line_bad_input():
    with pytest.raises(BadInputError) as info:
        get_tokenizer("no-such-encoding")
    assert str(info.value).startswith("unknown tokenizer 'no-such-encoding'; tiktoken knows gpt2, ")
    assert "\n" not in str(info.value)


def test_message_pieces_are_encoded_separately(tok):
    assert tok.header("user").tolist() == USER_HEADER
    assert tok.generation_prompt.tolist() == GENERATION_PROMPT
    assert tok.footer.tolist() == FOOTER
    assert tok.encode_message(SYSTEM).tolist() == SYSTEM_HEADER + YOU_ARE_TERSE + FOOTER


def test_encode_chat_without_and_with_generation_prompt(tok):
    assert tok.encode_chat([SYSTEM], add_generation_prompt=False).tolist() == SYSTEM_HEADER + YOU_ARE_TERSE + FOOTER
    assert tok.encode_chat([SYSTEM]).tolist() == SYSTEM_HEADER + YOU_ARE_TERSE + FOOTER + GENERATION_PROMPT
    assert tok.encode_chat([], add_generation_prompt=False).shape == (0,)
    assert encode_chat([SYSTEM]).tolist() == tok.encode_chat([SYSTEM]).tolist()


def test_same_system_message_gives_exactly_its_ids_as_shared_prefix(tok):
    a = tok.encode_chat([SYSTEM, {"role": "user", "content": "Hi"}])        # "Hi" = [13347]
    b = tok.encode_chat([SYSTEM, {"role": "user", "content": "Hello"}])     # "Hello" = [9906]
    system_ids = SYSTEM_HEADER + YOU_ARE_TERSE + FOOTER
    assert a[:len(system_ids)].tolist() == system_ids
    assert b[:len(system_ids)].tolist() == system_ids
    # the user header is shared too, then the contents differ at their first token
    assert common_prefix(a, b) == len(system_ids) + len(USER_HEADER)
    c = tok.encode_chat([SYSTEM, {"role": "tool", "content": "Hi"}])
    assert common_prefix(a, c) == len(system_ids) + 6  # "<|im_start|>" is 6 tokens, then the role differs


def test_next_turn_prompt_starts_with_previous_turn_prompt(tok):
    # contents chosen so that one BPE pass over the joined text would merge across message boundaries
    turn1 = [SYSTEM, {"role": "user", "content": "What is 2+2?\n"}]
    turn2 = turn1 + [{"role": "assistant", "content": "\n4\n\n"}, {"role": "user", "content": "\nAnd 3+3?"}]
    p1, p2 = tok.encode_chat(turn1), tok.encode_chat(turn2)
    assert p2[:len(p1)].tolist() == p1.tolist()
    assert len(p2) > len(p1)


def test_generation_prompt_is_prefix_of_assistant_message(tok):
    ids = tok.encode_message({"role": "assistant", "content": "\nSure."})
    assert ids[:len(GENERATION_PROMPT)].tolist() == GENERATION_PROMPT
    assert ids[-len(FOOTER):].tolist() == FOOTER


def test_content_parts_and_tool_calls_render_as_text():
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"},
                                         {"type": "image_url", "image_url": {"url": "x"}}]}
    assert message_text(parts) == 'a\nb\n{"image_url":{"url":"x"},"type":"image_url"}'
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert message_text({"role": "assistant", "content": None, "tool_calls": calls}) == json.dumps(
        calls, sort_keys=True, separators=(",", ":"))
    assert message_text({"role": "assistant", "content": "ok", "tool_calls": calls}).startswith("ok\n[{")


def test_render_chat_string():
    messages = [SYSTEM, {"role": "user", "content": "Hi"}]
    assert render_chat(messages) == ("<|im_start|>system\nYou are terse.<|im_end|>\n"
                                     "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert render_chat(messages, add_generation_prompt=False).endswith("Hi<|im_end|>\n")


@pytest.mark.parametrize("messages", [
    [{"content": "no role"}],
    [{"role": "user", "content": 5}],
    ["just a string"],
    {"role": "user", "content": "not a list"},
])
def test_bad_messages_are_bad_input(tok, messages):
    with pytest.raises(BadInputError):
        tok.encode_chat(messages)
