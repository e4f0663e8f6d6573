"""The `code` corpus: source files, one a document, byte for byte; by default the Python standard library.

Every machine that runs sedd has a code corpus already: the running
interpreter's standard library (`sysconfig.get_paths()["stdlib"]`, the
Python Software Foundation's licence), about 1,800 `.py` files on CPython
3.11, of which about 1,050 are tests. Nothing is downloaded. `data.path`
points the builder at any other folder of source files, in any language
(`data.code.glob` names them, e.g. "*.rs").

Unlike the text builders, a document is a file exactly as it is: no
whitespace is stripped, so indentation, blank lines and the final newline
round-trip byte for byte. Validation is chosen by file, from a fixed hash
of its path under the corpus's folder, so no validation file is ever seen
in training (a cut by line would put half a module on each side). The
preparation records the interpreter's version and a hash of the file list
(`sedd_manifest.json`), since the corpus differs from one Python to another.
"""

from __future__ import annotations

import hashlib
import platform
import stat
import sysconfig
import warnings
from pathlib import Path

from sedd.data.builders import VAL_FRACTION, TextFiles, find, register
from sedd.data.records import Utf8Errors, line_chunks

TEST_DIRS = ("test", "tests", "idle_test")  # folders of tests in CPython's Lib/ (and most projects)
SKIPPED_DIRS = ("site-packages", "dist-packages", "__pycache__")  # installed packages, not the standard library


def stdlib_dir() -> Path:
    """The running interpreter's standard-library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_test(relative: Path) -> bool:
    """A file of tests: under a folder named test/tests/idle_test, or named test_*.x / *_test.x."""
    return (
        any(part in TEST_DIRS for part in relative.parts[:-1])
        or relative.name.startswith("test_")
        or relative.stem.endswith("_test")
    )


def validation_share(relative: Path) -> float:
    """A fixed number in [0, 1) from a file's path under the corpus: below VAL_FRACTION, it validates."""
    digest = hashlib.sha1(relative.as_posix().encode()).hexdigest()
    return int(digest[:12], 16) / 16**12


MAX_FILE_BYTES = 4 << 20
"""data.code.max_file_bytes: a larger file is skipped, with a note (the standard library's largest, pydoc_data's
topics.py, is 0.76 MB; a sparse file of gigabytes became tokens without end: docs/reliability.md)."""
MAX_BYTES = 1 << 30
"""data.code.max_bytes: a corpus of more bytes is refused, naming the key (the standard library is 32 MB)."""
SNIFF_BYTES = 8192  # what is read of each file to tell text from binary
MAX_BAD_SHARE = 0.01  # share of a file's first bytes that may be NUL or invalid UTF-8, and it is still text


def not_text(f: Path) -> str | None:
    """Why the file is not text (a NUL byte, or over 1% invalid UTF-8 in its first 8 KiB), or None."""
    with open(f, "rb") as stream:
        head = stream.read(SNIFF_BYTES)
    if b"\0" in head:
        return f"not text: {head.count(0)} NUL bytes in its first {len(head):,}"
    bad = head.decode("utf-8", errors="replace").count("\ufffd")  # a character cut at the end counts one
    if bad > max(2, MAX_BAD_SHARE * len(head)):
        return f"not UTF-8 text: {bad} invalid sequences in its first {len(head):,} bytes"
    return None


def list_sources(
    root: Path,
    glob: str = "*.py",
    tests: bool = False,
    max_file_bytes: int = MAX_FILE_BYTES,
    max_bytes: int = MAX_BYTES,
) -> list[Path]:
    """The source files under root in sorted order, without installed packages (and tests unless asked).

    Decided before a byte of a file enters the corpus: a file that is a link
    leading out of root (or through a linked folder out of it), is not a
    regular file, holds more than `max_file_bytes`, or is not text
    (``not_text``) is skipped, and the skipped files are named in one note.

    Raises:
      FileNotFoundError: naming root where it holds none: slim images of
        Python often strip the standard library's sources and keep only `.pyc`.
      ValueError: the files kept hold more than `max_bytes` (data.code.max_bytes).
    """
    if not root.exists():
        raise FileNotFoundError(f"no such folder: {root}")
    home = root.resolve() if root.is_dir() else root.resolve().parent
    found, unlisted = ([root], []) if root.is_file() else find(root, glob)
    files: list[Path] = []
    skipped = [f"{f.relative_to(root) if root in f.parents else f}/ (not listed: {why})" for f, why in unlisted]
    for f in found:
        relative = f.relative_to(root) if f != root else Path(f.name)
        if any(part in SKIPPED_DIRS for part in relative.parts[:-1]) or (f != root and not tests and is_test(relative)):
            continue
        if f.is_dir() and not f.is_symlink():  # a folder whose name fits the pattern
            continue
        why = _skip_reason(f, home, max_file_bytes)
        if why:
            skipped.append(f"{relative} ({why})")
        else:  # an empty one too: in the list (its hash), left out of the splits by ``SourceCode.plan``
            files.append(f)
    if skipped:
        shown = "; ".join(skipped[:5]) + (f"; and {len(skipped) - 5} more" if len(skipped) > 5 else "")
        warnings.warn(f"{root}: skipped {len(skipped)} file(s) before reading them: {shown}", stacklevel=2)
    if not files:
        hint = (
            "this interpreter's standard library has no sources (slim images strip them: install the full "
            "Python, e.g. Debian's libpython3-stdlib, or point data.path at a folder of source files)"
            if root == stdlib_dir()
            else "set data.code.glob to the files' pattern, or data.path to another folder"
        )
        raise FileNotFoundError(f"no {glob} files under {root}" + ("" if tests else " (tests excluded)") + f": {hint}")
    total = sum(f.stat().st_size for f in files)
    if total > max_bytes:
        raise ValueError(
            f"{root}: its {len(files):,} {glob} files hold {total:,} bytes, more than "
            f"data.code.max_bytes = {max_bytes:,}; raise it (--config.data.code.max_bytes={total}) or "
            "point data.path at a smaller folder"
        )
    return sorted(files, key=lambda f: f.relative_to(root).as_posix() if f != root else f.name)


def _skip_reason(f: Path, home: Path, max_file_bytes: int) -> str | None:
    """Why a file found under the corpus folder `home` is not read into it, or None."""
    try:  # rglob descends into no linked folder: only the file itself may be a link
        real = f.resolve(strict=True) if f.is_symlink() else f
        st = real.stat()
    except (OSError, RuntimeError) as e:  # a dangling link, a loop
        return f"unreadable: {e}"
    if real is not f and real != home and home not in real.parents:
        return f"a link to {real}, outside the corpus folder"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_size > max_file_bytes:
        return f"{st.st_size:,} bytes, over data.code.max_file_bytes = {max_file_bytes:,}"
    try:
        return not_text(real) if st.st_size else None
    except OSError as e:  # vanished or unreadable since its stat
        return f"unreadable: {e.strerror or e}"


@register("code")
class SourceCode(TextFiles, skip_registration=True):
    """Source files, one a document, byte for byte (see the module's docstring).

    Options (`data.code`): `tests` takes test files too; `glob` is the
    pattern of the files taken from `data.path` (default "*.py");
    `max_file_bytes` and `max_bytes` cap a file (a larger one is skipped
    with a note) and the corpus (refused), ``list_sources``.
    """

    name = "sedd_code"
    RELEASE_NOTES = {"2.0.0": "one source file a document, unstripped; validation chosen by file"}

    def __init__(
        self,
        path: str = "",
        data_dir: str | None = None,
        documents: str = "",
        tests: bool = False,
        glob: str = "*.py",
        max_file_bytes: int = MAX_FILE_BYTES,
        max_bytes: int = MAX_BYTES,
        **kwargs,
    ):
        if documents not in ("", "file"):
            raise ValueError(
                f"data.documents must be 'file' (or '') for data.name='code': each source file is "
                f"one document, not {documents!r}"
            )
        if not isinstance(glob, str) or not glob or "/" in glob:
            raise ValueError(f"data.code.glob must be a file-name pattern such as '*.py', not {glob!r}")
        for key, value in (("max_file_bytes", max_file_bytes), ("max_bytes", max_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"data.code.{key} must be a positive number of bytes, not {value!r}")
        self.tests, self.glob = bool(tests), glob
        self.max_file_bytes, self.max_bytes = max_file_bytes, max_bytes
        super().__init__(path=path, data_dir=data_dir, documents="file", **kwargs)

    def key_parts(self) -> tuple:
        return (self.glob, self.tests)

    def default_path(self, data_dir: str) -> str:
        return str(stdlib_dir())

    def prompt(self) -> str:
        return "def parse_header(line):\n    " if self.glob == "*.py" else ""  # a function body to write

    def list_files(self) -> list[Path]:
        return list_sources(self.path, self.glob, self.tests, self.max_file_bytes, self.max_bytes)

    def describe(self) -> str:
        return (
            f"each {self.glob} file is one document, byte for byte; tests "
            f"{'included' if self.tests else 'left out (data.code.tests=true takes them)'}; "
            "validation: 5% of the files, by a hash of their path"
        )

    def plan(self) -> dict[str, list[Path]]:
        """The files of each split: validation those whose path hashes below VAL_FRACTION (at least one)."""
        files = [f for f in self.files if f.stat().st_size > 0]  # empty __init__.py files hold no text
        if len(files) < 2:
            raise ValueError(
                f"{self.path}: a code corpus needs at least 2 non-empty files (one to validate on), found {len(files)}"
            )
        root = self.path if self.path.is_dir() else self.path.parent
        share = {f: validation_share(f.relative_to(root)) for f in files}
        validation = [f for f in files if share[f] < VAL_FRACTION] or [min(files, key=share.get)]
        return {"train": [f for f in files if f not in validation], "validation": validation}

    def split_fragments(self):
        def fragments(files):
            for f in files:
                bad = Utf8Errors(f)
                with open(f, "rb") as stream:
                    for offset, chunk, _ in line_chunks(stream, 0, f.stat().st_size, by_line=False):
                        yield bad.check(chunk, offset)
                yield None
                bad.warn()

        return {
            split: (sum(f.stat().st_size for f in files), lambda files=files: fragments(files))
            for split, files in self.plan().items()
        }

    def manifest_extra(self) -> dict:
        """The interpreter and the file list: the standard library differs from one Python to another."""
        root = self.path if self.path.is_dir() else self.path.parent
        names = "\n".join(f.relative_to(root).as_posix() for f in self.files)
        return {
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "files_sha1": hashlib.sha1(names.encode()).hexdigest(),
            "tests": self.tests,
            "glob": self.glob,
        }
