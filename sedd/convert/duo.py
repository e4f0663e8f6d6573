"""DUO (s-sahoo/duo): its Lightning checkpoint (.ckpt) and the OmegaConf config in it, read into MDLM's fields."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from sedd.convert.allowlist import Opaque
from sedd.convert.fields import LOGLINEAR_EPS, field
from sedd.convert.limits import ConversionError, brief
from sedd.convert.mdlm import HF_SIZES, PEER_PREFIX
from sedd.convert.original import config_from_original
from sedd.convert.source import Source, ema_weights, state_dict_of, training_step
from sedd.convert.torch_zip import load_torch

MAX_CONFIG_DEPTH = 16  # OmegaConf containers nested in a Lightning checkpoint's hyper_parameters.config
MAX_CONFIG_NODES = 1 << 16  # values visited (a pickle's memo can share one container many times over)


def _plain_config(node, where: str, depth: int = 0, budget: list | None = None):
    """A Lightning checkpoint's OmegaConf DictConfig (`Opaque` stand-ins) as plain dicts, lists and scalars.

    A DictConfig's pickled state holds "_content", a dict of nodes (or None, or
    an interpolation string); a ListConfig's a list; a value node's "_val".
    Anything else is refused by its class name. At most MAX_CONFIG_DEPTH deep
    and MAX_CONFIG_NODES values in all (a container shared by memo counts each
    time it is reached, so nothing grows past the budget).
    """
    budget = [MAX_CONFIG_NODES] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        raise ConversionError(f"{where}: the config holds more than {MAX_CONFIG_NODES} values")
    if depth > MAX_CONFIG_DEPTH:
        raise ConversionError(f"{where} nests deeper than {MAX_CONFIG_DEPTH}")
    if isinstance(node, Opaque):
        state = node.state if isinstance(node.state, dict) else {}
        name = node.opaque_name
        if name in ("omegaconf.dictconfig.DictConfig", "omegaconf.listconfig.ListConfig"):
            node = state.get("_content")
        elif name.startswith("omegaconf.nodes."):
            node = state.get("_val")
        else:
            raise ConversionError(f"{where} holds a {brief(name)}, not an OmegaConf config")
    if isinstance(node, dict):
        if not all(isinstance(k, str) for k in node):
            raise ConversionError(f"{where} has a key that is not a string")
        return {k: _plain_config(v, f"{where}.{k}", depth + 1, budget) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_plain_config(v, f"{where}[{i}]", depth + 1, budget) for i, v in enumerate(node)]
    if node is None or isinstance(node, (str, int, float, bool)):
        return node
    raise ConversionError(f"{where} holds a {type(node).__name__}, not a config value")


def lightning_source(path: Path, ema: bool) -> Source:
    """A DUO training checkpoint (PyTorch Lightning's .ckpt, as s-sahoo/duo's trainer saves it).

    torch.save of {"state_dict": the module's (backbone.*), "ema":
    {"shadow_params": [the backbone's parameters in order]}, "hyper_parameters":
    {"config": the Hydra config, an OmegaConf DictConfig}, "global_step",
    optimizer and loop state}; read with inert stand-ins for every class
    (`load_torch(opaque=True)`). The model's fields come from the Hydra config
    (algo.*, model.*, noise.*), the vocabulary from the embedding's rows.
    """
    obj = load_torch(path, opaque=True)
    if not (isinstance(obj, dict) and isinstance(obj.get("state_dict"), Mapping)):
        raise ConversionError(f"{path} is not a Lightning checkpoint (a dict with a state_dict)")
    hp = obj.get("hyper_parameters")
    if not (isinstance(hp, dict) and "config" in hp):
        raise ConversionError(f"{path} has no hyper_parameters.config (the Hydra config its trainer saves)")
    hydra = _plain_config(hp["config"], "hyper_parameters.config")
    algo, model, noise = (hydra.get(k) if isinstance(hydra, dict) else None for k in ("algo", "model", "noise"))
    if not all(isinstance(x, dict) for x in (algo, model, noise)):
        raise ConversionError(f"{path}: hyper_parameters.config lacks an algo, model or noise section")
    if algo.get("name") not in ("duo", "duo_base"):
        raise ConversionError(
            f"{path}: algo.name = {brief(algo.get('name'))}; sedd convert reads DUO's Lightning "
            "checkpoints (MDLM and BD3-LM: their Hugging Face folders, config.json + "
            "model.safetensors)"
        )
    for key, want in (("parameterization", "mean"), ("causal_attention", False)):
        if algo.get(key, want) != want:
            raise ConversionError(f"{path}: algo.{key} = {brief(algo.get(key))}; DUO's models have {want!r}")
    eps = field(noise, "noise", "eps", float) if "eps" in noise else LOGLINEAR_EPS
    if noise.get("type") != "log-linear" or eps != LOGLINEAR_EPS:
        raise ConversionError(
            f"{path}: noise = {brief(noise)}; DUO's log-linear schedule with eps "
            f"{LOGLINEAR_EPS} is the one our loglinear noise is"
        )
    state = state_dict_of(obj["state_dict"], f"{path}['state_dict']")
    embedding = state.get(PEER_PREFIX + "vocab_embed.embedding")
    if not isinstance(embedding, np.ndarray) or embedding.ndim != 2:
        raise ConversionError(f"{path}: state_dict has no tensor {PEER_PREFIX}vocab_embed.embedding")
    config = {
        "model_type": "duo",
        "vocab_size": int(embedding.shape[0]),
        "time_conditioning": algo.get("time_conditioning", True),
        **{theirs: model[ours] for ours, theirs in {**HF_SIZES, "dropout": "dropout"}.items() if ours in model},
    }
    n_blocks = config_from_original(config).model.n_layers  # checks every field and size first
    step = training_step(obj.get("global_step", 0), str(path))
    weights = ema_weights(obj.get("ema"), state, n_blocks, str(path), PEER_PREFIX) if ema else state
    return Source(config, path, path, weights, state, step, "ema" if ema else "model")
