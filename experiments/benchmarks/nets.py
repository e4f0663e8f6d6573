"""The configs and networks the benchmarks time: a shipped config resized, its FLOPs, random weights."""

from __future__ import annotations

import jax
from flax import nnx

from sedd import config as config_lib
from sedd import kinds


def bench_config(base: str = "shakespeare_char", vocab_size: int = 85, **model_overrides):
    """A shipped config with vocab_size set (normally set from the tokenizer) and model overrides.

    Keys: hidden_size, n_layers, n_heads, cond_dim, seq_len, batch_size, kind, dtype.
    """
    c = config_lib.load_config(base)
    c.vocab_size = vocab_size
    for k, v in model_overrides.items():
        if k == "seq_len":
            c.data.seq_len = v
        elif k == "batch_size":
            c.training.batch_size = v
        else:
            c.model[k] = v
    return c


def network_matmul_params(model) -> int:
    """N, the weights of the matmuls every token meets: n (4 H^2 + 2 r H^2) + H D.

    qkv 3H^2 and the attention output H^2 per layer, the MLP 2 r H^2 (r the
    MLP ratio), the output projection H D. Embedding lookups and the
    per-sequence adaLN / sigma layers are left out. Works on an abstract model
    (``nnx.eval_shape``).
    """
    h = model.hidden_size
    mlp = model.layers[0].mlp_in.kernel.shape[1]  # r H
    return len(model.layers) * (4 * h * h + 2 * mlp * h) + h * model.out_dim


def network_flops_per_token(model, seq_len: int, training: bool = True) -> float:
    """Model FLOPs per token (not hardware FLOPs: no rematerialisation, no elementwise work).

        forward  = 2 N + 4 n L H        (QK^T and AV: 2 L H each, per layer)
        training = 6 N + 12 n L H       (backward = 2 x forward; PaLM App. B)

    with N = ``network_matmul_params(model)``. The attention term uses the full L for a
    causal model too: ``sedd.kernels.mixed_attention`` computes the whole score
    matrix and masks it.
    """
    forward = 2 * network_matmul_params(model) + 4 * len(model.layers) * seq_len * model.hidden_size
    return 3 * forward if training else forward


def matmul_params(config) -> int:
    """N of ``network_matmul_params`` for a config's network."""
    return network_matmul_params(nnx.eval_shape(lambda: kinds.build_model(config)))


def flops_per_token(config, training: bool = True) -> float:
    """``network_flops_per_token`` of a config's network at its sequence length."""
    return network_flops_per_token(nnx.eval_shape(lambda: kinds.build_model(config)), config.data.seq_len, training)


def diffusion_parts(config, seed: int = 0):
    """(graph, noise, score_params, score_fn(score_params, x, sigma)) of an untrained diffusion model."""
    graphdef, params, rest = nnx.split(kinds.build_model(config, seed), nnx.Param, ...)
    return kinds.build_graph(config), kinds.build_noise(config), (params, rest), kinds.params_score_fn(graphdef)


def random_net(config, kind_name: str, block_size: int | None = None):
    """(kind, Net) of random weights, every parameter nonzero (the zero-initialised layers too)."""
    c = config.copy_and_resolve_references()
    c.model.kind = kind_name
    if block_size:
        c.model.block_size = block_size
    kind = kinds.get(c)
    model = kind.network(0)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    leaves = jax.tree.leaves(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree.unflatten(
        jax.tree.structure(params), [p + 0.02 * jax.random.normal(k, p.shape) for p, k in zip(leaves, keys)]
    )
    return kind, kinds.Net(graphdef, params, rest)
