r"""The original PyTorch SEDD checkpoints, and MDLM's, BD3-LM's and DUO's, -> a run directory.

Sources (louaaron/Score-Entropy-Discrete-Diffusion, Lou, Meng & Ermon 2024):

  published folder    config.json (the training config as a dict) and
                      pytorch_model.bin or model.safetensors (the state dict of
                      the original's `SEDD` module), as `louaaron/sedd-small`
                      and `louaaron/sedd-medium` are published
  training run        .hydra/config.yaml and checkpoints-meta/checkpoint.pth or
                      checkpoints/checkpoint_N.pth: {"model": state dict,
                      "ema": {"decay", "num_updates", "shadow_params"},
                      "optimizer", "step"}; shadow_params is a list in
                      `model.parameters()` order

The field's other checkpoints of SEDD's network (the same state-dict names
under "backbone."; docs/pretrained.md, section 6, `mdlm.config_from_peer`):

  MDLM, BD3-LM        Hugging Face folders: config.json (model_type "mdlm" /
                      "bd3lm", flat fields) + model.safetensors; a network fed
                      sigma = 0 gets its sigma embedding folded into the adaLN
                      biases (`weights.fold_sigma_map`)
  DUO                 the Lightning checkpoint (.ckpt) its trainer saves,
                      read with inert stand-ins for the classes it pickles
                      (`load_torch(opaque=True)`, `duo.lightning_source`)

The destination is an ordinary run directory (sedd.runs) with converted.json
(where the weights came from) and the GPT-2 tokenizer files under gpt2/; its
checkpoint's "ema" holds the weights every tool reads (the EMA of a training
run unless --no_ema). Nothing of the optimizer is kept: a converted run
samples and evaluates, it does not resume. The modules, one concept each:
docs/architecture.md draws them.
"""

from sedd.convert.bd3lm import BD3LM_BUFFERS
from sedd.convert.duo import MAX_CONFIG_DEPTH, MAX_CONFIG_NODES
from sedd.convert.fields import GPT2_TOKENS
from sedd.convert.limits import (
    MAX_HEADER_BYTES,
    MAX_PICKLE_BYTES,
    MAX_PICKLE_CALLS,
    MAX_PICKLE_OPCODES,
    MAX_STRING_CHARS,
    MAX_TENSOR_DIMS,
    MAX_TEXT_BYTES,
    MAX_TOKENIZER_BYTES,
    MAX_TUPLE_NESTING,
    ConversionError,
    UnsafePickleError,
)
from sedd.convert.mdlm import PEER_PREFIX
from sedd.convert.original import config_from_original
from sedd.convert.read import locate, read_original_config, read_source
from sedd.convert.safetensors_file import load_safetensors
from sedd.convert.source import Scheme, Source, scheme_of
from sedd.convert.torch_zip import load_torch
from sedd.convert.weights import (
    ROTARY_KEY,
    abstract_params,
    convert_params,
    count_parameters,
    fold_sigma_map,
    parameter_map,
)
from sedd.convert.write import PROVENANCE, TOKENIZER_DIR, convert, main

__all__ = [
    "BD3LM_BUFFERS",
    "GPT2_TOKENS",
    "MAX_CONFIG_DEPTH",
    "MAX_CONFIG_NODES",
    "MAX_HEADER_BYTES",
    "MAX_PICKLE_BYTES",
    "MAX_PICKLE_CALLS",
    "MAX_PICKLE_OPCODES",
    "MAX_STRING_CHARS",
    "MAX_TENSOR_DIMS",
    "MAX_TEXT_BYTES",
    "MAX_TOKENIZER_BYTES",
    "MAX_TUPLE_NESTING",
    "PEER_PREFIX",
    "PROVENANCE",
    "ROTARY_KEY",
    "TOKENIZER_DIR",
    "ConversionError",
    "Scheme",
    "Source",
    "UnsafePickleError",
    "abstract_params",
    "config_from_original",
    "convert",
    "convert_params",
    "count_parameters",
    "fold_sigma_map",
    "scheme_of",
    "load_safetensors",
    "load_torch",
    "locate",
    "main",
    "parameter_map",
    "read_original_config",
    "read_source",
]
