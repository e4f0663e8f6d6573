"""Tokenizers: text <-> int ids. Each has `name`, `vocab_size`, `eos_id` (or
None), `encode(text) -> int32[n]`, `encode_many(texts) -> list[int32[n_i]]`,
`decode(ids) -> str` and `to_dict()`, which a run directory saves as
tokenizer.json and `tokenizer_from_dict` reads back.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np

from sedd import files

EOS_TEXT = "<|endoftext|>"  # how decode renders the separator (GPT-2's spelling)
MAX_TOKENIZER_BYTES = 64 << 20  # a tokenizer.json (GPT-2's is 1.4 MB)


class OutOfVocabulary(ValueError):
    """Text holding characters a character vocabulary lacks: the first of them and the vocabulary, clipped.

    Attributes:
      unknown: the characters outside the vocabulary, sorted.
    """

    SHOWN = 24  # characters of each list named in the message; a text in another script lacks thousands

    def __init__(self, unknown: list[str], chars: str):
        self.unknown = unknown
        shown = repr(unknown[: self.SHOWN])[:-1] + (
            f", ... ({len(unknown):,} in all)]" if len(unknown) > self.SHOWN else "]"
        )
        vocab = repr(chars if len(chars) <= 120 else chars[:120] + "...")
        super().__init__(f"characters {shown} are not in the {len(chars)}-character vocabulary of this run: {vocab}")


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
        ids = np.where(codes < len(self._table), self._table[np.minimum(codes, len(self._table) - 1)], -1)
        if (ids < 0).any():
            raise OutOfVocabulary(sorted({chr(c) for c in codes[ids < 0]}), self.chars)
        return ids.astype(np.int32)

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        """`encode` of each text, in one call: ids are per character, so the joined text is encoded once."""
        ends = np.cumsum([len(t) for t in texts])
        return np.split(self.encode("".join(texts)), ends[:-1]) if texts else []

    def decode(self, ids, skip_eos: bool = False) -> str:
        """Ids to text; EOS renders as EOS_TEXT (or nothing), other ids outside
        the vocabulary (e.g. an absorbing graph's mask id) as U+FFFD."""
        eos = "" if skip_eos else EOS_TEXT
        return "".join(
            eos if i == self.eos_id else self.chars[i] if 0 <= i < len(self.chars) else "\ufffd"
            for i in np.asarray(ids).reshape(-1).tolist()
        )

    def to_dict(self) -> dict:
        return {"name": self.name, "chars": self.chars}


class ByteTokenizer:
    """UTF-8 bytes: ids 0..255 are bytes, 256 is EOS (vocab 257)."""

    name = "byte"
    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        """`encode` of each text, in one call: ids are per byte, so the joined text is encoded once."""
        raw = [t.encode("utf-8") for t in texts]
        ends = np.cumsum([len(r) for r in raw])
        return np.split(np.frombuffer(b"".join(raw), np.uint8).astype(np.int32), ends[:-1]) if texts else []

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
    "GPT-2 BPE reads its vocabulary from local files (nothing is downloaded): "
    "set data.tokenizer_path to a GPT-2 `tokenizer.json`, or to a folder holding "
    "`vocab.json` and `merges.txt` (the files of the Hugging Face `gpt2` "
    "repository), and `pip install tokenizers` (the sedd-jax[gpt2] extra)."
)


class GPT2Tokenizer:
    """GPT-2 byte-level BPE (vocab 50257, EOS 50256) through the `tokenizers` package.

    Args:
      path: a `tokenizer.json`, or a folder with `tokenizer.json` or with
        `vocab.json` + `merges.txt`.
      pad: one more id, 50257, the [PAD] that DUO's tokenizer adds (a state of
        its uniform graph, so a converted DUO model's vocabulary is 50,258);
        never produced by `encode`, dropped by `decode`.
    Raises:
      FileNotFoundError: no tokenizer files at path (says what to put where).
      ImportError: `tokenizers` is not installed.
    """

    name = "gpt2"
    vocab_size = 50257
    eos_id = 50256

    def __init__(self, path: str = "", pad: bool = False):
        self.path = str(path)
        self.pad = bool(pad)
        self.vocab_size = GPT2Tokenizer.vocab_size + self.pad
        p = Path(path).expanduser()
        if not path or not p.exists():
            raise FileNotFoundError(f"GPT2Tokenizer: no tokenizer files at {path!r}. {_GPT2_HELP}")
        try:
            import tokenizers  # optional dependency: only GPT-2 runs need it
        except ImportError as e:
            raise ImportError(f"GPT2Tokenizer: the tokenizers package is missing. {_GPT2_HELP}") from e
        if p.is_dir() and (p / "tokenizer.json").exists():
            p = p / "tokenizer.json"
        if not p.is_dir():  # a regular file of bounded size (not a FIFO, not /dev/zero), read once (sedd.files)
            text = files.read_text(p, MAX_TOKENIZER_BYTES)
            check_contents(text, p)  # what it holds bounded before anything is built from it
            self._bpe = tokenizers.Tokenizer.from_str(text)
            check_pipeline(self._bpe, p)
            self._bpe.post_processor = None  # it changes no id without special tokens, and a Sequence of many is slow
            self._bpe.no_padding()  # the ids are the text's tokens, all of them and only them
            self._bpe.no_truncation()
        elif (p / "vocab.json").exists() and (p / "merges.txt").exists():
            for f in ("vocab.json", "merges.txt"):  # regular files of bounded size, of a bounded count of entries
                check_contents(files.read_text(p / f, MAX_TOKENIZER_BYTES), p / f)
            self._bpe = tokenizers.ByteLevelBPETokenizer(str(p / "vocab.json"), str(p / "merges.txt"))
        else:
            raise FileNotFoundError(f"GPT2Tokenizer: no tokenizer.json or vocab.json + merges.txt in {p}. {_GPT2_HELP}")
        check_vocabulary(self._bpe, self.vocab_size, p)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """Most characters one token stands for (its byte-level spelling is at least as long): a bound on a
        text's length in characters, checked before encoding it."""
        return max(map(len, self._bpe.get_vocab()), default=1)

    def encode(self, text: str) -> np.ndarray:
        """int32[n] ids. The batch encoder, which releases the GIL (the single one holds it while it runs)."""
        return self.encode_many([text])[0]

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        """`encode` of each text, through the tokenizers package's batch encoder (parallel, in Rust).

        Raises:
          ValueError: the tokenizers package failed on the text, including
            its panics (pyo3's PanicException is a BaseException), named.
        """
        return [
            np.asarray(e.ids, np.int32) for e in _named(lambda: self._bpe.encode_batch(texts, add_special_tokens=False))
        ]

    def decode(self, ids, skip_eos: bool = False) -> str:
        ids = [
            i
            for i in np.asarray(ids).reshape(-1).tolist()
            if 0 <= i < GPT2Tokenizer.vocab_size and not (skip_eos and i == self.eos_id)
        ]  # [PAD] dropped
        return _named(lambda: self._bpe.decode(ids, skip_special_tokens=False))

    def to_dict(self) -> dict:
        return {"name": self.name, "path": self.path, **({"pad": True} if self.pad else {})}


def _named(call):
    """call(), with the tokenizers package's failures, panics included, as a ValueError naming them.

    pyo3 turns a Rust panic (an Oniguruma regex over its retry limit, say)
    into ``pyo3_runtime.PanicException``, a BaseException that no ``except
    Exception`` sees; KeyboardInterrupt and SystemExit pass through.
    """
    try:
        return call()
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as e:  # noqa: BLE001  PanicException derives from BaseException only
        raise ValueError(f"the tokenizer failed on this text: {type(e).__name__}: {str(e)[:200]}") from None


GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
SPLIT_PATTERNS = {
    GPT2_PATTERN: "GPT-2's (SEDD, MDLM, BD3-LM and DUO use GPT-2's tokenizer; its ByteLevel step holds it built in)",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+": "Llama 3's (tiktoken's cl100k)",
}
"""The regexes a tokenizer.json may split its text by, compared as exact strings: the pre-tokenizers of the
tokenizers sedd converts or trains with. Each is linear in the text under Oniguruma (docs/reliability.md times
them on text of one piece repeated); time a pattern so before adding it."""
MAX_AFFIX_CHARS = 16  # a BPE's unk_token, continuing_subword_prefix, end_of_word_suffix (GPT-2's and Llama 3's: none)
_READ = (
    "sedd reads byte-level BPE tokenizers as GPT-2's and Llama 3's are: no normalizer, a ByteLevel "
    "pre-tokenizer or a Split by a pattern of sedd.data.tokenizers.SPLIT_PATTERNS then ByteLevel, a ByteLevel "
    "decoder or none, a BPE model (docs/reliability.md)"
)


def check_pipeline(bpe, where) -> None:
    r"""Refuse a Hugging Face tokenizer unless every step it runs on a text takes time linear in the text.

    Oniguruma, the package's regex engine, backtracks: a regex can take time
    exponential in the text (`(a+)+c`, issue 53) in shapes no scan or probe
    foresees (`(\w)?` 21 times then `\w{21}\x7a`, issues 63 and 72;
    docs/reliability.md). So no regex is judged: a regex is read only if it is
    one of ``SPLIT_PATTERNS``, and the other steps only as GPT-2's and Llama
    3's tokenizers have them. A normalizer is refused (a Replace holds a
    regex, or makes each "a" a million characters); so is any pre-tokenizer
    but ByteLevel or Split-then-ByteLevel, a decoder but ByteLevel, a model
    but BPE (WordPiece's longest match is at worst cubic in a word's
    length), and an unk_token or affix over MAX_AFFIX_CHARS characters (each
    unknown character becomes a copy of unk_token, so memory grows as their
    product; docs/reliability.md measures it). The steps are read as the package built them
    (their own serialization): what is checked is what runs. The
    post-processor, padding and truncation are never used (GPT2Tokenizer
    removes them).

    Raises:
      ValueError: naming the file and the first step that is not so, in one line.
    """

    def state(step) -> dict | None:  # a step as the package serializes it: {"type": ..., its settings}
        return None if step is None else json.loads(step.__getstate__())

    pre, normalizer, decoder, model = state(bpe.pre_tokenizer), state(bpe.normalizer), state(bpe.decoder), bpe.model
    steps = [] if pre is None else pre["pretokenizers"] if pre["type"] == "Sequence" else [pre]
    for step in steps:
        if step["type"] == "Split":
            ((how, pattern),) = step["pattern"].items()  # {"Regex": ...} or {"String": ...}
            if pattern not in SPLIT_PATTERNS:
                shown = f"{pattern[:80]!r}{'...' if len(pattern) > 80 else ''}"
                raise ValueError(
                    f"{where}: the tokenizer splits its text by the {how.lower()} {shown}, none of "
                    "the patterns sedd reads (sedd.data.tokenizers.SPLIT_PATTERNS: GPT-2's and Llama "
                    "3's; a regex of any other may take time exponential in the text)"
                )
            if (step.get("behavior"), step.get("invert")) != ("Isolated", False):  # "Removed" encoded all to ""
                raise ValueError(
                    f"{where}: the tokenizer's Split has behavior {step.get('behavior')!r} and invert "
                    f"{step.get('invert')!r}; GPT-2's and Llama 3's isolate each match ('Isolated', invert false), "
                    "and any other drops or merges text ('Removed' encoded every prompt to nothing)"
                )
    long = [
        f"{name} has {len(value)} characters (at most {MAX_AFFIX_CHARS})"
        for name in ("unk_token", "continuing_subword_prefix", "end_of_word_suffix")
        if (value := getattr(model, name, None)) and len(value) > MAX_AFFIX_CHARS
    ]
    why = None
    if [step["type"] for step in steps] not in (["ByteLevel"], ["Split", "ByteLevel"]):
        why = f"pre-tokenizer is {json.dumps(pre)[:100]}"
    elif normalizer is not None:
        why = f"normalizer is {json.dumps(normalizer)[:100]}"
    elif decoder is not None and decoder["type"] != "ByteLevel":
        why = f"decoder is {json.dumps(decoder)[:100]}"
    elif type(model).__name__ != "BPE":
        why = f"model is a {type(model).__name__}"
    elif long:
        why = f"model's {long[0]}"
    elif getattr(model, "dropout", None):  # each encoding of a text drops merges at random: ids differ call to call
        why = f"model has BPE dropout {model.dropout} (its encoding of a text differs from call to call)"
    if why:
        raise ValueError(f"{where}: the tokenizer's {why}; {_READ}")


MAX_TOKENIZER_ITEMS = 1 << 20  # values of a tokenizer file (GPT-2's tokenizer.json: about 200,000) or its lines
MAX_TOKEN_CHARS = 1024  # characters a token spells (a byte-level BPE's: one a byte; GPT-2's longest have 128)
MAX_ADDED_TOKENS = 1024  # tokens added beside the BPE's (GPT-2: <|endoftext|>; Llama 3: 256 special tokens)
MAX_STEP_CHARS = 1 << 16  # characters of any string of a tokenizer's steps (Llama 3's Split pattern has 160)
_STEPS = ("normalizer", "pre_tokenizer", "post_processor", "decoder", "padding", "truncation")


def check_contents(text: str, where) -> None:
    """Refuse a tokenizer file whose contents would cost more to build than its size (before it is built).

    An added token is compiled into a matcher many times its size, a normalizer's regex likewise, and a JSON
    file of empty lists parses to many times its bytes, each under the 64 MiB bound on the file's bytes
    (docs/reliability.md, "Fifth round", measured them). So a tokenizer.json (or vocab.json, merges.txt)
    holds at most ``MAX_TOKENIZER_ITEMS`` values (its commas, brackets and braces, counted in its text, strings'
    own included) or lines, at most ``MAX_ADDED_TOKENS`` added tokens of at most ``MAX_TOKEN_CHARS``
    characters, and no string of its steps (normalizer, pre-tokenizer, post-processor, decoder, padding,
    truncation) over ``MAX_STEP_CHARS`` characters. What the model holds (its tokens, their ids) is checked
    once it is built (``check_vocabulary``), which is linear in them.

    Raises:
      ValueError: one line naming the file and what it holds too much of.
    """
    items = max(sum(text.count(c) for c in ",[{"), text.count("\n"))
    if items > MAX_TOKENIZER_ITEMS:
        raise ValueError(
            f"{where} holds about {items:,} values or lines; a tokenizer sedd reads holds at most "
            f"{MAX_TOKENIZER_ITEMS:,} (GPT-2's tokenizer.json about 200,000)"
        )
    if Path(where).name == "merges.txt":
        return
    try:
        tree = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{where} is not JSON: {type(e).__name__}: {' '.join(str(e).split())[:200]}") from None
    if not isinstance(tree, dict) or Path(where).name == "vocab.json":
        return  # the package refuses a tokenizer.json that is not an object; vocab.json's tokens are the model's
    added = tree.get("added_tokens") or []
    added = added if isinstance(added, list) else []  # the package refuses what is not a list
    sizes = [len(t["content"]) for t in added if isinstance(t, dict) and isinstance(t.get("content"), str)]
    if len(added) > MAX_ADDED_TOKENS or max(sizes, default=0) > MAX_TOKEN_CHARS:
        what = (
            f"{len(added):,} added tokens"
            if len(added) > MAX_ADDED_TOKENS
            else f"an added token of {max(sizes):,} characters"
        )
        raise ValueError(
            f"{where} holds {what}; a tokenizer sedd reads adds at most {MAX_ADDED_TOKENS} of at most "
            f"{MAX_TOKEN_CHARS} characters each (each is built into a matcher of about 70 times its size)"
        )
    todo = [tree.get(step) for step in _STEPS]
    while todo:  # every string of the steps, by a stack (a nesting past Python's recursion limit is refused above)
        node = todo.pop()
        if isinstance(node, dict):
            todo += [*node.keys(), *node.values()]
        elif isinstance(node, list):
            todo += node
        elif isinstance(node, str) and len(node) > MAX_STEP_CHARS:
            raise ValueError(
                f"{where} holds a string of {len(node):,} characters in its steps ({node[:40]!r}...); a "
                f"tokenizer sedd reads has none over {MAX_STEP_CHARS:,} (a regex is compiled from it)"
            )


def check_vocabulary(bpe, vocab_size: int, where) -> None:
    """Refuse a built tokenizer whose ids are not the model's exactly: each id in [0, vocab_size) and one token's
    (50 tokens of one id decoded "ROMEO:" as "EOEOOO"; an id of 1,000,001 was caught only at sampling, one of
    2**32 - 1 was numpy's OverflowError), an added token's id its own or its token's, and no token over
    ``MAX_TOKEN_CHARS`` characters (the length of a prompt is checked against the longest before encoding).

    Raises:
      ValueError: one line naming the file, the ids or the token.
    """
    vocab = bpe.get_vocab(with_added_tokens=False)  # token -> id
    owner: dict[int, str] = {}
    for token, i in vocab.items():
        if not 0 <= i < vocab_size:
            raise ValueError(f"{where}: the token {token[:40]!r} has the id {i}, outside the model's [0, {vocab_size})")
        if i in owner:
            raise ValueError(
                f"{where}: the tokens {owner[i][:40]!r} and {token[:40]!r} share the id {i}; an id is one token's"
            )
        if len(token) > MAX_TOKEN_CHARS:
            raise ValueError(f"{where}: a token of {len(token):,} characters; at most {MAX_TOKEN_CHARS} are read")
        owner[i] = token
    for i, added in bpe.get_added_tokens_decoder().items():
        if not 0 <= i < vocab_size or owner.get(i, added.content) != added.content:
            raise ValueError(
                f"{where}: the added token {added.content[:40]!r} has the id {i}, "
                + (f"outside the model's [0, {vocab_size})" if not 0 <= i < vocab_size else f"{owner[i][:40]!r}'s")
            )


class MarkovTokenizer:
    """Ids 0..V-1 rendered as letters (a, b, ...; then base-V numbers); no EOS.

    Saved with a run like the other tokenizers (``to_dict``), so a run
    directory knows it was trained on synthetic data.
    """

    name = "markov"
    eos_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = int(vocab_size)

    def encode(self, text: str) -> np.ndarray:
        if self.vocab_size > 26:
            raise ValueError("MarkovTokenizer.encode reads letters; vocab_size > 26 has none")
        ids = np.array([ord(ch) - ord("a") for ch in text], np.int32)
        if ((ids < 0) | (ids >= self.vocab_size)).any():
            raise ValueError(f"{text!r} has characters outside the first {self.vocab_size} letters")
        return ids

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        return [self.encode(t) for t in texts]

    def decode(self, ids, skip_eos: bool = False) -> str:
        del skip_eos  # no EOS
        ids = np.asarray(ids).reshape(-1).tolist()
        if self.vocab_size <= 26:
            return "".join(chr(ord("a") + i) if 0 <= i < self.vocab_size else "?" for i in ids)
        return " ".join(str(i) if 0 <= i < self.vocab_size else "?" for i in ids)

    def to_dict(self) -> dict:
        return {"name": self.name, "vocab_size": self.vocab_size}


TOKENIZERS = {"char": CharTokenizer, "byte": ByteTokenizer, "gpt2": GPT2Tokenizer, "markov": MarkovTokenizer}


def get_tokenizer(name: str, **kwargs):
    """Builds a tokenizer by name: char (chars=...), byte, gpt2 (path=...), markov (vocab_size=...)."""
    if name not in TOKENIZERS:
        raise ValueError(f"unknown tokenizer {name!r}; known: {sorted(TOKENIZERS)}")
    return TOKENIZERS[name](**kwargs)


def tokenizer_from_dict(d: dict):
    """Inverse of `tokenizer.to_dict()`."""
    d = dict(d)
    return get_tokenizer(d.pop("name"), **d)


def save_tokenizer(tokenizer, path) -> None:
    """Write ``tokenizer.to_dict()`` as JSON to path (a run's tokenizer.json), through ``sedd.files.write_text``."""
    files.write_text(path, json.dumps(tokenizer.to_dict()), Path(path).parent)


def load_tokenizer(path):
    """The tokenizer saved at path by ``save_tokenizer``: a regular file of its run directory (``sedd.files``)."""
    path = Path(path)
    return tokenizer_from_dict(json.loads(files.read_text(path, MAX_TOKENIZER_BYTES, root=path.parent)))
