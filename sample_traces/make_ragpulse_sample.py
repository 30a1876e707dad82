"""Writes ragpulse_head60/: the first 60 requests of RAGPulse's trace and the lines of its five component files
that their hash ids name, every line copied unchanged, in the files' own order. Deterministic:
``python sample_traces/make_ragpulse_sample.py RAGPULSE/data`` (the data folder of flashserve/RAGPulse at commit
3672232d45d749fdcf45dbc38cc77e5264af4a32; MIT licence, sample_traces/SOURCES.md).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from kvcli.traces.ragpulse import COMPONENT_FILES

REQUESTS = 60


def main(data: Path, out: Path) -> None:
    out.mkdir(exist_ok=True)
    lines = (data / "0_trace.jsonl").read_text().splitlines(keepends=True)[:REQUESTS]
    (out / "0_trace.jsonl").write_text("".join(lines))
    used = {i for line in lines for ids in json.loads(line)["hash_ids"].values() for i in ids}
    for name, key in COMPONENT_FILES:
        kept = [line for line in (data / name).read_text().splitlines(keepends=True)
                if line.strip() and json.loads(line)[key] in used]
        (out / name).write_text("".join(kept))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).resolve().parent / "ragpulse_head60")
