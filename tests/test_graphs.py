"""Closed forms of sedd.graphs against explicit rate matrices and scipy's expm."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from sedd import graphs

SIGMAS = [1e-6, 1e-3, 0.3, 1.0, 5.0, 20.0]


def dense_q(graph):
    """The explicit D x D rate matrix (row = from), built from rate()."""
    states = jnp.arange(graph.dim)
    return np.asarray(graph.rate(states), np.float64)


def expected_q(graph):
    d = graph.dim
    if graph.absorb:
        q = np.zeros((d, d))
        q[:-1, -1] = 1.0
        q[np.arange(d - 1), np.arange(d - 1)] = -1.0
        return q
    return np.ones((d, d)) / d - np.eye(d)


GRAPHS = [graphs.Absorbing(4), graphs.Uniform(5), graphs.Absorbing(1), graphs.Uniform(2)]


@pytest.mark.parametrize("graph", GRAPHS, ids=repr)
def test_rates_match_explicit_q(graph):
    q = expected_q(graph)
    states = jnp.arange(graph.dim)
    np.testing.assert_allclose(graph.rate(states), q, atol=1e-7)
    np.testing.assert_allclose(graph.transp_rate(states), q.T, atol=1e-7)
    np.testing.assert_allclose(q.sum(1), 0, atol=1e-12)


@pytest.mark.parametrize("graph", GRAPHS, ids=repr)
@pytest.mark.parametrize("sigma", SIGMAS)
def test_transitions_match_expm(graph, sigma):
    p = scipy.linalg.expm(sigma * expected_q(graph))
    states = jnp.arange(graph.dim)
    # Relative tolerance too: at sigma = 1e-6 the off-diagonal entries are ~1e-6.
    np.testing.assert_allclose(graph.transition(states, sigma), p, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(graph.transp_transition(states, sigma), p.T, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("graph", GRAPHS, ids=repr)
@pytest.mark.parametrize("dsigma", SIGMAS[:4] + [2.0])
def test_staggered_score_matches_expm(graph, dsigma):
    rng = np.random.default_rng(0)
    score = rng.exponential(size=(3, graph.dim))
    want = score @ scipy.linalg.expm(-dsigma * expected_q(graph))  # rows: (exp(-dQ)^T s)^T
    got = graph.staggered_score(jnp.asarray(score, jnp.float32), jnp.full((3,), dsigma))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_broadcasting_batch_shapes():
    graph = graphs.Uniform(6)
    x = jnp.arange(12).reshape(3, 4) % 6
    sigma = jnp.array([[0.1], [1.0], [3.0]])
    out = graph.transition(x, sigma)
    assert out.shape == (3, 4, 6)
    p = scipy.linalg.expm(3.0 * expected_q(graph))
    np.testing.assert_allclose(out[2, 1], p[int(x[2, 1])], rtol=1e-5)


@pytest.mark.parametrize("graph", GRAPHS[:2], ids=repr)
def test_reverse_rate(graph):
    q = expected_q(graph)
    rng = np.random.default_rng(1)
    score = rng.exponential(size=(graph.dim, graph.dim))
    got = np.asarray(graph.reverse_rate(jnp.arange(graph.dim), jnp.asarray(score)))
    for i in range(graph.dim):
        want = q[:, i] * score[i]
        want[i] = 0
        want[i] = -want.sum()
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-7)


def brute_score_entropy(graph, log_score, sigma, x, x0):
    """sum_{y != x} Q[y, x] (s_y - r_y log s_y + K(r_y)) term by term, float64."""
    q = expected_q(graph)
    p = scipy.linalg.expm(sigma * q)
    s = np.exp(log_score)
    total = 0.0
    for y in range(graph.dim):
        if y == x or q[y, x] == 0:
            continue
        r = p[x0, y] / p[x0, x]
        k = r * (np.log(r) - 1) if r > 0 else 0.0
        total += q[y, x] * (s[y] - r * log_score[y] + k)
    return total


def valid_pairs(graph):
    """(x, x0) with p(x | x0) > 0 and x0 a real token."""
    for x0, x in itertools.product(range(graph.vocab_size), range(graph.dim)):
        if graph.absorb and x not in (x0, graph.vocab_size):
            continue
        yield x, x0


@pytest.mark.parametrize("graph", GRAPHS[:2], ids=repr)
@pytest.mark.parametrize("sigma", [1e-3, 0.5, 2.0, 8.0])
def test_score_entropy_matches_definition(graph, sigma):
    rng = np.random.default_rng(2)
    for x, x0 in valid_pairs(graph):
        log_score = rng.normal(size=graph.dim)
        log_score[x] = 0.0
        want = brute_score_entropy(graph, log_score, sigma, x, x0)
        got = graph.score_entropy(jnp.asarray(log_score, jnp.float32), sigma, x, x0)
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-5, err_msg=f"x={x} x0={x0}")


def true_log_ratios(graph, sigma, x, x0):
    p = scipy.linalg.expm(sigma * expected_q(graph))
    with np.errstate(divide="ignore"):
        log_r = np.log(p[x0] / p[x0, x])
    # Entries with r = 0 never enter the optimum (their term is s_y, minimised
    # at s -> 0); a very negative log-score stands in for log 0.
    return np.where(np.isfinite(log_r), log_r, -60.0)


@pytest.mark.parametrize("graph", GRAPHS[:2], ids=repr)
@pytest.mark.parametrize("sigma", [1e-6, 1e-3, 0.5, 5.0, 20.0])
def test_score_entropy_nonnegative_zero_and_stationary_at_truth(graph, sigma):
    rng = np.random.default_rng(3)
    se = jax.jit(graph.score_entropy)
    grad = jax.jit(jax.grad(graph.score_entropy))
    for x, x0 in valid_pairs(graph):
        # >= 0 on random inputs.
        for _ in range(5):
            log_score = jnp.asarray(rng.normal(scale=3, size=graph.dim), jnp.float32)
            assert se(log_score, sigma, x, x0) >= 0
        # 0 with zero gradient at the true ratios.
        truth = jnp.asarray(true_log_ratios(graph, sigma, x, x0), jnp.float32)
        value = se(truth, sigma, x, x0)
        g = grad(truth, sigma, x, x0)
        # Scale of the terms: r ~ 1 / sigma, so judge the error relative to it.
        scale = max(1.0, float(np.exp(truth).max()))
        assert abs(float(value)) <= 1e-5 * scale, (x, x0, float(value))
        np.testing.assert_allclose(g, 0.0, atol=1e-5 * scale)


@pytest.mark.parametrize("graph", GRAPHS[:2], ids=repr)
def test_score_entropy_finite_at_extreme_sigma(graph):
    x = jnp.array([[0, graph.dim - 1, 1]])
    x0 = jnp.array([[0, 1, 2]])
    log_score = jax.random.normal(jax.random.key(0), (1, 3, graph.dim)) * 5
    for sigma in [1e-7, 1e-6, 20.0, 40.0]:
        s = jnp.full((1, 1), sigma)
        value = graph.score_entropy(log_score, s, x, x0)
        g_score, g_sigma = jax.grad(
            lambda ls, sg: graph.score_entropy(ls, sg, x, x0).sum(), argnums=(0, 1)
        )(log_score, s)
        assert np.isfinite(value).all() and np.isfinite(g_score).all() and np.isfinite(g_sigma).all()


@pytest.mark.parametrize("graph", GRAPHS[:2], ids=repr)
@pytest.mark.parametrize("sigma", [0.05, 1.0, 4.0])
def test_sample_transition_law(graph, sigma):
    n = 200_000
    p = scipy.linalg.expm(sigma * expected_q(graph))
    for i in range(graph.vocab_size):
        draws = graph.sample_transition(jax.random.key(i), jnp.full((n,), i), sigma)
        freq = np.bincount(np.asarray(draws), minlength=graph.dim) / n
        # E[TV] <= 0.5 sum_j sqrt(p_j (1 - p_j) / n) <= 0.5 sqrt(D / n); 4x that
        # is far in the tail (TV concentrates within O(1/sqrt(n)) of its mean).
        tv = 0.5 * np.abs(freq - p[i]).sum()
        assert tv < 2 * np.sqrt(graph.dim / n), (i, tv)


def test_sample_limit():
    key = jax.random.key(0)
    assert (graphs.Absorbing(7).sample_limit(key, (3, 4)) == 7).all()
    draws = np.asarray(graphs.Uniform(4).sample_limit(key, (100_000,)))
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / 1e5, 0.25, atol=0.01)


@pytest.mark.parametrize("graph", GRAPHS[:2], ids=repr)
def test_sample_rate_law(graph):
    n = 100_000
    i = 1 if not graph.absorb else graph.dim - 1
    score = jnp.asarray(np.random.default_rng(4).exponential(size=graph.dim), jnp.float32)
    rate = 0.1 * graph.reverse_rate(jnp.full((n,), i), jnp.broadcast_to(score, (n, graph.dim)))
    probs = np.asarray(jax.nn.one_hot(i, graph.dim) + rate[0])
    assert probs.min() >= 0
    draws = graph.sample_rate(jax.random.key(5), jnp.full((n,), i), rate)
    freq = np.bincount(np.asarray(draws), minlength=graph.dim) / n
    assert 0.5 * np.abs(freq - probs / probs.sum()).sum() < 2 * np.sqrt(graph.dim / n)


def test_jit_and_vmap_agree_with_eager():
    graph = graphs.Absorbing(5)
    x = jnp.array([[5, 1, 5], [2, 5, 3]])
    x0 = jnp.array([[0, 1, 4], [2, 3, 3]])
    sigma = jnp.array([[0.3], [2.0]])
    log_score = jax.random.normal(jax.random.key(1), (2, 3, 6))
    eager = graph.score_entropy(log_score, sigma, x, x0)
    jitted = jax.jit(graph.score_entropy)(log_score, sigma, x, x0)
    vmapped = jax.vmap(graph.score_entropy)(log_score, sigma, x, x0)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)
    np.testing.assert_allclose(vmapped, eager, rtol=1e-6)
    for fn in ["transition", "transp_transition"]:
        f = getattr(graph, fn)
        np.testing.assert_allclose(jax.jit(f)(x, sigma), jax.vmap(f)(x, sigma), rtol=1e-6)
    # Graphs are hashable, so they can be static arguments of jit.
    step = jax.jit(lambda g, k, i: g.sample_transition(k, i, 0.5), static_argnums=0)
    assert step(graph, jax.random.key(0), x0).shape == x0.shape


def test_float64_under_x64():
    code = """
import jax, jax.numpy as jnp, numpy as np, scipy.linalg
jax.config.update("jax_enable_x64", True)
from sedd import graphs
g = graphs.Uniform(4)
q = np.ones((4, 4)) / 4 - np.eye(4)
for sigma in [1e-6, 20.0]:
    got = g.transition(jnp.arange(4), jnp.float64(sigma))
    assert got.dtype == jnp.float64, got.dtype
    np.testing.assert_allclose(got, scipy.linalg.expm(sigma * q), rtol=1e-12)
print("ok")
"""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_bad_vocab_size(bad):
    for cls in (graphs.Absorbing, graphs.Uniform):
        with pytest.raises(ValueError, match="vocab_size"):
            cls(bad)
    with pytest.raises(ValueError, match="unknown graph"):
        graphs.get_graph("absorb", 4)
