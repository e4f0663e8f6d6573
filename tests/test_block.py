"""Block diffusion (sedd.kinds.block, model.kind = "block") against exact laws, its own uncached forward, and SEDD.

The exact law: a seeded Dirichlet law P0 over the 81 sequences of V = 3, L = 4.
Its exact block scorer gives, for block i, the exact absorbing score of the
law of block i given the clean blocks before it (enumerated); with it the
block sampler must draw P0 (any b) and the block bound must equal -log P0.
"""

import contextlib
import io
import json

import jax
import ml_collections
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import reference
from sedd import evaluate, graphs, kinds, sampling
from sedd.kinds import block, block_sampling
from sedd import config as config_lib
from sedd import noise as noise_lib
from sedd.graphs import log_expm1
from sedd.kinds.block import block_diffusion_mask
from sedd.model import DDiT
from sedd.sampling import lanes as lanes_lib

V, L = 3, 4
GRAPH = graphs.Absorbing(V)
MASK = GRAPH.mask
SEQS = reference.all_sequences(V, L)
P0 = np.random.default_rng(3).dirichlet(np.ones(V**L))
N_SAMPLES = 20_000


def exact_block_scores(prefix, start, x, sigma, b):
    r"""The exact log-score of block [start, start + b) at state x given the clean prefix: float32[B, b, D].

    w_n = P0(n) [seqs_n agrees with the prefix before start]; with
    k(a, z) = e^{-sigma} [z = a] + (1 - e^{-sigma}) [z = MASK],
    p_sigma(x) = sum_n w_n prod_l k(seqs_nl, x_l), and s[l, y] = p_sigma(x with x_l = y) / p_sigma(x).
    """
    seqs, probs = jnp.asarray(SEQS, jnp.int32), jnp.asarray(P0, jnp.float32)
    before = jnp.arange(L) < start  # (L,)
    agree = jnp.all((seqs[None] == prefix[:, None]) | ~before, axis=-1)  # (B, N)
    w = probs[None] * agree  # (B, N)
    part = jax.lax.dynamic_slice(seqs, (0, start), (len(SEQS), b))  # (N, b)
    keep = jnp.exp(-sigma)[:, None, None]  # (B, 1, 1)
    k = jnp.where(part[None] == x[:, None], keep, 0.0) + jnp.where(x[:, None] == MASK, 1 - keep, 0.0)  # (B, N, b)
    others = jnp.stack(
        [jnp.prod(jnp.delete(k, l, axis=2, assume_unique_indices=True), axis=2) for l in range(b)], axis=2
    )  # (B, N, b): prod over l' != l
    tokens = jnp.einsum("bn,bnl,nly->bly", w, others * keep, jax.nn.one_hot(part, V))  # (B, b, V)
    to_mask = jnp.einsum("bn,bnl->bl", w, others)[..., None] * (1 - keep)  # (B, b, 1)
    num = jnp.concatenate([tokens, to_mask], axis=-1)  # (B, b, D)
    den = jnp.einsum("bn,bn->b", w, jnp.prod(k, axis=2))[:, None, None]  # (B, 1, 1): p_sigma(x)
    tiny = jnp.finfo(jnp.float32).tiny
    out = jnp.log(jnp.maximum(num, tiny)) - jnp.log(jnp.maximum(den, tiny))
    return jnp.where(jax.nn.one_hot(x, V + 1, dtype=bool), 0.0, out)


def exact_scorer(b, fused=False):
    """P0 as a ``block_sampling.Scorer``: the context is (the clean prefix int32[B, L], its length); with `fused`, a
    ``commit_score`` that commits and scores in one call."""
    init = lambda params, batch: (jnp.zeros((batch, L), jnp.int32), jnp.int32(0))  # noqa: E731

    def score(params, ctx, x, sigma):
        return exact_block_scores(ctx[0], ctx[1], x, jnp.broadcast_to(sigma, x.shape[:1]), b)

    def commit(params, ctx, x):
        return jax.lax.dynamic_update_slice(ctx[0], x, (0, ctx[1])), ctx[1] + b

    def commit_score(params, ctx, clean, x, sigma):
        ctx = commit(params, ctx, clean)
        return ctx, score(params, ctx, x, sigma)

    return block_sampling.Scorer(init, score, commit, commit_score if fused else None)


def exact_block_fn(b):
    """(x_t, x0, sigma float[B, n_b]) -> every block's exact log-score given x0's blocks before it."""

    def block_fn(x_t, x0, sigma):
        return jnp.concatenate(
            [exact_block_scores(x0, i * b, x_t[:, i * b : (i + 1) * b], sigma[:, i], b) for i in range(L // b)], axis=1
        )

    return block_fn


# --------------------------------------------------------------------------- exact laws


@pytest.mark.parametrize(
    "b, sampler, steps", [(1, "analytic", 1), (2, "first_hitting", 2), (2, "confidence", 2), (4, "first_hitting", 4)]
)
def test_block_sampler_draws_the_exact_law(b, sampler, steps):
    """With P0's exact block scores the block sampler draws P0: b = 1 is P0's AR chain rule, b = L SEDD's sampler.

    first_hitting and random-order unmasking are exact at one position a step
    (sedd.sampling); a single masked position is drawn exactly by the analytic
    denoise. TV within the noise bound of N_SAMPLES exact draws.
    """
    options = {"order": "random"} if sampler == "confidence" else {}
    out = block_sampling.sample_blocks(
        jax.random.key(b),
        exact_scorer(b),
        None,
        GRAPH,
        noise_lib.LogLinear(1e-3),
        (N_SAMPLES, L),
        b,
        steps,
        sampler,
        **options,
    )
    law = reference.empirical_law(np.asarray(out.tokens), V)
    dist = reference.tv(law, P0)
    assert dist < reference.tv_noise_bound(P0, N_SAMPLES), (b, sampler, dist)


def test_a_prompt_is_kept_and_the_rest_drawn_from_the_conditional_law():
    """A 3-token prompt (ending inside block 2 of b = 2): the last token is drawn from P0(x_3 | x_0..2)."""
    prompt = np.array([1, 0, 2, 0])
    mask = np.broadcast_to(np.arange(L) < 3, (N_SAMPLES, L))
    out = block_sampling.sample_blocks(
        jax.random.key(0),
        exact_scorer(2),
        None,
        GRAPH,
        noise_lib.LogLinear(1e-3),
        (N_SAMPLES, L),
        2,
        2,
        "first_hitting",
        fixed_mask=mask,
        fixed_tokens=np.broadcast_to(prompt, (N_SAMPLES, L)),
    )
    x = np.asarray(out.tokens)
    assert (x[:, :3] == prompt[:3]).all()
    rows = reference.seq_index(np.array([[1, 0, 2, y] for y in range(V)]), V)
    want = P0[rows] / P0[rows].sum()
    got = np.bincount(x[:, 3], minlength=V) / len(x)
    assert reference.tv(got, want) < reference.tv_bound(V, N_SAMPLES, 1e-6)


@pytest.mark.parametrize("b", [1, 2])
def test_block_bound_is_tight_at_the_exact_score(b):
    """Eq. (2) of sedd.kinds.block with the exact block scores: the bound equals -log P0(x) within its error."""
    noise = noise_lib.Geometric(1e-4, 20.0)
    bound, err = evaluate.likelihood_bound_with_stderr(
        jax.random.key(0),
        exact_block_fn(b),
        GRAPH,
        noise,
        SEQS,
        num_t=128,
        num_samples=16,
        t_batch=16,
        per_position=block.per_position_fn(b),
    )
    bound, err, nll = np.asarray(bound), np.asarray(err), -np.log(P0)
    z = (bound - nll) / err
    assert np.all(np.abs(z) < 4.5), (z, bound, nll)
    assert abs(float(np.mean(bound - nll))) < 3 * float(err.mean())


def _network(block_size, length=8, seed=0, shift=False, **kw):
    """A DDiT of the block kind with random (nonzero) weights everywhere, over V + 1 ids (V + 2 with `shift`: a
    token-shift network's BOS)."""
    model = DDiT(
        num_tokens=V + 1 + shift,
        out_dim=V + 1,
        hidden_size=16,
        n_layers=2,
        n_heads=2,
        cond_dim=8,
        dropout=0.0,
        max_len=length,
        scale_by_sigma=True,
        rngs=nnx.Rngs(seed),
        **kw,
    )
    params = nnx.state(model, nnx.Param)
    keys = jax.random.split(jax.random.key(seed + 1), len(jax.tree.leaves(params)))
    leaves = [p + 0.3 * jax.random.normal(k, p.shape) for p, k in zip(jax.tree.leaves(params), keys)]
    nnx.update(model, jax.tree.unflatten(jax.tree.structure(params), leaves))
    return model


def test_b1_bound_is_the_exact_nll_of_the_conditional_model():
    """b = 1, normalized, no time input: the bound is sum_i -log p_theta(x_i | x_<i) (the masked token's law).

    Each factor's integrand is sigma' e^{-sigma} (-log p_theta): over t it
    integrates to (e^{-sigma(0)} - e^{-sigma(1)}) NLL, 1 - 1e-4 here.
    """
    length = 6
    model = _network(1, length, normalize=True, time_conditioning=False)
    x0 = jnp.asarray(np.random.default_rng(0).integers(0, V, (16, length)), jnp.int32)
    masked = jnp.full_like(x0, MASK)
    sigma = jnp.ones((16, length))
    graphdef, state = nnx.split(model)
    fn = lambda s, x_t, x, sig: block.log_score(nnx.merge(graphdef, s), x_t, x, sig, 1)  # noqa: E731
    p = jax.jit(fn)(state, masked, x0, sigma)[..., :V] + log_expm1(1.0)  # log p_theta(. | x0_<i)
    nll = -np.asarray(jnp.take_along_axis(p, x0[..., None], -1)[..., 0].sum(-1))
    noise = noise_lib.Geometric(1e-4, 20.0)
    bound, err = evaluate.likelihood_bound_with_stderr(
        jax.random.key(1),
        fn,
        GRAPH,
        noise,
        x0,
        num_t=128,
        num_samples=16,
        t_batch=16,
        score_params=state,
        per_position=block.per_position_fn(1),
    )
    z = (np.asarray(bound) - nll) / np.asarray(err)
    assert np.all(np.abs(z) < 4.5), (z, bound, nll)


@pytest.mark.parametrize(
    "b, remat, time_conditioning, shift",
    [  # b = 16 (one block of the whole text) behind -m slow: the default suite's 900 CPU s
        (4, "none", True, False),
        pytest.param(16, "none", True, False, marks=pytest.mark.slow),
        (4, "layers", False, True),
        pytest.param(16, "dots", True, False, marks=pytest.mark.slow),
    ],
)
def test_the_bound_run_against_the_clean_context_is_the_full_forwards(b, remat, time_conditioning, shift):
    """x0's keys and values once a batch, then x_t's L positions alone (block.bound_fns, what the block kind's
    likelihood runs): the scores and the bound of the [x_t ; x0] forward at every t (block.log_score), float32;
    a token-shift network's too."""
    length = 32
    model = _network(b, length, shift=shift, remat=remat, time_conditioning=time_conditioning, normalize=True)
    rng = np.random.default_rng(b)
    x0 = jnp.asarray(rng.integers(0, V, (3, length)), jnp.int32)
    x_t = jnp.where(rng.random((3, length)) < 0.5, MASK, x0)
    sigma = jnp.asarray(rng.uniform(0.05, 3.0, (3, length // b)), jnp.float32)
    full = block.log_score(model, x_t, x0, sigma, b)
    in_context = block.log_score_in_context(model, x_t, block.clean_context(model, x0, b), sigma, b, x0)
    possible = full > -1e8  # the MASK column of the mean parameterization is -1e9 in both
    np.testing.assert_array_equal(possible, in_context > -1e8)
    np.testing.assert_allclose(np.where(possible, in_context, 0.0), np.where(possible, full, 0.0), atol=2e-5)

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    fns, noise = block.bound_fns(graphdef, b), noise_lib.LogLinear(1e-3)
    common = dict(num_t=8, num_samples=2, t_batch=4, score_params=(params, rest), per_position=block.per_position_fn(b))
    want = evaluate.likelihood_bound_with_stderr(
        jax.random.key(2), block.params_block_fn(graphdef, b), GRAPH, noise, x0, **common
    )
    got = evaluate.likelihood_bound_with_stderr(
        jax.random.key(2), fns.block_fn, GRAPH, noise, x0, prepare=fns.prepare, **common
    )
    np.testing.assert_allclose(np.asarray(got.bound), np.asarray(want.bound), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got.stderr), np.asarray(want.stderr), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------- the network's cache


def _uncached_scorer(graphdef, b, length):
    """The KV cache's reference: every call runs [x_t ; x_0] through the training forward (sedd.kinds.block.log_score).

    The context is the clean text so far and its length; the block being
    drawn sits in x_t at its place, every other x_t position MASK (their
    outputs are not read: block i's output depends on x_t's block i and x0's
    blocks < i only).
    """

    def score(state, ctx, x, sigma):
        text, start = ctx
        x_t = jax.lax.dynamic_update_slice(jnp.full_like(text, MASK), x, (0, start))
        scores = block.log_score(nnx.merge(graphdef, *state), x_t, text, sigma, b)
        return jax.lax.dynamic_slice(scores, (0, start, 0), (x.shape[0], b, scores.shape[2]))

    return block_sampling.Scorer(
        lambda params, batch: (jnp.zeros((batch, length), jnp.int32), jnp.int32(0)),
        score,
        lambda params, ctx, x: (jax.lax.dynamic_update_slice(ctx[0], x, (0, ctx[1])), ctx[1] + b),
    )


@pytest.mark.parametrize(
    "time_conditioning, sampler, shift",
    [(True, "entropy_bound", False), (False, "analytic", False), (False, "confidence", True)],
)
def test_kv_cache_gives_the_uncached_scores_and_samples(time_conditioning, sampler, shift):
    """The cached scores and commits equal the training forward's (a token-shift network's too: each block reads
    the last token of the one before, kept in the context), and so do the draws."""
    length, b = 8, 2
    model = _network(b, length, shift=shift, time_conditioning=time_conditioning)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    state = (params, rest)
    cached, uncached = block_sampling.network_scorer(graphdef, length, b), _uncached_scorer(graphdef, b, length)
    rng = np.random.default_rng(0)
    text = jnp.asarray(rng.integers(0, V, (3, length)), jnp.int32)
    ctx_c, ctx_u = cached.init(state, 3), uncached.init(state, 3)
    # Compiled as the sampler runs them (one program each, not one per operation: 4x faster on 2 cores).
    score_c, score_u, commit_c, commit_u = map(jax.jit, (cached.score, uncached.score, cached.commit, uncached.commit))
    for i in range(length // b):
        x = jnp.where(rng.random((3, b)) < 0.5, MASK, text[:, i * b : (i + 1) * b])
        sigma = jnp.asarray(rng.uniform(0.1, 3.0, 3), jnp.float32)
        got, want = score_c(state, ctx_c, x, sigma), score_u(state, ctx_u, x, sigma)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-5)
        clean = text[:, i * b : (i + 1) * b]
        ctx_c, ctx_u = commit_c(state, ctx_c, clean), commit_u(state, ctx_u, clean)
    noise = noise_lib.LogLinear(1e-3)
    draws = [
        block_sampling.sample_blocks(jax.random.key(5), s, state, GRAPH, noise, (4, length), b, 4, sampler).tokens
        for s in (cached, uncached)
    ]
    np.testing.assert_array_equal(*draws)


def _windowed_log_score(model, x_t, x0, sigma, b, window):
    """block.log_score with the sliding window of a ring cache: a query in the block starting at s sees the
    positions >= s + b - window only (on both halves), so every clean block's keys are those it was committed
    with, as far back as its own window reached."""
    batch, length = x_t.shape
    pos = np.arange(length)
    band = pos[None, :] >= (pos[:, None] // b + 1) * b - window  # (T, T) by position
    mask = block_diffusion_mask(length, b) & np.tile(band, (2, 2))
    blocks = length // b
    groups = jnp.concatenate([jnp.broadcast_to(sigma[:, None], (batch, blocks)), jnp.zeros((batch, blocks))], 1)
    out = model.network_output(
        jnp.concatenate([x_t, x0], axis=1), groups, positions=np.concatenate([pos, pos]), mask=mask, keep=length
    )
    return model.log_score(out, x_t, sigma)


def test_the_cache_past_its_window_is_the_windowed_forward():
    """3 L tokens through the ring: each block's score, alone or in the call that commits the block before it,
    is the training forward's with every query limited to the L - b positions before its block."""
    length, b = 8, 2
    model = _network(b, length)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    state = (params, rest)
    scorer = block_sampling.network_scorer(graphdef, length, b)
    rng = np.random.default_rng(1)
    total = 3 * length
    text = jnp.asarray(rng.integers(0, V, (3, total)), jnp.int32)
    ctx = fused_ctx = scorer.init(state, 3)
    # Each compiled once (not one program per operation): the same figures, 2x faster on 2 cores.
    windowed = jax.jit(
        lambda state, x_t, text, sigma: _windowed_log_score(nnx.merge(graphdef, *state), x_t, text, sigma, b, length)
    )
    score, commit_score, commit = map(jax.jit, (scorer.score, scorer.commit_score, scorer.commit))
    for start in range(0, total, b):
        x = jnp.where(rng.random((3, b)) < 0.5, MASK, text[:, start : start + b])
        sigma = jnp.asarray(rng.uniform(0.1, 3.0, 3), jnp.float32)
        x_t = jnp.full_like(text, MASK).at[:, start : start + b].set(x)
        want = np.asarray(windowed(state, x_t, text, sigma)[:, start : start + b])
        np.testing.assert_allclose(np.asarray(score(state, ctx, x, sigma)), want, atol=2e-5, rtol=1e-5)
        if start:
            fused_ctx, fused = commit_score(state, fused_ctx, text[:, start - b : start], x, sigma)
            np.testing.assert_allclose(np.asarray(fused), want, atol=2e-5, rtol=1e-5)
            assert int(fused_ctx[1]) == start  # the clean block committed
        ctx = commit(state, ctx, text[:, start : start + b])
    with pytest.raises(ValueError, match="a chunk of 11 positions exceeds the ring cache's 10 slots"):
        model.output_in_cache(
            text[:, :11], jnp.ones((3,)), positions=np.arange(11), mask=np.ones((11, 10), bool), cache=ctx[0]
        )


def _same_draws_one_call_fewer_a_block(outs, blocks):
    np.testing.assert_array_equal(np.asarray(outs[0].tokens), np.asarray(outs[1].tokens))
    assert int(outs[0].stats["nfe"]) == int(outs[1].stats["nfe"]) - (blocks - 1)
    np.testing.assert_array_equal(
        np.asarray(outs[0].stats["nfe_per_sample"]), np.asarray(outs[1].stats["nfe_per_sample"]) - (blocks - 1)
    )


@pytest.mark.parametrize("sampler", ["entropy_bound", "analytic", "confidence"])
def test_a_blocks_commit_and_its_first_score_are_one_call(sampler):
    """With commit_score each block's first sampler call comes with its predecessor's commit: the same draws as
    committing and scoring apart, with one call fewer a block after the first (P0's exact scorer, b = 1)."""
    noise = noise_lib.LogLinear(1e-3)
    outs = [
        block_sampling.sample_blocks(
            jax.random.key(3), exact_scorer(1, fused), None, GRAPH, noise, (64, L), 1, 2, sampler, return_stats=True
        )
        for fused in (True, False)
    ]
    _same_draws_one_call_fewer_a_block(outs, L)


@pytest.mark.slow  # 3 x 10 s on 2 cores; the exact scorer's test above checks the sampler, the windowed
# forward's test (below) the network's commit_score past the window
@pytest.mark.parametrize("sampler", ["entropy_bound", "analytic", "confidence"])
def test_a_blocks_commit_and_its_first_score_are_one_call_in_the_network(sampler):
    """As above with the network's KV cache, past its window."""
    length, b = 8, 2
    model = _network(b, length)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    fused = block_sampling.network_scorer(graphdef, length, b)
    apart = block_sampling.Scorer(fused.init, fused.score, fused.commit)  # no commit_score
    noise = noise_lib.LogLinear(1e-3)
    outs = [
        block_sampling.sample_blocks(
            jax.random.key(3), s, (params, rest), GRAPH, noise, (3, 2 * length + 2), b, 2, sampler, return_stats=True
        )
        for s in (fused, apart)
    ]
    _same_draws_one_call_fewer_a_block(outs, (2 * length + 2) // b)


def test_b_equal_l_is_sedds_sampler():
    """One block of L: the block sampler draws what sedd.sampling.sample draws with the same network and key."""
    length = 8
    model = _network(length, length)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    noise = noise_lib.LogLinear(1e-3)
    key = jax.random.key(2)
    got = block_sampling.sample_blocks(
        key,
        block_sampling.network_scorer(graphdef, length, length),
        (params, rest),
        GRAPH,
        noise,
        (6, length),
        length,
        8,
        "analytic",
    ).tokens
    want = sampling.sample(
        jax.random.fold_in(key, 0),
        kinds.params_score_fn(graphdef),
        GRAPH,
        noise,
        (6, length),
        8,
        "analytic",
        score_params=(params, rest),
    ).tokens
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_past_the_window_and_stop_id():
    """Text of 3 L tokens through a ring cache of L rows; stop_id ends it and fills the rest."""
    length, b = 8, 2
    model = _network(b, length)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    scorer = block_sampling.network_scorer(graphdef, length, b)
    out = block_sampling.sample_blocks(
        jax.random.key(0),
        scorer,
        (params, rest),
        GRAPH,
        noise_lib.LogLinear(1e-3),
        (2, 3 * length + 1),
        b,
        2,
        "analytic",
        return_stats=True,
    )
    assert out.tokens.shape == (2, 25) and int(np.asarray(out.tokens).max()) < V
    # 13 blocks, each: 2 steps (the first always calls), the denoise (skipped when nothing is masked), the commit
    assert 13 * 2 <= int(out.stats["nfe"]) <= 13 * 4
    stopped = block_sampling.sample_blocks(
        jax.random.key(0),
        scorer,
        (params, rest),
        GRAPH,
        noise_lib.LogLinear(1e-3),
        (2, 3 * length),
        b,
        2,
        "analytic",
        stop_id=0,
        return_stats=True,
    )
    x = np.asarray(stopped.tokens)
    assert (x == 0).any(1).all()
    end = max(int(np.argmax(row == 0)) // b + 1 for row in x) * b  # the block in which the last row stopped
    assert (x[:, end:] == 0).all()
    assert int(stopped.stats["nfe"]) <= end // b * 4  # no block drawn after it
    # Each row's calls end with the block in which it wrote stop_id (and its commit): the blocks drawn after it for
    # the other rows are not its calls (issue 84: a text that ended early was said to have taken them all).
    blocks = [int(np.argmax(row == 0)) // b + 1 for row in x]
    calls = np.asarray(stopped.stats["nfe_per_sample"])
    assert blocks[0] < blocks[1] and calls[0] < calls[1] <= int(stopped.stats["nfe"]), (blocks, calls)
    assert all(n <= c <= 4 * n for n, c in zip(blocks, calls)), (blocks, calls)


def test_block_outputs_see_only_their_block_and_the_clean_blocks_before():
    """Changing x_t outside block i, or x0 at blocks >= i, leaves block i's log-score as it was."""
    length, b = 8, 2
    model = _network(b, length)
    rng = np.random.default_rng(1)
    x_t = jnp.asarray(rng.integers(0, V + 1, (2, length)), jnp.int32)
    x0 = jnp.asarray(rng.integers(0, V, (2, length)), jnp.int32)
    sigma = jnp.asarray(rng.uniform(0.5, 2.0, (2, length // b)), jnp.float32)
    log_score = nnx.jit(block.log_score, static_argnums=4)  # eagerly: an op a compile
    base = np.asarray(log_score(model, x_t, x0, sigma, b))
    i = 2  # block 2: positions 4, 5
    other_t = x_t.at[:, [0, 1, 6, 7]].set((x_t[:, [0, 1, 6, 7]] + 1) % (V + 1))
    later_0 = x0.at[:, 4:].set((x0[:, 4:] + 1) % V)
    for args in ((other_t, x0), (x_t, later_0)):
        got = np.asarray(log_score(model, *args, sigma, b))
        np.testing.assert_allclose(got[:, i * b : (i + 1) * b], base[:, i * b : (i + 1) * b], atol=1e-5)
    earlier_0 = x0.at[:, :2].set((x0[:, :2] + 1) % V)  # and it does read the clean blocks before it
    assert not np.allclose(np.asarray(log_score(model, x_t, earlier_0, sigma, b))[:, 4:6], base[:, 4:6])


# --------------------------------------------------------------------------- the kind, end to end


def test_kind_errors():
    config = ml_collections.ConfigDict(
        config_lib.load_config("tiny", ["--config.model.kind=block", "--config.model.block_size=5"]).to_dict()
    )
    config.vocab_size = 5
    with pytest.raises(ValueError, match="block_size=5 must be a positive divisor of data.seq_len=32"):
        kinds.get(config)
    config = ml_collections.ConfigDict(
        config_lib.load_config("tiny", ["--config.model.kind=block", "--config.graph.type=uniform"]).to_dict()
    )
    config.vocab_size = 5
    with pytest.raises(ValueError, match="absorbing"):
        kinds.get(config)


@pytest.fixture(scope="module")
def block_run(tmp_path_factory):
    """`sedd train --config tiny --config.model.kind=block --config.model.block_size=8` of one block (the CLI, 20
    steps).

    In this process (a subprocess would import jax and compile again: the CLI in a subprocess is
    tests/test_runs.py's)."""
    from sedd import cli

    tmp = tmp_path_factory.mktemp("block_run")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(
            [
                "train",
                "--config",
                "tiny",
                "--config.model.kind=block",
                "--config.model.block_size=8",
                "--config.model.n_layers=1",  # the cache's layers: the network tests above use two
                f"--config.data.data_dir={tmp / 'data'}",
                "--workdir",
                str(tmp / "run"),
            ]
        )
    assert code == 0 and "validation bound" in out.getvalue(), out.getvalue()[-3000:]
    return tmp / "run"


@pytest.mark.dtypes  # end to end: .ci/run runs it again in the other compute dtype
def test_block_run_samples_past_its_length_and_evaluates(block_run, tmp_path, capsys):
    from sedd import cli

    out = tmp_path / "samples.jsonl"
    assert (
        cli.main(
            [
                "sample",
                "--workdir",
                str(block_run),
                "--max_length",
                "256",
                "--prefix",
                "ROMEO:",
                "--num_samples",
                "2",
                "--output",
                str(out),
            ]
        )
        == 0
    ), capsys.readouterr().err[-2000:]
    texts = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    # 256 characters (an <|endoftext|> is 13) after the prompt, 8 times the model's length of 32
    assert len(texts) == 2 and all(t.startswith("ROMEO:") and len(t) >= 200 for t in texts), texts
    assert cli.main(["sample", "--workdir", str(block_run), "--suffix", "END"]) == 2
    assert "writes after a prompt only; a suffix is for model.kind 'ddit'" in capsys.readouterr().err
    assert cli.main(["eval", "--workdir", str(block_run), "--batch_size", "8", "--max_batches", "2"]) == 0
    stdout = capsys.readouterr().out
    figures = dict((k.strip(), v) for k, v in (line.split(":", 1) for line in stdout.splitlines() if ":" in line))
    assert figures["kind"].strip() == "block" and 0 < float(figures["bits_per_char"]) < 12, stdout


def test_a_block_runs_calls_count_the_tokens_written_up_to_its_stop(block_run, tmp_path, capsys):
    """`sedd sample --stop` on a block run: each text's calls and tokens are those up to its first <|endoftext|>,
    the prompt's not counted as written (issue 84: "1025.0 a text of 1024 tokens" for a text of 15 characters)."""
    from sedd import cli

    out = tmp_path / "samples.jsonl"
    args = ["sample", "--workdir", str(block_run), "--max_length", "64", "--stop", "--prefix", "ROMEO:"]
    assert cli.main([*args, "--num_samples", "2", "--output", str(out)]) == 0, capsys.readouterr().err[-2000:]
    for line in map(json.loads, out.read_text().splitlines()):
        assert line["tokens"] == len(line["text"]) <= 64 and "<|endoftext|>" not in line["text"], line  # 1 a char
        assert line["tokens_written"] == line["tokens"] - 6, line
        assert line["tokens_per_call"] == pytest.approx(line["tokens_written"] / line["network_calls"], abs=1e-4)
    said = capsys.readouterr().err
    assert " tokens (up to its first <|endoftext|>), " in said and "(6 given by the prompt)" in said, said


@pytest.mark.slow  # the openai client on a block run; tests/test_streaming.py streams block runs by default: behind -m slow to keep the default suite within 900 CPU s
def test_block_run_is_served_to_the_openai_client_streamed_block_by_block(block_run, monkeypatch):
    """`sedd serve` on a block run: the openai client, a stream sent while the blocks are drawn, the diffusing view."""
    openai = pytest.importorskip("openai")
    uvicorn = pytest.importorskip("uvicorn")
    httpx = pytest.importorskip("httpx")
    import socket
    import threading
    import time

    from sedd import runs, serve

    run = runs.load(block_run)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    limits = serve.Limits(max_steps=16, max_n=4, max_batch=8, window_s=0.1)
    server = uvicorn.Server(
        uvicorn.Config(serve.create_app(run, "sedd-block", limits), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    try:
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
        model = httpx.get(f"{base}/v1/models").json()["data"][0]
        assert (model["kind"], model["block_size"]) == ("block", 8)
        args = dict(
            model="sedd-block",
            prompt="ROMEO:",
            max_tokens=12,
            n=2,
            seed=3,
            extra_body={"steps": 4, "sampler": "analytic"},
        )
        out = c.completions.create(**args, temperature=0.8)  # a traced temperature: any value, one program
        assert len(out.choices) == 2 and out.choices[0].text != out.choices[1].text
        for choice in out.choices:
            assert len(choice.text) == 12 if choice.finish_reason == "length" else len(choice.text) < 12
            run.tokenizer.encode(choice.text)
        again = c.completions.create(**args, temperature=0.8)
        assert [ch.text for ch in again.choices] == [ch.text for ch in out.choices]
        compiles = httpx.get(f"{base}/health").json()["compiles"]
        c.completions.create(**args, temperature=0.8 + 1e-6)
        assert httpx.get(f"{base}/health").json()["compiles"] == compiles

        # Streamed: each call's block placed into the text on the host, the settled prefix sent at once.
        slow_place = lanes_lib.Placed.place
        monkeypatch.setattr(
            lanes_lib.Placed, "place", lambda self, start, states: (slow_place(self, start, states), time.sleep(0.03))
        )
        arrived = []
        with httpx.stream(
            "POST",
            f"{base}/v1/completions",
            timeout=120,
            json={
                **{k: v for k, v in args.items() if k != "extra_body"},
                **args["extra_body"],
                "temperature": 0.8,
                "stream": True,
            },
        ) as r:
            for line in r.iter_lines():
                if line.startswith("data:") and "[DONE]" not in line:
                    arrived.append((time.monotonic(), json.loads(line[len("data:") :])))
        last = max(t for t, k in arrived if k["choices"][0]["finish_reason"] is not None)
        assert len([k for t, k in arrived if k["choices"][0]["text"] and t < last - 0.05]) > 1
        streamed = [
            "".join(k["choices"][0]["text"] for _, k in arrived if k["choices"][0]["index"] == i) for i in range(2)
        ]
        assert streamed == [ch.text for ch in out.choices]

        # Diffusing: the states of the blocks holding the completion (6..17: blocks 0, 1, 2), then the text.
        body = {
            "prompt": "ROMEO:",
            "max_tokens": 12,
            "n": 1,
            "seed": 3,
            "steps": 4,
            "sampler": "analytic",
            "temperature": 0.8,
            "diffusing": True,
        }
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=120)
        frames = [
            json.loads(line[5:]) for line in r.text.splitlines() if line.startswith("data:") and "[DONE]" not in line
        ]
        assert [f.get("block") for f in frames[:-1]] == [0] * 5 + [1] * 5 + [2] * 5
        assert frames[0]["choices"][0]["text"] == "ROMEO:" + serve.MASK_CHAR * 12 and frames[0]["nfe"] == 0
        assert frames[-1]["choices"][0]["completion"] == out.choices[0].text
        nfe = [f["nfe"] for f in frames]
        assert nfe == sorted(nfe) and 0 < nfe[-2] <= nfe[-1]
        # what a block model cannot do: a clear 400
        with pytest.raises(openai.BadRequestError, match="suffix"):
            c.completions.create(model="sedd-block", prompt="ROMEO:", suffix="END", max_tokens=4)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


# --------------------------------------------------------------------------- a token-shift network from an AR run


def _token_shift_config(b: int, length: int):
    c = config_lib.load_config("tiny")
    c.vocab_size = V
    c.data.seq_len = length
    c.model.update(kind="block", block_size=b, token_shift=True, time_conditioning=False, normalize=True)
    c.model.update(n_layers=2, hidden_size=16, n_heads=2, cond_dim=8)
    return c


def test_a_token_shift_network_started_from_an_ar_run_is_that_ar_network_at_b1():
    """params_from maps an AR run's weights into a token-shift block network (tokens and BOS rows, token columns):
    at b = 1 each masked position's law given the clean text before it is the AR network's next-token law, to
    float32 rounding. (At b > 1 a block's positions also attend to the MASKs of their block, which the AR never
    saw: training teaches it to read them.)"""
    from sedd import runs
    from sedd.kinds import causal

    length = 6
    ar_config = _token_shift_config(1, length)
    ar_config.model.kind = "ar"
    ar_model = kinds.get(ar_config).network(0)
    nnx.update(ar_model, reference.perturbed(nnx.state(ar_model, nnx.Param), 0.3, 7))
    graphdef, ar_params, rest = nnx.split(ar_model, nnx.Param, ...)
    source = runs.from_parts(ar_config, None, graphdef, ar_params, rest)
    x0 = jnp.asarray(np.random.default_rng(0).integers(0, V, (5, length)), jnp.int32)
    want = jax.nn.log_softmax(nnx.jit(causal.next_token_logits)(ar_model, x0), -1)  # (B, L, V): log p(x_i | x_<i)
    kind = kinds.get(_token_shift_config(1, length))
    model = kind.network(0)
    nnx.update(model, kind.params_from(source, nnx.state(model, nnx.Param)))
    got = nnx.jit(block.log_score, static_argnums=4)(model, jnp.full_like(x0, MASK), x0, jnp.full((5, length), 0.7), 1)
    got = got[..., :V]
    np.testing.assert_allclose(np.asarray(got + log_expm1(0.7)), np.asarray(want), atol=2e-5)


def test_params_from_refuses_a_run_of_another_size():
    """A run whose arrays do not fit is refused naming the array, before any training."""
    from sedd import runs

    small = _token_shift_config(2, 8)
    small.model.kind, small.model.hidden_size = "ar", 8
    graphdef, params, rest = nnx.split(kinds.get(small).network(0), nnx.Param, ...)
    kind = kinds.get(_token_shift_config(2, 8))
    with pytest.raises(ValueError, match=r"init_from: .*layers.* is \(48,\) in the AR run and \(96,\) here"):
        kind.params_from(runs.from_parts(small, None, graphdef, params, rest), nnx.state(kind.network(0), nnx.Param))


@pytest.mark.slow  # two CLI trainings; params_from and the b = 1 identity above hold the mapping by default
def test_a_block_run_starts_from_an_ar_run(tiny_run, tmp_path, capsys):
    """sedd train --config.training.init_from=AR_RUN: a token-shift block run trains from the AR run's EMA weights
    (its first state holds them), and a run of another vocabulary is refused."""
    from sedd import cli
    from sedd import train as train_lib

    common = [f"--config.data.data_dir={tiny_run[1]}", "--config.model.n_layers=1", "--config.training.n_iters=2"]
    common += ["--config.training.eval_every=2", "--config.training.ckpt_every=2", "--config.training.eval_samples=0"]
    common += ["--config.model.time_conditioning=false"]
    assert (
        cli.main(["train", "--config", "tiny", "--workdir", str(tmp_path / "ar"), "--config.model.kind=ar", *common])
        == 0
    )
    shifted = ["--config.model.kind=block", "--config.model.block_size=4", "--config.model.token_shift=true"]
    argv = ["train", "--config", "tiny", "--workdir", str(tmp_path / "block"), *shifted, *common]
    assert cli.main([*argv, f"--config.training.init_from={tmp_path / 'ar'}"]) == 0
    assert f"started from the EMA weights of {tmp_path / 'ar'} at its step 2" in capsys.readouterr().out
    from sedd import runs

    ar, shifted_run = runs.load(tmp_path / "ar"), runs.load(tmp_path / "block")
    trainer = train_lib.Trainer(shifted_run.config)
    state = train_lib.started_from(trainer, str(tmp_path / "ar"), shifted_run.tokenizer, say=lambda line: None)
    layer = lambda params: np.asarray(params["layers"][0]["attn_qkv"]["kernel"][...])  # noqa: E731
    np.testing.assert_array_equal(layer(state["params"]), layer(ar.params))
    embed = lambda params: np.asarray(params["vocab_embed"]["embedding"][...])  # noqa: E731
    v = ar.config.vocab_size
    np.testing.assert_array_equal(embed(state["params"])[:v], embed(ar.params)[:v])
    np.testing.assert_array_equal(embed(state["params"])[v + 1], embed(ar.params)[v])  # BOS


def test_an_ar_run_with_a_draft_head_starts_from_an_ar_run_without_one():
    """params_from of an AR run with a head: the network's arrays the AR run's, the head's as initialised (a run
    of another size is still refused)."""
    from sedd import runs

    plain = _token_shift_config(1, 8)
    plain.model.kind = "ar"
    graphdef, params, rest = nnx.split(kinds.get(plain).network(0), nnx.Param, ...)
    source = runs.from_parts(plain, None, graphdef, params, rest)
    headed = plain.copy_and_resolve_references()
    headed.model.update(draft_head=8, draft_k=2)
    kind = kinds.get(headed)
    fresh = nnx.state(kind.network(1), nnx.Param)
    got = kind.params_from(source, fresh)
    np.testing.assert_array_equal(got["vocab_embed"]["embedding"][...], params["vocab_embed"]["embedding"][...])
    for a, b in zip(jax.tree.leaves(got["draft_head"]), jax.tree.leaves(fresh["draft_head"])):
        np.testing.assert_array_equal(a, b)
