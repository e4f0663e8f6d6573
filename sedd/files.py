"""One way to read a file someone else may have made, one way to write a file of a run, and a checkpoint's checks.

A run directory, a teacher run, a converted model's folder or a tokenizer's
files may come from someone else, so each file of one is read as hostile
(docs/reliability.md): a link to /dev/zero would read without end, a FIFO
would block for ever, a link to ~/.ssh/id_rsa would copy that file into a new
run. Every command that reads or copies a file of a run goes through
``read_bytes``; every file a run writes through ``write_bytes`` (atomic, never
through a link) or ``open_append``; a write the disk refuses is a
``DiskError``, one line naming the path and what to do. orbax reads a
checkpoint's folder only after ``check_checkpoints`` has walked it, and
``save_checkpoint`` / ``verify_checksums`` keep a SHA-256 of every array a
checkpoint holds in its step metadata.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import secrets
import shutil
import stat
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx


class UnsafeFile(ValueError):
    """A file that is not read: not a regular file, a link out of its folder, or larger than its bound."""


class DiskError(OSError):
    """A file or folder of a run that the disk would not take: one line naming the path and what to do.

    An OSError with the errno it stands for, so callers that keep going without the file still catch it.
    """

    def __str__(self) -> str:
        return self.strerror


DO = {
    errno.ENOSPC: "the disk is full (no space left on device). Free some space, then run the same command",
    errno.EDQUOT: "the disk quota is used up. Free some space, then run the same command",
    errno.EROFS: "the file system is read-only. Run on a writable disk (copy the run there, or give another --workdir)",
    errno.EACCES: "permission denied. Run as the folder's owner, or give a folder of yours",
    errno.EPERM: "the operation is not permitted here. Give a folder of yours",
    errno.ENOTDIR: "a file stands where a folder goes. Move it away, or give another path",
    errno.EEXIST: "a file stands where a folder goes. Move it away, or give another path",
    errno.EISDIR: "a folder stands where a file goes. Move it away, or give another path",
}
"""What to do about each errno a run's files meet (``disk_error``); any other is named by its own words."""


def disk_error(e: OSError, path: str | Path, what: str = "written") -> DiskError:
    """`e`, raised while `path` (not a temporary file's) was `what` ("written", "made", "locked"), as a
    ``DiskError`` of one line naming the failure and what to do."""
    if isinstance(e, DiskError):
        return e
    do = DO.get(e.errno) or f"{e.strerror or e}"
    return DiskError(e.errno, f"{path} could not be {what}: {do}")


def read_bytes(path: str | Path, limit: int, root: str | Path | None = None) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes (inside `root`, when given).

    The file is opened once, without following a last link or blocking on a
    FIFO, and checked on the open descriptor; a larger file (or one that grows
    while read) is refused, never cut. With `root` (a run directory) the
    file's real path must lie inside root's, so no link on the way reaches out.

    Raises:
      FileNotFoundError: there is no such file.
      UnsafeFile: one line naming the file and what it is instead.
    """
    path = Path(path)
    real = _inside(path, root)
    try:  # O_NONBLOCK: a FIFO opens at once (then fstat refuses it); O_NOFOLLOW: no link swapped in meanwhile
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UnsafeFile(f"{path} cannot be read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)  # before a file object: io refuses a folder with IsADirectoryError
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path} is not a regular file ({what_is(st.st_mode)}); only regular files are read")
        if st.st_size > limit:
            raise UnsafeFile(f"{path} holds {st.st_size} bytes; at most {limit} are read")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise UnsafeFile(f"{path} grew past {limit} bytes while it was read; at most {limit} are read")
    return data


def read_text(path: str | Path, limit: int, root: str | Path | None = None) -> str:
    """``read_bytes`` as UTF-8 text (UnicodeDecodeError, a ValueError, for bytes that are not)."""
    return read_bytes(path, limit, root).decode("utf-8")


@contextlib.contextmanager
def disk_errors(path: str | Path, what: str = "written"):
    """The block's OSError as ``disk_error(e, path, what)``: one line naming `path` and what to do."""
    try:
        yield
    except OSError as e:
        raise disk_error(e, path, what) from None


def check_folder(path: Path, done: str = "nothing was touched") -> None:
    """Refuse (UnsafeFile, one line) a folder of a run that is a file, a FIFO or a device (mkdir's
    FileExistsError came later, as a traceback), saying what to do and, `done`, what was not."""
    if os.path.lexists(path) and not stat.S_ISDIR(mode := os.lstat(path).st_mode):
        raise UnsafeFile(
            f"{path} is {what_is(mode)}, where the run keeps a folder of its own; move it away (or rename it), "
            f"then run again; {done}"
        )


def read_json(path: str | Path, limit: int, root: str | Path | None = None):
    """``read_text`` parsed as JSON; a file that is not JSON, or nested past Python's recursion limit, is a
    ValueError naming the file, in one line."""
    try:
        return json.loads(read_text(path, limit, root))
    except (UnicodeDecodeError, RecursionError, ValueError) as e:
        if isinstance(e, UnsafeFile):
            raise
        raise ValueError(f"{path} is not JSON: {type(e).__name__}: {' '.join(str(e).split())[:200]}") from None


def copy(src: str | Path, dst: str | Path, limit: int, root: str | Path | None = None) -> None:
    """Copy the file `src` (read by ``read_bytes``) into `dst`, a new file: never written through a link.

    Raises FileExistsError where dst exists (left as it is); DiskError leaves no part of dst.
    """
    data = read_bytes(src, limit, root)
    try:
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except FileExistsError:
        raise
    except OSError as e:
        raise disk_error(e, dst) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(dst)
        raise disk_error(e, dst) from None


NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
RUN_NAMES = (
    "config.json",
    "tokenizer.json",
    "metrics.jsonl",
    "checkpoints",
    "checkpoints_unreadable",
    "tensorboard",
    "layouts.json",
    "converted.json",
    "gpt2",
    "sedd.lock",  # sedd.lock.LOCK
)
"""What sedd writes at the top of a run directory (``sedd.runs``, ``sedd.train``, a spec run's layouts, ``sedd
convert``'s record and tokenizer folder): no output of a command may land on one of them or under it."""


def write_bytes(path: str | Path, data: bytes, root: str | Path) -> None:
    """Replace `path`, a file of the run directory `root`, by a regular file holding `data`, atomically.

    The bytes go into a temporary file of a name of its own, created
    exclusively (O_CREAT | O_EXCL | O_NOFOLLOW) in path's folder, flushed to
    disk, then renamed over path, and the folder is flushed: a reader sees the
    old file or the new one, whole. A link, FIFO or device at path (or a
    planted ``layouts.json.tmp``) is never opened: a link is replaced, never
    written through. UnsafeFile where path's folder is outside root.
    """
    path = Path(path)
    folder = _inside_folder(path.parent, root)
    with disk_errors(path):
        fd_dir = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | NOFOLLOW)
    try:
        tmp = f".{path.name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644, dir_fd=fd_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path.name, src_dir_fd=fd_dir, dst_dir_fd=fd_dir)  # a rename follows no link
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd_dir)
            raise
        os.fsync(fd_dir)  # the rename itself on disk
    except OSError as e:  # a full or read-only disk, a folder at path: named by the target, not the temporary
        raise disk_error(e, path) from None
    finally:
        os.close(fd_dir)


def write_text(path: str | Path, text: str, root: str | Path) -> None:
    """``write_bytes`` of UTF-8 text."""
    write_bytes(path, text.encode("utf-8"), root)


def open_append(path: str | Path, root: str | Path):
    """A text file object appending to `path` (created if absent), a regular file of the run directory `root`.

    Opened without following a link or blocking on a FIFO, and checked on the
    descriptor. A file with other names (a hard link out of the run, a run
    copied with `cp -al`) is first replaced by a copy of its bytes, so the
    lines go to the run's own file, never into the other name's.
    """
    path = Path(path)
    folder = _inside_folder(path.parent, root)
    for _ in range(2):  # a second time after a file of several names was replaced by a copy
        fd = open_regular(path, os.O_WRONLY | os.O_APPEND, "sedd appends only to a regular file")
        if os.fstat(fd).st_nlink == 1:
            os.set_blocking(fd, True)
            return os.fdopen(fd, "a", encoding="utf-8")
        os.close(fd)
        _unshare(path, folder)
    raise UnsafeFile(f"{path} keeps gaining other names (hard links) while sedd replaces it; nothing was appended")


def open_regular(path: Path, flags: int, refusal: str, what: str = "written") -> int:
    """A descriptor of `path` opened (created if absent) with `flags`, never through a link or blocking on a FIFO;
    UnsafeFile "`path` is <what it is>; `refusal`" unless it is a regular file, checked on the descriptor too."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NONBLOCK | NOFOLLOW, 0o644)
    except OSError as e:
        mode = os.lstat(path).st_mode if os.path.lexists(path) else stat.S_IFREG
        if not stat.S_ISREG(mode):
            raise UnsafeFile(f"{path} is {what_is(mode)}; {refusal}") from None
        raise disk_error(e, path, what) from None
    if not stat.S_ISREG(mode := os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafeFile(f"{path} is {what_is(mode)}; {refusal}")
    return fd


def _unshare(path: Path, folder: Path) -> None:
    """Replace the regular file `path` (of several hard links) by a copy of its bytes, atomically, in `folder`."""
    tmp = folder / f".{path.name}.{secrets.token_hex(6)}.tmp"
    try:
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | NOFOLLOW), "rb") as src:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644), "wb") as dst:
                shutil.copyfileobj(src, dst)
                dst.flush()
                os.fsync(dst.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise disk_error(e, path) from None


def _inside_folder(folder: Path, root: str | Path) -> Path:
    """folder's real path, refused unless it is root's real path or lies inside it."""
    real, home = Path(folder).resolve(), Path(root).resolve()
    if real != home and home not in real.parents:
        raise UnsafeFile(f"{folder} leads to {real}, outside {root}; a run's files are read and written only inside it")
    return real


def _inside(path: Path, root: str | Path | None) -> Path:
    """path's real path (links followed), refused when a link leads out of root's real path."""
    if root is None:
        return path
    try:
        real = path.resolve(strict=True)
    except FileNotFoundError:
        raise
    except (OSError, RuntimeError) as e:  # a link loop
        raise UnsafeFile(f"{path} cannot be read: {e}") from None
    home = Path(root).resolve()
    if real != home and home not in real.parents:
        raise UnsafeFile(f"{path} is a link to {real}, outside {root}; a run's files are read only inside it")
    return real


def what_is(mode: int) -> str:
    """A file type in words."""
    for test, word in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return word
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def checkpoint_tree(folder: str | Path):
    """The tree of a checkpoint's item folder as its metadata names it (nested dicts, a leaf's metadata at each
    array), nothing read; None where the metadata cannot be read (the restore then names the problem)."""
    log = logging.getLogger("absl")  # orbax warns that the item folder has no step metadata: it is the step's
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        saved = ocp.PyTreeCheckpointer().metadata(Path(folder))
        return getattr(getattr(saved, "item_metadata", saved), "tree", saved)
    except Exception:  # noqa: BLE001  orbax raises many types; the restore names the problem
        return None
    finally:
        log.setLevel(level)


OLD_LAYERS = "blocks"
"""What checkpoints saved before 2026-12-06 name the network's layers (``DDiT.layers``; the original's name)."""


def holds_key(tree, key: str) -> bool:
    """Whether a checkpoint's tree (``files.checkpoint_tree``) holds a mapping with `key` anywhere."""
    if isinstance(tree, dict):
        return key in tree or any(holds_key(v, key) for v in tree.values())
    return False


def renamed(tree, old: str, new: str):
    """`tree` with every mapping key `old` named `new` (nnx States, dicts, optax's tuples of states), leaves as
    they are: a checkpoint saved under another name of a module restores into today's network."""
    if isinstance(tree, nnx.State):  # its own mapping, whose inner levels are plain dicts
        return nnx.State(renamed(dict(tree.raw_mapping), old, new))
    if isinstance(tree, dict):
        return type(tree)({(new if k == old else k): renamed(v, old, new) for k, v in tree.items()})
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):
        return type(tree)(*(renamed(v, old, new) for v in tree))
    if isinstance(tree, (list, tuple)):
        return type(tree)(renamed(v, old, new) for v in tree)
    return tree


def check_checkpoint_shapes(folder: str | Path, target) -> None:
    """Refuse (ValueError naming the first entry) a checkpoint whose arrays have other shapes than `target`'s (a
    dict of some of the train state's entries, leaves with `.shape`).

    Read from the metadata of the item folder (``<run>/checkpoints/<step>/state``) before any array is: a
    checkpoint of another network failed inside orbax's restore after TensorStore had started every read, whose
    pending reads then each printed a traceback (issue 63). Metadata that cannot be read is left to the restore.
    """
    if not (Path(folder) / "_METADATA").is_file():  # orbax then names a pytree structure over many lines
        raise ValueError(
            f"{Path(folder) / '_METADATA'} is missing: orbax writes it into every checkpoint, so this one is "
            "incomplete or was changed after it was saved"
        )
    tree = checkpoint_tree(folder)
    if tree is None:
        return
    for path, leaf in jax.tree_util.tree_leaves_with_path(target):
        node = tree
        try:
            for k in path:  # DictKey(0) or GetAttrKey("value") in the target, "0" and "value" in the metadata
                name = getattr(k, "key", getattr(k, "name", getattr(k, "idx", None)))
                node = node[name] if name in node else node[str(name)]
        except (KeyError, IndexError, TypeError):
            continue  # an entry the checkpoint lacks: orbax's restore names it
        shape = getattr(node, "shape", None)
        if shape is not None and tuple(shape) != tuple(leaf.shape):
            raise ValueError(
                f"{jax.tree_util.keystr(path)} has shape {tuple(shape)} in the checkpoint and "
                f"{tuple(leaf.shape)} in the config's network: the checkpoint is another network's."
            )


MAX_CHECKPOINT_ENTRIES = 1 << 20  # files and folders under a run's checkpoints/ (a tiny run's checkpoint: ~25)


def check_checkpoints(folder: str | Path, root: str | Path, limit: int = MAX_CHECKPOINT_ENTRIES) -> None:
    """Walk a run's checkpoints folder (absent: nothing to check) with lstat, before orbax reads any of it.

    orbax opens what a checkpoint's folder holds without a check: a FIFO in it
    blocked the manager's building or the restore (issue 72). UnsafeFile, one
    line, names the first entry that is not a regular file or a folder, a
    folder outside the run `root`, or more than `limit` entries.
    """
    folder = Path(folder)
    if not os.path.lexists(folder):
        return
    _inside_folder(folder, root)
    todo, seen = [folder], 0
    while todo:
        for entry in os.scandir(todo.pop()):
            seen += 1
            if seen > limit:
                raise UnsafeFile(
                    f"{folder} holds more than {limit:,} files and folders; a run's checkpoints are "
                    "fewer (move some away)"
                )
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                todo.append(Path(entry.path))
            elif not stat.S_ISREG(mode):
                raise UnsafeFile(
                    f"{entry.path} is not a regular file or a folder ({what_is(mode)}); a checkpoint "
                    "holds only the files and folders sedd wrote, and nothing of it was read"
                )


CHECKSUMS = "sedd_checksums.json"
"""The file beside orbax's in a checkpoint's folder (``<run>/checkpoints/<step>/``) where issue 72's sedd kept a
SHA-256 of each array; read for its checkpoints (since issue 83 they are in the step metadata: ``SAVED_WITH``)."""
HASH_THREADS = max(1, min(8, os.cpu_count() or 1))  # hashlib lets go of the GIL: arrays are hashed side by side


def leaf_name(path) -> str:
    """An array's place in a train state as a name that does not depend on the containers that hold it.

    ``['ema']['layers'][0]['attn_qkv']['kernel'].value`` (an nnx State) and the
    same entry of plain dicts (``sedd convert`` saves those) are both
    ``ema/layers/0/attn_qkv/kernel``.
    """
    names = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    if names and names[-1] == "value" and isinstance(path[-1], jax.tree_util.GetAttrKey):
        names.pop()
    return "/".join(names)


def _digests(tree, dtypes: dict | None = None) -> dict[str, dict]:
    """{leaf_name: {"dtype", "shape", "sha256"}} of every array of a pytree, hashed from its bytes on this host.

    With `dtypes` ({leaf_name: dtype name}), an array of another dtype is cast to it first (orbax casts
    a restored array to its target's dtype; a cast back from a wider float is exact).
    """
    leaves = [(leaf_name(p), x) for p, x in jax.tree_util.tree_leaves_with_path(tree)]

    def one(item):
        name, x = item
        a = np.asarray(x)
        if dtypes and name in dtypes and a.dtype.name != dtypes[name]:
            a = a.astype(jax.numpy.dtype(dtypes[name]))
        flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        return name, {"dtype": a.dtype.name, "shape": list(a.shape), "sha256": hashlib.sha256(flat).hexdigest()}

    with ThreadPoolExecutor(HASH_THREADS) as pool:
        return dict(pool.map(one, leaves))


def _addressable(tree) -> bool:
    """Whether this process holds every element of every array (one process: always)."""
    return all(getattr(x, "is_fully_addressable", True) for x in jax.tree.leaves(tree))


SAVED_WITH = "sedd_checksums"
"""The key of a checkpoint's step metadata (orbax's ``_CHECKPOINT_METADATA``, its custom_metadata) holding the
SHA-256 of each array since issue 83: written with the checkpoint, in the same rename, so that no checkpoint
exists without them, and none loses them by a file deleted beside it."""
STEP_METADATA = "_CHECKPOINT_METADATA"  # orbax writes it into every step's folder (orbax 0.12 and later)
MULTI_PROCESS = "not kept: a multi-process job holds only its shards of each array"


def save_checkpoint(manager: ocp.CheckpointManager, step: int, state) -> None:
    """orbax's synchronous save of the train state `state` at `step`, with {SAVED_WITH: {leaf_name: {"dtype",
    "shape", "sha256"}}} in its step metadata, hashed from its bytes on this host before orbax writes it (verified
    at every restore: ``verify_checksums``). A multi-process job holds only its own shards of each array, so it
    keeps none ({SAVED_WITH: MULTI_PROCESS}; its checkpoints load with a note). A save that fails removes orbax's
    temporary folder of `step` (``<step>.orbax-checkpoint-tmp-*``, left behind by a disk full inside orbax's write)."""
    try:
        with _reports_held():
            custom = {SAVED_WITH: _digests(state) if _addressable(state) else MULTI_PROCESS}
            args = ocp.args.Composite(state=ocp.args.PyTreeSave(state))
            manager.save(step, args=args, force=True, custom_metadata=custom)
    except BaseException:  # a full disk inside orbax's write: its partial copy, never read as a checkpoint, goes
        partial = f"{Path(manager.directory) / str(step)}.orbax-checkpoint-tmp"
        # and orbax's writers that fail after the save has raised (an error log of a thread, an asyncio task's
        # exception never retrieved) report it no more: the exception raised tells it once
        for name in ("absl", "asyncio"):
            logging.getLogger(name).addFilter(lambda r: r.levelno < logging.ERROR or partial not in r.getMessage())
        hook = sys.excepthook  # and TensorStore's callbacks into orbax's closed event loop (printed from C++)
        sys.excepthook = lambda *exc: None if _closed_loop(*exc) else hook(*exc)
        _remove_settled(Path(manager.directory), f"{step}.orbax-checkpoint-tmp*")
        raise


def _remove_settled(folder: Path, pattern: str, quiet: float = 0.5, limit: float = 10.0) -> None:
    """Remove the folders `pattern` names in `folder` until none has reappeared for `quiet` seconds (at most
    `limit`): writes of a failed save still in flight (TensorStore's own threads) create them again."""
    start = last = time.monotonic()
    while (now := time.monotonic()) - last < quiet and now - start < limit:
        for tmp in folder.glob(pattern):
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
                last = time.monotonic()
        time.sleep(0.02)


def _closed_loop(kind, exc, tb) -> bool:
    """An exception TensorStore prints from a thread of its own (``sys.excepthook``, as C's PyErr_Print does) when a
    write of a failed save completes after orbax closed the event loop waiting for it."""
    return kind is RuntimeError and str(exc) == "Event loop is closed"


@contextlib.contextmanager
def _reports_held():
    """Exceptions of threads (Python's and TensorStore's) and absl's errors while the block runs, held back: shown
    after it if it succeeds, dropped if it fails, whose exception tells the failure once (a disk full inside orbax's
    write printed a traceback of each writer thread and an error log above the one-line refusal)."""
    held, hook, log, excepthook = [], threading.excepthook, logging.getLogger("absl"), sys.excepthook

    def hold(record) -> bool:
        if record.levelno < logging.ERROR:
            return True
        held.append(record)
        return False

    threading.excepthook, sys.excepthook = held.append, lambda *exc: held.append(exc)
    log.addFilter(hold)
    try:
        yield
        for report in held:
            if isinstance(report, logging.LogRecord):
                log.handle(report)
            else:
                excepthook(*report) if isinstance(report, tuple) else hook(report)
    finally:
        threading.excepthook, sys.excepthook = hook, excepthook
        log.removeFilter(hold)


def verify_checksums(step_folder: str | Path, restored, root: str | Path) -> None:
    """Refuse (ValueError naming the first array) `restored` entries (all of a train state's, or some) whose bytes
    differ from the SHA-256 saved in `step_folder` (``<run>/checkpoints/<step>`` of the run directory `root`).

    Where the checksums are is told by the step metadata (``STEP_METADATA``, which orbax writes into every
    checkpoint; one without it is refused): ``SAVED_WITH`` in its custom metadata (since issue 83), else
    ``CHECKSUMS`` beside it (issue 72's); neither, or ``MULTI_PROCESS``: loaded with a RuntimeWarning.
    """
    step_folder = Path(step_folder)
    meta = step_folder / STEP_METADATA
    if not os.path.lexists(meta):
        raise ValueError(
            f"{meta} is missing: orbax writes it into every checkpoint (sedd keeps the arrays' SHA-256 there), "
            "so this one was changed after it was saved"
        )
    custom = read_json(meta, 64 << 20, root)
    custom = custom.get("custom_metadata") if isinstance(custom, dict) else None
    saved = custom.get(SAVED_WITH) if isinstance(custom, dict) else None
    where, path = meta, step_folder / CHECKSUMS
    if saved is None and os.path.lexists(path):  # issue 72's checkpoints: a file beside orbax's
        saved, where = read_json(path, 64 << 20, root), path
    if saved is None or saved == MULTI_PROCESS:
        warnings.warn(
            f"{step_folder} holds no SHA-256 of its arrays (saved before sedd wrote checksums, or by a "
            "multi-process job): its arrays are loaded without a check of their bytes",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    try:
        want = {name: (entry["dtype"], list(entry["shape"]), entry["sha256"]) for name, entry in saved.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"{where} holds no checksums sedd wrote ({type(e).__name__}: {str(e)[:200]})") from None
    if not _addressable(restored):
        return
    got = _digests(restored, {name: w[0] for name, w in want.items()})
    for name, entry in got.items():
        if name not in want:
            raise ValueError(
                f"the array {name} has no checksum in {where}; the checkpoint was changed after it was saved"
            )
        if (entry["dtype"], entry["shape"], entry["sha256"]) != want[name]:
            raise ValueError(
                f"the array {name} differs from the SHA-256 saved with it in {where}: the checkpoint's "
                "files were changed or damaged after it was saved (flipped bits on a disk, a bad copy)"
            )
