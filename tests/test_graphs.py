"""sedd.graphs in float32 against tests/reference.py: the dense rate matrix Q
built from its definition, scipy's expm, the score entropy and reverse rate
written term by term; and the laws of the graphs' samplers against expm, with
TV bounds from the sample size. The float64 path is in test_independent_core.py.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from sedd import graphs

SIGMAS = [1e-6, 1e-3, 0.3, 1.0, 5.0, 20.0]
GRAPHS = [graphs.Absorbing(4), graphs.Uniform(5), graphs.Absorbing(1), graphs.Uniform(2)]
SAMPLED = GRAPHS[:2]


def permuted_states(dim, rows, seed):
    """int32[rows, dim], each row a permutation of range(dim): every state, in [B, L] layout."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(dim) for _ in range(rows)]).astype(np.int32)


@pytest.mark.parametrize("graph", GRAPHS, ids=repr)
def test_dim_absorb_and_mask(graph):
    assert graph.dim == len(reference.dense_q(graph))
    assert graph.absorb == isinstance(graph, graphs.Absorbing)
    if graph.absorb:
        assert graph.mask == graph.vocab_size


@pytest.mark.parametrize("graph", GRAPHS, ids=repr)
def test_rates_match_q(graph):
    q = reference.dense_q(graph)
    states = jnp.arange(graph.dim)
    np.testing.assert_allclose(graph.rate(states), q, atol=1e-7)
    np.testing.assert_allclose(graph.transp_rate(states), q.T, atol=1e-7)
    x = permuted_states(graph.dim, 3, seed=0)  # (B, L)
    np.testing.assert_allclose(graph.rate(x), q[x], atol=1e-7)
    np.testing.assert_allclose(graph.transp_rate(x), q.T[x], atol=1e-7)


@pytest.mark.parametrize("graph", GRAPHS, ids=repr)
def test_reference_transition_matrix_is_expm(graph):
    """The closed form the exact score functions use agrees with scipy's expm."""
    got = np.asarray(reference.transition_matrix(graph, jnp.asarray(SIGMAS)))  # (S, D, D)
    for p, sigma in zip(got, SIGMAS):
        np.testing.assert_allclose(p, reference.expm_q(graph, sigma), rtol=2e-5, atol=1e-30)


@pytest.mark.parametrize("graph", GRAPHS, ids=repr)
def test_transitions_match_expm(graph):
    """One sigma per row b ([B, 1] against states [B, L]), every state in each row."""
    x = permuted_states(graph.dim, len(SIGMAS), seed=1)  # (B, L)
    sigma = jnp.asarray(SIGMAS)[:, None]  # (B, 1)
    forward = np.asarray(graph.transition(x, sigma))  # (B, L, D)
    backward = np.asarray(graph.transp_transition(x, sigma))
    assert forward.shape == backward.shape == x.shape + (graph.dim,)
    for b, s in enumerate(SIGMAS):
        p = reference.expm_q(graph, s)
        # Relative, entry by entry: at sigma = 1e-6 the off-diagonal entries are
        # ~1e-7, and 1 - e^{-sigma} computed as written is 5% off there in float32.
        np.testing.assert_allclose(forward[b], p[x[b]], rtol=2e-5, atol=1e-30, err_msg=str(s))
        np.testing.assert_allclose(backward[b], p.T[x[b]], rtol=2e-5, atol=1e-30, err_msg=str(s))


@pytest.mark.parametrize("graph", GRAPHS, ids=repr)
def test_staggered_score_matches_expm(graph):
    """exp(-dsigma Q)^T s, up to dsigma = 20 where the uniform graph's written form cancels."""
    dsigmas = SIGMAS + [2.0]
    score = np.random.default_rng(2).exponential(size=(len(dsigmas), 3, graph.dim))  # (B, L, D)
    got = graph.staggered_score(jnp.asarray(score, jnp.float32), jnp.asarray(dsigmas)[:, None])
    got = np.asarray(got)
    for b, d in enumerate(dsigmas):
        e = reference.expm_q(graph, -d)
        # Judged against |E|^T s, the size of the terms the product sums: the
        # entries of exp(-dQ) reach e^20 and cancel to O(1).
        err = np.abs(got[b] - score[b] @ e) / (score[b] @ np.abs(e))
        assert err.max() < 1e-5, (d, err.max())


@pytest.mark.parametrize("graph", [g for g in GRAPHS if not g.absorb], ids=repr)
def test_staggered_score_keeps_a_uniform_law(graph):
    """exp(-dsigma Q)^T 1 = 1 (Q symmetric, rows summing to 0): a uniform p_t stays uniform.

    The case where the written form e^{dsigma} s - (e^{dsigma} - 1) mean(s)
    cancels to nothing in float32 at dsigma = 20.
    """
    dsigmas = jnp.asarray(SIGMAS)
    got = graph.staggered_score(jnp.ones((len(SIGMAS), graph.dim)), dsigmas)
    np.testing.assert_allclose(got, 1.0, rtol=1e-5)


@pytest.mark.parametrize("graph", GRAPHS[:2], ids=repr)
def test_reverse_rate(graph):
    x = permuted_states(graph.dim, 3, seed=3)  # (B, L)
    score = np.random.default_rng(3).exponential(size=x.shape + (graph.dim,))
    got = np.asarray(graph.reverse_rate(jnp.asarray(x), jnp.asarray(score, jnp.float32)))
    for b, l in np.ndindex(x.shape):
        want = reference.reverse_rate_by_definition(graph, x[b, l], score[b, l])
        np.testing.assert_allclose(got[b, l], want, rtol=1e-5, atol=1e-6)


def valid_pairs(graph):
    """(x, x0) with p(x | x0) > 0 and x0 a real token."""
    for x0, x in itertools.product(range(graph.vocab_size), range(graph.dim)):
        if graph.absorb and x not in (x0, graph.vocab_size):
            continue
        yield x, x0


@pytest.mark.parametrize("graph", GRAPHS[:2], ids=repr)
@pytest.mark.parametrize("sigma", SIGMAS)
def test_score_entropy_matches_definition(graph, sigma):
    x, x0 = map(np.array, zip(*valid_pairs(graph)))  # (P,), (P,)
    log_score = np.random.default_rng(4).normal(scale=1.5, size=(len(x), graph.dim))
    log_score[np.arange(len(x)), x] = 0.0
    got = np.asarray(graph.score_entropy(jnp.asarray(log_score, jnp.float32), sigma, x, x0))
    for p in range(len(x)):
        want, scale = reference.score_entropy_by_definition(graph, log_score[p], sigma, x[p], x0[p])
        # Relative to the size of the terms: r ~ 1 / sigma reaches 1e6.
        assert abs(got[p] - want) <= 1e-4 * scale, (x[p], x0[p], got[p], want)
        assert got[p] >= -1e-6 * scale


def true_log_ratios(graph, sigma, x, x0):
    p = reference.expm_q(graph, sigma)
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
        g_score, g_sigma = jax.grad(lambda ls, sg: graph.score_entropy(ls, sg, x, x0).sum(), argnums=(0, 1))(
            log_score, s
        )
        assert np.isfinite(value).all() and np.isfinite(g_score).all() and np.isfinite(g_sigma).all()


def row_laws(draws, dim):
    """Empirical law of each row of int[R, n], float[R, dim]; out-of-range draws fail."""
    draws = np.asarray(draws)
    assert draws.min() >= 0 and draws.max() < dim, (draws.min(), draws.max())
    return np.stack([np.bincount(row, minlength=dim) for row in draws]) / draws.shape[1]


@pytest.mark.parametrize("graph", SAMPLED, ids=repr)
def test_sample_transition_law(graph):
    """Every state (the mask too) at every sigma, in one [R, n] call with sigma [R, 1]."""
    n = 100_000
    state, sigma = (a.ravel() for a in np.meshgrid(np.arange(graph.dim), SIGMAS, indexing="ij"))
    x = jnp.broadcast_to(jnp.asarray(state, jnp.int32)[:, None], (len(state), n))
    draws = graph.sample_transition(jax.random.key(11), x, jnp.asarray(sigma)[:, None])
    assert draws.shape == x.shape and draws.dtype == jnp.int32
    freq = row_laws(draws, graph.dim)
    for r in range(len(state)):
        p = reference.expm_q(graph, sigma[r])[state[r]]
        assert reference.tv(freq[r], p) < reference.tv_bound(graph.dim, n), (state[r], sigma[r])
        # Off the support means a jump the chain cannot make (token -> other token).
        assert freq[r][p == 0].sum() == 0, (state[r], sigma[r])


def test_sample_limit():
    key = jax.random.key(0)
    assert (graphs.Absorbing(7).sample_limit(key, (3, 4)) == 7).all()
    n = 100_000
    draws = graphs.Uniform(4).sample_limit(key, (8, n // 8))
    assert draws.shape == (8, n // 8) and draws.dtype == jnp.int32
    freq = row_laws(np.asarray(draws).reshape(1, -1), 4)[0]
    assert reference.tv(freq, 0.25) < reference.tv_bound(4, n)


@pytest.mark.parametrize("graph", SAMPLED, ids=repr)
def test_sample_rate_law(graph):
    """From every state, with dt up to the largest step (staying has probability exactly 0)."""
    n = 100_000
    rng = np.random.default_rng(6)
    rate = np.zeros((graph.dim, graph.dim))  # row i: dt * reverse rate out of i
    for i in range(graph.dim):
        reverse = reference.reverse_rate_by_definition(graph, i, rng.exponential(size=graph.dim))
        stay = 1.0 if i == graph.dim - 1 else rng.uniform(0.2, 0.95)  # fraction of the largest dt
        rate[i] = stay / -reverse[i] * reverse if reverse[i] < 0 else 0.0
    law = np.eye(graph.dim) + rate
    law[np.abs(law) < 1e-12] = 0.0  # the stay of the last row: 1 - 1, exactly 0
    x = jnp.broadcast_to(jnp.arange(graph.dim, dtype=jnp.int32)[:, None], (graph.dim, n))
    draws = graph.sample_rate(
        jax.random.key(13), x, jnp.broadcast_to(jnp.asarray(rate, jnp.float32)[:, None, :], (graph.dim, n, graph.dim))
    )
    assert draws.shape == x.shape and draws.dtype == jnp.int32
    freq = row_laws(draws, graph.dim)
    for i in range(graph.dim):
        assert reference.tv(freq[i], law[i]) < reference.tv_bound(graph.dim, n), i
        assert freq[i][law[i] == 0].sum() == 0, i


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


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_bad_vocab_size(bad):
    for cls in (graphs.Absorbing, graphs.Uniform):
        with pytest.raises(ValueError, match="vocab_size"):
            cls(bad)
    with pytest.raises(ValueError, match="unknown graph"):
        graphs.get_graph("absorb", 4)
