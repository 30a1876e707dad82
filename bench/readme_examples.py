"""The worked examples of README.md and docs/replay.md, run and written back, so that they show what kvcli prints today.

    python bench/readme_examples.py            # run every example and rewrite its block in its page
    python bench/readme_examples.py --check    # run them; exit 1, naming the block, where a fixed part differs

A block is a fenced block between ``<!-- example: NAME -->`` and ``<!-- /example -->`` in one of :data:`PAGES`;
:data:`EXAMPLES` says which page holds it, which command prints it (run as ``python -m kvcli ...`` from the
repository's root, at 80 columns, on an embedded server: ``REDIS_URL`` is cleared), which stream it shows and which
of its lines are fixed: the parts that do not depend on timing (a timed report's chunk sizes, hit ratios and answer
lines, the stderr's phases; a priced report whole, its objects and bytes included). tests/test_readme_examples.py
runs the same commands and compares the fixed parts with the pages'.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
REPLAY_DOC = ROOT / "docs" / "replay.md"
PAGES = (README, REPLAY_DOC)
"""The pages that hold example blocks."""
BLOCK = re.compile(r"(<!-- example: (?P<name>[\w-]+) -->\n```\n)(?P<body>.*?)(```\n<!-- /example -->)", re.DOTALL)
COUNTED = ("hit token ratio", "token-granular bound")
"""The compact table's rows that every timed run of a trace prints alike. Objects and bytes are not among them
there: how much of a measured request's prompt runs the model, and so which chunks get a real payload key, is set
by its timed measuring budget (a priced example, which measures nothing, fixes them)."""


def report(stdout: str, stderr: str) -> str:
    """A replay's answer and compact table, with its caption: stdout up to the first line under the table."""
    lines = stdout.splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith("  measured ")), len(lines))
    return "\n".join(line.rstrip() for line in lines[:end]) + "\n"


def progress(stdout: str, stderr: str) -> str:
    """A replay's stderr: its phases and its summary line."""
    return "\n".join(line.rstrip() for line in stderr.splitlines()) + "\n"


def counted(text: str) -> list[str]:
    """What a timed report's block fixes: the chunk sizes, the hit ratios (:data:`COUNTED`), and the answer's lines
    by their first words (its figures are timed)."""
    lines = text.splitlines()
    head = next(line for line in lines if line.startswith("chunk size"))
    rows = [" ".join(line.split()) for line in lines if line.strip().startswith(COUNTED)]
    answer = lines[:next(i for i, line in enumerate(lines) if not line.startswith(("answer: ", "  ")))]
    return [" ".join(re.findall(r"\d+", head)), *rows, *(re.sub(r"(\S+).*", r"\1", line) for line in answer)]


def phases(text: str) -> list[str]:
    """What a stderr block fixes: each phase without its seconds or the run's namespace, and the trace each summary
    line is of."""
    out = []
    for line in text.splitlines():
        m = re.fullmatch(r"\[ *\d+\.\ds\] (.*)", line)
        out.append(re.sub(r"replay-\S+", "replay-*", m[1]) if m else line.split(": ")[0] + ": ...")
    return out


def whole(text: str) -> list[str]:
    """What a priced report's block fixes: every line (nothing in it is timed)."""
    return text.splitlines()


@dataclass(frozen=True)
class Example:
    """One example block: ``args`` after ``kvcli``; ``shown``: what of (stdout, stderr) the block holds; ``fixed``:
    the block's lines that every run prints alike; ``page``: the page that holds it (one of :data:`PAGES`)."""

    args: tuple[str, ...]
    shown: Callable[[str, str], str]
    fixed: Callable[[str], list[str]]
    page: Path = README


CHAT = ("replay", "sample_traces/chat_shared_system.jsonl")
EXAMPLES = {
    "replay-chat": Example(CHAT, report, counted),
    "replay-chat-stderr": Example(CHAT, progress, phases, REPLAY_DOC),
    "replay-chat-h100": Example((*CHAT, "--model", "llama-3-8b", "--hardware", "h100-sxm"), report, whole,
                                REPLAY_DOC),
}


def run(args: tuple[str, ...]) -> tuple[str, str]:
    """``kvcli ARGS`` from the repository's root at 80 columns on an embedded server: (stdout, stderr).

    Raises:
        RuntimeError: the command failed (its stderr's last line).
    """
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "KVCLI_REDIS_TIMEOUT")}
    env.update(COLUMNS="80", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "kvcli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode:
        raise RuntimeError(f"kvcli {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    return proc.stdout, proc.stderr


def blocks(text: str) -> dict[str, str]:
    """A page's example blocks: name -> the text between its fences."""
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def page_blocks() -> dict[str, tuple[Path, str]]:
    """Every page's example blocks: name -> (the page, the text between its fences)."""
    return {name: (page, body) for page in PAGES for name, body in blocks(page.read_text()).items()}


def printed(names: list[str]) -> dict[str, str]:
    """What each example prints today (each distinct command run once)."""
    outputs: dict[tuple[str, ...], tuple[str, str]] = {}
    for name in names:
        args = EXAMPLES[name].args
        if args not in outputs:
            outputs[args] = run(args)
    return {name: EXAMPLES[name].shown(*outputs[EXAMPLES[name].args]) for name in names}


def differences(shown: dict[str, str], fresh: dict[str, str]) -> list[str]:
    """The examples whose fixed parts differ between the block its page shows (``shown``: name -> block) and what
    the command prints, and the blocks that name no example."""
    out = [f"{name}: no such example" for name in sorted(shown) if name not in EXAMPLES]
    for name, text in fresh.items():
        page = EXAMPLES[name].page.relative_to(ROOT)
        if name not in shown:
            out.append(f"{name}: no block in {page}")
        elif EXAMPLES[name].fixed(shown[name]) != EXAMPLES[name].fixed(text):
            out.append(f"{name}: {page} shows {EXAMPLES[name].fixed(shown[name])}, kvcli prints "
                       f"{EXAMPLES[name].fixed(text)}")
    return out


def rewrite(text: str, fresh: dict[str, str]) -> str:
    """``text`` with each example block's body replaced by what its command printed."""
    return BLOCK.sub(lambda m: m[1] + fresh.get(m["name"], m["body"]) + m[4], text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing; exit 1 on a difference")
    parser.add_argument("names", nargs="*", help=f"examples to run (default: all: {', '.join(EXAMPLES)})")
    opts = parser.parse_args()
    fresh = printed(opts.names or list(EXAMPLES))
    if opts.check:
        diff = differences({name: body for name, (_, body) in page_blocks().items()}, fresh)
        print("\n".join(diff) or "the pages' examples are what kvcli prints")
        return 1 if diff else 0
    for page in PAGES:
        mine = {name: text for name, text in fresh.items() if EXAMPLES[name].page == page}
        if mine:
            page.write_text(rewrite(page.read_text(), mine))
            print(f"{page.relative_to(ROOT)}: rewrote {', '.join(mine)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
