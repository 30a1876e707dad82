"""``kvcli hardware``: the accelerators ``--hardware`` prices prefill on, with their published peaks, the prefill
utilization (MFU) per precision, and where each figure comes from."""
from __future__ import annotations

from typing import Annotated

import typer

from kvcli.cli.options import JsonOut


def hardware(
    name: Annotated[str, typer.Argument(help="Show one accelerator (default: all).", show_default=False)] = "",
    json_out: JsonOut = False,
) -> None:
    """The accelerators --hardware prices on: peaks, MFU, sources.

    The accelerators `kvcli replay --hardware NAME` prices prefill on, with their published figures: dense BF16
    and FP8 tensor FLOP/s, HBM bandwidth and capacity, the host link, the share of the dense peak a prefill reaches
    (MFU) at bf16 and at fp8 with its interval, and where each figure comes from (docs/hardware.md derives them).
    --json gives each accelerator's mfu_bf16 and mfu_fp8 as {value, low, high} (null: no tensor cores at that
    precision) and mfu_basis (each one's rule and figures, with their sources).

    Examples:

      kvcli hardware

      kvcli hardware h100-sxm --json
    """
    from rich.table import Table
    from rich.text import Text

    from kvcli.model.hardware import ACCELERATORS, get_accelerator
    from kvcli.model.utilization import PRECISIONS, UTILIZATIONS, accelerator_utilizations
    from kvcli.tables import print_table, stdout_console
    from kvcli.units import json_document

    chosen = [get_accelerator(name)] if name else list(ACCELERATORS.values())
    if json_out:
        typer.echo(json_document("hardware", {"accelerators": [{**a.to_dict(), **accelerator_utilizations(a)}
                                                               for a in chosen]}, indent=1))
        return
    console = stdout_console()
    table = Table(title=Text("accelerators for --hardware (dense peaks)"), title_justify="left")
    for column in ("name", "accelerator", "BF16 TFLOP/s", "FP8 TFLOP/s", "HBM TB/s", "memory GiB", "host link"):
        table.add_column(column, justify="left" if column in ("name", "accelerator", "host link") else "right")
    for a in chosen:
        table.add_row(a.name, a.label, f"{a.bf16_flops / 1e12:,.1f}",
                      "–" if a.fp8_flops is None else f"{a.fp8_flops / 1e12:,.1f}",
                      f"{a.hbm_bytes_per_second / 1e12:.2f}", f"{a.memory_bytes / 2 ** 30:,.0f}",
                      f"{a.host_link}, {a.host_bytes_per_second / 1e9:.0f} GB/s")
    table.caption = "Vendors' published peaks (sparse figures halved); each figure's source: --json, docs/hardware.md."
    table.caption_justify = "left"
    print_table(console, table, keep=1)
    mfu = Table(title=Text("prefill MFU (the share of the dense peak a prefill reaches), value [interval]"),
                title_justify="left")
    for column in ("name", "precision", "MFU", "from"):
        mfu.add_column(column)
    for a in chosen:
        for p in PRECISIONS:
            u = UTILIZATIONS.get((a.name, p))
            mfu.add_row(a.name, p, *(("–", f"no {p.upper()} tensor cores") if u is None else
                                     (f"{u.value:.2f} [{u.low:.2f}, {u.high:.2f}]", u.summary())))
    mfu.caption = ("Each figure, its source and the rules: --json (mfu_basis), docs/hardware.md. A profile "
                   "(--prefill-profile) is preferred over any MFU.")
    mfu.caption_justify = "left"
    print_table(console, mfu, keep=2)
