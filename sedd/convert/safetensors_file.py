"""The safetensors reader: a .safetensors file's tensors as read-only memory maps, its header checked first."""

from __future__ import annotations

import json
import math
import os
import types
from pathlib import Path

import ml_dtypes
import numpy as np

from sedd.convert.limits import MAX_HEADER_BYTES, MAX_TENSOR_DIMS, ConversionError, brief, is_index

_SAFETENSORS_DTYPES = types.MappingProxyType(
    {
        "F64": np.dtype("<f8"),
        "F32": np.dtype("<f4"),
        "F16": np.dtype("<f2"),
        "BF16": np.dtype(ml_dtypes.bfloat16),
        "I64": np.dtype("<i8"),
        "I32": np.dtype("<i4"),
        "I16": np.dtype("<i2"),
        "I8": np.dtype("i1"),
        "U8": np.dtype("u1"),
        "BOOL": np.dtype("?"),
    }
)


def load_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file, by name, as read-only memory-mapped numpy arrays.

    The layout (8-byte little-endian header length, a JSON header of
    {name: {dtype, shape, data_offsets}}, then the bytes) is read here, every
    entry checked against the file before anything is mapped: no package is needed.

    Raises:
      ConversionError: naming the entry that lies about its dtype, shape or bytes.
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 2 <= n <= min(MAX_HEADER_BYTES, size - 8):
            raise ConversionError(
                f"{path}: not a safetensors file (its header would be {n} bytes of a "
                f"{size}-byte file; at most {MAX_HEADER_BYTES})"
            )
        try:
            header = json.loads(f.read(n))
        except (ValueError, RecursionError) as e:
            raise ConversionError(f"{path}: the safetensors header is not JSON: {brief(str(e))}") from None
    if not isinstance(header, dict):
        raise ConversionError(f"{path}: the safetensors header is not a mapping")
    metadata = header.pop("__metadata__", {})
    if not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise ConversionError(f"{path}: __metadata__ of the safetensors header is not a mapping of strings")
    start, spans, out = 8 + n, [], {}
    for name, entry in header.items():
        ok = isinstance(entry, dict) and set(entry) == {"dtype", "shape", "data_offsets"}
        dtype = _SAFETENSORS_DTYPES.get(entry["dtype"]) if ok and isinstance(entry["dtype"], str) else None
        shape, offsets = (entry["shape"], entry["data_offsets"]) if ok else (None, None)
        if not (
            dtype is not None
            and isinstance(shape, list)
            and len(shape) <= MAX_TENSOR_DIMS
            and all(map(is_index, shape))
            and isinstance(offsets, list)
            and len(offsets) == 2
            and all(map(is_index, offsets))
            and offsets[0] <= offsets[1] <= size - start
        ):
            raise ConversionError(
                f"{path}: tensor {brief(name)} has a malformed entry {brief(entry)} "
                f"(dtype one of {sorted(_SAFETENSORS_DTYPES)}, data inside the file's "
                f"{size - start} data bytes)"
            )
        numel = math.prod(shape)
        if offsets[1] - offsets[0] != numel * dtype.itemsize:
            raise ConversionError(
                f"{path}: tensor {brief(name)} of shape {shape} and dtype {entry['dtype']} "
                f"needs {numel * dtype.itemsize} bytes, its offsets give {offsets[1] - offsets[0]}"
            )
        spans.append((offsets[0], offsets[1], name))
        out[name] = (dtype, tuple(shape), offsets[0], numel)
    spans.sort()
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise ConversionError(f"{path}: tensors {brief(a)} and {brief(b)} overlap")
    # One map of the file, every tensor a view of it: a map holds a file descriptor of its own, so a map per
    # tensor failed under `ulimit -n 1024` for a file of more than about a thousand tensors.
    whole = np.memmap(path, np.uint8, mode="r")
    return {
        name: (
            whole[start + begin : start + begin + numel * dtype.itemsize].view(dtype).reshape(shape)
            if numel
            else np.zeros(shape, dtype)
        )
        for name, (dtype, shape, begin, numel) in out.items()
    }
