"""kvcli's entry point and signals: a Ctrl-C while a command imports torch stops it with exit 130, in a real
process sent a real SIGINT; a reader of stdout that stops early ends the command quietly with exit 141."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
