r"""The denoising score entropy loss, Monte Carlo over t (Sec. 3.2-3.3 of Lou et al. 2024).

For a clean sequence x0 of length L the training objective is

    L_DSE(x0) = E_{t ~ U[eps, 1]} E_{x_t ~ p_sigma_bar(t)(. | x0)}
                sum_l  sigma(t) * SE_l(s_theta(x_t, sigma_bar(t)), sigma_bar(t), x_t^l, x0^l),

with SE the per-position score entropy of ``Graph.score_entropy``. Integrated
over t in [0, 1] rather than sampled, and with an exact score, it is an upper
bound on -log p(x0) (Thm. 3.6, Eq. (13)) up to the prior term at t = 1, so the
loss is in **nats per sequence**. Divide by L for nats per token; ``units``
converts to bits and perplexity.

Shapes: B batch, L length, D = graph.dim.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp

from sedd.graphs import Graph, ScoreFn


def sample_times(
    key: jax.Array, batch_size: int, sampling_eps: float = 1e-3, low_discrepancy: bool = False
) -> jax.Array:
    """t ~ U[sampling_eps, 1], one per sequence: float32[B].

    SEDD draws t = (1 - eps) u + eps independently. With low_discrepancy the
    B draws are u_b = (u + b / B) mod 1 for one uniform u (the stratified draw
    of Kingma et al. 2021 (VDM) and MD4): each u_b is still uniform, so the
    loss is unbiased, but the batch covers [0, 1] evenly and its variance falls.
    """
    if not 0 <= sampling_eps < 1:
        raise ValueError(f"sampling_eps must be in [0, 1), got {sampling_eps!r}")
    if low_discrepancy:
        u = jnp.mod(jax.random.uniform(key, ()) + jnp.arange(batch_size) / batch_size, 1.0)
    else:
        u = jax.random.uniform(key, (batch_size,))
    return (1 - sampling_eps) * u + sampling_eps


def loss_per_position(
    key: jax.Array,
    score_fn: ScoreFn,
    graph: Graph,
    noise: Callable,
    x0: jax.Array,
    t: jax.Array | None = None,
    sampling_eps: float = 1e-3,
    low_discrepancy: bool = False,
) -> jax.Array:
    """One Monte Carlo draw of sigma(t) * SE at every position: float32[B, L] nats.

    Args:
      key: a ``jax.random`` key (drives t and x_t).
      score_fn: (x_t, sigma_bar) -> log-score, e.g. the model.
      graph: the forward process.
      noise: a schedule, ``noise(t) -> (sigma_bar, dsigma_bar)``.
      x0: int32[B, L] clean tokens in [0, graph.vocab_size).
      t: optional float[B] times to use instead of drawing them.
      sampling_eps: lower end of the t range.
      low_discrepancy: stratify the draw of t over the batch.
    Returns:
      float32[B, L]: summing over L gives nats per sequence.
    """
    k_t, k_x = jax.random.split(key)
    if t is None:
        t = sample_times(k_t, x0.shape[0], sampling_eps, low_discrepancy)
    sigma, dsigma = noise(t)  # (B,), (B,)
    x_t = graph.sample_transition(k_x, x0, sigma[:, None])  # (B, L)
    log_score = score_fn(x_t, sigma)  # (B, L, D)
    entropy = graph.score_entropy(log_score, sigma[:, None], x_t, x0)  # (B, L)
    return dsigma[:, None] * entropy


def loss_fn(key, score_fn, graph, noise, x0, **kwargs) -> jax.Array:
    """The DSE loss in nats per sequence, float32[B]; see ``loss_per_position``."""
    return loss_per_position(key, score_fn, graph, noise, x0, **kwargs).sum(-1)


def units(nats_per_token: float, chars_per_token: float | None = None) -> dict[str, float]:
    """A loss in nats per token in the units we report, each named with its unit.

    Args:
      nats_per_token: the loss (or bound) divided by the number of tokens.
      chars_per_token: characters per token of the data; 1 for character data.
        When given, bits per character is added.
    Returns:
      dict with nats_per_token, bits_per_token, ppl_bound (= exp(nats per
      token), an upper bound on perplexity when the loss is a bound) and, with
      chars_per_token, bits_per_char.
    """
    out = {
        "nats_per_token": float(nats_per_token),
        "bits_per_token": float(nats_per_token) / math.log(2),
        "ppl_bound": math.exp(min(float(nats_per_token), 700.0)),
    }
    if chars_per_token:
        out["bits_per_char"] = out["bits_per_token"] / chars_per_token
    return out
