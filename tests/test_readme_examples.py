"""README.md's and docs/replay.md's worked examples are what kvcli prints: each example block's fixed parts
(bench/readme_examples.py: a timed report's chunk sizes, hit ratios and answer lines, the phases; a priced report
whole) against a fresh run of its command, from the repository's root at 80 columns on an embedded server. A block
that differs is rewritten by ``python bench/readme_examples.py``."""
from __future__ import annotations

import pytest
import readme_examples as examples  # bench/readme_examples.py (bench/ is on the tests' path: conftest.py)


@pytest.fixture(scope="module")
def fresh() -> dict[str, str]:
    return examples.printed(list(examples.EXAMPLES))


def test_every_example_has_its_block_on_its_page_and_every_block_its_example():
    found = examples.page_blocks()
    assert sorted(found) == sorted(examples.EXAMPLES)
    assert {name: page for name, (page, _) in found.items()} == {n: e.page for n, e in examples.EXAMPLES.items()}
    # the README's one example is within its first 80 lines, with the question and the set-up commands
    head = "\n".join(examples.README.read_text().splitlines()[:80])
    assert "<!-- example: replay-chat -->" in head and "<!-- /example -->" in head


@pytest.mark.parametrize("name", list(examples.EXAMPLES))
def test_the_pages_block_is_what_kvcli_prints(fresh, name):
    page, shown = examples.page_blocks()[name]
    example = examples.EXAMPLES[name]
    assert example.fixed(shown) == example.fixed(fresh[name]), f"run: python bench/readme_examples.py {name}"
    assert example.fixed(shown)  # something is compared


def test_a_block_that_differs_is_named_and_rewritten():
    block = ("<!-- example: replay-chat -->\n```\nanswer: chunk size 64 (tie)\n  hit 74.5%; saves 3.44 s\n"
             "sample_traces/chat_shared_system.jsonl: 24 requests\nchunk size   16 =   64 =\n"
             "hit token ratio   77.6%   74.5%\nobjects created   210   51\n```\n<!-- /example -->\n")
    timed = block.replace("3.44 s", "3.51 s").replace("210", "242")  # timed figures: not fixed
    counted = block.replace("77.6%", "77.7%")  # a hit ratio: fixed
    readme = examples.blocks(block)
    assert examples.differences(readme, examples.blocks(timed)) == []
    (diff,) = examples.differences(readme, examples.blocks(counted))
    assert diff.startswith("replay-chat: README.md shows ") and "hit token ratio 77.6% 74.5%" in diff
    assert examples.differences({"nonesuch": ""}, {}) == ["nonesuch: no such example"]
    assert examples.differences({}, {"replay-chat-h100": block}) == ["replay-chat-h100: no block in docs/replay.md"]
    assert examples.rewrite(block, examples.blocks(counted)) == counted
