"""The samplers of sedd.sampling against exact laws, their options, and their NFE.

Two exact test laws, both with exact score functions:
  - P0, the seeded Dirichlet law over the 27 sequences of V = 3, L = 3 of
    test_sampling.py (reference.exact_score_fn): a correlated law, for the
    samplers that claim to be exact;
  - PRODUCT, independent positions (L = 12, V = 12) with known per-position
    laws p_l: the denoiser at a masked position is p_l whatever the rest, so
    the nucleus, the confidence schedule and the entropies of each step are
    known in closed form.
An empirical law of n draws is held to the sampler's law within
reference.tv_noise_bound (mean + 5 sd of the TV of n exact draws), plus the
discretisation allowance of test_sampling.py where the sampler is exact only
as the steps grow.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from sedd import categorical, graphs, noise, sampling
from test_independent_sampling import reference_law

V, L = 3, 3
N_SAMPLES = 20_000
ABSORBING, UNIFORM = graphs.Absorbing(V), graphs.Uniform(V)
LOGLINEAR, GEOMETRIC = noise.LogLinear(1e-3), noise.Geometric(1e-3, 15.0)
X0 = reference.all_sequences(V, L)
P0 = np.random.default_rng(0).dirichlet(np.ones(V**L))
EXACT = {"absorbing": reference.exact_score_fn(ABSORBING, X0, P0), "uniform": reference.exact_score_fn(UNIFORM, X0, P0)}
NOISE_BOUND = reference.tv_noise_bound(P0, N_SAMPLES)
MARGIN = 0.02  # test_sampling.py's allowance for 64 grid steps


def time_independent(graph, exact, sigma0=1.0):
    """A score that depends on sigma only through 1 / (e^sigma - 1) (RADD, Thm. 1), from an exact one.

    At a masked position the token ratios are p(x0_l = y | unmasked) / (e^sigma - 1),
    p(x0_l | unmasked) read once at sigma0 (it does not depend on sigma); every
    other entry is 0 (the samplers read nothing else of an unmasked row).
    """

    def score_fn(x, sigma):
        sigma = jnp.broadcast_to(sigma, x.shape[:1])
        log_p = exact(x, jnp.full_like(sigma, sigma0)) + graphs.log_expm1(jnp.float32(sigma0))
        out = log_p - graphs.log_expm1(sigma)[:, None, None]
        keep = (x == graph.mask)[..., None] & ~jax.nn.one_hot(x, graph.dim, dtype=bool)
        return jnp.where(keep, out, 0.0)

    return score_fn


TIME_INDEPENDENT = time_independent(ABSORBING, EXACT["absorbing"])

# Independent positions: position l has its own law p_l over V2 tokens.
V2, L2 = 12, 12
PRODUCT_GRAPH = graphs.Absorbing(V2)
_rng = np.random.default_rng(1)
PRODUCT = np.stack([_rng.dirichlet(np.full(V2, a)) for a in np.geomspace(0.005, 1.0, L2)]) + 1e-12
PRODUCT /= PRODUCT.sum(-1, keepdims=True)  # (L2, V2): entropies from 0 to 1.9 nats
PRODUCT_ENTROPY = -(PRODUCT * np.log(np.where(PRODUCT > 0, PRODUCT, 1.0))).sum(-1)  # (L2,) nats


def product_score(x, sigma):
    """The exact absorbing score of the product law: log p_l(y) - log(e^sigma - 1) at a masked position."""
    sigma = jnp.broadcast_to(sigma, x.shape[:1])
    tokens = jnp.log(jnp.asarray(PRODUCT, jnp.float32))[None] - graphs.log_expm1(sigma)[:, None, None]
    out = jnp.concatenate([tokens, jnp.zeros(tokens.shape[:2] + (1,))], -1)  # (B, L2, D)
    keep = (x == PRODUCT_GRAPH.mask)[..., None] & ~jax.nn.one_hot(x, PRODUCT_GRAPH.dim, dtype=bool)
    return jnp.where(keep, out, 0.0)


def nucleus_sets(p, top_p):
    """bool[L, V]: the smallest set of most probable tokens of each row with mass >= top_p."""
    keep = np.zeros(p.shape, bool)
    for l, row in enumerate(p):
        order = np.argsort(-row)
        before = np.cumsum(row[order]) - row[order]
        keep[l, order[before < top_p]] = True
    return keep


def counted(score_fn):
    """score_fn with a host counter of the calls the compiled program really makes."""
    calls = []

    def fn(x, sigma):
        jax.debug.callback(lambda: calls.append(1))
        return score_fn(x, sigma)

    return fn, calls


def draw(sampler, steps, n=N_SAMPLES, graph=ABSORBING, sched=LOGLINEAR, score_fn=None, seed=0, **kw):
    """Samples and stats of sampling.sample; every draw checks its reported NFE against the calls counted."""
    score_fn, calls = counted(score_fn or EXACT["absorbing" if graph.absorb else "uniform"])
    out = sampling.sample(
        jax.random.key(seed), score_fn, graph, sched, (n, L), steps, sampler=sampler, return_stats=True, **kw
    )
    jax.effects_barrier()
    assert int(out.stats["nfe"]) == len(calls), (sampler, kw, int(out.stats["nfe"]), len(calls))
    traj = () if out.trajectory is None else (np.asarray(out.trajectory),)
    return (np.asarray(out.tokens), *traj, out.stats)


# --------------------------------------------------------------------------- exact laws


@pytest.mark.parametrize(
    "sampler, steps, options, margin",
    [
        ("first_hitting", L, {}, 0.0),
        ("confidence", L, {"order": "random"}, 0.0),
        ("dilated", L, {}, 0.0),
        ("left_to_right", L, {"threshold": 1.0}, 0.0),
        ("remdm", 64, {"schedule": "cap", "eta": 0.02}, MARGIN),
        pytest.param("remdm", 64, {"schedule": "rescale", "eta": 0.02}, MARGIN, marks=pytest.mark.slow),
        pytest.param("remdm", 64, {"schedule": "loop", "eta": 0.02}, MARGIN, marks=pytest.mark.slow),
    ],
    ids=["first_hitting", "any_order_ar", "dilated_order", "left_to_right", "remdm_cap", "remdm_rescale", "remdm_loop"],
)
def test_exact_samplers_reproduce_p0(sampler, steps, options, margin):
    """first_hitting, random- or dilated-order unmasking and left to right one position a step are exact at L steps
    (no allowance); ReMDM keeps MDLM's marginals and is held to the 64-step allowance."""
    x, stats = draw(sampler, steps, **options)
    dist = reference.tv(reference.empirical_law(x, V), P0)
    print(f"{sampler} {options} steps={steps}: TV={dist:.4f} bound={NOISE_BOUND + margin:.4f} nfe={int(stats['nfe'])}")
    assert dist < NOISE_BOUND + margin


def test_cache_is_exact_and_saves_calls():
    """A time-independent exact score: cache=True draws the law with at most L calls a sequence.

    The calls a sequence needs are counted from its states as well: one at
    each step (and the denoise) that starts from a state with a MASK that
    differs from the state of the previous step.
    """
    steps = 64
    x, traj, stats = draw("analytic", steps, score_fn=TIME_INDEPENDENT, cache=True, return_trajectory=True)
    dist = reference.tv(reference.empirical_law(x, V), P0)
    per_row = np.asarray(stats["nfe_per_sample"])
    print(f"cache: TV={dist:.4f}, calls a sequence {per_row.mean():.2f} (max {per_row.max()}), {steps} steps")
    assert dist < NOISE_BOUND + MARGIN
    changed = np.concatenate([np.ones((1, len(x)), bool), (traj[1:] != traj[:-1]).any(-1)])  # (N + 1, n)
    np.testing.assert_array_equal(per_row, ((traj == ABSORBING.mask).any(-1) & changed).sum(0))
    # A sequence has at most L distinct states with a mask, so at most L calls.
    assert per_row.max() <= L < steps


@pytest.mark.slow
def test_cache_draws_what_the_uncached_sampler_draws():
    """Rescaling the cached output is exact up to float rounding: the same draws from the same key."""
    plain, _ = draw("analytic", 64, score_fn=TIME_INDEPENDENT)
    cached, stats = draw("analytic", 64, score_fn=TIME_INDEPENDENT, cache=True)
    assert np.mean(np.all(cached == plain, axis=1)) > 0.999
    _, one = draw("analytic", 64, n=1, score_fn=TIME_INDEPENDENT, cache=True)
    assert int(one["nfe"]) <= L


@pytest.mark.parametrize("graph_name", ["absorbing", "uniform"])
def test_corrector_is_no_worse(graph_name):
    """One forward-backward corrector step after each of 8 analytic steps: no farther from p0 than
    the exact law of the 8-step scheme without it (test_independent_sampling.reference_law)."""
    graph, sched = (ABSORBING, LOGLINEAR) if graph_name == "absorbing" else (UNIFORM, GEOMETRIC)
    x, stats = draw("analytic", 8, graph=graph, sched=sched, corrector_steps=1)
    with_corrector = reference.tv(reference.empirical_law(x, V), P0)
    without = reference.tv(reference_law(graph_name, "analytic", 8), P0)
    print(f"{graph_name} 8 steps: TV to p0 {without:.4f} without (exact), {with_corrector:.4f} with a corrector")
    assert with_corrector < without + NOISE_BOUND
    if not graph.absorb:
        assert int(stats["nfe"]) == 8 * 2 + 1


# --------------------------------------------------------------------------- options


FAST = ("analytic", "confidence")  # the rest of the samplers share the code; they run with -m slow
ALL = [p if p in FAST else pytest.param(p, marks=pytest.mark.slow) for p in sorted(sampling.SAMPLERS)]


@pytest.mark.parametrize("sampler", ALL)
def test_temperature_one_and_top_p_one_are_the_base_sampler(sampler):
    base, _ = draw(sampler, 8, n=256)
    same, _ = draw(sampler, 8, n=256, temperature=1.0, top_p=1.0)
    np.testing.assert_array_equal(base, same)


def test_large_vocabulary_steps_keep_the_law():
    """At D >= TWO_LEVEL_MIN_DIM euler and analytic draw a masked position without the (B, L, D)
    probabilities: P(unmask) = c S and y ∝ s_y, checked against the exact law of one step."""
    v = categorical.TWO_LEVEL_MIN_DIM + 3
    graph = graphs.Absorbing(v)
    p = np.random.default_rng(2).dirichlet(np.full(v, 0.3))
    sigma, dsigma = 1.0, 0.5  # one analytic step removing half the noise

    def step(key, log_p, x):  # p and x arguments, not constants: XLA would fold the (B, L, D) scores for ~15 s
        def score_fn(x, s):
            tokens = jnp.broadcast_to(log_p - graphs.log_expm1(s)[:, None, None], x.shape + (v,))
            return jnp.concatenate([tokens, jnp.zeros(x.shape + (1,))], -1)

        return sampling.one_step(key, score_fn, graph, sched, x, t, t - t_next)

    sched = noise.LogLinear(1e-3)
    t = float(-np.expm1(-sigma) / (1 - 1e-3))  # sigma_bar(t) = sigma
    t_next = float(-np.expm1(-(sigma - dsigma)) / (1 - 1e-3))
    x = jnp.full((256, 8), graph.mask, jnp.int32)
    out = np.asarray(jax.jit(step)(jax.random.key(0), jnp.log(jnp.asarray(p, jnp.float32)), x)).ravel()
    unmask = math.expm1(dsigma) / math.expm1(sigma)  # (e^dsigma - 1) sum_y s_y
    n = out.size
    print(f"large-D analytic step: unmasked {np.mean(out != graph.mask):.4f}, exact {unmask:.4f}")
    assert abs(np.mean(out != graph.mask) - unmask) < 5 * math.sqrt(unmask * (1 - unmask) / n)
    groups = np.arange(v) * 16 // v  # 16 groups of tokens: their law is p summed per group
    got = np.bincount(groups[out[out != graph.mask]], minlength=16) / np.sum(out != graph.mask)
    want = np.bincount(groups, weights=p, minlength=16)
    assert reference.tv(got, want) < reference.tv_noise_bound(want, int(np.sum(out != graph.mask)))


@pytest.mark.parametrize("sampler", ALL)
def test_top_p_never_leaves_the_nucleus(sampler):
    keep = nucleus_sets(PRODUCT, 0.6)
    x = sampling.sample(
        jax.random.key(3), product_score, PRODUCT_GRAPH, LOGLINEAR, (512, L2), 8, sampler=sampler, top_p=0.6
    ).tokens
    x = np.asarray(x)
    assert x.max() < V2
    inside = keep[np.arange(L2)[None, :], x]
    assert inside.all(), f"{(~inside).sum()} tokens outside the nucleus"
    if sampler != "confidence" and sampler in FAST:
        return
    # Temperature 0 takes the most probable token everywhere.
    x = np.asarray(
        sampling.sample(
            jax.random.key(4), product_score, PRODUCT_GRAPH, LOGLINEAR, (64, L2), 8, sampler=sampler, temperature=0.0
        ).tokens
    )
    np.testing.assert_array_equal(x, np.broadcast_to(PRODUCT.argmax(-1), x.shape))


@pytest.mark.parametrize(
    "order", ["confidence"] + [pytest.param(o, marks=pytest.mark.slow) for o in sampling.Confidence.ORDERS[1:]]
)
def test_confidence_unmasks_its_scheduled_count(order):
    steps = 5
    traj = sampling.sample(
        jax.random.key(5),
        product_score,
        PRODUCT_GRAPH,
        LOGLINEAR,
        (64, L2),
        steps,
        sampler="confidence",
        order=order,
        return_trajectory=True,
    ).trajectory
    masked = (np.asarray(traj) == PRODUCT_GRAPH.mask).sum(-1)  # (N + 1, B)
    for n in range(steps):
        want = -(-masked[n] // (steps - n))  # ceil(masked / steps left)
        np.testing.assert_array_equal(masked[n] - masked[n + 1], want, err_msg=f"{order} step {n}")
    assert masked[-1].max() == 0


@pytest.mark.parametrize("order", sampling.PLANNED_ORDERS)
def test_planned_orders_write_their_positions(order):
    """Step n of N writes the positions of places [n L/N, (n+1) L/N) of the planned order, whatever the tokens."""
    length, steps = 8, 4
    rank = sampling.planned_rank(order, length, steps)
    assert sorted(rank) == list(range(length))
    want = {"dilated": [0, 4, 2, 6, 1, 5, 3, 7], "strided": [0, 4, 1, 5, 2, 6, 3, 7]}[order]  # positions, in order
    np.testing.assert_array_equal(np.argsort(rank), want)
    graph = graphs.Absorbing(3)
    score = lambda x, sigma: jnp.zeros(x.shape + (4,))  # noqa: E731  any tokens: the order is by position alone
    traj = np.asarray(
        sampling.sample(
            jax.random.key(0),
            score,
            graph,
            LOGLINEAR,
            (5, length),
            steps,
            sampler="dilated",
            order=order,
            return_trajectory=True,
        ).trajectory
    )
    for n in range(steps):
        written = (traj[n] == graph.mask) & (traj[n + 1] != graph.mask)  # (B, L)
        np.testing.assert_array_equal(written, np.broadcast_to((rank // (length // steps)) == n, written.shape))
    with pytest.raises(ValueError, match="takes order in"):
        sampling.sample(
            jax.random.key(0), score, graph, LOGLINEAR, (1, length), steps, sampler="dilated", order="confidence"
        )


def test_entropy_bound_respects_its_bound():
    bound, steps = 1.0, L2
    out = sampling.sample(
        jax.random.key(6),
        product_score,
        PRODUCT_GRAPH,
        LOGLINEAR,
        (256, L2),
        steps,
        sampler="entropy_bound",
        max_entropy=bound,
        return_trajectory=True,
        return_stats=True,
    )
    traj, stats = out.trajectory, out.stats
    traj = np.asarray(traj) == PRODUCT_GRAPH.mask  # (N + 1, B, L2) masked
    for n in range(steps):
        for b in range(traj.shape[1]):
            new = traj[n, b] & ~traj[n + 1, b]
            if not traj[n, b].any():
                assert not new.any()
                continue
            h = PRODUCT_ENTROPY[new]
            assert new.any() and h.sum() - h.max() <= bound + 1e-5, (n, b, h)
            # The lowest-entropy masked positions are the ones taken.
            assert h.max() <= PRODUCT_ENTROPY[traj[n, b] & ~new].min(initial=np.inf) + 1e-6
    assert int(stats["nfe"]) < steps  # fewer calls than positions: several tokens a call


# --------------------------------------------------------------------------- NFE


@pytest.mark.slow
@pytest.mark.parametrize(
    "sampler, steps, n, options, kind",
    [
        ("analytic", 16, 8, {}, "absorbing"),
        ("analytic", 16, 1, {"cache": True}, "time_independent"),
        ("euler", 8, 8, {"corrector_steps": 2}, "absorbing"),
        ("analytic", 8, 8, {"corrector_steps": 1}, "uniform"),
        ("first_hitting", 2, 4, {}, "absorbing"),
        ("confidence", 2, 4, {}, "absorbing"),
        ("entropy_bound", 8, 1, {"max_entropy": 2.0}, "absorbing"),
        ("remdm", 16, 4, {"schedule": "loop"}, "absorbing"),
    ],
)
def test_nfe_is_the_number_of_calls(sampler, steps, n, options, kind):
    """More cases than the draws of the default tests (each of which checks its NFE in ``draw``)."""
    graph, sched = (UNIFORM, GEOMETRIC) if kind == "uniform" else (ABSORBING, LOGLINEAR)
    base = {"absorbing": EXACT["absorbing"], "uniform": EXACT["uniform"], "time_independent": TIME_INDEPENDENT}
    x, traj, stats = draw(
        sampler, steps, n=n, graph=graph, sched=sched, score_fn=base[kind], return_trajectory=True, **options
    )
    if sampler == "analytic" and kind != "uniform":
        has_mask = (traj == graph.mask).any(-1)  # (N + 1, n): the states the steps and the denoise start from
        if options.get("cache"):
            has_mask &= np.concatenate([np.ones((1, n), bool), (traj[1:] != traj[:-1]).any(-1)])
        np.testing.assert_array_equal(np.asarray(stats["nfe_per_sample"]), has_mask.sum(0))
    if sampler == "first_hitting":
        assert x.max() < V and int(stats["nfe"]) == steps + 1  # the denoise fills what 2 steps left


def test_mapped_rows_draw_what_each_row_draws_alone():
    """Under jax.vmap with axis_name (one key per row, as sedd serve batches requests), every row
    draws exactly the sequence a lone call with its key draws, and counts the calls it needed;
    "nfe" counts the calls of the mapped batch (one per step while any row has a mask)."""
    keys = jax.random.split(jax.random.key(11), 6)
    mask = np.zeros((6, L), bool)
    mask[:3, 0] = True  # three rows have a fixed first token: they need fewer calls
    tokens = np.ones((6, L), np.int32)

    def one(key, m, t, axis_name):
        out = sampling.sample(
            key,
            EXACT["absorbing"],
            ABSORBING,
            LOGLINEAR,
            (1, L),
            4,
            axis_name=axis_name,
            fixed_mask=m[None],
            fixed_tokens=t[None],
            return_stats=True,
        )
        x, stats = out.tokens, out.stats
        return x[0], stats["nfe"], stats["nfe_per_sample"][0]

    x, nfe, per_row = jax.vmap(lambda k, m, t: one(k, m, t, "rows"), axis_name="rows")(keys, mask, tokens)
    for b in range(6):
        alone, alone_nfe, _ = one(keys[b], mask[b], tokens[b], None)
        np.testing.assert_array_equal(x[b], alone)
        assert int(per_row[b]) == int(alone_nfe)
    assert (np.asarray(nfe) == int(per_row.max())).all()


# --------------------------------------------------------------------------- long texts


def test_blocks_generate_past_the_window():
    """max_length 8 from windows of 3 (2 new tokens a window): each window's new tokens follow p0
    conditioned on the kept token, and a fixed first token is kept."""
    n = N_SAMPLES
    mask = np.zeros((n, 8), bool)
    mask[:, 0] = True
    tokens = np.ones((n, 8), np.int32)
    out = sampling.sample_long(
        jax.random.key(8),
        EXACT["absorbing"],
        ABSORBING,
        LOGLINEAR,
        (n, L),
        L,
        8,
        2,
        sampler="first_hitting",
        return_stats=True,
        fixed_mask=mask,
        fixed_tokens=tokens,
    )
    x, stats = out.tokens, out.stats
    x = np.asarray(x)
    assert x.shape == (n, 8) and x.max() < V and (x[:, 0] == 1).all()
    assert int(stats["nfe"]) == 2 + 2 + 2 + 1  # windows [0, 3), [2, 5), [4, 7), [5, 8)
    # Window [2, 5): position 2 kept, (3, 4) drawn from p0(x_1, x_2 | x_0 = x[:, 2]).
    joint = P0.reshape(V, V, V)
    for first in range(V):
        rows = x[:, 2] == first
        want = (joint[first] / joint[first].sum()).ravel()
        got = np.bincount(x[rows, 3] * V + x[rows, 4], minlength=V * V) / rows.sum()
        assert reference.tv(got, want) < reference.tv_noise_bound(want, int(rows.sum()))


def test_a_rows_calls_past_the_window_end_with_the_window_that_stops_it():
    """With stop_id, a row's nfe_per_sample counts the windows up to the one in which it wrote stop_id: the windows
    drawn after it for the other rows are not its calls (issue 84)."""
    args = (EXACT["absorbing"], ABSORBING, LOGLINEAR, (8, L), L)
    first = sampling.sample_long(jax.random.key(8), *args, L, 2, sampler="analytic", return_stats=True)
    out = sampling.sample_long(jax.random.key(8), *args, 8, 2, sampler="analytic", return_stats=True, stop_id=0)
    x, calls = np.asarray(out.tokens), np.asarray(out.stats["nfe_per_sample"])
    np.testing.assert_array_equal(x[:, :L], np.asarray(first.tokens))  # window 0 is the same draw
    alone = np.asarray(first.stats["nfe_per_sample"])  # each row's calls in window 0
    done = (x[:, :L] == 0).any(1)  # the rows that stopped in window 0
    assert done.any() and not done.all(), x
    np.testing.assert_array_equal(calls[done], alone[done])
    assert (calls[~done] > alone[~done]).all() and calls.max() <= int(out.stats["nfe"]), (calls, alone)


# --------------------------------------------------------------------------- categorical


def test_first_argmax_is_argmax_with_ties():
    w = np.random.default_rng(4).integers(0, 4, (500, 7)).astype(np.float32)  # many ties
    w[:3] = 0.0  # a row of equal entries
    np.testing.assert_array_equal(categorical.first_argmax(jnp.asarray(w)), np.argmax(w, -1))


def test_two_level_draw_has_the_law():
    p = np.random.default_rng(3).dirichlet(np.ones(60))
    p[[3, 17, 59]] = 0.0
    p /= p.sum()
    draws = categorical.sample_two_level(
        jax.random.key(9), jnp.broadcast_to(jnp.asarray(p, jnp.float32), (200_000, 60)), bucket=8
    )
    freq = np.bincount(np.asarray(draws), minlength=60) / 200_000
    print(f"two-level, D = 60, K = 8: TV {reference.tv(freq, p):.4f}, bound {reference.tv_noise_bound(p, 200_000):.4f}")
    assert reference.tv(freq, p) < reference.tv_noise_bound(p, 200_000)
    assert freq[[3, 17, 59]].sum() == 0  # a zero weight is never drawn, in a full or the short last block


def test_large_vocabulary_draws_tiny_probabilities_at_their_rate():
    """D = 4096 (the two-level path): 4095 tokens of probability 1e-7 against one of ~1.

    Exact: they are drawn at 4095e-7 / (1 + 4095e-7) of the draws. float32
    Gumbel-max draws each at 0.52 of its rate (test_noise_losses.gumbel32_rate),
    7 standard deviations below at these counts. (The two levels keep the rate
    because a block's race sees the block's sum; inside a block the race is
    the flat one, exact to ~1e-12, test_noise_losses.py.)
    """
    d, tiny, chunks, rows = categorical.TWO_LEVEL_MIN_DIM, 1e-7, 8, 2**16

    @jax.jit
    def hits(key):
        def chunk(k):
            probs = jnp.broadcast_to(jnp.where(jnp.arange(d) == 0, 1.0, tiny), (rows, d))
            return jnp.sum(categorical.sample_categorical(k, probs) != 0)

        return jax.lax.map(chunk, jax.random.split(key, chunks)).sum()

    n = chunks * rows
    rate = (d - 1) * tiny / (1 + (d - 1) * tiny)
    sd = math.sqrt(n * rate)
    got = int(hits(jax.random.key(10)))
    print(
        f"{got} draws of the 1e-7 tokens in {n}: expected {n * rate:.1f} +- {sd:.1f}, float32 Gumbel ~{0.52 * n * rate:.0f}"
    )
    assert abs(got - n * rate) < 5 * sd, (got, n * rate)
    assert n * rate * (1 - 0.52) > 7 * sd  # the test would catch the float32 Gumbel bias


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sampler="first_hitting", graph=UNIFORM), "absorbing graph"),
        (dict(sampler="analytic", graph=UNIFORM, temperature=0.5), "absorbing graph only"),
        (dict(sampler="analytic", graph=UNIFORM, top_p=0.9), "absorbing graph only"),
        (dict(sampler="analytic", graph=UNIFORM, cache=True), "absorbing graph only"),
        (dict(sampler="first_hitting", corrector_steps=1), "cannot honour corrector_steps"),
        (dict(sampler="remdm", corrector_steps=1), "cannot honour corrector_steps"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(corrector_steps=-1), "corrector_steps"),
        (dict(cache=1), "cache"),
        (dict(order="random"), r"takes no option \['order'\]"),
        (dict(sampler="confidence", order="left"), "unknown order"),
        (dict(sampler="entropy_bound", max_entropy=-1.0), "max_entropy"),
        (dict(sampler="remdm", schedule="cosine"), "unknown schedule"),
        (dict(sampler="remdm", eta=2.0), "eta"),
        (dict(sampler="remdm", t_on=0.01, t_off=0.05), "t_off < t_on"),
        (dict(max_length=8, return_trajectory=True), "return_trajectory"),
        (dict(max_length=2), "max_length must be an integer >= "),
        (dict(options={"temperature": 0.5}), "options must be a sedd.sampling.Options"),
        (dict(sampler="first_hitting", options=sampling.Options(corrector_steps=1)), "cannot honour corrector_steps"),
        (dict(max_length=8, block_length=4), "block_length"),
    ],
)
def test_option_errors(kwargs, match):
    args = dict(graph=ABSORBING, sampler="analytic")
    args.update(kwargs)
    graph = args.pop("graph")
    score_fn = EXACT["absorbing" if graph.absorb else "uniform"]
    sched = LOGLINEAR if graph.absorb else GEOMETRIC
    with pytest.raises(ValueError, match=match):
        if "max_length" in args:  # long generation is its own entry point
            sampling.sample_long(jax.random.key(0), score_fn, graph, sched, (4, L), 3, **args)
        else:
            sampling.sample(jax.random.key(0), score_fn, graph, sched, (4, L), 3, **args)


def test_a_sampler_function_takes_no_generic_option():
    name = "test_function_sampler"

    @sampling.register_sampler(name)
    def stay(key, score_fn, graph, noise, x, t, dt, categorical):
        score_fn(x, jnp.full(x.shape[:1], 1.0))
        return x

    try:
        stats = sampling.sample(
            jax.random.key(0),
            EXACT["absorbing"],
            ABSORBING,
            LOGLINEAR,
            (4, L),
            3,
            sampler=name,
            denoise=False,
            return_stats=True,
        ).stats
        assert int(stats["nfe"]) == 3  # one call a step, counted while tracing
        with pytest.raises(ValueError, match="cannot honour temperature"):
            sampling.sample(
                jax.random.key(0), EXACT["absorbing"], ABSORBING, LOGLINEAR, (4, L), 3, sampler=name, temperature=0.5
            )
    finally:
        del sampling.SAMPLERS[name]


def test_left_to_right_writes_the_sure_positions_after_the_first_together():
    """left_to_right on the product law (independent positions, entropies 0 to 1.9 nats): its runs of sure
    positions are drawn together and still from their laws (each position's draws within the noise bound of its
    law); every step writes the first masked position and the sure ones right after it, so the calls fall with the
    threshold (0: everything in one call) and one position a step at 1."""
    calls = {}
    for tau in (0.0, 0.9, 1.0):
        out = sampling.sample(
            jax.random.key(9),
            product_score,
            PRODUCT_GRAPH,
            LOGLINEAR,
            (4096, L2),
            L2,
            sampler="left_to_right",
            threshold=tau,
            return_stats=True,
        )
        x = np.asarray(out.tokens)
        for l in range(L2):
            freq = np.bincount(x[:, l], minlength=V2) / len(x)
            assert 0.5 * np.abs(freq - PRODUCT[l]).sum() < reference.tv_noise_bound(PRODUCT[l], len(x)) + 1e-6, (tau, l)
        calls[tau] = float(np.mean(out.stats["nfe_per_sample"]))
    sure = (PRODUCT.max(-1) >= 0.9).astype(int)
    runs, at = 0, 0
    while at < L2:  # the steps of the rule: the first masked position, then the sure ones after it
        at += 1
        while at < L2 and sure[at]:
            at += 1
        runs += 1
    assert calls == {0.0: 1.0, 0.9: float(runs), 1.0: float(L2)}, (calls, runs)
