"""One writer of a run directory at a time: its lock, and the folder made for writing.

Two `sedd train` of one run started together interleaved their checkpoints and metrics (one failed at its
first save with orbax's rename error and left a temporary folder; metrics.jsonl held steps 5 and 10 twice,
issue 83). The writer of a run (`sedd train`, `sedd distill`) holds ``LOCK`` at the top of it from its first
write to its end (``writing``): an ``fcntl.flock``, which the kernel drops with its process, so a killed run
leaves nothing that blocks the next. Readers (`sedd sample`, `eval`, `serve`) take no lock; a spec run's
layouts.json, which they write, is renamed into place whole (``sedd.files.write_bytes``), a cache any of them
may rewrite.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import time
from pathlib import Path

from sedd import files

LOCK = "sedd.lock"
"""The file at the top of a run directory that its writer holds locked (``hold``), naming itself in it."""

_HELD: set[str] = set()  # the real paths of the run folders this process holds


class Locked(ValueError):
    """A run directory another process is writing (its ``LOCK`` is held): refused, naming the holder."""


@contextlib.contextmanager
def hold(workdir: str | Path):
    """Hold the run directory `workdir`'s lock while the block runs: one writer of a run at a time.

    ``fcntl.flock`` on ``workdir/LOCK`` (created if absent, never through a link, never a FIFO), taken without
    waiting; the holder writes who it is into the file (process id, host, start time, command) and removes the
    file as it lets go. The kernel drops a flock with its last descriptor, so a process killed by SIGKILL leaves
    at most the file, unlocked, which blocks nothing. Taken again by the process that holds it (``sedd distill``
    around ``sedd.train.train``), it is the same lock. Raises Locked (another process holds it: one line naming
    it), UnsafeFile (LOCK is a link, a FIFO or a folder) or DiskError (a full or read-only disk).
    """
    key = os.path.realpath(workdir)
    if key in _HELD:
        yield
        return
    path = Path(workdir) / LOCK
    fd = _take(path, workdir)
    try:
        holder = (
            f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')} "
            f"({' '.join(sys.argv)[:300]})"
        )
        with files.disk_errors(path):
            os.ftruncate(fd, 0)
            os.pwrite(fd, (holder + "\n").encode(), 0)
        _HELD.add(key)
        try:
            yield
        finally:
            _HELD.discard(key)
    finally:
        with contextlib.suppress(OSError):  # while held: whoever opened this file since finds it gone (_take)
            os.unlink(path)
        os.close(fd)  # the flock ends with it


def _take(path: Path, workdir) -> int:
    """A descriptor of the lock file `path`, flocked; the file it locks is the one at `path` now (a holder
    removes the file as it lets go, so a file opened before that is no longer the lock: opened again)."""
    for _ in range(100):
        fd = files.open_regular(path, os.O_RDWR, "a run's lock is a regular file sedd makes (remove it)", "locked")
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = " ".join(os.pread(fd, 1000, 0).decode("utf-8", "replace").split()) or "another process"
                raise Locked(
                    f"{workdir} is being written by {holder}; two writers of one run would interleave its "
                    "checkpoints and metrics. Wait for that one to end (or stop it: its lock ends with it), or "
                    "give another --workdir"
                ) from None
            with contextlib.suppress(FileNotFoundError):
                if os.lstat(path).st_ino == os.fstat(fd).st_ino:
                    return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise Locked(f"{workdir}: its lock {path} keeps changing; another process is taking it")


@contextlib.contextmanager
def writing(workdir: str | Path, first: tuple[str, ...] = ()):
    """Make the run directory `workdir` (with its parents) and ``hold`` its lock while the block writes it.

    `first` are the files a run writes before anything else (its config.json, tokenizer.json): when the block
    fails in a directory this call made that holds nothing else, they and the directory are removed, so a new run
    stopped by a full or read-only disk leaves nothing half-made. Raises ``hold``'s errors, and DiskError where
    the folder cannot be made (a file on the way).
    """
    workdir = Path(workdir)
    made = not os.path.lexists(workdir)
    with files.disk_errors(workdir, "made"):
        workdir.mkdir(parents=True, exist_ok=True)
    try:
        with hold(workdir):
            try:
                yield
            except BaseException:  # still holding the lock: no other writer has written here
                with contextlib.suppress(OSError):
                    if made and {p.name for p in workdir.iterdir()} <= {LOCK, *first}:
                        for name in first:
                            with contextlib.suppress(FileNotFoundError):
                                (workdir / name).unlink()
                raise
    except BaseException:
        if made:
            with contextlib.suppress(OSError):  # empty once the lock is gone; a folder another holds is not
                workdir.rmdir()
        raise
