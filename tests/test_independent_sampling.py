r"""sedd.sampling.sample at a few steps against the exact law of the paper's schemes.

p0 is the law of test_sampling.py: a seeded Dirichlet over the 27 sequences of
V = 3 tokens, L = 3 positions; the sampler gets its exact score
(reference.exact_score_fn). Written here from Sec. 4 of Lou et al. 2024 and
the sampler's documented grid, a reference propagates the law of the whole
reverse chain over all D^L states, in float64, with the exact ratios s of
p_sigma (reference.noised_law):

  grid      t_k = linspace(1, eps, S + 1), eps = 1e-5
  euler     p(x_l -> y) = dt sigma(t) Q[y, x_l] s_y for y != x_l, the rest stays
            (a negative stay is clipped to 0)
  analytic  p(x_l -> y) ∝ (exp(-ds Q)^T s)_y exp(ds Q)[y, x_l],
            ds = sigma_bar(t) - sigma_bar(t - dt)
  denoise   the analytic step with ds = sigma_bar(eps); for the absorbing graph MASK is dropped
  clamp     the fixed positions are set at the start, after every step and after the denoise

At S = 4 steps these laws are 0.10 to 0.14 from p0 in TV, and euler and
analytic differ by 0.09 for the uniform graph, while 20k draws scatter by
about 0.02: the sampler's empirical law is held to the reference's exact law
within the sampling noise alone, so a different grid, step or denoise fails.
For the uniform graph this pins down the law of the approximate (clamped)
conditioning as well. The reference is checked to converge to p0 at rate 1/S.
The sampler against p0 itself at 64 steps is test_sampling.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from sedd import graphs, noise, sampling

V, L = 3, 3
EPS = 1e-5  # the sampler's default last time
STEPS = 4
N_SAMPLES = 20_000
SETUPS = {
    "absorbing": (graphs.Absorbing(V), noise.LogLinear(1e-3)),
    "uniform": (graphs.Uniform(V), noise.Geometric(1e-3, 15.0)),
}
SAMPLERS = ("analytic", "euler")

X0 = reference.all_sequences(V, L)  # (27, L)
P0 = np.random.default_rng(0).dirichlet(np.ones(len(X0)))  # (27,)
EXACT = {kind: reference.exact_score_fn(graph, X0, P0) for kind, (graph, _) in SETUPS.items()}


@functools.lru_cache(maxsize=None)
def neighbours(dim):
    """int[D^L, L, D]: row of all_sequences(D, L) of state s with position l set to y."""
    states = reference.all_sequences(dim, L)
    out = np.empty((len(states), L, dim), np.int64)
    for l in range(L):
        for y in range(dim):
            z = states.copy()
            z[:, l] = y
            out[:, l, y] = reference.seq_index(z, dim)
    return out


def ratios(graph, sigma):
    """s[state, l, y] = p_sigma(state with x_l = y) / p_sigma(state), float64[D^L, L, D]."""
    p = reference.noised_law(graph, X0, P0, sigma)
    return p[neighbours(graph.dim)] / p[:, None, None]


def euler_kernel(graph, s, scale, states):
    """[D^L, L, D]: one tau-leaping step with the reverse rate, scale = dt sigma(t)."""
    q = reference.dense_q(graph)
    here = np.eye(graph.dim, dtype=bool)[states]  # (M, L, D)
    move = np.where(here, 0.0, q.T[states] * s * scale)  # Q[y, x_l] s_y dt sigma(t)
    return np.clip(np.where(here, 1.0 - move.sum(-1, keepdims=True), move), 0.0, None)


def analytic_kernel(graph, s, ds, states):
    """[D^L, L, D]: the Tweedie step over ds of noise, unnormalised."""
    back, forward = reference.expm_q(graph, -ds), reference.expm_q(graph, ds)
    return np.clip((s @ back) * forward.T[states], 0.0, None)


@functools.lru_cache(maxsize=None)
def reference_law(kind, sampler, steps, fixed=()):
    """The exact law over the 27 clean sequences of the scheme; fixed = ((position, token), ...)."""
    graph, schedule = SETUPS[kind]
    states = reference.all_sequences(graph.dim, L)  # (M, L), M = D^L

    def clamp(kernel):  # (M, L, D)
        for l, token in fixed:
            kernel[:, l, :] = np.eye(graph.dim)[token]
        return kernel

    def step(law, kernel):
        kernel = kernel / kernel.sum(-1, keepdims=True)
        move = np.ones((len(states), len(states)))  # (M, M): prod_l kernel[s, l, s'_l]
        for l in range(L):
            move *= kernel[:, l, :][:, states[:, l]]
        return law @ move

    # The limit law (all MASK, or uniform tokens) at each position, clamped.
    limit = np.eye(graph.dim)[graph.mask] if graph.absorb else np.full(graph.dim, 1.0 / graph.dim)
    start = np.tile(limit, (L, 1))  # (L, D)
    for l, token in fixed:
        start[l] = np.eye(graph.dim)[token]
    law = np.prod([start[l][states[:, l]] for l in range(L)], axis=0)  # (M,)
    times = np.linspace(1.0, EPS, steps + 1)
    for t, t_next in zip(times[:-1], times[1:]):
        sigma, dsigma = reference.schedule_by_definition(schedule, t)
        sigma_next, _ = reference.schedule_by_definition(schedule, t_next)
        s = ratios(graph, sigma)
        if sampler == "euler":
            kernel = euler_kernel(graph, s, (t - t_next) * dsigma, states)
        else:
            kernel = analytic_kernel(graph, s, sigma - sigma_next, states)
        law = step(law, clamp(kernel))
    sigma = reference.schedule_by_definition(schedule, times[-1])[0]
    kernel = analytic_kernel(graph, ratios(graph, sigma), sigma, states)
    if graph.absorb:
        kernel[..., graph.mask] = 0.0
    law = step(law, clamp(kernel))
    clean = (states < V).all(-1)
    assert law[~clean].sum() < 1e-12
    out = np.zeros(len(X0))
    out[reference.seq_index(states[clean], V)] = law[clean]
    return out


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("kind", SETUPS)
def test_reference_converges_to_p0(kind, sampler):
    """The reference scheme is first order: its error halves each time the steps double."""
    err = {s: reference.tv(reference_law(kind, sampler, s), P0) for s in (32, 64, 128)}
    assert err[128] < 6e-3, err
    assert 1.6 < err[32] / err[64] < 2.4 and 1.6 < err[64] / err[128] < 2.4, err


def run_sampler(kind, sampler, fixed=()):
    graph, schedule = SETUPS[kind]
    shape = (N_SAMPLES, L)
    kwargs = {}
    if fixed:
        mask, tokens = np.zeros(shape, bool), np.zeros(shape, np.int32)
        for l, token in fixed:
            mask[:, l], tokens[:, l] = True, token
        kwargs = dict(fixed_mask=mask, fixed_tokens=tokens)
    x = sampling.sample(jax.random.key(1), EXACT[kind], graph, schedule, shape, STEPS, sampler=sampler, **kwargs).tokens
    assert x.shape == shape and x.dtype == jnp.int32
    return np.asarray(x)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("kind", SETUPS)
def test_sampler_law_is_the_schemes(kind, sampler):
    x = run_sampler(kind, sampler)
    want = reference_law(kind, sampler, STEPS)
    got = reference.empirical_law(x, V)  # fails on a MASK left in the output
    assert reference.tv(got, want) < reference.tv_noise_bound(want, N_SAMPLES)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize(
    "kind, fixed",
    [("absorbing", ((0, 1),)), ("absorbing", ((L - 1, 2),)), ("uniform", ((0, 2), (L - 1, 0)))],
    ids=["absorbing-prefix", "absorbing-suffix", "uniform-both_ends"],
)
def test_conditioned_law_is_the_schemes(kind, fixed, sampler):
    """Exact conditioning for the absorbing graph, the clamped approximation for the uniform one."""
    x = run_sampler(kind, sampler, fixed)
    for l, token in fixed:
        assert (x[:, l] == token).all(), (l, np.unique(x[:, l]))
    want = reference_law(kind, sampler, STEPS, fixed)
    got = reference.empirical_law(x, V)
    assert reference.tv(got, want) < reference.tv_noise_bound(want, N_SAMPLES)
