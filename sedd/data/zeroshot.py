"""The zero-shot test sets of Table 1 of Lou et al. 2024, from local files.

LAMBADA, WikiText-2, PTB, WikiText-103 and One Billion Words, read as the
original code's `data.py` reads them through Hugging Face `datasets` (one text
per row), with its detokenizers, which undo each set's tokenization (" @-@ "
-> "-", " n't" -> "n't", ...) so that GPT-2's tokenizer sees ordinary text.
Nothing is downloaded: `data.path` names the file or folder (docs/evaluation.md,
"Zero-shot test sets", gives the protocol and the files).

Each row becomes a document, verbatim after detokenization: empty rows are
kept (WikiText's blank lines are rows of the original too, each then one EOS).
`row_groups` gives the original's grouping of rows, within which the token
stream is cut into sequences (sedd.data.text).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable, Iterator

from sedd.data.builders import TextFiles, register
from sedd.data.records import split_text

# ---------------------------------------------------------------- detokenizers


def _apply(text: str, rules) -> str:
    for old, new in rules:
        text = old.sub(new, text) if isinstance(old, re.Pattern) else text.replace(old, new)
    return text


_WT_RULES = [
    ("s '", "s'"),  # contractions
    (re.compile(r"/' [0-9]/"), r"/'[0-9]/"),
    (" @-@ ", "-"),
    (" @,@ ", ","),
    (" @.@ ", "."),  # WikiText's split numbers: 1 @,@ 000
    (" : ", ": "),
    (" ; ", "; "),
    (" . ", ". "),
    (" ! ", "! "),
    (" ? ", "? "),
    (" , ", ", "),
    (re.compile(r"\(\s*([^\)]*?)\s*\)"), r"(\1)"),  # no spaces inside brackets and quotes
    (re.compile(r"\[\s*([^\]]*?)\s*\]"), r"[\1]"),
    (re.compile(r"{\s*([^}]*?)\s*}"), r"{\1}"),
    (re.compile(r"\"\s*([^\"]*?)\s*\""), r'"\1"'),
    (re.compile(r"'\s*([^']*?)\s*'"), r"'\1'"),
    ("= = = =", "===="),
    ("= = =", "==="),
    ("= =", "=="),  # headings
    (" \u00b0 ", "\u00b0"),
    (" \n", "\n"),
    ("\n ", "\n"),
    (" N ", " 1 "),
    (" 's", "'s"),
]


def wt_detokenizer(text: str) -> str:
    """WikiText: joins split numbers and punctuation (" @-@ " -> "-", " , " -> ", "),
    closes brackets and quotes, re-forms headings ("= = Career = =" -> "== Career ==");
    the rules and their order are those of the original's `wt_detokenizer`."""
    return _apply(text, _WT_RULES)


_PTB_RULES = [(" 's", "'s"), ("s ' ", "s' "), (" n't", "n't"), (" \n ", "\n"), ("\\/", "/")]


def ptb_detokenizer(text: str) -> str:
    """PTB: contractions (" n't" -> "n't"), "\\/" -> "/", the number token N -> 1,
    "<unk>" -> "?"; as the original's `ptb_detokenizer`."""
    text = _apply(text, _PTB_RULES)
    for _ in range(10):  # " N N " needs more than one pass: matches overlap
        text = text.replace(" N ", " 1 ")
    return _apply(text, [("$ 1", "$1"), ("# 1", "#1"), ("<unk>", "?")])


_LM1B_RULES = [
    ("http : / / ", "http://"),
    ("https : / / ", "https://"),
    (re.compile(r" \'(\w+)"), r"'\1"),
    (re.compile(r" (\w+) \. "), r" \1. "),
    (re.compile(r" (\w+) \.$"), r" \1."),
    (" ? ", "? "),
    (re.compile(r" \?$"), "?"),
    (" ! ", "! "),
    (re.compile(r" \!$"), "!"),
    (" , ", ", "),
    (" : ", ": "),
    (" ; ", "; "),
    (" / ", "/"),
    (re.compile(r"\" ([^\"]+) \""), r'"\1"'),
    (re.compile(r"\' ([^\']+) \'"), r"'\1'"),
    (re.compile(r"\( ([^\(\)]+) \)"), r"(\1)"),
    (re.compile(r"\[ ([^\[\]]+) \]"), r"[\1]"),
    ("$ ", "$"),
    ("\u00a3 ", "\u00a3"),
]


def lm1b_detokenizer(text: str) -> str:
    """One Billion Words: URLs, contractions, punctuation, brackets, quotes and
    currency signs; as the original's `lm1b_detokenizer`."""
    return _apply(text, _LM1B_RULES)


def lambada_detokenizer(text: str) -> str:
    """LAMBADA (OpenAI's version): curly double quotes made straight, the text
    stripped and started with a newline; as the original's `lambada_detokenizer`."""
    return "\n" + text.replace("\u201c", '"').replace("\u201d", '"').strip()


# ---------------------------------------------------------------- builders

ZERO_SHOT: dict[str, type] = {}
HF_MAP_PROCESSES = 8  # the original's `num_proc` of datasets.map
HF_MAP_BATCH = 1000  # datasets.map's default batch size


def row_groups(num_rows: int) -> list[int]:
    """Rows per group of the original's `group_texts`, in order.

    The original cuts sequences with `datasets.map(group_texts, batched=True,
    num_proc=8)`: the rows are split into 8 contiguous shards (the first
    num_rows % 8 one row longer), each shard into batches of 1,000 rows, and
    each batch's tokens are concatenated and cut into sequences of L, its
    remainder dropped.
    """
    procs = max(1, min(HF_MAP_PROCESSES, num_rows))
    div, mod = divmod(num_rows, procs)
    out = []
    for i in range(procs):
        n = div + (i < mod)
        out += [HF_MAP_BATCH] * (n // HF_MAP_BATCH) + ([n % HF_MAP_BATCH] if n % HF_MAP_BATCH else [])
    return out


def zero_shot(name: str) -> Callable[[type], type]:
    """Class decorator: a zero-shot test set's builder, found by `data.name = name` (and in ZERO_SHOT)."""

    def add(cls):
        ZERO_SHOT[name] = cls
        return register(name)(cls)

    return add


class ZeroShot(TextFiles, skip_registration=True):
    """A test set of Table 1 from its usual local file(s); one document per row.

    Subclasses give FILES (per split, the glob patterns of its files in a
    folder; training files are never read, as these sets only evaluate),
    EXPECTS (what data.path should be, for errors and the docs), `rows` and
    `detokenize`. A file is the split whose patterns match its name ("test" if
    none); a folder gives every split whose files it holds.
    """

    FILES: dict[str, tuple[str, ...]] = {}
    EXPECTS = ""
    row_groups = staticmethod(row_groups)

    def list_files(self) -> list[Path]:
        if not self.path.exists():
            raise FileNotFoundError(f"no such file or folder: {self.path}; {self.name_of_set()} expects {self.EXPECTS}")
        if self.path.is_file():
            return [self.path]
        files = sorted({p for pats in self.FILES.values() for pat in pats for p in self.path.rglob(pat) if p.is_file()})
        if not files:
            raise FileNotFoundError(f"no {self.name_of_set()} files in {self.path}: expected {self.EXPECTS}")
        return files

    def name_of_set(self) -> str:
        return type(self).__name__

    def split_of(self, path: Path) -> str:
        for split, patterns in self.FILES.items():
            if any(path.match(p) for p in patterns):
                return split
        return "test"

    def describe(self) -> str:
        return f"{self.name_of_set()}: one document per row, detokenized"

    def rows(self, path: Path) -> Iterator[str]:
        """The rows of one file, as the original reads them."""
        raise NotImplementedError

    def detokenize(self, row: str) -> str:
        raise NotImplementedError

    def lines(self, path: Path) -> Iterator[tuple[int, str]]:
        """(byte offset, line with its "\\n") of a UTF-8 text file; invalid UTF-8 is an error."""
        offset = 0
        with open(path, "rb") as f:
            for raw in f:
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ValueError(
                        f"{path}: invalid UTF-8 at byte offset {offset + e.start}; "
                        f"{self.name_of_set()} expects {self.EXPECTS}"
                    ) from None
                yield offset, line
                offset += len(raw)

    def wrong_file(self, path: Path, why: str) -> ValueError:
        return ValueError(f"{path} is not a {self.name_of_set()} file ({why}): expected {self.EXPECTS}")

    def split_fragments(self):
        by_split: dict[str, list[Path]] = {}
        for f in self.files:
            by_split.setdefault(self.split_of(f), []).append(f)

        def fragments(files):
            for f in files:
                for row in self.rows(f):
                    yield from split_text(self.detokenize(row).encode("utf-8"))
                    yield None

        return {s: (sum(f.stat().st_size for f in fs), lambda fs=fs: fragments(fs)) for s, fs in by_split.items()}


class _WikiText(ZeroShot, skip_registration=True):
    FILES = {"test": ("wiki.test.raw",), "validation": ("wiki.valid.raw",)}
    detokenize = staticmethod(wt_detokenizer)
    HEADING = re.compile(r"^ = [^=].* = \n?$")
    EXPECTS = (
        "wiki.test.raw from wikitext-{}-raw-v1.zip (the raw version, one line of the articles per row), "
        "or the folder holding it"
    )

    def rows(self, path):
        # As Hugging Face's `wikitext` rows: every line with its "\n", a blank line as "".
        heading = False
        for i, (offset, line) in enumerate(self.lines(path)):
            if i < 100 and "<unk>" in line:
                raise self.wrong_file(path, f"<unk> at byte offset {offset}: the tokenized wiki.*.tokens version")
            if line.strip() and not heading:
                if not self.HEADING.match(line):
                    raise self.wrong_file(
                        path, f"its first text line is {line[:60]!r}, not a heading like ' = Robert Boulter = '"
                    )
                heading = True
            yield line if line.strip() else ""


@zero_shot("wikitext2")
class WikiText2(_WikiText, skip_registration=True):
    """WikiText-2 (raw): `wiki.test.raw` of `wikitext-2-raw-v1.zip`, or the
    extracted folder `wikitext-2-raw/` (wiki.test.raw and wiki.valid.raw,
    where present, are the test and validation splits)."""

    name = "sedd_wikitext2"
    EXPECTS = _WikiText.EXPECTS.format(2)


@zero_shot("wikitext103")
class WikiText103(_WikiText, skip_registration=True):
    """WikiText-103 (raw): `wiki.test.raw` of `wikitext-103-raw-v1.zip`, or its folder."""

    name = "sedd_wikitext103"
    EXPECTS = _WikiText.EXPECTS.format(103)


@zero_shot("ptb")
class PTB(ZeroShot, skip_registration=True):
    """Penn Treebank as `ptb_text_only` reads it: `ptb.test.txt` of Mikolov's
    simple-examples (one lower-cased sentence per line, rare words as <unk>,
    numbers as N), or a folder with ptb.test.txt and ptb.valid.txt."""

    name = "sedd_ptb"
    FILES = {"test": ("ptb.test.txt",), "validation": ("ptb.valid.txt",)}
    EXPECTS = (
        "ptb.test.txt of the Penn Treebank (Mikolov's simple-examples/data: one lower-cased, tokenized "
        "sentence per line with <unk> and N), or the folder holding it"
    )
    detokenize = staticmethod(ptb_detokenizer)

    def rows(self, path):
        seen_unk = False
        for i, (offset, line) in enumerate(self.lines(path)):
            if i < 1000:
                if line.lstrip().startswith(("{", "[")):
                    raise self.wrong_file(path, "it is JSON, not one sentence per line")
                if re.search(r"[A-Z]", re.sub(r"(?<!\S)N(?!\S)", "", line)):  # N alone is PTB's number token
                    raise self.wrong_file(path, f"capitals at byte offset {offset}: {line[:60]!r}")
                seen_unk = seen_unk or "<unk>" in line
            if i == 999 and not seen_unk:
                break
            yield line.strip()
        if not seen_unk:
            raise self.wrong_file(path, "no <unk> in its first 1,000 lines")


@zero_shot("lm1b")
class LM1B(ZeroShot, skip_registration=True):
    """One Billion Words as `lm1b` reads its test split: the 50 files
    `news.en.heldout-000NN-of-00050` of `heldout-monolingual.tokenized.shuffled/`
    (one tokenized sentence per line), in name order; one such file alone is
    read as the test split too."""

    name = "sedd_lm1b"
    FILES = {"test": ("news.en.heldout-*",)}
    EXPECTS = (
        "the folder heldout-monolingual.tokenized.shuffled of 1-billion-word-language-modeling-benchmark-"
        "r13output.tar.gz (files news.en.heldout-000NN-of-00050, one tokenized sentence per line)"
    )
    detokenize = staticmethod(lm1b_detokenizer)

    def rows(self, path):
        for offset, line in self.lines(path):
            if offset == 0 and line.lstrip().startswith(("{", "[")):
                raise self.wrong_file(path, "it is JSON, not one sentence per line")
            yield line.strip()


@zero_shot("lambada")
class Lambada(ZeroShot, skip_registration=True):
    """LAMBADA as GPT-2 evaluated it: OpenAI's `lambada_test.jsonl` (5,153 lines,
    each {"text": passage and its last word})."""

    name = "sedd_lambada"
    FILES = {"test": ("lambada_test.jsonl",)}
    EXPECTS = (
        "OpenAI's lambada_test.jsonl (https://openaipublic.blob.core.windows.net/gpt-2/data/"
        'lambada_test.jsonl): one JSON object {"text": ...} per line'
    )
    detokenize = staticmethod(lambada_detokenizer)

    def rows(self, path):
        for offset, line in self.lines(path):
            if not line.strip():
                continue  # the original skips empty lines
            try:
                text = json.loads(line)["text"]
                if not isinstance(text, str):
                    raise TypeError(f'its "text" is a {type(text).__name__}')
            except (ValueError, KeyError, TypeError) as e:
                raise self.wrong_file(
                    path,
                    f"the line at byte offset {offset} is not a JSON object with a "
                    f'"text" string: {type(e).__name__}: {e}',
                ) from None
            yield text
