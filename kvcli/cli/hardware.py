"""``kvcli hardware``: the accelerators ``--hardware`` prices prefill on, with their published peaks and sources."""
from __future__ import annotations

from typing import Annotated

import typer

from kvcli.cli.options import JsonOut


def hardware(
    name: Annotated[str, typer.Argument(help="Show one accelerator (default: all).", show_default=False)] = "",
    json_out: JsonOut = False,
) -> None:
    """List the accelerators `kvcli replay --hardware NAME` prices prefill on: dense BF16 and FP8 tensor FLOP/s,
    HBM bandwidth and capacity, the host link, and where each figure comes from.

    Examples:

      kvcli hardware

      kvcli hardware h100-sxm --json
    """
    from rich.table import Table
    from rich.text import Text

    from kvcli.model.hardware import ACCELERATORS, get_accelerator
    from kvcli.model.roofline import DEFAULT_MFU, MFU_RANGE
    from kvcli.tables import print_table, stdout_console
    from kvcli.units import json_document

    chosen = [get_accelerator(name)] if name else list(ACCELERATORS.values())
    if json_out:
        typer.echo(json_document("hardware", {"accelerators": [a.to_dict() for a in chosen], "default_mfu": DEFAULT_MFU,
                                              "mfu_interval": list(MFU_RANGE)}, indent=1))
        return
    table = Table(title=Text(f"accelerators for --hardware (dense peaks; prefill at MFU {DEFAULT_MFU} "
                             f"[{MFU_RANGE[0]}, {MFU_RANGE[1]}] by default)"), title_justify="left")
    for column in ("name", "accelerator", "BF16 TFLOP/s", "FP8 TFLOP/s", "HBM TB/s", "memory GiB", "host link"):
        table.add_column(column, justify="left" if column in ("name", "accelerator", "host link") else "right")
    for a in chosen:
        table.add_row(a.name, a.label, f"{a.bf16_flops / 1e12:,.1f}",
                      "–" if a.fp8_flops is None else f"{a.fp8_flops / 1e12:,.1f}",
                      f"{a.hbm_bytes_per_second / 1e12:.2f}", f"{a.memory_bytes / 2 ** 30:,.0f}",
                      f"{a.host_link}, {a.host_bytes_per_second / 1e9:.0f} GB/s")
    table.caption = "Vendors' published peaks (sparse figures halved); each figure's source: --json, docs/hardware.md."
    table.caption_justify = "left"
    print_table(stdout_console(), table, keep=1)
