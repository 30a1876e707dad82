"""Bailian sessions and export follow the parent_chat_id chain over the whole file, whatever its order
(kvcli/traces/hashids.py, kvcli/traces/export.py): the hand-computed case of a turn read before the turn it
continues, and properties over random forests of chains in random order."""
from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.errors import BadInputError
from kvcli.traces.detect import read_trace
from kvcli.traces.export import BlockNumbering, export_records
from kvcli.traces.hashids import chain_link
from kvcli.traces.records import optional_id
from kvcli.traces.request import TurnLink

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def bailian(chat, parent, t, blocks, turn=None):
    record = {"chat_id": chat, "parent_chat_id": parent, "timestamp": t, "input_length": 16 * len(blocks),
              "output_length": 5, "type": "text", "hash_ids": blocks}
    if turn is not None:
        record["turn"] = turn
    return record


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# Chat 1 -> 2 -> 3 is one conversation, chat 9 another; the file holds turn 3 before turn 2.
OUT_OF_ORDER = [bailian(1, -1, 1, [1], 1), bailian(3, 2, 3, [1, 2, 3], 3), bailian(2, 1, 2, [1, 2], 2),
                bailian(9, -1, 4, [7], 1)]


def test_a_turn_before_the_turn_it_continues_is_in_its_chain_s_session(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", OUT_OF_ORDER)
    requests = list(read_trace(path))
    assert [r.session_id for r in requests] == ["1", "1", "1", "9"]  # the roots: 3 -> 2 -> 1, and 9
    assert [r.link for r in requests] == [TurnLink(None, 1), TurnLink("2", 3), TurnLink("1", 2), TurnLink(None, 1)]
    out = CliRunner().invoke(app, ["stats", str(path), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["traces"][0]["sessions"] == 2


def test_export_keeps_the_link_of_a_turn_read_before_its_parent(tmp_path):
    path = write_jsonl(tmp_path / "b.jsonl", OUT_OF_ORDER)
    records = list(export_records(read_trace(path), "bailian", BlockNumbering(b"k" * 32, 16)))
    # chat ids numbered where first named: 1 -> 0; 3 -> 1, its parent 2 -> 2 (named there); 9 -> 3
    assert [(r["chat_id"], r["parent_chat_id"], r["turn"]) for r in records] == [(0, -1, 1), (1, 2, 3), (2, 0, 2),
                                                                                 (3, -1, 1)]
    exported = write_jsonl(tmp_path / "e.jsonl", records)
    assert [r.session_id for r in read_trace(exported)] == ["0", "0", "0", "3"]


def test_the_hand_made_sample_has_four_sessions_of_three_turns(tmp_path):
    requests = list(read_trace("sample_traces/bailian_handmade.jsonl"))
    sessions: dict[str, list[int]] = {}
    for r in requests:
        assert r.link is not None and r.session_id is not None
        sessions.setdefault(r.session_id, []).append(r.link.turn or 0)
    assert sessions == {"0": [1, 2, 3], "1": [1, 2, 3], "2": [1, 2, 3], "3": [1, 2, 3]}


def test_a_parent_outside_the_file_roots_its_children_and_a_loop_is_an_error(tmp_path):
    cut = write_jsonl(tmp_path / "c.jsonl", [bailian(5, 7, 0, [1]), bailian(6, 7, 1, [1]), bailian(8, 5, 2, [1])])
    assert [r.session_id for r in read_trace(cut)] == ["7", "7", "7"]
    loop = write_jsonl(tmp_path / "l.jsonl", [bailian(1, 2, 0, [1]), bailian(2, 1, 1, [1])])
    with pytest.raises(BadInputError) as info:
        list(read_trace(loop))
    assert str(info.value) == f"{loop}:1: the parent_chat_id chain from 2 loops back to chat_id 2"
    out = CliRunner().invoke(app, ["stats", str(loop)])
    assert out.exit_code == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.output


@st.composite
def forests(draw):
    """Chats 0..n-1, each a first turn or the child of an earlier chat; the file holds them in a random order."""
    n = draw(st.integers(1, 12))
    parents = [-1] + [draw(st.sampled_from([-1, *range(i)])) for i in range(1, n)]
    order = draw(st.permutations(range(n)))
    return parents, order


def _root(parents: list[int], chat: int) -> int:
    while parents[chat] != -1:
        chat = parents[chat]
    return chat


@SETTINGS
@given(forest=forests(), seed=st.integers(0, 2**16))
def test_sessions_and_export_follow_the_chains_in_any_order(tmp_path, forest, seed):
    parents, order = forest
    ids = random.Random(seed).sample(range(1000, 100_000), len(parents))  # chat ids as a trace has them
    rows = [bailian(ids[c], -1 if parents[c] == -1 else ids[parents[c]], float(i), [c]) for i, c in enumerate(order)]
    path = write_jsonl(tmp_path / "f.jsonl", rows)
    requests = list(read_trace(path))
    assert [r.session_id for r in requests] == [str(ids[_root(parents, c)]) for c in order]
    records = list(export_records(requests, "bailian", BlockNumbering(b"k" * 32, 16)))
    new = {int(r.id): rec["chat_id"] for r, rec in zip(requests, records)}
    assert len(set(new.values())) == len(new)
    for c, rec in zip(order, records):  # each link kept, renumbered
        assert rec["parent_chat_id"] == (-1 if parents[c] == -1 else new[ids[parents[c]]])
    back = list(read_trace(write_jsonl(tmp_path / "e.jsonl", records)))
    assert [str(new[int(s)]) for s in (r.session_id for r in requests)] == [r.session_id for r in back]


ids_ = st.one_of(st.integers(-3, 2**70), st.text(max_size=6), st.none(), st.booleans(), st.floats(allow_nan=False),
                 st.lists(st.integers(), max_size=2))
noise = st.one_of(st.text(max_size=8), st.integers(), st.dictionaries(st.sampled_from(["chat_id", "x"]),
                                                                      st.integers(), max_size=2))


@SETTINGS
@given(chat=ids_, parent=ids_, has_parent=st.booleans(), extra=st.dictionaries(st.sampled_from(
    ["type", "note", "turn", "hash_ids"]), noise, max_size=3), compact=st.booleans(), first=st.booleans())
def test_the_byte_reading_of_a_chain_link_is_the_parsed_one(chat, parent, has_parent, extra, compact, first):
    record = {"chat_id": chat, **({"parent_chat_id": parent} if has_parent else {}), **extra}
    if not first:
        record = {**extra, **record}
    line = json.dumps(record, separators=(",", ":") if compact else (", ", ": ")).encode()
    try:
        want = optional_id(record, "chat_id"), optional_id(record, "parent_chat_id")
        want = want[0], None if want[1] == "-1" else want[1]
    except BadInputError:
        want = None
    assert chain_link(line) == want
