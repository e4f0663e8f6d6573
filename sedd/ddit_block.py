"""DDiTBlock: one adaLN-Zero transformer block of the DDiT (Peebles & Xie 2023), and its decoding cache.

  x += gate_a * Drop(Attn(modulate(LN(x), shift_a, scale_a)))     rotary self-attention
  x += gate_m * Drop(MLP (modulate(LN(x), shift_m, scale_m)))     GELU MLP

with (shift, scale, gate) x 2 from a zero-initialised Linear of the
conditioning c. A causal or block-causal block also decodes: `init_cache`
gives it a ring of keys and values (`_attend_cache`), and `decode=True` runs
new positions against the earlier ones, the pattern of Flax's lm1b example.
The layers it is built from are in ``sedd.layers``; the network that stacks
it, ``sedd.model.DDiT``.

Shape letters used in this module:
  B batch, L sequence length (a decoded chunk's with decode), H hidden size,
  N attention heads, K head dim (H = N K), C conditioning width, G groups of
  positions with a noise level each, S rows of the decoding cache.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sedd import kernels
from sedd.layers import apply_rotary, broadcast_positions, layer_norm, linear, modulate, per_position

Array = jax.Array


ROW_WRITES = 64
"""``DDiTBlock.run``'s writes at a place a sequence: one write each up to this many sequences, a scatter past it."""


class DDiTBlock(nnx.Module):
    """One adaLN-modulated transformer block (Peebles & Xie 2023), rotary attention.

    A causal or block-causal block can also decode: after `init_cache`,
    `decode=True` runs the new positions against the keys and values of the
    earlier ones.

    Args:
      hidden_size: H.
      n_heads: N; K = H / N must be even for rotary.
      cond_dim: C.
      mlp_ratio: MLP hidden width as a multiple of H.
      dropout: dropout rate on both residual branches.
      causal: causal self-attention (for an autoregressive baseline).
      block_size: decoding unit of a block-diffusion model: a decoded position
        sees the cached positions of its own and earlier blocks (causal is
        block_size 1); None for neither, a model that cannot decode.
      dtype: compute dtype of matmuls and attention.
      rngs: parameter keys and the 'dropout' stream.
    """

    def __init__(
        self,
        hidden_size: int,
        n_heads: int,
        cond_dim: int,
        *,
        mlp_ratio: int = 4,
        dropout: float = 0.1,
        causal: bool = False,
        block_size: int | None = None,
        dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ):
        h = hidden_size
        self.n_heads = n_heads
        self.head_dim = h // n_heads
        self.causal = causal
        self.block_size = 1 if causal else block_size
        self.dtype = dtype
        self.norm1 = layer_norm(h, rngs)
        # Packed as (3, N, K) along the output axis, the original's layout.
        self.attn_qkv = linear(h, 3 * h, ("embed", "qkv"), use_bias=False, dtype=dtype, rngs=rngs)
        self.attn_out = linear(h, h, ("heads", "embed"), use_bias=False, dtype=dtype, rngs=rngs)
        self.norm2 = layer_norm(h, rngs)
        self.mlp_in = linear(h, mlp_ratio * h, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.mlp_out = linear(mlp_ratio * h, h, ("mlp", "embed"), dtype=dtype, rngs=rngs)
        # Zero init makes every block the identity map at start (gates are 0),
        # the "adaLN-Zero" choice of Peebles & Xie 2023.
        self.adaLN_modulation = linear(cond_dim, 6 * h, ("cond", "adaln"), zero=True, dtype=dtype, rngs=rngs)
        # deterministic=True: a fresh model is in eval mode; `model.train()` flips it.
        self.dropout1 = kernels.Dropout(dropout, deterministic=True, rngs=rngs)
        self.dropout2 = kernels.Dropout(dropout, deterministic=True, rngs=rngs)
        # Set by `init_cache`; the layout of nnx.MultiHeadAttention's cache.
        self.cached_key: nnx.Cache | None = nnx.data(None)
        self.cached_value: nnx.Cache | None = nnx.data(None)
        self.cache_index: nnx.Cache | None = nnx.data(None)

    def init_cache(self, batch: int, max_len: int) -> None:
        """An empty decoding cache of a window of max_len positions: keys and values
        [B, S = max_len + u, N, K] in the compute dtype (u = block_size, the decoding
        unit: a ring of one unit more than the window, ``_attend_cache``), and the
        next position to write, 0."""
        shape = (batch, max_len + (self.block_size or 0), self.n_heads, self.head_dim)
        self.cached_key = nnx.Cache(jnp.zeros(shape, self.dtype))
        self.cached_value = nnx.Cache(jnp.zeros(shape, self.dtype))
        self.cache_index = nnx.Cache(jnp.array(0, jnp.int32))

    def __call__(
        self,
        x: Array,
        c: Array,
        *,
        positions: Array | None = None,
        mask: Array | None = None,
        context: tuple[Array, Array] | None = None,
        decode: bool = False,
        commit: bool | int = True,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> Array:
        """Applies the block.

        Args:
          x: float32[B, L, H] residual stream; with decode, at the L positions
            from the cache index on.
          c: float32[B, C] conditioning (already passed through SiLU), or
            float32[B, G, C], one for each of G equal groups of positions.
          positions: int[L] rotary positions (default 0 .. L - 1; ignored with decode).
          mask: bool[L, L] attention mask, True = attend (default: none, or
            causal); with context bool[L, S], the context positions each
            query sees, or bool[L, S + L], what each query sees of the
            context and of the chunk (any block: ``sedd.spec``'s calls);
            not with decode.
          context: (keys, values), each [B, S, N, K]: S positions of another
            call (``run``'s rotary-embedded keys and values, their rotary
            positions kept). Each query then sees its own unit of block_size
            positions of x (a block-causal block only; L a multiple of
            block_size) and the context positions of mask, as in
            ``sedd.block``'s forward over [x_t ; x_0]
            (``kernels.unit_context_attention``); not with decode.
          decode: write this chunk's keys and values into the cache and attend
            over it (causal or block-causal blocks only; see `_attend_cache`).
          commit: with decode, keep this chunk in the cache and advance its
            index by L; False scores the chunk against the cache and leaves
            the cache as it was (a block still being denoised); an int n
            keeps the first n positions only.
          deterministic: disable dropout; None follows the module's train/eval mode.
          rngs: optional 'dropout' keys overriding the stored stream.
        Returns:
          float32[B, L, H].
        """
        return self.run(x, c, positions=positions, mask=mask, context=context, decode=decode, commit=commit,
                        deterministic=deterministic, rngs=rngs)[0]

    def _write(self, held: Array, new: Array, at: Array) -> Array:
        """new [B N, L, K] into the cache held [B N, S, K] at rows at .. at + L - 1, in place; at int32[] or
        int32[B] (each sequence's own rows: one write a sequence, its heads together, up to
        ``ROW_WRITES`` sequences; past that one scatter, which a program of B writes would outgrow)."""
        if jnp.ndim(at) == 0:
            return jax.lax.dynamic_update_slice(held, new, (0, at, 0))
        b, n = jnp.shape(at)[0], self.n_heads
        if b > ROW_WRITES:
            write = jax.vmap(lambda h, x, a: jax.lax.dynamic_update_slice(h, x, (0, a, 0)))
            return write(held.reshape(b, n, *held.shape[1:]), new.reshape(b, n, *new.shape[1:]), at).reshape(
                held.shape)
        for i in range(b):
            held = jax.lax.dynamic_update_slice(held, new[i * n:(i + 1) * n], (i * n, at[i], 0))
        return held

    def run(
        self,
        x: Array,
        c: Array,
        *,
        positions: Array | None = None,
        mask: Array | None = None,
        context: tuple[Array, Array] | None = None,
        decode: bool = False,
        commit: bool | int = True,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | None = None,
        at: Array | None = None,
    ) -> tuple[Array, tuple[Array, Array]]:
        """The block's output (``__call__``'s, same arguments) and this chunk's keys and values.

        With `at` (int32[]), `context` is a decoding cache (keys, values),
        each [B N, S, K] (batch and heads grouped, then rows), that the caller
        holds (any block: ``sedd.spec``'s rounds, ``sedd.kinds.ar``'s
        decoding): the chunk's keys and values are written into rows at .. at
        + L - 1, in place, and each query attends over the S rows as mask
        bool[L, S] says (``kernels.cache_attention``). Nothing of the S rows
        is concatenated, transposed or copied at the call. With at int32[B]
        each sequence's rows go to its own place (one write a sequence, its
        mask bool[B, L, S]): under ``jax.vmap`` such a write is a scatter,
        around which XLA's CPU compiler copied the cache at every write.

        Returns:
          (float32[B, L, H], (keys, values)): the keys rotary-embedded, both
          [B, L, N, K] as attention reads them: what a later call takes as its
          `context` (``sedd.block``'s bound runs the clean text once so); with
          `at`, the whole cache after the write, [B N, S, K] each.
        """
        if at is not None and (context is None or decode or mask is None):
            raise ValueError("at= writes into a decoding cache given as context, read as a mask over its rows "
                             "says, and no decoding cache")
        units = self.block_size and x.shape[1] % self.block_size == 0
        if context is not None and at is None and (decode or not units):
            raise ValueError("an external context needs a block-causal block (block_size dividing the chunk's "
                             "length) or a cache to write into (at=), and no decoding cache")
        b, l, h = x.shape
        mod = per_position(self.adaLN_modulation(c).astype(jnp.float32), l)  # (B, 6H) or (B, L, 6H)
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = jnp.split(mod, 6, axis=-1)

        y = modulate(self.norm1(x.astype(jnp.float32)), shift_a, scale_a)  # (B, L, H)
        qkv = self.attn_qkv(y.astype(self.dtype))  # (B, L, 3H)
        qkv = qkv.reshape(b, l, 3, self.n_heads, self.head_dim)  # (B, L, 3, N, K)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (B, L, N, K) each
        if decode:
            pos = self._cache_start(b) + jnp.arange(l)  # (L,)
        else:
            pos = np.arange(l) if positions is None else positions  # numpy when known at trace time
        q = apply_rotary(q, pos)  # (B, L, N, K)
        k = apply_rotary(k, pos)  # (B, L, N, K)
        if decode:
            att = self._attend_cache(q.astype(self.dtype), k.astype(self.dtype), v.astype(self.dtype), pos, commit)
        elif context is None:
            att = kernels.mixed_attention(q, k, v, self.causal, self.dtype, mask=mask)  # (B, L, N, K), float32
        elif at is not None:  # the chunk's rows written into the caller's cache, then the cache read as mask says
            grouped = lambda a: jnp.swapaxes(a, 1, 2).reshape(b * self.n_heads, l, self.head_dim)  # noqa: E731
            held_dtype = context[0].dtype  # the attention's products: in the cache's dtype (``DDiT.empty_cache``)
            k, v = (self._write(held, grouped(new).astype(held.dtype), at) for held, new in zip(context, (k, v)))
            if jnp.ndim(mask) == 3:  # a mask a sequence, (B, L, S): the same for its heads
                mask = jnp.broadcast_to(mask[:, None], (b, self.n_heads, *mask.shape[1:])).reshape(
                    b * self.n_heads, *mask.shape[1:])
            att = kernels.cache_attention(grouped(q), k, v, mask, held_dtype)  # (B N, L, K)
            att = jnp.swapaxes(att.reshape(b, self.n_heads, l, self.head_dim), 1, 2)  # (B, L, N, K)
        else:  # its own unit of the chunk and the context's positions of mask
            att = kernels.unit_context_attention(q, k, v, context, self.block_size, mask, self.dtype)  # (B, L, N, K)
        att = self.attn_out(att.reshape(b, l, h))  # (B, L, H)
        att = self.dropout1(att, deterministic=deterministic, rngs=rngs).astype(jnp.float32)
        x = x + broadcast_positions(gate_a) * att  # (B, L, H)

        y = modulate(self.norm2(x), shift_m, scale_m)  # (B, L, H)
        y = self.mlp_in(y.astype(self.dtype))  # (B, L, mlp_ratio H)
        y = self.mlp_out(jax.nn.gelu(y, approximate=True))  # (B, L, H)
        y = self.dropout2(y, deterministic=deterministic, rngs=rngs).astype(jnp.float32)
        return x + broadcast_positions(gate_m) * y, (k, v)  # (B, L, H), ((B, L, N, K), (B, L, N, K))

    def _cache_start(self, batch: int) -> Array:
        """The position of the first new row: int32[] (trace-time checks first)."""
        if self.block_size is None:
            raise ValueError("decode needs a causal or block-causal block: with full attention every "
                             "position sees later ones, which no cache holds.")
        if self.cache_index is None:
            raise ValueError("no decoding cache: call init_cache(batch, max_len) first.")
        if self.cached_key.shape[0] != batch:
            raise ValueError(f"the cache holds batch {self.cached_key.shape[0]}, the input {batch}.")
        return self.cache_index[...]

    def _attend_cache(self, q: Array, k: Array, v: Array, pos: Array, commit: bool | int) -> Array:
        """Writes k, v into the cache at rows pos mod S and attends over it, (block-)causally, in a window.

        The cache is a ring of S = W + u rows (W the window, u = block_size
        the decoding unit, 1 for a causal block): position p lives in row
        p mod S, so past S the newest positions overwrite the oldest, and the
        absolute positions may pass S (rotary scores depend on position
        differences only). A query at position p in the unit starting at
        s = u floor(p / u) sees a held position r when

            floor(r / u) <= floor(p / u)      its own unit and earlier ones (causal: r <= p),
            r >= s + u - W                    the last W positions up to its unit's end,

        so a unit sees the W - u positions before it, whatever else the chunk
        holds: a chunk of two units (the clean block committed and the next
        one scored in one call, ``sedd.block``) gives each unit the context it
        has alone, which is what the extra u rows are for.

        Args:
          q, k: [B, L, N, K] rotary-embedded queries and keys, compute dtype.
          v: [B, L, N, K] values.
          pos: int32[L] consecutive positions from the cache index.
          commit: store the chunk's rows and advance the index past pos (True);
            False leaves the cache as it was; an int n stores the first n rows
            and advances the index by n.
        Returns:
          [B, L, N, K] attention output.
        """
        size, l = self.cached_key.shape[1], pos.shape[0]
        if l > size:
            raise ValueError(f"a decoded chunk of {l} positions exceeds the cache's {size} rows "
                             f"(a window of {size - self.block_size} and one unit of {self.block_size})")
        unit = self.block_size
        window = size - unit
        rows_new = pos % size  # (L,) the chunk's rows (a chunk may wrap around the ring's end)
        keys = self.cached_key[...].at[:, rows_new].set(k)  # (B, S, N, K)
        values = self.cached_value[...].at[:, rows_new].set(v)  # (B, S, N, K)
        keep = l if commit is True else int(commit)
        if keep == l:
            self.cached_key[...], self.cached_value[...] = keys, values
        elif keep:
            self.cached_key[...] = self.cached_key[...].at[:, rows_new[:keep]].set(k[:, :keep])
            self.cached_value[...] = self.cached_value[...].at[:, rows_new[:keep]].set(v[:, :keep])
        if keep:
            self.cache_index[...] = pos[keep - 1] + 1
        last = pos[-1]
        held = last - (last - jnp.arange(size)) % size  # (S,) the position in each row; < 0: never written
        own = pos // unit  # (L,)
        visible = ((held[None, :] >= 0) & (held[None, :] // unit <= own[:, None])
                   & (held[None, :] >= (own[:, None] + 1) * unit - window))  # (L, S)
        return jax.nn.dot_product_attention(q, keys, values, mask=visible[None, None])  # (B, L, N, K)

