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
stays float32 (no ``jax_enable_x64``), and the 64 bits are the two words of
one threefry block (``sedd.rng.words``), the block ``jax.random.bits`` spends
on a single uint32.

Methods: "precise", the race (default); "gumbel32", ``jax.random.categorical``
on log p, which against a category of probability ~1 draws a 1e-7 category at
0.52 of its rate and a 1e-8 one at ~1e-4 of it (computed exactly over the
float32 uniform grid). JAX's ``mode="high"`` pushes the limit to ~1e-14 at a
similar cost; the race is kept because the tests can integrate its law
exactly over the random bits (tests/test_noise_losses.py).

Large D: a race over every entry needs 64 random bits per entry, and at a
GPT-2 vocabulary (D = 50,258) making them cost five times a forward pass of a
small model (docs/benchmarks.md). From ``TWO_LEVEL_MIN_DIM`` entries on,
"precise" draws in two levels instead: cut the D entries into buckets of K
(K a power of two near sqrt(D); 196 buckets of 256 and one of 82 at D = 50,258), race the
bucket sums S_b, then race the entries of the chosen bucket:

    P(d) = P(bucket b) P(d | b) = S_b / sum_b' S_b'  *  p_d / S_b = p_d / sum p,

the same law, both races exact for small probabilities, with 2 (D / K + K)
random words per draw instead of 2 D. The only rounding is that of the
float32 bucket sums, a relative error (~1e-7), never an absolute floor: a
token of probability 1e-12 keeps its rate. Below the threshold the flat race
is kept, so draws at small D are bit-for-bit what they were.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sedd import rng

METHODS = ("precise", "gumbel32")

_TWO_M32 = 2.0**-32

TWO_LEVEL_MIN_DIM = 4096
"""From this many categories on, "precise" draws in two levels (see the module docstring)."""


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


def race(key: jax.Array, probs: jax.Array) -> jax.Array:
    """argmax_d p_d / E_d with E_d ~ Exp(1): index d with probability p_d / sum(p). int32[...]."""
    hi, lo = rng.words(key, probs.shape)  # one threefry block an entry
    exp_noise = exponential_from_bits(hi, lo)  # E ~ Exp(1), (..., D)
    return first_argmax(probs / exp_noise)


def first_argmax(w: jax.Array) -> jax.Array:
    """``jnp.argmax(w, -1)`` (the first index of the maximum) for finite w: int32[...].

    Two plain reductions, a max and a min over the indices where w equals
    it, instead of one reduction over (value, index) pairs: XLA's CPU
    backend vectorises the plain ones (the race's draw's figures are in
    docs/serving.md). A row holding NaN gives the last index.
    """
    d = w.shape[-1]
    top = jnp.max(w, axis=-1, keepdims=True)
    first = jnp.min(jnp.where(w == top, jnp.arange(d, dtype=jnp.int32), d), axis=-1)
    return jnp.minimum(first, d - 1)


def bucket_size(dim: int) -> int:
    """K of the two-level draw: the power of two nearest above sqrt(dim)."""
    return 1 << max(0, math.ceil(math.log2(math.sqrt(dim))))


def bucket_sums(probs: jax.Array, bucket: int | None = None) -> jax.Array:
    """S_b, the sums of the buckets of K entries [b K, (b + 1) K) (the last may be shorter): float32[..., nb]."""
    d = probs.shape[-1]
    k = min(bucket or bucket_size(d), d)
    full = d // k
    # A strided window sum reads the entries in place; slicing off the short
    # bucket and reshaping to (..., nb, K) makes XLA copy the array first.
    window = (1,) * (probs.ndim - 1) + (k,)
    sums = jax.lax.reduce_window(probs, 0.0, jax.lax.add, window, window, "VALID")  # (..., full)
    if full * k < d:
        sums = jnp.concatenate([sums, probs[..., full * k :].sum(-1, keepdims=True)], -1)
    return sums


def sample_two_level(
    key: jax.Array, probs: jax.Array, bucket: int | None = None, sums: jax.Array | None = None
) -> jax.Array:
    """An exact draw ∝ probs float32[..., D] in two races, a bucket by its sum, then an entry: int32[...].

    The law is the module docstring's. The second race reads the K = bucket entries from min(b K, D - K)
    and zeroes those before b K, so nothing is padded or copied. sums: ``bucket_sums(probs, bucket)``
    when the caller has them already.
    """
    d = probs.shape[-1]
    k = min(bucket or bucket_size(d), d)
    if sums is None:
        sums = bucket_sums(probs, k)
    k_bucket, k_entry = jax.random.split(key)
    first = race(k_bucket, sums) * k  # (...,) first index of the chosen bucket
    start = jnp.minimum(first, d - k)
    idx = start[..., None] + jnp.arange(k, dtype=jnp.int32)  # (..., K)
    inside = jnp.where(idx >= first[..., None], jnp.take_along_axis(probs, idx, axis=-1), 0.0)
    return start + race(k_entry, inside)


def check_method(method: str) -> None:
    """Raise ValueError unless `method` is one of ``METHODS`` (sampling.categorical, checked before any work)."""
    if method not in METHODS:
        raise ValueError(f"unknown categorical method {method!r}; expected one of {METHODS}")


def sample_categorical(key: jax.Array, probs: jax.Array, method: str = "precise") -> jax.Array:
    """One draw int32[...] from the categorical ∝ probs float[..., D] (unnormalised; round-off below 0 is 0),
    by `method` of ``METHODS`` (module docstring)."""
    check_method(method)
    probs = jnp.maximum(probs.astype(jnp.float32), 0.0)
    if method == "gumbel32":
        return jax.random.categorical(key, jnp.log(probs), axis=-1).astype(jnp.int32)
    if probs.shape[-1] >= TWO_LEVEL_MIN_DIM:
        return sample_two_level(key, probs)
    return race(key, probs)
