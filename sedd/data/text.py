"""Local text as training data: a TFDS builder's documents, tokenized once and cached.

The documents of a split are joined with the tokenizer's EOS separator into one
int stream, cached as `.npy` beside the TFDS files so later runs do not
tokenize again.
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
