r"""A source's state dict -> our parameters: the name map, every tensor checked, a constant sigma embedding folded.

State dict -> our parameters (sedd/model.py; i = 0..n_blocks-1, the
original's transformer blocks, our layers). Every PyTorch Linear stores
weight [out, in] and computes x W^T; ours stores the kernel [in, out] and
computes x K, so K = W^T:

  vocab_embed.embedding                  vocab_embed.embedding          [D, H]
  sigma_map.mlp.{0,2}.weight / .bias     sigma_map.fc{1,2}.kernel^T / .bias
  blocks.i.norm{1,2}.weight              layers.i.norm{1,2}.scale
  blocks.i.attn_qkv.weight               layers.i.attn_qkv.kernel^T      (3, N, K) packing kept
  blocks.i.attn_out.weight               layers.i.attn_out.kernel^T
  blocks.i.mlp.{0,2}.weight / .bias      layers.i.mlp_{in,out}.kernel^T / .bias
  blocks.i.adaLN_modulation.weight/.bias layers.i.adaLN_modulation.kernel^T / .bias
  output_layer.norm_final.weight         output_layer.norm_final.scale
  output_layer.linear.weight / .bias     output_layer.linear.kernel^T / .bias
  output_layer.adaLN_modulation.*        output_layer.adaLN_modulation.kernel^T / .bias
  rotary_emb.inv_freq                    a buffer, not a parameter: checked to be
                                         base^{-2j/K} with base 10000 (our rotary)
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx

from sedd import kinds
from sedd.convert.limits import ConversionError, brief
from sedd.layers import FREQ_DIM, ROTARY_BASE, timestep_embedding

ROTARY_KEY = "rotary_emb.inv_freq"


def parameter_map(n_blocks: int, sigma_map: bool = True) -> list[tuple[str, str, bool]]:
    """(original name, our name, transposed) of every parameter, in the original's `model.parameters()` order.

    The order is that of module registration in the original's SEDD:
    vocab_embed, sigma_map, (rotary_emb: a buffer only), blocks, output_layer;
    inside a block norm1, attn_qkv, attn_out, norm2, mlp, adaLN_modulation;
    inside the final layer norm_final, linear, adaLN_modulation. The EMA's
    shadow_params list follows it. MDLM's, BD3-LM's and DUO's backbones have the
    same names and order. sigma_map=False leaves out the sigma embedding (a
    time-independent network of ours, `fold_sigma_map`).
    """

    def linear(src, dst):
        return [(f"{src}.weight", f"{dst}.kernel", True), (f"{src}.bias", f"{dst}.bias", False)]

    out = [("vocab_embed.embedding", "vocab_embed.embedding", False)]
    if sigma_map:
        out += linear("sigma_map.mlp.0", "sigma_map.fc1") + linear("sigma_map.mlp.2", "sigma_map.fc2")
    for i in range(n_blocks):
        b, ours = f"blocks.{i}", f"layers.{i}"  # the original's transformer blocks, our layers
        out += [
            (f"{b}.norm1.weight", f"{ours}.norm1.scale", False),
            (f"{b}.attn_qkv.weight", f"{ours}.attn_qkv.kernel", True),
            (f"{b}.attn_out.weight", f"{ours}.attn_out.kernel", True),
            (f"{b}.norm2.weight", f"{ours}.norm2.scale", False),
        ]
        out += linear(f"{b}.mlp.0", f"{ours}.mlp_in") + linear(f"{b}.mlp.2", f"{ours}.mlp_out")
        out += linear(f"{b}.adaLN_modulation", f"{ours}.adaLN_modulation")
    out += [("output_layer.norm_final.weight", "output_layer.norm_final.scale", False)]
    out += linear("output_layer.linear", "output_layer.linear")
    out += linear("output_layer.adaLN_modulation", "output_layer.adaLN_modulation")
    return out


def _path_name(path) -> str:
    """'layers.0.attn_qkv.kernel' of a jax key path into an nnx.State (the Variable's 'value' dropped)."""
    return jax.tree_util.keystr(
        tuple(k for k in path if k != jax.tree_util.GetAttrKey("value")), simple=True, separator="."
    )


def abstract_params(config) -> nnx.State:
    """The parameters of the config's network as ``jax.ShapeDtypeStruct``s (nothing is computed)."""
    _, params, _ = nnx.split(nnx.eval_shape(lambda: kinds.build_model(config)), nnx.Param, ...)
    return params


FLOATS = {np.dtype(t) for t in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16)}
_TENSORS = (np.ndarray, jax.Array, jax.ShapeDtypeStruct)


def _tensor_problem(name: str, x, shape: tuple[int, ...]) -> str | None:
    """Why x cannot be the float tensor of this shape, or None; checked before a byte of it is read."""
    if not isinstance(x, _TENSORS):
        return f"{name!r} is a {type(x).__name__}, not a tensor"
    if tuple(x.shape) != tuple(shape):
        return f"tensor {name!r} has shape {tuple(x.shape)}, the config needs {tuple(shape)}"
    if np.dtype(x.dtype) not in FLOATS:
        return f"tensor {name!r} has dtype {x.dtype}, not a float type"
    return None


def _check_rotary(inv_freq, head_dim: int) -> str | None:
    """A problem with the rotary buffer, or None: it must be base^{-2j/K}, j < K/2, base 10000."""
    if isinstance(inv_freq, _TENSORS) and tuple(inv_freq.shape) != (head_dim // 2,):
        return (
            f"{ROTARY_KEY} has shape {tuple(inv_freq.shape)}, not ({head_dim // 2},): the checkpoint's "
            f"head size is not hidden_size / n_heads = {head_dim} of the config"
        )
    if problem := _tensor_problem(ROTARY_KEY, inv_freq, (head_dim // 2,)):
        return problem
    if isinstance(inv_freq, jax.ShapeDtypeStruct):
        return None
    want = 1.0 / ROTARY_BASE ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    got = np.asarray(inv_freq, np.float64)
    rtol = 1e-6 if np.dtype(inv_freq.dtype).itemsize >= 4 else 1e-2
    if not np.allclose(got, want, rtol=rtol, atol=0):
        return f"{ROTARY_KEY} is not the rotary frequencies of base {ROTARY_BASE:g}, which sedd.model uses"
    return None


def fold_sigma_map(sd: Mapping[str, np.ndarray], n_blocks: int) -> dict[str, np.ndarray]:
    """The adaLN biases of a network always fed sigma = 0, with its constant conditioning folded in.

    MDLM and BD3-LM train time-independent networks by feeding sigma = 0: the
    sigma embedding still runs and every adaLN layer reads the constant
    c0 = silu(sigma_map(0)), so W c + b is the constant W c0 + b. Ours with
    model.time_conditioning = False has no sigma embedding and feeds c = 0 (the
    output is the bias): the same network when each bias becomes b + W c0
    (computed in float64). sd: the source tensors (already checked for shape);
    returns {source name: new bias} of the blocks' and the final layer's adaLN.
    """
    f64 = lambda name: np.asarray(sd[name], np.float64)  # noqa: E731
    silu = lambda h: h / (1.0 + np.exp(-h))  # noqa: E731
    emb = np.asarray(timestep_embedding(jnp.zeros(1)), np.float64)[0]  # [1, .., 1, 0, .., 0]
    h = silu(f64("sigma_map.mlp.0.weight") @ emb + f64("sigma_map.mlp.0.bias"))
    c0 = silu(f64("sigma_map.mlp.2.weight") @ h + f64("sigma_map.mlp.2.bias"))  # (C,)
    layers = [f"blocks.{i}.adaLN_modulation" for i in range(n_blocks)] + ["output_layer.adaLN_modulation"]
    return {f"{m}.bias": (f64(f"{m}.weight") @ c0 + f64(f"{m}.bias")).astype(np.float32) for m in layers}


def convert_params(
    state_dict: Mapping[str, Any], config, prefix: str = "", fold_sigma: bool = False, buffers: tuple[str, ...] = ()
) -> nnx.State:
    """Our parameters of the config's network from a state dict (the original's, or a backbone's under `prefix`).

    Every target parameter is written exactly once, from the one source tensor
    `parameter_map` names for it, with the right shape; every source tensor is
    used (the rotary buffer by a check). Values may be arrays (returned as
    float32 jax arrays) or ``jax.ShapeDtypeStruct``s (returned as such:
    converting shapes alone checks a configuration without any weights).

    Args:
      prefix: of every backbone tensor's name ("backbone." in MDLM, BD3-LM, DUO).
      fold_sigma: the source feeds sigma = 0 to a sigma embedding our
        time-independent network lacks: its tensors are read and folded into
        the adaLN biases (`fold_sigma_map`).
      buffers: names (without prefix) outside the backbone that the caller reads
        itself (BD3-LM's clipped schedule), accepted here as used.
    Raises:
      ConversionError: naming every missing, unexpected, misshapen or
        non-float tensor.
    """
    abstract = abstract_params(config)
    targets = {_path_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(abstract)[0]}
    n_blocks = config.model.n_layers
    plan = parameter_map(n_blocks, sigma_map=not fold_sigma)
    if sorted(dst for _, dst, _ in plan) != sorted(targets):  # a change in sedd.model not mirrored here
        raise ConversionError(
            f"internal: the parameter map does not cover the network exactly: "
            f"{sorted(set(targets) ^ {dst for _, dst, _ in plan})}"
        )
    problems, out = [], {}
    sd = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
    outside = [k for k in state_dict if not k.startswith(prefix) and k not in buffers]
    if fold_sigma:  # read (shape-checked) but not mapped: folded into the adaLN biases below
        cond, freq = config.model.cond_dim, FREQ_DIM
        for src, shape in (
            ("sigma_map.mlp.0.weight", (cond, freq)),
            ("sigma_map.mlp.0.bias", (cond,)),
            ("sigma_map.mlp.2.weight", (cond, cond)),
            ("sigma_map.mlp.2.bias", (cond,)),
        ):
            if src not in sd:
                problems.append(f"missing tensor {prefix + src!r} (the sigma embedding, folded into the adaLN biases)")
            elif problem := _tensor_problem(prefix + src, sd[src], shape):
                problems.append(problem)
    for src, dst, transpose in plan:
        if src not in sd:
            problems.append(f"missing tensor {prefix + src!r} (for {dst})")
            continue
        x = sd[src]
        if problem := _tensor_problem(prefix + src, x, targets[dst].shape[::-1] if transpose else targets[dst].shape):
            problems.append(problem)
        elif isinstance(x, jax.ShapeDtypeStruct):
            out[dst] = jax.ShapeDtypeStruct(targets[dst].shape, jnp.float32)
        else:
            x = np.asarray(x, np.float32)  # native float32, read out of the memory map
            out[dst] = x.T if transpose else x
    used = {src for src, _, _ in plan} | (
        {f"sigma_map.mlp.{i}.{w}" for i in (0, 2) for w in ("weight", "bias")} if fold_sigma else set()
    )
    if ROTARY_KEY in sd:
        used.add(ROTARY_KEY)
        problem = _check_rotary(sd[ROTARY_KEY], config.model.hidden_size // config.model.n_heads)
        if problem:
            problems.append(problem)
    unexpected = [prefix + k for k in sd if k not in used] + outside
    if unexpected:
        problems.append(f"tensor(s) {brief(unexpected)} are not part of the network with n_blocks = {n_blocks}")
    if problems:
        raise ConversionError("the checkpoint does not fit the config:\n  " + "\n  ".join(problems[:20]))
    if fold_sigma and not any(isinstance(x, jax.ShapeDtypeStruct) for x in out.values()):
        ours = {src: dst for src, dst, _ in plan}
        out.update({ours[src]: bias for src, bias in fold_sigma_map(sd, n_blocks).items()})
    as_array = lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else jnp.asarray(x)  # noqa: E731
    return jax.tree_util.tree_map_with_path(lambda p, _: as_array(out[_path_name(p)]), abstract)


def count_parameters(params) -> int:
    """Number of scalars in a tree of arrays or shape structs."""
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
