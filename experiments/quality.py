"""The quality of samples: the studies' Markov corpus and its exact scoring, and the figures of a batch of samples.

The studies train on text of a known law (``sedd.data.markov.MarkovChain``:
letters a-l of an order-2 chain, one line a document), so a sample's quality
is its exact NLL under the chain, not a judge's estimate. Units: nats per
character (a letter is a character) unless a name says bits.

Letters used below: B samples, L their length, V the chain's letters.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from sedd.kinds import causal
from sedd.data.markov import MarkovChain
from sedd.data.tokenizers import EOS_TEXT

MARKOV = {"vocab_size": 12, "order": 2, "alpha": 0.25}  # the chain of each seed
MARKOV_LENGTH = 200  # letters per line (document) of the markov corpus
LETTERS = "abcdefghijkl"  # token id i is written as LETTERS[i]


def markov_chain(seed: int) -> MarkovChain:
    """The chain of the studies' markov corpus of this seed."""
    return MarkovChain(seed=seed, **MARKOV)


def write_markov_corpus(seed: int, lines: int, path: Path) -> Path:
    """Write `lines` draws of the chain of `seed` (letters a-l, one sequence a line) to `path`."""
    ids = markov_chain(seed).sample(lines, MARKOV_LENGTH, seed=seed + 1)  # (lines, MARKOV_LENGTH)
    text = "".join("".join(LETTERS[i] for i in row) + "\n" for row in ids)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:  # an unchanged file keeps its prepared token cache
        path.write_text(text)
    return path


def texts_nll(texts: list[str], chain: MarkovChain) -> tuple[float, float, float]:
    """Exact NLL of texts of letters a-l under the chain, nats/char, its standard error, and the share scored.

    A text is cut at every character that is not a letter a-l (document
    separators, a mask left in a sample); each piece of at least k letters is
    scored with ``log_prob``, whose first k letters cost their stationary law,
    as for a window cut anywhere from the stream. The NLL is the scored nats
    over the scored letters; its standard error treats the texts as the
    independent units (the delta method for a ratio of means).
    """
    nats, letters, chars = [], [], 0
    for text in texts:
        text = text.replace(EOS_TEXT, "\n")  # "<|endoftext|>" holds letters a-l (e, d, f) of its own
        chars += len(text)
        pieces = [p for p in re.split(f"[^{LETTERS}]+", text) if len(p) >= chain.order]
        nats.append(sum(-chain.log_prob(np.frombuffer(p.encode(), np.uint8) - ord("a")) for p in pieces))
        letters.append(sum(len(p) for p in pieces))
    nats, letters = np.asarray(nats, np.float64), np.asarray(letters, np.float64)
    nll = nats.sum() / max(letters.sum(), 1)
    se = float(np.std(nats - nll * letters, ddof=1) / max(letters.mean(), 1) / math.sqrt(len(nats)))
    return float(nll), se, float(letters.sum() / max(chars, 1))


def unigram_entropy_nats(chain: MarkovChain) -> float:
    """Entropy of the chain's stationary one-letter law, nats (the floor of a model that ignores context)."""
    marginal = np.bincount(np.arange(chain.num_contexts) % chain.vocab_size, weights=chain.stationary)  # (V,)
    return float(-(marginal * np.log(np.where(marginal > 0, marginal, 1.0))).sum())


def letters_entropy_bits(texts: list[str]) -> float:
    """Entropy of the letters a-l of all texts pooled, bits (other characters not counted)."""
    counts = np.array([sum(t.count(c) for t in texts) for c in LETTERS], np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


def ngram_law(x: np.ndarray, vocab_size: int, n: int) -> np.ndarray:
    """The pooled law of the n-grams of every window of the rows of x int[B, L]: float64[V^n]."""
    x = np.asarray(x, np.int64)
    idx = np.zeros((x.shape[0], x.shape[1] - n + 1), np.int64)
    for j in range(n):
        idx = idx * vocab_size + x[:, j : x.shape[1] - n + 1 + j]
    return np.bincount(idx.ravel(), minlength=vocab_size**n) / idx.size


def chain_figures(chain: MarkovChain, x: np.ndarray) -> dict:
    """Exact figures of samples x int[B, L] of token ids against the chain (nats).

    Returns:
      {"exact_nats_per_token", its "_se", "true_nats_per_token" (the chain's own, at L),
       "ngram_kl_nats" (KL of the samples' pooled n-gram law, n = order + 1, to the chain's),
       "ngram_entropy_nats", "true_ngram_entropy_nats"}.
    """
    length, n = x.shape[1], chain.order + 1
    truth = (chain.stationary[:, None] * chain.transitions).ravel()  # p(x_0..x_k), base-V index
    emp = ngram_law(x, chain.vocab_size, n)
    seen = emp > 0
    with np.errstate(divide="ignore"):
        kl = float(np.sum(emp[seen] * (np.log(emp[seen]) - np.log(truth[seen]))))
    nll = -chain.log_prob(x) / length  # (B,) nats/token
    return {
        "exact_nats_per_token": float(nll.mean()),
        "exact_nats_per_token_se": float(nll.std(ddof=1) / np.sqrt(len(nll))),
        "true_nats_per_token": chain.sequence_entropy(length) / length,
        "ngram_kl_nats": kl,
        "ngram_entropy_nats": float(-np.sum(emp[seen] * np.log(emp[seen]))),
        "true_ngram_entropy_nats": chain.sequence_entropy(n),
    }


def sample_quality(x: np.ndarray, target_run, chain: MarkovChain | None) -> dict:
    """Quality of samples x int[B, L]: their exact NLL under the chain, or else the AR run target_run's own NLL.

    Returns:
      {"quality": which NLL, "nll" (nats a token, mean over the samples), "nll_se", "unigram_entropy_bits"}.
    """
    x = np.asarray(x)
    length = x.shape[1]
    if chain is not None:
        nll = -chain.log_prob(x) / length  # (B,) nats a token
        what = "exact_nats_per_token"
    else:
        nll = np.asarray(causal.nll(target_run.net.model, jnp.asarray(x, jnp.int32))) / length  # (B,) nats a token
        what = "target_nats_per_token"
    counts = np.bincount(x.ravel(), minlength=int(x.max()) + 1) / x.size
    seen = counts[counts > 0]
    return {
        "quality": what,
        "nll": float(nll.mean()),
        "nll_se": float(nll.std(ddof=1) / np.sqrt(len(nll))) if len(nll) > 1 else float("nan"),
        "unigram_entropy_bits": float(-(seen * np.log2(seen)).sum()),
    }
