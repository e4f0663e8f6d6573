"""What every source family shares in its config: GPT-2's vocabulary, size bounds, the log-linear eps, typed fields."""

from __future__ import annotations

import contextlib
import math
from typing import Mapping

import ml_collections

from sedd import config as config_lib
from sedd.convert.limits import ConversionError, brief

GPT2_TOKENS = 50257  # the original trains only with GPT-2's tokenizer (its data.py)

# Upper bounds on the model's sizes, checked before anything is built from them;
# sedd-medium has hidden_size 1024, 24 blocks, 16 heads, cond_dim 128, length 1024.
SIZE_BOUNDS = {"hidden_size": 1 << 14, "n_blocks": 256, "n_heads": 256, "cond_dim": 1 << 14, "length": 1 << 17}
# The original's LogLinearNoise has eps = 1e-3 built in; its config has no field for it.
LOGLINEAR_EPS = 1e-3


def field(sec: Mapping, section: str, key: str, want: type):
    """sec[key] as `want`; YAML 1.1 reads '1e-4' as a string, so numbers may come as text."""
    name = f"{section}.{key}" if section else key
    if key not in sec:
        raise ConversionError(f"the original's config has no {name}")
    value = sec[key]
    if want is float and isinstance(value, str):
        with contextlib.suppress(ValueError):  # not a number: the type check below names the field
            value = float(value)
    ok = isinstance(value, want) and not (want is not bool and isinstance(value, bool))
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value, ok = float(value), True
        except OverflowError:  # an integer of hundreds of digits
            raise ConversionError(
                f"{name} = an integer of {_digits(value)} digits in the original's config is not a finite number"
            ) from None
    if not ok:
        raise ConversionError(f"{name} = {brief(value)} in the original's config is not a {want.__name__}")
    if want is float and not math.isfinite(value):
        raise ConversionError(f"{name} = {value!r} in the original's config is not a finite number")
    return value


def ddit_config(sizes: Mapping[str, int], dropout: float, dtype: str, tokenizer_path) -> ml_collections.ConfigDict:
    """owt_small's config with a DDiT of these sizes (`SIZE_BOUNDS`' keys) over GPT-2's tokenizer and the log-linear
    eps: what every family's config sets alike (each then sets its graph, noise and output)."""
    c = config_lib.load_config("owt_small")
    c.model.kind = "ddit"
    c.model.hidden_size, c.model.n_heads, c.model.n_layers = sizes["hidden_size"], sizes["n_heads"], sizes["n_blocks"]
    c.model.cond_dim = sizes["cond_dim"]
    c.model.mlp_ratio = 4  # fixed in the original's DDiTBlock
    c.model.dropout = dropout
    c.model.dtype = dtype
    c.model.vocab_multiple = 1  # the original's tables, unpadded
    c.noise.eps = LOGLINEAR_EPS  # LogLinearNoise (the original's, MDLM's): move chance (1 - 1e-3) t
    c.data.tokenizer = "gpt2"
    c.data.tokenizer_path = str(tokenizer_path)
    c.data.seq_len = sizes["length"]
    return c


def _digits(value: int) -> str:
    """How many digits an integer has (str() of one over 4,300 digits is refused, and slow well before)."""
    if value.bit_length() > 13_000:
        return "more than 3900"
    return str(len(str(abs(value))))
