"""Local text as training data: a TFDS builder's documents, tokenized once and cached.

The documents of a split are joined with the tokenizer's EOS separator into one
int stream, cached as `.npy` beside the TFDS files so later runs do not
tokenize again. The stream is written to the file document by document, so
tokenizing an OpenWebText-sized corpus needs the memory of one document, not
of the corpus; training then reads the file memory-mapped.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from sedd.data.builders import read_documents
from sedd.data.packing import PackedTokens, TokenData, tokenize_documents


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
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            stats = write_token_cache(npy, read_documents(self.builder, split), self.tokenizer,
                                      stream=self.builder.STREAM)
            tmp = meta.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(stats))
            os.replace(tmp, meta)
        self._tokens[split] = np.load(npy, mmap_mode="r")
        self.stats[split] = json.loads(meta.read_text())


def write_token_cache(path: Path, docs, tokenizer, stream: bool = False) -> dict[str, int]:
    """Tokenizes documents straight into the .npy file `path`, one document in memory at a time.

    The file holds the stream of ``tokenize_documents(docs, tokenizer, stream)``
    as uint16 where ids fit 16 bits (half the memory and disk), else int32;
    batches are cast to int32. The .npy header is written first for length 0
    and rewritten in place at the end: numpy pads every header so that the
    first dimension can grow to 21 digits without moving the data. The file is
    written under a temporary name and renamed, so concurrent processes never
    read a partial cache.

    Args:
      path: the .npy file to write.
      docs: iterable of strings, consumed once.
      tokenizer: any tokenizer of sedd.data.tokenizers.
      stream: the documents are chunks of one text (no separators).
    Returns:
      {"documents", "chars", "tokens"} counts.
    """
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 65536 else np.int32)

    def header(n: int) -> dict:
        return {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (n,)}

    stats = {"documents": 0, "chars": 0, "tokens": 0}
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    with open(tmp, "wb") as f:
        np.lib.format.write_array_header_1_0(f, header(0))
        start = f.tell()
        for doc in docs:
            ids = tokenize_documents([doc], tokenizer, stream=stream).astype(dtype)
            f.write(ids.tobytes())
            stats["documents"] += 1
            stats["chars"] += len(doc)
            stats["tokens"] += len(ids)
        f.seek(0)
        np.lib.format.write_array_header_1_0(f, header(stats["tokens"]))
        if f.tell() != start:  # a numpy that stops padding headers would shift the data
            raise RuntimeError(f"the .npy header of {stats['tokens']} tokens does not fit in place; {tmp} is left")
    os.replace(tmp, path)
    return stats
