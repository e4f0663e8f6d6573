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

Sampling (``sedd.kinds.block_sampling``): block by block, each from
all-MASK by any sampler of ``sedd.sampling`` that runs on the absorbing
graph, against the network's cache of the clean blocks before it.

A token-shift network (model.token_shift, ``shifted_inputs``) reads at each
position the token before it, as an AR network does, so that an AR run's
weights start it (``BlockDiffusion.params_from``; Fast-dLLM v2's shift).

Letters: B batch (not blocks, in shapes), L length, b block size, n_b = L / b
blocks, T the length of the text drawn, S the cache's rows, D = graph.dim.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sedd import evaluate, losses
from sedd.graphs import Graph
from sedd.kinds import base
from sedd.kinds.base import register
from sedd.kinds.block_draft import BlockDraft
from sedd.kinds.block_sampling import bos_id, network_scorer, lane_program, sample_blocks, shift_right, shifts
from sedd.kinds.capabilities import Drafts, refuse_drafts
from sedd.kinds.ddit import Diffusion
from sedd.model import DDiT

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
    the final layer. A token-shift network reads ``shifted_inputs``.

    Args:
      model: a DDiT built with block_size (``sedd.kinds`` "block"); block_size: b, dividing L.
      x_t: int[B, L] noisy tokens; x0: int[B, L] clean tokens.
      sigma: float[B, n_b] the noise of each block (or float[B], one for all).
    """
    b, length = x_t.shape
    sigma = _per_block(sigma, b, length // block_size)  # (B, n_b)
    noise_groups = jnp.concatenate([sigma, jnp.zeros_like(sigma)], axis=1)  # (B, 2 n_b): x0's blocks at 0
    positions = np.concatenate([np.arange(length), np.arange(length)])
    out = model.network_output(
        jnp.concatenate(shifted_inputs(model, x_t, x0, block_size) if shifts(model) else [x_t, x0], axis=1),
        noise_groups,
        positions=positions,
        mask=block_diffusion_mask(length, block_size),
        keep=length,
        deterministic=deterministic,
        rngs=rngs,
    )  # (B, L, D)
    return model.log_score(out, x_t, jnp.repeat(sigma, block_size, axis=1))


def shifted_inputs(model: DDiT, x_t: jax.Array, x0: jax.Array, block_size: int) -> tuple[jax.Array, jax.Array]:
    r"""The [x_t ; x0] forward's inputs of a token-shift network (Fast-dLLM v2's shift; model.token_shift).

    Position p reads the token at p - 1, not its own: the clean half reads
    BOS, x0_0 .. x0_{L-2}, as an AR network does; the noisy half reads
    x_t at p - 1 within a block, and the clean x0 at p - 1 at a block's first
    position (the last token of the clean block before it). A block's first
    position so always reads a clean token, and at b = 1 the whole forward
    is an AR network's: noisy position p reads x0_{p-1} and attends to
    itself and the clean positions < p, what an AR network's position p
    reads and attends to, at the same rotary positions (an AR run's weights
    start such a model where its first positions are already right:
    ``BlockDiffusion.params_from``).

    Returns:
      (noisy inputs int32[B, L], clean inputs int32[B, L]).
    """
    clean = shift_right(x0, bos_id(model))
    first = (np.arange(x_t.shape[1]) % block_size == 0)[None, :]  # (1, L): a block's first position
    return jnp.where(first, clean, shift_right(x_t, bos_id(model))), clean


def _per_block(sigma, batch: int, blocks: int) -> jax.Array:
    """sigma float[B, n_b], or float[B] (one level for every block), as float[B, n_b]."""
    return jnp.broadcast_to(sigma if jnp.ndim(sigma) == 2 else jnp.asarray(sigma)[:, None], (batch, blocks))


def clean_context(model: DDiT, x0: jax.Array, block_size: int) -> tuple:
    """x0's keys and values at every layer of ``log_score``'s forward: what ``log_score_in_context`` reads.

    In that forward x0's rows attend to x0's blocks only (block-causally: the
    lower right quarter of ``block_diffusion_mask``) and are at noise 0, so
    they depend neither on t nor on x_t: run alone, once a batch, x0 gives
    the keys and values that forward computes again at every t. Returns per
    layer of the network (keys, values), each [B, L, N, K].
    """
    b, length = x0.shape
    mask = block_diffusion_mask(length, block_size)[length:, length:]  # (L, L): x0 -> x0
    inputs = shift_right(x0, bos_id(model)) if shifts(model) else x0
    return model.keys_values(inputs, jnp.zeros((b, length // block_size), jnp.float32), mask=mask)


def log_score_in_context(
    model: DDiT, x_t: jax.Array, context: tuple, sigma: jax.Array, block_size: int, x0: jax.Array | None = None
) -> jax.Array:
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

    Arguments as ``log_score``'s; context: ``clean_context(model, x0, block_size)``; x0: read by a
    token-shift network's blocks at their first positions only.
    """
    b, length = x_t.shape
    sigma = _per_block(sigma, b, length // block_size)  # (B, n_b)
    if shifts(model) and x0 is None:
        raise ValueError("a token-shift network's blocks read the clean tokens before them: give x0")
    inputs = shifted_inputs(model, x_t, x0, block_size)[0] if shifts(model) else x_t
    # x_t -> x0, the upper right quarter of the mask; its upper left one, x_t -> x_t, is a block's own block
    mask = block_diffusion_mask(length, block_size)[:length, length:]  # (L, L)
    h, c = model.features(
        inputs, sigma, mask=mask, context=context, unit=block_size, deterministic=True
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
      block_fn: (x_t, x0, sigma float[B, n_b]) -> log-score float[B, L, D] (``log_score``).
      t: optional float[B] (every block of a row at that t, unweighted) or float[B, n_b].
      the rest: as ``losses.loss_per_position``'s; block_size: b, dividing L.
    """
    k_t, k_x = jax.random.split(key)
    b, length = x0.shape
    blocks = length // block_size
    if t is None:
        t, weight = losses.sample_times(k_t, b * blocks, sampling_eps, low_discrepancy, t_power)
        t, weight = t.reshape(b, blocks), weight.reshape(b, blocks)
    else:
        t = _per_block(t, b, blocks)
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

    def block_fn(state_context, x_t, x0, sigma):  # x0 is read through its context (and a shift's first inputs)
        state, context = state_context
        return log_score_in_context(nnx.merge(graphdef, *state), x_t, context, sigma, block_size, x0)

    return BoundFns(prepare, block_fn)


# =========================================================================== the kind


@register("block", reads=("model.block_size", "model.token_shift"))
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
        if not isinstance(config.model.token_shift, bool):
            raise ValueError(f"model.token_shift={config.model.token_shift!r} must be true or false")
        self.block_size = b
        self.token_shift = config.model.token_shift

    @property
    def label(self):
        return f"block b={self.block_size}" + (", shifted" if self.token_shift else "")

    def network(self, seed: int = 0, **arch):
        """The DDiT of the absorbing graph's D ids; with model.token_shift one more, BOS (``shifted_inputs``)."""
        return super().network(seed, **({"num_tokens": self.graph.dim + 1} if self.token_shift else {}), **arch)

    def one_token_steps(self, length):
        """Steps a block (``sample_blocks`` takes its steps per block)."""
        return self.block_size

    def describe(self):
        return {"kind": self.name, "block_size": self.block_size}

    def _lane_program(self, graphdef, **static):
        return lane_program(graphdef, self.graph, self.noise, block_size=self.block_size, **static)

    def params_from(self, source, params):
        """A token-shift network starts from an AR run of its size too (Fast-dLLM v2's adaptation): its layers
        as they are; its embedding's token rows and BOS (the AR's row V, here V + 1) and its output's token
        columns from the AR's, the MASK row and column as initialised. At b = 1 it is then the AR network
        (``shifted_inputs``); a larger b learns to read MASK."""
        v = self.graph.vocab_size
        theirs = source.model
        if not (self.token_shift and (theirs.num_tokens, theirs.out_dim) == (v + 1, v)):  # not an AR network
            return super().params_from(source, params)

        def adapt(name, ours, theirs):
            if "vocab_embed" in name and theirs.shape[0] >= v + 1:  # (V + 1, H): tokens, BOS
                return ours.at[:v].set(theirs[:v]).at[v + 1].set(theirs[v])
            if "output_layer" in name and "linear" in name and theirs.shape[-1] >= v:  # (H, V) or (V,)
                return ours.at[..., :v].set(theirs[..., :v])
            return None

        return base.transfer(params, source.params, "AR", adapt)

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
        t, block_fn = self.config.training, self.noise_groups(model, train, rngs)[1]  # ``log_score``
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

    def likelihood(self, key, net, batches, num_t, **options):
        """The sum of the blocks' bounds, Eq. (2) of the module docstring, with its standard error.

        The clean text's keys and values are computed once a batch and each
        t point runs the noisy text against them (``bound_fns``).
        """
        fns, per_position = bound_fns(net.graphdef, self.block_size), per_position_fn(self.block_size)
        options.update(score_params=net.state, prepare=fns.prepare, per_position=per_position)
        return evaluate.dataset_bound(key, fns.block_fn, self.graph, self.noise, batches, num_t, **options)

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
