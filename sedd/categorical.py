"""Categorical sampling that is right for small probabilities.

Every sampler in the package ends in a draw from an unnormalised categorical
p over D states. The common trick, Gumbel-max (``jax.random.categorical``),
computes ``argmax(log p - log(-log U))`` with a float32 uniform U. U has a
resolution of 2^-23, so ``-log(-log U)`` is capped near 15.9 and a category of
probability below ~1e-7 can (almost) never win: an implicit top-p that lowers
the effective temperature of the sampler (Zheng et al. 2024, arXiv 2409.02908;
the MD4 authors warn about the same effect).

The default here is an exponential race that keeps full relative precision
down to ~2^-64: draw E_d ~ Exp(1) independently and return argmin_d E_d / p_d
(= argmax p_d / E_d). Because min_d E_d / p_d is attained at d with
probability p_d / sum(p), this is exact; the only thing that matters is that
*small* E are represented with full relative precision, which we ensure by
building V = 1 - U from 64 random bits and taking E = -log1p(-V). Everything
stays float32 (no ``jax_enable_x64``), and the cost is one extra uint32 per
entry.

Methods:
  "precise"  the exponential race above (default).
  "gumbel32" ``jax.random.categorical`` on log p (its default "low" mode): about
             half the random bits, but against a category of probability ~1
             it draws a 1e-7 category at 0.52 of its rate and a 1e-8 one at
             ~1e-4 of it (computed exactly over the float32 uniform grid).

JAX's own ``categorical(..., mode="high")`` pushes the limit to ~1e-14 at a
similar cost; the race here is kept because the test suite can integrate its
law exactly over the random bits (tests/test_noise_losses.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

METHODS = ("precise", "gumbel32")

_TWO_M32 = 2.0**-32


def exponential_from_bits(hi: jax.Array, lo: jax.Array) -> jax.Array:
    """E ~ Exp(1) in float32 from two uniform uint32 words, exact for small E.

    V = (hi + (lo + 1/2) 2^-32) 2^-32 is uniform on (0, 1) to 64-bit
    resolution; when V is small (hi < 2^24) the float32 sum keeps all 24
    mantissa bits, and V is never 0, so E = -log1p(-V) > 0 has full relative
    precision down to ~2^-64. hi rounds up to 2^32 with probability ~3e-8:
    V = 1 then and E = inf, a token that cannot win this draw.
    """
    v = (hi.astype(jnp.float32) + (lo.astype(jnp.float32) + 0.5) * _TWO_M32) * _TWO_M32
    return -jnp.log1p(-jnp.minimum(v, 1.0))


def sample_categorical(key: jax.Array, probs: jax.Array, method: str = "precise") -> jax.Array:
    """One draw from the categorical ∝ probs along the last axis.

    Args:
      key: a ``jax.random`` key.
      probs: float[..., D] non-negative, unnormalised weights. Small negative
        values from round-off are treated as 0.
      method: "precise" (exponential race, exact for small probabilities) or
        "gumbel32" (``jax.random.categorical``, float32 Gumbel-max).

    Returns:
      int32[...] the sampled indices.
    """
    if method not in METHODS:
        raise ValueError(f"unknown categorical method {method!r}; expected one of {METHODS}")
    probs = jnp.maximum(probs.astype(jnp.float32), 0.0)
    if method == "gumbel32":
        return jax.random.categorical(key, jnp.log(probs), axis=-1).astype(jnp.int32)
    hi, lo = jax.random.bits(key, (2, *probs.shape), jnp.uint32)
    exp_noise = exponential_from_bits(hi, lo)  # E ~ Exp(1), (..., D)
    return jnp.argmax(probs / exp_noise, axis=-1).astype(jnp.int32)
