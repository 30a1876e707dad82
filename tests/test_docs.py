"""The docs' examples run: every ``>>>`` example in README.md and docs/*.md through doctest, from the repository's
root (where their relative paths point), on embedded servers. A ```python block must be doctest-style, so no
example in the docs goes untested."""
from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", [p for p in PAGES if ">>> " in p.read_text()], ids=lambda p: p.name)
def test_examples_print_what_the_page_says(page, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("REDIS_URL", raising=False)  # the examples' open_redis(): an embedded server
    result = doctest.testfile(str(page), module_relative=False, optionflags=doctest.ELLIPSIS, verbose=False)
    assert (result.failed, result.attempted > 0) == (0, True)


def test_every_python_block_in_the_docs_is_an_example_that_runs():
    untested = [f"{page.name}: block {i}" for page in PAGES
                for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL))
                if ">>> " not in block]
    assert untested == []


def test_the_library_names_resolve_and_load_only_when_used():
    import subprocess
    import sys

    import kvcli

    assert [name for name in kvcli.__all__ if getattr(kvcli, name, None) is None] == []
    assert sorted(kvcli.__all__) == sorted(["__version__", *kvcli._EXPORTS])
    out = subprocess.run([sys.executable, "-c", "import kvcli, sys; print(sorted(m for m in ('numpy', 'redis', "
                          "'torch', 'rich') if m in sys.modules))"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"  # `import kvcli` (and so `kvcli --version`) loads none of them


def _setup_commands() -> list[list[str]]:
    """README's two set-up commands (its first two ```bash blocks under "Set up on a new machine"), as steps."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Set up on a new machine"):]
    section = section[:section.index("\n## ", 1)]
    blocks = re.findall(r"```bash\n(.*?)\n```", section, re.DOTALL)
    return [[step.strip() for step in block.split("&&")] for block in blocks]


def test_readme_has_two_setup_commands_and_ci_runs_the_test_one_from_the_lock():
    main, test = _setup_commands()
    def quiet(step: str) -> str:  # .ci/run adds -q to pip and --durations to pytest
        return " ".join(word for word in step.split() if word != "-q")

    ci = [quiet(line.split("#")[0]) for line in (ROOT / ".ci/run").read_text().splitlines()]
    ci = [line for line in ci if line]
    # the test command's steps after the venv, in order, are .ci/run's
    steps = [quiet(step) for step in test[2:]]
    assert steps[1] == "pip install -r requirements/test.txt" and main[3] == "pip install -r requirements/main.txt"
    at = [ci.index(next(line for line in ci if line.startswith(step))) for step in steps]
    assert at == sorted(at)
    for name in ("main", "test"):
        lock = (ROOT / "requirements" / f"{name}.txt").read_text()
        pins = re.findall(r"^([a-z0-9._-]+)==", lock, re.MULTILINE)
        assert pins and "torch" not in pins  # torch is the first, separate step
        assert all("--hash=sha256:" in entry for entry in re.split(r"\n(?=[a-z0-9])", lock.split("\n", 1)[1]) if
                   "==" in entry)
