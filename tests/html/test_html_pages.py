"""The HTML report without a browser: each command's --html and kvcli report draw the same page from the same
document, the page is one file that fetches nothing, every figure's Vega-Lite spec compiles, replay's attached
per-request breakdown agrees with the replay, and every input that is no kvcli document is one line naming the file.
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.html.blocks import Figure
from kvcli.html.documents import Document, as_document, read_document
from kvcli.html.page import sections_of
from kvcli.html.replay import answer_lines, focus_chunk_size
from kvcli.html.timeline import positions, timeline_data

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
MOONCAKE = SAMPLES / "mooncake_conversation_head1000.jsonl.gz"


def run(*args) -> object:
    out = CliRunner().invoke(app, [str(a) for a in args])
    assert out.exit_code == 0, out.output
    return out


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    """Each command's --json document and --html page: a replay (a capacity, so eviction shows, and the optimal
    bound), an explain of a chat trace, a route sweep."""
    d = tmp_path_factory.mktemp("pages")
    out = {}
    replay = run("replay", MOONCAKE, "--limit", 300, "--payload", "accounted", "--measure", 0, "--prefill-tps", 3000,
                 "--model", "llama-3-8b", "--chunk-sizes", "256,1024", "--capacity-tokens", 1_000_000, "--optimal",
                 "--json", "--html", d / "replay.html")
    (d / "replay.json").write_text(replay.stdout)
    explain = run("explain", SAMPLES / "chat_shared_system.jsonl", "--chunk-size", 16, "--json", "--html",
                  d / "explain.html")
    (d / "explain.json").write_text(explain.stdout)
    route = run("route", SAMPLES / "glaive_toolcall_head30.json", "--chunk-size", 16, "--prefill-tps", 10000, "--rate",
                40, "-p", "round-robin,prefix,cost", "--sweep", "nodes=2,4", "--no-count-rtt", "--json", "--html",
                d / "route.html")
    (d / "route.json").write_text(route.stdout)
    for kind in ("replay", "explain", "route"):
        out[kind], out[f"{kind}.json"] = d / f"{kind}.html", d / f"{kind}.json"
    return out


def specs(page: Path) -> dict:
    text = page.read_text()
    return json.loads(re.search(r'<script type="application/json" id="kvcli-specs">(.*?)</script>', text, re.S)[1])


@pytest.mark.parametrize("kind", ["replay", "explain", "route"])
def test_report_draws_what_the_command_drew_from_its_json(pages, tmp_path, kind):
    again = tmp_path / "again.html"
    out = CliRunner().invoke(app, ["report", str(pages[f"{kind}.json"]), "--html", str(again)])
    assert out.exit_code == 0, out.output
    assert f"report written: {again}" in out.stderr
    assert specs(again) == specs(pages[kind]) and specs(again)


@pytest.mark.parametrize("kind", ["replay", "explain", "route"])
def test_the_page_is_one_file_that_fetches_nothing(pages, kind):
    text = pages[kind].read_text()
    assert not re.search(r"<script\b[^>]*\ssrc=", text, re.I)
    markup = re.sub(r"<script\b[^>]*>.*?</script>", "", text, flags=re.S | re.I)  # the page's own elements
    assert not re.search(r"<(img|iframe|link|embed|object|source|video|audio)\b", markup, re.I)
    assert "http-equiv=\"Content-Security-Policy\" content=\"default-src 'none';" in text
    assert '"url"' not in json.dumps(specs(pages[kind]))  # every figure's data inline
    assert 0.5e6 < len(text.encode()) < 3e6  # the Vega bundle (~0.9 MB) and the data: a few MB at most


def test_every_figure_compiles_to_vega(pages):
    vl_convert = pytest.importorskip("vl_convert")
    for kind in ("replay", "explain", "route"):
        for name, spec in specs(pages[kind]).items():
            assert vl_convert.vegalite_to_vega(spec)["marks"], (kind, name)


def test_replay_page_has_the_answer_the_curves_and_the_timeline(pages):
    text = pages["replay"].read_text()
    doc = json.loads(pages["replay.json"].read_text())
    (trace,) = doc["traces"]
    assert trace["answer"]["lines"] and all(line.strip() in html.unescape(text) for line in trace["answer"]["lines"])
    anchors = set(re.findall(r'<figure id="s1-([a-z-]+)"', text))
    assert anchors == {"hit-ratio", "objects", "savings", "capacity", "ttl", "causes", "timeline"}
    spec = specs(pages["replay"])
    assert any("optimal (Belady's MIN)" in json.dumps(s) for s in spec.values())  # --optimal's dashed lines


def test_replays_breakdown_is_the_replay_at_the_chunk_size_it_names(pages):
    """The attached breakdown is explain's at the answer's chunk size and the replay's capacity: its reused tokens
    are the replay's hit tokens there, and every request's spans tile its prompt."""
    (trace,) = json.loads(pages["replay.json"].read_text())["traces"]
    x = trace["explain"]
    row = next(r for r in trace["per_chunk_size"] if r["chunk_size"] == x["chunk_size"])
    assert x["chunk_size"] == focus_chunk_size(trace)
    assert x["reused_tokens"] == row["hit_tokens"] and x["requests"] == row["requests"] == 300
    assert x["capacity_chunks"] == 1_000_000 // x["chunk_size"]
    assert x["lost_tokens_by_cause"]["eviction"] > 0
    for r in x["per_request"]:
        spans = r["token_spans"]
        assert spans[0][1] == 0 and spans[-1][2] == r["prompt_tokens"]
        assert all(a[2] == b[1] for a, b in zip(spans, spans[1:]))
        assert r["timestamp_seconds"] is not None


def test_a_replay_json_without_the_breakdown_says_how_to_get_it(pages, tmp_path):
    body = json.loads(pages["replay.json"].read_text())
    del body["traces"][0]["explain"]
    (tmp_path / "plain.json").write_text(json.dumps(body))
    run("report", tmp_path / "plain.json", pages["explain.json"], "--html", tmp_path / "both.html")
    text = (tmp_path / "both.html").read_text()
    assert "No per-request breakdown in this document" in text
    assert 'id="s2-timeline"' in text  # the explain document's timeline, drawn beside


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    ("{not json", "not a kvcli JSON document: not JSON (Expecting property name"),
    ("[1, 2]", 'not a kvcli JSON document (no "schema_version" and "command")'),
    ('{"schema_version": 1, "command": "replay"}', "schema_version 1: this kvcli reads version 2"),
    ('{"schema_version": 2, "command": "stats", "provenance": {}}',
     "a kvcli stats document: the report draws replay, explain, route documents"),
    ('{"schema_version": 2, "command": "replay", "provenance": {}, "traces": [{"trace": "t"}]}',
     "not a complete kvcli replay document (KeyError: 'per_chunk_size')"),
])
def test_a_file_that_is_no_kvcli_document_is_one_line_naming_it(tmp_path, content, message):
    path = tmp_path / "result.json"
    if content is not None:
        path.write_text(content)
    out = CliRunner().invoke(app, ["report", str(path), "--html", str(tmp_path / "r.html")])
    assert out.exit_code == 2
    assert out.stderr.startswith(f"kvcli: error: {path}: {message}")
    assert out.stderr.count("\n") == 1
    assert not (tmp_path / "r.html").exists()


def test_html_in_a_missing_folder_fails_before_any_work(tmp_path):
    out = CliRunner().invoke(app, ["replay", str(MOONCAKE), "--html", str(tmp_path / "no" / "r.html")])
    assert out.exit_code == 2 and "no folder" in out.stderr and "replaying" not in out.stderr


@pytest.mark.parametrize("answer, lines", [
    ({"lines": ["answer: chunk size 256", "  hit 21.6%"]}, ("answer: chunk size 256", "  hit 21.6%")),
    ({"text": "one\ntwo"}, ("one", "two")),
    ("plain words", ("plain words",)),
    ({"chunk_size": 256, "hit_token_ratio": 0.2, "nested": {}}, ("chunk size: 256", "hit token ratio: 0.2")),
    (None, ("the verdict",)),
])
def test_the_answer_is_the_documents_answer_else_its_verdict(answer, lines):
    trace = {"verdict": {"text": "the verdict"}, **({"answer": answer} if answer is not None else {})}
    assert answer_lines(trace) == lines


def test_the_chunk_size_in_focus_is_the_answers_else_the_verdicts():
    verdict = {"tied_chunk_sizes": [16, 256], "focus_chunk_size": 256}
    assert focus_chunk_size({"verdict": verdict, "recommended_chunk_size": None}) == 256
    assert focus_chunk_size({"verdict": verdict, "answer": {"chunk_size": 1024}}) == 1024
    assert focus_chunk_size({"verdict": None, "recommended_chunk_size": 16}) == 16
    assert focus_chunk_size({"verdict": None}) is None


def test_requests_of_one_instant_are_drawn_side_by_side_before_the_next():
    assert positions([0.0, 0.0, 1.0, 3.0, 3.0]) == pytest.approx([0.0, 0.4, 1.0, 3.0, 3.8])
    assert positions([5.0]) == [5.0]
    assert positions([]) == []


def test_a_long_trace_is_drawn_every_kth_request(monkeypatch):
    import kvcli.html.timeline as timeline

    monkeypatch.setattr(timeline, "MAX_REQUESTS", 4)
    per = [{"id": f"r{i}", "prompt_tokens": 10, "reused_tokens": 4, "timestamp_seconds": None,
            "lost_tokens_by_cause": {"divergence": 6, "new": 0}} for i in range(10)]
    requests, spans, stride, timed = timeline_data({"per_request": per})
    assert stride == 3 and [r["i"] for r in requests] == [0, 3, 6, 9] and not timed
    assert spans[:2] == [{"i": 0, "cause": "reused", "a": 0, "b": 4}, {"i": 0, "cause": "divergence", "a": 4, "b": 10}]


def test_every_kind_draws_without_a_browser(pages):
    docs = [read_document(pages[f"{kind}.json"]) for kind in ("replay", "explain", "route")]
    sections = sections_of(docs)
    assert [s.kind for s in sections] == ["replay", "explain", "route"]
    assert all(any(isinstance(p, Figure) for p in s.parts) for s in sections)
    assert as_document({"schema_version": 2, "command": "route"}, "x") == Document("x", "route", {
        "schema_version": 2, "command": "route"})


def test_a_chunk_size_without_hits_draws_a_dash_for_its_cache_sizes(tmp_path):
    """At chunk size 1024 no prompt of the customer-service sample (at most 413 tokens) fills one chunk: no cache
    size reaches any share of its (zero) hits, and the document says so with nulls; the page draws a dash there.
    At 64 the 77-token system prompt's first chunk is hit by the 4 later requests (256 tokens), short of half of
    the unlimited cache's 704 hit tokens: half needs 2 chunks, 128 tokens x 8,192 bytes/token (the cpu model's
    KV) = 1.0 MiB."""
    out = run("replay", SAMPLES / "customer_service_handmade.parquet", "--payload", "accounted", "--measure", 0,
              "--prefill-tps", 5000, "--chunk-sizes", "64,1024", "--json", "--html", tmp_path / "r.html")
    assert (tmp_path / "r.html").exists()
    (tmp_path / "r.json").write_text(out.stdout)
    (trace,) = json.loads(out.stdout)["traces"]
    assert set(trace["per_chunk_size"][1]["hit_curve"]["capacity_for_fraction"].values()) == {None}
    (figure,) = [p for s in sections_of([read_document(tmp_path / "r.json")]) for p in s.parts
                 if isinstance(p, Figure) and p.anchor == "capacity"]
    assert figure.table.columns == ("chunk size", "size for 50%", "size for 90%", "size for 99%")
    assert figure.table.rows[0][:2] == ("64", "1.0 MiB (128 tokens)")
    assert figure.table.rows[1] == ("1024", "–", "–", "–")
