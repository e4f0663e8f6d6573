"""Noise schedules against their formulas (tests/reference.py) and autodiff; the
DSE loss at the exact score of a point mass; the categorical sampler's law,
integrated exactly over its random bits."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.integrate
import scipy.stats

import reference
from sedd import graphs, losses, noise
from sedd.categorical import sample_categorical

SCHEDULES = [
    noise.Geometric(1e-4, 20.0),
    noise.Geometric(1e-3, 1.0),
    noise.Geometric(0.5, 3.0),
    noise.LogLinear(1e-3),
    noise.LogLinear(0.1),
    noise.LogLinear(),
]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_dsigma_is_the_derivative(schedule):
    ts = jnp.linspace(0.0, 1.0, 11)
    grads = jax.vmap(jax.grad(lambda t: schedule(t)[0]))(ts)
    _, dsigma = schedule(ts)
    np.testing.assert_allclose(grads, dsigma, rtol=1e-5)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=repr)
def test_schedule_formulas(schedule):
    """On a [3, 7] grid of t and at a scalar t; the float64 path is in test_independent_core.py."""
    t = np.linspace(0.0, 1.0, 21, dtype=np.float32).reshape(3, 7)
    sigma, dsigma = schedule(jnp.asarray(t))
    want_sigma, want_dsigma = reference.schedule_by_definition(schedule, t)
    assert sigma.shape == dsigma.shape == t.shape
    # 5e-5: float32 holds 1 - eps = 0.999 to 1.3e-8, which is 1.3e-5 of 1 - 0.999 t at t = 1.
    np.testing.assert_allclose(sigma, want_sigma, rtol=5e-5, atol=1e-7)
    np.testing.assert_allclose(dsigma, want_dsigma, rtol=5e-5)
    sigma, dsigma = schedule(0.37)
    assert np.shape(sigma) == np.shape(dsigma) == ()
    want = reference.schedule_by_definition(schedule, np.float32(0.37))
    np.testing.assert_allclose([sigma, dsigma], want, rtol=5e-5)


def test_loglinear_mask_probability_is_linear():
    """Why the absorbing graph uses it: 1 - e^{-sigma_bar(t)} = (1 - eps) t."""
    t = jnp.linspace(0.0, 1.0, 11)
    sigma, _ = noise.LogLinear(1e-3)(t)
    np.testing.assert_allclose(-np.expm1(-np.asarray(sigma)), 0.999 * np.asarray(t), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "make",
    [
        lambda: noise.Geometric(1.0, 1.0),
        lambda: noise.Geometric(2.0, 1.0),
        lambda: noise.Geometric(0.0, 1.0),
        lambda: noise.LogLinear(0.0),
        lambda: noise.LogLinear(1.0),
        lambda: noise.LogLinear(-0.1),
    ],
)
def test_bad_schedules(make):
    with pytest.raises(ValueError, match="sigma_min|eps"):
        make()


def test_low_discrepancy_times():
    t, w = losses.sample_times(jax.random.key(0), 8, 1e-3, low_discrepancy=True)
    u = np.sort((np.asarray(t) - 1e-3) / (1 - 1e-3))
    # One point in each eighth of [0, 1).
    np.testing.assert_array_equal(np.floor(u * 8), np.arange(8))
    np.testing.assert_array_equal(w, 1.0)
    iid, _ = losses.sample_times(jax.random.key(0), 10_000)
    assert 1e-3 <= float(iid.min()) and float(iid.max()) <= 1.0


@pytest.mark.parametrize("power", [0.3, 0.5, 0.8])
def test_power_proposal_draws_its_law_and_weights_it_back_to_uniform(power):
    """t ~ q(t) = t^-p / Z on [eps, 1] (its CDF, a KS test), and E_q[w f] = E_U[f] (exact integrals)."""
    eps, n = 1e-3, 400_000
    t, w = map(np.asarray, losses.sample_times(jax.random.key(1), n, eps, power=power))
    t, w = t.astype(np.float64), w.astype(np.float64)
    assert eps * (1 - 1e-6) <= t.min() and t.max() <= 1.0
    assert (
        scipy.stats.kstest(t, lambda x: (x ** (1 - power) - eps ** (1 - power)) / (1 - eps ** (1 - power))).pvalue
        > 1e-3
    )
    # The weights are U(t) / q(t): exact at every draw ...
    z = sum(scipy.integrate.quad(lambda x: x**-power, lo, hi)[0] for lo, hi in [(eps, 0.01), (0.01, 1.0)])
    np.testing.assert_allclose(w, (1 / (1 - eps)) / (t**-power / z), rtol=2e-5)
    # ... so the weighted mean of f under q estimates f's uniform mean, for f like the loss's integrand.
    for f in (lambda x: 1 / x, lambda x: x**2, lambda x: np.log(x)):
        exact = sum(scipy.integrate.quad(f, lo, hi)[0] for lo, hi in [(eps, 0.01), (0.01, 1.0)]) / (1 - eps)
        vals = w * f(t)
        assert abs(vals.mean() - exact) < 4 * vals.std() / np.sqrt(n), f
    # Stratified and power together: one draw in each eighth of the proposal's CDF.
    t8, _ = losses.sample_times(jax.random.key(2), 8, eps, low_discrepancy=True, power=power)
    cdf = (np.asarray(t8, np.float64) ** (1 - power) - eps ** (1 - power)) / (1 - eps ** (1 - power))
    np.testing.assert_array_equal(np.floor(np.sort(cdf) * 8 + 1e-6), np.arange(8))


@pytest.mark.parametrize("power", [-0.1, 1.0])
def test_power_outside_its_range_is_refused(power):
    with pytest.raises(ValueError, match="t_power"):
        losses.sample_times(jax.random.key(0), 4, 1e-3, power=power)


def test_power_proposal_weights_each_sequences_loss():
    """The loss with t_power is the loss at the proposal's times, times their weights (unbiased by the test above)."""
    graph, sched = graphs.Absorbing(3), noise.LogLinear()
    x0 = jnp.tile(jnp.array([[0, 1, 2, 1]]), (64, 1))
    score_fn = lambda x, sigma: jnp.full((*x.shape, graph.dim), jnp.log(0.3))  # noqa: E731  (far from exact)
    key = jax.random.key(3)
    t, w = losses.sample_times(jax.random.split(key)[0], 64, 1e-3, power=0.5)
    at_t = losses.loss_per_position(key, score_fn, graph, sched, x0, t=t)
    weighted = losses.loss_per_position(key, score_fn, graph, sched, x0, t_power=0.5)
    assert float(jnp.abs(w - 1).max()) > 0.5  # the weights are not all 1
    np.testing.assert_allclose(weighted, w[:, None] * at_t, rtol=1e-6)
    uniform = losses.loss_per_position(key, score_fn, graph, sched, x0)  # t_power 0: SEDD's draw, unweighted
    t0, _ = losses.sample_times(jax.random.split(key)[0], 64, 1e-3)
    np.testing.assert_array_equal(uniform, losses.loss_per_position(key, score_fn, graph, sched, x0, t=t0))


@pytest.mark.parametrize("graph", [graphs.Absorbing(5), graphs.Uniform(5)], ids=repr)
def test_loss_zero_for_the_exact_score_of_a_point_mass(graph):
    """The exact score of p0 = delta(x0) is the minimiser, where the loss is 0."""
    x0 = jnp.array([[0, 3, 1, 4]] * 6)
    sched = noise.LogLinear() if graph.absorb else noise.Geometric(1e-3, 10.0)
    exact = reference.exact_score_fn(graph, x0[:1], [1.0])
    per_pos = losses.loss_per_position(jax.random.key(0), exact, graph, sched, x0)
    assert per_pos.shape == (6, 4)
    np.testing.assert_allclose(per_pos, 0.0, atol=1e-4)
    # A wrong score (all ratios 1) has a strictly positive loss.
    wrong = losses.loss_fn(jax.random.key(0), lambda x, s: jnp.zeros(x.shape + (graph.dim,)), graph, sched, x0)
    assert wrong.shape == (6,) and (wrong > 0).any() and (wrong >= 0).all()


def test_loss_is_nats_per_sequence_and_jits():
    graph, sched = graphs.Absorbing(7), noise.LogLinear()
    x0 = jax.random.randint(jax.random.key(1), (4, 16), 0, 7)
    f = jax.jit(lambda k: losses.loss_fn(k, lambda x, s: jnp.zeros(x.shape + (8,)), graph, sched, x0))
    per_seq = f(jax.random.key(2))
    per_pos = losses.loss_per_position(jax.random.key(2), lambda x, s: jnp.zeros(x.shape + (8,)), graph, sched, x0)
    np.testing.assert_allclose(per_seq, per_pos.sum(-1), rtol=1e-6)
    u = losses.units(float(per_seq.mean()) / 16, chars_per_token=1.0)
    assert math.isclose(u["bits_per_token"], u["nats_per_token"] / math.log(2))
    assert math.isclose(u["bits_per_char"], u["bits_per_token"])


def precise_rate(p):
    """Exact P(draw the p-token) of the "precise" sampler against one (1 - p)-token.

    The rare token wins iff E_r / p < E_b / (1 - p), so given E_r the chance is
    exp(-E_r (1 - p) / p) (E_b is Exp(1) to ~1e-4 relative precision where it
    matters, E_b ~ 1). The rate is the mean of that over the 2^64 bit patterns
    (hi, lo) behind E_r; only hi < 60 p 2^32 contributes more than e^-60, and
    lo is integrated on a fine grid, so the sum below is the sampler's law.
    """
    from sedd.categorical import exponential_from_bits

    odds = (1 - p) / p
    n_hi = max(1, int(60 * p * 2**32))
    hi = np.arange(n_hi, dtype=np.uint64)
    m = 64 if n_hi > 1 else 2**20  # hi = 0 alone: E ~ lo 2^-64, so lo needs detail
    lo = ((np.arange(m) + 0.5) / m * 2**32).astype(np.uint64)
    total = 0.0
    for chunk in np.array_split(hi, max(1, n_hi * m // 2**22)):
        e = exponential_from_bits(
            jnp.asarray(chunk[:, None].astype(np.uint32)), jnp.asarray(lo[None, :].astype(np.uint32))
        )
        total += float(np.exp(-np.asarray(e, np.float64) * odds).mean(1).sum())
    return total / 2**32


def gumbel32_rate(p):
    """Exact P(draw the p-token) of float32 Gumbel-max ("low" mode) against a (1 - p)-token.

    JAX's low-mode Gumbel is -log(-log u) with u = uniform(tiny, 1) on the float32
    grid {tiny + k 2^-23}. The rare token wins iff g_r - g_b > log((1 - p) / p);
    summing over the grid points of u_r, with the exact grid law of g_b, gives
    the sampler's law (the top of the grid caps g at 15.94).
    """
    c = np.log((1 - p) / p)
    k = np.arange(2**23 - 2**20, 2**23, dtype=np.float64)  # the top of the u grid
    u_r = np.float32(np.finfo(np.float32).tiny) + (k * 2.0**-23).astype(np.float32)
    g_r = -np.log(-np.log(u_r.astype(np.float64)))
    u_b_max = np.exp(-np.exp(-(g_r - c)))  # g_b < g_r - c  <=>  u_b < this
    return float((np.ceil(u_b_max * 2**23) / 2**23).sum() / 2**23)


def test_categorical_precise_draws_rare_tokens_at_the_right_rate():
    """A token of probability ~1e-7 (and far below) is drawn at its own rate; float32 Gumbel is not."""
    for p in (1e-7, 1e-9, 1e-12):
        assert abs(precise_rate(p) / p - 1) < 2e-3, (p, precise_rate(p))
    # JAX's float32 Gumbel really lives on that grid: it never exceeds the cap.
    g = jax.random.gumbel(jax.random.key(0), (2**22,), jnp.float32, mode="low")
    assert float(g.max()) <= -np.log(-np.log(np.float32(1 - 2**-23))) + 1e-5
    assert gumbel32_rate(1e-7) / 1e-7 < 0.9  # biased at 1e-7
    assert gumbel32_rate(1e-9) / 1e-9 < 1e-3  # and all but never draws a 1e-9 token
    # Empirical check that the precise sampler's law is right at moderate p
    # (where counting is cheap): p = 1e-3 over 2^22 draws, ~4,200 hits.
    probs = jnp.broadcast_to(jnp.array([1 - 1e-3, 1e-3]), (2**22, 2))
    hits = int(jax.jit(lambda k: sample_categorical(k, probs).sum())(jax.random.key(1)))
    assert abs(hits - 1e-3 * 2**22) < 5 * np.sqrt(1e-3 * 2**22), hits


def test_categorical_law_and_bad_method():
    probs = jnp.array([0.5, 0.3, 0.2, 0.0])
    draws = sample_categorical(jax.random.key(3), jnp.broadcast_to(probs, (100_000, 4)))
    freq = np.bincount(np.asarray(draws), minlength=4) / 1e5
    assert reference.tv(freq, probs) < reference.tv_bound(4, 100_000)
    assert freq[3] == 0  # a zero weight is never drawn
    with pytest.raises(ValueError, match="precise"):
        sample_categorical(jax.random.key(0), probs, "float16")
