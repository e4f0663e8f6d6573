"""sedd.graphs and sedd.noise in float64 (``jax.enable_x64``), through the public
API of DESIGN.md, against the float64 references of tests/reference.py: the
dense Q from its definition, scipy's expm (whose entries agree with a 40-digit
mpmath expm to 2e-13 relative on these Q and sigmas, and keep the exact zeros
of the absorbing graph), the score entropy and reverse rate term by term, and
the schedule formulas.

The tolerances are float64 ones (1e-10 to 1e-12, relative to the size of the
terms), so they fail where a closed form is right only to float32 precision:
a float32 intermediate, or a cancelling form such as 1 - e^{-sigma} at small
sigma. The float32 path and the same properties at float32 tolerances are in
test_graphs.py and test_noise_losses.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from sedd import graphs, noise

SIGMAS = (1e-6, 1e-3, 0.1, 1.0, 5.0, 20.0)
GRAPHS = (graphs.Uniform(3), graphs.Uniform(5), graphs.Absorbing(3), graphs.Absorbing(5))


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


def states(dim, seed):
    """int[B, L] with B = len(SIGMAS), each row a permutation of range(dim): every state."""
    rng = np.random.default_rng(seed)
    return np.stack([rng.permutation(dim) for _ in SIGMAS])


def f64(a):
    return jnp.asarray(np.asarray(a), jnp.float64)


@pytest.mark.parametrize("graph", GRAPHS, ids=repr)
def test_rates(graph):
    q = reference.dense_q(graph)
    x = jnp.asarray(states(graph.dim, 1))
    rate, transp = graph.rate(x), graph.transp_rate(x)
    assert rate.dtype == transp.dtype == jnp.float64
    np.testing.assert_array_equal(rate, q[np.asarray(x)])
    np.testing.assert_array_equal(transp, q.T[np.asarray(x)])


@pytest.mark.parametrize("graph", GRAPHS, ids=repr)
def test_transitions(graph):
    """One sigma per row ([B, 1] against states [B, L])."""
    x = states(graph.dim, 2)
    sigma = f64(SIGMAS)[:, None]
    forward = graph.transition(jnp.asarray(x), sigma)
    backward = graph.transp_transition(jnp.asarray(x), sigma)
    assert forward.dtype == backward.dtype == jnp.float64
    for b, s in enumerate(SIGMAS):
        p = reference.expm_q(graph, s)
        # Relative: the entries of order sigma (1e-6) and e^{-sigma} (2e-9) are
        # where a float32 step or a cancellation shows.
        np.testing.assert_allclose(forward[b], p[x[b]], rtol=1e-11, atol=1e-300, err_msg=str(s))
        np.testing.assert_allclose(backward[b], p.T[x[b]], rtol=1e-11, atol=1e-300, err_msg=str(s))


@pytest.mark.parametrize("graph", GRAPHS, ids=repr)
def test_staggered_score(graph):
    score = np.exp(np.random.default_rng(3).normal(size=(len(SIGMAS), 7, graph.dim)))  # (B, L, D)
    got = graph.staggered_score(f64(score), f64(SIGMAS)[:, None])
    assert got.dtype == jnp.float64 and got.shape == score.shape
    for b, d in enumerate(SIGMAS):
        e = reference.expm_q(graph, -d)
        # Against |E|^T s, the size of the terms the product sums.
        err = np.abs(np.asarray(got[b]) - score[b] @ e) / (score[b] @ np.abs(e))
        assert err.max() < 1e-12, (d, err.max())


@pytest.mark.parametrize("graph", GRAPHS, ids=repr)
def test_reverse_rate(graph):
    x = states(graph.dim, 5)
    score = np.exp(np.random.default_rng(5).normal(size=x.shape + (graph.dim,)))
    got = np.asarray(graph.reverse_rate(jnp.asarray(x), f64(score)))
    assert got.dtype == np.float64
    for b, l in np.ndindex(x.shape):
        want = reference.reverse_rate_by_definition(graph, x[b, l], score[b, l])
        scale = max(1.0, np.abs(want).max())
        assert np.abs(got[b, l] - want).max() <= 1e-12 * scale, (x[b, l], got[b, l], want)


def pairs(graph):
    """(x, x0) for every clean token x0 and every x it can be noised to."""
    p = reference.expm_q(graph, 1.0)
    return [(x, x0) for x0 in range(graph.vocab_size) for x in range(graph.dim) if p[x0, x] > 0]


@pytest.mark.parametrize("graph", GRAPHS, ids=repr)
@pytest.mark.parametrize("at_truth", [False, True], ids=["random", "true_ratios"])
def test_score_entropy(graph, at_truth):
    """The definition term by term at every sigma; >= 0, and 0 at the true ratios.

    Errors are relative to sum_y |Q[y, x]| (|s_y| + |r_y log s_y| + |K(r_y)|):
    at sigma = 1e-6 the ratios reach 1e6 and the terms nearly cancel.
    """
    x, x0 = map(np.array, zip(*pairs(graph)))  # (P,), (P,)
    rng = np.random.default_rng(4)
    for sigma in SIGMAS:
        if at_truth:
            p = reference.expm_q(graph, sigma)
            r = p[x0] / p[x0, x][:, None]  # (P, D)
            # exp(-1e4) is exactly 0 in float64: the score of a ratio of 0.
            log_score = np.where(r > 0, np.log(np.where(r > 0, r, 1.0)), -1e4)
        else:
            log_score = rng.normal(0.0, 1.5, size=(len(x), graph.dim))
        log_score[np.arange(len(x)), x] = 0.0
        got = graph.score_entropy(f64(log_score), f64(sigma), jnp.asarray(x), jnp.asarray(x0))
        assert got.dtype == jnp.float64 and got.shape == x.shape
        for i in range(len(x)):
            want, scale = reference.score_entropy_by_definition(graph, log_score[i], sigma, x[i], x0[i])
            assert abs(float(got[i]) - want) <= 1e-10 * scale, (sigma, x[i], x0[i], got[i], want)
            assert float(got[i]) >= -1e-10 * scale
            if at_truth:
                assert abs(want) <= 1e-12 * scale  # the reference's own minimum


SCHEDULES = (
    noise.Geometric(1e-4, 20.0),
    noise.Geometric(1e-3, 1.0),
    noise.LogLinear(1e-3),
    noise.LogLinear(0.1),
    noise.LogLinear(),
)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_schedules(schedule):
    t = np.linspace(0.0, 1.0, 21).reshape(3, 7)
    sigma, dsigma = schedule(f64(t))
    assert sigma.dtype == dsigma.dtype == jnp.float64 and sigma.shape == dsigma.shape == t.shape
    want_sigma, want_dsigma = reference.schedule_by_definition(schedule, t)
    np.testing.assert_allclose(sigma, want_sigma, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(dsigma, want_dsigma, rtol=1e-12)


@pytest.mark.parametrize("graph", (graphs.Uniform(5), graphs.Absorbing(3)), ids=repr)
def test_samplers(graph):
    """sample_transition and sample_rate keep their laws with float64 inputs.

    Fewer draws than the float32 checks of test_graphs.py: what is new here is
    the float64 code path, and a wrong path is wrong by far more than the bound.
    """
    n = 20_000
    bound = reference.tv_bound(graph.dim, n)
    state, sigma = (a.ravel() for a in np.meshgrid(np.arange(graph.dim), SIGMAS, indexing="ij"))
    x = jnp.broadcast_to(jnp.asarray(state)[:, None], (len(state), n))
    draws = np.asarray(graph.sample_transition(jax.random.key(11), x, f64(sigma)[:, None]))
    assert draws.shape == x.shape and np.issubdtype(draws.dtype, np.integer)
    for r in range(len(state)):
        p = reference.expm_q(graph, sigma[r])[state[r]]
        freq = np.bincount(draws[r], minlength=graph.dim) / n
        assert len(freq) == graph.dim
        assert reference.tv(freq, p) < bound and freq[p == 0].sum() == 0, (state[r], sigma[r])

    # From every state, the largest step dt = 1 / (total rate out).
    rate = np.zeros((graph.dim, graph.dim))
    rng = np.random.default_rng(6)
    for i in range(graph.dim):
        reverse = reference.reverse_rate_by_definition(graph, i, rng.exponential(size=graph.dim))
        rate[i] = reverse / -reverse[i] if reverse[i] < 0 else 0.0
    law = np.eye(graph.dim) + rate
    law[np.abs(law) < 1e-12] = 0.0
    x = jnp.broadcast_to(jnp.arange(graph.dim)[:, None], (graph.dim, n))
    rates = jnp.broadcast_to(f64(rate)[:, None, :], (graph.dim, n, graph.dim))  # (D, n, D)
    draws = np.asarray(graph.sample_rate(jax.random.key(13), x, rates))
    assert draws.shape == x.shape and np.issubdtype(draws.dtype, np.integer)
    for i in range(graph.dim):
        freq = np.bincount(draws[i], minlength=graph.dim) / n
        assert reference.tv(freq, law[i]) < bound and freq[law[i] == 0].sum() == 0, i
