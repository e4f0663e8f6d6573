"""Local text as training data: a TFDS builder's documents, tokenized once and cached.

The documents of a split are joined with the tokenizer's EOS separator into one
int stream, cached as `.npy` beside the TFDS files so later runs do not
tokenize again. The stream is written to the file piece by piece (a record of
the builder holds about 1 MiB of text), so tokenizing an OpenWebText-sized
corpus needs the memory of one piece, not of a document or of the corpus;
training then reads the file memory-mapped.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

import sedd.data.records  # the module, not the package: RECORD_BYTES is read at call time
from sedd.data.records import read_pieces
from sedd.data.packing import TokenData


class TextData(TokenData):
    """A builder's splits as a ``TokenData``: tokenized once (`write_token_cache`), cached in cache_dir."""

    def __init__(self, builder, tokenizer, seq_len: int, cache_dir: Path):
        self.builder, self.tokenizer, self.seq_len = builder, tokenizer, int(seq_len)
        self.splits = list(builder.info.splits.keys())
        self.stats, self._tokens, self._packed = {}, {}, {}  # typed in TokenData
        tok_id = hashlib.sha1(json.dumps(tokenizer.to_dict(), sort_keys=True).encode())
        # A zero-shot set is cut into sequences within the original's groups of rows, so its stream depends on L.
        self.row_groups = getattr(builder, "row_groups", None)
        grouped = f"-L{self.seq_len}" if self.row_groups else ""
        self.cache_dir = cache_dir / f"{tokenizer.name}-{tok_id.hexdigest()[:10]}{grouped}"
        for split in self.splits:
            self._load(split)

    def _load(self, split: str) -> None:
        npy, meta = self.cache_dir / f"{split}.npy", self.cache_dir / f"{split}.json"
        if not (npy.exists() and meta.exists()):
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            groups = None
            if self.row_groups:
                source = self.builder.as_data_source(split)
                groups = self.row_groups(sum(len(source[i]["ends"]) for i in range(len(source))))
            stats = write_token_cache(npy, read_pieces(self.builder, split), self.tokenizer, groups, self.seq_len)
            tmp = meta.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(stats))
            os.replace(tmp, meta)
        self._tokens[split] = np.load(npy, mmap_mode="r")
        self.stats[split] = json.loads(meta.read_text())


def write_token_cache(
    path: Path, pieces, tokenizer, groups: list[int] | None = None, seq_len: int = 0
) -> dict[str, int]:
    """Tokenizes pieces of documents straight into the .npy file `path`, one piece in memory at a time.

    The file holds each piece's ids, followed by EOS where the piece ends a
    document (for whole documents, the stream of ``tokenize_documents``), as
    uint16 where ids fit 16 bits (half the memory and disk), else int32;
    batches are cast to int32. The .npy header is written first for length 0
    and rewritten in place at the end: numpy pads every header so that the
    first dimension can grow to 21 digits without moving the data. The file is
    written under a temporary name and renamed, so concurrent processes never
    read a partial cache; after a failure the temporary file is removed.

    Args:
      pieces: iterable of (text, ends_document) pairs (`records.read_pieces`),
        consumed once. A document cut into pieces is tokenized piece by piece:
        the same ids for the char and byte tokenizers; for BPE, a merge across
        a cut (at a line end, or every 1 MiB of a longer line) is lost.
      groups, seq_len: documents per group (`zeroshot.row_groups`): the
        tokens of each group are cut to a multiple of seq_len (the rest
        dropped), as the original code cuts its evaluation sets.
    Returns:
      {"documents", "chars", "tokens"} counts (documents: pieces that end
      one; tokens: those kept).
    """
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 65536 else np.int32)

    def header(n: int) -> dict:
        return {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n,)}

    eos = np.zeros(0, dtype) if tokenizer.eos_id is None else np.array([tokenizer.eos_id], dtype)
    stats = {"documents": 0, "chars": 0, "tokens": 0}
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    try:  # a failure (text the tokenizer cannot encode, a full disk) leaves no temporary file behind
        with open(tmp, "wb") as f:
            np.lib.format.write_array_header_1_0(f, header(0))
            start = f.tell()
            bounds = iter(np.cumsum(groups)) if groups else iter(())
            bound, group_start = next(bounds, -1), 0
            for piece, ends, ids in _encoded(pieces, tokenizer):
                ids = np.asarray(ids, dtype)
                f.write(ids.tobytes())
                if ends:
                    f.write(eos.tobytes())
                stats["documents"] += bool(ends)
                stats["chars"] += len(piece)
                stats["tokens"] += len(ids) + (len(eos) if ends else 0)
                if stats["documents"] == bound:  # the end of a group: drop its last tokens short of seq_len
                    stats["tokens"] = group_start + (stats["tokens"] - group_start) // seq_len * seq_len
                    f.seek(start + stats["tokens"] * dtype.itemsize)
                    bound, group_start = next(bounds, -1), stats["tokens"]
            f.truncate(start + stats["tokens"] * dtype.itemsize)
            f.seek(0)
            np.lib.format.write_array_header_1_0(f, header(stats["tokens"]))
            if f.tell() != start:  # a numpy that stops padding headers would shift the data
                raise RuntimeError(f"the .npy header of {stats['tokens']} tokens does not fit in place")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return stats


def _encoded(pieces, tokenizer):
    """(text, ends, ids) of each piece, encoded in batches of about a record's
    size (`encode_many`: one call for many short documents)."""
    batch_chars = sedd.data.records.RECORD_BYTES
    encode_many = getattr(tokenizer, "encode_many", None) or (lambda texts: [tokenizer.encode(t) for t in texts])
    batch, size = [], 0
    for piece, ends in pieces:
        batch.append((piece, ends))
        size += len(piece)
        if size >= batch_chars:
            yield from ((p, e, ids) for (p, e), ids in zip(batch, encode_many([p for p, _ in batch])))
            batch, size = [], 0
    if batch:
        yield from ((p, e, ids) for (p, e), ids in zip(batch, encode_many([p for p, _ in batch])))
