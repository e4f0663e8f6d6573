r"""A block-diffusion run as the drafter of an AR run: one block of k <= b positions in one call.

``BlockDraft`` is the ``sedd.drafts.Drafter`` a block run's kind gives
(``sedd.kinds.block.BlockDiffusion.drafter``); ``drafter_parts`` is its
(prefill, drafter) pair for ``sedd.speculative.decode``.

Letters: B batch, L length, k drafts a round, b block size, V vocabulary, D = graph.dim.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from sedd import drafts, sampling
from sedd.graphs import Graph
from sedd.kinds.block_sampling import bos_id, shift_right, shifts


class BlockDraft(drafts.Drafter):
    """A block network as the drafter of an AR target: k <= b drafts at t = 1 in one call a round.

    Attributes:
      graphdef, state: the network (state = (params, rest)); graph: its absorbing graph (vocab = graph.dim - 1);
      noise: its schedule (the draft block is at sigma(1)); block_size: its b, the most drafts a round.
    """

    name = "block"

    def __init__(self, graphdef, state, graph: Graph, noise: Callable, block_size: int):
        self.graphdef, self.state, self.graph, self.noise = graphdef, state, graph, noise
        self.vocab = graph.dim - 1
        self.block_size = block_size

    def most(self):
        """min(b, MAX_DRAFTS): a draft block is at most one of the network's blocks."""
        most, why = super().most()
        return (self.block_size, "the block drafter's block size") if self.block_size < most else (most, why)

    def calls(self, k):
        return 1

    def parts(self, temperature, top_p):
        return drafter_parts(
            self.graphdef, self.graph, self.noise, self.block_size, temperature=temperature, top_p=top_p
        )

    def cached_parts(self, temperature, top_p):
        return cached_drafter_parts(
            self.graphdef, self.graph, self.noise, self.block_size, temperature=temperature, top_p=top_p
        )


def draft_mask(length: int, k: int, start: jax.Array, block_size: int) -> jax.Array:
    """The attention of a one-step draft over [draft block (k) ; clean text (length)]: bool[k + length, k + length].

    The clean rows attend as the x_0 half of ``block_diffusion_mask`` does
    (blk(j) <= blk(p), blocks of block_size), restricted to the prefix j <
    start (the rest of the buffer is not text yet); the draft block attends
    to itself and to the whole prefix, as a noisy block attends to the clean
    blocks before it. A clean row at or past start sees itself only: its
    output is never read, and no row sees it.

    Args:
      length: the clean buffer's positions; k: the draft block's;
      start: int32[] the prefix's length; block_size: the model's b.
    """
    j = jnp.arange(length)
    blk = j // block_size
    prefix = j < start  # (length,)
    clean = (prefix[None, :] & (blk[None, :] <= blk[:, None])) | (j[:, None] == j[None, :])  # (length, length)
    top = jnp.concatenate([jnp.ones((k, k), bool), jnp.broadcast_to(prefix[None, :], (k, length))], axis=1)
    bottom = jnp.concatenate([jnp.zeros((length, k), bool), clean], axis=1)
    return jnp.concatenate([top, bottom], axis=0)  # (k + length, k + length)


def drafter_parts(
    graphdef, graph: Graph, noise: Callable, block_size: int, *, temperature: float = 1.0, top_p: float = 1.0
) -> tuple:
    r"""(prefill, drafter) of the block network `graphdef` for ``sedd.speculative.decode``: k tokens in one call.

    A round drafts the k <= b positions start .. start + k - 1 as one block
    at t = 1 (all MASK, sigma = sigma(1)) given the clean prefix
    text[:start], in one network call: at a masked position of the
    absorbing graph the score over the V real tokens is proportional to
    p_theta(x_0 = . | context) (``DDiT.log_score``), the same for every sigma
    up to a factor, and the positions of a block are independent given the
    context at t = 1. So

        q_i(v) = softmax_v(log s_theta(MASK^k, x_<start, sigma(1))_{i, v} / T),   v < V,

    with the target's temperature T (and nucleus top_p), is the law each
    draft y_i is drawn from given the prefix alone, and (1) of
    ``sedd.speculative`` holds: y_i does not depend on y_<i. Several
    denoising steps are not offered: a sampler that unmasks some positions
    and then draws the others given them draws y_i given later drafts, and
    (1) would then need the left-to-right conditionals of its joint law,
    which a diffusion model does not give in closed form.

    The call is a forward without a cache over [draft block ; text[:L]]
    (``draft_mask``, the rotary positions of the text; the draft block at
    positions start .. start + k - 1), each row under ``jax.vmap`` with its
    own start, since rows keep different numbers of drafts. The prefix's
    last block may be partial (start not a multiple of b): its rows attend
    within the part written, unlike training's, which saw whole clean blocks;
    the law of the text is the target's whatever q is, only the acceptance
    can suffer. One call costs a forward over L + k positions.

    Not cached: temperature and top_p may be traced (``sedd serve``'s rows);
    ``cached_drafter_parts`` is the cached builder of Python values.

    Returns:
      prefill(state, prompt) -> state (no cache: the state is the weights);
      drafter(key, state, text, start, k) -> (drafted int32[B, k], q float32[B, k, V], state).
    """
    vocab = graph.dim - 1  # the real tokens; graph.mask = V

    def prefill(state, prompt):
        return state

    def drafter(key, state, text, start, k):
        model = nnx.merge(graphdef, *state)
        length = text.shape[1] - k - 1  # decode's buffer: L + k + 1
        clean_len = -(-length // k) * k  # a multiple of k: the noise groups are k positions each
        sigma = noise(jnp.ones((), jnp.float32))[0]  # sigma(1)

        def one(key, row, s):  # (T,), ()
            clean = jnp.pad(row[:length], (0, clean_len - length))
            x = jnp.concatenate([jnp.full((k,), graph.mask, jnp.int32), clean.astype(jnp.int32)])[None]  # (1, k + Lc)
            inputs = x
            if shifts(model):  # a token-shift network reads the token before each position (block.shifted_inputs)
                before = jnp.where(s > 0, row[jnp.maximum(s - 1, 0)], bos_id(model))  # before the draft block
                inputs = jnp.concatenate([shift_right(x[:, :k], before), shift_right(x[:, k:], bos_id(model))], 1)
            positions = jnp.concatenate([s + jnp.arange(k), jnp.arange(clean_len)])
            groups = jnp.zeros((1, 1 + clean_len // k), jnp.float32).at[:, 0].set(sigma)  # the draft block at sigma(1)
            mask = draft_mask(clean_len, k, s, block_size)
            out = model.network_output(
                inputs, groups, positions=positions, mask=mask, keep=k, deterministic=True
            )  # (1, k, D)
            logits = model.log_score(out, x[:, :k], jnp.full((1, k), sigma))[0, :, :vocab]  # (k, V)
            q = sampling.shaped_law(logits, temperature, top_p)  # (k, V); T, top_p floats or traced (a server's)
            y = jax.random.categorical(key, jnp.log(q)).astype(jnp.int32)  # (k,) independent given the prefix
            return y, q

        drafted, q = jax.vmap(one)(jax.random.split(key, text.shape[0]), text, start)
        return drafted, q, state

    return prefill, drafter


@functools.lru_cache(maxsize=None)
def cached_drafter_parts(
    graphdef, graph: Graph, noise: Callable, block_size: int, *, temperature: float = 1.0, top_p: float = 1.0
) -> tuple:
    """``drafter_parts`` of Python temperature and top_p, one per network structure (compiled once)."""
    return drafter_parts(graphdef, graph, noise, block_size, temperature=temperature, top_p=top_p)
