"""DDiTLayer: one adaLN-Zero transformer layer of the DDiT (the original's DDiTBlock; Peebles & Xie 2023).

  x += gate_a * Drop(Attn(modulate(LN(x), shift_a, scale_a)))     rotary self-attention
  x += gate_m * Drop(MLP (modulate(LN(x), shift_m, scale_m)))     GELU MLP

with (shift, scale, gate) x 2 from a zero-initialised Linear of the
conditioning c. The attention reads its keys and values from one of three
places, each a function of its own that ``run`` is given: the chunk itself
(``self_attention``: training, a full pass), a decoding cache the caller
holds (``cache_attention``: the chunk's slots written into it first;
``sedd.model`` says why there is one cache), or a clean context that is
read, never written (``context_attention``: block diffusion's bound). The layers it is built from are in
``sedd.layers``; the network that stacks it, ``sedd.model.DDiT``.

Shape letters used in this module:
  B batch, L sequence length (a chunk's), H hidden size, N attention heads,
  K head dim (H = N K), C conditioning width, G groups of positions with a
  noise level each, S slots of a decoding cache or positions of a context.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sedd import kernels
from sedd.layers import apply_rotary, broadcast_positions, layer_norm, linear, modulate, per_position

Array = jax.Array


# model.remat: what the backward pass of a layer keeps from its forward pass (jax.checkpoint
# policies). "none": everything (no recomputation); "dots": the outputs of the weight matmuls
# (not the attention products, which have batch dimensions), the rest recomputed; "layers": only
# each layer's input, the whole layer recomputed.
REMAT_POLICIES = {
    "none": None,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "layers": jax.checkpoint_policies.nothing_saveable,
}


ROW_WRITES = 64
"""``write_slots``' writes at a place a sequence: one write each up to this many sequences, a scatter past it."""


def self_attention(q: Array, k: Array, v: Array, *, causal: bool, mask: Array | None, dtype: Any) -> tuple:
    """The chunk's queries over its own keys and values (training, a full pass): mask bool[L, L] (default: none,
    or causal). Returns (float32[B, L, N, K], (k, v)): the keys and values are what a later call takes as its
    context (``context_attention``)."""
    return kernels.mixed_attention(q, k, v, causal, dtype, mask=mask), (k, v)


def write_slots(held: Array, new: Array, at: Array | None, positions, n_heads: int) -> Array:
    """new [B N, L, K] into the cache held [B N, S, K], in place: at slots at .. at + L - 1, at int32[] or
    int32[B] (each sequence's own slots: one write a sequence, its heads together, up to ``ROW_WRITES``
    sequences; past that one scatter, which a program of B writes would outgrow); at None: position p
    to slot p mod S (a ring), positions int[L]."""
    if at is None:
        if new.shape[1] > held.shape[1]:
            raise ValueError(f"a chunk of {new.shape[1]} positions exceeds the ring cache's {held.shape[1]} slots")
        return held.at[:, jnp.asarray(positions) % held.shape[1]].set(new)
    if jnp.ndim(at) == 0:
        return jax.lax.dynamic_update_slice(held, new, (0, at, 0))
    b = jnp.shape(at)[0]
    if b > ROW_WRITES:
        write = jax.vmap(lambda h, x, a: jax.lax.dynamic_update_slice(h, x, (0, a, 0)))
        slots = write(held.reshape(b, n_heads, *held.shape[1:]), new.reshape(b, n_heads, *new.shape[1:]), at)
        return slots.reshape(held.shape)
    for i in range(b):
        held = jax.lax.dynamic_update_slice(held, new[i * n_heads : (i + 1) * n_heads], (i * n_heads, at[i], 0))
    return held


def cache_attention(q: Array, k: Array, v: Array, *, cache: tuple, at: Array | None, mask: Array, positions) -> tuple:
    """The chunk's queries over a decoding cache the caller holds, (keys, values) each [B N, S, K] (batch and heads
    grouped, then slots: as the attention reads it). The chunk's rotary-embedded keys and values are written into
    it in place first (``write_slots``: at slots at .., or by position on a ring), then each query attends over
    the S slots as mask bool[L, S] or [B, L, S] says (``kernels.cache_attention``, in the cache's dtype:
    ``sedd.model.DDiT.empty_cache``). Nothing of the S slots is concatenated, transposed or copied at the call.
    Returns (float32[B, L, N, K], the cache after the write)."""
    if mask is None:
        raise ValueError("a decoding cache is read as a mask over its slots says: give mask")
    b, l, n, d = q.shape
    grouped = lambda a: jnp.swapaxes(a, 1, 2).reshape(b * n, l, d)  # noqa: E731  (B N, L, K)
    held_dtype = cache[0].dtype
    k, v = (write_slots(held, grouped(new).astype(held_dtype), at, positions, n) for held, new in zip(cache, (k, v)))
    if jnp.ndim(mask) == 3:  # a mask a sequence, (B, L, S): the same for its heads
        mask = jnp.broadcast_to(mask[:, None], (b, n, *mask.shape[1:])).reshape(b * n, *mask.shape[1:])
    att = kernels.cache_attention(grouped(q), k, v, mask, held_dtype)  # (B N, L, K)
    return jnp.swapaxes(att.reshape(b, n, l, d), 1, 2), (k, v)  # (B, L, N, K)


def context_attention(q: Array, k: Array, v: Array, *, context: tuple, unit: int, mask: Array, dtype: Any) -> tuple:
    """The chunk's queries over a clean context read and never written, (keys, values) each [B, S, N, K] (a
    ``self_attention``'s own): each query sees its own unit of `unit` positions of the chunk (L a multiple of
    unit) and the context positions of mask bool[L, S] (``kernels.unit_context_attention``: block diffusion's bound,
    whose noisy blocks never see each other). Returns (float32[B, L, N, K], (k, v))."""
    if not (unit and q.shape[1] % unit == 0 and mask is not None):
        raise ValueError(
            "a context is read by units of positions: give unit dividing the chunk's length and a mask over the context"
        )
    return kernels.unit_context_attention(q, k, v, context, unit, mask, dtype), (k, v)


class DDiTLayer(nnx.Module):
    """One adaLN-modulated transformer layer (Peebles & Xie 2023), rotary attention: the arguments of
    ``sedd.model.DDiT`` of the same names."""

    def __init__(
        self,
        hidden_size: int,
        n_heads: int,
        cond_dim: int,
        *,
        mlp_ratio: int = 4,
        dropout: float = 0.1,
        causal: bool = False,
        dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        h = hidden_size
        self.n_heads = n_heads
        self.head_dim = h // n_heads
        self.causal = causal
        self.dtype = dtype
        self.norm1 = layer_norm(h, rngs)
        # Packed as (3, N, K) along the output axis, the original's layout.
        self.attn_qkv = linear(h, 3 * h, ("embed", "qkv"), use_bias=False, dtype=dtype, rngs=rngs)
        self.attn_out = linear(h, h, ("heads", "embed"), use_bias=False, dtype=dtype, rngs=rngs)
        self.norm2 = layer_norm(h, rngs)
        self.mlp_in = linear(h, mlp_ratio * h, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.mlp_out = linear(mlp_ratio * h, h, ("mlp", "embed"), dtype=dtype, rngs=rngs)
        # Zero init makes every layer the identity map at start (gates are 0),
        # the "adaLN-Zero" choice of Peebles & Xie 2023.
        self.adaLN_modulation = linear(cond_dim, 6 * h, ("cond", "adaln"), zero=True, dtype=dtype, rngs=rngs)
        # deterministic=True: a fresh model is in eval mode; `model.train()` flips it.
        self.dropout1 = kernels.Dropout(dropout, deterministic=True, rngs=rngs)
        self.dropout2 = kernels.Dropout(dropout, deterministic=True, rngs=rngs)

    def __call__(self, x: Array, c: Array, attend=None, **kwargs) -> Array:
        """The layer's output float32[B, L, H] (``run``'s first value, the same arguments)."""
        return self.run(x, c, attend, **kwargs)[0]

    def run(
        self,
        x: Array,
        c: Array,
        attend=None,
        *,
        positions: Array | None = None,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> tuple[Array, tuple[Array, Array]]:
        """The layer's output and the keys and values its attention read.

        Args:
          x: float32[B, L, H] residual stream.
          c: float32[B, C] conditioning (already passed through SiLU), float32[B, G, C], one for each of G
            equal groups of positions, or float32[1, C], one for the batch.
          attend: (q, k, v) -> (float32[B, L, N, K], keys and values), the rotary-embedded queries, keys and
            values [B, L, N, K] of the chunk: one of the three attention paths with its own arguments bound
            (``self_attention``, ``cache_attention``, ``context_attention``; ``functools.partial``); None:
            ``self_attention`` of this layer, no mask (causal for a causal layer).
          positions: int[L] (or int[B, L] with a cache) rotary positions, default 0 .. L - 1.
        Returns:
          (float32[B, L, H], the keys and values `attend` gives: the chunk's [B, L, N, K], or the cache after
          the write).
        """
        b, l, h = x.shape
        mod = per_position(self.adaLN_modulation(c).astype(jnp.float32), l)  # (B, 6H) or (B, L, 6H)
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = jnp.split(mod, 6, axis=-1)

        y = modulate(self.norm1(x.astype(jnp.float32)), shift_a, scale_a)  # (B, L, H)
        qkv = self.attn_qkv(y.astype(self.dtype))  # (B, L, 3H)
        qkv = qkv.reshape(b, l, 3, self.n_heads, self.head_dim)  # (B, L, 3, N, K)
        pos = np.arange(l) if positions is None else positions  # numpy when known at trace time
        q, k, v = apply_rotary(qkv[:, :, 0], pos), apply_rotary(qkv[:, :, 1], pos), qkv[:, :, 2]  # (B, L, N, K) each
        attend = attend or functools.partial(self_attention, causal=self.causal, mask=None, dtype=self.dtype)
        att, kv = attend(q, k, v)  # (B, L, N, K), float32
        att = self.attn_out(att.reshape(b, l, h))  # (B, L, H)
        att = self.dropout1(att, deterministic=deterministic, rngs=rngs).astype(jnp.float32)
        x = x + broadcast_positions(gate_a) * att  # (B, L, H)

        y = modulate(self.norm2(x), shift_m, scale_m)  # (B, L, H)
        y = self.mlp_in(y.astype(self.dtype))  # (B, L, mlp_ratio H)
        y = self.mlp_out(jax.nn.gelu(y, approximate=True))  # (B, L, H)
        y = self.dropout2(y, deterministic=deterministic, rngs=rngs).astype(jnp.float32)
        return x + broadcast_positions(gate_m) * y, kv  # (B, L, H), the keys and values read


def scan_layers(layers, h: Array, run, policy, deterministic: bool | None, rngs: nnx.Rngs | None) -> Array:
    """h through `layers` as one ``jax.lax.scan`` over their stacked weights, each step run(layer, h, rngs) under
    ``jax.checkpoint`` with `policy` (``REMAT_POLICIES``'): the backward loop recomputes a layer just before its
    gradient, so one layer's intermediates are live at a time. (Unrolled, XLA's CPU compiler drops the
    checkpoint's optimization barriers and merges the recomputation into the forward pass, which then keeps
    every layer's intermediates; a loop cannot be merged.) Their dropout masks come from one key drawn for each
    layer, other masks than the unrolled layers', of the same law."""
    graphdef, _, other = nnx.split(layers[0], nnx.Param, ...)
    stacked = jax.tree.map(lambda *p: jnp.stack(p), *(nnx.state(layer, nnx.Param) for layer in layers))
    drop = layers[0].dropout1
    keys = None
    if drop.rate > 0 and not (drop.deterministic if deterministic is None else deterministic):
        # Dropout keys drawn here, one a layer, from which its two dropout layers draw in turn.
        draw = [rngs.dropout() if rngs is not None else layer.dropout1.rngs() for layer in layers]
        keys = jnp.stack([jax.random.key_data(k) for k in draw])  # (n_layers, ...)

    @functools.partial(jax.checkpoint, policy=policy)
    def step(h, params, key):
        rngs = None if key is None else nnx.Rngs(dropout=jax.random.wrap_key_data(key))
        return run(nnx.merge(graphdef, params, other), h, rngs)  # (B, L, H)

    return jax.lax.scan(lambda h, xs: (step(h, *xs), None), h, (stacked, keys))[0]
