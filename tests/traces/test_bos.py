"""A double BOS (kvcli.traces.bos) and the choice of special tokens for text prompts: ``--add-special-tokens/
--no-special-tokens`` (TraceFormat.add_special_tokens) and a record's own ``add_special_tokens``.

The tokenizer is the tiny checkpoint's own (kvcli.model.hf_tiny: byte-level BPE, ``<|begin_of_text|>`` as BOS, a
Llama-3-style chat template that starts with the BOS). The text prompt is that template rendered for the messages
M by transformers itself, so it already holds M's BOS.
"""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.model.hf_offline import transformers
from kvcli.model.tokenize import get_tokenizer
from kvcli.traces.bos import trace_bos_note
from kvcli.traces.detect import read_trace
from kvcli.traces.hashids import TraceFormat

M = [{"role": "system", "content": "You are a helpful assistant. Answer briefly and accurately."},
     {"role": "user", "content": "What does a KV cache store?"}]


@pytest.fixture(scope="module")
def rendered(tiny_checkpoint):
    """``(the template rendered for M as text, M's token ids under the template, the BOS id)``."""
    reference = transformers().AutoTokenizer.from_pretrained(tiny_checkpoint, local_files_only=True)
    text = reference.apply_chat_template(M, add_generation_prompt=True, tokenize=False)
    chat = get_tokenizer(tiny_checkpoint).encode_chat(M)
    bos = reference.convert_tokens_to_ids("<|begin_of_text|>")
    assert text.startswith("<|begin_of_text|>") and chat[0] == bos and chat[1] != bos
    return text, chat, bos


def _trace(tmp_path, records) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_the_tokenizer_adds_a_second_bos_to_a_rendered_template_unless_told_not_to(tiny_checkpoint, rendered):
    text, chat, bos = rendered
    tok = get_tokenizer(tiny_checkpoint)
    assert tok.prompt_bos_id == bos and get_tokenizer("cl100k_base").prompt_bos_id is None
    assert tok.encode_prompt(text).tolist() == [bos] + chat.tolist()  # two BOS
    assert tok.encode_prompt(text, add_special_tokens=False).tolist() == chat.tolist()
    plain = tok.with_special_tokens(False)
    assert plain.name == tok.name and plain.encode_prompt(text).tolist() == chat.tolist()
    assert plain.encode_prompt(text, add_special_tokens=True).tolist() == [bos] + chat.tolist()


def test_the_flag_and_the_record_choose(tmp_path, tiny_checkpoint, rendered):
    """Records: M as messages; the text; the text with add_special_tokens false; the text with it true."""
    text, chat, bos = rendered
    path = _trace(tmp_path, [{"messages": M}, {"prompt": text}, {"prompt": text, "add_special_tokens": False},
                             {"prompt": text, "add_special_tokens": True}])
    default = [r.token_ids.tolist() for r in read_trace(path, "auto", tiny_checkpoint)]
    assert default == [chat.tolist(), [bos] + chat.tolist(), chat.tolist(), [bos] + chat.tolist()]
    off = [r.token_ids.tolist() for r in read_trace(path, TraceFormat(add_special_tokens=False), tiny_checkpoint)]
    assert off == [chat.tolist(), chat.tolist(), chat.tolist(), [bos] + chat.tolist()]  # the record's true wins
    note = trace_bos_note(path, "auto", tiny_checkpoint)
    assert note.startswith(f"double BOS: 2 prompts start with two '<|begin_of_text|>' (id {bos}; first {path}:2)")
    assert "--no-special-tokens" in note
    assert trace_bos_note(path, TraceFormat(add_special_tokens=False), tiny_checkpoint).startswith(
        "double BOS: 1 prompt start")
    assert trace_bos_note(_trace(tmp_path, [{"messages": M}]), "auto", tiny_checkpoint) is None
    assert trace_bos_note(path, "auto", "cl100k_base") is None  # tiktoken adds no BOS: nothing is read


def test_a_record_flag_that_is_not_a_bool_names_its_line(tmp_path, tiny_checkpoint):
    path = _trace(tmp_path, [{"prompt": "hi"}, {"prompt": "hi", "add_special_tokens": "no"}])
    with pytest.raises(BadInputError, match=r"t\.jsonl:2: add_special_tokens must be true or false, not .no."):
        list(read_trace(path, "auto", tiny_checkpoint))


@pytest.mark.parametrize("flag", ["--add-special-tokens", "--no-special-tokens"])
def test_replay_hits_and_notes(tmp_path, redis_url, server_kind, tiny_checkpoint, rendered, flag):
    """R1 is M as messages (n tokens), R2 the text. By default R2 = [BOS] + R1: only its chunk 0 (the first BOS)
    matches R1 at chunk size 1, nothing at 4, and the note names it. Without special tokens R2 = R1: every chunk
    of size 1 hits and the last token is computed (n - 1); at 4, the full chunks (capped at n - 1).

    The flag that is not the default replays once in worker processes (the CLI's default --jobs here), each
    tokenizing the text itself: the flag must reach them. The other runs replay in this process (--jobs 1; each
    worker imports transformers for the tokenizer, seconds), which gives the workers' report (test_parallel)."""
    text, chat, _ = rendered
    n = len(chat)
    path = _trace(tmp_path, [{"messages": M}, {"prompt": text}])
    jobs = [] if (flag, server_kind) == ("--no-special-tokens", "single") else ["--jobs", "1"]
    out = CliRunner().invoke(app, ["replay", path, "--model", tiny_checkpoint, "--chunk-sizes", "1,4", "--payload",
                                   "accounted", "--measure", "0", "--prefill-tps", "1000", "--redis-url", redis_url,
                                   "--json", flag, *jobs])
    assert out.exit_code == 0, out.output
    (trace,) = json.loads(out.stdout)["traces"]
    hits = {row["chunk_size"]: row["hit_tokens"] for row in trace["per_chunk_size"]}
    double = [note for note in trace["notes"] if note.startswith("double BOS: 1 prompt start")]
    if flag == "--add-special-tokens":
        assert (hits, len(double)) == ({1: 1, 4: 0}, 1)
    else:
        assert (hits, len(double)) == ({1: n - 1, 4: min(4 * (n // 4), n - 1)}, 0)


@pytest.mark.parametrize("flag", ["--add-special-tokens", "--no-special-tokens"])
def test_stats_notes_a_double_bos(tmp_path, tiny_checkpoint, rendered, flag):
    """The same two records: stats' trace note names the text prompt's two BOS by default (its line, 2), and is
    absent without special tokens."""
    text, _, bos = rendered
    path = _trace(tmp_path, [{"messages": M}, {"prompt": text}])
    out = CliRunner().invoke(app, ["stats", path, "--tokenizer", tiny_checkpoint, "--json", flag])
    assert out.exit_code == 0, out.output
    (trace,) = json.loads(out.stdout)["traces"]
    if flag == "--add-special-tokens":
        assert trace["note"].startswith(f"double BOS: 1 prompt starts with two '<|begin_of_text|>' (id {bos}; "
                                        f"first {path}:2)")
    else:
        assert trace["note"] is None


@pytest.mark.parametrize("flag", ["--add-special-tokens", "--no-special-tokens"])
def test_explain_notes_a_double_bos(tmp_path, tiny_checkpoint, rendered, flag):
    text, _, bos = rendered
    path = _trace(tmp_path, [{"messages": M}, {"prompt": text}])
    out = CliRunner().invoke(app, ["explain", path, "--model", tiny_checkpoint, "--chunk-size", "4", "--json",
                                   flag])
    assert out.exit_code == 0, out.output
    (trace,) = json.loads(out.stdout)["traces"]
    double = [n for n in trace["notes"] if n.startswith("double BOS: ")]
    if flag == "--add-special-tokens":
        assert len(double) == 1 and double[0].startswith(
            f"double BOS: 1 prompt starts with two '<|begin_of_text|>' (id {bos}; first {path}:2)")
    else:
        assert double == []


@pytest.mark.parametrize("flag", ["--add-special-tokens", "--no-special-tokens"])
def test_the_chunk_map_of_a_double_bos_prompt_names_the_double_bos(tmp_path, redis_url, tiny_checkpoint, rendered,
                                                                  flag):
    """warm stores M as messages (n tokens, one BOS) at chunk size 4; the map of the text prompt (line 2) by default
    reads [BOS] + M's tokens: its chunk 0 is not stored, 0 tokens reused, and the warning says why, the double BOS,
    where it guessed at another tokenizer or cache salt. Without special tokens it reads M's own tokens: every full
    chunk hits (4 * (n // 4) tokens, n - 1 at most) and there is no warning."""
    text, chat, bos = rendered
    n = len(chat)
    path = _trace(tmp_path, [{"messages": M}, {"prompt": text}])
    stored = tmp_path / "m.jsonl"
    stored.write_text(json.dumps({"messages": M}) + "\n")
    base = ["--model", tiny_checkpoint, "--chunk-size", "4", "--namespace", "bos", "--redis-url", redis_url]
    out = CliRunner().invoke(app, ["warm", str(stored), *base])
    assert out.exit_code == 0, out.output
    out = CliRunner().invoke(app, ["inspect", "--request", f"{path}:2", *base, "--json", flag])
    assert out.exit_code == 0, out.output
    (m,) = json.loads(out.stdout)["chunk_maps"]
    if flag == "--no-special-tokens":
        assert (m["hit_tokens"], m["warning"]) == (min(4 * (n // 4), n - 1), "")
        assert "warning" not in out.stderr
        return
    assert (m["hit_tokens"], m["break_index"], m["break_reason"]) == (0, 0, "missing")
    assert m["warning"].startswith(f"namespace 'bos' gave no hit at chunk size 4 although it holds model "
                                   f"{m['model_id']} there: double BOS: the prompt starts with two "
                                   f"'<|begin_of_text|>' (id {bos}): the text already holds the rendered chat "
                                   f"template's BOS and the tokenizer added another")
    assert "another tokenizer or cache salt" not in m["warning"] and "--no-special-tokens" in m["warning"]
    assert "warning: namespace 'bos' gave no hit" in out.stderr
