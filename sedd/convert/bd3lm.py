"""BD3-LM (block diffusion, kuleshov-group/bd3lm-owt-block_size*): its own config fields and buffers.

The rest of its config is MDLM's (`sedd.convert.mdlm`); the converted model
is our block kind (`sedd.kinds.block`) over [x_t ; x_0].
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from sedd.convert.fields import field
from sedd.convert.limits import ConversionError, brief
from sedd.convert.weights import FLOATS

# BD3-LM's config.json fields beyond MDLM's (`sedd.convert.mdlm.HF_FIELDS`).
BD3LM_FIELDS = frozenset(
    {"block_size", "cross_attn", "adaln", "attn_backend", "causal", "var_min", "sampling_eps_min", "sampling_eps_max"}
)
BD3LM_BUFFERS = ("sampling_eps_min", "sampling_eps_max")  # BD3-LM's clipped noise interval, outside the backbone


def block_size_of(orig: Mapping, length: int, time_conditioning: bool) -> int:
    """The block size of a BD3-LM config.json (orig, whose other fields `sedd.convert.mdlm.config_from_peer` has
    checked), of a block-diffusion model our block kind runs: dividing model_length = length, time_conditioning false.

    Raises:
      ConversionError: naming the field that differs from the published models'.
    """
    for key, want in (("cross_attn", True), ("adaln", True), ("causal", False)):
        if orig.get(key, want) is not want:
            raise ConversionError(
                f"{key} = {brief(orig[key])} in the bd3lm config.json; a block-diffusion "
                f"model has {key} = {want} (as the published ones)"
            )
    if time_conditioning:
        raise ConversionError(
            "time_conditioning = true in the bd3lm config.json: BD3-LM feeds the mean "
            "sigma of all blocks, which our block kind does not; the published models "
            "have false"
        )
    block = field(orig, "", "block_size", int)
    if not (1 <= block <= length and length % block == 0):
        raise ConversionError(f"block_size = {block} in the bd3lm config.json must divide model_length = {length}")
    return block


def scalar_buffer(sd: Mapping[str, Any], name: str) -> float:
    """A 0-d float buffer of a state dict (BD3-LM's sampling_eps_min / _max), finite, in [0, 1]."""
    x = sd.get(name)
    if x is None:
        raise ConversionError(f"missing tensor {name!r} (BD3-LM's clipped noise interval)")
    if not (isinstance(x, np.ndarray) and x.size == 1 and np.dtype(x.dtype) in FLOATS):
        raise ConversionError(f"tensor {name!r} is {brief(x)}, not one float")
    value = float(np.asarray(x, np.float64).reshape(()))
    if not 0.0 <= value <= 1.0:
        raise ConversionError(f"{name} = {value} is outside [0, 1]")
    return value
