"""One way to read a file someone else may have made, one way to write a file of a run, and a checkpoint's checks.

A run directory, a teacher run, a converted model's folder or a tokenizer's
files may come from someone else, so each file of one is read as hostile
(docs/reliability.md): a link to /dev/zero would read without end, a FIFO
would block for ever, a link to ~/.ssh/id_rsa or /etc/passwd would copy that
file into a new run. ``read_bytes`` (and ``read_text``, ``copy``) opens the
file once, without following a last link and without blocking on a FIFO,
checks on the open descriptor that it is a regular file, and reads at most
`limit` bytes of it; with `root`, the file's real path (every link followed)
must lie inside `root`'s. Every command that reads or copies a file of a run
(load, distill, convert, serve, resume) goes through here.

Every file a run writes goes through ``write_bytes`` (``write_text``): a
temporary file of a name of its own, created exclusively in the target's
folder (which must lie inside the run), written, flushed to disk and renamed
over the target; no link is followed and no FIFO or device opened, so a
link planted where sedd writes is replaced, never written through. A log
appended to (metrics.jsonl) is opened by ``open_append``: a regular file or
nothing. orbax reads a checkpoint's folder only after ``check_checkpoints``
has walked it (files and folders inside the run, nothing else), and
``write_checksums`` / ``verify_checksums`` keep a SHA-256 of every array a
checkpoint holds beside it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import stat
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx


class UnsafeFile(ValueError):
    """A file that is not read: not a regular file, a link out of its folder, or larger than its bound."""


def read_bytes(path: str | Path, limit: int, root: str | Path | None = None) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes (inside `root`, when given).

    Args:
      path: the file; a symbolic link is followed only when it stays inside `root`
        (without `root`, to any regular file).
      limit: the most bytes read; a larger file (or one that grows past it while
        read) is refused, never cut.
      root: the folder the file belongs to (a run directory); its real path and
        the file's are compared, so no link, of the file or of a folder on the
        way, reaches outside.
    Returns:
      at most `limit` bytes.
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
            raise UnsafeFile(f"{path} is not a regular file ({_what(st.st_mode)}); only regular files are read")
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


def copy(src: str | Path, dst: str | Path, limit: int, root: str | Path | None = None) -> None:
    """Copy the file `src` (read by ``read_bytes``) into `dst`, a new file: never written through a link.

    Raises:
      FileNotFoundError, UnsafeFile: as ``read_bytes``; FileExistsError: dst
        exists (a file or a link), and is left as it is.
    """
    data = read_bytes(src, limit, root)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


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
)
"""What sedd writes at the top of a run directory (``sedd.runs``, ``sedd.train``, a spec run's layouts, ``sedd
convert``'s record and tokenizer folder): no output of a command may land on one of them or under it."""


def write_bytes(path: str | Path, data: bytes, root: str | Path) -> None:
    """Replace `path`, a file of the run directory `root`, by a regular file holding `data`, atomically.

    The bytes go into a temporary file of a name of its own (``.<name>.<random>.tmp``),
    created exclusively (O_CREAT | O_EXCL | O_NOFOLLOW) in path's folder, flushed to
    disk (fsync), then renamed over path, and the folder is flushed: a reader sees
    the old file or the new one, whole. A link, FIFO or device at path (or at any
    other name, such as a planted ``layouts.json.tmp``) is never opened: a link is
    replaced by the file, never written through.

    Args:
      path: the file; its folder's real path must lie inside root's.
      data: its new bytes.
      root: the run directory.
    Raises:
      UnsafeFile: path's folder is outside root (a link on the way leads out).
      OSError: the write failed (a full disk, a folder at path); the temporary file is removed.
    """
    path = Path(path)
    folder = _inside_folder(path.parent, root)
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
            try:
                os.unlink(tmp, dir_fd=fd_dir)
            except OSError:
                pass
            raise
        os.fsync(fd_dir)  # the rename itself on disk
    finally:
        os.close(fd_dir)


def write_text(path: str | Path, text: str, root: str | Path) -> None:
    """``write_bytes`` of UTF-8 text."""
    write_bytes(path, text.encode("utf-8"), root)


def open_append(path: str | Path, root: str | Path):
    """A text file object appending to `path` (created if absent), a regular file of the run directory `root`.

    Opened without following a link (O_NOFOLLOW) and without blocking on a FIFO
    (O_NONBLOCK: a FIFO with no reader fails at once, one with a reader is
    refused by the check on the open descriptor).

    Raises:
      UnsafeFile: path is a link, a FIFO, a device or a folder, or its folder is outside root.
    """
    path = Path(path)
    _inside_folder(path.parent, root)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | NOFOLLOW, 0o644)
    except OSError as e:
        what = _what(os.lstat(path).st_mode) if os.path.lexists(path) else e.strerror
        raise UnsafeFile(f"{path} cannot be written: {what}; sedd appends only to a regular file") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeFile(f"{path} is not a regular file ({_what(st.st_mode)}); sedd appends only to a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "a", encoding="utf-8")


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


def _what(mode: int) -> str:
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
    return "not a regular file"


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
    """Refuse a checkpoint whose arrays have other shapes than `target`'s, from its metadata, before any is read.

    A checkpoint of another network (a teacher whose config.json was changed,
    a run's checkpoints copied into another) used to fail inside orbax's
    restore, after TensorStore had started every read: the reads still
    pending then called back into a closed event loop, a traceback each
    ("Event loop is closed", 1,600 lines under a memory cap, issue 63).

    Args:
      folder: the checkpoint's item folder (``<run>/checkpoints/<step>/state``).
      target: a dict of some of the train state's entries, leaves with `.shape`.
    Raises:
      ValueError: naming the first entry whose saved shape differs. A checkpoint
        whose metadata cannot be read is left to the restore to refuse.
    """
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
    """Walk a run's checkpoints folder once, before orbax reads any of it: files and folders inside the run only.

    orbax opens what a checkpoint's folder holds without a check: a FIFO at
    ``<step>/_CHECKPOINT_METADATA`` blocked the building of the manager itself,
    one at ``state/_METADATA`` or a data file the restore (issue 72). Every entry
    is looked at with lstat (nothing is opened or followed).

    Args:
      folder: ``<run>/checkpoints`` (absent: nothing to check).
      root: the run directory; folder's real path must lie inside it.
      limit: the most entries walked.
    Raises:
      UnsafeFile: one line naming the first entry that is a link, a FIFO, a
        device or a socket, or the folder outside the run, or more than `limit` entries.
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
                    f"{entry.path} is not a regular file or a folder ({_what(mode)}); a checkpoint "
                    "holds only the files and folders sedd wrote, and nothing of it was read"
                )


CHECKSUMS = "sedd_checksums.json"
"""The file beside orbax's in a checkpoint's folder (``<run>/checkpoints/<step>/``): a SHA-256 of each array."""
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


def write_checksums(step_folder: str | Path, state, root: str | Path) -> bool:
    """Write ``CHECKSUMS`` into a checkpoint's folder, after orbax finished it: a SHA-256 of each array of `state`.

    Through ``write_bytes`` (atomic, inside the run). A multi-process job holds
    only its own shards of each array, so it writes none (its checkpoints load
    with the note of ``verify_checksums``).

    Returns:
      whether the file was written.
    """
    if not _addressable(state):
        return False
    write_text(Path(step_folder) / CHECKSUMS, json.dumps(_digests(state), sort_keys=True), root)
    return True


def verify_checksums(step_folder: str | Path, restored, root: str | Path) -> None:
    """Refuse restored arrays whose bytes differ from the SHA-256 saved with them (``write_checksums``).

    A checkpoint saved before sedd wrote checksums (none in its folder) loads,
    with a RuntimeWarning saying it is not verified.

    Args:
      step_folder: ``<run>/checkpoints/<step>``.
      restored: the entries of the train state read from it (all of them, or some).
      root: the run directory.
    Raises:
      ValueError: naming the first array whose bytes, dtype or shape differ, or that has no checksum.
    """
    path = Path(step_folder) / CHECKSUMS
    if not os.path.lexists(path):
        warnings.warn(
            f"{step_folder} has no {CHECKSUMS} (saved before sedd wrote checksums, or by a multi-process "
            "job): its arrays are loaded without a check of their bytes",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    try:
        saved = json.loads(read_text(path, 64 << 20, root))
        want = {name: (entry["dtype"], list(entry["shape"]), entry["sha256"]) for name, entry in saved.items()}
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ValueError(f"{path} is not a checksum file sedd wrote ({type(e).__name__}: {str(e)[:200]})") from None
    if not _addressable(restored):
        return
    got = _digests(restored, {name: w[0] for name, w in want.items()})
    for name, entry in got.items():
        if name not in want:
            raise ValueError(
                f"the array {name} has no checksum in {path}; the checkpoint was changed after it was saved"
            )
        if (entry["dtype"], entry["shape"], entry["sha256"]) != want[name]:
            raise ValueError(
                f"the array {name} differs from the SHA-256 saved with it in {path}: the checkpoint's "
                "files were changed or damaged after it was saved (flipped bits on a disk, a bad copy)"
            )
