"""kvcli.outfile: every file a user names for kvcli to write, on real files: a regular file replaced whole through
kvcli's own temporary file, a FIFO and a character device written in place, a symbolic link followed and kept, the
refusals before any write, and a write that fails leaving the old file and no temporary one."""
from __future__ import annotations

import os
import resource
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvcli.errors import BadInputError
from kvcli.outfile import check_output, write_output

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534


def _entries(folder: Path) -> dict[str, tuple[str, bytes | None]]:
    """Each entry of ``folder``: its kind and, for a regular file, its bytes (a link: where it points)."""
    out: dict[str, tuple[str, bytes | None]] = {}
    for p in sorted(folder.iterdir()):
        mode = os.lstat(p).st_mode
        if stat.S_ISLNK(mode):
            out[p.name] = ("link", os.readlink(p).encode())
        elif stat.S_ISREG(mode):
            out[p.name] = ("file", p.read_bytes())
        else:
            out[p.name] = (stat.filemode(mode)[0], None)
    return out


def read_fifo(path: Path) -> tuple[threading.Thread, list[bytes]]:
    """A thread that opens the FIFO ``path`` for reading and keeps what it reads (joined by the caller)."""
    got: list[bytes] = []

    def reader() -> None:
        with open(path, "rb") as f:
            got.append(f.read())

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    return thread, got


def make_null_device(path: Path) -> Path:
    """A character device like /dev/null (major 1, minor 3) at ``path``; skips the test where mknod is refused."""
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod of a character device needs root here")
    return path


def test_a_regular_file_is_replaced_whole_and_keeps_its_mode(tmp_path):
    out = tmp_path / "o.json"
    out.write_text("old\n")
    out.chmod(0o640)
    (tmp_path / "o.json.partial").write_text("the user's own file\n")  # the name a fixed-temporary writer used
    with write_output(out, "--out") as f:
        f.write("new\n")
        (temps,) = [p.name for p in tmp_path.iterdir() if p.name.startswith(".o.json.kvcli-")]
        assert temps.endswith(".tmp") and out.read_text() == "old\n"  # the old file until the end
    assert out.read_text() == "new\n" and stat.S_IMODE(out.stat().st_mode) == 0o640
    assert _entries(tmp_path) == {"o.json": ("file", b"new\n"),
                                  "o.json.partial": ("file", b"the user's own file\n")}


def test_a_missing_file_is_created_with_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        with write_output(tmp_path / "new.bin", "--out", binary=True) as f:
            f.write(b"\x00\x01")
    finally:
        os.umask(old)
    assert (tmp_path / "new.bin").read_bytes() == b"\x00\x01"
    assert stat.S_IMODE((tmp_path / "new.bin").stat().st_mode) == 0o640
    assert _entries(tmp_path) == {"new.bin": ("file", b"\x00\x01")}


def test_a_fifo_is_written_in_place_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    thread, got = read_fifo(fifo)
    with write_output(fifo, "--out") as f:
        f.write("through the pipe\n")
    thread.join(10)
    assert got == [b"through the pipe\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and _entries(tmp_path) == {"f": ("p", None)}


def test_a_symlink_stays_a_link_and_its_target_is_written(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "t.json"
    target.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with write_output(link, "--out") as f:
        f.write("new\n")
    assert os.readlink(link) == str(target) and target.read_text() == "new\n"
    assert _entries(tmp_path / "real") == {"t.json": ("file", b"new\n")}
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "real" / "later.json")
    with write_output(dangling, "--out") as f:
        f.write("made\n")
    assert os.path.islink(dangling) and (tmp_path / "real" / "later.json").read_text() == "made\n"


def test_a_character_device_stays_a_device(tmp_path):
    null = make_null_device(tmp_path / "null")
    with write_output(null, "--out") as f:
        f.write("x" * 5410)
    assert stat.S_ISCHR(os.lstat(null).st_mode) and os.lstat(null).st_rdev == os.makedev(1, 3)
    assert _entries(tmp_path) == {"null": ("c", None)}


@pytest.fixture
def unix_socket(tmp_path) -> Iterator[Path]:
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        yield path


def test_what_cannot_be_written_is_refused_before_any_write(tmp_path, unix_socket):
    (tmp_path / "d").mkdir()
    cases = {tmp_path / "d": f"--out {tmp_path / 'd'} is a directory; give a file name",
             tmp_path / "no" / "o.json": f"--out {tmp_path / 'no' / 'o.json'}: no folder {tmp_path / 'no'} to write "
                                         "it in",
             unix_socket: f"--out {unix_socket} is a socket: kvcli writes regular files, FIFOs and character devices"}
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    cases[loop] = f"--out {loop}: Too many levels of symbolic links"
    before = _entries(tmp_path)
    for path, message in cases.items():
        with pytest.raises(BadInputError) as refused:
            check_output(path, "--out")
        assert str(refused.value) == message
        with pytest.raises(BadInputError), write_output(path, "--out") as f:
            f.write("never")
    assert _entries(tmp_path) == before


def test_a_block_device_is_refused(tmp_path):
    try:
        os.mknod(tmp_path / "blk", stat.S_IFBLK | 0o666, os.makedev(7, 0))
    except PermissionError:
        pytest.skip("mknod of a block device needs root here")
    with pytest.raises(BadInputError, match="is a block device: kvcli writes regular files, FIFOs and character"):
        check_output(tmp_path / "blk", "--out")


def unprivileged(args: list[str], folder: Path) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` in ``folder`` with kvcli importable, where root's permission bypass does not apply: as
    user nobody (setpriv) when this is root (skipped without setpriv), else as this user. ``folder`` and its
    parents must be open to that user (:func:`open_folder`)."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv: a folder's permission bits bind no one here")
        prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([*prefix, sys.executable, *args], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=120)


def give_to_nobody(folder: Path) -> None:
    """Make ``folder`` writable by the user :func:`unprivileged` runs as (nobody, when this is root)."""
    if os.geteuid() == 0:
        os.chown(folder, NOBODY, -1)


def test_a_read_only_folder_and_a_read_only_file_are_refused_before_any_write(open_folder):
    locked = open_folder / "ro"
    locked.mkdir()
    (open_folder / "mine.json").write_text("keep\n")
    (open_folder / "mine.json").chmod(0o444)
    give_to_nobody(open_folder)  # who runs the check may write open_folder itself, but not ro/ or mine.json
    locked.chmod(0o555)
    code = ("from kvcli.errors import BadInputError\nfrom kvcli.outfile import check_output\n"
            "for p in ('ro/o.json', 'mine.json', 'fresh.json'):\n"
            "    try:\n        check_output(p, '--out'); print('ok', p)\n"
            "    except BadInputError as e:\n        print(e)\n")
    done = unprivileged(["-c", code], open_folder)
    assert done.stdout.splitlines() == ["--out ro/o.json: the folder " + str(locked) + " is not writable",
                                        "--out mine.json: not writable", "ok fresh.json"], done.stderr
    assert _entries(locked) == {} and (open_folder / "mine.json").read_text() == "keep\n"


_FULL_DISK = """
import resource, signal, sys
from kvcli.outfile import write_output
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))  # files of this process stop at 100 bytes: EFBIG past it
try:
    with write_output(sys.argv[1], "--out") as f:
        f.write("y" * 1000)
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_a_write_that_fails_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    out = tmp_path / "p.png"
    out.write_bytes(b"the old figure")
    done = subprocess.run([sys.executable, "-c", _FULL_DISK, str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == (f"BadInputError --out {out}: cannot write: File too large; the file was left as "
                                   "it was")
    assert _entries(tmp_path) == {"p.png": ("file", b"the old figure")}
    assert resource.getrlimit(resource.RLIMIT_FSIZE)[0] == resource.RLIM_INFINITY  # only the child was limited


def test_an_error_in_the_block_or_ctrl_c_keeps_the_old_file(tmp_path):
    out = tmp_path / "o.jsonl"
    out.write_text("old\n")
    for error in (ValueError("a bad record"), KeyboardInterrupt()):
        with pytest.raises(type(error)), write_output(out, "--out") as f:
            f.write("half")
            raise error
        assert _entries(tmp_path) == {"o.jsonl": ("file", b"old\n")}


def test_an_os_error_about_another_file_is_not_taken_for_the_writes(tmp_path):
    with pytest.raises(FileNotFoundError), write_output(tmp_path / "o", "--out") as f:
        f.write("x")
        (tmp_path / "missing-input").read_text()  # the block's own read fails
    assert _entries(tmp_path) == {}

