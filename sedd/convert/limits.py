"""What a conversion refuses, and within which bounds: its errors, the sizes a file may declare, brief quotes.

Every file a conversion reads is read as hostile (docs/reliability.md): each
size it declares is checked against a bound below before anything is
allocated for it, and a value read from it is quoted in a message through
`brief`, whatever its size.
"""

from __future__ import annotations

import reprlib


class ConversionError(ValueError):
    """The source does not describe a SEDD model this package can rebuild exactly."""


class UnsafePickleError(ConversionError):
    """A pickle names a callable outside the state-dict allow-list; nothing was run."""


# What a file may declare, each far above what the original's checkpoints
# hold (sedd-medium's data.pkl: 251 tensors, 28 kB, 8,000 opcodes; its
# training checkpoint with the EMA and AdamW state: ~1,250 tensors, 100 kB,
# 36,000 opcodes): beyond a bound a file is refused before anything is
# allocated for it.
MAX_PICKLE_BYTES = 8 << 20  # data.pkl
MAX_PICKLE_OPCODES = 1 << 19  # each makes at most one object of ~100 bytes; a tensor takes ~30
MAX_PICKLE_CALLS = 1 << 17  # REDUCE calls: two per tensor (the tensor, its backward hooks)
MAX_STRING_CHARS = 1 << 16  # one str in a pickle
MAX_TUPLE_NESTING = 16  # a state dict nests tuples 2 deep; hashing a tuple recurses in C
MAX_TENSOR_DIMS = 8
MAX_HEADER_BYTES = 1 << 20  # a safetensors header (JSON; sedd-medium's is ~25 kB)
MAX_TEXT_BYTES = 256 << 10  # config.json / .hydra/config.yaml (Hydra's is ~3 kB)
MAX_TOKENIZER_BYTES = 64 << 20  # each GPT-2 tokenizer file (tokenizer.json is 1.4 MB)

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 80, 80


def brief(x) -> str:
    """A short repr of a value read from a file, whatever its size or depth."""
    return _REPR.repr(x)


def is_index(v) -> bool:
    """v is a size, stride, offset or count a file may declare: an int (not a bool) in [0, 2**62)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62
