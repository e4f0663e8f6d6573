"""Token streams cut into training sequences, and resumable batches of them.

`PackedTokens` cuts a stream into N = len(stream) // L sequences of length L
(the remainder is dropped) and serves batches int32[B, L], where batch n is a
pure function of (seed, n): resuming at step n reproduces exactly the batches
of an uninterrupted run. `TokenData` is what training reads: token streams per
split (text in sedd.data.text, a Markov chain in sedd.data.markov).

Letters: B global batch size, b = B / process_count per-process batch, L
sequence length, N number of packed sequences in a split, V vocabulary size.
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np


def tokenize_documents(docs, tokenizer, stream: bool = False) -> np.ndarray:
    """The int32[T] stream of tokenized documents (strings), each followed by the EOS separator;
    stream=True: the documents are chunks of one text, with no separators at all."""
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

    def batches(
        self, batch_size: int, seed: int, start_step: int = 0, process_index: int = 0, process_count: int = 1
    ) -> Iterator[np.ndarray]:
        """Endless shuffled batches int32[b, L], b = batch_size // process_count.

        Process p takes rows [p b, (p+1) b) of each global batch of `batch_size`.
        """
        local = _local_size(batch_size, process_count)
        step = start_step
        while True:
            idx = self.global_indices(step, batch_size, seed)
            yield self.sequences(idx[process_index * local : (process_index + 1) * local])
            step += 1

    def eval_batches(self, batch_size: int, process_index: int = 0, process_count: int = 1) -> Iterator[np.ndarray]:
        """One pass over all N sequences in order, as int32[b, L] batches.

        The last batch is filled by wrapping around to the first sequences, so
        every batch has the same shape (one jit compilation); at most B - 1
        sequences are counted twice.
        """
        local = _local_size(batch_size, process_count)
        for start in range(0, self.num_sequences, batch_size):
            idx = (start + np.arange(batch_size)) % self.num_sequences
            yield self.sequences(idx[process_index * local : (process_index + 1) * local])


def _local_size(batch_size: int, process_count: int) -> int:
    if batch_size % process_count:
        raise ValueError(f"batch size {batch_size} is not divisible by {process_count} processes")
    return batch_size // process_count


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
        characters): bits/char = bits/token / chars_per_token. Data without a
        train split (a zero-shot test set) gives its first split's."""
        stats = self.stats["train"] if "train" in self.stats else self.stats[self.splits[0]]
        return stats["chars"] / max(stats["tokens"], 1)

    def unigram_entropy_bits(self, split: str = "train") -> float:
        """Entropy of the split's token frequencies, bits per token."""
        return unigram_entropy_bits(self._tokens[split], self.tokenizer.vocab_size)

    def packed(self, split: str, seq_len: int | None = None) -> PackedTokens:
        """The split cut into sequences of seq_len (default L), cached."""
        key = (split, int(seq_len or self.seq_len))
        if key not in self._packed:
            self._packed[key] = PackedTokens(self._tokens[split], key[1])
        return self._packed[key]

    def batches(
        self,
        split: str = "train",
        batch_size: int = 8,
        seq_len: int | None = None,
        seed: int = 0,
        start_step: int = 0,
        process_index: int = 0,
        process_count: int = 1,
    ) -> Iterator[np.ndarray]:
        """Endless shuffled int32[b, L] batches; batch n a pure function of (seed, n)."""
        return self.packed(split, seq_len).batches(batch_size, seed, start_step, process_index, process_count)

    def train_batches(
        self, batch_size: int, seed: int = 0, start_step: int = 0, process_index: int = 0, process_count: int = 1
    ):
        """`batches` of the train split: what the training loop reads."""
        return self.batches("train", batch_size, None, seed, start_step, process_index, process_count)

    def eval_batches(self, batch_size: int, split: str = "validation", process_index: int = 0, process_count: int = 1):
        """One ordered, unshuffled pass over a split (see PackedTokens.eval_batches)."""
        return self.packed(split).eval_batches(batch_size, process_index, process_count)
