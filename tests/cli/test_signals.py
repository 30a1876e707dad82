"""kvcli's entry point and signals: a Ctrl-C while a command imports torch stops it with exit 130, in a real
process sent a real SIGINT; a reader of stdout that stops early ends the command quietly with exit 141."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

ROOT = Path(__file__).resolve().parents[2]

# Runs ``python -m kvcli ARGS`` with an import hook that sends this process SIGINT at the first import torch makes
# (numpy, when torch's C++ start-up is the first to import it) or, when numpy is loaded already, as torch's own
# import begins: a Ctrl-C that lands while torch imports.
_CTRL_C_DURING_TORCH_IMPORT = """
import os, runpy, signal, sys

class CtrlC:
    sent = False

    def find_spec(self, name, path=None, target=None):
        torch_starts = name == "torch" and "numpy" in sys.modules
        torch_imports_numpy = name.split(".")[0] == "numpy" and "torch" in sys.modules
        if not CtrlC.sent and (torch_starts or torch_imports_numpy):
            CtrlC.sent = True
            sys.stderr.write(f"test: SIGINT while importing {name}\\n")
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["kvcli", *sys.argv[1:]]
runpy.run_module("kvcli", run_name="__main__")
"""


def test_ctrl_c_while_warm_imports_torch_exits_130_having_written_nothing(tmp_path, make_server):
    url = make_server()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the first prompt, long enough for a chunk or two\nand a second one\n")
    proc = subprocess.run([sys.executable, "-c", _CTRL_C_DURING_TORCH_IMPORT, "warm", str(prompts), "--chunk-size",
                           "4", "--redis-url", url], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert "test: SIGINT while importing" in proc.stderr
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "kvcli: interrupted"
    assert "Traceback" not in proc.stderr
    assert redis.Redis.from_url(url).dbsize() == 0  # stopped before it wrote anything


def test_a_reader_that_stops_early_ends_the_command_quietly_with_141():
    """``kvcli stats ... | head``: stdout's reading end is closed before the table is written; the command ends as
    SIGPIPE would end it (128 + 13), saying nothing (rich's own default was exit 1, read as a kvcli error)."""
    proc = subprocess.Popen([sys.executable, "-m", "kvcli", "stats", "sample_traces/chat_shared_system.jsonl"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the command has imported what it needs, let alone printed
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (141, b"")


def _default_sigint() -> None:
    """In the child before it runs Python: SIGINT as a terminal's Ctrl-C leaves it. A shell without job control
    starts a command run in the background (``cmd &``, as a CI runner may) with SIGINT ignored, which the child
    inherits, and Python then installs no KeyboardInterrupt handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _entry_point() -> str:
    """The ``kvcli`` console script's entry point as pyproject.toml declares it (``module:function``)."""
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["kvcli"]


# The console script as pip writes it (``from MODULE import FUNCTION; sys.exit(FUNCTION())``), with an import hook
# that sends this process SIGINT when the module named by argv[1] starts to import: a Ctrl-C while kvcli is still
# importing itself.
_SCRIPT_CTRL_C_AT_IMPORT = """
import importlib, os, signal, sys

TARGET = sys.argv[1]

class CtrlC:
    sent = False

    def find_spec(self, name, path=None, target=None):
        if not CtrlC.sent and name == TARGET:
            CtrlC.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
module, function = sys.argv[2].split(":")
sys.argv = ["kvcli", "--help"]
entry = getattr(importlib.import_module(module), function)
sys.exit(entry())
"""


@pytest.mark.parametrize("module", ["typer", "rich.console", "kvcli.cli.options", "kvcli.replay.events"])
def test_ctrl_c_while_kvcli_imports_itself_exits_130_in_one_line(module):
    proc = subprocess.run([sys.executable, "-c", _SCRIPT_CTRL_C_AT_IMPORT, module, _entry_point()], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, preexec_fn=_default_sigint)
    assert (proc.returncode, proc.stderr, proc.stdout) == (130, "kvcli: interrupted\n", "")


# The console script once the interpreter has started (its own start-up, site and .pth files, comes before any of
# kvcli's code): "ready" on stdout, then what pip's script does.
_SCRIPT_AFTER_START_UP = """
import importlib, sys
module, function = sys.argv[1].split(":")
sys.argv = ["kvcli", "--help"]
print("ready", flush=True)
sys.exit(getattr(importlib.import_module(module), function)())
"""


@pytest.mark.parametrize("delay", [0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.0, 1.3])
def test_ctrl_c_at_any_moment_of_start_up_is_never_a_traceback(delay):
    """``kvcli --help`` sent a real SIGINT ``delay`` seconds after the interpreter started: it has either finished
    (exit 0) or stops with one line, wherever the signal lands (importing kvcli, typer or rich, building the help;
    not in the script's own ``import`` statement, the milliseconds before kvcli's first line runs). Stopped means
    exit 130, or ended by the SIGINT itself (-2 here, 130 in a shell): CPython ends a process that way once a
    KeyboardInterrupt went through an ``eval`` (typer evaluates kvcli's annotations), whatever its exit code."""
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT_AFTER_START_UP, _entry_point()], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    assert proc.stdout.readline() == "ready\n"
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert "Traceback" not in err and proc.returncode in (0, 130, -signal.SIGINT), (proc.returncode, err)
    if proc.returncode and "Usage: kvcli" in out and not err:
        assert proc.returncode == -signal.SIGINT  # the help printed whole, the signal landed in the teardown
    elif proc.returncode:
        assert err.splitlines()[-1] == "kvcli: interrupted"
    else:
        assert "Usage: kvcli" in out
