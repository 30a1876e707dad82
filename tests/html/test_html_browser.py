"""The HTML report in a real browser: headless Chromium, offline, driven over the DevTools protocol
(tests/html/browser_pipe.py). The Mooncake sample's report (the replay of the issue's command) draws every figure with
its marks, shows the answer, and reports no console error or warning, no uncaught exception and no blocked fetch;
kvcli report draws the same from the --json; a click on a request draws its chunk map; a drag on the overview zooms
the timeline. Console problems are caught twice: the protocol's events, and the page's own record (#kvcli-console).
Skipped, saying so, where no Chromium is installed (.ci/run installs Debian's).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from browser_pipe import Browser, find_browser
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.html.blocks import Figure, Section
from kvcli.html.documents import Document
from kvcli.html.page import write_report
from kvcli.html.views import VIEWS

BROWSER = find_browser()
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium on PATH to open the report in (apt-get install "
                                                        "chromium, as .ci/run does, or set KVCLI_CHROMIUM)")

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"
MOONCAKE = SAMPLES / "mooncake_conversation_head1000.jsonl.gz"

MARKS = ("Array.from(document.querySelectorAll('[data-kvcli-chart]'))"
         ".map((d) => d.querySelectorAll('svg [role=\"graphics-symbol\"]').length)")
CHUNK_MAP_LABEL = ("Array.from(document.querySelectorAll('#s1-timeline text'))"
                   ".map((t) => t.textContent).find((t) => t.startsWith('request '))")
DETAIL_TICKS = ("Array.from(document.querySelectorAll('#s1-timeline .concat_0_group .role-axis-label text'))"
                ".map((t) => t.textContent)")


def run(*args):
    out = CliRunner().invoke(app, [str(a) for a in args])
    assert out.exit_code == 0, out.output
    return out


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory) -> dict[str, Path]:
    """The issue's command with --json beside (the same document --html drew), and kvcli report of that JSON."""
    d = tmp_path_factory.mktemp("mooncake")
    out = run("replay", MOONCAKE, "--model", "llama-3-8b", "--hardware", "h100-sxm", "--html", d / "report.html",
              "--json")
    (d / "replay.json").write_text(out.stdout)
    run("report", d / "replay.json", "--html", d / "again.html")
    return {"page": d / "report.html", "json": d / "replay.json", "again": d / "again.html"}


def drawn_cleanly(browser: Browser) -> list[int]:
    """Check the page just opened: every figure drawn, no problem either way of recording them; its marks per
    figure."""
    assert browser.problems == []
    assert browser.evaluate("document.documentElement.getAttribute('data-kvcli-problems')") in (None, "0")
    assert browser.evaluate("document.getElementById('kvcli-console').hidden") is True
    drawn = browser.evaluate("document.documentElement.getAttribute('data-kvcli-drawn')")
    charts = browser.evaluate("document.querySelectorAll('[data-kvcli-chart]').length")
    assert drawn == f"{charts}/{charts}" and charts > 0
    marks = browser.evaluate(MARKS)
    assert all(n > 0 for n in marks), marks
    return marks


def test_the_mooncake_report_renders_offline_with_its_answer_curves_and_timeline(mooncake):
    with Browser(BROWSER) as browser:
        browser.open(mooncake["page"])
        marks = drawn_cleanly(browser)
        assert len(marks) == 7  # hit ratio, objects, savings, capacity, TTL, causes, timeline
        (trace,) = json.loads(mooncake["json"].read_text())["traces"]
        assert browser.evaluate("document.querySelector('[data-kvcli-answer]').checkVisibility()")
        shown = browser.evaluate("document.querySelector('[data-kvcli-answer]').innerText")
        assert trace["answer"]["lines"] and all(line.strip() in shown for line in trace["answer"]["lines"])
        for curve in ("capacity", "ttl"):
            assert browser.evaluate(f"document.querySelectorAll('#s1-{curve} path[aria-roledescription=\"line mark\"]')"
                                    ".length") >= 4  # a line per chunk size
        bars = browser.evaluate("document.querySelectorAll('#s1-timeline path[aria-roledescription=\"bar\"]').length")
        assert bars > 1000  # every request's spans, its overview and the chunk map
        assert browser.evaluate(CHUNK_MAP_LABEL).startswith("request ")  # the chunk map of the request shown
    with Browser(BROWSER) as browser:
        browser.open(mooncake["again"])
        assert drawn_cleanly(browser) == marks


def test_a_click_on_a_request_draws_its_chunk_map(mooncake):
    with Browser(BROWSER, height=1400) as browser:
        browser.open(mooncake["page"])
        before = browser.evaluate(CHUNK_MAP_LABEL)
        browser.evaluate("document.getElementById('s1-timeline').scrollIntoView()")
        # the tallest bar of another request than the one shown, clicked near its top (no other bar reaches there)
        target = browser.evaluate("""(() => {
          const shown = %s;
          let best = null;
          const bars = '#s1-timeline .concat_0_group path[aria-roledescription="bar"]';
          for (const bar of document.querySelectorAll(bars)) {
            const id = (bar.getAttribute('aria-label').match(/request: ([^;]+);/) || [])[1];
            const r = bar.getBoundingClientRect();
            if (id && !shown.startsWith('request ' + id + ':') && (!best || r.top < best.top))
              best = {id: id, x: r.left + r.width / 2, y: r.top + 2, top: r.top};
          }
          return best; })()""" % json.dumps(before))
        browser.click(target["x"], target["y"])
        after = browser.evaluate(CHUNK_MAP_LABEL)
        assert after != before and after.startswith(f"request {target['id']}:"), (before, after, target)
        assert browser.problems == []


def test_a_drag_on_the_overview_zooms_the_timeline(mooncake):
    with Browser(BROWSER, height=1400) as browser:
        browser.open(mooncake["page"])
        browser.evaluate("document.getElementById('s1-timeline').scrollIntoView()")
        before = browser.evaluate(DETAIL_TICKS)
        box = browser.evaluate("(() => { const r = document.querySelector('#s1-timeline .concat_1_group')"
                               ".getBoundingClientRect(); return {x: r.left, y: r.top, w: r.width, h: r.height}; })()")
        browser.drag(box["x"] + 0.4 * box["w"], box["y"] + 0.3 * box["h"], box["x"] + 0.5 * box["w"],
                     box["y"] + 0.3 * box["h"])
        after = browser.evaluate(DETAIL_TICKS)
        assert after != before, before
        assert float(after[0].replace(",", "")) > float(before[0].replace(",", ""))  # the axis starts later
        assert browser.problems == []


@pytest.mark.parametrize("command", [
    ["explain", SAMPLES / "chat_shared_system.jsonl", "--chunk-size", 16, "--ttl", 60],
    ["route", SAMPLES / "glaive_toolcall_head30.json", "--chunk-size", 16, "--prefill-tps", 10000, "--rate", 40,
     "--sweep", "nodes=2,4", "--no-count-rtt"],
    ["route", SAMPLES / "glaive_toolcall_head30.json", "--chunk-size", 16, "--prefill-tps", 10000, "--rate", 40,
     "-p", "round-robin,prefix", "--no-count-rtt"],
], ids=["explain", "route-sweep", "route-one-point"])
def test_explain_and_route_pages_render_cleanly(tmp_path, command):
    run(*command, "--html", tmp_path / "page.html")
    with Browser(BROWSER) as browser:
        browser.open(tmp_path / "page.html")
        drawn_cleanly(browser)


def test_the_checks_catch_a_figure_that_fails_and_one_that_fetches(tmp_path, monkeypatch):
    """The check can fail: a figure Vega-Lite cannot draw, and one whose data is a URL (refused by the page's
    policy), are both reported, by the protocol's events and by the page's own record."""
    bad = [Figure("no such mark", {"data": {"values": [{"a": 1}]}, "mark": "no-such-mark"}),
           Figure("fetches", {"data": {"url": "https://example.com/data.json"}, "mark": "point",
                              "encoding": {"x": {"field": "a", "type": "quantitative"}}})]
    monkeypatch.setitem(VIEWS, "broken", lambda doc: [Section("broken", "broken", tuple(bad))])
    write_report(tmp_path / "broken.html", [Document("broken.json", "broken", {})])
    with Browser(BROWSER) as browser:
        browser.open(tmp_path / "broken.html", settle=20)
        text = "\n".join(browser.problems)
        assert "console.error: figure fig1: " in text and "example.com" in text, text
        assert int(browser.evaluate("document.documentElement.getAttribute('data-kvcli-problems')")) >= 2
        assert browser.evaluate("document.getElementById('kvcli-console').hidden") is False


AXIS_LABELS = "Array.from(document.querySelectorAll('#%s .role-axis text')).map((t) => t.textContent)"


def test_route_axes_label_every_run_alike_and_a_whole_sweep_at_its_values(tmp_path):
    """One request of 1,000 token ids prefilled at 10,000 tokens/s: every run's TTFT is 0.1 s, so each axis of TTFT
    holds one value, labelled 0.1 (Vega's default format took its digits from a zero tick step and wrote "0"); a
    sweep of nodes=1,2 is ticked at 1 and 2 alone (no 1.5 tick labelled "2")."""
    trace = tmp_path / "one.jsonl"
    trace.write_text(json.dumps({"id": "a", "timestamp": 0, "token_ids": list(range(1, 1001)),
                                 "output_length": 1}) + "\n")
    run("route", trace, "--prefill-tps", 10000, "--sweep", "nodes=1,2", "-p", "prefix", "--no-count-rtt", "--html",
        tmp_path / "page.html")
    with Browser(BROWSER) as browser:
        browser.open(tmp_path / "page.html")
        drawn_cleanly(browser)
        assert browser.evaluate(AXIS_LABELS % "s1-frontier") == ["0.1", "TTFT p99 (s)", "0%", "hit token ratio (%)"]
        assert browser.evaluate(AXIS_LABELS % "s1-load") == [
            "1", "2", "serving nodes (count)", "0%", "hit token ratio (%)",
            "1", "2", "serving nodes (count)", "0.1", "TTFT (s): p99 solid, p50 faint"]


def test_a_chunk_size_that_stored_nothing_keeps_its_place_on_the_bytes_axis(tmp_path, monkeypatch):
    """Prompts shorter than 1,024 tokens store no chunk of 1,024: the bytes panel (log scale, where 0 has no bar)
    still names that chunk size beside the others, as the objects panel does."""
    from kvcli.html.replay import objects_figure

    rows = [{"chunk_size": cs, "objects_created": n, "payload_bytes_written": 1000 * n,
             "metadata_bytes_written": 10 * n, "redis_memory_bytes": 2000 * n}
            for cs, n in ((16, 200), (64, 50), (256, 8), (1024, 0))]
    monkeypatch.setitem(VIEWS, "objects", lambda doc: [Section("objects", "objects", (objects_figure(rows, None),))])
    write_report(tmp_path / "objects.html", [Document("objects.json", "objects", {})])
    with Browser(BROWSER) as browser:
        browser.open(tmp_path / "objects.html")
        labels = browser.evaluate("Array.from(document.querySelectorAll('#s1-objects .concat_1_group "
                                  ".role-axis-label text')).map((t) => t.textContent)")
        assert labels[:4] == ["16", "64", "256", "1024"], labels
        assert browser.problems == []
