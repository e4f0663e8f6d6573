"""Text longer than the model: semi-autoregressive windows of the sampling core (MDLM Sec. 3.5; BD3-LM).

Shapes: B batch, L the window (the model's length), T the text's length.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from sedd.graphs import Graph, ScoreFn
from sedd.sampling.loop import Samples, bound_loop, check_int, check_shape, conditioning, options_from, time_grid


def sample_long(
    key: jax.Array,
    score_fn: ScoreFn,
    graph: Graph,
    noise: Callable,
    shape: tuple[int, int],
    steps: int,
    max_length: int,
    block_length: int | None = None,
    fixed_mask: jax.Array | None = None,
    fixed_tokens: jax.Array | None = None,
    **sample_args,
) -> Samples:
    r"""Text of ``max_length`` >= L tokens by semi-autoregressive windows of L (MDLM Sec. 3.5; BD3-LM).

    Window w covers positions [s_w, s_w + L): s_0 = 0, then each window
    starts block_length after the previous one (the last is moved back to
    end at max_length). Its positions before the previous window's end are
    fixed to the text already drawn; the rest are drawn by ``sample``'s loop,
    with the caller's own fixed positions kept. Every window is the same compiled
    program (the conditioning is traced); window w uses fold_in(key, w).

    Args (the others, and **sample_args but a trajectory, as ``sample``'s):
      shape: (B, L), L the window (the model's length).
      block_length: new tokens per window after the first, in [1, L] (default L // 2).
      fixed_mask, fixed_tokens: of shape (B, max_length).
      stop_id (in sample_args): a token id that ends the text: no window is drawn after the one in
        which every row has written it, and the positions not drawn hold it.
    Returns:
      ``Samples`` of tokens int32[B, max_length], the stats summed over the windows a row drew.
    """
    b, length = check_shape(shape)
    stop_id = sample_args.pop("stop_id", None)
    if stop_id is not None and not 0 <= int(stop_id) < graph.vocab_size:
        raise ValueError(f"stop_id must be a token id in [0, {graph.vocab_size}), got {stop_id!r}")
    sampler, denoise = sample_args.pop("sampler", "analytic"), bool(sample_args.pop("denoise", True))
    eps, score_params = sample_args.pop("eps", 1e-5), sample_args.pop("score_params", None)
    opts = options_from(sample_args.pop("options", None), sample_args).checked(sampler, graph, denoise)
    times = time_grid(opts.time_grid, check_int("steps", steps, 1), eps)  # checked once: every window shares them
    if opts.return_trajectory:
        raise ValueError("return_trajectory is not available with max_length (one trajectory per window)")
    max_length = check_int("max_length", max_length, length)
    block_length = check_int("block_length", length // 2 if block_length is None else block_length, 1)
    if block_length > length:
        raise ValueError(f"block_length must be <= the window L = {length}, got {block_length}")
    fixed_mask, fixed_tokens = conditioning(fixed_mask, fixed_tokens, (b, max_length), graph)
    if fixed_mask is None:  # as ``sample``: an all-False mask fixes nothing
        fixed_mask, fixed_tokens = jnp.zeros((b, max_length), bool), jnp.zeros((b, max_length), jnp.int32)
    out = jnp.zeros((b, max_length), jnp.int32)
    nfe, nfe_row = jnp.int32(0), jnp.zeros((b,), jnp.int32)
    loop = bound_loop(score_fn, graph, noise, (b, length), sampler, denoise, opts)
    done, start, w = 0, 0, 0
    while done < max_length:
        start = min(start, max_length - length)
        window = slice(start, start + length)
        drawn = jnp.arange(start, start + length) < done  # (L,) already generated
        mask = fixed_mask[:, window] | drawn[None, :]
        tokens = jnp.where(drawn[None, :], out[:, window], fixed_tokens[:, window])
        x, _, stats = loop(jax.random.fold_in(key, w), times, mask, tokens, score_params)
        if stop_id is not None:  # a row that wrote stop_id before this window needs none of its calls
            stats["nfe_per_sample"] = jnp.where(jnp.any(out[:, :done] == stop_id, axis=1), 0, stats["nfe_per_sample"])
        out = out.at[:, window].set(x)
        nfe, nfe_row = nfe + stats["nfe"], nfe_row + stats["nfe_per_sample"]
        done, start, w = start + length, start + block_length, w + 1
        if stop_id is not None and done < max_length and bool(jnp.all(jnp.any(out[:, :done] == stop_id, axis=1))):
            out = out.at[:, done:].set(jnp.int32(stop_id))
            break
    return Samples(out, None, {"nfe": nfe, "nfe_per_sample": nfe_row} if opts.return_stats else None)
