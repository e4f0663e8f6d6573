"""The records a builder stores: local text cut into documents and packed into records, and read back.

A record is `{"text": utf-8 bytes, "ends": int64[k]}`: about `RECORD_BYTES` of
text from consecutive documents, and the byte offsets in `text` where a
document ends. Short documents share a record; a long one runs over several,
ending in the record whose `ends` holds its end. A file is read in blocks of
`BLOCK` bytes (``line_chunks``), cut into documents (``text_fragments``: a
file, its lines or its paragraphs) and packed (``pack_records``);
`read_pieces` gives the text back as (piece, ends_document) pairs,
`read_documents` as whole documents.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np

BLOCK = 1 << 20  # bytes read from a file at a time (and the longest line piece)
RECORD_BYTES = 1 << 20  # text per stored record
DOCUMENTS = ("file", "lines", "paragraphs")  # how a .txt file is cut into documents (data.documents)


class Segment(NamedTuple):
    """Bytes [start, end) of one file."""

    path: Path
    start: int
    end: int


def _char_start(data: bytes, k: int) -> int:
    """k moved back to the start of the UTF-8 character holding byte k."""
    j = k
    while j > max(k - 3, 0) and (data[j] & 0xC0) == 0x80:  # 10xxxxxx: a continuation byte
        j -= 1
    return j


def line_chunks(f, start: int, end: int, by_line: bool, whole_lines: bool = False) -> Iterator[tuple[int, bytes, bool]]:
    """(offset, chunk, ends_line) covering bytes [start, end) of an open binary file.

    by_line: each chunk is one line with its "\\n"; otherwise chunks of about
    BLOCK bytes that end at a line end where the block holds one. A line longer
    than BLOCK comes in pieces cut at character boundaries, unless whole_lines
    (a JSON line must be parsed whole).
    """
    f.seek(start)
    pos, carry = start, b""
    while pos < end:
        block = f.read(min(BLOCK, end - pos))
        if not block:
            raise RuntimeError(
                f"{f.name} ends at byte {pos}, not {end} as when it was listed: it changed while being prepared"
            )
        pos += len(block)
        data, offset = carry + block, pos - len(carry) - len(block)
        if by_line:
            lines = data.split(b"\n")
            carry = lines.pop()
            for line in lines:
                yield offset, line + b"\n", True
                offset += len(line) + 1
        else:
            nl = data.rfind(b"\n") + 1
            carry = data[nl:]
            if nl:
                yield offset, data[:nl], True
                offset += nl
        if len(carry) > BLOCK and not whole_lines:
            k = _char_start(carry, BLOCK)
            yield offset, carry[:k], False
            carry = carry[k:]
    if carry:
        yield pos - len(carry), carry, False


class Utf8Errors:
    """Counts invalid UTF-8 in one segment, replaces it by U+FFFD and warns once at the end."""

    def __init__(self, path: Path):
        self.path, self.count, self.first = path, 0, -1

    def check(self, chunk: bytes, offset: int) -> bytes:
        try:
            chunk.decode("utf-8")
            return chunk
        except UnicodeDecodeError as e:
            text = chunk.decode("utf-8", errors="replace")
            # "replace" puts one U+FFFD per invalid sequence; U+FFFD already in the file is not an error.
            self.count += text.count("\ufffd") - chunk.count("\ufffd".encode())
            if self.first < 0:
                self.first = offset + e.start
            return text.encode("utf-8")

    def warn(self) -> None:
        if self.count:
            warnings.warn(
                f"{self.path}: {self.count} invalid UTF-8 sequence(s) replaced by U+FFFD, "
                f"the first at byte offset {self.first}",
                stacklevel=2,
            )


class _Document:
    """The text of one document as fragments, without the whitespace around it.

    Trailing whitespace is held back until more text follows it (so a document
    ends stripped without being held whole); `end()` marks the end with None.
    """

    def __init__(self):
        self.started, self.tail = False, b""

    def add(self, chunk: bytes) -> tuple:
        if not self.started:
            chunk = chunk.lstrip()
            if not chunk:
                return ()
            self.started = True
        body = chunk.rstrip()
        if not body:
            self.tail += chunk
            if len(self.tail) > BLOCK:  # a long run of whitespace is kept rather than held
                out, self.tail = self.tail, b""
                return (out,)
            return ()
        out, self.tail = self.tail + body, chunk[len(body) :]
        return (out,)

    def end(self) -> tuple:
        if not self.started:
            return ()  # a blank document is dropped
        self.started, self.tail = False, b""
        return (None,)


def split_text(text: bytes) -> Iterator[bytes]:
    """Pieces of at most RECORD_BYTES bytes, cut at character boundaries."""
    start = 0
    while len(text) - start > RECORD_BYTES:
        k = start + _char_start(text[start : start + RECORD_BYTES + 1], RECORD_BYTES)
        yield text[start:k]
        start = k
    yield text[start:]


def text_fragments(seg: Segment, documents: str = "file", separator: bytes | None = None) -> Iterator[bytes | None]:
    """The documents in bytes [start, end) of one file, as fragments of text; None ends a document.

    A .jsonl file holds one JSON object per line with a "text" field, taken as
    it is. In any other file, documents are (`documents`): the whole segment
    ("file"), each line ("lines") or each run of non-blank lines
    ("paragraphs"); a line equal to `separator` (TinyStories' `<|endoftext|>`)
    also ends one. Documents are stripped of the ASCII whitespace around them,
    and blank ones dropped. A document ends at the end of the segment.
    Invalid UTF-8 is replaced by U+FFFD, with one warning per segment naming
    the file, the count and the first offset.

    Memory: one BLOCK, or one line of a .jsonl file.
    """
    if documents not in DOCUMENTS:
        raise ValueError(f"data.documents must be one of {DOCUMENTS}, not {documents!r}")
    bad = Utf8Errors(seg.path)
    with open(seg.path, "rb") as f:
        if seg.path.suffix == ".jsonl":
            for offset, line, _ in line_chunks(f, seg.start, seg.end, by_line=True, whole_lines=True):
                if not line.strip():
                    continue
                try:
                    text = json.loads(bad.check(line, offset))["text"]
                    if not isinstance(text, str):
                        raise TypeError(f'its "text" is a {type(text).__name__}')
                except (ValueError, KeyError, TypeError) as e:
                    raise ValueError(
                        f"{seg.path}, the line at byte offset {offset}: not a JSON object with a "
                        f'"text" string ({type(e).__name__}: {e})'
                    ) from None
                yield from split_text(text.encode("utf-8", errors="replace"))
                yield None
        else:
            doc = _Document()
            by_line = documents != "file" or separator is not None
            for offset, chunk, ends_line in line_chunks(f, seg.start, seg.end, by_line):
                chunk = bad.check(chunk, offset)
                if separator is not None and ends_line and chunk.strip() == separator:
                    yield from doc.end()
                elif documents == "paragraphs" and ends_line and not chunk.strip():
                    yield from doc.end()
                else:
                    yield from doc.add(chunk)
                    if documents == "lines" and ends_line:
                        yield from doc.end()
            yield from doc.end()
    bad.warn()


def pack_records(fragments) -> Iterator[dict]:
    """Records {"text", "ends"} of about RECORD_BYTES from fragments of text and None (a document's end)."""
    text, ends = bytearray(), []
    for frag in fragments:
        if frag is None:
            ends.append(len(text))
        else:
            text += frag
            if len(text) >= RECORD_BYTES:
                yield {"text": bytes(text), "ends": np.asarray(ends, np.int64)}
                text, ends = bytearray(), []
    if text or ends:
        yield {"text": bytes(text), "ends": np.asarray(ends, np.int64)}


def read_pieces(builder, split: str) -> Iterator[tuple[str, bool]]:
    """(text, ends_document) pieces of a split's documents, in stored order, one record in memory.

    Concatenating the pieces up to one whose flag is True gives a document.
    """
    source = builder.as_data_source(split)
    for i in range(len(source)):
        rec = source[i]
        text, start = rec["text"], 0
        for end in rec["ends"].tolist():
            yield text[start:end].decode("utf-8"), True
            start = end
        if start < len(text):
            yield text[start:].decode("utf-8"), False


def read_documents(builder, split: str) -> Iterator[str]:
    """Whole documents of a split, in stored order (a stream without ends, text8's, is one document)."""
    parts = []
    for piece, ends in read_pieces(builder, split):
        parts.append(piece)
        if ends:
            yield "".join(parts)
            parts = []
    if parts:
        yield "".join(parts)
