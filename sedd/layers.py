"""The pieces of the DDiT (``sedd.model``): embeddings of sigma and of position, adaLN, its layers.

  timestep_embedding, TimestepEmbedder   sigma -> sinusoidal(F) -> Linear -> SiLU -> Linear (DiT)
  apply_rotary                           rotary position embedding (Su et al. 2021, RoFormer)
  modulate, per_position,                adaLN (Peebles & Xie 2023): x (1 + scale) + shift, one
    broadcast_positions                  value a sequence or one a group of positions
  linear, layer_norm, partitioned,       float32-parameter layers initialised as the original's
    padded                               torch defaults, with logical axis names on their
                                         parameters (their list: ``sedd.model``)
  FinalLayer                             LayerNorm, adaLN and the zero-initialised projection to D

The transformer layer built from them is ``sedd.ddit_layer.DDiTLayer``; the
network, ``sedd.model.DDiT``. Precision, as there: parameters float32, the
matmuls in the compute dtype, LayerNorm, adaLN and the sigma embedding float32.

Shape letters used in this module:
  B batch, L sequence length, H hidden size, N attention heads, K head dim,
  C conditioning width, F sinusoidal frequency features (256), D output width,
  G groups of positions with a noise level each, X any feature width.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sedd import kernels

Array = jax.Array

# Width of the sinusoidal sigma embedding, as in the original.
FREQ_DIM = 256
# Rotary base of RoFormer (Su et al. 2021) and of the original.
ROTARY_BASE = 10000.0
# LayerNorm epsilon of torch's F.layer_norm default, which the original uses.
LN_EPS = 1e-5


def padded(n: int, multiple: int) -> int:
    """n rounded up to a multiple of `multiple`: the rows of a vocabulary table a mesh axis can split."""
    return -(-n // multiple) * multiple


def partitioned(init, names: tuple[str | None, ...]):
    """`init` with logical axis names (one a dimension, or None) as `out_sharding` metadata, not sharded eagerly.

    Eager sharding would need a mesh at construction time; as metadata the same model builds unsharded on
    one CPU and is placed on a mesh later by `jax.jit(..., out_shardings=...)`.
    """
    return nnx.with_partitioning(init, names, eager_sharding=False)


# torch's default nn.Linear / nn.Embedding-with-kaiming_uniform(a=sqrt(5)) init,
# U(-1/sqrt(fan_in), 1/sqrt(fan_in)), whose variance is 1 / (3 fan_in); the
# original DDiT uses it everywhere it does not zero-initialise.
_torch_like = nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")
_zeros = nnx.initializers.zeros_init()
_ones = nnx.initializers.ones_init()


def linear(
    n_in: int,
    n_out: int,
    names: tuple[str | None, str],
    *,
    use_bias: bool = True,
    zero: bool = False,
    dtype: Any = jnp.float32,
    rngs: nnx.Rngs,
) -> nnx.Linear:
    """A float32-parameter Linear layer with logical axis names on its kernel and bias.

    The kernel starts as torch's default nn.Linear init (the original's), or
    at zero with `zero` (the adaLN-Zero and output layers); the bias at zero.
    names: the kernel's (input, output) logical axis names; the bias takes the output's.
    """
    # Below float32: multiply in dtype, accumulate and return float32 (kernels.mixed_einsum).
    return nnx.Linear(
        n_in,
        n_out,
        use_bias=use_bias,
        dtype=dtype,
        param_dtype=jnp.float32,
        **kernels.linear_kwargs(dtype),
        kernel_init=partitioned(_zeros if zero else _torch_like, names),
        bias_init=partitioned(_zeros, (names[1],)),
        rngs=rngs,
    )


def layer_norm(h: int, rngs: nnx.Rngs) -> nnx.LayerNorm:
    """Weight-only LayerNorm over h = H features in float32 (the original has no bias), its scale named "embed"."""
    return nnx.LayerNorm(
        h,
        epsilon=LN_EPS,
        use_bias=False,
        use_scale=True,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        scale_init=partitioned(_ones, ("embed",)),
        rngs=rngs,
    )


def modulate(x: Array, shift: Array, scale: Array) -> Array:
    """adaLN modulation of Peebles & Xie 2023: x (1 + scale) + shift, x float[B, L, H], shift and scale
    float[B, H] or float[B, L, H] (``per_position``). The identity at shift = scale = 0, so a zero-initialised
    adaLN layer starts every layer as a plain pre-LN layer."""
    return x * (1.0 + broadcast_positions(scale)) + broadcast_positions(shift)


def broadcast_positions(a: Array) -> Array:
    """One adaLN value a sequence, float[B, X], as float[B, 1, X]; one a position, float[B, L, X], as it is."""
    return a[:, None, :] if a.ndim == 2 else a


def per_position(mod: Array, length: int) -> Array:
    """Conditioning outputs of G groups, float[B, G, X], repeated over each group's length / G positions.

    The noise groups of ``DDiT.network_output``: group g covers positions
    [g length / G, (g + 1) length / G). float[B, X] (one group) stays as it is.
    Returns float[B, X] or float[B, length, X].
    """
    if mod.ndim == 2:
        return mod
    b, groups, width = mod.shape
    # A broadcast XLA fuses into its consumers; jnp.repeat's gather was materialised (B, L, 6H) at every layer.
    return jnp.broadcast_to(mod[:, :, None, :], (b, groups, length // groups, width)).reshape(b, length, width)


def timestep_embedding(sigma: Array, dim: int = FREQ_DIM, max_period: float = 10000.0) -> Array:
    """Sinusoidal embedding of the noise level (DiT's timestep embedding).

    emb = [cos(sigma w_0), ..., cos(sigma w_{F/2-1}), sin(sigma w_0), ..., sin(sigma w_{F/2-1})],
    w_k = max_period^{-k / (F/2)}; cos comes before sin, as in the original. sigma float[B] -> float32[B, F].
    """
    half = dim // 2
    freqs = jnp.exp(-math.log(max_period) * jnp.arange(half, dtype=jnp.float32) / half)  # (F/2,)
    args = sigma.astype(jnp.float32)[:, None] * freqs[None, :]  # (B, F/2)
    return jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)  # (B, F)


def apply_rotary(x: Array, positions: Array, base: float = ROTARY_BASE) -> Array:
    """Rotary position embedding (Su et al. 2021, RoFormer), half-split layout.

    Channel j is paired with channel j + K/2 and the pair is rotated by the angle
    p theta_j, theta_j = base^{-2j/K}, at position p:
      (x_j, x_{j+K/2}) -> (x_j cos - x_{j+K/2} sin, x_{j+K/2} cos + x_j sin).
    Because R(m)^T R(n) = R(n - m), the score <R(m) q, R(n) k> depends on the
    positions only through n - m. The half-split layout (rather than interleaved
    pairs) matches the original's weights. x: float[B, L, N, K]; positions: [L]
    or [B, L] (each sequence's own).
    """
    k = x.shape[-1]
    half = k // 2
    # Positions known at trace time (training, evaluation, a sampler's steps) give a
    # constant table: XLA would otherwise fuse cos and sin into the rotation and
    # compute them again for every (B, N) element (docs/benchmarks.md, float32 step).
    xp = np if isinstance(positions, np.ndarray) else jnp
    inv_freq = 1.0 / (base ** (xp.arange(half, dtype=np.float32) * np.float32(2.0) / np.float32(k)))  # (K/2,)
    angles = xp.asarray(positions).astype(np.float32)[..., None] * inv_freq  # ([B,] L, K/2)
    cos = xp.cos(angles)[..., None, :]  # ([B,] L, 1, K/2)
    sin = xp.sin(angles)[..., None, :]  # ([B,] L, 1, K/2)
    x = x.astype(jnp.float32)
    x1, x2 = x[..., :half], x[..., half:]  # (B, L, N, K/2) each
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # (B, L, N, K)


class TimestepEmbedder(nnx.Module):
    """sigma -> cond: sinusoidal(F) -> Linear(F, C = cond_dim) -> SiLU -> Linear(C, C)."""

    def __init__(self, cond_dim: int, *, rngs: nnx.Rngs):
        # float32 whatever the model's compute dtype: the original computes the
        # conditioning outside its bfloat16 autocast.
        self.fc1 = linear(FREQ_DIM, cond_dim, ("freq", "cond"), dtype=jnp.float32, rngs=rngs)
        # One logical name per spec: a mesh axis may shard only one dimension.
        self.fc2 = linear(cond_dim, cond_dim, (None, "cond"), dtype=jnp.float32, rngs=rngs)

    def __call__(self, sigma: Array) -> Array:
        """Args: sigma float[B]. Returns: float32[B, C]."""
        h = self.fc1(timestep_embedding(sigma))  # (B, C)
        return self.fc2(jax.nn.silu(h))  # (B, C)


class FinalLayer(nnx.Module):
    """LayerNorm, adaLN (shift, scale) and a zero-initialised projection from H to D = out_dim (its columns
    ``padded`` to vocab_multiple; the output has D)."""

    def __init__(
        self,
        hidden_size: int,
        out_dim: int,
        cond_dim: int,
        *,
        dtype: Any = jnp.float32,
        vocab_multiple: int = 1,
        rngs: nnx.Rngs,
    ):
        self.out_dim = out_dim
        self.norm_final = layer_norm(hidden_size, rngs)
        self.adaLN_modulation = linear(cond_dim, 2 * hidden_size, ("cond", "adaln"), zero=True, dtype=dtype, rngs=rngs)
        # Zero init: the network starts with output 0, so the log-score starts at
        # the scale-by-sigma prior alone (see DDiT.__call__).
        # Padded to a multiple of vocab_multiple columns so a mesh axis can split them;
        # the padding is sliced off the output, so its columns get no gradient and stay 0.
        self.linear = linear(
            hidden_size, padded(out_dim, vocab_multiple), ("embed", "vocab"), zero=True, dtype=dtype, rngs=rngs
        )
        self.dtype = dtype

    def __call__(self, x: Array, c: Array) -> Array:
        """Args: x float32[B, L, H]; c float32[B, C] or [B, G, C] (groups). Returns: float32[B, L, D]."""
        mod = per_position(self.adaLN_modulation(c).astype(jnp.float32), x.shape[1])  # (B, 2H) or (B, L, 2H)
        shift, scale = jnp.split(mod, 2, axis=-1)
        y = modulate(self.norm_final(x.astype(jnp.float32)), shift, scale)  # (B, L, H)
        out = self.linear(y.astype(self.dtype)).astype(jnp.float32)  # (B, L, D padded)
        return out[..., : self.out_dim] if out.shape[-1] != self.out_dim else out  # (B, L, D)
