r"""Block diffusion: SEDD inside blocks of b tokens, autoregressive across them (BD3-LM).

Arriola et al. 2025 (ICLR, "Block Diffusion", kuleshov-group/bd3lms) split a
sequence of L tokens into B = L / b blocks x^1 .. x^B and factor its law by
the chain rule over blocks,

    log p_theta(x) = sum_i log p_theta(x^i | x^{<i}),                          (1)

each factor a discrete diffusion over the b tokens of block i whose network
also reads the clean blocks before it. SEDD's bound (Lou et al. 2024, Thm. 3.6)
applied to each factor bounds the whole:

    -log p_theta(x) <= sum_i [ int_0^1 E_{x_t^i} sum_{l in block i} sigma'(t)
                               SE_l(s_theta(x_t^i, x^{<i}, t), sigma(t), x_t^i, x^i) dt
                               + KL(p_1(. | x^i) || p_base) ].                  (2)

b = L is SEDD; b = 1 is an autoregressive model whose factor is one masked
token given the clean ones before it.

Training (``loss_per_position``, ``log_score``): one network call scores every
block at once on the 2L tokens [x_t ; x_0] with the attention mask of
``block_diffusion_mask``: noisy block i sees itself and the clean
blocks < i, the clean half attends block-causally (the keys and values a
sampler will have cached). Each block has its own t (an unbiased one-draw
estimate of (2) per block), the clean half the noise 0; with time
conditioning each block's adaLN reads its own sigma.

Sampling (``sample_blocks``): block by block, each from all-MASK by any sampler of
``sedd.sampling`` that runs on the absorbing graph, the network run on the b
positions of the current block against a cache of the clean blocks' keys and
values (``Scorer``). A drawn block is written into the cache (its "commit") by
the call that starts the next block: one call on 2b positions, the clean block
and the next block all-MASK, the attention of the training forward (the MASK
block sees the clean one, not the reverse), keeps the clean block's keys and
values and gives the next block's first score, which the sampler's first step
takes instead of a call of its own (``sedd.sampling``'s ``prime``). So a block
costs its sampler's calls, not one more; only the last block's commit is a
call of its own. The cache is a ring (``sedd.model.ring_mask``): text past
the model's length keeps the last L - b tokens as context, a sliding window.
A prompt is prefilled as clean blocks; the block holding its end is drawn
with the prompt's positions fixed.

Letters: B batch (not blocks, in shapes), L length, b block size, n_b = L / b
blocks, T the length of the text drawn, S the cache's rows, D = graph.dim.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sedd import evaluate, losses, sampling
from sedd.kinds.base import register
from sedd.kinds.capabilities import Drafts, refuse_drafts
from sedd.kinds.block_draft import BlockDraft
from sedd.kinds.ddit import Diffusion
from sedd.graphs import Graph
from sedd.sampling import rows as rows_lib
from sedd.model import DDiT, ring_mask

# =========================================================================== training and the bound


def block_diffusion_mask(length: int, block_size: int) -> np.ndarray:
    r"""The attention mask of the block-diffusion forward over [x_t ; x_0] (2 length rows): bool[2L, 2L].

    BD3-LM (Arriola et al. 2025, Sec. 3.2). With blocks of b positions and
    blk(p) = p // b on each half, a query may attend to

        x_t^q -> x_t^k   blk(k) = blk(q)     (its own noisy block)
        x_t^q -> x_0^k   blk(k) < blk(q)     (the clean blocks before it)
        x_0^q -> x_0^k   blk(k) <= blk(q)    (clean blocks, block-causally)

    and never x_0 -> x_t. So the output at x_t's block i depends on x_t's
    block i and x_0's blocks < i only, which is what a sampler with the clean
    blocks' keys and values in a cache computes; the x_0 half's rows are
    those keys and values. True = attend.
    """
    blk = np.arange(length) // block_size
    own = blk[:, None] == blk[None, :]
    before = blk[:, None] > blk[None, :]
    top = np.concatenate([own, before], axis=1)  # x_t queries
    bottom = np.concatenate([np.zeros_like(own), own | before], axis=1)  # x_0 queries
    return np.concatenate([top, bottom], axis=0)


def log_score(
    model: DDiT,
    x_t: jax.Array,
    x0: jax.Array,
    sigma: jax.Array,
    block_size: int,
    *,
    deterministic: bool | None = True,
    rngs=None,
) -> jax.Array:
    """The log-score at x_t's positions, each block given x0's blocks before it: float32[B, L, D].

    One forward over [x_t ; x0] (2L positions, the same rotary positions on
    both halves) with ``block_diffusion_mask``; only x_t's half goes through
    the final layer.

    Args:
      model: a DDiT built with block_size (``sedd.kinds`` "block").
      x_t: int[B, L] noisy tokens; x0: int[B, L] clean tokens.
      sigma: float[B, n_b] the noise of each block (or float[B], one for all).
      block_size: b, dividing L.
      deterministic, rngs: dropout control, as in ``DDiT.network_output``.
    """
    b, length = x_t.shape
    sigma = _per_block(sigma, b, length // block_size)  # (B, n_b)
    noise_groups = jnp.concatenate([sigma, jnp.zeros_like(sigma)], axis=1)  # (B, 2 n_b): x0's blocks at 0
    positions = np.concatenate([np.arange(length), np.arange(length)])
    out = model.network_output(
        jnp.concatenate([x_t, x0], axis=1),
        noise_groups,
        positions=positions,
        mask=block_diffusion_mask(length, block_size),
        keep=length,
        deterministic=deterministic,
        rngs=rngs,
    )  # (B, L, D)
    return model.log_score(out, x_t, jnp.repeat(sigma, block_size, axis=1))


def _per_block(sigma, batch: int, blocks: int) -> jax.Array:
    """sigma float[B, n_b], or float[B] (one level for every block), as float[B, n_b]."""
    return jnp.broadcast_to(sigma if jnp.ndim(sigma) == 2 else jnp.asarray(sigma)[:, None], (batch, blocks))


def clean_context(model: DDiT, x0: jax.Array, block_size: int) -> tuple:
    """x0's keys and values at every layer of ``log_score``'s forward: what ``log_score_in_context`` reads.

    In that forward x0's rows attend to x0's blocks only (block-causally: the
    lower right quarter of ``block_diffusion_mask``) and are at noise 0, so
    they depend neither on t nor on x_t: run alone, once a batch, x0 gives
    the keys and values that forward computes again at every t.

    Args:
      model: a DDiT built with block_size; x0: int[B, L] clean tokens; block_size: b.
    Returns:
      per layer of the network (keys, values), each [B, L, N, K].
    """
    b, length = x0.shape
    mask = block_diffusion_mask(length, block_size)[length:, length:]  # (L, L): x0 -> x0
    return model.keys_values(x0, jnp.zeros((b, length // block_size), jnp.float32), mask=mask)


def log_score_in_context(model: DDiT, x_t: jax.Array, context: tuple, sigma: jax.Array, block_size: int) -> jax.Array:
    """``log_score`` with x0's half given by its keys and values (``clean_context``): float32[B, L, D], dropout off.

    Only x_t's L positions run through the network, each block's queries
    attending as in the training forward (the upper rows of
    ``block_diffusion_mask``) to its own noisy block and to x0's blocks
    before it, at the same rotary positions; the logits between different
    noisy blocks, which that forward computes and masks, are not computed
    (``kernels.unit_context_attention``). The same scores as ``log_score``
    to float rounding (tests/test_block.py) at, per call, the DDiT's matrix
    and attention products and (L b) / L^2 more of the latter, where
    ``log_score`` pays twice and four times (docs/block_diffusion.md, "The
    cost of the bound").

    Args:
      model: a DDiT built with block_size.
      x_t: int[B, L] noisy tokens; context: ``clean_context(model, x0, block_size)``.
      sigma: float[B, n_b] the noise of each block (or float[B], one for all).
      block_size: b, dividing L.
    """
    b, length = x_t.shape
    sigma = _per_block(sigma, b, length // block_size)  # (B, n_b)
    # x_t -> x0, the upper right quarter of the mask; its upper left one, x_t -> x_t, is a block's own block
    mask = block_diffusion_mask(length, block_size)[:length, length:]  # (L, L)
    h, c = model.features(
        x_t, sigma, mask=mask, context=context, unit=block_size, deterministic=True
    )  # (B, L, H), (B, n_b, C)
    return model.log_score(model.output(h, c), x_t, jnp.repeat(sigma, block_size, axis=1))


def loss_per_position(
    key: jax.Array,
    block_fn: Callable,
    graph: Graph,
    noise: Callable,
    x0: jax.Array,
    t: jax.Array | None = None,
    sampling_eps: float = 1e-3,
    low_discrepancy: bool = False,
    t_power: float = 0.0,
    *,
    block_size: int,
) -> jax.Array:
    r"""One Monte Carlo draw of sigma'(t_i) SE at every position, t_i drawn per block: float32[B, L] nats.

    The integrand of (2): block i is noised to x_t^i ~ p_{sigma(t_i)}(. | x^i)
    at its own t_i (``losses.sample_times`` over the B n_b blocks, with its
    importance weights), and scored given the clean blocks before it. Summed
    over L it is an unbiased estimate of (2) without the prior terms.

    Args:
      key: a ``jax.random`` key (t and x_t).
      block_fn: (x_t, x0, sigma float[B, n_b]) -> log-score float[B, L, D] (``log_score``).
      graph: the forward process (absorbing).
      noise: the schedule.
      x0: int32[B, L] clean tokens.
      t: optional float[B] (every block of a row at that t, unweighted) or float[B, n_b].
      sampling_eps, low_discrepancy, t_power: as ``losses.loss_per_position``.
      block_size: b, dividing L.
    """
    k_t, k_x = jax.random.split(key)
    b, length = x0.shape
    blocks = length // block_size
    if t is None:
        t, weight = losses.sample_times(k_t, b * blocks, sampling_eps, low_discrepancy, t_power)
        t, weight = t.reshape(b, blocks), weight.reshape(b, blocks)
    else:
        t = jnp.broadcast_to(t if jnp.ndim(t) == 2 else jnp.asarray(t)[:, None], (b, blocks))
        weight = jnp.ones_like(t)
    sigma, dsigma = noise(t)  # (B, n_b) each
    at_positions = lambda a: jnp.repeat(a, block_size, axis=1)  # noqa: E731  (B, n_b) -> (B, L)
    x_t = graph.sample_transition(k_x, x0, at_positions(sigma))  # (B, L)
    scores = block_fn(x_t, x0, sigma)  # (B, L, D)
    entropy = graph.score_entropy(scores, at_positions(sigma), x_t, x0)  # (B, L)
    return at_positions(weight * dsigma) * entropy


@functools.lru_cache(maxsize=None)
def per_position_fn(block_size: int) -> Callable:
    """``loss_per_position`` for blocks of block_size, as the one static integrand of ``evaluate.likelihood_bound``."""
    return functools.partial(loss_per_position, block_size=block_size)


@functools.lru_cache(maxsize=None)
def params_block_fn(graphdef, block_size: int) -> Callable:
    """(state, x_t, x0, sigma) -> ``log_score`` of the network `graphdef` (dropout off); state = (params, rest).

    The whole [x_t ; x0] forward at every call: the bound's reference
    (tests/test_block.py); ``bound_fns`` computes the same in less time.
    """
    return lambda state, x_t, x0, sigma: log_score(nnx.merge(graphdef, *state), x_t, x0, sigma, block_size)


class BoundFns(NamedTuple):
    """A block network's ``evaluate.likelihood_bound`` arguments: x0's half run once a batch, not at every t.

      prepare(state, x0) -> (state, context)              ``clean_context``, once a batch (likelihood_bound's prepare)
      block_fn((state, context), x_t, x0, sigma)          ``log_score_in_context`` (its score_fn)
          -> log-score float32[B, L, D]

    state = (params, rest) of the network.
    """

    prepare: Callable
    block_fn: Callable


@functools.lru_cache(maxsize=None)
def bound_fns(graphdef, block_size: int) -> BoundFns:
    """The ``BoundFns`` of the network `graphdef`: one object per network and b (jit's cache key)."""

    def prepare(state, x0):
        return state, clean_context(nnx.merge(graphdef, *state), x0, block_size)

    def block_fn(state_context, x_t, x0, sigma):  # x0 is read through its context
        state, context = state_context
        return log_score_in_context(nnx.merge(graphdef, *state), x_t, context, sigma, block_size)

    return BoundFns(prepare, block_fn)


# =========================================================================== sampling


class Scorer(NamedTuple):
    """What the block sampler asks of a model: a context of clean blocks, scored against and extended.

    Each field is a function, traced inside the sampler's program; ``params``
    are the model's (traced) weights, ``ctx`` the context's pytree:

      init(params, batch) -> ctx                       no clean block yet
      score(params, ctx, x, sigma) -> log-score         x int32[B, b] the current block, sigma float[B];
                                                        float32[B, b, D], the block given the context
      commit(params, ctx, x) -> ctx                     the clean block x appended
      commit_score(params, ctx, clean, x, sigma)        both in one call: (commit(params, ctx, clean),
          -> (ctx, log-score)                           score(params, that ctx, x, sigma)); or None:
                                                        each block's commit a call, its first score another

    ``network_scorer`` is the model's, with its KV cache as the context; a
    test's exact law is another (tests/test_block.py).
    """

    init: Callable
    score: Callable
    commit: Callable
    commit_score: Callable | None = None


@functools.lru_cache(maxsize=None)
def network_scorer(graphdef, window: int, block_size: int) -> Scorer:
    """The block network `graphdef` with the network's decoding cache of the clean blocks as its context.

    The context is (cache, index): per layer the rotary-embedded keys and
    the values of the committed positions, a ring of S = window + b rows
    (``DDiT.output_in_cache`` with each position at its row mod S; window =
    the model's length L), and the next position, int32[]. ``score`` runs the
    block against it and drops the cache it wrote (the context is as it
    was); ``commit`` runs the clean block at noise 0 and keeps it;
    ``commit_score`` runs [x ; clean] with the noise levels [sigma, 0] in one
    call and keeps both blocks' rows (x's are written over by its next score
    before any query reads them). Each query sees its own block and the
    clean ones before it within the window (``sedd.model.ring_mask``).
    Exactly what the x_0 half of the training forward computes (tests/test_block.py).
    """
    b = block_size
    rows = window + b

    def run(state, cache, x, sigma, positions, keep=None):
        model = nnx.merge(graphdef, *state)
        mask = ring_mask(positions, rows, window, b)  # (L, S): its own block and the clean ones before it
        out, cache, _ = model.output_in_cache(x, sigma, positions=positions, mask=mask, cache=cache, keep=keep)
        return model, out, cache

    def init(state, batch):
        return nnx.merge(graphdef, *state).empty_cache(batch, rows), jnp.int32(0)

    def score(state, ctx, x, sigma):
        model, out, _ = run(state, ctx[0], x, sigma, ctx[1] + jnp.arange(b))
        return model.log_score(out, x, sigma)

    def commit(state, ctx, x):
        cache, index = ctx
        return run(state, cache, x, jnp.zeros(x.shape[:1], jnp.float32), index + jnp.arange(b))[2], index + b

    def commit_score(state, ctx, clean, x, sigma):
        cache, index = ctx
        both = jnp.concatenate([x, clean], axis=1)  # (B, 2b): x first, so that the final layer runs on it alone
        positions = index + jnp.concatenate([jnp.arange(b, 2 * b), jnp.arange(b)])
        sigmas = jnp.stack([sigma, jnp.zeros_like(sigma)], axis=1).astype(jnp.float32)  # (B, 2) a level a block
        model, out, cache = run(state, cache, both, sigmas, positions, keep=b)
        return (cache, index + b), model.log_score(out, x, sigma)

    return Scorer(init, score, commit, commit_score)


@functools.lru_cache(maxsize=None)
def context_score_fn(scorer: Scorer) -> Callable:
    """``sedd.sampling``'s score_fn((params, ctx), x, sigma) of a scorer: one object per scorer (jit's cache key)."""
    return lambda params_ctx, x, sigma: scorer.score(params_ctx[0], params_ctx[1], x, sigma)


@functools.partial(
    jax.jit,
    static_argnames=("scorer", "graph", "noise", "block_size", "sampler", "denoise", "options", "blocks", "stop_id"),
)
def draw_blocks(
    key,
    times,
    params,
    ctx,
    text,
    fixed,
    first,
    shaping=None,
    *,
    scorer,
    graph,
    noise,
    block_size,
    sampler,
    denoise,
    options,
    blocks,
    stop_id,
):
    """Blocks first .. first + blocks - 1 of `text` drawn and committed, in one program.

    Returns (ctx, text, nfe int32[], nfe_row int32[B], drawn int32[] blocks
    drawn, frames). With options.return_trajectory, frames int32[blocks S + 1,
    B, T] is the whole text at each of the S = steps + 1 states of each
    block's sampler in turn (the blocks before it clean, the blocks after it
    MASK), then the text; every block is drawn. Otherwise frames is None, and
    with stop_id the loop ends after the block where every row has written it.
    shaping: None, or traced (temperature, top_p) (``sedd.sampling.run_loop``).
    """
    rows, b = text.shape[0], block_size
    score_fn = context_score_fn(scorer)
    sigma0 = jnp.broadcast_to(noise(times[0])[0], (rows,)).astype(jnp.float32)  # a sampler's first call's noise

    def block_of(i, a):
        return jax.lax.dynamic_slice(a, (0, (first + i) * b), (rows, b))

    def draw(i, ctx, text, prime):
        """Block i drawn against ctx; prime: (its start state, sigma0, their score) or None."""
        x, traj, stats = sampling.run_loop(
            jax.random.fold_in(key, first + i),
            times,
            block_of(i, fixed),
            block_of(i, text),
            (params, ctx),
            score_fn=score_fn,
            graph=graph,
            noise=noise,
            shape=(rows, b),
            sampler=sampler,
            denoise=denoise,
            options=options,
            prime=prime,
            shaping=shaping,
        )
        return x, jax.lax.dynamic_update_slice(text, x, (0, (first + i) * b)), traj, stats

    def advance(i, ctx, text, clean):
        """Block i's start. For i >= 1 one call commits the clean block before it and scores block i's start
        state (its prime); block 0 starts against the context as it is, with no call and a prime that never
        hits (noise -1). One sampler loop serves every block: the program compiles it once."""
        later = i > 0
        if scorer.commit_score is None:  # the commit alone; the sampler's first step makes its own call
            return jax.lax.cond(later, lambda c: scorer.commit(params, c, clean), lambda c: c, ctx), None, later
        start = jnp.where(block_of(i, fixed), block_of(i, text), jnp.int32(graph.mask))  # (B, b)

        def commit_score(c):  # the score in float32, as the sampler reads it
            c, score = scorer.commit_score(params, c, clean, start, sigma0)
            return c, score.astype(jnp.float32)

        as_is = lambda c: (c, jnp.zeros((rows, b, graph.dim), jnp.float32))  # noqa: E731  (block 0)
        ctx, score = jax.lax.cond(later, commit_score, as_is, ctx)
        return ctx, (start, jnp.where(later, sigma0, -1.0), score), later

    def next_block(i, ctx, text, clean):
        """Block i of this call, after `clean` (block i - 1) is committed with its prime: NFE + 1 for i >= 1."""
        ctx, prime, later = advance(i, ctx, text, clean)
        x, text, traj, stats = draw(i, ctx, text, prime)
        n = later.astype(jnp.int32)
        return ctx, x, text, traj, stats["nfe"] + n, stats["nfe_per_sample"] + n

    # Every block after the call that commits its predecessor (block 0 against the context as it is); the
    # last block's commit is a call of its own.
    none_yet = jnp.zeros((rows, b), jnp.int32)  # the "clean block" before block 0: never committed

    if options.return_trajectory:

        def step(carry, i):
            ctx, text, clean = carry
            ctx, x, text, traj, n, n_row = next_block(i, ctx, text, clean)
            return (ctx, text, x), (traj, n, n_row)

        (ctx, text, x), (trajs, n, n_row) = jax.lax.scan(step, (ctx, text, none_yet), jnp.arange(blocks))
        ctx = scorer.commit(params, ctx, x)  # trajs: (blocks, S, B, b)
        nfe, nfe_row = n.sum() + 1, n_row.sum(0) + 1
        pos = jnp.arange(text.shape[1])

        def place(i, traj):  # block i's states in the whole text: (S, B, T)
            start = (first + i) * b
            base = jnp.where(pos[None, :] < start, text, jnp.int32(graph.mask))
            return jax.vmap(lambda state: jax.lax.dynamic_update_slice(base, state, (0, start)))(traj)

        frames = jax.vmap(place)(jnp.arange(blocks), trajs).reshape(-1, *text.shape)
        frames = jnp.concatenate([frames, text[None]])
        return ctx, text, nfe, nfe_row, jnp.int32(blocks), frames

    def stops(x):
        return jnp.zeros((rows,), bool) if stop_id is None else jnp.any(x == stop_id, axis=1)

    def body(carry):
        i, ctx, text, clean, nfe, nfe_row, stopped = carry
        ctx, x, text, _, n, n_row = next_block(i, ctx, text, clean)
        return i + 1, ctx, text, x, nfe + n, nfe_row + n_row, stopped | stops(x)

    carry = (jnp.int32(0), ctx, text, none_yet, jnp.int32(0), jnp.zeros((rows,), jnp.int32), jnp.zeros((rows,), bool))
    i, ctx, text, x, nfe, nfe_row, _ = jax.lax.while_loop(lambda c: (c[0] < blocks) & ~jnp.all(c[6]), body, carry)
    return scorer.commit(params, ctx, x), text, nfe + 1, nfe_row + 1, i, None


def draw(
    key: jax.Array,
    scorer: Scorer,
    params: Any,
    graph: Graph,
    noise: Callable,
    fixed: jax.Array,
    text: jax.Array,
    times: jax.Array,
    *,
    block_size: int,
    sampler: str,
    denoise: bool,
    options: sampling.Options,
    stop_id: int | None = None,
    shaping: tuple | None = None,
) -> tuple:
    """``sample_blocks``'s traced core: every block of `text` drawn from all-MASK and committed, from an empty context.

    For callers that are themselves traced (``sedd serve`` maps it over rows).

    Args:
      key, scorer, params, graph, noise: as ``sample_blocks``.
      fixed: bool[B, T] the prompt's positions (a prefix), T a multiple of b;
        text: int32[B, T] the prompt's tokens there.
      times: float[steps + 1] the sampler's time grid.
      block_size, sampler, denoise, options, stop_id: as ``sample_blocks`` (options
        checked, its time_grid unset).
      shaping: None, or traced (temperature, top_p) (``sedd.sampling.run_loop``).
    Returns:
      (text int32[B, T], frames as ``draw_blocks``'s or None, nfe int32[], nfe_row int32[B], drawn int32[]).
    """
    ctx, text, nfe, nfe_row, drawn, frames = draw_blocks(
        key,
        times,
        params,
        scorer.init(params, text.shape[0]),
        text,
        fixed,
        jnp.int32(0),
        shaping,
        scorer=scorer,
        graph=graph,
        noise=noise,
        block_size=block_size,
        sampler=sampling.get_sampler(sampler),
        denoise=bool(denoise),
        options=options,
        blocks=text.shape[1] // block_size,
        stop_id=stop_id,
    )
    return text, frames, nfe, nfe_row, drawn


def _prefix_lengths(fixed_mask, shape) -> np.ndarray:
    """The prompt length of each row of a prefix-shaped fixed_mask (int[B]); a ValueError for any other pattern."""
    mask = np.asarray(fixed_mask, bool)
    if mask.shape != shape:
        raise ValueError(f"fixed_mask must have the text's shape {shape}, got {mask.shape}")
    lengths = mask.sum(1)
    if not np.array_equal(mask, np.arange(shape[1])[None, :] < lengths[:, None]):
        raise ValueError(
            "a block model takes a prefix only (fixed positions at the start of each row): it "
            "never saw text after a block, so a suffix or an infill pattern cannot be honoured"
        )
    return lengths


def sample_blocks(
    key: jax.Array,
    scorer: Scorer,
    params: Any,
    graph: Graph,
    noise: Callable,
    shape: tuple[int, int],
    block_size: int,
    steps: int,
    sampler: str = "analytic",
    denoise: bool = True,
    eps: float = 1e-5,
    fixed_mask=None,
    fixed_tokens=None,
    *,
    options: sampling.Options | None = None,
    **option_values,
) -> sampling.Samples:
    r"""Text of T tokens drawn block by block: each block by ``sedd.sampling``'s loop, then committed.

    Block i is drawn from all-MASK by ``sampler`` in ``steps`` steps (plus
    the denoise) with the key fold_in(key, i), its network calls on the b
    positions of the block against the scorer's context; then the clean
    block is committed (one more call). The whole text is one compiled
    program (a ``while_loop`` over blocks); with ``stop_id`` it ends after the
    block in which every row has written that token, and the blocks not drawn
    hold stop_id.

    Args:
      key: a ``jax.random`` key.
      scorer: the model as a ``Scorer`` (``network_scorer``).
      params: its weights (traced).
      graph: the absorbing graph; noise: the schedule.
      shape: (B, T), T >= 1 (rounded up to whole blocks for the draw, cut after).
      block_size: b.
      steps: sampler steps per block.
      sampler, denoise, eps: as ``sedd.sampling.sample``.
      fixed_mask, fixed_tokens: bool / int[B, T], a prompt: True on each row's
        first P_row positions only.
      options, **option_values: as ``sedd.sampling.sample`` (temperature, top_p,
        return_stats, return_trajectory, the sampler's own options, ...), and
        stop_id: a token id that ends the text (None: draw all T).
    Returns:
      ``Samples``: tokens int32[B, T]; with return_trajectory the states of
      the whole text along the way (every block's steps in turn, a block not
      yet drawn all MASK); stats with the NFE (the commits counted).

    Raises:
      ValueError: a graph other than absorbing, a fixed pattern other than a
        prefix, and what ``sedd.sampling.sample`` refuses.
    """
    if not graph.absorb:
        raise ValueError("block diffusion samples on the absorbing graph (each block starts all-MASK)")
    stop_id = option_values.pop("stop_id", None)
    opts = sampling.options_from(options, option_values).checked(sampler, graph, bool(denoise))
    (rows, length), steps = sampling.check_shape(shape), sampling.check_int("steps", steps, 1)
    times = sampling.time_grid(opts.time_grid, steps, eps)
    b = sampling.check_int("block_size", block_size, 1)
    if stop_id is not None and not 0 <= int(stop_id) < graph.vocab_size:
        raise ValueError(f"stop_id must be a token id in [0, {graph.vocab_size}), got {stop_id!r}")
    blocks = -(-length // b)
    padded = blocks * b
    fixed = np.zeros((rows, padded), bool)
    text = jnp.zeros((rows, padded), jnp.int32)
    if fixed_mask is not None or fixed_tokens is not None:
        mask, tokens = sampling.conditioning(fixed_mask, fixed_tokens, (rows, length), graph)
        fixed[:, :length] = _prefix_lengths(mask, (rows, length))[:, None] > np.arange(length)[None, :]
        text = text.at[:, :length].set(jnp.where(mask, tokens, 0))
    text, traj, nfe, nfe_row, drawn = draw(
        key,
        scorer,
        params,
        graph,
        noise,
        jnp.asarray(fixed),
        text,
        times,
        block_size=b,
        sampler=sampler,
        denoise=bool(denoise),
        options=dataclasses.replace(opts, time_grid=None),
        stop_id=None if stop_id is None else int(stop_id),
    )
    if stop_id is not None and traj is None:  # the blocks never drawn
        text = jnp.where(jnp.arange(padded)[None, :] < drawn * b, text, jnp.int32(stop_id))
    stats = {"nfe": nfe, "nfe_per_sample": nfe_row} if opts.return_stats else None
    return sampling.Samples(text[:, :length], None if traj is None else traj[..., :length], stats)


# =========================================================================== serving: rows drawn alone in one program


@functools.lru_cache(maxsize=None)
def serving_scorer(graphdef, window: int, block_size: int, live: bool) -> Scorer:
    """``network_scorer`` with params = (state, batch id): with `live` each call first hands its block to the host.

    Each call (a sampler step, or the commit of the clean block) ``observe``s
    the states of the current block of all rows, at its first position in the
    text (the cache's next row); the host places them into the whole text
    (``sedd.sampling.rows.Placed``). Each commit is a call of its own, so the
    host sees every clean block before the next one starts.
    """
    base = network_scorer(graphdef, window, block_size)

    def tell(batch_id, ctx, x):
        if live:  # the block's first position, the same on every row
            rows_lib.observe(batch_id, jax.lax.all_gather(ctx[1], rows_lib.AXIS)[0] % window, x)

    def score(params, ctx, x, sigma):
        tell(params[1], ctx, x)
        return base.score(params[0], ctx, x, sigma)

    def commit(params, ctx, x):
        tell(params[1], ctx, x)
        return base.commit(params[0], ctx, x)

    return Scorer(lambda params, batch: base.init(params[0], batch), score, commit)


@functools.partial(
    jax.jit,
    static_argnames=(
        "graphdef",
        "graph",
        "noise",
        "steps",
        "sampler",
        "eps",
        "categorical",
        "trajectory",
        "live",
        "block_size",
    ),
)
def sample_rows(
    state,
    seeds,
    row_ids,
    mask,
    tokens,
    temperature,
    top_p,
    batch_id,
    *,
    graphdef,
    graph,
    noise,
    steps,
    sampler,
    eps,
    categorical,
    trajectory,
    live,
    block_size,
):
    """``RowsProgram.fn`` of a block model: ``draw`` per row, its T and top_p traced (``sedd.sampling.rows.map_rows``).

    The prompt is a prefix. With trajectory, frames is int32[B, F, L]: the
    whole text at each state of each block's sampler in turn, then the text
    (``draw_blocks``'s frames).
    """
    length = mask.shape[1]
    scorer = serving_scorer(graphdef, length, block_size, live)
    options = sampling.Options.make(
        categorical=categorical, return_trajectory=trajectory, return_stats=True, axis_name=rows_lib.AXIS
    ).checked(sampler, graph, True)
    times = sampling.time_grid(None, steps, eps)

    def one(key, m, t, temp, p):  # (1, L)
        text, frames, _, nfe_row, _ = draw(
            key,
            scorer,
            (state, batch_id),
            graph,
            noise,
            m[None],
            jnp.where(m, t, 0)[None],
            times,
            block_size=block_size,
            sampler=sampler,
            denoise=True,
            options=options,
            shaping=(temp, p),
        )
        return text[0], None if frames is None else frames[:, 0], nfe_row[0]

    return rows_lib.map_rows(one, seeds, row_ids, mask, tokens, temperature, top_p)


def serving_frames(traj: np.ndarray, start: int, length: int, steps: int, *, block_size: int, mask_id: int):
    """``RowsProgram.frames`` of a block model: the frames of the blocks that hold completion positions.

    ``sample_rows`` gives the steps + 1 states of each block's sampler in
    turn (the last before its denoise) and then the text; a frame's calls
    count the sampler steps that had a mask in its block and the commit of
    each clean block (one call after a block's last state). Returns the kept
    frames, the most calls any row made before each, and {"block": i}, the block each draws.
    """
    per = steps + 1  # states of one block's sampler
    blocks = np.arange(traj.shape[1] - 1) // per  # the block each frame draws
    own = np.arange(traj.shape[2])[None, :] // block_size == blocks[:, None]  # (F, L): its positions
    pending = ((traj[:, :-1] == mask_id) & own[None]).any(-1)  # (n, F): the frame made a call
    commits = (np.arange(len(blocks)) % per == per - 1).astype(int)  # after a block's last state
    calls = np.concatenate([[0], np.cumsum(pending + commits[None], axis=1).max(0)])
    kept = np.flatnonzero(((blocks + 1) * block_size > start) & (blocks * block_size < start + length))
    return traj[:, kept], calls[kept], [{"block": int(i)} for i in blocks[kept]]


def rows_program(
    graphdef,
    graph: Graph,
    noise: Callable,
    *,
    block_size: int,
    steps: int,
    sampler: str,
    eps: float,
    categorical: str,
    trajectory: bool,
    live: bool,
) -> rows_lib.RowsProgram:
    """The ``sedd.sampling.rows.RowsProgram`` of the block network `graphdef`."""
    static = dict(
        graphdef=graphdef,
        graph=graph,
        noise=noise,
        steps=steps,
        sampler=sampler,
        eps=eps,
        categorical=categorical,
        trajectory=trajectory,
        live=live,
        block_size=block_size,
    )
    return rows_lib.RowsProgram(
        sample_rows, static, functools.partial(serving_frames, block_size=block_size, mask_id=graph.mask)
    )


# =========================================================================== the kind


@register("block")
class BlockDiffusion(Diffusion, Drafts):
    """Block diffusion (module docstring): the DDiT over [x_t ; x_0] with block-causal attention.

    Attributes:
      block_size: b = model.block_size, dividing data.seq_len.
    """

    conditions = ("prefix",)  # a prompt before the text only: the model never saw text after a block

    def __init__(self, config):
        super().__init__(config)
        b, length = config.model.block_size, config.data.seq_len
        if not (isinstance(b, int) and 1 <= b <= length and length % b == 0):
            raise ValueError(
                f"model.block_size={b!r} must be a positive divisor of data.seq_len={length} "
                "(b = 1: autoregressive over single-token blocks; b = seq_len: SEDD)"
            )
        if config.training.loss_chunk:
            raise ValueError(
                f"training.loss_chunk={config.training.loss_chunk} is not implemented for "
                "model.kind='block' (its noise levels differ from block to block): set it to 0"
            )
        if not self.graph.absorb:
            raise ValueError(
                f"model.kind='block' needs graph.type='absorbing' (got {config.graph.type!r}): "
                "each block is drawn from all-MASK given the clean blocks before it"
            )
        self.block_size = b

    @property
    def label(self):
        return f"block b={self.block_size}"

    def one_token_steps(self, length):
        """Steps a block (``sample_blocks`` takes its steps per block)."""
        return self.block_size

    def describe(self):
        return {"kind": self.name, "block_size": self.block_size}

    def rows_program(self, graphdef, *, steps, sampler, trajectory, live):
        s = self.config.sampling
        return rows_program(
            graphdef,
            self.graph,
            self.noise,
            block_size=self.block_size,
            steps=steps,
            sampler=sampler,
            eps=float(s.eps),
            categorical=s.categorical,
            trajectory=trajectory,
            live=live,
        )

    def noise_groups(self, model, train=False, rngs=None):
        """The blocks, each at its own sigma and given x0's blocks before it (``log_score``)."""
        return self.block_size, lambda x_t, x0, sigma: log_score(
            model, x_t, x0, sigma, self.block_size, deterministic=not train, rngs=rngs
        )

    def drafter(self, net):
        """Drafts one block of k <= b positions in one call (``sedd.kinds.block_draft.BlockDraft``)."""
        return BlockDraft(net.graphdef, net.state, self.graph, self.noise, self.block_size)

    def loss(self, key, model, x0, train, rngs=None):
        r"""Eq. (2) of the module docstring: each block's score entropy at its own t, given the clean blocks
        before it."""
        t = self.config.training
        block_fn = lambda x_t, x, sigma: log_score(  # noqa: E731
            model, x_t, x, sigma, self.block_size, deterministic=not train, rngs=rngs
        )
        return loss_per_position(
            key,
            block_fn,
            self.graph,
            self.noise,
            x0,
            sampling_eps=t.sampling_eps,
            low_discrepancy=t.low_discrepancy,
            t_power=t.t_power if train else 0.0,
            block_size=self.block_size,
        ).sum(-1)

    def likelihood(self, key, net, batches, num_t, *, max_batches=None, chars_per_token=None, progress=False, **kwargs):
        """The sum of the blocks' bounds, Eq. (2) of the module docstring, with its standard error.

        The clean text's keys and values are computed once a batch and each
        t point runs the noisy text against them (``bound_fns``).
        """
        fns = bound_fns(net.graphdef, self.block_size)
        return evaluate.dataset_bound(
            key,
            fns.block_fn,
            self.graph,
            self.noise,
            batches,
            num_t,
            max_batches=max_batches,
            chars_per_token=chars_per_token,
            score_params=net.state,
            progress=progress,
            prepare=fns.prepare,
            per_position=per_position_fn(self.block_size),
            **kwargs,
        )

    def sample(self, key, net, num_samples, steps=None, sampler=None, **options):
        """``sample_blocks``: block by block with the KV cache; max_length tokens (default data.seq_len).

        steps are per block; the rows stay where the weights are.

        Raises:
          ValueError: block_length (a block model's blocks are model.block_size),
            cache=True with a time-conditioned model, a suffix or infill
            pattern, an option the sampler cannot honour.
        """
        refuse_drafts(self, options)
        s = self.config.sampling
        if options.get("block_length") is not None:
            raise ValueError(
                f"block_length is for a SEDD run's windows; this block model draws blocks of "
                f"model.block_size={self.block_size}"
            )
        options.pop("block_length", None)
        self._check_cache(options)
        options.setdefault("categorical", s.categorical)
        length = options.pop("max_length", None) or self.config.data.seq_len
        scorer = network_scorer(net.graphdef, self.config.data.seq_len, self.block_size)
        return sample_blocks(
            key,
            scorer,
            net.state,
            self.graph,
            self.noise,
            (num_samples, length),
            self.block_size,
            s.steps if steps is None else steps,
            sampler or s.sampler,
            eps=s.eps,
            **options,
        )
