"""DDiT: the diffusion transformer of SEDD (Lou, Meng & Ermon 2024), in Flax NNX.

The network maps a noisy sequence x_t and its total noise sigma to a log-score,
log s_theta(x_t, sigma)[l, y] ~ log p_sigma(x_t with position l set to y)
                                   - log p_sigma(x_t),
so the entry at the current token is 0 (ratio 1) by construction.

Architecture (Sec. 5 / App. C of Lou et al. 2024), a DiT (Peebles & Xie 2023,
"Scalable Diffusion Models with Transformers") conditioned on sigma through
adaptive LayerNorm (adaLN), with rotary position embeddings (Su et al. 2021,
"RoFormer") in place of learned positions:

  tokens -> Embed -> [DDiTLayer] x n_layers -> FinalLayer -> log-score post-processing
  sigma  -> sinusoidal(256) -> Linear -> SiLU -> Linear -> SiLU = cond c
  each layer: x += gate_a * Drop(Attn(modulate(LN(x), shift_a, scale_a)))
              x += gate_m * Drop(MLP (modulate(LN(x), shift_m, scale_m)))

The pieces are ``sedd.layers`` and ``sedd.ddit_layer``; the masks of a kind's
attention are its own module's. docs/model.md gives the precision policy, the
decoding cache (one, held by the caller: ``empty_cache``, ``output_in_cache``,
``ring_mask``; and why) and the logical axis names the parameters carry.

Shapes: B batch, L length, H hidden size, N heads, K head dim (H = N K), C
conditioning width, G groups of positions with a noise level each, V
vocabulary size, D output width `out_dim`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from sedd import kernels
from sedd.ddit_layer import REMAT_POLICIES, DDiTLayer, cache_attention, context_attention, scan_layers, self_attention
from sedd.graphs import log_expm1  # one stable log(e^sigma - 1) for the package
from sedd.layers import FinalLayer, TimestepEmbedder, broadcast_positions, padded, partitioned
from sedd.sharding import constrain_rows

Array = jax.Array


def ring_mask(positions: Array, slots: int, window: int, unit: int = 1) -> Array:
    r"""What each position of a chunk sees of a ring cache of `slots` slots, a sliding window: bool[L, S].

    On a ring (``DDiT.output_in_cache`` with at None) position p lives in row
    p mod S, so past S slots the newest positions overwrite the oldest (rotary
    scores depend on position differences only, so positions may pass S).
    After the chunk's write, with `last` its last position, slot r holds
    position last - ((last - r) mod S) (< 0: never written). A query at
    position p of the unit starting at s = u floor(p / u) sees a held position r when

        floor(r / u) <= floor(p / u)      its own unit and earlier ones (u = 1: causal),
        r >= s + u - W                    the last W positions up to its unit's end,

    so a unit sees the W - u positions before it whatever else the chunk holds:
    a chunk of two units (block diffusion's commit of a clean block with the
    next one's first score) gives each the context it has alone, which needs
    S >= W + u slots.

    Args:
      positions: int[L] the chunk's consecutive positions; slots: S; window: W; unit: u.
    """
    positions = jnp.asarray(positions)
    last = positions.max()
    held = last - (last - jnp.arange(slots)) % slots  # (S,) the position in each slot
    own = positions // unit  # (L,)
    return (
        (held[None, :] >= 0)
        & (held[None, :] // unit <= own[:, None])
        & (held[None, :] >= (own[:, None] + 1) * unit - window)
    )  # (L, S)


def check_remat(remat: str) -> None:
    """Raise ValueError unless `remat` names one of ``REMAT_POLICIES`` (model.remat, checked before any work)."""
    if remat not in REMAT_POLICIES:
        raise ValueError(f"remat={remat!r} must be one of {', '.join(map(repr, REMAT_POLICIES))}.")


class DDiT(nnx.Module):
    """SEDD's diffusion transformer: (x_t int32[B, L], sigma float[B]) -> log-score float32[B, L, D].

    Args:
      num_tokens: rows of the embedding table, the ids an input may hold.
      out_dim, hidden_size, n_heads, cond_dim: D, H, N, C (H divisible by N, K = H / N even: rotary pairs channels).
      n_layers: number of transformer layers (DDiTLayer; the original's DDiTBlocks).
      mlp_ratio: MLP hidden width as a multiple of H.
      dropout: dropout rate on the residual branches (active only in training).
      max_len: longest accepted sequence. Rotary needs no table; the check catches
        configuration mistakes at trace time.
      scale_by_sigma: subtract the absorbing graph's prior log(e^sigma - 1) +
        log(D - 1) from the output (SEDD Sec. 5 / App. C.1, "scale by sigma");
        for the absorbing graph only.
      causal: causal self-attention (autoregressive baseline).
      time_conditioning: if False there is no sigma embedding and the adaLN layers
        read a zero conditioning vector, so their outputs are their (learned)
        biases: shift, scale and gate become learned per-channel constants and the
        layers are plain pre-LN layers. sigma may then be None (it is still
        required when scale_by_sigma applies).
      normalize: the network predicts a distribution over the clean token (the
        mean parameterization: MDLM's SUBS and RADD with scale_by_sigma, UDLM's
        and DUO's without); ``log_score`` turns it into the score.
      dtype: compute dtype (bfloat16 on accelerators); parameters are float32.
      vocab_multiple: the embedding's rows and the output projection's columns
        are rounded up to a multiple of this (``padded``), so that ``tensor``
        or ``fsdp`` can split them; the padding is never looked up and sliced
        off the output, so everything downstream sees D.
      remat: what a layer's backward pass keeps of its forward pass, a key of
        ``REMAT_POLICIES``.
      rngs: nnx.Rngs with 'params' and 'dropout' streams (or default).
    """

    def __init__(
        self,
        *,
        num_tokens: int,
        out_dim: int,
        hidden_size: int,
        n_layers: int,
        n_heads: int,
        cond_dim: int = 128,
        mlp_ratio: int = 4,
        dropout: float = 0.1,
        max_len: int = 1024,
        scale_by_sigma: bool = False,
        causal: bool = False,
        time_conditioning: bool = True,
        normalize: bool = False,
        dtype: Any = jnp.float32,
        vocab_multiple: int = 1,
        remat: str = "none",
        rngs: nnx.Rngs,
    ):
        if hidden_size % n_heads != 0:
            raise ValueError(f"hidden_size={hidden_size} must be divisible by n_heads={n_heads}.")
        head_dim = hidden_size // n_heads
        if head_dim % 2 != 0:
            raise ValueError(
                f"head_dim = hidden_size / n_heads = {hidden_size} / {n_heads} = {head_dim} "
                "must be even: rotary embedding rotates channel pairs."
            )
        if num_tokens < 1 or out_dim < 1:
            raise ValueError(f"num_tokens={num_tokens} and out_dim={out_dim} must be >= 1.")
        if scale_by_sigma and out_dim < 2:
            raise ValueError(f"scale_by_sigma takes log(out_dim - 1); out_dim={out_dim} must be >= 2.")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout} must be in [0, 1).")
        if not (isinstance(vocab_multiple, int) and vocab_multiple >= 1):
            raise ValueError(f"vocab_multiple={vocab_multiple!r} must be an integer >= 1 (1: no padding).")
        check_remat(remat)

        self.num_tokens = num_tokens
        self.out_dim = out_dim
        self.hidden_size = hidden_size
        self.n_heads = n_heads
        self.max_len = max_len
        self.scale_by_sigma = scale_by_sigma
        self.causal = causal
        self.time_conditioning = time_conditioning
        self.normalize = normalize
        self.cond_dim = cond_dim
        self.dtype = dtype
        self.remat = remat

        # Scaled like torch's kaiming_uniform on the [num_tokens, H] table
        # (fan_in = H), as in the original.
        emb_init = nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform", in_axis=-1, out_axis=-2)
        self.vocab_embed = nnx.Embed(
            padded(num_tokens, vocab_multiple),
            hidden_size,
            dtype=jnp.float32,
            param_dtype=jnp.float32,
            embedding_init=partitioned(emb_init, ("vocab", "embed")),
            rngs=rngs,
        )
        self.sigma_map = TimestepEmbedder(cond_dim, rngs=rngs) if time_conditioning else None
        layer = functools.partial(DDiTLayer, mlp_ratio=mlp_ratio, dropout=dropout, causal=causal, dtype=dtype)
        self.layers = nnx.List([layer(hidden_size, n_heads, cond_dim, rngs=rngs) for _ in range(n_layers)])
        self.output_layer = FinalLayer(
            hidden_size, out_dim, cond_dim, dtype=dtype, vocab_multiple=vocab_multiple, rngs=rngs
        )

    def _check_inputs(self, x: Array, sigma: Array | None, positions) -> None:
        """Trace-time checks of static shapes (values cannot be checked under jit)."""
        if x.ndim != 2:
            raise ValueError(f"x must be 2-D int[B, L]; got shape {x.shape}.")
        if not jnp.issubdtype(x.dtype, jnp.integer):
            raise ValueError(f"x must hold integer token ids; got dtype {x.dtype}.")
        b, l = x.shape
        if positions is None and l > self.max_len:
            raise ValueError(f"sequence length L={l} exceeds max_len={self.max_len}.")
        if positions is not None and jnp.shape(positions) not in ((l,), (b, l)):
            raise ValueError(
                f"positions must have shape [L] = ({l},) or [B, L] = ({b}, {l}); got shape {jnp.shape(positions)}."
            )
        if sigma is None:
            if self.time_conditioning or self.scale_by_sigma:
                raise ValueError(
                    "sigma is None but the model needs it (time_conditioning="
                    f"{self.time_conditioning}, scale_by_sigma={self.scale_by_sigma})."
                )
            return
        shape = jnp.shape(sigma)
        if not (shape == (b,) or (len(shape) == 2 and shape[0] == b and shape[1] >= 1 and l % shape[1] == 0)):
            raise ValueError(
                f"sigma must have shape [B] = ({b},), or [B, G] with G dividing L = {l} "
                f"(a noise level per group of positions); got shape {shape}."
            )

    def network_output(
        self,
        x: Array,
        sigma: Array | None,
        *,
        positions: Array | None = None,
        mask: Array | None = None,
        keep: int | None = None,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | Array | None = None,
    ) -> Array:
        """The raw output of the final layer, before ``log_score`` (a causal LM's next-token logits).

        Args:
          x: int[B, L] token ids in [0, num_tokens).
          sigma: float[B] total noise, or float[B, G]: G groups of L / G
            consecutive positions, each with its own noise (the blocks of a
            block-diffusion model); or None when not time-conditioned.
          positions: int[L] rotary positions (default 0 .. L - 1); with them
            L may exceed max_len (the [x_t ; x_0] input of ``sedd.kinds.block``).
          mask: bool[L, L] attention mask, True = attend (default: full, or causal).
          keep: only the first `keep` positions go through the final layer
            (with sigma groups, `keep` a multiple of L / G).
          deterministic: disable dropout; None follows the module's train/eval
            mode (eval for a fresh model).
          rngs: dropout keys: an nnx.Rngs or a jax key; None uses the stream given
            at construction.
        Returns:
          float32[B, L, D], or float32[B, keep, D].
        """
        h, c = self.features(
            x, sigma, positions=positions, mask=mask, deterministic=deterministic, rngs=rngs
        )  # (B, L, H), (B, C) or (B, G, C)
        return self.output(h, c, keep)  # (B, L or keep, D)

    def output(self, h: Array, c: Array, keep: int | None = None) -> Array:
        """The final layer on the first `keep` positions of h (all: None), with their groups' conditioning: the
        raw output float32[B, L or keep, D] of ``features``' (h, c)."""
        if keep is not None:
            if c.ndim == 3:
                c = c[:, : keep * c.shape[1] // h.shape[1]]  # the groups of the kept positions
            h = h[:, :keep]
        return self.output_layer(h, c)  # (B, L or keep, D)

    def features(
        self,
        x: Array,
        sigma: Array | None,
        *,
        positions: Array | None = None,
        mask: Array | None = None,
        context: tuple | None = None,
        unit: int | None = None,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | Array | None = None,
    ) -> tuple[Array, Array]:
        """The residual stream after the last layer and the conditioning: what ``output_layer`` reads.

        Arguments as ``network_output``, and context: per layer (keys,
        values) [B, S, N, K] of ``keys_values``, read and never written; each
        query then sees its own unit of `unit` positions of x and the context
        positions of mask, bool[L, S] (``sedd.ddit_layer.context_attention``).
        With ``remat`` the layers run as one scan under ``jax.checkpoint``
        (not with a context: it is inference), their dropout masks of the same
        law as without, other draws.

        Returns:
          (float32[B, L, H], float32[B, C] or float32[B, G, C]).
        """
        if rngs is not None and not isinstance(rngs, nnx.Rngs):
            # One key for all layers would give every dropout the same mask; an Rngs
            # hands each call its own fold of the key.
            rngs = nnx.Rngs(dropout=rngs)
        h, c = self._inputs(x, sigma, positions)  # (B, L, H), (B, C) or (B, G, C)
        attend = functools.partial(self_attention, causal=self.causal, mask=mask, dtype=self.dtype)

        def run(layer, h, rngs, attend=attend):
            return constrain_rows(layer(h, c, attend, positions=positions, deterministic=deterministic, rngs=rngs))

        if context is None and self.remat != "none":
            return scan_layers(self.layers, h, run, REMAT_POLICIES[self.remat], deterministic, rngs), c
        reads = [attend] * len(self.layers)
        if context is not None:
            read = functools.partial(context_attention, unit=unit, mask=mask, dtype=self.dtype)
            reads = [functools.partial(read, context=ctx) for ctx in self._per_layer("context", context)]
        for layer, read in zip(self.layers, reads):
            h = run(layer, h, rngs, read)  # (B, L, H)
        return h, c

    def _per_layer(self, name: str, held: tuple) -> tuple:
        """`held` (a context or a cache: one (keys, values) a layer), checked to hold one for each layer."""
        if len(held) != (n := len(self.layers)):
            raise ValueError(f"{name} holds {len(held)} layers' keys and values, the model has {n} layers")
        return held

    def _inputs(self, x: Array, sigma: Array | None, positions) -> tuple[Array, Array]:
        """What the first layer reads: the embedded tokens float32[B, L, H] and the conditioning
        float32[B, C] or [B, G, C] (after its SiLU).

        Without time conditioning it is zeros float32[1, C], one row for the batch: every row's adaLN
        modulation is its bias, computed once instead of B times, which XLA hoists out of a decoding loop."""
        self._check_inputs(x, sigma, positions)
        h = constrain_rows(self.vocab_embed(x).astype(jnp.float32))  # (B, L, H)
        if self.sigma_map is None:
            return h, jnp.zeros((1, self.cond_dim), jnp.float32)  # (1, C), broadcast over the batch
        sigma = jnp.asarray(sigma)
        return h, jax.nn.silu(self.sigma_map(sigma.reshape(-1))).reshape(*sigma.shape, -1)  # (B, C) or (B, G, C)

    def keys_values(
        self, x: Array, sigma: Array | None, *, positions: Array | None = None, mask: Array | None = None
    ) -> tuple:
        """Every layer's rotary-embedded keys and values of x, dropout off: what ``features``' context reads, per
        layer (keys, values), each [B, L, N, K]."""
        h, c = self._inputs(x, sigma, positions)  # (B, L, H), (B, C) or (B, G, C)
        out = []
        attend = functools.partial(self_attention, causal=self.causal, mask=mask, dtype=self.dtype)
        for layer in self.layers:
            h, kv = layer.run(h, c, attend, positions=positions, deterministic=True)
            h = constrain_rows(h)  # (B, L, H)
            out.append(kv)
        return tuple(out)

    def output_in_cache(
        self,
        x: Array,
        sigma: Array | None,
        *,
        positions: Array,
        mask: Array,
        cache: tuple,
        at: Array | None = None,
        keep: int | None = None,
    ) -> tuple:
        """The output of x written into and run against every layer's decoding cache, dropout off.

        The one decoding path of the network (docs/model.md, "Decoding"): x's
        L keys and values are written in place at slots at .. at + L - 1, or
        with at None each position p at slot p mod S (a ring, ``ring_mask``);
        mask bool[L, S] says what each position sees after the write. Each
        sequence may have its own place: at int32[B], positions [B, L], mask
        [B, L, S]. at + L must not pass S: under jit `at` is traced, and XLA
        moves a write past the end back inside the cache, over other slots.

        Args:
          x: int[B, L]; sigma: as ``network_output``'s.
          positions: int[L] or int[B, L] rotary positions.
          keep: only the first `keep` positions go through the final layer (``network_output``'s).
        Returns:
          (float32[B, L or keep, D], the caches after the write, float32[B, L, H] the residual stream after
          the last layer: what the final layer read, and a draft head reads, ``sedd.kinds.draft_head``).
        """
        self._per_layer("cache", cache)
        h, c = self._inputs(x, sigma, positions)  # (B, L, H), (B, C)
        out = []
        for layer, held in zip(self.layers, cache):
            read = functools.partial(cache_attention, cache=held, at=at, mask=mask, positions=positions)
            h, kv = layer.run(h, c, read, positions=positions, deterministic=True)
            out.append(kv)
        return self.output(h, c, keep), tuple(out), h  # (B, L or keep, D), caches, (B, L, H)

    def empty_cache(self, batch: int, slots: int) -> tuple:
        """Per layer, zero (keys, values) [B N, S = slots, K]: ``output_in_cache``'s cache.

        Float32 on a CPU, whose runtime would convert a bfloat16 cache whole at every step
        (docs/model.md, "Decoding"); the compute dtype elsewhere.
        """
        layer = self.layers[0]
        shape = (batch * layer.n_heads, slots, layer.head_dim)
        dtype = jnp.float32 if jax.default_backend() == "cpu" else self.dtype
        return tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in self.layers)

    def output_chunked(self, h: Array, c: Array, fn, *arrays: Array, chunk: int = 0) -> Array:
        """fn(out, *row_chunks) over the final layer's output `out`, `chunk` positions at a time.

        The fused output projection and loss of a large vocabulary (``sedd.kernels.chunked``): no
        [B, L, D] array is ever live, and the result equals fn(output(h, c), *arrays): float[B, L]. h
        float32[B, L, H] and c float32[B, C] are ``features``'; fn maps (float32[B, Lc, D], *[B, Lc, ...]) to
        float[B, Lc]; arrays and chunk are as ``kernels.chunked``'s.
        """
        if c.ndim != 2:
            raise ValueError(
                f"output_chunked takes one conditioning vector a sequence, c of shape [B, C]; got {c.shape}"
            )
        graphdef, state = nnx.split(self.output_layer)
        return kernels.chunked(
            lambda shared, h, *r: fn(nnx.merge(graphdef, shared[0])(h, shared[1]), *r), chunk, (state, c), h, *arrays
        )

    def __call__(
        self,
        x: Array,
        sigma: Array | None,
        *,
        deterministic: bool | None = None,
        rngs: nnx.Rngs | Array | None = None,
        **attention,
    ) -> Array:
        """Log-score of the reverse process, float32[B, L, D], 0 at the current token: ``log_score`` of the
        ``network_output`` (the same arguments)."""
        out = self.network_output(x, sigma, deterministic=deterministic, rngs=rngs, **attention)  # (B, L, D)
        return self.log_score(out, x, sigma)

    def log_score(self, out: Array, x: Array, sigma: Array | None) -> Array:
        """The log-score of the network output `out` float32[B, L, D] at x int[B, L] and noise sigma.

        sigma is float[B], or float[B, L] (a noise level per position), or
        None when scale_by_sigma does not apply.

        With scale_by_sigma, for the absorbing graph (SEDD Sec. 5, App. C.1):
          log s[l, y] = out[l, y] - log(e^sigma - 1) - log(D - 1),   y != x_l,
        so at initialisation (out = 0) a masked position has
          sum_{y != mask} s[l, y] = 1 / (e^sigma - 1),
        the exact total ratio sum_y p_sigma(y) / p_sigma(mask) at a masked position
        of a data point (whose survival probability is e^-sigma); the network then
        only learns how that mass is shared among tokens. With normalize, out
        over the D - 1 tokens is replaced by log_softmax(out) + log(D - 1), so the
        mass is exactly 1 / (e^sigma - 1) at every step of training, not only at
        initialisation: s[l, y] = p_theta(y | x_t) / (e^sigma - 1), and the score
        entropy at a masked position (``Absorbing.score_entropy``) becomes

          sum_y s_y - r log s_{x0} + K(r) = r (-log p_theta(x0 | x_t)),   r = 1 / (e^sigma - 1),

        the cross-entropy of MDLM's SUBS objective and RADD's lambda-DCE, with the
        same time weight. The mask column is set to -1e9, a finite 'impossible'
        that keeps gradients finite. In every case log s[l, x_l] = 0.

        With normalize and no scale_by_sigma (the uniform graph, forward kernel
        q_sigma(y | z) = alpha [y = z] + (1 - alpha) / D, alpha = e^-sigma),
        w = softmax(out) over all D, and

          log s[l, y] = log xbar_y - log xbar_{x_l},   xbar = D alpha w + 1 - alpha,

        the ratio of the forward marginals with the clean token drawn from w
        (DUO's posterior, UDLM's bound).

        Returns:
          float32[B, L, D] log-score, 0 at the current token.
        """
        d = self.out_dim
        if self.normalize and self.scale_by_sigma:
            tokens = jax.nn.log_softmax(out[..., : d - 1], axis=-1) + math.log(d - 1)  # (B, L, D - 1)
            out = jnp.concatenate([tokens, jnp.full_like(out[..., d - 1 :], -1e9)], axis=-1)  # (B, L, D)
        if self.scale_by_sigma:
            # Computed stably, unlike the original's log(expm1) / exp - 1 switch which
            # is fine in float32 only up to moderate sigma.
            offset = log_expm1(jnp.asarray(sigma)) + math.log(d - 1)  # (B,) or (B, L)
            out = out - broadcast_positions(offset[..., None])  # (B, L, D)
        current = x[..., None] == jnp.arange(d)  # (B, L, D) bool
        if self.normalize and not self.scale_by_sigma:
            out = _uniform_mean_log_score(out, current, broadcast_positions(jnp.asarray(sigma)[..., None]))
        return jnp.where(current, 0.0, out)  # (B, L, D)


def _uniform_mean_log_score(out: Array, current: Array, sigma: Array) -> Array:
    """log xbar_y - log xbar_{x_l}, xbar = D e^-sigma softmax(out) + 1 - e^-sigma (``DDiT.log_score``).

    out float32[B, L, D], current bool[B, L, D] (one-hot of x), sigma [B, 1, 1]
    or [B, L, 1]; computed in log space: log xbar = logaddexp(log D - sigma +
    log w, log(1 - e^-sigma)), finite as sigma -> 0 (then log s = log w_y - log w_x).
    """
    d = out.shape[-1]
    log_w = jax.nn.log_softmax(out.astype(jnp.float32), axis=-1)
    log_xbar = jnp.logaddexp(math.log(d) - sigma + log_w, jnp.log(-jnp.expm1(-sigma)))  # (B, L, D)
    at_x = jnp.sum(jnp.where(current, log_xbar, 0.0), axis=-1, keepdims=True)  # (B, L, 1)
    return log_xbar - at_x


def param_count(model: nnx.Module) -> int:
    """Total number of parameters (nnx.Param leaves) of a model."""
    return sum(int(p.size) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))


def non_embedding_param_count(model: DDiT) -> int:
    """Parameters outside the token embedding and the output projection.

    Both scale with the vocabulary, not with depth or width; excluding both gives
    the "~90M non-embedding" of SEDD-small (12 layers, H = 768).
    """
    return param_count(model) - param_count(model.vocab_embed) - param_count(model.output_layer.linear)
