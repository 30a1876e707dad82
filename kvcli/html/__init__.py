"""The HTML report: one self-contained page drawn from kvcli's JSON documents (the ``--json`` of ``replay``,
``explain`` and ``route``), its figures Vega-Lite specs with their numbers beside them, the Vega JavaScript inlined;
no Redis, no model. ``kvcli report`` and each command's ``--html`` write it (:func:`kvcli.html.page.write_report`);
each document kind has its view module, registered in :data:`kvcli.html.views.VIEWS`.

May import: kvcli.errors, kvcli.units (the byte format, the schema version) and kvcli.outfile (how a page is
written), and vl-convert-python (the Vega, Vega-Lite and vega-embed bundle). Not the subpackages that make the
documents: a page is a pure function of them.
"""
