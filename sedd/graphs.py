r"""Forward diffusion processes: continuous-time Markov chains on D states.

A graph is a rate matrix Q (D x D). Convention used throughout the code:
**Q[i, j] is the rate of jumping from i to j (row = from)**, rows sum to 0,
and the forward marginal after total noise sigma is

    p_sigma(x_t = j | x_0 = i) = exp(sigma Q)[i, j].

Lou et al. 2024 write the transpose (columns = from, dp/dt = Q p). Their
Q_paper[y, x] is our Q[x, y]; "transition" and "rate" below return rows of
our Q (columns of theirs), "transp_*" columns of ours (rows of theirs).

Two graphs, Sec. 3.3 of Lou et al. 2024, each with closed forms so that no
dense D x D matrix is ever built (D is 50,258 for GPT-2 with a mask):

  Uniform(N):   Q = 1 1^T / N - I.   (J/N is a projector, so
                exp(sigma Q) = e^{-sigma} I + (1 - e^{-sigma}) 1 1^T / N.)
  Absorbing(V): D = V + 1, mask M = V; Q[i, M] = 1, Q[i, i] = -1 for i != M,
                row M is 0. exp(sigma Q)[i] = e^{-sigma} e_i + (1 - e^{-sigma}) e_M.

Shapes: states i or x int[...] (typically [B, L]); sigma, dsigma float and
broadcastable against them ([B, 1]); vectors over states float[..., D].
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp

from sedd.categorical import sample_categorical

ScoreFn = Callable[..., jax.Array]
"""(x int32[B, L], sigma float[B]) -> log_score float32[B, L, D], the log of the
ratios p_t(x with x_l = y) / p_t(x), 0 at y = x_l. With ``score_params`` the
samplers and the bound call it as score_fn(score_params, x, sigma)."""


def log_expm1(x: jax.Array) -> jax.Array:
    """log(e^x - 1) for x > 0, accurate from 1e-7 to beyond 80 in float32.

    log(e^x - 1) = x + log(1 - e^{-x}) = x + log(-expm1(-x)): expm1 keeps the
    small-x end exact and nothing overflows at the large end.
    """
    return x + jnp.log(-jnp.expm1(-x))


def _float_dtype(*xs) -> jnp.dtype:
    """float32, or float64 when an input already is (under jax_enable_x64)."""
    return jnp.result_type(*xs, jnp.float32)


def _default_float() -> jnp.dtype:
    """float32, or float64 under jax_enable_x64 (for rates that take no float input)."""
    return jnp.result_type(float)


def _entropy_term(log_score: jax.Array, log_ratio: jax.Array) -> jax.Array:
    r"""s - r log s + K(r), K(r) = r (log r - 1), for r > 0, written stably.

    With u = log s - log r the sum is r (e^u - u - 1) = r (expm1(u) - u): each
    term is >= 0, exactly 0 at s = r, and free of the cancellation between
    r log s and r log r that costs float32 its digits when r is ~1e6
    (absorbing graph, sigma ~ 1e-6).
    """
    u = log_score - log_ratio
    return jnp.exp(log_ratio) * (jnp.expm1(u) - u)


@dataclasses.dataclass(frozen=True)
class Graph(abc.ABC):
    """A forward CTMC with rate matrix Q. Subclasses give closed forms.

    Frozen dataclasses, so graphs are hashable and can be static arguments of
    ``jax.jit``. The abstract methods are what a new graph must give in closed
    form; reverse_rate and sample_rate follow from them.
    """

    vocab_size: int

    def __post_init__(self):
        if not isinstance(self.vocab_size, int) or self.vocab_size < 1:
            raise ValueError(f"vocab_size must be an integer >= 1, got {self.vocab_size!r}")

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """D, the number of states of the chain."""

    @property
    @abc.abstractmethod
    def absorb(self) -> bool:
        """Whether the chain has an absorbing mask state."""

    @abc.abstractmethod
    def rate(self, i: jax.Array) -> jax.Array:
        """Q[i, :], the rates out of state i (float[..., D])."""

    @abc.abstractmethod
    def transp_rate(self, i: jax.Array) -> jax.Array:
        """Q[:, i], the rates into state i (float[..., D])."""

    @abc.abstractmethod
    def transition(self, i: jax.Array, sigma: jax.Array) -> jax.Array:
        """exp(sigma Q)[i, :] = p_sigma(x_t = . | x_0 = i) (float[..., D])."""

    @abc.abstractmethod
    def transp_transition(self, i: jax.Array, sigma: jax.Array) -> jax.Array:
        """exp(sigma Q)[:, i] = p_sigma(x_t = i | x_0 = .) (float[..., D])."""

    @abc.abstractmethod
    def sample_transition(self, key: jax.Array, i: jax.Array, sigma: jax.Array) -> jax.Array:
        """x_t ~ p_sigma(. | x_0 = i), int32 of the shape of i."""

    @abc.abstractmethod
    def sample_limit(self, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
        """x ~ the limit law p_sigma as sigma -> infinity, int32[shape]."""

    @abc.abstractmethod
    def staggered_score(self, score: jax.Array, dsigma: jax.Array) -> jax.Array:
        """exp(-dsigma Q)^T s, the score mapped back by dsigma of noise.

        The analytic sampler (Thm. 4.2 of Lou et al. 2024) needs
        p_{t-dt}(y) / p_t(x) = sum_z exp(-dsigma Q)[z, y] p_t(z) / p_t(x), i.e.
        this map applied to the ratio vector s_z = p_t(z) / p_t(x): score float[..., D] (ratios, not logs),
        dsigma the noise step, broadcastable against score[..., 0].
        """

    @abc.abstractmethod
    def score_entropy(self, log_score: jax.Array, sigma: jax.Array, x: jax.Array, x0: jax.Array) -> jax.Array:
        r"""Denoising score entropy at one position, Eq. (8) of Lou et al. 2024.

            sum_{y != x} Q[y, x] (s_y - r_y log s_y + K(r_y)),
            r_y = p_sigma(y | x0) / p_sigma(x | x0),  K(a) = a (log a - 1),

        with s = exp(log_score). The weight Q[y, x] is the forward rate from y
        into x (the paper's Q_t(x, y) in its column convention). K makes the
        loss >= 0 with equality exactly at s = r. log_score: the model's log-ratios at the noised states
        x (x_t); x0: the clean states. Returns the loss at each position in nats, not yet weighted by dsigma.
        """

    def reverse_rate(self, i: jax.Array, score: jax.Array) -> jax.Array:
        r"""The reverse-time rates out of i, Eq. (4) of Lou et al. 2024.

            Qbar[i, y] = Q[y, i] s_y  (y != i),   Qbar[i, i] = -sum_{y != i} Qbar[i, y],

        where s_y approximates p_t(y) / p_t(i) (score: ratios, not logs). Rows sum to 0.
        """
        rates = self.transp_rate(i) * score  # (..., D)
        here = jax.nn.one_hot(i, self.dim, dtype=bool)
        rates = jnp.where(here, 0.0, rates)
        return rates - here * rates.sum(-1, keepdims=True)

    def sample_rate(self, key: jax.Array, i: jax.Array, rate: jax.Array, method: str = "precise") -> jax.Array:
        """One tau-leaping step from states i: int32[...] a draw from the categorical one_hot(i) + rate.

        rate: float[..., D] a rate row already scaled by the step dt, the diagonal holding minus the off-diagonal
        sum; method: of ``sedd.categorical``.
        """
        probs = jax.nn.one_hot(i, self.dim, dtype=rate.dtype) + rate
        return sample_categorical(key, probs, method)


@dataclasses.dataclass(frozen=True)
class Uniform(Graph):
    """Q = 1 1^T / N - I: every token jumps to a uniformly drawn token at rate 1.

    D = N = vocab_size. The limit law is uniform over the vocabulary.
    """

    absorb = False

    @property
    def dim(self) -> int:
        return self.vocab_size

    def rate(self, i):
        n, dtype = self.dim, _default_float()
        i = jnp.asarray(i)
        return jnp.full(i.shape + (n,), 1.0 / n, dtype) - jax.nn.one_hot(i, n, dtype=dtype)

    transp_rate = rate  # Q is symmetric

    def transition(self, i, sigma):
        """e^{-sigma} e_i + (1 - e^{-sigma}) / N: a token survives or is resampled."""
        dtype = _float_dtype(sigma)
        sigma = jnp.asarray(sigma, dtype)[..., None]
        move = -jnp.expm1(-sigma)  # 1 - e^{-sigma}, exact at small sigma
        return move / self.dim + jnp.exp(-sigma) * jax.nn.one_hot(i, self.dim, dtype=dtype)

    transp_transition = transition

    def sample_transition(self, key, i, sigma):
        k_move, k_token = jax.random.split(key)
        move = jax.random.uniform(k_move, i.shape) < -jnp.expm1(-jnp.asarray(sigma))
        token = jax.random.randint(k_token, i.shape, 0, self.dim, dtype=jnp.int32)
        return jnp.where(move, token, i).astype(jnp.int32)

    def sample_limit(self, key, shape):
        return jax.random.randint(key, shape, 0, self.dim, dtype=jnp.int32)

    def staggered_score(self, score, dsigma):
        """exp(-dsigma Q) s = e^{dsigma} s - (e^{dsigma} - 1) mean(s) (Q symmetric).

        Computed as e^{dsigma} (s - mean(s)) + mean(s): the same number, but at
        dsigma ~ 20 (the first step of a geometric schedule) the written form
        subtracts two terms of size e^20 and float32 loses the score entirely.
        """
        dsigma = jnp.asarray(dsigma, score.dtype)[..., None]
        mean = score.mean(-1, keepdims=True)
        return jnp.exp(dsigma) * (score - mean) + mean

    def score_entropy(self, log_score, sigma, x, x0):
        """Closed form of the ratios r_y = p_sigma(y | x0) / p_sigma(x | x0).

        With m = e^sigma - 1: if x = x0, r_y = m / (m + N) for every y != x;
        if x != x0, r_{x0} = (m + N) / m and r_y = 1 for the other y. The
        original computes the first as 1 - N / (m + N), which cancels in
        float32 at small sigma; m / (m + N) is the same number without it.
        The weight Q[y, x] = 1/N for every y != x.
        """
        n = self.dim
        x, x0 = jnp.asarray(x), jnp.asarray(x0)
        sigma = jnp.asarray(sigma, log_score.dtype)[..., None]  # (..., 1)
        log_m = log_expm1(sigma)
        log_m_plus_n = jnp.logaddexp(log_m, jnp.log(jnp.asarray(n, log_score.dtype)))
        is_x0 = jax.nn.one_hot(x0, n, dtype=bool)  # (..., D)
        clean = (x == x0)[..., None]  # (..., 1)
        log_ratio = jnp.where(clean, log_m - log_m_plus_n, jnp.where(is_x0, log_m_plus_n - log_m, 0.0))
        terms = _entropy_term(log_score, log_ratio)  # (..., D)
        terms = jnp.where(jax.nn.one_hot(x, n, dtype=bool), 0.0, terms)
        return terms.sum(-1) / n


@dataclasses.dataclass(frozen=True)
class Absorbing(Graph):
    """Every token jumps to the absorbing MASK (id vocab_size) at rate 1.

    D = vocab_size + 1. The limit law is all MASK.
    """

    absorb = True

    @property
    def dim(self) -> int:
        return self.vocab_size + 1

    @property
    def mask(self) -> int:
        """The id of the absorbing state."""
        return self.vocab_size

    def rate(self, i):
        """e_M - e_i for i != M, and 0 out of M (M - M)."""
        dtype = _default_float()
        return jax.nn.one_hot(self.mask, self.dim, dtype=dtype) - jax.nn.one_hot(i, self.dim, dtype=dtype)

    def transp_rate(self, i):
        """-e_i for i != M (nothing enters a token); 1 - e_M into M."""
        is_mask = (jnp.asarray(i) == self.mask)[..., None]
        dtype = _default_float()
        return is_mask.astype(dtype) - jax.nn.one_hot(i, self.dim, dtype=dtype)

    def transition(self, i, sigma):
        """e^{-sigma} e_i + (1 - e^{-sigma}) e_M (which is e_M for i = M)."""
        dtype = _float_dtype(sigma)
        sigma = jnp.asarray(sigma, dtype)[..., None]
        e_i, e_mask = (jax.nn.one_hot(j, self.dim, dtype=dtype) for j in (i, self.mask))
        return jnp.exp(-sigma) * e_i - jnp.expm1(-sigma) * e_mask

    def transp_transition(self, i, sigma):
        """Column i: e^{-sigma} e_i for a token; (1 - e^{-sigma}) 1 + e^{-sigma} e_M for M."""
        dtype = _float_dtype(sigma)
        sigma = jnp.asarray(sigma, dtype)[..., None]
        is_mask = (jnp.asarray(i) == self.mask)[..., None]
        into_mask = -jnp.expm1(-sigma) * is_mask  # (..., 1)
        return into_mask + jnp.exp(-sigma) * jax.nn.one_hot(i, self.dim, dtype=dtype)

    def sample_transition(self, key, i, sigma):
        move = jax.random.uniform(key, i.shape) < -jnp.expm1(-jnp.asarray(sigma))
        return jnp.where(move, self.mask, i).astype(jnp.int32)

    def sample_limit(self, key, shape):
        del key  # the limit is a point mass
        return jnp.full(shape, self.mask, dtype=jnp.int32)

    def staggered_score(self, score, dsigma):
        """e^{dsigma} s_y for tokens; s_M - (e^{dsigma} - 1) sum_{y != M} s_y for M."""
        dsigma = jnp.asarray(dsigma, score.dtype)[..., None]
        token_total = score[..., : self.mask].sum(-1, keepdims=True)
        is_mask = jax.nn.one_hot(self.mask, self.dim, dtype=score.dtype)
        return jnp.where(is_mask > 0, score - jnp.expm1(dsigma) * token_total, jnp.exp(dsigma) * score)

    def score_entropy(self, log_score, sigma, x, x0):
        """Nonzero only at masked positions (Q[y, x] = 0 for y != x unless x = M).

        There Q[y, M] = 1 and r_y = 0 except r_{x0} = e^{-sigma} / (1 - e^{-sigma})
        = 1 / (e^sigma - 1), so the loss is sum_{y != M, x0} s_y + the stable
        r (expm1(u) - u) term at x0.
        """
        x = jnp.asarray(x)
        sigma = jnp.asarray(sigma, log_score.dtype)[..., None]  # (..., 1)
        log_ratio = -log_expm1(sigma)
        is_x0 = jax.nn.one_hot(x0, self.dim, dtype=bool)  # (..., D)
        is_mask = jax.nn.one_hot(self.mask, self.dim, dtype=bool)
        terms = jnp.where(is_x0, _entropy_term(log_score, log_ratio), jnp.exp(log_score))
        terms = jnp.where(is_mask, 0.0, terms)
        return jnp.where(x == self.mask, terms.sum(-1), 0.0)


GRAPHS = {"absorbing": Absorbing, "uniform": Uniform}


def get_graph(name: str, vocab_size: int) -> Graph:
    """The graph called `name` ("absorbing" or "uniform") over vocab_size tokens."""
    if name not in GRAPHS:
        raise ValueError(f"unknown graph {name!r}; expected one of {sorted(GRAPHS)}")
    return GRAPHS[name](vocab_size)
