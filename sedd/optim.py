r"""The optimizer of a config's optim section: AdamW or Muon, the learning-rate schedule, clipping, the adaLN
kernels' scale, gradient accumulation (``build_optimizer``, what ``sedd.train.Trainer`` steps with)."""

from __future__ import annotations

import jax
import optax


def learning_rate_schedule(optim, n_updates: int) -> optax.Schedule:
    """Linear warmup from 0, then constant or cosine decay to 10% of the peak."""
    warmup = max(optim.warmup, 1)
    if optim.schedule == "constant":
        return optax.join_schedules(
            [optax.linear_schedule(0.0, optim.lr, warmup), optax.constant_schedule(optim.lr)], [warmup]
        )
    if optim.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, optim.lr, warmup, max(n_updates, optim.warmup + 1), end_value=0.1 * optim.lr
        )
    raise ValueError(f"unknown optim.schedule {optim.schedule!r}; expected 'constant' or 'cosine'")


def _names(path) -> set[str]:
    """The keys of a pytree path, as strings."""
    return {str(getattr(k, "key", getattr(k, "name", k))) for k in path}


def is_adaln_kernel(params):
    """A bool pytree like `params`: True at the kernels of the adaLN modulation layers."""
    return jax.tree_util.tree_map_with_path(lambda path, _: {"adaLN_modulation", "kernel"} <= _names(path), params)


OPTIMIZERS = ("adamw", "muon")
MUON_MATRICES = ("attn_qkv", "attn_out", "mlp_in", "mlp_out")  # the layers' weight matrices, Muon's share


def muon_dimensions(params):
    """Muon's spec tree: a MuonDimensionNumbers (x W, W = [in, out]) at each layer's four weight matrices,
    None (AdamW) at everything else: embedding, output layer, adaLN and sigma layers, LayerNorms, biases."""

    def spec(path, _):
        names = _names(path)
        return optax.contrib.MuonDimensionNumbers() if "kernel" in names and names & set(MUON_MATRICES) else None

    return jax.tree_util.tree_map_with_path(spec, params)


def build_optimizer(config) -> tuple[optax.GradientTransformation, optax.Schedule]:
    r"""AdamW or Muon, with global-norm clipping, warmup, and optional gradient accumulation.

    optim.optimizer = "muon" updates each layer's four weight matrices W
    (q/k/v, attention output, MLP in and out) with Muon (Jordan et al. 2024,
    "Muon: an optimizer for hidden layers"; optax.contrib.muon): Nesterov
    momentum M (beta 0.95), orthogonalised by five Newton-Schulz iterations,

        W <- W - lr_muon 0.2 \sqrt{max(n_in, n_out)} NS(M),   NS(M) ~ U V^T for M = U S V^T,

    the 0.2 sqrt(max) factor giving the update AdamW's RMS (Liu et al. 2025,
    "Muon is Scalable for LLM Training"), and lr_muon = optim.muon_lr_scale x
    the schedule. Every other parameter takes AdamW with optim.lr. An
    orthogonalised step moves every direction of W's row and column spaces by
    the same amount, where Adam's follows the few directions the noisy
    gradient is largest in (docs/default_run.md compares the two).

    optim.adaln_lr_scale multiplies the learning rate of the adaLN modulation
    kernels. Their input, the sigma conditioning c, is nearly the same vector
    for every sequence of a batch, so their gradient c g^T is coherent and
    Adam moves every modulation output (shift, scale, gate) by up to
    lr ||c||_1 per step, where a bias moves by lr: with ||c||_1 of several
    units the modulations learn several times faster than anything else,
    which can keep attention from learning context-only text (the figures
    are in docs/default_run.md). 1.0 is the original SEDD's plain AdamW.
    """
    o, t = config.optim, config.training
    if t.accum_steps < 1:
        raise ValueError(f"training.accum_steps must be >= 1, got {t.accum_steps}")
    if not o.adaln_lr_scale > 0:
        raise ValueError(f"optim.adaln_lr_scale must be > 0, got {o.adaln_lr_scale!r}")
    schedule = learning_rate_schedule(o, t.n_iters // t.accum_steps)
    parts = [optax.clip_by_global_norm(o.grad_clip)] if o.grad_clip > 0 else []
    if o.optimizer == "adamw":
        parts.append(optax.adamw(schedule, b1=o.beta1, b2=o.beta2, eps=o.eps, weight_decay=o.weight_decay))
    elif o.optimizer == "muon":
        muon_scale = o.muon_lr_scale
        if not muon_scale > 0:
            raise ValueError(f"optim.muon_lr_scale must be > 0, got {muon_scale!r}")
        parts.append(
            optax.contrib.muon(
                lambda n: muon_scale * schedule(n),
                consistent_rms=0.2,
                weight_decay=o.weight_decay,
                muon_weight_dimension_numbers=muon_dimensions,
                adam_learning_rate=schedule,
                adam_b1=o.beta1,
                adam_b2=o.beta2,
                eps=o.eps,
                adam_weight_decay=o.weight_decay,
            )
        )
    else:
        raise ValueError(f"optim.optimizer={o.optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")
    if o.adaln_lr_scale != 1.0:
        parts.append(optax.masked(optax.scale(o.adaln_lr_scale), is_adaln_kernel))
    tx = optax.chain(*parts)
    if t.accum_steps > 1:
        tx = optax.MultiSteps(tx, every_k_schedule=t.accum_steps)
    return tx, schedule
