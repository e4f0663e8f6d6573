r"""Block diffusion's sampling: block by block against the network's decoding cache, and its serving program.

``sample_blocks`` draws text block by block, each from all-MASK by any
sampler of ``sedd.sampling`` that runs on the absorbing graph, the network
run on the b positions of the current block against a cache of the clean
blocks' keys and values (``Scorer``, ``network_scorer``). A drawn block is
written into the cache (its "commit") by the call that starts the next
block: one call on 2b positions, the clean block and the next block
all-MASK, the attention of the training forward (the MASK block sees the
clean one, not the reverse), keeps the clean block's keys and values and
gives the next block's first score, which the sampler's first step takes
instead of a call of its own (``sedd.sampling``'s ``prime``). So a block
costs its sampler's calls, not one more; only the last block's commit is a
call of its own. The cache is a ring (``sedd.model.ring_mask``): text past
the model's length keeps the last L - b tokens as context, a sliding window.
A prompt is prefilled as clean blocks; the block holding its end is drawn
with the prompt's positions fixed. A token-shift network (model.token_shift,
``sedd.kinds.block.shifted_inputs``) reads the token before each position:
the context keeps each row's last committed token for the next block's
first position (``shift_right``).

The math of the model, its training and its bound: ``sedd.kinds.block``.

Letters: B batch (not blocks, in shapes), L length, b block size, T the
length of the text drawn, S the cache's rows, D = graph.dim.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sedd import sampling
from sedd.graphs import Graph
from sedd.model import DDiT, ring_mask
from sedd.sampling import lanes as lanes_lib

# =========================================================================== what a token-shift network reads


def shift_right(x: jax.Array, before) -> jax.Array:
    """A token-shift network's inputs at the positions of x int[B, n]: each reads the token before it.

    `before` (int[B], or an int) is the token before the first position: the
    last clean token before it, or BOS (``bos_id``) at the text's start. A
    masked token is read as MASK by the position after it.
    """
    before = jnp.broadcast_to(jnp.asarray(before, jnp.int32), x.shape[:1])
    return jnp.concatenate([before[:, None], x[:, :-1].astype(jnp.int32)], axis=1)


def shifts(model: DDiT) -> bool:
    """Whether a block network reads the token before each position (model.token_shift): it then embeds a
    BOS beside the graph's D ids, num_tokens = D + 1 (``BlockDiffusion.network``)."""
    return model.num_tokens > model.out_dim


def bos_id(model: DDiT) -> int:
    """BOS of a token-shift network: its last embedding row (V + 1; MASK is V, the graph's)."""
    return model.num_tokens - 1


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

    The context is (cache, index, last): per layer the rotary-embedded keys
    and the values of the committed positions, a ring of S = window + b rows
    (``DDiT.output_in_cache`` with each position at its row mod S; window =
    the model's length L), the next position, int32[], and the last
    committed token of each row, int32[B] (BOS before any: what a
    token-shift network's next block reads first, ``shift_right``).
    ``score`` runs the block against it and drops the cache it wrote (the
    context is as it was); ``commit`` runs the clean block at noise 0 and
    keeps it; ``commit_score`` runs [x ; clean] with the noise levels
    [sigma, 0] in one call and keeps both blocks' rows (x's are written over
    by its next score before any query reads them). Each query sees its own
    block and the clean ones before it within the window
    (``sedd.model.ring_mask``). Exactly what the x_0 half of the training
    forward computes (tests/test_block.py), a token-shift network's on the
    inputs of ``shifted_inputs``.
    """
    b = block_size
    rows = window + b

    def run(model, cache, x, sigma, positions, keep=None):
        mask = ring_mask(positions, rows, window, b)  # (L, S): its own block and the clean ones before it
        out, cache, _ = model.output_in_cache(x, sigma, positions=positions, mask=mask, cache=cache, keep=keep)
        return out, cache

    def inputs(model, x, last):  # what the network reads at the positions of x, after the token `last`
        return shift_right(x, last) if shifts(model) else x

    def init(state, batch):
        model = nnx.merge(graphdef, *state)
        return model.empty_cache(batch, rows), jnp.int32(0), jnp.full((batch,), model.num_tokens - 1, jnp.int32)

    def score(state, ctx, x, sigma):
        model = nnx.merge(graphdef, *state)
        out, _ = run(model, ctx[0], inputs(model, x, ctx[2]), sigma, ctx[1] + jnp.arange(b))
        return model.log_score(out, x, sigma)

    def commit(state, ctx, x):
        (cache, index, last), model = ctx, nnx.merge(graphdef, *state)
        zero = jnp.zeros(x.shape[:1], jnp.float32)
        _, cache = run(model, cache, inputs(model, x, last), zero, index + jnp.arange(b))
        return cache, index + b, x[:, -1].astype(jnp.int32)

    def commit_score(state, ctx, clean, x, sigma):
        (cache, index, last), model = ctx, nnx.merge(graphdef, *state)
        # (B, 2b): x first, so that the final layer runs on it alone; x reads the clean block's last token first
        both = jnp.concatenate([inputs(model, x, clean[:, -1]), inputs(model, clean, last)], axis=1)
        positions = index + jnp.concatenate([jnp.arange(b, 2 * b), jnp.arange(b)])
        sigmas = jnp.stack([sigma, jnp.zeros_like(sigma)], axis=1).astype(jnp.float32)  # (B, 2) a level a block
        out, cache = run(model, cache, both, sigmas, positions, keep=b)
        return (cache, index + b, clean[:, -1].astype(jnp.int32)), model.log_score(out, x, sigma)

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

    loop = functools.partial(sampling.run_loop, graph=graph, noise=noise, sampler=sampler, options=options)

    def draw(i, ctx, text, prime):
        """Block i drawn against ctx; prime: (its start state, sigma0, their score) or None."""
        x, traj, stats = loop(
            jax.random.fold_in(key, first + i),
            times,
            block_of(i, fixed),
            block_of(i, text),
            (params, ctx),
            score_fn=score_fn,
            shape=(rows, b),
            denoise=denoise,
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
        frames = _whole_text_frames(trajs, text, first, b, graph.mask)  # trajs: (blocks, S, B, b)
        return scorer.commit(params, ctx, x), text, n.sum() + 1, n_row.sum(0) + 1, jnp.int32(blocks), frames

    i, ctx, text, x, nfe, nfe_row = _until_stopped(next_block, ctx, text, none_yet, blocks, stop_id)
    return scorer.commit(params, ctx, x), text, nfe + 1, nfe_row + 1, i, None


def _until_stopped(next_block: Callable, ctx, text, clean, blocks: int, stop_id: int | None) -> tuple:
    """next_block(i, ctx, text, clean) for i = 0 .. blocks - 1, or until every row has written stop_id: (blocks
    drawn, ctx, text, the last block, nfe, nfe_row); a stopped row's calls end (the later blocks are the others')."""
    rows = text.shape[0]

    def stops(x):
        return jnp.zeros((rows,), bool) if stop_id is None else jnp.any(x == stop_id, axis=1)

    def body(carry):
        i, ctx, text, clean, nfe, nfe_row, stopped = carry
        ctx, x, text, _, n, n_row = next_block(i, ctx, text, clean)
        return i + 1, ctx, text, x, nfe + n, nfe_row + jnp.where(stopped, 0, n_row), stopped | stops(x)

    carry = (jnp.int32(0), ctx, text, clean, jnp.int32(0), jnp.zeros((rows,), jnp.int32), jnp.zeros((rows,), bool))
    return jax.lax.while_loop(lambda c: (c[0] < blocks) & ~jnp.all(c[6]), body, carry)[:6]


def _whole_text_frames(trajs: jax.Array, text: jax.Array, first, block_size: int, mask_id: int) -> jax.Array:
    """Each block's sampler states (int32[blocks, S, B, b]) in the whole text, then the text: int32[blocks S + 1,
    B, T]; the blocks before a state's block clean, those after it MASK."""
    pos = jnp.arange(text.shape[1])

    def place(i, traj):  # block i's states in the whole text: (S, B, T)
        start = (first + i) * block_size
        base = jnp.where(pos[None, :] < start, text, jnp.int32(mask_id))
        return jax.vmap(lambda state: jax.lax.dynamic_update_slice(base, state, (0, start)))(traj)

    frames = jax.vmap(place)(jnp.arange(trajs.shape[0]), trajs).reshape(-1, *text.shape)
    return jnp.concatenate([frames, text[None]])


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

    For callers that are themselves traced (``sedd serve`` maps it over rows). Arguments as ``sample_blocks``'s
    (options checked, its time_grid unset) and ``draw_blocks``': fixed bool[B, T] the prompt's positions (a
    prefix), T a multiple of b, text int32[B, T] its tokens there, times float[steps + 1] the sampler's grid.

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
      scorer, params: the model as a ``Scorer`` (``network_scorer``), its weights (traced).
      graph: the absorbing graph; noise: the schedule.
      shape: (B, T), T >= 1 (rounded up to whole blocks for the draw, cut after).
      steps: sampler steps per block (of block_size b); sampler, denoise, eps: as ``sedd.sampling.sample``.
      fixed_mask, fixed_tokens: bool / int[B, T], a prompt: True on each row's
        first P_row positions only.
      options, **option_values: as ``sedd.sampling.sample`` (temperature, top_p,
        return_stats, return_trajectory, the sampler's own options, ...), and
        stop_id: a token id that ends the text (None: draw all T).
    Returns:
      ``Samples``: tokens int32[B, T]; with return_trajectory the states of the whole text along the way (every
      block's steps in turn, a block not yet drawn all MASK); stats with the NFE (the commits counted), each row's
      ("nfe_per_sample") with stop_id up to the block in which it wrote it (and that block's commit).

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
    (``sedd.sampling.lanes.Placed``). Each commit is a call of its own, so the
    host sees every clean block before the next one starts.
    """
    base = network_scorer(graphdef, window, block_size)

    def tell(batch_id, ctx, x):
        if live:  # the block's first position, the same on every row
            lanes_lib.observe(batch_id, jax.lax.all_gather(ctx[1], lanes_lib.AXIS)[0] % window, x)

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
def sample_lanes(
    state,
    seeds,
    lane_ids,
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
    """``LaneProgram.fn`` of a block model: ``draw`` per lane, its T and top_p traced (``sedd.sampling.lanes.map_lanes``).

    The prompt is a prefix. With trajectory, frames is int32[B, F, L]: the
    whole text at each state of each block's sampler in turn, then the text
    (``draw_blocks``'s frames).
    """
    length = mask.shape[1]
    scorer = serving_scorer(graphdef, length, block_size, live)
    options = sampling.Options.make(
        categorical=categorical, return_trajectory=trajectory, return_stats=True, axis_name=lanes_lib.AXIS
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

    return lanes_lib.map_lanes(one, seeds, lane_ids, mask, tokens, temperature, top_p)


def serving_frames(traj: np.ndarray, start: int, length: int, steps: int, *, block_size: int, mask_id: int):
    """``LaneProgram.frames`` of a block model: the frames of the blocks that hold completion positions.

    ``sample_lanes`` gives the steps + 1 states of each block's sampler in
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


def lane_program(graphdef, graph: Graph, noise: Callable, *, block_size: int, **static) -> lanes_lib.LaneProgram:
    """The ``sedd.sampling.lanes.LaneProgram`` of the block network `graphdef`; static: the rest of ``sample_lanes``'s
    (steps, sampler, eps, categorical, trajectory, live)."""
    static |= dict(graphdef=graphdef, graph=graph, noise=noise, block_size=block_size)
    frames = functools.partial(serving_frames, block_size=block_size, mask_id=graph.mask)
    return lanes_lib.LaneProgram(sample_lanes, static, frames)
