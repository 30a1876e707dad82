"""The page: one HTML file holding every script, style and figure, that opens offline. Its Content-Security-Policy
forbids any fetch (a figure that tried would be an error, not a silent download); a script at its head records every
script error, console error or warning and blocked fetch into ``#kvcli-console`` (shown to the reader, and read by
the browser test), and the page marks ``data-kvcli-drawn`` on ``<html>`` once every figure is drawn."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from kvcli.errors import BadInputError
from kvcli.html import vega
from kvcli.html.blocks import Figure, Section, esc, part_html
from kvcli.html.documents import Document
from kvcli.html.views import VIEWS
from kvcli.outfile import check_output, write_output

CSP = ("default-src 'none'; script-src 'unsafe-inline' 'unsafe-eval'; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:")  # Vega compiles its expressions: 'unsafe-eval'

#: records what a console would show, before any other script runs.
HOOK = """(function () {
  var seen = [];
  function show() {
    var box = document.getElementById('kvcli-console');
    document.documentElement.setAttribute('data-kvcli-problems', String(seen.length));
    if (box && seen.length) {
      box.textContent = 'This page reported problems:\\n' + seen.join('\\n');
      box.hidden = false;
    }
  }
  function put(kind, args) {
    seen.push(kind + ': ' + Array.prototype.map.call(args, function (a) {
      return a && a.stack ? String(a.stack) : String(a); }).join(' '));
    show();
  }
  window.addEventListener('error', function (e) {
    put('error', [e.message || ('could not load ' + ((e.target && (e.target.src || e.target.href)) || 'a resource'))]);
  }, true);
  window.addEventListener('unhandledrejection', function (e) { put('error', [e.reason]); });
  document.addEventListener('securitypolicyviolation', function (e) { put('error', ['blocked: ' + e.blockedURI]); });
  var error = console.error, warn = console.warn;
  console.error = function () { put('console.error', arguments); error.apply(console, arguments); };
  console.warn = function () { put('console.warn', arguments); warn.apply(console, arguments); };
  document.addEventListener('DOMContentLoaded', show);
})();"""

#: draws every figure's spec into its div (SVG, so its marks are elements), then marks the page drawn.
DRAW = """const specs = JSON.parse(document.getElementById('kvcli-specs').textContent);
const options = {renderer: 'svg', mode: 'vega-lite',
                 actions: {export: true, source: false, compiled: false, editor: false}};
const ids = Object.keys(specs);
Promise.allSettled(ids.map((id) => window.vegaEmbed('#' + id, specs[id], options).then(() => {
  document.getElementById(id).setAttribute('data-kvcli-drawn', 'true');
}))).then((results) => {
  results.forEach((r, k) => { if (r.status === 'rejected') console.error('figure ' + ids[k] + ': ' + r.reason); });
  const drawn = results.filter((r) => r.status === 'fulfilled').length;
  document.documentElement.setAttribute('data-kvcli-drawn', drawn + '/' + ids.length);
});"""

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif; color: #222; margin: 0;
       background: #fafafa; }
header, main, footer { max-width: 1240px; margin: 0 auto; padding: 0 20px; }
header h1 { font-size: 22px; margin: 18px 0 4px; }
header p { margin: 2px 0; color: #555; }
nav a { margin-right: 14px; }
section { background: #fff; border: 1px solid #e3e3e3; border-radius: 6px; padding: 6px 18px 14px; margin: 16px 0; }
section h2 { font-size: 18px; margin: 10px 0; overflow-wrap: anywhere; }
.answer { border-left: 5px solid #2ca02c; background: #f1f8f1; padding: 8px 14px; margin: 8px 0 12px;
          font-size: 16px; }
.answer p { margin: 2px 0; }
.answer p:first-child { font-weight: 600; }
.facts h4, .notes h4 { margin: 10px 0 4px; font-size: 13px; color: #555; text-transform: uppercase; }
.facts dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 14px; margin: 0; }
.facts dt { color: #555; }
.facts dd { margin: 0; overflow-wrap: anywhere; }
figure { margin: 18px 0 8px; }
figcaption { font-weight: 600; font-size: 15px; margin-bottom: 6px; }
.figure-body { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
.side { max-height: 440px; overflow: auto; }
.note { color: #555; font-size: 13px; margin: 4px 0; max-width: 1100px; }
table.numbers { border-collapse: collapse; font-size: 12.5px; }
table.numbers caption { text-align: left; color: #555; padding-bottom: 3px; }
table.numbers th, table.numbers td { border-bottom: 1px solid #e6e6e6; padding: 3px 8px; text-align: left;
                                     vertical-align: top; }
table.numbers td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.table-only { margin: 12px 0; overflow-x: auto; }
.notes ul { margin: 0; padding-left: 20px; color: #444; font-size: 13px; }
.console { background: #fdecea; color: #8a1c13; border: 1px solid #f5c2bd; padding: 8px; white-space: pre-wrap; }
footer { color: #777; font-size: 12px; padding-bottom: 24px; }
"""


def sections_of(documents: Sequence[Document]) -> list[Section]:
    """Every document's sections, in the documents' order.

    Raises:
        BadInputError: naming the document: a kind no view draws, or a document of a known kind that lacks what
            its view reads.
    """
    out: list[Section] = []
    for doc in documents:
        view = VIEWS.get(doc.kind)
        if view is None:
            raise BadInputError(f"a kvcli {doc.kind} document: the report draws {', '.join(VIEWS)} documents",
                                path=doc.name)
        try:
            out += view(doc)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise BadInputError(f"not a complete kvcli {doc.kind} document ({type(exc).__name__}: {exc})",
                                path=doc.name) from None
    return out


def draw(documents: Sequence[Document]) -> str:
    """The page of ``documents`` (:class:`~kvcli.html.documents.Document`, in order), as text.

    Raises:
        BadInputError: :func:`sections_of`'s.
        KvcliError: vl-convert-python, which ships the JavaScript, is not installed.
    """
    sections = sections_of(documents)
    specs: dict[str, dict] = {}
    body = []
    for k, section in enumerate(sections, 1):
        parts = []
        for part in section.parts:
            chart_id = None
            if isinstance(part, Figure):
                chart_id = f"fig{len(specs) + 1}"
                specs[chart_id] = part.spec
            parts.append(part_html(part, chart_id, f"s{k}"))
        body.append(f'<section id="s{k}" class="{esc(section.kind)}"><h2>{esc(section.title)}</h2>'
                    f'{"".join(parts)}</section>')
    toc = "".join(f'<a href="#s{k}">{esc(s.title)}</a>' for k, s in enumerate(sections, 1))
    names = ", ".join(f"{d.kind} ({d.name})" for d in documents)
    libs = vega.versions()
    title = sections[0].title if sections else "no document"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<title>kvcli report: {esc(title)}</title>
<script>{HOOK}</script>
<style>{CSS}</style>
<!--
{vega.LICENSE}
-->
<script type="module">{_script(vega.bundle())}</script>
</head><body>
<header><h1>kvcli report</h1><p>Drawn from {esc(names)}.</p><nav>{toc}</nav></header>
<main><pre id="kvcli-console" class="console" hidden></pre>
{"".join(body)}
</main>
<footer>Figures drawn by Vega {esc(libs["vega"])}, Vega-Lite {esc(libs["vega-lite"])} and vega-embed
{esc(libs["vega-embed"])} (BSD-3-Clause, University of Washington Interactive Data Lab), inlined in this file:
it opens offline and fetches nothing.</footer>
<script type="application/json" id="kvcli-specs">{_json(specs)}</script>
<script type="module">{DRAW}</script>
</body></html>
"""


def _json(value: object) -> str:
    """JSON that is safe inside a ``<script>`` element (no ``</script>`` or ``<!--`` can end or open anything)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def _script(code: str) -> str:
    """JavaScript that is safe inside a ``<script>`` element."""
    return code.replace("</script", "<\\/script")


def check_report_path(path: str | Path) -> None:
    """Raise BadInputError (naming ``--html``) unless a page can be written at ``path``
    (:func:`kvcli.outfile.check_output`): checked before a command's work."""
    check_output(path, "--html")


def write_report(path: str | Path, documents: Sequence[Document]) -> int:
    """Write the page of ``documents`` to ``path`` by :func:`kvcli.outfile.write_output` (a regular file through a
    temporary file beside it, so a reader never sees half a page; a pipe or a device in place) and return its size
    in bytes.

    Raises:
        BadInputError: :func:`draw`'s, or ``path`` cannot be written (naming it).
        KvcliError: vl-convert-python is not installed.
    """
    data = draw(documents).encode("utf-8")
    with write_output(path, "--html", binary=True) as f:
        f.write(data)
    return len(data)
