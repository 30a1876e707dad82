"""Every command's ``--help`` at 80 columns: each option name printed whole (rich cuts a cell too narrow with "…"),
every line inside 80 columns; and the help panels' mechanism refusing a name that is no parameter."""
from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from kvcli.cli.app import app
from kvcli.cli.options import help_panels


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
