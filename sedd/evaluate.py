r"""Evaluation: the likelihood bound, generative perplexity, sample entropy.

Three figures, each measured the same way for every model and sampler:

1. ``likelihood_bound``: the score-entropy upper bound on -log p_theta(x0),
   averaged over a split by ``dataset_bound`` (``dataset_nll`` for a model with
   an exact likelihood).
2. ``generative_perplexity`` under a judge's NLL function, always reported with
   ``sample_entropy_bits``: repetitive samples get flattering perplexities.
3. On synthetic data with a known law (``sedd.data.markov``) the exact NLL of
   each sample instead of a judge's.

Pure: these functions take score functions, NLL functions and batches, and
know no network; the figures of a run directory are ``sedd.figures``'.

Letters: B sequences, L length, V vocabulary, D = graph.dim, R Monte Carlo
repetitions, n points of the time grid.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Iterable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from sedd import losses
from sedd.data import unigram_entropy_bits
from sedd.graphs import Graph, ScoreFn

# =========================================================================== the bound


def prior_kl(graph: Graph, noise: Callable, x0: jax.Array) -> jax.Array:
    r"""KL(p_{sigma(1)}(. | x0) || p_base) summed over positions: float32[B] nats.

    p_base is the forward marginal at sigma(1) of tokens drawn uniformly,
    b = (1/V) sum_v exp(sigma(1) Q)[v, :], per position. For the uniform graph
    that is the uniform limit itself, and

        KL = sum_l sum_y q_y log(N q_y),  q = exp(sigma(1) Q)[x0_l, :].

    For the absorbing graph the limit is the point mass on MASK, against which
    the KL is infinite whenever a token can survive to t = 1 (probability
    e^{-sigma(1)} > 0). Against b instead (MASK with probability 1 - e^{-sigma},
    a uniform token otherwise) it is finite and closed-form:

        KL = L e^{-sigma(1)} log V,

    e.g. 2e-9 L log V at sigma(1) = 20, or 1e-3 L log V for the log-linear
    schedule with eps = 1e-3. The bound is then a bound for the reverse chain
    started from b; the sampler starts from all-MASK, whose law differs from b
    by at most L e^{-sigma(1)} in total variation. x0: int[B, L].
    """
    sigma1, _ = noise(jnp.float32(1.0))
    q = graph.transition(x0, sigma1)  # (B, L, D)
    v = graph.vocab_size
    # b in closed form, not as the mean of V rows (a [V, D] matrix: 10 GB at GPT-2's vocabulary).
    if graph.absorb:  # e^{-sigma}/V on each token, 1 - e^{-sigma} on MASK
        base = jnp.concatenate([jnp.full((v,), jnp.exp(-sigma1) / v), -jnp.expm1(-sigma1)[None]])  # (D,)
    else:  # the uniform law is stationary
        base = jnp.full((v,), 1.0 / v)  # (D,)
    terms = jnp.where(q > 0, q * (jnp.log(jnp.where(q > 0, q, 1.0)) - jnp.log(base)), 0.0)
    return terms.sum((-1, -2))


@functools.partial(
    jax.jit,
    static_argnames=(
        "score_fn",
        "graph",
        "noise",
        "num_t",
        "num_samples",
        "t_min",
        "t_batch",
        "per_position",
        "prepare",
    ),
)
def _dse_integrals(
    key, x0, score_params, *, score_fn, graph, noise, num_t, num_samples, t_min, t_batch, per_position, prepare
):
    """R independent stratified estimates of int_{t_min}^1 E[sigma' SE] dt: float32[R, B]."""
    if prepare is not None:  # once, outside the map over t
        score_params = prepare(score_params, x0)
    call = score_fn if score_params is None else functools.partial(score_fn, score_params)
    r, n, b = num_samples, num_t, x0.shape[0]
    k_shift, key = jax.random.split(key)
    shift = jax.random.uniform(k_shift, (r, 1))  # one shift per repetition
    t = t_min + (1.0 - t_min) * (jnp.arange(n)[None, :] + shift) / n  # (R, n): one t per stratum

    def integrand(args):
        t_i, k_i = args
        per_pos = per_position(jax.random.wrap_key_data(k_i), call, graph, noise, x0, t=jnp.full((b,), t_i))  # (B, L)
        return per_pos.sum(-1)  # (B,)

    keys = jax.random.key_data(jax.random.split(key, r * n))
    values = jax.lax.map(integrand, (t.reshape(-1), keys), batch_size=t_batch)  # (R n, B)
    return (1.0 - t_min) * values.reshape(r, n, b)


class BoundEstimate(NamedTuple):
    """``likelihood_bound`` with its Monte Carlo standard error: float32[B] nats per sequence each."""

    bound: jax.Array
    stderr: jax.Array


def likelihood_bound(*args, **kwargs) -> jax.Array:
    """``likelihood_bound_with_stderr(...).bound``: float32[B] nats per sequence, the same arguments."""
    return likelihood_bound_with_stderr(*args, **kwargs).bound


def likelihood_bound_with_stderr(
    key: jax.Array,
    score_fn: ScoreFn,
    graph: Graph,
    noise: Callable,
    x0: jax.Array,
    num_t: int = 64,
    *,
    num_samples: int = 1,
    t_min: float = 1e-5,
    prior: bool = True,
    score_params: Any = None,
    t_batch: int | None = None,
    per_position: Callable = losses.loss_per_position,
    prepare: Callable | None = None,
) -> BoundEstimate:
    r"""Upper bound on -log p_theta(x0), nats per sequence (Thm. 3.6 / Eq. (13), Lou et al. 2024), with its error.

        -log p_theta(x0) <= int_0^1 E_{x_t ~ p_{sigma(t)}(. | x0)} sum_l sigma'(t)
                              SE_l(s_theta(x_t, sigma(t)), sigma(t), x_t, x0) dt
                            + KL(p_{sigma(1)}(. | x0) || p_base),

    SE the per-position denoising score entropy of ``Graph.score_entropy``;
    the second term is ``prior_kl``. The t integral over [t_min, 1] is
    estimated on a stratified grid (n points, one uniform shift per
    repetition, a fresh x_t at each point), averaged over R repetitions. The
    Monte Carlo standard error of each sequence's estimate is the spread of the
    R repetitions (R >= 2), or for R = 1 the iid formula over the n grid
    points, which overestimates it; inf for R = n = 1. The derivation, the
    standard error and why the bound is tight at the exact score: docs/math.md,
    "The likelihood bound".

    Args:
      score_fn: (x, sigma) -> log-score; with score_params (traced), (params, x, sigma).
        Static, as per_position and prepare: pass the same object to reuse the compilation.
      x0: int[B, L] clean tokens in [0, V).
      num_t: n, points of the time grid per repetition; num_samples: R, repetitions.
      t_min: the lower end of the t integral, in [0, 1).
      prior: add ``prior_kl``.
      t_batch: grid points evaluated together in one score_fn call; None = one at a time.
      per_position: the integrand at one t, (key, score_fn, graph, noise, x0,
        t=float[B]) -> float[B, L]: ``losses.loss_per_position`` (SEDD), or a block model's.
      prepare: optional (score_params, x0) -> what score_fn then takes in place of score_params:
        the work that depends on x0 alone, done once a batch (a block model's clean keys and values).
    """
    if not (isinstance(num_t, int) and num_t >= 1 and isinstance(num_samples, int) and num_samples >= 1):
        raise ValueError(f"num_t and num_samples must be integers >= 1, got {num_t!r}, {num_samples!r}")
    if not 0.0 <= t_min < 1.0:
        raise ValueError(f"t_min must be in [0, 1), got {t_min!r}")
    x0 = jnp.asarray(x0, jnp.int32)
    if x0.ndim != 2:
        raise ValueError(f"x0 must be int[B, L], got shape {x0.shape}")
    values = _dse_integrals(
        key,
        x0,
        score_params,
        score_fn=score_fn,
        graph=graph,
        noise=noise,
        num_t=num_t,
        num_samples=num_samples,
        t_min=float(t_min),
        t_batch=t_batch,
        per_position=per_position,
        prepare=prepare,
    )  # (R, n, B)
    per_rep = values.mean(1)  # (R, B)
    bound = per_rep.mean(0)
    if prior:
        bound = bound + prior_kl(graph, noise, x0)
    if num_samples >= 2:
        stderr = per_rep.std(0, ddof=1) / math.sqrt(num_samples)
    else:
        stderr = values[0].std(0, ddof=1) / math.sqrt(num_t) if num_t > 1 else jnp.full_like(bound, jnp.inf)
    return BoundEstimate(bound, stderr)


def _dataset_figures(
    per_sequence: Callable,
    batches: Iterable,
    max_batches: int | None,
    chars_per_token: float | None,
    progress: bool,
    desc: str,
) -> dict:
    """Average per-sequence nats over batches: ``per_sequence(i, x0) -> (nats float[B], stderr float[B] or None)``."""
    total, var, n_seq, n_tok = 0.0, 0.0, 0, 0
    if max_batches is None and hasattr(batches, "__len__"):
        max_batches = len(batches)
    bar = tqdm(total=max_batches, desc=desc, disable=not progress, dynamic_ncols=True)
    for i, batch in enumerate(batches):
        if max_batches is not None and i >= max_batches:
            break
        x0 = jnp.asarray(batch, jnp.int32)
        nats, err = per_sequence(i, x0)
        total += float(nats.sum())
        if err is not None:
            var += float((err.astype(jnp.float32) ** 2).sum())
        n_seq += x0.shape[0]
        n_tok += x0.size
        bar.update(1)
    bar.close()
    if n_tok == 0:
        raise ValueError("no batches to evaluate")
    out = losses.units(total / n_tok, chars_per_token)
    out.update(
        nats_per_seq=total / n_seq, stderr_nats_per_token=math.sqrt(var) / n_tok, num_sequences=n_seq, num_tokens=n_tok
    )
    return out


def dataset_bound(
    key: jax.Array,
    score_fn: ScoreFn,
    graph: Graph,
    noise: Callable,
    batches: Iterable,
    num_t: int = 64,
    *,
    max_batches: int | None = None,
    chars_per_token: float | None = None,
    score_params: Any = None,
    progress: bool = False,
    **kwargs,
) -> dict:
    """The bound averaged over int[B, L] batches (batch i with fold_in(key, i); the other arguments as
    ``likelihood_bound``'s): the units of ``losses.units`` (bits_per_char with chars_per_token), nats_per_seq,
    stderr_nats_per_token (the sequences independent), num_sequences, num_tokens, and exact = False."""

    def per_sequence(i, x0):
        return likelihood_bound_with_stderr(
            jax.random.fold_in(key, i), score_fn, graph, noise, x0, num_t, score_params=score_params, **kwargs
        )

    return {**_dataset_figures(per_sequence, batches, max_batches, chars_per_token, progress, "bound"), "exact": False}


def dataset_nll(
    nll: Callable,
    batches: Iterable,
    *,
    max_batches: int | None = None,
    chars_per_token: float | None = None,
    progress: bool = False,
) -> dict:
    """The exact NLL of a model over a split (nll: x0 int32[B, L] -> float[B] nats per sequence), in the units
    of ``dataset_bound`` (stderr 0, exact = True)."""
    figures = _dataset_figures(lambda i, x0: (nll(x0), None), batches, max_batches, chars_per_token, progress, "nll")
    return {**figures, "exact": True}


# =========================================================================== samples


def sample_entropy_bits(samples) -> np.ndarray:
    """Unigram entropy of each sample's own token frequencies: float64[B] bits.

    A sample that repeats a few tokens has low entropy; GPT-2 text of 1024
    tokens sits near 7.5-8 bits (5.2-5.6 nats), and sampler artefacts that
    lower gen-PPL (low temperature, float32 Gumbel) show up here.
    """
    return np.array([unigram_entropy_bits(row) for row in np.atleast_2d(np.asarray(samples))])


def samples_nll(nll: Callable, samples, batch_size: int = 64) -> np.ndarray:
    """-log p_judge(sample) of each sample int[B, L] under a judge (x0 int32[b, L] -> float[b] nats per
    sequence; ``sedd.figures.judge_nll``): float64[B] nats. Every call gets batch_size sequences (the last
    padded with copies of its first row), so a jitted judge compiles once."""
    samples = np.asarray(samples)
    out = []
    for i in range(0, len(samples), batch_size):
        chunk = samples[i : i + batch_size]
        pad = batch_size - len(chunk) if len(samples) > batch_size else 0  # one compiled shape
        x = np.concatenate([chunk, np.repeat(chunk[:1], pad, 0)]) if pad else chunk
        out.append(np.asarray(nll(jnp.asarray(x, jnp.int32)), np.float64)[: len(chunk)])
    return np.concatenate(out)


def generative_perplexity(nll: Callable, samples, batch_size: int = 64) -> dict:
    """Perplexity of samples under a judge, with the entropy of the samples.

    gen_ppl = exp(sum of NLL / number of tokens), every token of every sample
    weighted equally (the convention of SEDD, MDLM, ReMDM). Arguments as
    ``samples_nll``'s; returns gen_ppl, judge_nats_per_token, entropy_bits
    (the mean of ``sample_entropy_bits``) and per_sample_nats.
    """
    nats = samples_nll(nll, samples, batch_size)
    per_token = float(nats.sum() / np.asarray(samples).size)
    return {
        "gen_ppl": math.exp(min(per_token, 700.0)),
        "judge_nats_per_token": per_token,
        "entropy_bits": float(sample_entropy_bits(samples).mean()),
        "per_sample_nats": nats,
    }
