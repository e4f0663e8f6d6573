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
    key: jax.Array, batch_size: int, sampling_eps: float = 1e-3, low_discrepancy: bool = False, power: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    r"""Times t in [sampling_eps, 1], one per sequence, and their importance weights: float32[B] each.

    SEDD draws t ~ U[eps, 1]: t = (1 - eps) u + eps. With ``power`` = p > 0, t
    is drawn from the proposal q(t) = t^{-p} / Z, Z = (1 - eps^{1-p}) / (1 - p),
    by inverting its CDF,

        t = (eps^{1-p} + u (1 - eps^{1-p}))^{1 / (1 - p)},

    and weighted by w(t) = U(t) / q(t) = Z t^p / (1 - eps), so that
    E_q[w(t) f(t)] = E_U[f(t)] for every f: the loss keeps its expectation (the
    bound) and only its variance changes. Importance sampling of t is the
    variance reduction of Nichol & Dhariwal 2021 (Sec. 3.3), whose proposal
    follows the loss's measured second moment; here the exponent follows the
    per-sequence *gradient* norm of the score-entropy loss, which falls about
    as t^{-1/2} on a trained model (docs/default_run.md), and q proportional to
    the gradient's RMS is the proposal of least gradient variance. p = 0 is
    SEDD's uniform draw with weights 1.

    With low_discrepancy the B uniforms are u_b = (u + b / B) mod 1 for one
    uniform u (the stratified draw of Kingma et al. 2021 (VDM) and MD4): each
    u_b is still uniform, so the loss is unbiased, but the batch covers the
    proposal evenly.
    """
    if not 0 <= sampling_eps < 1:
        raise ValueError(f"sampling_eps must be in [0, 1), got {sampling_eps!r}")
    if not 0 <= power < 1:
        raise ValueError(f"training.t_power must be in [0, 1) (0: uniform t, as SEDD), got {power!r}")
    if power > 0 and sampling_eps == 0:
        raise ValueError(f"training.t_power={power} needs sampling_eps > 0 (its weights vanish at t = 0)")
    if low_discrepancy:
        u = jnp.mod(jax.random.uniform(key, ()) + jnp.arange(batch_size) / batch_size, 1.0)
    else:
        u = jax.random.uniform(key, (batch_size,))
    if power == 0:
        return (1 - sampling_eps) * u + sampling_eps, jnp.ones((batch_size,), jnp.float32)
    a = sampling_eps ** (1 - power)
    t = (a + u * (1 - a)) ** (1 / (1 - power))
    z = (1 - a) / (1 - power)  # Z = int_eps^1 t^{-p} dt
    return t, z * t**power / (1 - sampling_eps)


def loss_per_position(
    key: jax.Array,
    score_fn: ScoreFn,
    graph: Graph,
    noise: Callable,
    x0: jax.Array,
    t: jax.Array | None = None,
    sampling_eps: float = 1e-3,
    low_discrepancy: bool = False,
    t_power: float = 0.0,
    entropy_fn: Callable | None = None,
) -> jax.Array:
    """One Monte Carlo draw of sigma(t) * SE at every position: float32[B, L] nats.

    Summed over L: nats per sequence, an unbiased estimate of the uniform-t loss whatever t_power.

    Args:
      x0: int32[B, L] clean tokens in [0, graph.vocab_size).
      t: optional float[B] times to use instead of drawing them (unweighted).
      sampling_eps, low_discrepancy, t_power: as ``sample_times``'s eps, low_discrepancy and power.
      entropy_fn: (x_t, sigma, x0) -> float32[B, L], the score entropy of the network at x_t, in
        place of score_fn and ``graph.score_entropy`` (the same numbers without the [B, L, D]
        log-score: ``sedd.kinds.chunked_entropy``).
    """
    k_t, k_x = jax.random.split(key)
    if t is None:
        t, weight = sample_times(k_t, x0.shape[0], sampling_eps, low_discrepancy, t_power)
    else:
        weight = jnp.ones_like(t)
    sigma, dsigma = noise(t)  # (B,), (B,)
    x_t = graph.sample_transition(k_x, x0, sigma[:, None])  # (B, L)
    if entropy_fn is not None:
        entropy = entropy_fn(x_t, sigma, x0)  # (B, L)
    else:
        log_score = score_fn(x_t, sigma)  # (B, L, D)
        entropy = graph.score_entropy(log_score, sigma[:, None], x_t, x0)  # (B, L)
    return (weight * dsigma)[:, None] * entropy


def loss_fn(key, score_fn, graph, noise, x0, **kwargs) -> jax.Array:
    """The DSE loss in nats per sequence, float32[B]; see ``loss_per_position``."""
    return loss_per_position(key, score_fn, graph, noise, x0, **kwargs).sum(-1)


def units(nats_per_token: float, chars_per_token: float | None = None) -> dict[str, float]:
    """A loss (or bound) in nats per token in the units we report: nats_per_token, bits_per_token, ppl_bound (=
    exp(nats per token), an upper bound on perplexity when the loss is a bound) and, given the data's
    chars_per_token (1 for character data), bits_per_char."""
    out = {
        "nats_per_token": float(nats_per_token),
        "bits_per_token": float(nats_per_token) / math.log(2),
        "ppl_bound": math.exp(min(float(nats_per_token), 700.0)),
    }
    if chars_per_token:
        out["bits_per_char"] = out["bits_per_token"] / chars_per_token
    return out
