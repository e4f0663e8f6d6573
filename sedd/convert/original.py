"""The original SEDD's config (louaaron/Score-Entropy-Discrete-Diffusion's Hydra config) -> our config.

`config_from_original` is where every source's config becomes ours: the
original's here, a Hugging Face config of MDLM, BD3-LM or DUO handed to
`sedd.convert.mdlm.config_from_peer`.
"""

from __future__ import annotations

import math
from typing import Mapping

import ml_collections

from sedd.convert.fields import GPT2_TOKENS, SIZE_BOUNDS, ddit_config, field
from sedd.convert.limits import ConversionError
from sedd.convert.mdlm import config_from_peer
from sedd.convert.source import scheme_of

# The sections the original's code reads to build and run the model (SEDD
# reads tokens, graph.type and model.*; sampling reads noise.*). They are
# checked strictly and are what converted.json keeps (with training.ema); the
# rest (training, optim, data, eval, sampling, ngpus, ...) configures training
# only and is dropped.
_MODEL_KEYS = {"name", "type", "hidden_size", "cond_dim", "length", "n_blocks", "n_heads", "scale_by_sigma", "dropout"}
_GRAPH_KEYS = {"type", "file", "report_all"}
_NOISE_KEYS = {"type", "sigma_min", "sigma_max"}
_GRAPHS = {"absorb": "absorbing", "uniform": "uniform"}


def _section(orig: Mapping, name: str, known: set[str]) -> Mapping:
    sec = orig.get(name)
    if not isinstance(sec, Mapping):
        raise ConversionError(f"the original's config has no {name!r} section")
    unknown = sorted(set(sec) - known)
    if unknown:
        raise ConversionError(
            f"unknown field(s) {[f'{name}.{k}' for k in unknown]} in the original's config; known: {sorted(known)}"
        )
    return sec


def config_from_original(orig: Mapping, tokenizer_path: str = "", dtype: str = "float32") -> ml_collections.ConfigDict:
    """Our config (owt_small with the original's model, graph, noise and length) of an original config dict.

    orig: the original's config.json or .hydra/config.yaml, parsed (a Hugging Face config.json of MDLM, BD3-LM
    or DUO, by its model_type, is read by `sedd.convert.mdlm.config_from_peer`); tokenizer_path: the result's
    data.tokenizer_path (GPT-2 files); dtype: its model.dtype ("bfloat16" as the original's autocast on
    accelerators). Returns a config for `sedd.kinds.build_model` with vocab_size set.

    Raises:
      ConversionError: naming an unknown, missing or inconsistent field.
    """
    if set(orig) == {"config"} and isinstance(orig["config"], Mapping):  # a mixin wrapping its init kwargs
        orig = orig["config"]
    if scheme_of(orig).family != "sedd":
        return config_from_peer(orig, tokenizer_path, dtype)
    model = _section(orig, "model", _MODEL_KEYS)
    graph = _section(orig, "graph", _GRAPH_KEYS)
    noise = _section(orig, "noise", _NOISE_KEYS)
    tokens = field(orig, "", "tokens", int)
    if tokens != GPT2_TOKENS:
        raise ConversionError(
            f"tokens = {tokens} in the original's config, but its only tokenizer, GPT-2's, has {GPT2_TOKENS}"
        )
    if model.get("type", "ddit") != "ddit":
        raise ConversionError(f"model.type = {model['type']!r}; only the original's 'ddit' exists")
    graph_type = field(graph, "graph", "type", str)
    if graph_type not in _GRAPHS:
        raise ConversionError(f"graph.type = {graph_type!r}; the original knows {sorted(_GRAPHS)}")
    noise_type = field(noise, "noise", "type", str)
    if noise_type not in ("geometric", "loglinear"):
        raise ConversionError(f"noise.type = {noise_type!r}; the original knows 'geometric' and 'loglinear'")
    sizes = {key: field(model, "model", key, int) for key in SIZE_BOUNDS}
    for key, value in sizes.items():
        if not 1 <= value <= SIZE_BOUNDS[key]:
            raise ConversionError(f"model.{key} = {value} in the original's config is outside [1, {SIZE_BOUNDS[key]}]")
    hidden, heads = sizes["hidden_size"], sizes["n_heads"]
    scale_by_sigma = field(model, "model", "scale_by_sigma", bool)
    if scale_by_sigma and graph_type != "absorb":
        raise ConversionError(
            "model.scale_by_sigma = true with graph.type = 'uniform': the original "
            "asserts the absorbing graph there and cannot run this config"
        )
    if hidden % heads or (hidden // heads) % 2:
        raise ConversionError(f"model.hidden_size = {hidden} and n_heads = {heads} give no even head size")
    c = ddit_config(sizes, field(model, "model", "dropout", float), dtype, tokenizer_path)
    c.model.scale_by_sigma = scale_by_sigma
    c.model.normalize = False  # the original's score output
    c.graph.type = _GRAPHS[graph_type]
    c.noise.type = noise_type
    c.noise.sigma_min = field(noise, "noise", "sigma_min", float)
    c.noise.sigma_max = field(noise, "noise", "sigma_max", float)
    training = orig.get("training")
    if isinstance(training, Mapping) and training.get("ema") is not None:
        c.training.ema = field(training, "training", "ema", float)
        if not 0.0 <= c.training.ema < 1.0:
            raise ConversionError(f"training.ema = {c.training.ema} in the original's config must be in [0, 1)")
    if not 0.0 <= c.model.dropout < 1.0:
        raise ConversionError(f"model.dropout = {c.model.dropout} must be in [0, 1)")
    for key in ("sigma_min", "sigma_max"):
        if not 0.0 < c.noise[key] < math.inf:
            raise ConversionError(f"noise.{key} = {c.noise[key]} in the original's config must be positive and finite")
    c = ml_collections.ConfigDict(c.to_dict())
    c.vocab_size = tokens
    return c
