"""sedd.rng: every word of a threefry block used, with the laws and the layout of jax.random.bits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from sedd import rng


def _uniform_p(values: np.ndarray, bins: int, top: int) -> float:
    """Chi-square p-value of `values` (integers in [0, top)) against the uniform law over `bins` equal bins."""
    counts = np.bincount((values.astype(np.int64) * bins // top).ravel(), minlength=bins)
    return stats.chisquare(counts).pvalue


@pytest.mark.parametrize("shape", [(3, 1001), (2, 5, 64), (7,)])
def test_uint16_words_are_uniform_and_independent(shape):
    u = np.asarray(rng.uint16(jax.random.key(3), shape))
    assert u.shape == shape and u.dtype == np.uint16
    n = u.size
    if n > 1000:
        assert _uniform_p(u, 16, 2**16) > 1e-4
        assert _uniform_p(u % 16, 16, 16) > 1e-4  # the low bits too
        # Neighbours share a block (four words from one block): no correlation between them, or with the
        # word four places on (the next block), or between the halves of a block's two words.
        flat = u.reshape(-1, shape[-1]).astype(np.float64)
        for lag in (1, 2, 3, 4):
            r = np.corrcoef(flat[:, :-lag].ravel(), flat[:, lag:].ravel())[0, 1]
            assert abs(r) < 5 / np.sqrt(n), (lag, r)
    # Different keys, different words.
    assert not np.array_equal(u, np.asarray(rng.uint16(jax.random.key(4), shape)))


def test_words_are_uniform_and_independent_and_follow_the_element_index():
    key = jax.random.key(0)
    hi, lo = (np.asarray(w) for w in rng.words(key, (4096,)))
    assert hi.dtype == lo.dtype == np.uint32
    assert _uniform_p(hi, 32, 2**32) > 1e-4 and _uniform_p(lo, 32, 2**32) > 1e-4
    assert abs(np.corrcoef(hi.astype(np.float64), lo.astype(np.float64))[0, 1]) < 5 / np.sqrt(4096)
    # Counter-based: an element's words depend on its row-major index only, so a shape's words are
    # the flat words reshaped, and a prefix of a longer draw (what lets a sharded draw equal the whole).
    h2, l2 = (np.asarray(w) for w in rng.words(key, (64, 64)))
    np.testing.assert_array_equal(h2.ravel(), hi)
    np.testing.assert_array_equal(l2.ravel(), lo)
    h3, _ = rng.words(key, (1000,))
    np.testing.assert_array_equal(np.asarray(h3), hi[:1000])
    # Under jit and vmap (one key a lane, as the server draws) the same words as lane by lane.
    keys = jax.random.split(key, 3)
    mapped = jax.jit(jax.vmap(lambda k: rng.words(k, (5, 9))[1]))(keys)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(mapped[i]), np.asarray(rng.words(keys[i], (5, 9))[1]))


def test_other_keys_take_jax_random_bits():
    for key in (jax.random.key(0, impl="rbg"), jax.random.key(0, impl="unsafe_rbg")):
        u = rng.uint16(key, (8, 6))
        hi, lo = rng.words(key, (8, 6))
        assert u.shape == hi.shape == lo.shape == (8, 6) and u.dtype == jnp.uint16
        assert not np.array_equal(np.asarray(hi), np.asarray(lo))
    assert rng.uint16(jax.random.key(0), ()).shape == ()
    hi, lo = rng.words(jax.random.PRNGKey(0), (3,))  # a raw uint32[2] key is a threefry key
    assert hi.shape == (3,) and not np.array_equal(np.asarray(hi), np.asarray(lo))
