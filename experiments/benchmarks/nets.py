"""The configs and networks the benchmarks time: a shipped config resized, its FLOPs, random weights."""

from __future__ import annotations

import jax
from flax import nnx

from sedd import config as config_lib
from sedd import kinds
from sedd import model as model_lib


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


def matmul_params(config) -> int:
    """N of ``sedd.model.matmul_params`` for a config's network."""
    return model_lib.matmul_params(nnx.eval_shape(lambda: kinds.build_model(config)))


def flops_per_token(config, training: bool = True) -> float:
    """``sedd.model.flops_per_token`` of a config's network at its sequence length."""
    return model_lib.flops_per_token(nnx.eval_shape(lambda: kinds.build_model(config)), config.data.seq_len, training)


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
