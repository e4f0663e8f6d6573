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
under "backbone."; docs/pretrained.md, section 6, `_config_from_peer`):

  MDLM, BD3-LM        Hugging Face folders: config.json (model_type "mdlm" /
                      "bd3lm", flat fields) + model.safetensors; a network fed
                      sigma = 0 gets its sigma embedding folded into the adaLN
                      biases (`fold_sigma_map`)
  DUO                 the Lightning checkpoint (.ckpt) its trainer saves,
                      read with inert stand-ins for the classes it pickles
                      (`load_torch(opaque=True)`, `_lightning_source`)

The destination is an ordinary run directory (sedd.runs): config.json,
tokenizer.json, the GPT-2 tokenizer files under gpt2/, converted.json (where
the weights came from) and an orbax checkpoint of {"step", "params", "ema"}.
"ema" holds the weights every tool reads by default (the EMA of a training
run unless --no_ema; the one published set otherwise); "params" holds the raw
weights where the source has them, else the same set. Nothing of the
optimizer is kept: a converted run samples and evaluates, it does not resume.

State dict -> our parameters (sedd/model.py; i = 0..n_blocks-1). Every
PyTorch Linear stores weight [out, in] and computes x W^T; ours stores the
kernel [in, out] and computes x K, so K = W^T:

  vocab_embed.embedding                  vocab_embed.embedding          [D, H]
  sigma_map.mlp.{0,2}.weight / .bias     sigma_map.fc{1,2}.kernel^T / .bias
  blocks.i.norm{1,2}.weight              blocks.i.norm{1,2}.scale
  blocks.i.attn_qkv.weight               blocks.i.attn_qkv.kernel^T      (3, N, K) packing kept
  blocks.i.attn_out.weight               blocks.i.attn_out.kernel^T
  blocks.i.mlp.{0,2}.weight / .bias      blocks.i.mlp_{in,out}.kernel^T / .bias
  blocks.i.adaLN_modulation.weight/.bias blocks.i.adaLN_modulation.kernel^T / .bias
  output_layer.norm_final.weight         output_layer.norm_final.scale
  output_layer.linear.weight / .bias     output_layer.linear.kernel^T / .bias
  output_layer.adaLN_modulation.*        output_layer.adaLN_modulation.kernel^T / .bias
  rotary_emb.inv_freq                    a buffer, not a parameter: checked to be
                                         base^{-2j/K} with base 10000 (our rotary)

Reading .bin / .pth without torch. `torch.save` writes a zip archive:
<name>/data.pkl, a pickle of the object in which every tensor is
`torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)` and
every storage a persistent id ("storage", torch.<Type>Storage, key, location,
numel) whose bytes are the zip member <name>/data/<key> (raw, in the byte order
of <name>/byteorder, little-endian when absent). A pickle can name any Python
callable, so it is first scanned opcode by opcode (`_scan_pickle`: only what
a state dict's pickle does, within bounds), then read by an unpickler that
resolves only the names a state dict needs (below) to immutable values: a
malicious file fails with `UnsafePickleError` or `ConversionError` and runs
nothing. Every file is read as hostile; docs/reliability.md lists what is
refused and how.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import io
import json
import math
import os
import pickle
import pickletools
import re
import reprlib
import shutil
import struct
import sys
import types
import uuid
import zipfile
import zlib
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

from sedd import config as config_lib
from sedd import kinds, runs
from sedd.data import GPT2Tokenizer, save_tokenizer
from sedd.model import FREQ_DIM, ROTARY_BASE, timestep_embedding

GPT2_TOKENS = 50257  # the original trains only with GPT-2's tokenizer (its data.py)
TOKENIZER_DIR = "gpt2"  # where a converted run keeps its copy of the tokenizer files
PROVENANCE = "converted.json"
ROTARY_KEY = "rotary_emb.inv_freq"


class ConversionError(ValueError):
    """The source does not describe a SEDD model this package can rebuild exactly."""


class UnsafePickleError(ConversionError):
    """A pickle names a callable outside the state-dict allow-list; nothing was run."""


# =========================================================================== torch's zip format

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

# torch.<Name>Storage -> the element type of its bytes (numbers only: never an object dtype).
# UntypedStorage holds raw bytes.
_STORAGE_DTYPES = types.MappingProxyType({name: np.dtype(t) for name, t in {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_, "UntypedStorage": np.uint8,
}.items()})


class _StorageType(NamedTuple):
    """Stands for the class torch.<name> inside a persistent id: an immutable name, no torch object.

    A tuple: no ``__dict__`` and no ``__setstate__``, so a pickle's BUILD cannot
    give it attributes; its dtype is looked up by name in `_STORAGE_DTYPES`.
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


def _is_index(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62


def _rebuild_tensor(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                    metadata=None) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2, for numpy: a read-only strided view of the storage.

    Element (i_0, ..., i_k) is storage[offset + sum_j i_j stride_j]; every index
    the view can reach is checked to lie inside the storage first, and the view
    may not hold more elements than the storage (no broadcast views in a state dict).
    """
    del requires_grad, backward_hooks, metadata  # autograd state, meaningless here
    if not isinstance(storage, np.ndarray):
        raise ConversionError(f"a tensor's storage is {type(storage).__name__}, not a storage id")
    if not (isinstance(size, tuple) and isinstance(stride, tuple) and len(size) == len(stride) <= MAX_TENSOR_DIMS
            and all(map(_is_index, (storage_offset, *size, *stride)))):
        raise ConversionError(f"malformed tensor: offset {_brief(storage_offset)}, size {_brief(size)}, "
                              f"stride {_brief(stride)}")
    numel = math.prod(size)
    if numel == 0:
        return np.zeros(size, storage.dtype)
    last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= storage.size or numel > storage.size:
        raise ConversionError(f"a tensor of size {size}, stride {stride} at offset {storage_offset} "
                              f"reads past its storage of {storage.size} elements")
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
_ALLOWED = types.MappingProxyType({
    ("collections", "OrderedDict"): _Callable("collections.OrderedDict", _ordered_dict),
    ("torch._utils", "_rebuild_tensor_v2"): _Callable("torch._utils._rebuild_tensor_v2", _rebuild_tensor),
    ("torch._utils", "_rebuild_parameter"): _Callable("torch._utils._rebuild_parameter", _rebuild_parameter),
    **{("torch", name): _StorageType(name) for name in _STORAGE_DTYPES},
})

# The opcodes of protocol 2, torch.save's default, that Python's pickler writes
# for a state dict, a training checkpoint and an optimizer's state.
_OPCODES = frozenset({
    "PROTO", "STOP", "MARK", "GLOBAL", "REDUCE", "BUILD", "BINPERSID", "BINPUT", "LONG_BINPUT", "BINGET",
    "LONG_BINGET", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "SETITEM",
    "SETITEMS", "APPEND", "APPENDS", "NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1",
    "BINFLOAT", "BINUNICODE",
})
# The kinds of object a GLOBAL pushes: they may only be called or named in a storage id, never kept.
_NAMES = ("OrderedDict class", "storage type", "function")
# What BUILD (torch's `_metadata` of a state dict), SETITEM(S) and APPEND(S) may apply to.
_TARGETS = {"BUILD": ("OrderedDict",), "SETITEM": ("dict", "OrderedDict"), "SETITEMS": ("dict", "OrderedDict"),
            "APPEND": ("list",), "APPENDS": ("list",)}
# What REDUCE and NEWOBJ may call, by kind, and the kind of what they push (opaque: `_Opaque` stand-ins).
_CALLS = {"REDUCE": {"OrderedDict class": "OrderedDict", "function": "tensor", "opaque class": "object"},
          "NEWOBJ": {"opaque class": "object"}}
# Opcodes that push one object, by kind; the rest are handled one by one in `_scan_pickle`.
_PUSHES = {"EMPTY_DICT": "dict", "EMPTY_LIST": "list", "NONE": "value", "NEWTRUE": "value", "NEWFALSE": "value",
           "BININT": "value", "BININT1": "value", "BININT2": "value", "LONG1": "value", "BINFLOAT": "value",
           "BINUNICODE": "value"}


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 80, 80


def _brief(x) -> str:
    """A short repr of a value read from a file, whatever its size or depth."""
    return _REPR.repr(x)


def _check_opcode(i: int, name: str, arg, pos: int, where: str, opaque: bool = False) -> None:
    """Opcode i of a pickle (at byte pos) is one a state dict uses, within the count, after protocol 2."""
    if name not in _OPCODES and not (opaque and name == "NEWOBJ"):
        raise ConversionError(f"{where}: the pickle uses opcode {name} at byte {pos}, which a state dict "
                              "never does; refused before anything was unpickled")
    if i >= MAX_PICKLE_OPCODES:
        raise ConversionError(f"{where}: the pickle has more than {MAX_PICKLE_OPCODES} opcodes")
    if name == "PROTO" and (i != 0 or arg != 2):
        raise ConversionError(f"{where}: pickle protocol {arg} at byte {pos}; torch.save writes 2")
    if name != "PROTO" and i == 0:
        raise ConversionError(f"{where}: the pickle does not start with protocol 2 as torch.save writes it")


def _scan_pickle(data: bytes, where: str, opaque: bool = False) -> None:
    """Refuses a pickle unlike a state dict's, from its opcodes alone, before any of it is unpickled.

    opaque (a Lightning checkpoint): any other name is an inert `_Opaque`
    that NEWOBJ / REDUCE build and BUILD, SETITEM(S), APPEND(S) fill, and a
    string may be as long as the pickle; every other rule stands.

    Python's C unpickler sizes its memo to the largest index it is given
    (LONG_BINPUT 2**27: 2 GB) and trusts declared lengths; BUILD sets the
    attributes of any object. The scan follows the kind of each object on the
    stack (`pickletools.genops`; nothing is built) and admits only `_OPCODES`;
    names of `_ALLOWED`, each called or (a storage type) named in a storage
    id, never kept as a value; memo indices up to the number of puts so far;
    BUILD on an OrderedDict only (torch's `_metadata`); and bounded strings,
    opcodes, calls and tuple nesting.

    Raises:
      UnsafePickleError: a name outside the allow-list.
      ConversionError: anything else a state dict does not do.
    """
    stack: list[tuple[str, int]] = []  # (kind, tuple nesting) of each object on the unpickler's stack
    marks: list[int] = []  # stack heights at each MARK
    memo: dict[int, tuple[str, int]] = {}
    puts = calls = 0

    def pop(n: int) -> list[tuple[str, int]]:
        if len(stack) - (marks[-1] if marks else 0) < n:
            raise ConversionError(f"{where}: malformed pickle: {op.name} at byte {pos} pops an empty stack")
        items = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        return items

    def pop_mark() -> list[tuple[str, int]]:
        if not marks:
            raise ConversionError(f"{where}: malformed pickle: {op.name} at byte {pos} without a MARK")
        start = marks.pop()
        items = stack[start:]
        del stack[start:]
        return items

    def values(items, storage_id=False):
        """items, checked to be values: a name is only called (REDUCE) or, a storage type, named in a storage id."""
        for kind, _ in items:
            if kind == "opaque class":  # an inert stand-in (typing.Any as OmegaConf's ref_type)
                continue
            if (kind in _NAMES and not (storage_id and kind == "storage type")) or kind == "storage id":
                raise ConversionError(f"{where}: {op.name} at byte {pos} uses a {kind} as a value; a state dict's "
                                      "pickle only calls its names or puts a storage type in a storage id")
        return items

    def push_tuple(items):
        item_kinds = [kind for kind, _ in values(items, storage_id=True)]
        depth = 1 + max((d for _, d in items), default=0)
        if depth > MAX_TUPLE_NESTING:
            raise ConversionError(f"{where}: tuples nested {depth} deep at byte {pos}; a state dict nests 2")
        stack.append(("storage id" if "storage type" in item_kinds else "tuple", depth))

    try:
        for i, (op, arg, pos) in enumerate(pickletools.genops(data)):
            name = op.name
            _check_opcode(i, name, arg, pos, where, opaque)
            if name in _PUSHES:
                if name == "BINUNICODE" and len(arg) > MAX_STRING_CHARS and not opaque:
                    raise ConversionError(f"{where}: a string of {len(arg)} characters at byte {pos}")
                stack.append((_PUSHES[name], 0))
            elif name == "MARK":
                marks.append(len(stack))
            elif name == "GLOBAL":
                module, _, attr = arg.partition(" ")
                if (module, attr) not in _ALLOWED and not opaque:
                    raise UnsafePickleError(
                        f"{where}: the pickle asks for {module}.{attr}, which a state dict never needs; refused "
                        "before anything ran. Only tensors, storages and plain containers are read. If the file "
                        "is trusted, re-save its state dict with safetensors.")
                kind = {"collections": "OrderedDict class", "torch": "storage type"}.get(module, "function")
                stack.append((kind if (module, attr) in _ALLOWED else "opaque class", 0))
            elif name in ("BINPUT", "LONG_BINPUT"):
                if arg > puts:  # Python's pickler numbers its memo 0, 1, 2, ...
                    raise ConversionError(f"{where}: memo index {arg} at byte {pos} after {puts} puts")
                puts += 1
                memo[arg] = pop(1)[0]
                stack.append(memo[arg])
            elif name in ("BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise ConversionError(f"{where}: memo index {arg} at byte {pos} was never put")
                stack.append(memo[arg])
            elif name == "EMPTY_TUPLE":
                push_tuple([])
            elif name == "TUPLE":
                push_tuple(pop_mark())
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                push_tuple(pop(int(name[-1])))
            elif name == "BINPERSID":
                if pop(1)[0][0] != "storage id":
                    raise ConversionError(f"{where}: BINPERSID at byte {pos} of something other than a storage id")
                stack.append(("storage", 0))
            elif name in _CALLS:  # NEWOBJ: admitted in opaque mode only (_check_opcode)
                calls += 1
                if calls > MAX_PICKLE_CALLS:
                    raise ConversionError(f"{where}: the pickle makes more than {MAX_PICKLE_CALLS} calls")
                (fn, _), (args, _) = pop(2)
                if fn not in _CALLS[name] or args != "tuple":
                    raise ConversionError(f"{where}: {name} at byte {pos} calls a {fn} with a {args}")
                stack.append((_CALLS[name][fn], 0))
            elif name in ("BUILD", "SETITEM", "SETITEMS", "APPEND", "APPENDS"):
                values(pop_mark() if name in ("SETITEMS", "APPENDS") else pop({"SETITEM": 2}.get(name, 1)))
                target = pop(1)[0]
                if target[0] not in _TARGETS[name] and not (opaque and target[0] == "object"):
                    raise ConversionError(f"{where}: {name} at byte {pos} on a {target[0]}; in a state dict's pickle "
                                          f"it applies to {' or '.join(_TARGETS[name])} only")
                stack.append(target)
            elif name == "STOP":
                values(pop(1))
                if stack or marks or pos + 1 != len(data):
                    raise ConversionError(f"{where}: malformed pickle: STOP at byte {pos} of {len(data)} leaves "
                                          f"{len(stack)} object(s) and {len(marks)} mark(s)")
    except ConversionError:
        raise
    except (ValueError, struct.error, OverflowError) as e:  # genops: unknown opcode, truncated argument, bad UTF-8
        raise ConversionError(f"{where}: malformed pickle: {e}") from None


# Exceptions of unpickling a malformed (but scanned) pickle: wrong argument types or counts, a memo miss.
_MALFORMED = (pickle.UnpicklingError, EOFError, TypeError, ValueError, AttributeError, KeyError, IndexError,
              OverflowError, MemoryError, RecursionError, struct.error)


class _Opaque:
    """An object of a class a Lightning checkpoint names but that is never imported (OmegaConf's
    DictConfig and nodes, Lightning's loop state, a tokenizer): NEWOBJ and REDUCE keep its arguments,
    BUILD its state, SETITEM(S) and APPEND(S) its items. No code of the named class runs; only
    `_plain_config` reads these, by name. Each name gets its own subclass (`_opaque_class`)."""

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


def _opaque_class(module: str, name: str) -> type:
    return type("Opaque", (_Opaque,), {"opaque_name": f"{module}.{name}"})


class _StateDictUnpickler(pickle.Unpickler):
    """An unpickler that resolves only `_ALLOWED` names (others to inert `_Opaque` classes in opaque mode)
    and reads storages from the archive."""

    def __init__(self, file, archive: "_TorchArchive", opaque: bool = False):
        super().__init__(file)
        self._archive = archive
        self._opaque = opaque
        self._classes: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED and self._opaque:
            return self._classes.setdefault((module, name), _opaque_class(module, name))
        try:
            return _ALLOWED[(module, name)]
        except KeyError:  # the scan refuses these first; this is the second lock
            raise UnsafePickleError(f"{self._archive.path}: the pickle asks for {module}.{name}, which a state "
                                    "dict never needs; refused before anything ran") from None

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ConversionError(f"{self._archive.path}: unknown persistent id {_brief(pid)}")
        _, storage_type, key, location, numel = pid
        if not (isinstance(storage_type, _StorageType) and isinstance(key, str) and isinstance(location, str)
                and _is_index(numel)):
            raise ConversionError(f"{self._archive.path}: malformed storage id {_brief(pid)}")
        return self._archive.storage(key, storage_type.name, numel)


class _TorchArchive:
    """The zip archive torch.save writes: <prefix>/data.pkl + <prefix>/data/<key> storages.

    torch stores every member uncompressed (so that storages can be memory
    mapped); a compressed, encrypted or misplaced member is refused before a
    byte of it is read, which bounds every read by the size of the file.
    """

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            head = f.read(4)
            self.size = os.fstat(f.fileno()).st_size
        if head != b"PK\x03\x04":
            legacy = head[:2] == b"\x80\x02"
            raise ConversionError(
                f"{path} is not a zip archive written by torch.save"
                + (" (it is the legacy format of torch < 1.6: re-save it with a recent torch)" if legacy else ""))
        try:
            self.zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, struct.error, NotImplementedError,
                OSError) as e:  # OSError: a seek to a negative offset
            raise ConversionError(f"{path} is not a readable zip archive: {e}") from None
        self.prefix, self.byteorder = "", "<"  # of <prefix>data.pkl and <prefix>byteorder, set by `load`
        self._storages: dict[str, tuple[str, np.ndarray]] = {}  # key -> (storage type's name, its array)

    def _member(self, name: str) -> tuple[zipfile.ZipInfo, int]:
        """A member's entry and the offset of its bytes in the file, checked to be stored as torch stores it."""
        try:
            info = self.zip.getinfo(name)
        except KeyError:
            raise ConversionError(f"{self.path}: no member {name!r} in the archive") from None
        if info.flag_bits & 0x1:
            raise ConversionError(f"{self.path}: member {name!r} is encrypted; torch.save encrypts nothing")
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise ConversionError(f"{self.path}: member {name!r} is compressed (method {info.compress_type}); "
                                  "torch.save stores every member uncompressed")
        if not 0 <= info.header_offset < self.size:
            raise ConversionError(f"{self.path}: member {name!r} has its header at byte {info.header_offset}, outside "
                                  f"the {self.size}-byte file")
        with open(self.path, "rb") as f:
            f.seek(info.header_offset)
            header = f.read(30)
            if len(header) < 30 or header[:4] != b"PK\x03\x04":
                raise ConversionError(f"{self.path}: member {name!r} has no local header at byte {info.header_offset}")
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            stored_name = f.read(name_len)
        if stored_name != info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437"):
            raise ConversionError(f"{self.path}: member {name!r} is named {_brief(stored_name)} in its local header")
        offset = info.header_offset + 30 + name_len + extra_len
        if offset + info.file_size > self.size:
            raise ConversionError(f"{self.path}: member {name!r} claims {info.file_size} bytes at byte {offset}, "
                                  f"past the end of the {self.size}-byte file")
        return info, offset

    def _read(self, name: str, limit: int) -> bytes:
        info, offset = self._member(name)
        if info.file_size > limit:
            raise ConversionError(f"{self.path}: member {name!r} holds {info.file_size} bytes, more than the "
                                  f"{limit} a state dict's needs")
        with open(self.path, "rb") as f:
            f.seek(offset)
            data = f.read(info.file_size)
        if zlib.crc32(data) != info.CRC:
            raise ConversionError(f"{self.path}: member {name!r} fails its CRC check (a damaged file)")
        return data

    def storage(self, key: str, type_name: str, numel: int) -> np.ndarray:
        """Storage `key` as a read-only 1-D memory map of its member, numel elements of the named type."""
        if key in self._storages:
            seen, array = self._storages[key]
            if (seen, array.size) != (type_name, numel):
                raise ConversionError(f"{self.path}: storage {key!r} is named as {seen} of {array.size} and as "
                                      f"{type_name} of {numel}")
            return array
        dtype = _STORAGE_DTYPES[type_name]  # by name, from the allow-list: never from an object of the file
        if self.byteorder == ">" and dtype.itemsize > 1:
            dtype = dtype.newbyteorder(">")
        info, offset = self._member(f"{self.prefix}data/{key}")
        if info.file_size != numel * dtype.itemsize:
            raise ConversionError(f"{self.path}: storage {key!r} holds {info.file_size} bytes, not "
                                  f"{numel} x {dtype.itemsize}")
        array = np.memmap(self.path, dtype, mode="r", offset=offset, shape=(numel,)) if numel else np.zeros(0, dtype)
        self._storages[key] = (type_name, array)
        return array

    def load(self, opaque: bool = False) -> Any:
        with self.zip:  # the storages outlive it as memory maps
            pickles = [n for n in self.zip.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(pickles) != 1:
                raise ConversionError(f"{self.path}: expected one <name>/data.pkl in the archive, found "
                                      f"{_brief(pickles)}")
            self.prefix = pickles[0][: -len("data.pkl")]
            order = "little"  # older torch writes no byteorder member
            if self.prefix + "byteorder" in self.zip.namelist():
                order = self._read(self.prefix + "byteorder", 16).decode("ascii", "replace").strip()
            if order not in ("little", "big"):
                raise ConversionError(f"{self.path}: unknown byte order {_brief(order)}")
            self.byteorder = "<" if order == "little" else ">"
            data = self._read(pickles[0], MAX_PICKLE_BYTES)
            _scan_pickle(data, str(self.path), opaque)
            try:
                return _StateDictUnpickler(io.BytesIO(data), self, opaque).load()
            except ConversionError as e:  # the rebuild functions' messages do not know the file
                if str(e).startswith(str(self.path)):
                    raise
                raise type(e)(f"{self.path}: {e}") from None
            except _MALFORMED as e:
                raise ConversionError(f"{self.path}: malformed pickle: {type(e).__name__}: {_brief(str(e))}") from None


def load_torch(path: str | Path, opaque: bool = False) -> Any:
    """The object a `torch.save` zip archive holds, with tensors as (memory-mapped) numpy arrays.

    No torch is needed and no code in the file runs: the pickle may name only
    tensor rebuilders, storage types and OrderedDict, and is scanned
    (`_scan_pickle`) before it is unpickled. opaque=True (a Lightning
    checkpoint) admits any other name as an inert `_Opaque` stand-in.

    Raises:
      UnsafePickleError: the pickle names anything else (e.g. os.system).
      ConversionError: not such an archive, or a malformed one, or one past a bound.
    """
    return _TorchArchive(Path(path)).load(opaque)


_SAFETENSORS_DTYPES = types.MappingProxyType({
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U8": np.dtype("u1"), "BOOL": np.dtype("?")})


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
            raise ConversionError(f"{path}: not a safetensors file (its header would be {n} bytes of a "
                                  f"{size}-byte file; at most {MAX_HEADER_BYTES})")
        try:
            header = json.loads(f.read(n))
        except (ValueError, RecursionError) as e:
            raise ConversionError(f"{path}: the safetensors header is not JSON: {_brief(str(e))}") from None
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
        if not (dtype is not None and isinstance(shape, list) and len(shape) <= MAX_TENSOR_DIMS
                and all(map(_is_index, shape)) and isinstance(offsets, list) and len(offsets) == 2
                and all(map(_is_index, offsets)) and offsets[0] <= offsets[1] <= size - start):
            raise ConversionError(f"{path}: tensor {_brief(name)} has a malformed entry {_brief(entry)} "
                                  f"(dtype one of {sorted(_SAFETENSORS_DTYPES)}, data inside the file's "
                                  f"{size - start} data bytes)")
        numel = math.prod(shape)
        if offsets[1] - offsets[0] != numel * dtype.itemsize:
            raise ConversionError(f"{path}: tensor {_brief(name)} of shape {shape} and dtype {entry['dtype']} "
                                  f"needs {numel * dtype.itemsize} bytes, its offsets give {offsets[1] - offsets[0]}")
        spans.append((offsets[0], offsets[1], name))
        out[name] = (dtype, tuple(shape), offsets[0], numel)
    spans.sort()
    for (_, end, a), (begin, _, b) in zip(spans, spans[1:]):
        if begin < end:
            raise ConversionError(f"{path}: tensors {_brief(a)} and {_brief(b)} overlap")
    return {name: (np.memmap(path, dtype, mode="r", offset=start + begin, shape=(numel,)).reshape(shape) if numel
                   else np.zeros(shape, dtype))
            for name, (dtype, shape, begin, numel) in out.items()}


# =========================================================================== the original's config

# The sections the original's code reads to build and run the model (SEDD
# reads tokens, graph.type and model.*; sampling reads noise.*). They are
# checked strictly and are what converted.json keeps (with training.ema); the
# rest (training, optim, data, eval, sampling, ngpus, ...) configures training
# only and is dropped.
_MODEL_KEYS = {"name", "type", "hidden_size", "cond_dim", "length", "n_blocks", "n_heads", "scale_by_sigma", "dropout"}
_GRAPH_KEYS = {"type", "file", "report_all"}
_NOISE_KEYS = {"type", "sigma_min", "sigma_max"}
_GRAPHS = {"absorb": "absorbing", "uniform": "uniform"}
# Upper bounds on the model's sizes, checked before anything is built from them;
# sedd-medium has hidden_size 1024, 24 blocks, 16 heads, cond_dim 128, length 1024.
_SIZE_BOUNDS = {"hidden_size": 1 << 14, "n_blocks": 256, "n_heads": 256, "cond_dim": 1 << 14, "length": 1 << 17}
# The original's LogLinearNoise has eps = 1e-3 built in; its config has no field for it.
_LOGLINEAR_EPS = 1e-3


def _section(orig: Mapping, name: str, known: set[str]) -> Mapping:
    sec = orig.get(name)
    if not isinstance(sec, Mapping):
        raise ConversionError(f"the original's config has no {name!r} section")
    unknown = sorted(set(sec) - known)
    if unknown:
        raise ConversionError(f"unknown field(s) {[f'{name}.{k}' for k in unknown]} in the original's config; "
                              f"known: {sorted(known)}")
    return sec


def _field(sec: Mapping, section: str, key: str, kind: type):
    """sec[key] as `kind`; YAML 1.1 reads '1e-4' as a string, so numbers may come as text."""
    name = f"{section}.{key}" if section else key
    if key not in sec:
        raise ConversionError(f"the original's config has no {name}")
    value = sec[key]
    if kind is float and isinstance(value, str):
        try:  # YAML may keep "1e-4" a string
            value = float(value)
        except ValueError:
            pass  # not a number: the type check below names the field
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ConversionError(f"{name} = {value!r} in the original's config is not a {kind.__name__}")
    return value


# A Hugging Face config.json's fields that load code or describe the file, not the model: dropped on reading.
_HF_METADATA = frozenset({"architectures", "auto_map", "transformers_version", "torch_dtype", "return_dict",
                          "_name_or_path"})
# The model fields of kuleshov-group's published configs (MDLMConfig, BD3LMConfig), by model_type.
_HF_FIELDS = {"vocab_size", "model_length", "hidden_dim", "cond_dim", "n_blocks", "n_heads", "dropout",
              "time_conditioning", "model_type"}
_PEERS = {"mdlm": _HF_FIELDS, "duo": _HF_FIELDS,
          "bd3lm": _HF_FIELDS | {"block_size", "cross_attn", "adaln", "attn_backend", "causal", "var_min",
                                 "sampling_eps_min", "sampling_eps_max"}}
PEER_PREFIX = "backbone."  # the backbone's tensors inside MDLM's and BD3-LM's published state dicts
BD3LM_BUFFERS = ("sampling_eps_min", "sampling_eps_max")  # BD3-LM's clipped noise interval, outside the backbone


class Layout(NamedTuple):
    """How a source's state dict maps onto our network (`layout_of`).

    family: "sedd", "mdlm" or "bd3lm"; prefix: of the backbone's tensors;
    fold_sigma: the source feeds sigma = 0 to its sigma embedding
    (`fold_sigma_map`); buffers: names outside the backbone read separately.
    """

    family: str
    prefix: str = ""
    fold_sigma: bool = False
    buffers: tuple[str, ...] = ()


def layout_of(orig: Mapping) -> Layout:
    """The layout of a source by its config: a Hugging Face model_type, or the original SEDD's Hydra config."""
    if "model_type" not in orig:
        return Layout("sedd")
    family = orig["model_type"]
    if family not in _PEERS:
        raise ConversionError(f"model_type = {_brief(family)} in config.json; sedd convert reads the original SEDD "
                              f"(a training config) and the Hugging Face models of types {sorted(_PEERS)}")
    fold = not _field(orig, "", "time_conditioning", bool)
    return Layout(family, PEER_PREFIX, fold, BD3LM_BUFFERS if family == "bd3lm" else ())


def _config_from_peer(orig: Mapping, tokenizer_path: str, dtype: str) -> ml_collections.ConfigDict:
    """Our config of MDLM's (kuleshov-group/mdlm-owt), BD3-LM's (bd3lm-owt-block_size*) or DUO's model.

    orig: a Hugging Face config.json (MDLM, BD3-LM), or the same fields read
    from a DUO Lightning checkpoint (`_lightning_source`). All three are SEDD's
    DDiT with the log-linear schedule (eps 1e-3) over GPT-2's tokenizer. MDLM
    and BD3-LM: the absorbing graph over GPT-2's 50,257 tokens + MASK (id
    50,257), the output MDLM's SUBS (``model.normalize`` with
    ``scale_by_sigma``); BD3-LM is our block kind (``sedd.block``) over [x_t ;
    x_0] with its block size. DUO: the uniform graph over GPT-2's tokens + its
    [PAD], the output x0's law (``model.normalize`` without ``scale_by_sigma``).
    """
    family = orig["model_type"]
    unknown = sorted(set(orig) - _PEERS[family])
    if unknown:
        raise ConversionError(f"unknown field(s) {unknown} in the {family} config.json; known: "
                              f"{sorted(_PEERS[family])}")
    vocab = _field(orig, "", "vocab_size", int)
    if vocab != GPT2_TOKENS + 1:
        raise ConversionError(f"vocab_size = {vocab} in the {family} config.json; its published models are "
                              f"GPT-2's {GPT2_TOKENS} tokens + MASK = {GPT2_TOKENS + 1}")
    names = {"hidden_size": "hidden_dim", "n_blocks": "n_blocks", "n_heads": "n_heads", "cond_dim": "cond_dim",
             "length": "model_length"}
    sizes = {ours: _field(orig, "", theirs, int) for ours, theirs in names.items()}
    for key, value in sizes.items():
        if not 1 <= value <= _SIZE_BOUNDS[key]:
            raise ConversionError(f"{names[key]} = {value} in the {family} config.json is outside "
                                  f"[1, {_SIZE_BOUNDS[key]}]")
    hidden, heads = sizes["hidden_size"], sizes["n_heads"]
    if hidden % heads or (hidden // heads) % 2:
        raise ConversionError(f"hidden_dim = {hidden} and n_heads = {heads} give no even head size")
    time_conditioning = _field(orig, "", "time_conditioning", bool)
    if family == "duo" and not time_conditioning:
        raise ConversionError("algo.time_conditioning = false in the duo config: a uniform-state network "
                              "needs sigma (DUO trains with true)")
    c = config_lib.load_config("owt_small")
    c.model.kind = "ddit"
    if family == "bd3lm":
        for key, want in (("cross_attn", True), ("adaln", True), ("causal", False)):
            if orig.get(key, want) is not want:
                raise ConversionError(f"{key} = {_brief(orig[key])} in the bd3lm config.json; a block-diffusion "
                                      f"model has {key} = {want} (as the published ones)")
        if time_conditioning:
            raise ConversionError("time_conditioning = true in the bd3lm config.json: BD3-LM feeds the mean "
                                  "sigma of all blocks, which our block kind does not; the published models "
                                  "have false")
        block = _field(orig, "", "block_size", int)
        if not (1 <= block <= sizes["length"] and sizes["length"] % block == 0):
            raise ConversionError(f"block_size = {block} in the bd3lm config.json must divide model_length = "
                                  f"{sizes['length']}")
        c.model.kind, c.model.block_size = "block", block
    c.model.hidden_size, c.model.n_heads, c.model.n_blocks = hidden, heads, sizes["n_blocks"]
    c.model.cond_dim = sizes["cond_dim"]
    c.model.mlp_ratio = 4
    c.model.dropout = _field(orig, "", "dropout", float)
    if not 0.0 <= c.model.dropout < 1.0:
        raise ConversionError(f"dropout = {c.model.dropout} in the {family} config.json must be in [0, 1)")
    # MDLM, BD3-LM: SUBS, a log-softmax over the tokens (the MASK logit is never a prediction); DUO: a
    # log-softmax over all V = 50,258 ids (GPT-2's + its [PAD], every one a state of the uniform graph).
    c.model.scale_by_sigma = family != "duo"
    c.model.normalize = True
    c.model.time_conditioning = time_conditioning  # False: sigma_map folded into the adaLN biases
    c.model.dtype = dtype
    c.model.vocab_multiple = 1
    c.graph.type = "uniform" if family == "duo" else "absorbing"
    c.noise.type = "loglinear"
    c.noise.eps = _LOGLINEAR_EPS  # MDLM's LogLinearNoise: move chance (1 - 1e-3) t
    c.training.loss_chunk = 0 if family == "bd3lm" else c.training.loss_chunk
    c.data.tokenizer = "gpt2"
    c.data.tokenizer_path = str(tokenizer_path)
    c.data.seq_len = sizes["length"]
    c = ml_collections.ConfigDict(c.to_dict())
    c.vocab_size = GPT2_TOKENS + (family == "duo")  # DUO's [PAD] (id 50,257) is a token of its graph
    return c


def config_from_original(orig: Mapping, tokenizer_path: str = "", dtype: str = "float32") -> ml_collections.ConfigDict:
    """Our config (owt_small with the original's model, graph, noise and length) of an original config dict.

    A Hugging Face config.json of MDLM or BD3-LM (its model_type) is read by
    `_config_from_peer`.

    Args:
      orig: the original's config (config.json or .hydra/config.yaml, parsed).
      tokenizer_path: data.tokenizer_path of the result (GPT-2 files).
      dtype: model.dtype, the compute dtype ("float32", or "bfloat16" as the
        original's autocast on accelerators).
    Returns:
      a config for `sedd.kinds.build_model` with vocab_size set.
    Raises:
      ConversionError: naming an unknown, missing or inconsistent field.
    """
    if set(orig) == {"config"} and isinstance(orig["config"], Mapping):  # a mixin wrapping its init kwargs
        orig = orig["config"]
    if layout_of(orig).family != "sedd":
        return _config_from_peer(orig, tokenizer_path, dtype)
    model = _section(orig, "model", _MODEL_KEYS)
    graph = _section(orig, "graph", _GRAPH_KEYS)
    noise = _section(orig, "noise", _NOISE_KEYS)
    tokens = _field(orig, "", "tokens", int)
    if tokens != GPT2_TOKENS:
        raise ConversionError(f"tokens = {tokens} in the original's config, but its only tokenizer, GPT-2's, "
                              f"has {GPT2_TOKENS}")
    if model.get("type", "ddit") != "ddit":
        raise ConversionError(f"model.type = {model['type']!r}; only the original's 'ddit' exists")
    graph_type = _field(graph, "graph", "type", str)
    if graph_type not in _GRAPHS:
        raise ConversionError(f"graph.type = {graph_type!r}; the original knows {sorted(_GRAPHS)}")
    noise_type = _field(noise, "noise", "type", str)
    if noise_type not in ("geometric", "loglinear"):
        raise ConversionError(f"noise.type = {noise_type!r}; the original knows 'geometric' and 'loglinear'")
    sizes = {key: _field(model, "model", key, int) for key in _SIZE_BOUNDS}
    for key, value in sizes.items():
        if not 1 <= value <= _SIZE_BOUNDS[key]:
            raise ConversionError(f"model.{key} = {value} in the original's config is outside [1, {_SIZE_BOUNDS[key]}]")
    hidden, heads = sizes["hidden_size"], sizes["n_heads"]
    scale_by_sigma = _field(model, "model", "scale_by_sigma", bool)
    if scale_by_sigma and graph_type != "absorb":
        raise ConversionError("model.scale_by_sigma = true with graph.type = 'uniform': the original "
                              "asserts the absorbing graph there and cannot run this config")
    if hidden % heads or (hidden // heads) % 2:
        raise ConversionError(f"model.hidden_size = {hidden} and n_heads = {heads} give no even head size")

    c = config_lib.load_config("owt_small")
    c.model.kind = "ddit"
    c.model.hidden_size = hidden
    c.model.n_heads = heads
    c.model.n_blocks = sizes["n_blocks"]
    c.model.cond_dim = sizes["cond_dim"]
    c.model.mlp_ratio = 4  # fixed in the original's DDiTBlock
    c.model.dropout = _field(model, "model", "dropout", float)
    c.model.scale_by_sigma = scale_by_sigma
    c.model.normalize = False  # the original's score output
    c.model.dtype = dtype
    c.model.vocab_multiple = 1  # the original's tables, unpadded
    c.graph.type = _GRAPHS[graph_type]
    c.noise.type = noise_type
    c.noise.sigma_min = _field(noise, "noise", "sigma_min", float)
    c.noise.sigma_max = _field(noise, "noise", "sigma_max", float)
    c.noise.eps = _LOGLINEAR_EPS
    c.data.tokenizer = "gpt2"
    c.data.tokenizer_path = str(tokenizer_path)
    c.data.seq_len = sizes["length"]
    training = orig.get("training")
    if isinstance(training, Mapping) and training.get("ema") is not None:
        c.training.ema = _field(training, "training", "ema", float)
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


def read_original_config(path: str | Path) -> dict:
    """The sections of config.json (JSON) or .hydra/config.yaml (YAML) that the conversion reads.

    Returns:
      {"tokens", "model", "graph", "noise"} and training.ema where present, each
      value a scalar: what converted.json keeps of the original's config.
    Raises:
      ConversionError: too large, not JSON / YAML, a YAML alias, or a section
        that is not a mapping of scalars.
    """
    path = Path(path)
    if path.stat().st_size > MAX_TEXT_BYTES:
        raise ConversionError(f"{path} holds {path.stat().st_size} bytes; a config has at most {MAX_TEXT_BYTES}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConversionError(f"{path} is not UTF-8 text: {e}") from None
    if path.suffix in (".yaml", ".yml"):
        data = _load_yaml(text, path)
    else:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as e:
            raise ConversionError(f"{path} is not JSON: {_brief(str(e))}") from None
    if not isinstance(data, dict):
        raise ConversionError(f"{path} does not hold a config mapping")
    if set(data) == {"config"} and isinstance(data["config"], dict):  # a mixin wrapping its init kwargs
        data = data["config"]
    if "model_type" in data:  # a Hugging Face config of MDLM / BD3-LM: flat; its code-loading fields dropped
        kept = {key: value for key, value in data.items() if key not in _HF_METADATA}
    else:
        kept = {key: data[key] for key in ("tokens", "model", "graph", "noise") if key in data}
    if isinstance(data.get("training"), dict) and "ema" in data["training"]:
        kept["training"] = {"ema": data["training"]["ema"]}
    scalar = (str, int, float, bool, type(None))
    for name, value in kept.items():
        fields = value.items() if isinstance(value, dict) else [("", value)]
        for key, v in fields:
            if not isinstance(v, scalar):
                where = f"{name}.{key}" if key else name
                raise ConversionError(f"{where} in {path} is a {type(v).__name__}, not a number, string or bool")
    return kept


def _load_yaml(text: str, path: Path):
    """YAML with PyYAML's safe loader, aliases refused: Hydra writes none, and a few of them nest into gigabytes."""
    try:
        import yaml  # optional dependency: only Hydra run directories need it
    except ImportError as e:
        raise ImportError(f"reading {path} needs PyYAML: pip install pyyaml") from e

    class NoAliasLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise ConversionError(f"{path}: a YAML alias (*{_brief(event.anchor)}) at line "
                                      f"{event.start_mark.line + 1}; a Hydra config has none, and aliases are "
                                      "refused (a few can expand to gigabytes)")
            return super().compose_node(parent, index)

    try:
        return yaml.load(text, NoAliasLoader)  # noqa: S506 (a SafeLoader)
    except ConversionError:
        raise
    except (yaml.YAMLError, RecursionError, ValueError, OverflowError) as e:
        raise ConversionError(f"{path} is not YAML a config can hold: {' '.join(str(e).split())[:300]}") from None


# =========================================================================== state dict -> parameters


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
    linear = lambda src, dst: [(f"{src}.weight", f"{dst}.kernel", True), (f"{src}.bias", f"{dst}.bias", False)]
    out = [("vocab_embed.embedding", "vocab_embed.embedding", False)]
    if sigma_map:
        out += linear("sigma_map.mlp.0", "sigma_map.fc1") + linear("sigma_map.mlp.2", "sigma_map.fc2")
    for i in range(n_blocks):
        b = f"blocks.{i}"
        out += [(f"{b}.norm1.weight", f"{b}.norm1.scale", False),
                (f"{b}.attn_qkv.weight", f"{b}.attn_qkv.kernel", True),
                (f"{b}.attn_out.weight", f"{b}.attn_out.kernel", True),
                (f"{b}.norm2.weight", f"{b}.norm2.scale", False)]
        out += linear(f"{b}.mlp.0", f"{b}.mlp_in") + linear(f"{b}.mlp.2", f"{b}.mlp_out")
        out += linear(f"{b}.adaLN_modulation", f"{b}.adaLN_modulation")
    out += [("output_layer.norm_final.weight", "output_layer.norm_final.scale", False)]
    out += linear("output_layer.linear", "output_layer.linear")
    out += linear("output_layer.adaLN_modulation", "output_layer.adaLN_modulation")
    return out


def _path_name(path) -> str:
    """'blocks.0.attn_qkv.kernel' of a jax key path into an nnx.State (the Variable's 'value' dropped)."""
    parts = []
    for k in path:
        if isinstance(k, jax.tree_util.GetAttrKey):
            if k.name != "value":
                parts.append(k.name)
        elif isinstance(k, jax.tree_util.DictKey):
            parts.append(str(k.key))
        elif isinstance(k, jax.tree_util.SequenceKey):
            parts.append(str(k.idx))
        else:
            parts.append(str(k))
    return ".".join(parts)


def abstract_params(config) -> nnx.State:
    """The parameters of the config's network as ``jax.ShapeDtypeStruct``s (nothing is computed)."""
    _, params, _ = nnx.split(nnx.eval_shape(lambda: kinds.build_model(config)), nnx.Param, ...)
    return params


_FLOATS = {np.dtype(t) for t in (np.float16, np.float32, np.float64, ml_dtypes.bfloat16)}
_TENSORS = (np.ndarray, jax.Array, jax.ShapeDtypeStruct)


def _tensor_problem(name: str, x, shape: tuple[int, ...]) -> str | None:
    """Why x cannot be the float tensor of this shape, or None; checked before a byte of it is read."""
    if not isinstance(x, _TENSORS):
        return f"{name!r} is a {type(x).__name__}, not a tensor"
    if tuple(x.shape) != tuple(shape):
        return f"tensor {name!r} has shape {tuple(x.shape)}, the config needs {tuple(shape)}"
    if np.dtype(x.dtype) not in _FLOATS:
        return f"tensor {name!r} has dtype {x.dtype}, not a float type"
    return None


def _check_rotary(inv_freq, head_dim: int) -> str | None:
    """A problem with the rotary buffer, or None: it must be base^{-2j/K}, j < K/2, base 10000."""
    if isinstance(inv_freq, _TENSORS) and tuple(inv_freq.shape) != (head_dim // 2,):
        return (f"{ROTARY_KEY} has shape {tuple(inv_freq.shape)}, not ({head_dim // 2},): the checkpoint's "
                f"head size is not hidden_size / n_heads = {head_dim} of the config")
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


def convert_params(state_dict: Mapping[str, Any], config, prefix: str = "", fold_sigma: bool = False,
                   buffers: tuple[str, ...] = ()) -> nnx.State:
    """Our parameters of the config's network from a state dict (the original's, or a backbone's under `prefix`).

    Every target parameter is written exactly once, from the one source tensor
    `parameter_map` names for it, with the right shape; every source tensor is
    used (the rotary buffer by a check). Values may be arrays (returned as
    float32 jax arrays) or ``jax.ShapeDtypeStruct``s (returned as such:
    converting shapes alone checks a configuration without any weights).

    Args:
      state_dict: name -> tensor.
      config: the network's config.
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
    n_blocks = config.model.n_blocks
    plan = parameter_map(n_blocks, sigma_map=not fold_sigma)
    if sorted(dst for _, dst, _ in plan) != sorted(targets):  # a change in sedd.model not mirrored here
        raise ConversionError(f"internal: the parameter map does not cover the network exactly: "
                              f"{sorted(set(targets) ^ {dst for _, dst, _ in plan})}")
    problems, out = [], {}
    sd = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    outside = [k for k in state_dict if not k.startswith(prefix) and k not in buffers]
    if fold_sigma:  # read (shape-checked) but not mapped: folded into the adaLN biases below
        cond, freq = config.model.cond_dim, FREQ_DIM
        for src, shape in (("sigma_map.mlp.0.weight", (cond, freq)), ("sigma_map.mlp.0.bias", (cond,)),
                           ("sigma_map.mlp.2.weight", (cond, cond)), ("sigma_map.mlp.2.bias", (cond,))):
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
    used = {src for src, _, _ in plan} | ({f"sigma_map.mlp.{i}.{w}" for i in (0, 2) for w in ("weight", "bias")}
                                          if fold_sigma else set())
    if ROTARY_KEY in sd:
        used.add(ROTARY_KEY)
        problem = _check_rotary(sd[ROTARY_KEY], config.model.hidden_size // config.model.n_heads)
        if problem:
            problems.append(problem)
    unexpected = [prefix + k for k in sd if k not in used] + outside
    if unexpected:
        problems.append(f"tensor(s) {_brief(unexpected)} are not part of "
                        f"the network with n_blocks = {n_blocks}")
    if problems:
        raise ConversionError("the checkpoint does not fit the config:\n  " + "\n  ".join(problems[:20]))
    if fold_sigma and not any(isinstance(x, jax.ShapeDtypeStruct) for x in out.values()):
        out.update(fold_sigma_map(sd, n_blocks))  # the adaLN layers' names are the same on both sides
    as_array = lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else jnp.asarray(x)  # noqa: E731
    return jax.tree_util.tree_map_with_path(lambda p, _: as_array(out[_path_name(p)]), abstract)


def _scalar_buffer(sd: Mapping[str, Any], name: str) -> float:
    """A 0-d float buffer of a state dict (BD3-LM's sampling_eps_min / _max), finite, in [0, 1]."""
    x = sd.get(name)
    if x is None:
        raise ConversionError(f"missing tensor {name!r} (BD3-LM's clipped noise interval)")
    if not (isinstance(x, np.ndarray) and x.size == 1 and np.dtype(x.dtype) in _FLOATS):
        raise ConversionError(f"tensor {name!r} is {_brief(x)}, not one float")
    value = float(np.asarray(x, np.float64).reshape(()))
    if not 0.0 <= value <= 1.0:
        raise ConversionError(f"{name} = {value} is outside [0, 1]")
    return value


def count_parameters(params) -> int:
    """Number of scalars in a tree of arrays or shape structs."""
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


# =========================================================================== sources


@dataclasses.dataclass
class Source:
    """What a conversion reads.

    Attributes:
      config: the sections of the original's config that are read (`read_original_config`).
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


def _newest_snapshot(folder: Path) -> Path | None:
    found = [(int(m[1]), p) for p in folder.glob("checkpoint_*.pth")
             if (m := re.fullmatch(r"checkpoint_(\d+)\.pth", p.name))]
    return max(found)[1] if found else None


def locate(src: str | Path) -> tuple[Path, Path]:
    """(config file, weights file) of a published folder, a training run directory, or a weights file.

    A folder: model.safetensors (preferred: no pickle) or pytorch_model.bin
    beside config.json; else .hydra/config.yaml with
    checkpoints-meta/checkpoint.pth (the newest, as the original's
    load_model_local), else the highest checkpoints/checkpoint_N.pth. A file:
    its folder's config.json, or the run directory's .hydra/config.yaml above it.

    Raises:
      FileNotFoundError: saying which files were looked for.
    """
    src = Path(src).expanduser()
    if src.is_file():
        for config in (src.parent / "config.json", src.parent.parent / ".hydra" / "config.yaml"):
            if config.is_file():
                return config, src
        raise FileNotFoundError(f"no config.json beside {src} and no .hydra/config.yaml above it")
    if not src.is_dir():
        raise FileNotFoundError(f"no such file or folder: {src}")
    for weights in ("model.safetensors", "pytorch_model.bin"):
        if (src / weights).is_file():
            if not (src / "config.json").is_file():
                raise FileNotFoundError(f"{src / weights} has no config.json beside it")
            return src / "config.json", src / weights
    hydra = src / ".hydra" / "config.yaml"
    if hydra.is_file():
        meta = src / "checkpoints-meta" / "checkpoint.pth"
        weights = meta if meta.is_file() else _newest_snapshot(src / "checkpoints")
        if weights is None:
            raise FileNotFoundError(f"{src} has .hydra/config.yaml but neither checkpoints-meta/checkpoint.pth "
                                    "nor checkpoints/checkpoint_N.pth")
        return hydra, weights
    raise FileNotFoundError(
        f"{src} holds neither the published files (config.json + pytorch_model.bin or model.safetensors) nor "
        "an original training run (.hydra/config.yaml + checkpoints-meta/checkpoint.pth or "
        "checkpoints/checkpoint_N.pth)")


def _state_dict(obj, where: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping) or not all(isinstance(k, str) for k in obj):
        raise ConversionError(f"{where} is not a state dict (a mapping of names to tensors)")
    return obj


def _step(value, where: str) -> int:
    """A training checkpoint's step: an int (or a 0-d integer tensor) that fits the int32 of our checkpoint."""
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype.kind in "iu":
        value = int(value)
    if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31):
        raise ConversionError(f"{where}['step'] = {_brief(value)} is not a training step (an integer in [0, 2**31))")
    return value


MAX_CONFIG_DEPTH = 16  # OmegaConf containers nested in a Lightning checkpoint's hyper_parameters.config
MAX_CONFIG_NODES = 1 << 16  # values visited (a pickle's memo can share one container many times over)


def _plain_config(node, where: str, depth: int = 0, budget: list | None = None):
    """A Lightning checkpoint's OmegaConf DictConfig (`_Opaque` stand-ins) as plain dicts, lists and scalars.

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
    if isinstance(node, _Opaque):
        state = node.state if isinstance(node.state, dict) else {}
        name = node.opaque_name
        if name in ("omegaconf.dictconfig.DictConfig", "omegaconf.listconfig.ListConfig"):
            node = state.get("_content")
        elif name.startswith("omegaconf.nodes."):
            node = state.get("_val")
        else:
            raise ConversionError(f"{where} holds a {_brief(name)}, not an OmegaConf config")
    if isinstance(node, dict):
        if not all(isinstance(k, str) for k in node):
            raise ConversionError(f"{where} has a key that is not a string")
        return {k: _plain_config(v, f"{where}.{k}", depth + 1, budget) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_plain_config(v, f"{where}[{i}]", depth + 1, budget) for i, v in enumerate(node)]
    if node is None or isinstance(node, (str, int, float, bool)):
        return node
    raise ConversionError(f"{where} holds a {type(node).__name__}, not a config value")


def _lightning_source(path: Path, ema: bool) -> Source:
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
        raise ConversionError(f"{path}: algo.name = {_brief(algo.get('name'))}; sedd convert reads DUO's Lightning "
                              "checkpoints (MDLM and BD3-LM: their Hugging Face folders, config.json + "
                              "model.safetensors)")
    for key, want in (("parameterization", "mean"), ("causal_attention", False)):
        if algo.get(key, want) != want:
            raise ConversionError(f"{path}: algo.{key} = {_brief(algo.get(key))}; DUO's models have {want!r}")
    if noise.get("type") != "log-linear" or float(noise.get("eps", _LOGLINEAR_EPS)) != _LOGLINEAR_EPS:
        raise ConversionError(f"{path}: noise = {_brief(noise)}; DUO's log-linear schedule with eps "
                              f"{_LOGLINEAR_EPS} is the one our loglinear noise is")
    state = _state_dict(obj["state_dict"], f"{path}['state_dict']")
    embedding = state.get(PEER_PREFIX + "vocab_embed.embedding")
    if not isinstance(embedding, np.ndarray) or embedding.ndim != 2:
        raise ConversionError(f"{path}: state_dict has no tensor {PEER_PREFIX}vocab_embed.embedding")
    config = {"model_type": "duo", "vocab_size": int(embedding.shape[0]),
              "time_conditioning": algo.get("time_conditioning", True),
              **{theirs: model[ours] for theirs, ours in (
                  ("hidden_dim", "hidden_size"), ("n_blocks", "n_blocks"), ("n_heads", "n_heads"),
                  ("cond_dim", "cond_dim"), ("model_length", "length"), ("dropout", "dropout")) if ours in model}}
    n_blocks = config_from_original(config).model.n_blocks  # checks every field and size first
    step = _step(obj.get("global_step", 0), str(path))
    if not ema:
        return Source(config, path, path, state, state, step, "model")
    shadow = obj.get("ema", {}).get("shadow_params") if isinstance(obj.get("ema"), dict) else None
    if not isinstance(shadow, (list, tuple)):
        raise ConversionError(f"{path}['ema'] has no shadow_params list; use --no_ema for the raw weights")
    names = [PEER_PREFIX + name for name, _, _ in parameter_map(n_blocks)]
    if len(shadow) != len(names):
        raise ConversionError(f"{path}: the EMA holds {len(shadow)} tensors, the config's model has "
                              f"{len(names)} parameters")
    weights = dict(zip(names, shadow))
    if PEER_PREFIX + ROTARY_KEY in state:
        weights[PEER_PREFIX + ROTARY_KEY] = state[PEER_PREFIX + ROTARY_KEY]
    return Source(config, path, path, weights, state, step, "ema")


def read_source(src: str | Path, ema: bool = True) -> Source:
    """The config and weights of a source (see `locate`), EMA weights by default for a training checkpoint.

    The config is read and checked first, so that every size in it is bounded
    before the weights are read against it. A .ckpt file is a DUO Lightning
    checkpoint (`_lightning_source`), its config inside it.
    """
    if Path(src).expanduser().suffix == ".ckpt" and Path(src).expanduser().is_file():
        return _lightning_source(Path(src).expanduser(), ema)
    config_file, weights_file = locate(src)
    config = read_original_config(config_file)
    n_blocks = config_from_original(config).model.n_blocks
    if weights_file.suffix == ".safetensors":
        return Source(config, config_file, weights_file, load_safetensors(weights_file), None, 0, "published")
    obj = load_torch(weights_file)
    if not (isinstance(obj, Mapping) and "model" in obj and "ema" in obj):  # a bare state dict
        return Source(config, config_file, weights_file, _state_dict(obj, str(weights_file)), None, 0, "published")
    model = _state_dict(obj["model"], f"{weights_file}['model']")
    step = _step(obj.get("step", 0), str(weights_file))
    if not ema:
        return Source(config, config_file, weights_file, model, model, step, "model")
    shadow = obj["ema"].get("shadow_params") if isinstance(obj["ema"], Mapping) else None
    if not isinstance(shadow, (list, tuple)):
        raise ConversionError(f"{weights_file}['ema'] has no shadow_params list; use --no_ema for the raw weights")
    names = [src_name for src_name, _, _ in parameter_map(n_blocks)]
    if len(shadow) != len(names):
        raise ConversionError(f"{weights_file}: the EMA holds {len(shadow)} tensors, the config's model has "
                              f"{len(names)} parameters")
    weights = dict(zip(names, shadow))
    if ROTARY_KEY in model:
        weights[ROTARY_KEY] = model[ROTARY_KEY]
    return Source(config, config_file, weights_file, weights, model, step, "ema")


def _tokenizer_files(path: Path) -> list[Path]:
    """The GPT-2 tokenizer files at path (a tokenizer.json, or a folder with one or with vocab.json + merges.txt)."""
    if path.is_file():
        return [path]
    if (path / "tokenizer.json").is_file():
        return [path / "tokenizer.json"]
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        return [path / "vocab.json", path / "merges.txt"]
    return []


def _read_gpt2(path: Path, pad: bool = False) -> GPT2Tokenizer:
    """GPT2Tokenizer of path, any failure to parse its files a ConversionError."""
    try:
        return GPT2Tokenizer(str(path), pad=pad)
    except (FileNotFoundError, ImportError):
        raise
    except Exception as e:  # the tokenizers package raises a bare Exception for a malformed file
        raise ConversionError(f"{path}: not a readable GPT-2 tokenizer: {_brief(str(e))}") from None


def _check_destination(dst: Path) -> None:
    if dst.exists() and not dst.is_dir():
        raise ConversionError(f"{dst} is a file; choose a new directory (it was left as it is)")
    held = sorted(p.name for p in dst.iterdir()) if dst.is_dir() else []
    if held:
        raise ConversionError(f"{dst} already holds {_brief(held)}; choose a new or empty directory (it was "
                              "left as it is)")


# =========================================================================== conversion


def convert(src: str | Path, dst: str | Path, ema: bool = True, tokenizer_path: str | Path | None = None,
            dtype: str = "float32") -> dict:
    """Writes the run directory `dst` from the original's checkpoint at `src`.

    Args:
      src: a published folder, an original training run directory, or a weights file (see `locate`).
      dst: the new run directory; it must not exist, or be empty.
      ema: a training checkpoint's EMA weights (True, as the original samples) or its raw weights.
      tokenizer_path: GPT-2's tokenizer.json, or a folder with it or with
        vocab.json + merges.txt; default: those files inside src. Copied into dst/gpt2.
      dtype: the compute dtype written into the config.
    Returns:
      dict: parameters, step, weights (published / ema / model), source files.
    Raises:
      ConversionError, UnsafePickleError, FileNotFoundError, ImportError.
      dst is written whole or not at all: into a folder beside it, renamed to
      dst once everything was read, checked and written.
    """
    dst = Path(dst).expanduser().absolute()
    if not Path(src).expanduser().exists():
        raise FileNotFoundError(f"no such source {src}: give the published folder (config.json + "
                                "pytorch_model.bin or model.safetensors) or an original training run directory")
    _check_destination(dst)
    tok_src = Path(tokenizer_path or src).expanduser()
    if not tokenizer_path and tok_src.is_file():  # a weights file: look beside it
        tok_src = tok_src.parent
    tok_files = _tokenizer_files(tok_src)
    if not tok_files:
        raise FileNotFoundError(
            f"no GPT-2 tokenizer files at {tok_src}: pass --tokenizer_path pointing to GPT-2's tokenizer.json, or "
            "to a folder holding vocab.json and merges.txt (the files of the Hugging Face `gpt2` repository); "
            "nothing is downloaded")
    for f in tok_files:
        if f.stat().st_size > MAX_TOKENIZER_BYTES:
            raise ConversionError(f"{f} holds {f.stat().st_size} bytes; GPT-2's tokenizer files are far under "
                                  f"{MAX_TOKENIZER_BYTES}")
    _read_gpt2(tok_files[0] if len(tok_files) == 1 else tok_src)  # readable, or a clear error

    source = read_source(src, ema)
    tok_dir = dst / TOKENIZER_DIR
    config = config_from_original(source.config, str(tok_dir), dtype)
    layout = layout_of(source.config)
    read = lambda sd: convert_params(sd, config, layout.prefix, layout.fold_sigma, layout.buffers)  # noqa: E731
    weights = read(source.weights)
    raw = weights if source.raw is None or source.raw is source.weights else read(source.raw)
    summary = {"source": str(Path(src).absolute()), "config_file": str(source.config_file.absolute()),
               "weights_file": str(source.weights_file.absolute()), "weights": source.kind, "step": source.step,
               "parameters": count_parameters(weights), "family": layout.family, "original_config": source.config}
    if layout.fold_sigma:
        summary["folded"] = "the source feeds sigma = 0: its sigma embedding is folded into the adaLN biases"
    for name in layout.buffers:  # BD3-LM's clipped schedule: kept for the record (our bound runs t over [eps, 1])
        summary[name] = _scalar_buffer(source.weights, name)

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.parent / f".{dst.name}.converting-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        (tmp / TOKENIZER_DIR).mkdir()
        for f in tok_files:  # a lone JSON file is GPT-2's tokenizer.json, whatever its name
            shutil.copyfile(f, tmp / TOKENIZER_DIR / ("tokenizer.json" if len(tok_files) == 1 else f.name))
        tokenizer = _read_gpt2(tmp / TOKENIZER_DIR, pad=config.vocab_size == GPT2_TOKENS + 1)
        tokenizer.path = str(tok_dir)  # where the copy is once tmp is renamed to dst
        save_tokenizer(tokenizer, tmp / runs.TOKENIZER)
        (tmp / runs.CONFIG).write_text(config_lib.to_json(config))
        (tmp / PROVENANCE).write_text(json.dumps(summary, indent=2, sort_keys=True, default=str))
        state = {"step": jnp.asarray(source.step, jnp.int32), "params": raw, "ema": weights}
        manager = runs.checkpoint_manager(tmp, config)
        manager.save(source.step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state)), force=True)
        manager.wait_until_finished()
        manager.close()
        try:
            os.rename(tmp, dst)  # atomic; replaces an empty dst, refuses one that gained files meanwhile
        except OSError as e:
            raise ConversionError(f"{dst} could not take the converted run ({e.strerror}); it was left as it "
                                  "is") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return summary


def main(argv: list[str] | None = None) -> int:
    """`sedd convert SRC DST [--no_ema] [--tokenizer_path PATH] [--dtype D]`; returns the exit code."""
    p = argparse.ArgumentParser(
        prog="sedd convert",
        description="Convert PyTorch weights into a run directory for sedd sample / eval / serve: the original "
                    "SEDD's (the published folder with config.json + pytorch_model.bin or model.safetensors, or "
                    "an original training run directory), MDLM's and BD3-LM's Hugging Face folders, or a DUO "
                    "Lightning checkpoint (.ckpt). torch is not needed; see docs/pretrained.md.")
    p.add_argument("src", help="published folder, original training run directory, a weights file, or a DUO .ckpt")
    p.add_argument("dst", help="the new run directory")
    p.add_argument("--no_ema", action="store_true", help="a training checkpoint's raw weights instead of its EMA")
    p.add_argument("--tokenizer_path", default=None,
                   help="GPT-2's tokenizer.json, or a folder with vocab.json + merges.txt (default: inside SRC)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="compute dtype of the converted model (bfloat16 as the original on GPUs)")
    args = p.parse_args(argv)
    try:
        summary = convert(args.src, args.dst, ema=not args.no_ema, tokenizer_path=args.tokenizer_path,
                          dtype=args.dtype)
    except (ValueError, FileNotFoundError, ImportError, OSError) as e:
        print(f"sedd convert: error: {e}", file=sys.stderr)
        return 2
    print(f"converted {summary['weights_file']} ({summary['weights']} weights, step {summary['step']}, "
          f"{summary['parameters']:,} parameters) to {args.dst}")
    print(f"next: sedd sample --workdir {args.dst} --prefix 'Hello'")
    return 0
