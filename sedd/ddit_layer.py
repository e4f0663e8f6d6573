"""DDiTLayer: one adaLN-Zero transformer layer of the DDiT (the original's DDiTBlock; Peebles & Xie 2023).

  x += gate_a * Drop(Attn(modulate(LN(x), shift_a, scale_a)))     rotary self-attention
  x += gate_m * Drop(MLP (modulate(LN(x), shift_m, scale_m)))     GELU MLP

with (shift, scale, gate) x 2 from a zero-initialised Linear of the
conditioning c. The attention reads its keys and values from one of three
places (``run``): the chunk itself (training, a full pass), a decoding cache
the caller holds (the chunk's rows written into it first; ``sedd.model``
says why there is one cache), or a clean context that is read, never written
(block diffusion's bound). The layers it is built from are in
``sedd.layers``; the network that stacks it, ``sedd.model.DDiT``.

Shape letters used in this module:
  B batch, L sequence length (a chunk's), H hidden size, N attention heads,
  K head dim (H = N K), C conditioning width, G groups of positions with a
  noise level each, S rows of a decoding cache or a context.
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
"""``DDiTLayer.run``'s writes at a place a sequence: one write each up to this many sequences, a scatter past it."""


class DDiTLayer(nnx.Module):
    """One adaLN-modulated transformer layer (Peebles & Xie 2023), rotary attention.

    Args:
      hidden_size: H.
      n_heads: N; K = H / N must be even for rotary.
      cond_dim: C.
      mlp_ratio: MLP hidden width as a multiple of H.
      dropout: dropout rate on both residual branches.
      causal: causal self-attention (for an autoregressive baseline).
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

    def __call__(self, x: Array, c: Array, **kwargs) -> Array:
        """The layer's output float32[B, L, H] (``run``'s first value, the same arguments)."""
        return self.run(x, c, **kwargs)[0]

    def _write(self, held: Array, new: Array, at: Array | None, positions) -> Array:
        """new [B N, L, K] into the cache held [B N, S, K], in place: at rows at .. at + L - 1, at int32[] or
        int32[B] (each sequence's own rows: one write a sequence, its heads together, up to ``ROW_WRITES``
        sequences; past that one scatter, which a program of B writes would outgrow); at None: position p
        to row p mod S (a ring), positions int[L]."""
        if at is None:
            if new.shape[1] > held.shape[1]:
                raise ValueError(f"a chunk of {new.shape[1]} positions exceeds the ring cache's {held.shape[1]} rows")
            return held.at[:, jnp.asarray(positions) % held.shape[1]].set(new)
        if jnp.ndim(at) == 0:
            return jax.lax.dynamic_update_slice(held, new, (0, at, 0))
        b, n = jnp.shape(at)[0], self.n_heads
        if b > ROW_WRITES:
            write = jax.vmap(lambda h, x, a: jax.lax.dynamic_update_slice(h, x, (0, a, 0)))
            return write(held.reshape(b, n, *held.shape[1:]), new.reshape(b, n, *new.shape[1:]), at).reshape(held.shape)
        for i in range(b):
            held = jax.lax.dynamic_update_slice(held, new[i * n : (i + 1) * n], (i * n, at[i], 0))
        return held

    def run(
        self,
        x: Array,
        c: Array,
        *,
        positions: Array | None = None,
        mask: Array | None = None,
        cache: tuple[Array, Array] | None = None,
        at: Array | None = None,
        context: tuple[Array, Array] | None = None,
        unit: int | None = None,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> tuple[Array, tuple[Array, Array]]:
        """The layer's output and the keys and values its attention read.

        Args:
          x: float32[B, L, H] residual stream.
          c: float32[B, C] conditioning (already passed through SiLU), float32[B, G, C], one for each of G
            equal groups of positions, or float32[1, C], one for the batch.
          positions: int[L] (or int[B, L] with a cache) rotary positions, default 0 .. L - 1.
          mask: bool attention mask, True = attend: [L, L] over the chunk (default: none, or causal);
            with a cache [L, S] or [B, L, S] over its rows after the write; with a context [L, S].
          cache: a decoding cache the caller holds, (keys, values) each [B N, S, K] (batch and heads
            grouped, then rows: as the attention reads it). The chunk's rotary-embedded keys and values
            are written into it in place (``_write``: at rows at .., or by position on a ring), then each
            query attends over the S rows as mask says (``kernels.cache_attention``). Nothing of the S
            rows is concatenated, transposed or copied at the call.
          at: with a cache, the chunk's first row: int32[], or int32[B] (each sequence its own place,
            rows at different lengths); None: position p to row p mod S.
          context: a clean context read and never written, (keys, values) each [B, S, N, K] (a
            ``run``'s own keys and values): each query sees its own unit of `unit` positions of the
            chunk (L a multiple of unit) and the context rows of mask (``kernels.unit_context_attention``:
            block diffusion's bound, whose noisy blocks never see each other).
          deterministic: disable dropout; None follows the module's train/eval mode.
          rngs: optional 'dropout' keys overriding the stored stream.
        Returns:
          (float32[B, L, H], (keys, values)): without a cache the chunk's keys (rotary-embedded) and
          values [B, L, N, K], what a later call takes as its context; with a cache, the cache after
          the write.
        """
        if cache is not None and mask is None:
            raise ValueError("a decoding cache is read as a mask over its rows says: give mask")
        if context is not None and not (unit and x.shape[1] % unit == 0 and mask is not None):
            raise ValueError(
                "a context is read by units of positions: give unit dividing the chunk's length "
                "and a mask over the context"
            )
        b, l, h = x.shape
        mod = per_position(self.adaLN_modulation(c).astype(jnp.float32), l)  # (B, 6H) or (B, L, 6H)
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = jnp.split(mod, 6, axis=-1)

        y = modulate(self.norm1(x.astype(jnp.float32)), shift_a, scale_a)  # (B, L, H)
        qkv = self.attn_qkv(y.astype(self.dtype))  # (B, L, 3H)
        qkv = qkv.reshape(b, l, 3, self.n_heads, self.head_dim)  # (B, L, 3, N, K)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (B, L, N, K) each
        pos = np.arange(l) if positions is None else positions  # numpy when known at trace time
        q = apply_rotary(q, pos)  # (B, L, N, K)
        k = apply_rotary(k, pos)  # (B, L, N, K)
        if cache is not None:  # the chunk's rows written into the caller's cache, then the cache read as mask says
            grouped = lambda a: jnp.swapaxes(a, 1, 2).reshape(b * self.n_heads, l, self.head_dim)  # noqa: E731
            held_dtype = cache[0].dtype  # the attention's products: in the cache's dtype (``DDiT.empty_cache``)
            k, v = (self._write(held, grouped(new).astype(held.dtype), at, pos) for held, new in zip(cache, (k, v)))
            if jnp.ndim(mask) == 3:  # a mask a sequence, (B, L, S): the same for its heads
                mask = jnp.broadcast_to(mask[:, None], (b, self.n_heads, *mask.shape[1:])).reshape(
                    b * self.n_heads, *mask.shape[1:]
                )
            att = kernels.cache_attention(grouped(q), k, v, mask, held_dtype)  # (B N, L, K)
            att = jnp.swapaxes(att.reshape(b, self.n_heads, l, self.head_dim), 1, 2)  # (B, L, N, K)
        elif context is not None:  # its own unit of the chunk and the context's positions of mask
            att = kernels.unit_context_attention(q, k, v, context, unit, mask, self.dtype)  # (B, L, N, K)
        else:
            att = kernels.mixed_attention(q, k, v, self.causal, self.dtype, mask=mask)  # (B, L, N, K), float32
        att = self.attn_out(att.reshape(b, l, h))  # (B, L, H)
        att = self.dropout1(att, deterministic=deterministic, rngs=rngs).astype(jnp.float32)
        x = x + broadcast_positions(gate_a) * att  # (B, L, H)

        y = modulate(self.norm2(x), shift_m, scale_m)  # (B, L, H)
        y = self.mlp_in(y.astype(self.dtype))  # (B, L, mlp_ratio H)
        y = self.mlp_out(jax.nn.gelu(y, approximate=True))  # (B, L, H)
        y = self.dropout2(y, deterministic=deterministic, rngs=rngs).astype(jnp.float32)
        return x + broadcast_positions(gate_m) * y, (k, v)  # (B, L, H), the keys and values read
