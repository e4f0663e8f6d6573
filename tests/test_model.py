"""Tests of sedd.model: the DDiT log-score network, on tiny CPU sizes."""

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sedd import ddit_layer, kernels, layers
from sedd import model as M

ROOT = Path(__file__).resolve().parents[1]
V, H, BLOCKS, HEADS, L = 11, 32, 2, 2, 8

# The three ways sedd builds a DDiT: absorbing and uniform diffusion, and the
# autoregressive baseline, which embeds BOS = V but predicts only the V tokens.
ABSORBING = dict(num_tokens=V + 1, out_dim=V + 1, scale_by_sigma=True)
UNIFORM = dict(num_tokens=V, out_dim=V)
AR = dict(num_tokens=V + 1, out_dim=V, causal=True, time_conditioning=False)


def make(kind=ABSORBING, **kw):
    kw = {"max_len": 16, "rngs": nnx.Rngs(0), **kind, **kw}
    return M.DDiT(hidden_size=H, n_layers=BLOCKS, n_heads=HEADS, **kw)


def perturb(model, seed=1, scale=0.3):
    """Replaces every parameter by scaled normals so the zero-initialised layers
    no longer hide the attention and MLP paths."""
    # numpy draws: a jitted or eager jax.random version would compile anew for
    # every model configuration, which dominates the run time on CPU.
    rng = np.random.default_rng(seed)
    state = nnx.state(model, nnx.Param)
    new = jax.tree.map(lambda p: jnp.asarray(scale * rng.standard_normal(p.shape), p.dtype), state)
    nnx.update(model, new)
    return model


# One compiled program per model configuration is much cheaper on CPU than
# eager dispatch, which compiles every primitive of the forward pass separately.
run = nnx.jit(lambda model, x, sigma: model(x, sigma))


def tokens(seed, d, b=2):
    return jax.random.randint(jax.random.key(seed), (b, L), 0, d, dtype=jnp.int32)


@pytest.mark.parametrize("kind", [ABSORBING, UNIFORM])
def test_shape_dtype_and_zero_at_current_token(kind):
    m = perturb(make(kind))
    d = kind["out_dim"]
    x = tokens(0, d)
    out = run(m, x, jnp.array([0.3, 4.0]))
    assert out.shape == (2, L, d) and out.dtype == jnp.float32
    at_x = jnp.take_along_axis(out, x[..., None], axis=-1)
    np.testing.assert_array_equal(np.asarray(at_x), 0.0)
    assert bool(jnp.all(jnp.isfinite(out)))
    # The perturbed network is non-trivial away from the current token.
    assert float(jnp.abs(out).max()) > 1e-3


def test_init_absorbing_total_ratio_at_mask():
    """At init, sum_{y != mask} s_y = 1 / (e^sigma - 1): Lou et al. 2024, scale by sigma."""
    m = make()
    sig = np.array([1e-4, 0.5, 3.0, 20.0], np.float32)
    x = jnp.full((4, L), V, jnp.int32).at[:, 1::2].set(3)  # masks at even positions
    out = np.asarray(run(m, x, jnp.asarray(sig)), np.float64)
    lse = np.log(np.exp(out[:, 0::2, :V]).sum(-1))  # (4, L/2)
    want = -np.log(np.expm1(sig.astype(np.float64)))
    np.testing.assert_allclose(lse, np.broadcast_to(want[:, None], lse.shape), rtol=1e-5, atol=1e-5)
    for s in (1e-6, 20.0):
        assert bool(jnp.all(jnp.isfinite(run(m, x, jnp.full(4, s)))))


def test_init_uniform_is_zero():
    m = make(UNIFORM)
    np.testing.assert_array_equal(np.asarray(run(m, tokens(0, V), jnp.array([0.1, 2.0]))), 0.0)


def test_log_expm1_accurate_and_finite():
    s = np.geomspace(1e-6, 60.0, 200).astype(np.float32)
    got = np.asarray(M.log_expm1(jnp.asarray(s)))
    np.testing.assert_allclose(got, np.log(np.expm1(s.astype(np.float64))), rtol=2e-6, atol=2e-6)
    g = jax.grad(lambda z: M.log_expm1(z).sum())(jnp.asarray(s))
    assert bool(jnp.all(jnp.isfinite(g)))


def test_timestep_embedding_cos_before_sin():
    e = np.asarray(layers.timestep_embedding(jnp.zeros(1)))
    assert e.shape == (1, layers.FREQ_DIM)
    np.testing.assert_array_equal(e[0, :128], 1.0)
    np.testing.assert_array_equal(e[0, 128:], 0.0)


def test_rotary_half_split_layout():
    x = jnp.zeros((1, 1, 1, 4)).at[..., 0].set(1.0)  # channel 0 pairs with channel 2
    p = 0.7
    r = np.asarray(layers.apply_rotary(x, jnp.array([p])))[0, 0, 0]
    np.testing.assert_allclose(r, [np.cos(p), 0.0, np.sin(p), 0.0], atol=1e-6)


def test_rotary_scores_depend_on_relative_position_only():
    kq, kk = jax.random.split(jax.random.key(0))
    q = jax.random.normal(kq, (1, 1, 1, 16))
    k = jax.random.normal(kk, (1, 1, 1, 16))

    def score(m, n):
        return float(jnp.sum(layers.apply_rotary(q, jnp.array([m])) * layers.apply_rotary(k, jnp.array([n]))))

    for m, n, s in [(0, 3, 5), (7, 2, 11), (4, 4, 100)]:
        np.testing.assert_allclose(score(m, n), score(m + s, n + s), rtol=1e-4, atol=1e-4)
    # and it does depend on the offset
    assert abs(score(0, 1) - score(0, 3)) > 1e-3


def test_causal_ignores_future_tokens():
    m = perturb(make(causal=True))
    x = tokens(0, V + 1)
    sig = jnp.array([0.5, 2.0])
    out = run(m, x, sig)
    i = 3
    x2 = x.at[:, i + 1 :].set((x[:, i + 1 :] + 1) % (V + 1))
    out2 = run(m, x2, sig)
    np.testing.assert_allclose(np.asarray(out[:, : i + 1]), np.asarray(out2[:, : i + 1]), rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(out[:, i + 1 :] - out2[:, i + 1 :]).max()) > 1e-4


def test_noncausal_sees_future_tokens():
    m = perturb(make())
    x = tokens(0, V + 1)
    sig = jnp.array([0.5, 2.0])
    x2 = x.at[:, 5].set((x[:, 5] + 1) % (V + 1))
    diff = jnp.abs(run(m, x, sig)[:, 0] - run(m, x2, sig)[:, 0]).max()
    assert float(diff) > 1e-4


def test_dropout():
    m = perturb(make(dropout=0.5))
    x, sig = tokens(0, V + 1), jnp.array([0.5, 2.0])
    ref = m(x, sig)
    np.testing.assert_array_equal(np.asarray(ref), np.asarray(m(x, sig, deterministic=True)))
    a = m(x, sig, deterministic=False, rngs=jax.random.key(1))
    b = m(x, sig, deterministic=False, rngs=jax.random.key(1))
    c = m(x, sig, deterministic=False, rngs=nnx.Rngs(dropout=2))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert float(jnp.abs(a - c).max()) > 1e-4
    assert float(jnp.abs(a - ref).max()) > 1e-4
    # train()/eval() modes drive the same dropout layers.
    m.train()
    assert float(jnp.abs(m(x, sig) - ref).max()) > 1e-4
    m.eval()
    np.testing.assert_array_equal(np.asarray(m(x, sig)), np.asarray(ref))


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_layer_rate_and_mean(rate):
    """The 16-bit mask drops round(rate 2^16) / 2^16 of the elements and keeps the mean (1M draws: 5 s.e.)."""
    layer = kernels.Dropout(rate, deterministic=False)
    x = jnp.full((1024, 1024), 2.0)
    y = np.asarray(layer(x, rngs=jax.random.key(0)))
    drop = round(rate * 2**16) / 2**16
    n = y.size
    assert abs((y == 0).mean() - drop) < 5 * np.sqrt(drop * (1 - drop) / n)
    np.testing.assert_allclose(y[y != 0], 2.0 / (1 - drop), rtol=1e-6)
    assert abs(y.mean() - 2.0) < 5 * 2.0 * np.sqrt(drop / (1 - drop) / n)
    # independent positions: neighbouring elements' masks are uncorrelated (the 16-bit halves of one word)
    z = (y == 0).astype(float).reshape(-1)
    assert abs(np.corrcoef(z[0::2], z[1::2])[0, 1]) < 5 / np.sqrt(n / 2)
    np.testing.assert_array_equal(np.asarray(layer(x, deterministic=True)), np.asarray(x))


def test_bfloat16_compute():
    m16 = perturb(make(dtype=jnp.bfloat16))
    m32 = perturb(make())
    for p in jax.tree.leaves(nnx.state(m16, nnx.Param)):
        assert p.dtype == jnp.float32
    x, sig = tokens(0, V + 1), jnp.array([1e-3, 5.0])
    out = run(m16, x, sig)
    assert out.dtype == jnp.float32 and bool(jnp.all(jnp.isfinite(out)))
    ref = run(m32, x, sig)
    assert float(jnp.abs(out - ref).max()) < 0.1 * float(jnp.abs(ref).max())


@pytest.mark.parametrize(
    "spec, a_shape, b_shape",
    [
        ("...i,io->...o", (2, 3, 8), (8, 5)),  # a Linear layer
        ("bnqk,bnsk->bnqs", (2, 2, 4, 8), (2, 2, 4, 8)),  # attention logits
        ("bnqs,bnsk->bnqk", (2, 2, 4, 4), (2, 2, 4, 8)),  # attention values
    ],
)
def test_mixed_einsum_is_einsum_to_bfloat16_rounding(spec, a_shape, b_shape):
    ka, kb, kg = jax.random.split(jax.random.key(0), 3)
    a, b = jax.random.normal(ka, a_shape), jax.random.normal(kb, b_shape)
    w = jax.random.normal(kg, jnp.einsum(spec, a, b).shape)  # a fixed cotangent

    def loss(f):
        return lambda a, b: jnp.sum(w * f(a, b))

    exact = jax.value_and_grad(loss(lambda a, b: jnp.einsum(spec, a, b, precision="highest")), (0, 1))(a, b)
    mixed = jax.jit(jax.value_and_grad(loss(lambda a, b: kernels.mixed_einsum(spec, a, b, jnp.bfloat16)), (0, 1)))(a, b)
    # float32 in, float32 out, and float32 gradients for float32 operands.
    assert mixed[0].dtype == jnp.float32 and all(g.dtype == jnp.float32 for g in mixed[1])
    for got, want in zip(jax.tree.leaves(mixed), jax.tree.leaves(exact)):
        # bfloat16 keeps 8 significant bits: relative rounding 2^-8 per operand.
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=0.03 * float(jnp.abs(want).max()))
        assert not np.array_equal(np.asarray(got), np.asarray(want))  # it did round
    # In float32 it is einsum itself, gradients included.
    f32 = jax.value_and_grad(loss(lambda a, b: kernels.mixed_einsum(spec, a, b, jnp.float32)), (0, 1))(a, b)
    for got, want in zip(jax.tree.leaves(f32), jax.tree.leaves(exact)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_mixed_attention_is_dot_product_attention(causal):
    q, k, v = jax.random.normal(jax.random.key(1), (3, 2, 5, 2, 8))  # (B, L, N, K) each
    want = jax.nn.dot_product_attention(q, k, v, is_causal=causal)
    got = jax.jit(kernels.mixed_attention, static_argnums=(3, 4))(q, k, v, causal, jnp.float32)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    # Its own backward pass (softmax normalised after the value product) is softmax's.
    w = jax.random.normal(jax.random.key(2), want.shape)
    grads = [
        jax.jit(jax.grad(lambda q, k, v: jnp.sum(w * f(q, k, v)), (0, 1, 2)))(q, k, v)
        for f in (
            lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal),
            lambda q, k, v: kernels.mixed_attention(q, k, v, causal, jnp.float32),
        )
    ]
    for a, b in zip(*grads):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5)
    low = jax.jit(kernels.mixed_attention, static_argnums=(3, 4))(q, k, v, causal, jnp.bfloat16)
    assert low.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(low), np.asarray(want), atol=0.05)


@pytest.mark.parametrize("unit", [1, 2, 4])
def test_unit_context_attention_is_the_masked_attention_over_both(unit):
    """Each query over its own unit of the chunk and the context positions its mask allows: mixed_attention over
    [k ; ck] with the block-diagonal mask beside that one (a unit's first row sees no context position)."""
    q, k, v = jax.random.normal(jax.random.key(3), (3, 2, 8, 2, 8))  # (B, L, N, K) each
    ck, cv = jax.random.normal(jax.random.key(4), (2, 2, 6, 2, 8))  # (B, S, N, K) each
    mask = np.random.default_rng(unit).random((8, 6)) < 0.5
    mask[:unit] = False
    own = np.arange(8)[:, None] // unit == np.arange(8)[None, :] // unit
    for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 0.05)):
        want = kernels.mixed_attention(
            q,
            jnp.concatenate([k, ck], 1),
            jnp.concatenate([v, cv], 1),
            False,
            jnp.float32,
            mask=np.concatenate([own, mask], 1),
        )
        got = jax.jit(kernels.unit_context_attention, static_argnums=(4, 6))(q, k, v, (ck, cv), unit, mask, dtype)
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


def test_bfloat16_gradients_track_float32():
    """The whole network's parameter gradients in bfloat16 point where float32's do."""
    m16, m32 = perturb(make(dtype=jnp.bfloat16)), perturb(make())
    x, sig = tokens(0, V + 1), jnp.array([0.3, 2.0])

    def grads(m):
        graphdef, params, rest = nnx.split(m, nnx.Param, ...)
        loss = lambda p: jnp.mean(jnp.exp(nnx.merge(graphdef, p, rest)(x, sig)))  # noqa: E731
        return jax.jit(jax.grad(loss))(params)

    g16, g32 = (jnp.concatenate([g.ravel() for g in jax.tree.leaves(grads(m))]) for m in (m16, m32))
    assert g16.dtype == jnp.float32
    cosine = float(g16 @ g32 / (jnp.linalg.norm(g16) * jnp.linalg.norm(g32)))
    assert cosine > 0.99, cosine


def test_bfloat16_keeps_sigma_map_float32():
    m16 = perturb(make(dtype=jnp.bfloat16))
    m32 = perturb(make())
    sig = jnp.array([1e-3, 0.7, 5.0])
    c16 = m16.sigma_map(sig)
    assert c16.dtype == jnp.float32
    # bfloat16 matmuls would be off by ~1e-3 relative.
    np.testing.assert_allclose(np.asarray(c16), np.asarray(m32.sigma_map(sig)), rtol=1e-6, atol=1e-7)


def test_jit_matches_eager():
    m = perturb(make())
    x, sig = tokens(0, V + 1), jnp.array([0.5, 2.0])
    eager = m(x, sig)
    out = nnx.jit(lambda mod, a, b: mod(a, b))(m, x, sig)
    np.testing.assert_allclose(np.asarray(out), np.asarray(eager), rtol=1e-5, atol=1e-5)
    graphdef, state = nnx.split(m)
    out2 = jax.jit(lambda st, a, b: nnx.merge(graphdef, st)(a, b))(state, x, sig)
    np.testing.assert_allclose(np.asarray(out2), np.asarray(eager), rtol=1e-5, atol=1e-5)


def test_autoregressive_shape_embeds_more_ids_than_it_outputs():
    m = perturb(make(AR))
    assert m.sigma_map is None
    assert m.vocab_embed.embedding.shape == (V + 1, H)
    assert m.output_layer.linear.kernel.shape == (H, V)
    x = tokens(0, V + 1).at[:, 0].set(V)  # BOS = V is a valid input id
    out = nnx.jit(lambda mod, a: mod.network_output(a, None))(m, x)
    assert out.shape == (2, L, V) and bool(jnp.all(jnp.isfinite(out)))
    with pytest.raises(ValueError, match="sigma"):
        make(time_conditioning=False)(tokens(0, V), None)  # scale_by_sigma needs it


def test_a_ring_cache_gives_each_position_the_window_before_it():
    """``output_in_cache`` with at None (each position at its row mod S) and ``ring_mask``: past the S = W + 1
    rows, position p sees the W positions up to its own at every layer: the full pass over the whole text
    with a band mask (a sliding window)."""
    m = perturb(make(AR))
    window, total = 5, 3 * L
    x = jax.random.randint(jax.random.key(7), (2, total), 0, V + 1)
    rows = window + 1
    cache, got = m.empty_cache(2, rows), []
    step = jax.jit(
        lambda cache, a, p: m.output_in_cache(
            a, None, positions=p[None], cache=cache, mask=M.ring_mask(p[None], rows, window)
        )
    )
    for p in range(total):
        out, cache, _ = step(cache, x[:, p : p + 1], jnp.int32(p))
        got.append(np.asarray(out[:, 0]))
    pos = np.arange(total)
    band = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)  # (T, T)
    full = np.asarray(m.network_output(x, None, positions=pos, mask=band))  # (B, T, V)
    np.testing.assert_allclose(np.stack(got, 1), full, rtol=1e-5, atol=1e-5)


def test_a_cache_held_by_the_caller_gives_the_full_pass_and_refuses_a_wrong_one():
    """``output_in_cache``: a 3-position chunk written at 0, then single positions, any mask: the full causal pass."""
    m = perturb(make(AR))
    x = tokens(0, V + 1)
    full = np.asarray(nnx.jit(lambda mod, a: mod.network_output(a, None))(m, x))  # (B, L, V)
    rows = np.arange(L)
    cache, got = m.empty_cache(2, L), []
    step = nnx.jit(  # eagerly: an op a compile, for each chunk's shape
        lambda m, x, positions, mask, cache, at: m.output_in_cache(
            x, None, positions=positions, mask=mask, cache=cache, at=at
        )
    )
    for start, n in [(0, 3)] + [(i, 1) for i in range(3, L)]:
        mask = rows[None, :] <= start + np.arange(n)[:, None]  # (n, L) causal over the rows written so far
        out, cache, _ = step(m, x[:, start : start + n], start + np.arange(n), mask, cache, jnp.int32(start))
        got.append(out)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(got, axis=1)), full, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=f"cache holds 1 layers' keys and values, the model has {len(m.layers)}"):
        m.output_in_cache(
            x[:, :1], None, positions=np.arange(1), mask=np.ones((1, L), bool), cache=cache[:1], at=jnp.int32(0)
        )
    with pytest.raises(ValueError, match="a decoding cache is read as a mask over its slots says"):
        q = jnp.zeros((2, 1, m.layers[0].n_heads, m.layers[0].head_dim))
        ddit_layer.cache_attention(q, q, q, cache=cache[0], at=jnp.int32(0), mask=None, positions=np.arange(1))


@pytest.mark.parametrize("row_writes", [64, 1])  # a write a sequence, and the scatter past ROW_WRITES
def test_a_cache_held_by_the_caller_takes_each_sequence_at_its_own_place(monkeypatch, row_writes):
    """``output_in_cache`` with at int32[B]: sequences at different lengths (2 and 5) in one call, each equal to
    the full causal pass at its positions, and each row's cache to one written at its own place alone."""
    monkeypatch.setattr(ddit_layer, "ROW_WRITES", row_writes)
    m = perturb(make(AR))
    x = tokens(0, V + 1)  # (2, L)
    full = np.asarray(nnx.jit(lambda mod, a: mod.network_output(a, None))(m, x))  # (B, L, V)
    rows, starts, n = np.arange(L), np.array([2, 5]), 3
    cache = m.empty_cache(2, L)
    _, cache, _ = m.output_in_cache(
        x[:, :5],
        None,
        positions=np.arange(5),
        mask=rows[None, :] <= np.arange(5)[:, None],
        cache=cache,
        at=jnp.int32(0),
    )  # both texts up to 5; row 0 rewrites from 2 below
    positions = starts[:, None] + np.arange(n)  # (B, n)
    chunk = np.take_along_axis(np.asarray(x), positions, axis=1)
    out, cache, _ = m.output_in_cache(
        chunk,
        None,
        positions=positions,
        mask=rows[None, None, :] <= positions[..., None],
        cache=cache,
        at=jnp.asarray(starts, jnp.int32),
    )
    np.testing.assert_allclose(
        np.asarray(out), np.take_along_axis(full, positions[..., None], axis=1), rtol=1e-5, atol=1e-5
    )
    alone = m.empty_cache(2, L)
    _, alone, _ = m.output_in_cache(
        x[:, :8],
        None,
        positions=np.arange(8),
        mask=rows[None, :] <= np.arange(8)[:, None],
        cache=alone,
        at=jnp.int32(0),
    )
    heads = m.layers[0].n_heads
    for got, want in zip(jax.tree.leaves(cache), jax.tree.leaves(alone)):  # [B N, S, K]: row b's rows < start + n
        for b, start in enumerate(starts):
            np.testing.assert_allclose(
                np.asarray(got)[b * heads : (b + 1) * heads, : start + n],
                np.asarray(want)[b * heads : (b + 1) * heads, : start + n],
                rtol=1e-5,
                atol=1e-5,
            )


def test_logical_axis_names_without_mesh():
    m = make()
    specs = nnx.get_partition_spec(nnx.state(m, nnx.Param))
    assert tuple(specs["vocab_embed"]["embedding"].get_value()) == ("vocab", "embed")
    assert tuple(specs["layers"][0]["attn_qkv"]["kernel"].get_value()) == ("embed", "qkv")
    assert tuple(specs["layers"][0]["mlp_in"]["kernel"].get_value()) == ("embed", "mlp")
    assert tuple(specs["output_layer"]["linear"]["kernel"].get_value()) == ("embed", "vocab")


def test_param_counts():
    """Counted by hand for D = 12, H = 32, C = 128, 2 blocks, MLP width 128."""
    embed = 384  # 12 x 32 table
    sigma_map = 49_408  # 256 x 128 + 128, then 128 x 128 + 128
    # LayerNorms 2 x 32, qkv 32 x 96, attention out 32 x 32, MLP 32 x 128 + 128
    # and 128 x 32 + 32, adaLN 128 x 192 + 192.
    block = 37_280
    final = 8_288  # LayerNorm 32, adaLN 128 x 64 + 64
    projection = 396  # 32 x 12 + 12
    m = make()
    assert M.param_count(m) == embed + sigma_map + 2 * block + final + projection
    assert M.non_embedding_param_count(m) == sigma_map + 2 * block + final


def test_errors():
    with pytest.raises(ValueError, match="hidden_size=30.*n_heads=4"):
        M.DDiT(**ABSORBING, hidden_size=30, n_layers=1, n_heads=4, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="even"):
        M.DDiT(**ABSORBING, hidden_size=30, n_layers=1, n_heads=2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="out_dim=1"):
        M.DDiT(num_tokens=1, out_dim=1, scale_by_sigma=True, hidden_size=8, n_layers=1, n_heads=2, rngs=nnx.Rngs(0))
    m = make(max_len=4)
    with pytest.raises(ValueError, match="L=8.*max_len=4"):
        m(tokens(0, V), jnp.ones(2))
    with pytest.raises(ValueError, match="2-D"):
        m(jnp.zeros((4,), jnp.int32), jnp.ones(1))
    with pytest.raises(ValueError, match=r"sigma must have shape"):
        m(jnp.zeros((2, 4), jnp.int32), jnp.ones((2, 3)))  # 3 groups do not divide L = 4
    with pytest.raises(ValueError, match=r"sigma must have shape"):
        m(jnp.zeros((2, 4), jnp.int32), jnp.ones((3,)))


def test_gradients_finite_at_init_and_reach_output_layer():
    m = make()
    x, sig = tokens(0, V + 1), jnp.array([1e-4, 20.0])

    def loss(mod):
        return jnp.sum(jnp.exp(mod(x, sig, deterministic=False, rngs=jax.random.key(0))))

    grads = nnx.jit(nnx.grad(loss))(m)
    leaves = jax.tree.leaves(grads)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    assert float(jnp.abs(grads["output_layer"]["linear"]["kernel"].get_value()).max()) > 0


def test_normalize_turns_the_score_entropy_into_weighted_cross_entropy():
    """normalize=True (MDLM's SUBS / RADD): at a masked position the tokens' scores
    sum to r = 1 / (e^sigma - 1) and the absorbing score entropy equals
    r * (-log p_theta(x0 | x_t)) exactly, the weighted cross-entropy."""
    from sedd.graphs import Absorbing

    m = perturb(make(normalize=True))
    sig = jnp.array([0.01, 0.7, 5.0], jnp.float32)
    x0 = tokens(3, V, b=3)
    x = x0.at[:, ::2].set(V)  # masks at even positions
    log_score = run(m, x, sig)  # (3, L, D)
    r = 1.0 / np.expm1(np.asarray(sig, np.float64))
    s = np.exp(np.asarray(log_score, np.float64))
    np.testing.assert_allclose(s[:, ::2, :V].sum(-1), np.broadcast_to(r[:, None], (3, L // 2)), rtol=1e-5)
    assert float(s[:, 1::2, V].max()) == 0.0  # never a move into the mask
    se = np.asarray(Absorbing(V).score_entropy(log_score, sig[:, None], x, x0), np.float64)
    log_p = np.log(np.take_along_axis(s[:, ::2], np.asarray(x0)[:, ::2, None], -1)[..., 0] / r[:, None])
    np.testing.assert_allclose(se[:, ::2], r[:, None] * -log_p, rtol=2e-4, atol=1e-6)
    np.testing.assert_array_equal(se[:, 1::2], 0.0)  # unmasked positions carry no loss
    # Without scale_by_sigma normalize is the uniform graph's x0 output (DUO), tested in test_convert_peers.py.


@pytest.mark.slow  # counts page faults over repeated runs, a speed property: behind -m slow to keep the default suite within 900 CPU s
@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_keep_freed_memory_ends_the_page_faults_of_each_run(monkeypatch):
    """glibc maps a buffer of 32 MB or more afresh at each allocation and unmaps it when freed, so
    each run of a program that holds one faults its pages in again; after `keep_freed_memory` the
    freed pages stay in the process and a run faults none in."""
    code = """
    import json, resource, sys
    from sedd import kernels
    kept = kernels.keep_freed_memory() if sys.argv[1] == "keep" else None
    import jax, jax.numpy as jnp
    f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum())  # the product's work buffers hold x: 32 MB
    x = jnp.ones((256, 32768), jnp.float32)  # 1/4 of the arithmetic of (1024, 8192)
    for _ in range(2):
        f(x).block_until_ready()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        f(x).block_until_ready()
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3
    print("RESULT " + json.dumps({"kept": kept, "faults": faults}))
    """
    monkeypatch.setenv("SEDD_PLAIN_MALLOC", "1")
    assert kernels.keep_freed_memory() is False  # the opt-out: this process keeps glibc's defaults
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MALLOC_") and k not in ("XLA_FLAGS", "SEDD_PLAIN_MALLOC")
    }  # the defaults
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu")
    runs_ = {}
    for mode in ("keep", "plain"):
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code), mode], env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs_[mode] = json.loads(proc.stdout.split("RESULT ")[-1])
    pages = 32 * 2**20 // 4096
    assert runs_["keep"]["kept"] is True
    assert runs_["keep"]["faults"] < pages / 100, runs_
    if runs_["plain"]["faults"] < pages:  # 65,500 a run on a 2-core EPYC: 8x the buffer's pages
        pytest.skip(f"this XLA maps no large buffer afresh at each run here ({runs_}): nothing to compare")
