"""Samplers against the exact score function of a tiny known distribution.

p0 is a seeded Dirichlet law over all V^L sequences (V = 3, L = 3); the
samplers run on its exact log-score (reference.exact_score_fn, enumerated
over the 27 sequences) and their empirical law is compared with p0, or with
p0 conditioned on the fixed positions, within the sampling noise of n draws
plus a discretisation margin. The law of the discretised schemes themselves,
at a few steps, is in test_independent_sampling.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from sedd import graphs, noise, sampling

V, L = 3, 3
N_SAMPLES = 5_000
STEPS = 64

ABSORBING = graphs.Absorbing(V)
UNIFORM = graphs.Uniform(V)
LOGLINEAR = noise.LogLinear(1e-3)
# sigma_max = 15: e^-15 = 3e-7, so the uniform limit is reached at t = 1.
GEOMETRIC = noise.Geometric(1e-3, 15.0)
SETUPS = {"absorbing": (ABSORBING, LOGLINEAR), "uniform": (UNIFORM, GEOMETRIC)}

ALL_X0 = reference.all_sequences(V, L)  # (N0, L), N0 = V^L
P0 = np.random.default_rng(0).dirichlet(np.ones(V**L))  # (N0,)
EXACT = {name: reference.exact_score_fn(g, ALL_X0, P0) for name, (g, _) in SETUPS.items()}

# Discretisation allowance at STEPS = 64: the exact laws of the schemes at 64
# steps are 0.0065 (absorbing), 0.0099 (uniform, analytic) and 0.0066
# (uniform, euler) from p0 in TV (test_independent_sampling.py propagates
# them); twice the largest.
MARGIN = 0.02


def tv_bound(p, n, margin):
    """TV(empirical, p) <= TV(empirical, q) + TV(q, p) for the sampler's law q:
    the sampling noise of n draws, plus the discretisation error `margin`."""
    return reference.tv_noise_bound(p, n) + margin


def conditional(p0, fixed):
    """p0 conditioned on {position: token}, over the free positions' sequences."""
    keep = np.all([ALL_X0[:, l] == tok for l, tok in fixed.items()], axis=0)
    free = [l for l in range(L) if l not in fixed]
    cond = np.zeros(V ** len(free))
    np.add.at(cond, reference.seq_index(ALL_X0[keep][:, free], V), p0[keep])
    return cond / cond.sum(), free


def free_marginal(p0, free):
    """The unconditioned law of the free positions."""
    marginal = np.zeros(V ** len(free))
    np.add.at(marginal, reference.seq_index(ALL_X0[:, free], V), p0)
    return marginal


@pytest.mark.parametrize("graph_name", ["absorbing", "uniform"])
def test_exact_score_matches_enumeration(graph_name):
    """The jnp score the samplers run on, at every state, against float64 enumeration (scipy's expm)."""
    graph = SETUPS[graph_name][0]
    states = reference.all_sequences(graph.dim, L)  # (M, L): every noised sequence
    for sigma in (1e-5, 1e-3, 0.1, 1.0, 6.9, 15.0):
        p = reference.noised_law(graph, ALL_X0, P0, sigma)  # (M,)
        got = np.asarray(EXACT[graph_name](jnp.asarray(states), jnp.full(len(states), sigma)))
        for l in range(L):
            for y in range(graph.dim):
                moved = states.copy()
                moved[:, l] = y
                want = np.log(p[reference.seq_index(moved, graph.dim)] / p)
                np.testing.assert_allclose(got[:, l, y], want, atol=2e-5, err_msg=f"{sigma} {l} {y}")


@pytest.mark.parametrize("sampler", ["analytic", "euler"])
@pytest.mark.parametrize("graph_name", ["absorbing", "uniform"])
def test_sampler_matches_p0(graph_name, sampler):
    graph, sched = SETUPS[graph_name]
    x = sampling.sample(
        jax.random.key(0), EXACT[graph_name], graph, sched, (N_SAMPLES, L), STEPS, sampler=sampler
    ).tokens
    x = np.asarray(x)
    assert x.dtype == np.int32 and x.shape == (N_SAMPLES, L)
    assert x.min() >= 0 and x.max() < V
    dist = reference.tv(reference.empirical_law(x, V), P0)
    bound = tv_bound(P0, N_SAMPLES, MARGIN)
    print(f"{graph_name} {sampler} steps={STEPS} n={N_SAMPLES}: TV={dist:.4f} bound={bound:.4f}")
    assert dist < bound


@pytest.mark.parametrize(
    "fixed", [{0: 1}, {1: 2}, {2: 0}, {0: 2, 2: 1}], ids=["prefix", "infill", "suffix", "both_ends"]
)
def test_absorbing_conditioning_is_exact(fixed):
    graph, sched = SETUPS["absorbing"]
    mask = np.zeros((N_SAMPLES, L), bool)
    tokens = np.zeros((N_SAMPLES, L), np.int32)
    for l, tok in fixed.items():
        mask[:, l], tokens[:, l] = True, tok
    x = np.asarray(
        sampling.sample(
            jax.random.key(1),
            EXACT["absorbing"],
            graph,
            sched,
            (N_SAMPLES, L),
            STEPS,
            fixed_mask=mask,
            fixed_tokens=tokens,
        ).tokens
    )
    np.testing.assert_array_equal(x[mask], tokens[mask])
    cond, free = conditional(P0, fixed)
    dist = reference.tv(reference.empirical_law(x[:, free], V), cond)
    bound = tv_bound(cond, N_SAMPLES, MARGIN)
    print(f"absorbing conditioning {fixed}: TV={dist:.4f} bound={bound:.4f}")
    assert dist < bound


def test_uniform_conditioning_is_approximate():
    """Clamping on the uniform graph pulls the free positions most of the way to p0(. | fixed).

    Not all the way (the score reads the clamp as a noisy token; the exact law
    of the clamped scheme is checked in test_independent_sampling.py): at 64
    steps it is 0.047 from the conditional, against 0.244 for the marginal, the
    law of a sampler that clamps the output only.
    """
    graph, sched = SETUPS["uniform"]
    fixed = {0: 1}
    mask = np.zeros((N_SAMPLES, L), bool)
    mask[:, 0] = True
    tokens = np.where(mask, 1, 0).astype(np.int32)
    x = np.asarray(
        sampling.sample(
            jax.random.key(2),
            EXACT["uniform"],
            graph,
            sched,
            (N_SAMPLES, L),
            STEPS,
            fixed_mask=mask,
            fixed_tokens=tokens,
        ).tokens
    )
    np.testing.assert_array_equal(x[:, 0], 1)
    cond, free = conditional(P0, fixed)
    dist = reference.tv(reference.empirical_law(x[:, free], V), cond)
    unconditioned = reference.tv(free_marginal(P0, free), cond)
    print(f"uniform prefix clamp: TV to p0(.|x_0=1) = {dist:.4f}; marginal: {unconditioned:.4f}")
    assert dist < unconditioned / 2


def test_no_mask_survives_the_denoise():
    graph, sched = SETUPS["absorbing"]
    # Stopping at t = 0.5 leaves about half of the positions masked ...
    grid = [1.0, 0.8, 0.5]
    raw = sampling.sample(
        jax.random.key(3), EXACT["absorbing"], graph, sched, (512, L), 2, denoise=False, time_grid=grid
    ).tokens
    assert 0.3 < float(jnp.mean(raw == graph.mask)) < 0.7
    # ... and the denoise fills every one of them.
    x = sampling.sample(jax.random.key(3), EXACT["absorbing"], graph, sched, (512, L), 2, time_grid=grid).tokens
    assert int(jnp.max(x)) < V and int(jnp.min(x)) >= 0


def test_argmax_final_and_trajectory():
    graph, sched = SETUPS["absorbing"]
    out = sampling.sample(
        jax.random.key(4),
        EXACT["absorbing"],
        graph,
        sched,
        (8, L),
        10,
        final="argmax",
        return_trajectory=True,
        trajectory_every=3,
    )
    x, traj = out.tokens, out.trajectory
    assert x.shape == (8, L) and x.dtype == jnp.int32 and int(x.max()) < V
    assert traj.shape == (10 // 3 + 1, 8, L) and traj.dtype == jnp.int32
    assert bool(jnp.all(traj[0] == graph.mask))  # the limit law
    # Masks never come back in the absorbing reverse process.
    masked = np.asarray(traj == graph.mask)
    assert np.all(masked[1:] <= masked[:-1])
    # With a deterministic last step, the same trajectory gives the same sample.
    x2 = sampling.sample(jax.random.key(4), EXACT["absorbing"], graph, sched, (8, L), 10, final="argmax").tokens
    np.testing.assert_array_equal(x, x2)


def test_argmax_picks_the_mode_at_the_denoise():
    """From the all-mask state a single denoise fills each position by its argmax."""
    graph = ABSORBING
    logits = jnp.log(jnp.array([0.2, 0.5, 0.3]))

    def score_fn(x, sigma):
        # The exact score at a masked position of independent positions with
        # law softmax(logits): p_sigma(y) / p_sigma(MASK) = p(y) / (e^sigma - 1).
        tokens = logits - graphs.log_expm1(sigma)[:, None, None]  # (B, 1, 1)
        tokens = jnp.broadcast_to(tokens, x.shape + (V,))  # (B, L, V)
        return jnp.concatenate([tokens, jnp.zeros(x.shape + (1,))], -1)

    x = sampling.sample(
        jax.random.key(5), score_fn, graph, LOGLINEAR, (4, L), 1, final="argmax", time_grid=[1.0, 0.999]
    ).tokens
    # One step from t = 1 to 0.999 unmasks a position with probability ~1e-3;
    # the argmax denoise then fills the masked ones with token 1.
    assert int(jnp.sum(x == 1)) >= 10


def test_compiled_once_for_repeated_calls():
    graph, sched = SETUPS["absorbing"]
    traces = []
    exact = EXACT["absorbing"]

    def counting(x, sigma):
        traces.append(1)  # runs only while tracing
        return exact(x, sigma)

    mask = jnp.zeros((16, L), bool).at[:, 0].set(True)
    for seed in range(3):
        tokens = jnp.full((16, L), seed, jnp.int32)
        sampling.sample(
            jax.random.key(seed), counting, graph, sched, (16, L), 5, fixed_mask=mask, fixed_tokens=tokens
        ).tokens
        if seed == 0:
            first = len(traces)
    # One trace of the loop body and one of the denoise, then never again.
    assert first == 2 and len(traces) == first


def test_score_params_are_traced():
    graph, sched = SETUPS["absorbing"]
    traces = []

    def score_fn(params, x, sigma):
        traces.append(1)
        logits = jnp.broadcast_to(params, x.shape + (V,))
        return jnp.concatenate([logits, jnp.zeros(x.shape + (1,))], -1)

    for favourite in range(V):
        params = jnp.full((V,), -30.0).at[favourite].set(0.0)
        x = sampling.sample(jax.random.key(6), score_fn, graph, sched, (4, L), 4, score_params=params).tokens
        assert bool(jnp.all(x == favourite))
    assert len(traces) == 2


def test_a_registered_sampler_is_used():
    name = "test_stay_put"

    @sampling.register_sampler(name)
    def stay(key, score_fn, graph, noise, x, t, dt, categorical):
        return x

    try:
        with pytest.raises(ValueError, match="already registered"):
            sampling.register_sampler(name)(stay)
        x = sampling.sample(
            jax.random.key(7), EXACT["absorbing"], ABSORBING, LOGLINEAR, (4, L), 3, sampler=name, denoise=False
        ).tokens
        assert bool(jnp.all(x == ABSORBING.mask))
    finally:
        del sampling.SAMPLERS[name]


def test_gumbel32_runs():
    graph, sched = SETUPS["uniform"]
    x = sampling.sample(jax.random.key(8), EXACT["uniform"], graph, sched, (64, L), 4, categorical="gumbel32").tokens
    assert x.shape == (64, L) and int(x.max()) < V


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(steps=0), "steps"),
        (dict(steps=2.5), "steps"),
        (dict(sampler="heun"), r"unknown sampler 'heun'.*analytic.*euler"),
        (dict(categorical="float16"), r"unknown categorical method 'float16'"),
        (dict(final="mode"), "unknown final"),
        (dict(final="argmax", denoise=False), "denoise"),
        (dict(shape=(4,)), "2-D"),
        (dict(shape=(2, 2, 3)), "2-D"),
        (dict(eps=0.0), "eps"),
        (dict(eps=1.0), "eps"),
        (dict(time_grid=[1.0, 0.5]), "time_grid"),
        (dict(time_grid=[1.0, 0.5, 0.7, 0.1]), "decreasing"),
        (dict(time_grid=[1.0, 0.5, 0.2, 0.0]), "decreasing"),
        (dict(fixed_mask=np.ones((4, L), bool)), "together"),
        (dict(fixed_mask=np.ones((4, 2), bool), fixed_tokens=np.ones((4, 2), int)), "fixed_mask must have"),
        (dict(fixed_mask=np.ones((4, L), bool), fixed_tokens=np.ones((4, 2), int)), "fixed_tokens must have"),
        (dict(fixed_mask=np.ones((4, L), bool), fixed_tokens=np.full((4, L), V)), r"\[0, vocab_size=3\)"),
        (dict(fixed_mask=np.ones((4, L), bool), fixed_tokens=np.full((4, L), -1)), r"\[0, vocab_size=3\)"),
        (dict(trajectory_every=0), "trajectory_every"),
    ],
)
def test_errors(kwargs, match):
    args = dict(shape=(4, L), steps=3)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        sampling.sample(jax.random.key(0), EXACT["absorbing"], ABSORBING, LOGLINEAR, **args)


def test_unfixed_positions_of_fixed_tokens_are_ignored():
    """Only fixed positions are range-checked: filler such as the mask id is fine."""
    mask = np.zeros((4, L), bool)
    mask[:, 0] = True
    tokens = np.full((4, L), ABSORBING.mask)
    tokens[:, 0] = 2
    x = sampling.sample(
        jax.random.key(9), EXACT["absorbing"], ABSORBING, LOGLINEAR, (4, L), 3, fixed_mask=mask, fixed_tokens=tokens
    ).tokens
    assert bool(jnp.all(x[:, 0] == 2)) and int(x.max()) < V


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["analytic", "euler"])
@pytest.mark.parametrize("graph_name", ["absorbing", "uniform"])
def test_sampler_matches_p0_many_steps(graph_name, sampler):
    """Tighter: 256 steps, 100k samples, a quarter of the margin."""
    graph, sched = SETUPS[graph_name]
    n = 100_000
    x = sampling.sample(jax.random.key(10), EXACT[graph_name], graph, sched, (n, L), 256, sampler=sampler).tokens
    dist = reference.tv(reference.empirical_law(x, V), P0)
    bound = tv_bound(P0, n, MARGIN / 4)
    print(f"{graph_name} {sampler} steps=256 n={n}: TV={dist:.4f} bound={bound:.4f}")
    assert dist < bound
