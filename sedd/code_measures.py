"""Measures of generated code: does it parse, do its lines tokenise, how much of it is copied.

A sample has a fixed length, so it ends inside a statement; it counts as
parsing when the text up to its last complete top-level statement parses:

    cut(x)   = x[: start of the last top-level statement of x]
    parses(x) = ast.parse(cut(x)) succeeds        (x with >= 1 complete statement)

A top-level statement starts on a line at column 0 that is not blank, not a
comment, not a closing bracket and not the clause of a compound statement
(`else`, `elif`, `except`, `finally`); a decorator's statement starts at
its first decorator. Text after `<|endoftext|>` (the end of a file) is a new
document: the sample is cut there, and what comes before is complete. The
cut is a heuristic on lines (a line of a triple-quoted string at column 0
looks like a statement), so the figures come with the same measure on held-out
text of the corpus (`data_reference`), its ceiling.

`line_tokenise_rate` is the share of a sample's complete lines that Python's
tokenizer reads without an error token, each line alone (indentation
stripped; an open bracket continued on the next line is not an error).

`Memorisation` is the share of a sample's characters inside a verbatim copy
of at least `min_chars` characters of the training text, found through a
64-bit hash of every window of the training text (a false match has
probability about size / 2**64).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import warnings
from typing import Iterable

import numpy as np

from sedd.data.tokenizers import EOS_TEXT

CLAUSES = ("else", "elif", "except", "finally")  # lines at column 0 that continue a compound statement
MIN_CHARS = 64  # a verbatim copy this long or longer counts as memorised
HASH_BASE = 0x9E3779B97F4A7C15  # odd, so multiplying by it loses no bits mod 2**64
TRIPLE = re.compile(r'"""|\'\'\'')


def _starts_statement(line: str) -> bool:
    if not line.strip() or line[0] in " \t#)]}\r\n":
        return False
    word = line.split(None, 1)[0].rstrip(":")
    if not line.endswith("\n") and any(clause.startswith(word) for clause in CLAUSES):
        return False  # the sample's cut last line may be a clause's first letters ("exce")
    return word not in CLAUSES


def _triple_quotes(line: str, inside: str | None) -> str | None:
    """The triple quote a line leaves open, given the one open before it (None: outside a string)."""
    for quote in TRIPLE.findall(line):
        if inside is None:
            inside = quote
        elif quote == inside:
            inside = None
    return inside


def statement_cut(text: str) -> str | None:
    """The text up to its last complete top-level statement, or None if it holds none (see the module)."""
    if EOS_TEXT in text:
        return text.split(EOS_TEXT, 1)[0]  # a whole file, or its end: complete
    starts, offset, previous, inside = [], 0, "", None
    for line in text.splitlines(keepends=True):
        if inside is None and _starts_statement(line) and not previous.startswith("@"):
            starts.append(offset)
        inside = _triple_quotes(line, inside)
        if line.strip() and not line.lstrip().startswith("#"):
            previous = line
        offset += len(line)
    last = [s for s in starts if s > 0]
    return text[: last[-1]] if last else None


def parses(text: str) -> bool | None:
    """Whether the text up to its last complete top-level statement parses as Python (None: it holds none)."""
    cut = statement_cut(text)
    if cut is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)  # "invalid escape sequence" is not an error
            ast.parse(cut)
        return True
    except (SyntaxError, ValueError, MemoryError, RecursionError):  # ValueError: a NUL character
        return False


def line_tokenises(line: str) -> bool:
    """Whether one line, its indentation stripped, tokenises without an error token."""
    try:
        for token in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if token.type == tokenize.ERRORTOKEN and not token.string.isspace():
                return False
    except tokenize.TokenError as e:
        return "multi-line statement" in str(e)  # an open bracket, closed on a later line
    except (SyntaxError, ValueError):  # IndentationError is a SyntaxError
        return False
    return True


def complete_lines(text: str) -> list[str]:
    """The lines of a sample before its end (its last line is cut unless the text ends in a newline)."""
    return [line for line in text.split(EOS_TEXT, 1)[0].split("\n")[:-1] if line.strip()]


def line_tokenise_rate(texts: Iterable[str]) -> float:
    """The share of the texts' complete, non-blank lines that tokenise (`line_tokenises`)."""
    results = [line_tokenises(line) for text in texts for line in complete_lines(text)]
    return float(np.mean(results)) if results else float("nan")


def parse_figures(texts: Iterable[str]) -> dict:
    """parse_rate (of the texts with a complete top-level statement), complete_share, tokenise_rate, count."""
    texts = list(texts)
    verdicts = [parses(t) for t in texts]
    measured = [v for v in verdicts if v is not None]
    return {
        "parse_rate": float(np.mean(measured)) if measured else float("nan"),
        "complete_share": len(measured) / len(texts) if texts else float("nan"),
        "tokenise_rate": line_tokenise_rate(texts),
        "count": len(texts),
    }


def top_level_starts(source: str) -> list[int]:
    """The offsets where the top-level statements of a Python file start, read by Python's tokenizer.

    Exact for a file that tokenises (a decorated statement starts at its first
    decorator); on one that does not, the starts before the error.
    """
    lines = source.splitlines(keepends=True)
    line_start = np.cumsum([0] + [len(line) for line in lines]).tolist()
    starts, fresh, depth = [], True, 0  # fresh: the next token begins a logical line; depth: indentation
    skip = {tokenize.NL, tokenize.COMMENT, tokenize.ENCODING}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.INDENT:
                depth += 1
            elif tok.type == tokenize.DEDENT:
                depth -= 1
            elif tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                fresh = True
            elif tok.type not in skip and fresh:
                fresh = False
                decorated = _follows_decorator(lines, tok.start[0])
                if depth == 0 and tok.string not in CLAUSES and not decorated:
                    starts.append(line_start[tok.start[0] - 1] + tok.start[1])
    except (tokenize.TokenError, SyntaxError):
        pass
    return starts


def _follows_decorator(lines: list[str], row: int) -> bool:
    """Whether the last non-blank, non-comment line before 1-based `row` is a decorator's."""
    for line in reversed(lines[: row - 1]):
        if line.strip() and not line.lstrip().startswith("#"):
            return line.startswith("@")
    return False


def prompts(
    documents: Iterable[str], count: int, length: int, prompt_chars: int, seed: int = 0
) -> list[tuple[str, str]]:
    """(prompt, continuation) pairs of held-out code: windows of `length` characters that start at a top-level
    statement (drawn with a fixed seed), the first `prompt_chars` of each its prompt."""
    windows = [
        doc[s : s + length]
        for doc in documents
        for s in top_level_starts(doc)
        if len(doc) - s >= length and EOS_TEXT not in doc[s : s + length]
    ]
    if len(windows) < count:
        raise ValueError(
            f"the documents hold {len(windows)} windows of {length} characters from a top-level "
            f"statement; {count} asked"
        )
    chosen = np.random.default_rng(seed).choice(len(windows), count, replace=False)
    return [(windows[i][:prompt_chars], windows[i][prompt_chars:]) for i in sorted(chosen)]


def window_hashes(text: str, n: int) -> np.ndarray:
    """uint64[len(text) - n + 1]: a polynomial hash (mod 2**64) of each window of n characters.

    Windows of 2^k characters are hashed from those of 2^(k-1), and a
    window of n from the powers of two that sum to n, in log2(n) passes.
    """
    codes = np.frombuffer(text.encode("utf-32-le"), np.uint32).astype(np.uint64) + np.uint64(1)
    count = len(codes) - n + 1
    if count <= 0:
        return np.zeros(0, np.uint64)
    out, width = np.zeros(count, np.uint64), 0  # the hash of the first `width` characters of each window
    block, size = codes, 1  # the hash of every window of `size` characters
    with np.errstate(over="ignore"):  # arithmetic mod 2**64 is the point
        while n:
            shift = np.uint64(pow(HASH_BASE, size, 1 << 64))
            if n & 1:
                out = out * shift + block[width : width + count]
                width += size
            n >>= 1
            if n:
                block, size = block[:-size] * shift + block[size:], 2 * size
    return out


class Memorisation:
    """The share of a text inside verbatim copies of >= min_chars characters of a training text."""

    def __init__(self, train_text: str, min_chars: int = MIN_CHARS):
        if min_chars < 1:
            raise ValueError(f"min_chars must be >= 1, not {min_chars}")
        self.min_chars = min_chars
        self.table = np.unique(window_hashes(train_text, min_chars))

    def copied(self, text: str) -> np.ndarray:
        """bool[len(text)]: the characters inside a window of min_chars also in the training text."""
        n, hashes = self.min_chars, window_hashes(text, self.min_chars)
        covered = np.zeros(len(text) + 1, np.int64)
        if len(hashes) and len(self.table):
            at = np.minimum(np.searchsorted(self.table, hashes), len(self.table) - 1)
            starts = np.flatnonzero(self.table[at] == hashes)
            np.add.at(covered, starts, 1)  # +1 where a copied window starts, -1 where it ends
            np.add.at(covered, starts + n, -1)
        return np.cumsum(covered)[: len(text)] > 0

    def share(self, texts: Iterable[str]) -> float:
        """The share of all the texts' characters inside a copy (EOS markers left out)."""
        marks = [self.copied(t.replace(EOS_TEXT, "\x00")) for t in texts]
        total = sum(len(m) for m in marks)
        return float(sum(m.sum() for m in marks) / total) if total else float("nan")
