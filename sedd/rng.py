"""Random words that use every bit a threefry block makes.

``jax.random.bits`` with a threefry key (JAX's default, "partitionable"
form) runs one threefry2x32 block per element of its output: the block makes
two 32-bit words, and ``bits`` XORs them into one uint32, or keeps 16 of the
64 bits for a uint16. The block is the cost (20 rounds of add, rotate, xor),
so a sampler's exponential race, which needs 64 bits an entry, paid for two
blocks, and a dropout mask, which needs 16 bits an element, paid for a whole
block too. Here the block's words are all used:

  words(key, shape)   two uint32[shape] words, one block an element
                      (the race of ``sedd.categorical``)
  uint16(key, shape)  uint16[shape], four words from a block (``sedd.model.Dropout``)

Both are threefry2x32 (the primitive ``jax.random.bits`` calls) on counters
that number the elements of the output, as ``bits`` does, built from iotas of
the output's shape, so a sharded output is drawn shard by shard. Other key
kinds and outputs of 2^32 elements or more take ``jax.random.bits``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.extend.random import threefry2x32_p

_MAX_COUNT = 2**32  # the counters here are the 32-bit low word of the element's index


def _threefry_key(key: jax.Array) -> jax.Array | None:
    """The key's two uint32 words if it is a threefry key, else None."""
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(key) if str(jax.random.key_impl(key)) == "threefry2x32" else None
    return key if key.dtype == jnp.uint32 and key.shape == (2,) else None  # one raw (legacy) key


def _counters(shape: tuple[int, ...]) -> jax.Array:
    """uint32[shape]: each element's row-major index (iotas: the partitioner splits them like the output)."""
    count, stride = jnp.zeros(shape, jnp.uint32), 1
    for axis in reversed(range(len(shape))):
        count = count + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride)
        stride *= shape[axis]
    return count


def words(key: jax.Array, shape: tuple[int, ...]) -> tuple[jax.Array, jax.Array]:
    """Two independent uint32[shape] arrays of uniform random words, one threefry block an element."""
    shape = tuple(shape)
    data = _threefry_key(key)
    if data is None or math.prod(shape) >= _MAX_COUNT:
        both = jax.random.bits(key, (2, *shape), jnp.uint32)
        return both[0], both[1]
    count = _counters(shape)
    return tuple(threefry2x32_p.bind(data[0], data[1], jnp.zeros_like(count), count))


def uint16(key: jax.Array, shape: tuple[int, ...], out_sharding=None) -> jax.Array:
    """uint16[shape] uniform random words, four from each threefry block.

    The blocks number the groups of four consecutive elements of the last
    axis; a group's words are the low and high halves of the block's two words.
    `out_sharding` is passed to ``jax.random.bits`` where it is used.
    """
    shape = tuple(shape)
    if not shape or _threefry_key(key) is None or math.prod(shape) >= _MAX_COUNT:
        return jax.random.bits(key, shape, jnp.uint16, out_sharding=out_sharding)
    *lead, last = shape
    groups = -(-last // 4)
    a, b = words(key, (*lead, groups))
    quarters = [a.astype(jnp.uint16), (a >> 16).astype(jnp.uint16), b.astype(jnp.uint16), (b >> 16).astype(jnp.uint16)]
    return jnp.stack(quarters, -1).reshape(*lead, 4 * groups)[..., :last]
