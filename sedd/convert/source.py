"""What a conversion reads: the `Source` record, and the `Scheme` of its state dict (family, prefix, folding)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import numpy as np

from sedd.convert.bd3lm import BD3LM_BUFFERS
from sedd.convert.fields import field
from sedd.convert.limits import ConversionError, brief
from sedd.convert.mdlm import PEER_PREFIX, PEERS
from sedd.convert.weights import ROTARY_KEY, parameter_map


class Scheme(NamedTuple):
    """How a source's state dict maps onto our network (`scheme_of`).

    family: "sedd", "mdlm" or "bd3lm"; prefix: of the backbone's tensors;
    fold_sigma: the source feeds sigma = 0 to its sigma embedding
    (`sedd.convert.weights.fold_sigma_map`); buffers: names outside the backbone read separately.
    """

    family: str
    prefix: str = ""
    fold_sigma: bool = False
    buffers: tuple[str, ...] = ()


def scheme_of(orig: Mapping) -> Scheme:
    """The scheme of a source by its config: a Hugging Face model_type, or the original SEDD's Hydra config."""
    if "model_type" not in orig:
        return Scheme("sedd")
    family = orig["model_type"]
    if not isinstance(family, str) or family not in PEERS:
        raise ConversionError(
            f"model_type = {brief(family)} in config.json; sedd convert reads the original SEDD "
            f"(a training config) and the Hugging Face models of types {sorted(PEERS)}"
        )
    fold = not field(orig, "", "time_conditioning", bool)
    return Scheme(family, PEER_PREFIX, fold, BD3LM_BUFFERS if family == "bd3lm" else ())


@dataclasses.dataclass
class Source:
    """What a conversion reads.

    Attributes:
      config: the sections of the original's config that are read
        (`sedd.convert.read.read_original_config`).
      config_file, weights_file: where they came from.
      weights: the state dict of the chosen weights (name -> array).
      raw: the raw (non-EMA) state dict where the source has both, else None.
      step: the training step (0 for published weights, which carry none).
      kind: "published", "ema" or "model" (which weights `weights` holds).
    """

    config: dict
    config_file: Path
    weights_file: Path
    weights: Mapping[str, Any]
    raw: Mapping[str, Any] | None
    step: int
    kind: str


def state_dict_of(obj, where: str) -> Mapping[str, Any]:
    """obj, checked to be a state dict (a mapping of names to tensors); where names it in the error."""
    if not isinstance(obj, Mapping) or not all(isinstance(k, str) for k in obj):
        raise ConversionError(f"{where} is not a state dict (a mapping of names to tensors)")
    return obj


def training_step(value, where: str) -> int:
    """A training checkpoint's step: an int (or a 0-d integer tensor) that fits the int32 of our checkpoint."""
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu":
        value = int(value)
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31):
        raise ConversionError(f"{where}['step'] = {brief(value)} is not a training step (an integer in [0, 2**31))")
    return value


def ema_weights(ema, model: Mapping[str, Any], n_blocks: int, where: str, prefix: str = "") -> dict[str, Any]:
    """A training checkpoint's EMA weights by name: its shadow_params list (in `parameter_map` order) and the
    model's rotary buffer; where names the checkpoint in the errors, prefix that of the backbone's tensors."""
    shadow = ema.get("shadow_params") if isinstance(ema, Mapping) else None
    if not isinstance(shadow, (list, tuple)):
        raise ConversionError(f"{where}['ema'] has no shadow_params list; use --no_ema for the raw weights")
    names = [prefix + name for name, _, _ in parameter_map(n_blocks)]
    if len(shadow) != len(names):
        raise ConversionError(
            f"{where}: the EMA holds {len(shadow)} tensors, the config's model has {len(names)} parameters"
        )
    weights = dict(zip(names, shadow))
    if prefix + ROTARY_KEY in model:
        weights[prefix + ROTARY_KEY] = model[prefix + ROTARY_KEY]
    return weights
