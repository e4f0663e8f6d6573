"""The names a state dict's pickle may use, each resolved to an immutable stand-in; inert stand-ins for the rest.

A pickle can name any Python callable. The restricted unpickler
(`sedd.convert.torch_zip`) resolves only the names of `ALLOWED`: the storage
types (`StorageType`, a name and nothing else), collections.OrderedDict and
torch's two tensor rebuilders, each a `_Callable` whose function a pickle's
BUILD cannot rewrite. A Lightning checkpoint (DUO's) names many more classes;
read with opaque=True, each becomes an `Opaque` stand-in that runs no code of
the class it names.
"""

from __future__ import annotations

import collections
import math
import types
from typing import Callable, NamedTuple

import ml_dtypes
import numpy as np

from sedd.convert.limits import MAX_TENSOR_DIMS, ConversionError, brief, is_index

# torch.<Name>Storage -> the element type of its bytes (numbers only: never an object dtype).
# UntypedStorage holds raw bytes.
STORAGE_DTYPES = types.MappingProxyType(
    {
        "DoubleStorage": np.dtype(np.float64),
        "FloatStorage": np.dtype(np.float32),
        "HalfStorage": np.dtype(np.float16),
        "BFloat16Storage": np.dtype(ml_dtypes.bfloat16),
        "LongStorage": np.dtype(np.int64),
        "IntStorage": np.dtype(np.int32),
        "ShortStorage": np.dtype(np.int16),
        "CharStorage": np.dtype(np.int8),
        "ByteStorage": np.dtype(np.uint8),
        "BoolStorage": np.dtype(np.bool_),
        "UntypedStorage": np.dtype(np.uint8),
    }
)


class StorageType(NamedTuple):
    """Stands for the class torch.<name> inside a persistent id: an immutable name, no torch object.

    A tuple: no ``__dict__`` and no ``__setstate__``, so a pickle's BUILD cannot
    give it attributes; its dtype is looked up by name in `STORAGE_DTYPES`.
    """

    name: str


class _Callable(NamedTuple):
    """An allowed callable as a pickle's GLOBAL sees it: immutable, unlike a function (whose
    ``__defaults__`` a BUILD could rewrite for the whole process)."""

    name: str
    fn: Callable

    def __call__(self, *args):
        return self.fn(*args)


class _OrderedDict(collections.OrderedDict):
    """collections.OrderedDict as a state dict pickles it; BUILD's state (torch's `_metadata`, module
    versions) is checked and dropped."""

    def __setstate__(self, state):
        if not (isinstance(state, dict) and all(isinstance(k, str) for k in state)):
            raise ConversionError(f"an OrderedDict's state is {type(state).__name__}, not attributes by name")


def _ordered_dict(*args) -> _OrderedDict:
    if args:  # torch's pickle calls OrderedDict() and then sets the items
        raise ConversionError(f"OrderedDict called with {len(args)} argument(s); a state dict calls it with none")
    return _OrderedDict()


def _rebuild_tensor(
    storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None, metadata=None
) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2, for numpy: a read-only strided view of the storage.

    Element (i_0, ..., i_k) is storage[offset + sum_j i_j stride_j]; every index
    the view can reach is checked to lie inside the storage first, and the view
    may not hold more elements than the storage (no broadcast views in a state dict).
    """
    del requires_grad, backward_hooks, metadata  # autograd state, meaningless here
    if not isinstance(storage, np.ndarray):
        raise ConversionError(f"a tensor's storage is {type(storage).__name__}, not a storage id")
    if not (
        isinstance(size, tuple)
        and isinstance(stride, tuple)
        and len(size) == len(stride) <= MAX_TENSOR_DIMS
        and all(map(is_index, (storage_offset, *size, *stride)))
    ):
        raise ConversionError(
            f"malformed tensor: offset {brief(storage_offset)}, size {brief(size)}, stride {brief(stride)}"
        )
    numel = math.prod(size)
    if numel == 0:
        return np.zeros(size, storage.dtype)
    last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= storage.size or numel > storage.size:
        raise ConversionError(
            f"a tensor of size {size}, stride {stride} at offset {storage_offset} "
            f"reads past its storage of {storage.size} elements"
        )
    base = storage[storage_offset:]
    return np.lib.stride_tricks.as_strided(base, size, [s * storage.itemsize for s in stride], writeable=False)


def _rebuild_parameter(data, requires_grad=True, backward_hooks=None) -> np.ndarray:
    """torch._utils._rebuild_parameter: an nn.Parameter is its data here."""
    del requires_grad, backward_hooks
    if not isinstance(data, np.ndarray):
        raise ConversionError(f"a parameter's data is {type(data).__name__}, not a tensor")
    return data


# The only names a state dict (or the original's training checkpoint: model,
# EMA list, AdamW state, step) pickles. Everything else is refused.
ALLOWED = types.MappingProxyType(
    {
        ("collections", "OrderedDict"): _Callable("collections.OrderedDict", _ordered_dict),
        ("torch._utils", "_rebuild_tensor_v2"): _Callable("torch._utils._rebuild_tensor_v2", _rebuild_tensor),
        ("torch._utils", "_rebuild_parameter"): _Callable("torch._utils._rebuild_parameter", _rebuild_parameter),
        **{("torch", name): StorageType(name) for name in STORAGE_DTYPES},
    }
)


class Opaque:
    """An object of a class a Lightning checkpoint names but that is never imported (OmegaConf's
    DictConfig and nodes, Lightning's loop state, a tokenizer): NEWOBJ and REDUCE keep its arguments,
    BUILD its state, SETITEM(S) and APPEND(S) its items. No code of the named class runs; only
    `sedd.convert.duo`'s config reader reads these, by name. Each name gets its own subclass (`opaque_class`)."""

    opaque_name = "?"

    def __new__(cls, *args):
        obj = object.__new__(cls)
        obj.args, obj.state, obj.items = args, None, []
        return obj

    def __init__(self, *args):
        pass

    def __setstate__(self, state):
        self.state = state

    def __setitem__(self, key, value):
        self.items.append((key, value))

    def append(self, value):
        self.items.append(value)

    def extend(self, values):
        self.items.extend(values)


def opaque_class(module: str, name: str) -> type:
    """A new `Opaque` subclass that stands for the class module.name (named, never imported)."""
    return type("Opaque", (Opaque,), {"opaque_name": f"{module}.{name}"})
