r"""Brute-force references shared by the tests, built from DESIGN.md's definitions only.

Nothing here calls the closed forms of ``sedd.graphs`` or ``sedd.noise``: a
graph is only asked its class and ``vocab_size``, a schedule its class and
parameters.

  dense_q             the D x D rate matrix Q, row = from (Q[i, j]: rate of i -> j)
  expm_q              scipy's exp(sigma Q), float64
  transition_matrix   exp(sigma Q) in jnp (traceable), from Q^2 = -Q
  noised_law          p_sigma over all D^L sequences, by enumeration, float64
  exact_score_fn      the exact log-score of a law over V^L, as a score_fn
  score_entropy_by_definition, reverse_rate_by_definition
                      the per-position loss and the reverse rate, term by term
  schedule_by_definition
                      sigma_bar(t) and its derivative from the formulas, float64
  tv, empirical_law, all_sequences, seq_index
  tv_bound, tv_noise_bound
                      how far an empirical law of n draws strays from its law

Shapes: B batch, L length, N sequences of a law, D = graph dim.
"""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg

from sedd import graphs, noise


def dense_q(graph) -> np.ndarray:
    """Q as float64[D, D] (rows sum to 0), from the graph's definition.

    Uniform(N):   Q = 1 1^T / N - I, D = N.
    Absorbing(V): D = V + 1, mask M = V; Q[i, M] = 1 and Q[i, i] = -1 for
                  i != M; row M is 0.
    """
    n = graph.vocab_size
    if isinstance(graph, graphs.Absorbing):
        q = np.zeros((n + 1, n + 1))
        q[:n, n] = 1.0
        q[np.arange(n), np.arange(n)] = -1.0
        return q
    if isinstance(graph, graphs.Uniform):
        return np.ones((n, n)) / n - np.eye(n)
    raise TypeError(f"no reference rate matrix for {graph!r}")


def expm_q(graph, sigma: float) -> np.ndarray:
    """exp(sigma Q) by scipy's Pade expm, float64[D, D]: row i is p_sigma(. | x_0 = i)."""
    return scipy.linalg.expm(float(sigma) * dense_q(graph))


def transition_matrix(graph, sigma: jax.Array) -> jax.Array:
    r"""exp(sigma Q) as float[..., D, D] for sigma float[...], jit-traceable.

    Both graphs have Q^2 = -Q, so Pi = Q + I is a projector (its rows are the
    limit law) and the exponential series collapses to

        exp(sigma Q) = e^{-sigma} I + (1 - e^{-sigma}) Pi,

    a sum of two non-negative terms: no cancellation in float32 at any sigma
    (I + (1 - e^{-sigma}) Q would lose e^{-sigma} on the diagonal at sigma ~ 15).
    The dtype follows sigma (float32 unless sigma is float64).
    """
    q = dense_q(graph)
    proj = q + np.eye(len(q))
    assert np.allclose(proj @ proj, proj), "the closed form needs Q^2 = -Q"
    sigma = jnp.asarray(sigma, jnp.result_type(sigma, jnp.float32))[..., None, None]
    eye, proj = jnp.asarray(np.eye(len(q)), sigma.dtype), jnp.asarray(proj, sigma.dtype)
    return jnp.exp(-sigma) * eye - jnp.expm1(-sigma) * proj


def all_sequences(num_tokens: int, length: int) -> np.ndarray:
    """Every sequence over range(num_tokens), in seq_index order: int64[num_tokens^length, length]."""
    return np.array(list(itertools.product(range(num_tokens), repeat=length)), np.int64)


def seq_index(x, num_tokens: int) -> np.ndarray:
    """Sequences int[..., L] -> their rows in all_sequences(num_tokens, L) (base-num_tokens digits)."""
    x = np.asarray(x, np.int64)
    return (x * num_tokens ** np.arange(x.shape[-1] - 1, -1, -1)).sum(-1)


def noised_law(graph, seqs, probs, sigma: float) -> np.ndarray:
    r"""p_sigma over all_sequences(D, L), float64[D^L], by enumeration:

        p_sigma(z) = sum_n probs[n] prod_l exp(sigma Q)[seqs[n, l], z_l].

    Args:
      graph: the forward graph.
      seqs: int[N, L] the support of the clean law.
      probs: float[N] its probabilities.
      sigma: total noise.
    """
    seqs = np.asarray(seqs, np.int64)
    p = expm_q(graph, sigma)
    states = all_sequences(len(p), seqs.shape[1])  # (D^L, L)
    kernel = np.ones((len(seqs), len(states)))  # (N, D^L)
    for l in range(seqs.shape[1]):
        kernel *= p[seqs[:, l]][:, states[:, l]]
    return np.asarray(probs, np.float64) @ kernel


def exact_score_fn(graph, seqs, probs):
    r"""The exact log-score of a law over sequences, as a ``score_fn``.

    For the clean law p0 = sum_n probs[n] delta(seqs[n]),

        p_sigma(x) = sum_n probs[n] prod_l exp(sigma Q)[seqs[n, l], x_l],
        log_score[b, l, y] = log p_sigma(x_b with x_l = y) - log p_sigma(x_b),

    enumerated over the N sequences with ``transition_matrix`` (not sedd's
    closed forms). A ratio of 0 comes out as log(float tiny) (about -87 in
    float32): exp of it is 0 to the precision of any sampler or loss.

    Args:
      graph: the forward graph.
      seqs: int[N, L] the support of p0.
      probs: float[N] its probabilities.
    Returns:
      score_fn(x int[B, L], sigma float[B]) -> log_score float[B, L, D],
      jit-traceable, 0 at y = x_l; float32 unless sigma is float64.
    """
    seqs = np.asarray(seqs, np.int64)
    probs = np.asarray(probs, np.float64)
    length, dim = seqs.shape[1], len(dense_q(graph))
    rows = int(seqs.max()) + 1  # K: only rows of clean tokens of exp(sigma Q) are needed
    onehot0 = np.eye(rows)[seqs]  # (N, L, K): one-hot matmuls, not gathers, for speed on CPU

    def score_fn(x, sigma):
        x = jnp.asarray(x, jnp.int32)
        dtype = jnp.result_type(sigma, jnp.float32)
        sigma = jnp.broadcast_to(jnp.asarray(sigma, dtype), x.shape[:1])  # (B,)
        trans = transition_matrix(graph, sigma)[:, :rows, :]  # (B, K, D)
        idx = jnp.broadcast_to(x[:, None, :], (x.shape[0], rows, length))
        into_x = jnp.take_along_axis(trans, idx, axis=2)  # (B, K, L): exp(sigma Q)[v, x_l]
        onehot = jnp.asarray(onehot0, dtype)
        here = jnp.einsum("nlv,bvl->bnl", onehot, into_x)  # (B, N, L): exp(sigma Q)[x0_l, x_l]
        p = jnp.asarray(probs, dtype)
        # weight[b, n, l] = p0(n) prod_{l' != l} exp(sigma Q)[x0_l', x_l']
        weight = jnp.stack(
            [p * jnp.prod(here[:, :, [k for k in range(length) if k != l]], axis=2) for l in range(length)], axis=2
        )  # (B, N, L)
        num = jnp.einsum("bnl,nlv,bvy->bly", weight, onehot, trans)  # p_sigma(x with x_l = y)
        den = jnp.take_along_axis(num, x[..., None], axis=2)  # (B, L, 1) = p_sigma(x)
        tiny = jnp.finfo(dtype).tiny
        log_score = jnp.log(jnp.maximum(num, tiny)) - jnp.log(jnp.maximum(den, tiny))
        return jnp.where(jax.nn.one_hot(x, dim, dtype=bool), 0.0, log_score)

    return score_fn


def score_entropy_by_definition(graph, log_score, sigma: float, x: int, x0: int):
    r"""The per-position denoising score entropy, term by term in float64.

        sum_{y != x} Q[y, x] (s_y - r_y log s_y + K(r_y)),
        r_y = p_sigma(y | x0) / p_sigma(x | x0),  K(a) = a (log a - 1),  K(0) = 0.

    Args:
      log_score: float[D] log s.
      x, x0: the noised and the clean state, with p_sigma(x | x0) > 0.
    Returns:
      (value, scale): the loss and sum_y |Q[y, x]| (|s_y| + |r_y log s_y| + |K(r_y)|),
      the size of its terms, against which an error is judged.
    """
    q, p = dense_q(graph), expm_q(graph, sigma)
    assert p[x0, x] > 0, (x, x0)
    log_score = np.asarray(log_score, np.float64)
    r = p[x0] / p[x0, x]
    value = scale = 0.0
    for y in range(len(q)):
        if y == x or q[y, x] == 0:
            continue
        r_log_s = r[y] * log_score[y] if r[y] > 0 else 0.0
        k = r[y] * (math.log(r[y]) - 1) if r[y] > 0 else 0.0
        s = math.exp(log_score[y])
        value += q[y, x] * (s - r_log_s + k)
        scale += abs(q[y, x]) * (s + abs(r_log_s) + abs(k))
    return value, scale


def reverse_rate_by_definition(graph, i: int, score) -> np.ndarray:
    """Q[y, i] s_y off the diagonal, minus their sum on it: float64[D]."""
    out = dense_q(graph)[:, i] * np.asarray(score, np.float64)
    out[i] = 0.0
    out[i] = -out.sum()
    return out


def schedule_by_definition(schedule, t):
    r"""(sigma_bar(t), d sigma_bar / dt) of a ``sedd.noise`` schedule, float64, from Sec. 3.3:

    Geometric(a, b): sigma_bar = a^{1-t} b^t, its derivative sigma_bar log(b / a);
    LogLinear(eps):  sigma_bar = -log(1 - (1 - eps) t), derivative (1 - eps) / (1 - (1 - eps) t).
    """
    t = np.asarray(t, np.float64)
    if isinstance(schedule, noise.Geometric):
        a, b = schedule.sigma_min, schedule.sigma_max
        sigma = a ** (1 - t) * b**t
        return sigma, sigma * math.log(b / a)
    if isinstance(schedule, noise.LogLinear):
        rate = 1 - schedule.eps
        return -np.log1p(-rate * t), rate / (1 - rate * t)
    raise TypeError(f"no reference formula for {schedule!r}")


def tv(p, q) -> float:
    """Total variation distance 1/2 sum |p - q| between two laws on the same cells."""
    return 0.5 * float(np.abs(np.asarray(p, np.float64) - np.asarray(q, np.float64)).sum())


def empirical_law(x, num_tokens: int) -> np.ndarray:
    """The empirical law of sequences x int[n, L] over all_sequences(num_tokens, L).

    Tokens outside range(num_tokens) are an error, not a silently dropped draw.
    """
    x = np.asarray(x)
    assert x.min() >= 0 and x.max() < num_tokens, (x.min(), x.max())
    return np.bincount(seq_index(x, num_tokens), minlength=num_tokens ** x.shape[1]) / len(x)


def tv_bound(dim: int, n: int, delta: float = 1e-9) -> float:
    r"""A bound TV(empirical law of n iid draws, their law) exceeds with probability < delta.

    It holds for every law on `dim` cells:
      E TV = 1/2 sum_j E|p^_j - p_j| <= 1/2 sum_j sqrt(p_j / n) <= 1/2 sqrt(dim / n)
      (Jensen, then Cauchy-Schwarz), and one draw moves TV by at most 1/n, so
      McDiarmid gives P(TV >= E TV + u) <= exp(-2 n u^2), u = sqrt(log(1/delta) / (2 n)).
    At dim = 6, n = 1e5 it is 0.014; at dim = 27, n = 2e4, 0.041.
    """
    return 0.5 * math.sqrt(dim / n) + math.sqrt(math.log(1 / delta) / (2 * n))


def tv_noise_bound(p, n: int, reps: int = 400, sds: float = 5.0, seed: int = 0) -> float:
    """mean + sds x sd of TV(empirical law of n draws from p, p), by simulation.

    Tighter than ``tv_bound`` (0.022 against 0.041 for 27 cells at n = 20k)
    because it uses p; meant for a sampler's law q close to p, whose draws
    scatter around q as draws from p scatter around p. Deterministic (seeded).
    """
    p = np.asarray(p, np.float64)
    p = p / p.sum()
    counts = np.random.default_rng(seed).multinomial(n, p, size=reps)  # (reps, cells)
    tvs = 0.5 * np.abs(counts / n - p).sum(-1)
    return float(tvs.mean() + sds * tvs.std())


def perturbed(params, scale: float, seed: int):
    """params with N(0, scale^2) noise added to every leaf: a network whose output depends on its input.

    Zero-initialised output layers make a fresh network's every score the same; tests that compare draws
    or laws of a network perturb its weights first.
    """
    return _perturbed(params, float(scale), int(seed))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _perturbed(params, scale: float, seed: int):
    """``perturbed`` as one compiled program a network's shapes (eagerly, two ops a leaf shape a test file)."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [p + scale * jax.random.normal(k, p.shape, p.dtype) for p, k in zip(leaves, keys)])


def greedy_by_full_passes(net, ids, n: int) -> list[int]:
    """`ids` and the n tokens after it by argmax, each from a full forward pass of a causal network (no cache).

    Every pass reads one input of len(ids) + n positions (zeros after the text: a causal network's logits at a
    position read only the tokens before it), so the n passes are one compiled program, not one a length.
    """
    from flax import nnx

    from sedd.kinds import causal

    ids, length = list(ids), len(ids) + n
    forward = nnx.jit(causal.next_token_logits)
    for _ in range(n):
        x = jnp.asarray([ids + [0] * (length - len(ids))], jnp.int32)
        ids.append(int(jnp.argmax(forward(net, x)[0, len(ids)])))
    return ids
