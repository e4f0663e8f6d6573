r"""Synthetic data with a known law: a random stationary Markov chain of order k.

A model's likelihood bound or the quality of its samples can only be judged
against a reference. For text the reference is another model (a judge), which
has its own errors; for this data the reference is exact:

  - the law of every sequence, log p(x) in closed form (``log_prob``);
  - the entropy rate h = -sum_c pi(c) sum_v P[c, v] log P[c, v] (nats/token);
  - the entropy of a window of L tokens, H(x_{0:k}) + (L - k) h, which is what
    a perfect model's bound per sequence converges to.

The chain. Tokens are ids 0..V-1. A context c is the last k tokens,
c = (x_{t-k}, ..., x_{t-1}), read as the base-V number
c = sum_j x_{t-k+j} V^{k-1-j}; there are C = V^k contexts. Each row of the
transition table P[c, :] is drawn from a symmetric Dirichlet(alpha) with a
seeded numpy generator: small alpha gives peaked rows (low entropy rate), large
alpha rows close to uniform. The stream starts in the stationary law pi of the
first-order chain on contexts (c -> c' = (c V + v) mod C with probability
P[c, v]), so every window of the stream, wherever it starts, has the same law

    p(x_0..x_{L-1}) = pi(x_{0:k}) prod_{t=k}^{L-1} P[c_t, x_t],

which is the law of the packed training sequences (``PackedTokens`` cuts the
stream into consecutive windows).

Letters: V vocabulary, k order, C = V^k contexts, L sequence length, B batch.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from sedd.data.packing import TokenData
from sedd.data.tokenizers import MarkovTokenizer


@dataclasses.dataclass(frozen=True)
class MarkovChain:
    """A seeded random Markov chain of order k over V tokens.

    Args:
      vocab_size: V >= 2.
      order: k >= 1 (tokens of context).
      seed: seeds the transition table (the same seed gives the same chain).
      alpha: Dirichlet concentration of each transition row (> 0).
    """

    vocab_size: int = 8
    order: int = 1
    seed: int = 0
    alpha: float = 0.3

    def __post_init__(self):
        if self.vocab_size < 2 or self.order < 1 or self.alpha <= 0:
            raise ValueError(
                f"MarkovChain needs vocab_size >= 2, order >= 1, alpha > 0; got "
                f"{self.vocab_size}, {self.order}, {self.alpha}"
            )
        if self.vocab_size**self.order > 2**20:
            raise ValueError(f"V^k = {self.vocab_size}^{self.order} contexts is too many (> 2^20)")

    @property
    def num_contexts(self) -> int:
        return self.vocab_size**self.order

    @property
    def transitions(self) -> np.ndarray:
        """float64[C, V], P[c, v] = p(x_t = v | context c); rows sum to 1."""
        return _table(self.vocab_size, self.order, self.seed, self.alpha)[0]

    @property
    def stationary(self) -> np.ndarray:
        """float64[C], the stationary law pi of the context chain."""
        return _table(self.vocab_size, self.order, self.seed, self.alpha)[1]

    # ------------------------------------------------------------ exact figures

    def entropy_rate(self) -> float:
        """h = sum_c pi(c) H(P[c, :]), nats per token."""
        p = self.transitions
        row_h = -(p * np.log(np.where(p > 0, p, 1.0))).sum(-1)  # (C,)
        return float(self.stationary @ row_h)

    def context_entropy(self) -> float:
        """H(x_{0:k}) = H(pi), nats: the cost of the first k tokens of a window."""
        pi = self.stationary
        return float(-(pi * np.log(np.where(pi > 0, pi, 1.0))).sum())

    def sequence_entropy(self, seq_len: int) -> float:
        """H(x_0..x_{L-1}) = H(pi) + (L - k) h in nats per sequence (L >= k)."""
        if seq_len < self.order:
            raise ValueError(f"seq_len {seq_len} < order {self.order}")
        return self.context_entropy() + (seq_len - self.order) * self.entropy_rate()

    def log_prob(self, x) -> np.ndarray:
        """Exact log p(x) of each sequence, nats.

        Args:
          x: int[B, L] (or int[L]) token ids in [0, V), L >= k.
        Returns:
          float64[B] (or a float for one sequence); -inf where x has an id
          outside [0, V) (for example a mask left in a sample).
        """
        x = np.asarray(x, np.int64)
        one = x.ndim == 1
        x = np.atleast_2d(x)
        v, k = self.vocab_size, self.order
        if x.shape[1] < k:
            raise ValueError(f"sequences of length {x.shape[1]} are shorter than the order {k}")
        valid = ((x >= 0) & (x < v)).all(-1)
        x = np.clip(x, 0, v - 1)
        ctx = np.zeros(x.shape[0], np.int64)
        for j in range(k):
            ctx = ctx * v + x[:, j]
        with np.errstate(divide="ignore"):
            logp = np.log(self.stationary[ctx])
            log_table = np.log(self.transitions)
        for t in range(k, x.shape[1]):
            logp = logp + log_table[ctx, x[:, t]]
            ctx = (ctx * v + x[:, t]) % self.num_contexts
        logp = np.where(valid, logp, -np.inf)
        return float(logp[0]) if one else logp

    def posteriors(self, x) -> np.ndarray:
        r"""The exact law of every token of a window given the tokens revealed in it.

        The forward-backward recursion of the context chain (a hidden Markov
        chain whose state s_t = (x_{t-k+1}, ..., x_t) is a context, revealed
        tokens its evidence): with e_t(v) = 1 where position t may hold v,

            alpha_t(s') = \sum_{s -> s'} alpha_{t-1}(s) P[s, v] e_t(v),   alpha_{k-1}(s) = pi(s) \prod_j e_j(s_j),
            beta_t(s)   = \sum_v P[s, v] e_{t+1}(v) beta_{t+1}(s'),     beta_{L-1} = 1,

        s' = (s_2, ..., s_k, v), and p(x_t = v | revealed) is proportional to
        the alpha_t beta_t mass on the states whose last token is v (for
        t >= k - 1; the k-th to last for the first positions). Each step is
        normalised, so windows of any length stay in range. What a perfect
        denoiser of an absorbing diffusion returns at a masked position.

        Args:
          x: int[B, L] token ids in [0, V), or -1 where the token is hidden; L >= k.
        Returns:
          float64[B, L, V]: each row a law; at a revealed position, one_hot(x).
        """
        x = np.atleast_2d(np.asarray(x, np.int64))
        b, length = x.shape
        v, k, c = self.vocab_size, self.order, self.num_contexts
        if length < k:
            raise ValueError(f"windows of length {length} are shorter than the order {k}")
        if ((x < -1) | (x >= v)).any():
            raise ValueError(f"token ids must be in [0, {v}) or -1 (hidden)")
        e = np.where(x[..., None] < 0, 1.0, x[..., None] == np.arange(v)).astype(np.float64)  # (B, L, V)
        table = self.transitions.reshape(v, c // v, v)  # P[(a, r), v], r the context's last k - 1 tokens
        first = self.stationary.reshape((v,) * k).copy()  # pi over the first k tokens
        first = first[None] * np.ones((b,) + (1,) * k)
        for j in range(k):  # evidence on the first k tokens
            first *= e[:, j].reshape((b,) + (1,) * j + (v,) + (1,) * (k - 1 - j))
        alpha = np.empty((b, length, c))
        alpha[:, k - 1] = first.reshape(b, c)
        alpha[:, k - 1] /= alpha[:, k - 1].sum(-1, keepdims=True)
        for t in range(k, length):
            nxt = np.einsum("zar,arv->zrv", alpha[:, t - 1].reshape(b, v, c // v), table) * e[:, t, None, :]
            alpha[:, t] = (nxt / nxt.sum((1, 2), keepdims=True)).reshape(b, c)
        beta = np.ones((b, length, c))
        for t in range(length - 2, k - 2, -1):
            back = np.einsum("arv,zrv->zar", table, (e[:, t + 1, None, :] * beta[:, t + 1].reshape(b, c // v, v)))
            beta[:, t] = (back / back.sum((1, 2), keepdims=True)).reshape(b, c)
        joint = (alpha[:, k - 1 :] * beta[:, k - 1 :]).reshape(b, length - k + 1, *(v,) * k)
        post = np.empty((b, length, v))
        post[:, k - 1 :] = joint.sum(axis=tuple(range(2, k + 1)))  # the last token of s_t
        for j in range(k - 1):  # the first positions: token j of s_{k-1}
            post[:, j] = joint[:, 0].sum(axis=tuple(i + 1 for i in range(k) if i != j))
        return post / post.sum(-1, keepdims=True)

    # ------------------------------------------------------------ sampling

    def sample_stream(self, num_tokens: int, seed: int) -> np.ndarray:
        """A stationary stream int32[num_tokens] (a separate seed from the chain's)."""
        rng = np.random.default_rng([self.seed, 1, seed])
        v, k, c = self.vocab_size, self.order, self.num_contexts
        ctx = int(rng.choice(c, p=self.stationary))
        first = [(ctx // v ** (k - 1 - j)) % v for j in range(k)]
        n = max(num_tokens - k, 0)
        cdf = np.cumsum(self.transitions, -1)  # (C, V)
        cdf[:, -1] = 1.0
        u = rng.random(n)
        out = np.empty(n, np.int32)
        for t in range(n):  # a sequential chain
            out[t] = tok = int(np.searchsorted(cdf[ctx], u[t], side="right"))
            ctx = (ctx * v + tok) % c
        return np.concatenate([np.asarray(first, np.int32), out])[:num_tokens]

    def sample(self, num_sequences: int, seq_len: int, seed: int) -> np.ndarray:
        """int32[B, L] independent windows, each with the stationary law."""
        return np.stack([self.sample_stream(seq_len, seed * 1_000_003 + i) for i in range(num_sequences)])


@functools.cache
def _table(v: int, k: int, seed: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """(P float64[C, V], pi float64[C]) of the chain, memoised."""
    rng = np.random.default_rng([seed, 0])
    c = v**k
    p = rng.dirichlet(np.full(v, alpha), size=c)  # (C, V)
    # Tiny floor: every transition possible, so log p is finite for every
    # sequence and the context chain is irreducible (pi unique, > 0).
    p = (p + 1e-6) / (1 + v * 1e-6)
    # pi by power iteration on the context chain c -> (c V + v) mod C;
    # the floor makes it mix, and 10^4 sweeps of a C-state chain are cheap.
    nxt = (np.arange(c)[:, None] * v + np.arange(v)[None, :]) % c  # (C, V)
    pi = np.full(c, 1.0 / c)
    for _ in range(10_000):
        new = np.bincount(nxt.reshape(-1), weights=(pi[:, None] * p).reshape(-1), minlength=c)
        if np.abs(new - pi).max() < 1e-15:
            pi = new
            break
        pi = new
    return p, pi / pi.sum()


# ---------------------------------------------------------------- as a dataset


class MarkovData(TokenData):
    """A Markov chain as a ``sedd.data.packing.TokenData`` (the interface of text datasets).

    Splits are stationary streams drawn with split-specific seeds, so validation
    never overlaps training. Batches go through ``sedd.data.packing.PackedTokens``
    (resumable, per-process), exactly as for text. num_tokens: tokens in the
    train split; validation and test get 1/20 each (at least 64 sequences).
    """

    STREAM = True

    def __init__(self, chain: MarkovChain, seq_len: int, num_tokens: int = 1_000_000):
        self.chain, self.seq_len = chain, int(seq_len)
        self.tokenizer = MarkovTokenizer(chain.vocab_size)
        held = max(num_tokens // 20, 64 * self.seq_len)
        sizes = {"train": int(num_tokens), "validation": held, "test": held}
        self.splits = list(sizes)
        self._tokens = {s: chain.sample_stream(n, seed=i) for i, (s, n) in enumerate(sizes.items())}
        self.stats = {s: {"documents": 1, "chars": len(t), "tokens": len(t)} for s, t in self._tokens.items()}
        self._packed = {}

    def true_nats_per_token(self) -> float:
        """H(x_0..x_{L-1}) / L: the best bound any model can reach, nats/token."""
        return self.chain.sequence_entropy(self.seq_len) / self.seq_len


def chain_from_config(config) -> MarkovChain:
    """The chain a config's ``data.markov`` section describes."""
    m = config.markov
    return MarkovChain(int(m.vocab_size), int(m.order), int(m.seed), float(m.alpha))


def load_markov(config) -> MarkovData:
    """The dataset of a ``data`` config section with name = "markov"."""
    return MarkovData(chain_from_config(config), config.seq_len, int(config.markov.num_tokens))
