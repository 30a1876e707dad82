"""Every command's ``--help`` at 80 columns: each option name printed whole (rich cuts a cell too narrow with "…"),
every line inside 80 columns; and the help panels' mechanism refusing a name that is no parameter."""
from __future__ import annotations

import re
import shlex

import pytest
import typer
import typer.main
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.core import TyperCommand
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.cli.options import EXAMPLE_WIDTH, HelpCommand, help_panels, reflow, wrap_example


def _commands(command, path=()):
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


ROOT = typer.main.get_command(app)
COMMANDS = list(_commands(ROOT))


def _command(path):
    command = ROOT
    for name in path:
        command = command.commands[name]
    return command


def test_every_command_is_checked():
    assert {p[0] for p in COMMANDS if p} == {"replay", "warm", "inspect", "purge", "route", "profile", "hardware",
                                             "export", "stats", "explain", "events", "report", "audit"}


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "kvcli")
def test_help_at_80_columns_shows_every_option_name_whole(path):
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert not re.findall(r"-[\w-]*…", res.stdout)  # no option name cut
    assert "…" not in res.stdout, [line for line in lines if "…" in line]  # nor any other word
    shown = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", res.stdout))
    names = {n for p in _command(path).params if not getattr(p, "hidden", False)
             for n in (*p.opts, *p.secondary_opts) if n.startswith("--")}
    assert names <= shown, names - shown


def test_help_panels_refuse_a_name_that_is_no_parameter():
    broken = typer.Typer()
    broken.command(cls=help_panels({"Store": ("chunk_size", "redis_urll")}))(lambda chunk_size: None)
    with pytest.raises(ValueError, match="help panels name no parameter of .*: redis_urll"):
        typer.main.get_command(broken)


def test_reflow_joins_each_prose_paragraph_and_keeps_literal_ones():
    """A paragraph wrapped by hand becomes one line; one with an indented line (examples), one marked ``\\b`` and
    what follows ``\\f`` stay as written."""
    text = "First line.\n\nA paragraph\nwrapped by hand.\n\nExamples:\n\n  kvcli x\n  kvcli y\n\f\nhidden\nlines"
    assert reflow(text) == ("First line.\n\nA paragraph wrapped by hand.\n\nExamples:\n\n  kvcli x\n  kvcli y\n"
                            "\f\nhidden\nlines")
    assert reflow("\b\nkept\nas is\n\nand\nthis") == "\b\nkept\nas is\n\nand this"


def test_kvcli_help_lists_each_command_on_one_line():
    """Each command's short help (its docstring's first line) fits one line of the listing at 80 columns: every row
    of the Commands panel starts with a command's name, none is a continuation."""
    res = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    panel = res.stdout[res.stdout.index("Commands"):].splitlines()[1:]
    names = [line.split()[1] for line in panel[:next(i for i, line in enumerate(panel) if line.startswith("╰"))]]
    assert names == ["replay", "warm", "inspect", "purge", "route", "profile", "hardware", "export", "stats",
                     "explain", "report", "audit", "events"]


def _help_lines(command_class, columns: str) -> list[str]:
    """The lines of a one-command app's --help, between its first line and "Examples:", stripped; the command's
    docstring has a one-line summary, then a paragraph wrapped by hand."""
    one = typer.Typer()

    @one.command(cls=command_class)
    def run(flag: bool = False) -> None:
        """Do one thing.

        A paragraph wrapped by hand in the source, as every command's
        docstring is, so that its lines stay inside the source's width, which
        is not the terminal's.

        Examples:

          run --flag
        """

    res = CliRunner().invoke(one, ["--help"], env={"COLUMNS": columns})
    assert res.exit_code == 0, res.output
    text = res.stdout[res.stdout.index("Do one thing."):res.stdout.index("Examples:")]
    return [line.strip() for line in text.strip().splitlines()[1:] if line.strip()]


PARAGRAPH = ("A paragraph wrapped by hand in the source, as every command's docstring is, so that its lines stay "
             "inside the source's width, which is not the terminal's.")


@pytest.mark.parametrize("columns", ["80", "120", "240"])
def test_a_commands_long_help_wraps_at_the_terminals_width(columns):
    """With HelpCommand the terminal wraps the paragraph: at 240 columns on one line, at 80 and 120 on lines that
    each end where the next word would not fit; typer's own command keeps the source's line breaks."""
    lines = _help_lines(HelpCommand, columns)
    assert " ".join(lines) == PARAGRAPH
    width = int(columns) - 2  # the help's margin on each side
    assert all(len(line) + 1 + len(following.split()[0]) > width for line, following in zip(lines, lines[1:]))
    assert (len(lines) == 1) == (columns == "240")
    assert _help_lines(TyperCommand, "240") == [
        "A paragraph wrapped by hand in the source, as every command's", "docstring is, so that its lines stay "
        "inside the source's width, which", "is not the terminal's."]


@pytest.mark.parametrize("columns", ["80", "120"])
def test_replays_long_help_reflows(columns):
    res = CliRunner().invoke(app, ["replay", "--help"], env={"COLUMNS": columns})
    assert res.exit_code == 0, res.output
    text = res.stdout[res.stdout.index(" Replay prompt traces"):res.stdout.index("Examples:")]
    lines = [line.strip() for line in text.strip().splitlines()]
    assert " ".join(lines) == ("Replay prompt traces through a chunk-hash KV-cache store on Redis and report, per "
                               "chunk size, hit token ratio, objects, bytes, round trips, measured prefill savings "
                               "and the net benefit that picks the chunk size.")
    assert all(len(line) + 1 + len(following.split()[0]) > int(columns) - 2
               for line, following in zip(lines, lines[1:]))


def test_a_long_example_is_cut_between_words_with_its_comment_above():
    # 8 + 1 + ... columns counted by hand: the cut falls before the word that would pass 76 - 2 (room for " \")
    line = ("  kvcli replay mooncake.jsonl --payload accounted --measure 0 --prefill-tps 5000 "
            "--prompt \"a b c d\" --plot curve.png  # a comment")
    assert wrap_example(line) == (
        "  # a comment\n"
        "  kvcli replay mooncake.jsonl --payload accounted --measure 0 \\\n"
        "      --prefill-tps 5000 --prompt \"a b c d\" --plot curve.png")
    assert wrap_example("  kvcli stats t.jsonl") == "  kvcli stats t.jsonl"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.from_regex(r"--[a-z]{1,12}", fullmatch=True),
                          st.from_regex(r"[a-z0-9./=]{1,30}", fullmatch=True),
                          st.from_regex(r'"[a-z ]{1,40}"', fullmatch=True)), min_size=1, max_size=30))
def test_a_wrapped_example_is_the_same_shell_words(words):
    line = "  kvcli " + " ".join(words)
    wrapped = wrap_example(line).split("\n")
    assert all(len(x) <= EXAMPLE_WIDTH or len(x.split()) <= 2 for x in wrapped)
    assert shlex.split(" ".join(x.removesuffix(" \\") for x in wrapped)) == shlex.split(line)


def test_every_example_in_every_commands_help_fits_80_columns():
    def lines(command):
        for sub in (getattr(command, "commands", None) or {}).values():
            yield from lines(sub)
        yield from ((command.name, x) for x in (command.help or "").split("\n") if x[:1].isspace())
    long = [(name, x) for name, x in lines(typer.main.get_command(app)) if len(x) > EXAMPLE_WIDTH]
    assert long == []
