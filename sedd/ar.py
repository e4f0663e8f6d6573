r"""The autoregressive baseline: DDiT with causal attention and no time input.

The same backbone as the diffusion model (``sedd.model.DDiT`` built with
``causal=True, time_conditioning=False``), trained by the same ``sedd train``
with ``model.kind = "ar"`` on the next-token cross-entropy

    -log p_theta(x) = -sum_{l=0}^{L-1} log p_theta(x_l | x_{<l})   (nats per sequence),

the exact negative log-likelihood, directly comparable with the diffusion
model's bound on the same quantity (``sedd.evaluate.likelihood_bound``).
The network reads [BOS, x_0, ..., x_{L-2}] and its output at position l is the
logits of x_l: every one of the L tokens is predicted, the first from BOS alone.
BOS is the id V (the model is built with D = V + 1 rows, as for the absorbing
graph); its logit is dropped, so p_theta is a law over the V real tokens.

Uses: the likelihood and speed baseline of the benchmarks, and the default
judge of generative perplexity (``sedd.evaluate.generative_perplexity``).

Decoding with a KV cache: ``decode_step`` runs one position through the blocks,
reusing the DDiT's own submodules (no second copy of the model), and keeps the
rotary-embedded keys and the values of earlier positions. Its next-token
distribution equals that of a full forward pass (tests/test_ar.py).

Letters: B batch, L length, V vocabulary, D = V + 1, H hidden, N heads, K head
dim, n blocks.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from sedd.categorical import sample_categorical
from sedd.model import DDiT, apply_rotary, modulate


def _check(model: DDiT) -> None:
    if not model.causal or model.time_conditioning or model.out_dim != model.vocab_size + 1:
        raise ValueError(
            "an AR baseline is a DDiT with causal=True, time_conditioning=False and a BOS row "
            "(absorbing=True); build it with model.kind='ar' (sedd.train.build_model)")


def bos_id(model: DDiT) -> int:
    """The beginning-of-sequence id, V."""
    return model.vocab_size


def next_token_logits(model: DDiT, x: jax.Array, *, deterministic: bool | None = True, rngs=None) -> jax.Array:
    """Logits of x_l given x_{<l} at every position, one full forward pass.

    Args:
      model: the AR DDiT.
      x: int[B, L] tokens in [0, V).
      deterministic, rngs: dropout control, as in ``DDiT.network_output``.
    Returns:
      float32[B, L, V]: row l scores x_l.
    """
    _check(model)
    b = x.shape[0]
    inputs = jnp.concatenate([jnp.full((b, 1), bos_id(model), x.dtype), x[:, :-1]], axis=1)  # (B, L)
    out = model.network_output(inputs, None, deterministic=deterministic, rngs=rngs)  # (B, L, D)
    return out[..., : model.vocab_size]  # (B, L, V)


def token_nll(model: DDiT, x: jax.Array, *, deterministic: bool | None = True, rngs=None) -> jax.Array:
    """-log p_theta(x_l | x_{<l}) at every position: float32[B, L] nats."""
    logits = next_token_logits(model, x, deterministic=deterministic, rngs=rngs)  # (B, L, V)
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, x[..., None].astype(jnp.int32), axis=-1)[..., 0]


def sequence_nll(model: DDiT, x: jax.Array, *, deterministic: bool | None = True, rngs=None) -> jax.Array:
    """-log p_theta(x) in nats per sequence, float32[B]: the training loss of model.kind="ar"."""
    return token_nll(model, x, deterministic=deterministic, rngs=rngs).sum(-1)


@nnx.jit
def nll(model: DDiT, x: jax.Array) -> jax.Array:
    """Jitted ``sequence_nll`` with dropout off: float32[B] nats per sequence."""
    return sequence_nll(model, x, deterministic=True)


# --------------------------------------------------------------------------- KV cache


def init_cache(model: DDiT, batch: int, max_len: int | None = None) -> dict:
    """Empty key/value cache: {"k", "v"} each [n, B, L, N, K] in the compute dtype."""
    _check(model)
    n, length = len(model.blocks), max_len or model.max_len
    block = model.blocks[0]
    shape = (n, batch, length, block.n_heads, block.head_dim)
    return {"k": jnp.zeros(shape, model.dtype), "v": jnp.zeros(shape, model.dtype)}


def _block_step(block, x: jax.Array, c: jax.Array, k_cache: jax.Array, v_cache: jax.Array, pos):
    """``DDiTBlock.__call__`` for one new position, attending to the cache.

    Args:
      block: a DDiTBlock of the model.
      x: float32[B, 1, H] residual stream at position pos.
      c: float32[B, C] conditioning (zeros for the AR model).
      k_cache, v_cache: [B, L, N, K] keys (rotary applied) and values so far.
      pos: int32[] position of x.
    Returns:
      (float32[B, 1, H], k_cache, v_cache) with position pos written.
    """
    b, _, h = x.shape
    mod = block.adaLN_modulation(c).astype(jnp.float32)  # (B, 6H)
    shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = jnp.split(mod, 6, axis=-1)
    y = modulate(block.norm1(x.astype(jnp.float32)), shift_a, scale_a)  # (B, 1, H)
    qkv = block.attn_qkv(y.astype(block.dtype)).reshape(b, 1, 3, block.n_heads, block.head_dim)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # (B, 1, N, K) each
    where = jnp.reshape(pos, (1,))
    q = apply_rotary(q, where).astype(block.dtype)
    k = apply_rotary(k, where).astype(block.dtype)
    k_cache = jax.lax.dynamic_update_slice(k_cache, k.astype(k_cache.dtype), (0, pos, 0, 0))
    v_cache = jax.lax.dynamic_update_slice(v_cache, v.astype(v_cache.dtype), (0, pos, 0, 0))
    # Softmax attention over positions <= pos; the same scale 1/sqrt(K) as
    # jax.nn.dot_product_attention in the full pass.
    scores = jnp.einsum("bqnk,blnk->bnql", q, k_cache).astype(jnp.float32) / math.sqrt(block.head_dim)
    visible = jnp.arange(k_cache.shape[1]) <= pos  # (L,)
    scores = jnp.where(visible, scores, -jnp.inf)  # (B, N, 1, L)
    weights = jax.nn.softmax(scores, axis=-1).astype(v_cache.dtype)
    att = jnp.einsum("bnql,blnk->bqnk", weights, v_cache)  # (B, 1, N, K)
    att = block.attn_out(att.reshape(b, 1, h)).astype(jnp.float32)  # (B, 1, H)
    x = x + gate_a[:, None, :] * att
    y = modulate(block.norm2(x), shift_m, scale_m)
    y = block.mlp_out(jax.nn.gelu(block.mlp_in(y.astype(block.dtype)), approximate=True))
    return x + gate_m[:, None, :] * y.astype(jnp.float32), k_cache, v_cache


def decode_step(model: DDiT, cache: dict, token: jax.Array, pos) -> tuple[jax.Array, dict]:
    """One position through the model with the cache: the logits of x_pos.

    The input at position p is BOS for p = 0 and x_{p-1} after, so feeding
    ``token`` (BOS or x_{p-1}) at position p returns the logits of x_p.

    Args:
      model: the AR DDiT (dropout off).
      cache: from ``init_cache`` or the previous step.
      token: int[B] the input at position pos.
      pos: int32[] the position.
    Returns:
      (float32[B, V] logits of x_pos, the updated cache).
    """
    b = token.shape[0]
    x = model.vocab_embed(token[:, None]).astype(jnp.float32)  # (B, 1, H)
    c = jnp.zeros((b, model.cond_dim), jnp.float32)  # (B, C): no time input
    ks, vs = [], []
    for i, block in enumerate(model.blocks):
        x, k, v = _block_step(block, x, c, cache["k"][i], cache["v"][i], pos)
        ks.append(k)
        vs.append(v)
    logits = model.output_layer(x, c)[:, 0, : model.vocab_size]  # (B, V)
    return logits, {"k": jnp.stack(ks), "v": jnp.stack(vs)}


@functools.partial(nnx.jit, static_argnames=("num_samples", "length", "categorical"))
def _sample(model, key, temperature, prompt, prompt_len, *, num_samples, length, categorical):
    cache = init_cache(model, num_samples, length)
    bos = jnp.full((num_samples,), bos_id(model), jnp.int32)

    def step(carry, pos):
        cache, prev = carry
        logits, cache = decode_step(model, cache, prev, pos)  # (B, V)
        probs = jax.nn.softmax(logits.astype(jnp.float32) / temperature, axis=-1)
        tok = sample_categorical(jax.random.fold_in(key, pos), probs, categorical).astype(jnp.int32)
        tok = jnp.where(pos < prompt_len, prompt[:, pos], tok)  # a given prefix is kept
        return (cache, tok), tok

    _, toks = jax.lax.scan(step, (cache, bos), jnp.arange(length))  # (L, B)
    return toks.T


def sample(
    key: jax.Array,
    model: DDiT,
    num_samples: int,
    length: int,
    temperature: float = 1.0,
    prompt: jax.Array | None = None,
    categorical: str = "precise",
) -> jax.Array:
    """Ancestral sampling with the KV cache: L network calls of one position each.

    Args:
      key: a ``jax.random`` key.
      model: the AR DDiT.
      num_samples: B.
      length: L <= model.max_len.
      temperature: divides the logits (1 = the model's law).
      prompt: optional int[B, P] prefix (P <= L) kept as given.
      categorical: method of ``sedd.categorical.sample_categorical``.
    Returns:
      int32[B, L] tokens in [0, V).
    """
    _check(model)
    if length < 1 or length > model.max_len:
        raise ValueError(f"length must be in [1, max_len={model.max_len}], got {length}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if prompt is None:
        prompt = jnp.zeros((num_samples, length), jnp.int32)
        prompt_len = 0
    else:
        prompt = jnp.asarray(prompt, jnp.int32)
        prompt_len = prompt.shape[1]
        if prompt.shape[0] != num_samples or prompt_len > length:
            raise ValueError(f"prompt must be int[{num_samples}, <= {length}], got {prompt.shape}")
        prompt = jnp.pad(prompt, ((0, 0), (0, length - prompt_len)))
    model.eval()
    return _sample(model, key, jnp.float32(temperature), prompt, jnp.int32(prompt_len),
                   num_samples=int(num_samples), length=int(length), categorical=categorical)
