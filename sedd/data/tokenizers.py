"""Tokenizers: text <-> int ids. Each has `name`, `vocab_size`, `eos_id` (or
None), `encode(text) -> int32[n]`, `encode_many(texts) -> list[int32[n_i]]`,
`decode(ids) -> str` and `to_dict()`, which a run directory saves as
tokenizer.json and `tokenizer_from_dict` reads back.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from sedd import files

EOS_TEXT = "<|endoftext|>"  # how decode renders the separator (GPT-2's spelling)
MAX_TOKENIZER_BYTES = 64 << 20  # a tokenizer.json (GPT-2's is 1.4 MB)

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

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        """`encode` of each text, in one call: ids are per character, so the joined text is encoded once."""
        ends = np.cumsum([len(t) for t in texts])
        return np.split(self.encode("".join(texts)), ends[:-1]) if texts else []

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
    "repository), and `pip install tokenizers` (the sedd-jax[gpt2] extra).")


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
        if p.is_file():  # a regular file of bounded size, read once (sedd.files)
            text = files.read_text(p, MAX_TOKENIZER_BYTES)
            check_regexes(json.loads(text), p)
            self._bpe = tokenizers.Tokenizer.from_str(text)
        elif (p / "vocab.json").exists() and (p / "merges.txt").exists():
            for f in ("vocab.json", "merges.txt"):  # regular files of bounded size (not a FIFO, not /dev/zero)
                files.read_bytes(p / f, MAX_TOKENIZER_BYTES)
            self._bpe = tokenizers.ByteLevelBPETokenizer(str(p / "vocab.json"), str(p / "merges.txt"))
        else:
            raise FileNotFoundError(f"GPT2Tokenizer: no tokenizer.json or vocab.json + merges.txt in {p}. "
                                    f"{_GPT2_HELP}")

    @property
    def max_token_chars(self) -> int:
        """Most characters one token stands for (its byte-level spelling is at least as long): a bound on a
        text's length in characters, checked before encoding it."""
        if not hasattr(self, "_max_chars"):
            self._max_chars = max(map(len, self._bpe.get_vocab()), default=1)
        return self._max_chars

    def encode(self, text: str) -> np.ndarray:
        """int32[n] ids. The batch encoder, which releases the GIL (the single one holds it while it runs)."""
        return self.encode_many([text])[0]

    def encode_many(self, texts: list[str]) -> list[np.ndarray]:
        """`encode` of each text, through the tokenizers package's batch encoder (parallel, in Rust).

        Raises:
          ValueError: the tokenizers package failed on the text, including
            its panics (pyo3's PanicException is a BaseException), named.
        """
        return [np.asarray(e.ids, np.int32) for e in _named(lambda: self._bpe.encode_batch(
            texts, add_special_tokens=False))]

    def decode(self, ids, skip_eos: bool = False) -> str:
        ids = [i for i in np.asarray(ids).reshape(-1).tolist()
               if 0 <= i < GPT2Tokenizer.vocab_size and not (skip_eos and i == self.eos_id)]  # [PAD] dropped
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


MAX_REGEX_CHARS = 1000  # GPT-2's pre-tokenizer regex has 94 characters, Llama 3's 118


GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
KNOWN_REGEXES = {
    GPT2_REGEX: "GPT-2's pre-tokenizer (MDLM, BD3-LM and DUO use GPT-2's tokenizer)",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
    r"\s+(?!\S)|\s+": "Llama 3's (tiktoken's cl100k)",
}
"""Regexes read without a probe: the pre-tokenizers of the tokenizers sedd converts or trains with. GPT-2's
tokenizer.json written by `tokenizers` holds a ByteLevel pre-tokenizer with GPT-2's regex built in (no "Regex"
entry); newer files write it out as a Split of GPT2_REGEX."""
PROBE_BUDGET_S = 0.5  # a GPT-2 BPE encodes the probe texts in about 0.05 s
PROBE_START_S = 60.0  # the probe's process reads and builds a tokenizer.json of up to 64 MiB
PROBE_RUN = 64  # characters of the repeated run in each probe text
_ATOMS = "aZ0 \n\t!'_-.é中"  # a letter of each case, a digit, blanks, punctuation, accented and CJK letters
_META = set("\\()[]{}|?*+.^$")
_probed: dict[str, str | None] = {}  # sha256 of a tokenizer.json -> why it was refused (None: it passed)


def check_regexes(tree, where) -> None:
    r"""Refuse a Hugging Face tokenizer.json whose regexes (Split, Replace, ...) can stall an encode.

    Oniguruma, the package's regex engine, backtracks: `(a+)+c` takes time
    exponential in the text (a 2,040-character prompt held a server 26 s,
    issue 53), and so do shapes no scan foresees (`(\w)?` 21 times then
    `\w{21}z`: 7.3 s for 89 characters, issue 63). So the decision is by
    behaviour: a regex of ``KNOWN_REGEXES`` is read as it is; a tokenizer with
    any other regex is read only if, in a process of its own, it encodes the
    probe texts (``probe_texts``: long runs of one character, then another,
    then the regexes' own characters) within ``PROBE_BUDGET_S``; the process
    is killed at the budget. ``regex_risk`` names the common bad shape first.
    A passed probe does not prove an encode fast on every text: `sedd serve`
    holds each request's encoding to a budget of its own (docs/reliability.md).

    Raises:
      ValueError: naming the file, the regex and what is wrong with it.
    """
    regexes, stack = [], [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            regex = node.get("Regex")
            if isinstance(regex, str):
                why = regex_risk(regex)
                if why:
                    raise ValueError(f"{where}: the tokenizer's regex {regex[:100]!r} {why}; sedd reads only "
                                     "tokenizers whose regexes run in time linear in the text")
                regexes.append(regex)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    unknown = [r for r in regexes if r not in KNOWN_REGEXES]
    if unknown:
        text = json.dumps(tree)
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest not in _probed:
            _probed[digest] = probe(text, probe_texts(unknown))
        if _probed[digest]:
            shown = ", ".join(repr(r[:60]) for r in unknown[:2])
            raise ValueError(f"{where}: the tokenizer's regex {shown} may backtrack without end: the tokenizer "
                             f"{_probed[digest]} (a regex other than GPT-2's and Llama 3's pre-tokenizers is read "
                             "only if it passes this probe)")


def probe_texts(regexes: list[str]) -> list[str]:
    """Texts that make a backtracking regex show itself: a run of one character, a breaking one, the regexes' own.

    Each text is ``PROBE_RUN`` copies of a character (one of ``_ATOMS``, or a
    character the regexes name), then another, then every character the
    regexes name: a regex that backtracks tries its ways to split the run
    before failing at the break, and its literal characters at the end defeat
    the engine's shortcut of refusing a text that lacks one.
    """
    own = sorted({c for r in regexes for c in r if c not in _META and c.isprintable()})[:24]
    tail = "".join(own)
    texts = [x * PROBE_RUN + y + tail for x in dict.fromkeys(_ATOMS + tail) for y in _ATOMS]
    texts += [(x + y) * (PROBE_RUN // 2) + "!" + tail for x in _ATOMS for y in _ATOMS if x != y]
    return texts


_PROBE = r"""
import sys
sys.path = [p for p in sys.path if p not in ("", ".")]  # nothing from the folder it was started in
import json
import tokenizers
job = json.loads(sys.stdin.buffer.read())
try:
    tok = tokenizers.Tokenizer.from_str(job["tokenizer"])
except BaseException as e:
    print("unbuilt", json.dumps(f"{type(e).__name__}: {str(e)[:200]}"), flush=True)
    sys.exit(0)
print("built", flush=True)
for text in job["texts"]:
    try:
        tok.encode(text, add_special_tokens=False)
    except BaseException as e:
        print("failed", json.dumps(f"{type(e).__name__}: {str(e)[:200]} on {text[:20]!r}..."), flush=True)
        sys.exit(0)
print("done", flush=True)
"""


def probe(text: str, texts: list[str], budget_s: float | None = None) -> str | None:
    """Encode `texts` with the tokenizer.json `text` in a process of its own, killed at the budget.

    Returns:
      None when every text was encoded within `budget_s` (default
      ``PROBE_BUDGET_S``) of the tokenizer being built; else what happened,
      as words ("took more than 0.5 s to encode ...", "failed on a probe text: ...").
    """
    budget_s = PROBE_BUDGET_S if budget_s is None else budget_s
    env = {**os.environ, "RUST_BACKTRACE": "0", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen([sys.executable, "-c", _PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env)
    try:
        try:
            proc.stdin.write(json.dumps({"tokenizer": text, "texts": texts}).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        word, said = _said(proc, PROBE_START_S)
        if word == "unbuilt":
            return f"cannot be built: {said}"
        if word != "built":
            return f"could not be probed (its probe process ended, exit code {proc.poll()})"
        word, said = _said(proc, budget_s)
        if word == "failed":
            return f"failed on a probe text: {said}"
        if word != "done":
            chars = sum(map(len, texts))
            return (f"took more than {budget_s:g} s to encode {len(texts)} probe texts ({chars:,} characters; "
                    "a GPT-2 BPE takes about 0.05 s)")
        return None
    finally:
        proc.kill()
        proc.wait()


def _said(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    """(first word, the rest) of the next line the probe process writes within `timeout` s; ("", "") if none."""
    end = time.monotonic() + timeout
    ready, _, _ = select.select([proc.stdout], [], [], max(end - time.monotonic(), 0.0))
    if not ready:
        return "", ""
    word, _, rest = proc.stdout.readline().decode("utf-8", "replace").strip().partition(" ")
    try:
        rest = json.loads(rest) if rest else ""
    except ValueError:
        pass
    return word, str(rest)


_COUNT = re.compile(r"\{(\d*)(,?)(\d*)\}")


def regex_risk(pattern: str) -> str | None:
    """Why `pattern` may backtrack exponentially (a repeated group holding a repetition or an alternation), or None.

    A scan of the pattern's groups, escapes and character classes, not a
    parser: it refuses some harmless patterns (`(ab|cd)+`), never a
    nested quantifier.
    """
    if len(pattern) > MAX_REGEX_CHARS:
        return f"has {len(pattern)} characters (at most {MAX_REGEX_CHARS})"
    groups = [{"repeats": False, "alt": False}]  # one entry per open group; the whole pattern first
    closed = None  # the group that ended just before this character
    i = 0
    while i < len(pattern):
        c, after, repeat = pattern[i], None, False
        if c == "\\":
            i += 2
        elif c == "[":  # a character class: nothing in it repeats
            j = i + 1 + (pattern[i + 1:i + 2] == "^")
            j += pattern[j:j + 1] == "]"
            while j < len(pattern) and pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = j + 1
        elif c == "(":
            groups.append({"repeats": False, "alt": False})
            i += 1
            if pattern[i:i + 1] == "?":  # (?:, (?=, (?i: ... : the ? is no quantifier
                i += 1
        elif c == ")" and len(groups) > 1:
            after = groups.pop()
            groups[-1]["repeats"] |= after["repeats"]
            groups[-1]["alt"] |= after["alt"]
            i += 1
        elif c == "|":
            groups[-1]["alt"] = True
            i += 1
        elif c in "*+":
            repeat = True
            i += 1
        elif c == "{" and (m := _COUNT.match(pattern, i)):
            repeat = bool(m.group(2)) or (m.group(1) or "0") not in ("0", "1")
            i = m.end()
        else:
            i += 1
        if repeat:
            if closed is not None and (closed["repeats"] or closed["alt"]):
                what = "a repetition" if closed["repeats"] else "an alternation"
                return f"repeats a group that holds {what} (exponential backtracking, as in (a+)+c)"
            groups[-1]["repeats"] = True
        if after is not None:
            closed = after
        elif not (repeat or c in "?" and closed is not None):
            closed = None
    return None


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
