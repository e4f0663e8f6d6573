"""The opcode scan: a pickle unlike a state dict's is refused from its opcodes alone, before any of it is unpickled."""

from __future__ import annotations

import pickletools
import struct

from sedd.convert.allowlist import ALLOWED
from sedd.convert.limits import (
    MAX_PICKLE_CALLS,
    MAX_PICKLE_OPCODES,
    MAX_STRING_CHARS,
    MAX_TUPLE_NESTING,
    ConversionError,
    UnsafePickleError,
)

# Opcodes that push one object, by kind; the rest are handled one by one in `scan_pickle`.
_PUSHES = {
    "EMPTY_DICT": "dict",
    "EMPTY_LIST": "list",
    **dict.fromkeys(
        ("NONE", "NEWTRUE", "NEWFALSE", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "BINUNICODE"), "value"
    ),
}
# The opcodes of protocol 2, torch.save's default, that Python's pickler writes
# for a state dict, a training checkpoint and an optimizer's state: these and those of `_PUSHES`.
_OPCODES = frozenset(
    {
        "PROTO",
        "STOP",
        "MARK",
        "GLOBAL",
        "REDUCE",
        "BUILD",
        "BINPERSID",
        "BINPUT",
        "LONG_BINPUT",
        "BINGET",
        "LONG_BINGET",
        "EMPTY_TUPLE",
        "TUPLE",
        "TUPLE1",
        "TUPLE2",
        "TUPLE3",
        "SETITEM",
        "SETITEMS",
        "APPEND",
        "APPENDS",
        *_PUSHES,
    }
)
# The kinds of object a GLOBAL pushes: they may only be called or named in a storage id, never kept.
_NAMES = ("OrderedDict class", "storage type", "function")
# What BUILD (torch's `_metadata` of a state dict), SETITEM(S) and APPEND(S) may apply to.
_TARGETS = {
    "BUILD": ("OrderedDict",),
    "SETITEM": ("dict", "OrderedDict"),
    "SETITEMS": ("dict", "OrderedDict"),
    "APPEND": ("list",),
    "APPENDS": ("list",),
}
# What REDUCE and NEWOBJ may call, by kind, and the kind of what they push (opaque: `Opaque` stand-ins).
_CALLS = {
    "REDUCE": {"OrderedDict class": "OrderedDict", "function": "tensor", "opaque class": "object"},
    "NEWOBJ": {"opaque class": "object"},
}


class _Stack:
    """The kinds of the objects on the unpickler's stack as `scan_pickle` follows a pickle; nothing is built.

    op, pos: the opcode being scanned and its byte, named in every message.
    """

    def __init__(self, where: str):
        self.where = where
        self.items: list[tuple[str, int]] = []  # (kind, tuple nesting) of each object on the unpickler's stack
        self.marks: list[int] = []  # stack heights at each MARK
        self.op, self.pos = "", 0

    def pop(self, n: int) -> list[tuple[str, int]]:
        if len(self.items) - (self.marks[-1] if self.marks else 0) < n:
            raise ConversionError(f"{self.where}: malformed pickle: {self.op} at byte {self.pos} pops an empty stack")
        items = self.items[len(self.items) - n :]
        del self.items[len(self.items) - n :]
        return items

    def pop_mark(self) -> list[tuple[str, int]]:
        if not self.marks:
            raise ConversionError(f"{self.where}: malformed pickle: {self.op} at byte {self.pos} without a MARK")
        start = self.marks.pop()
        items = self.items[start:]
        del self.items[start:]
        return items

    def values(self, items, storage_id=False):
        """items, checked to be values: a name is only called (REDUCE) or, a storage type, named in a storage id."""
        for kind, _ in items:
            if kind == "opaque class":  # an inert stand-in (typing.Any as OmegaConf's ref_type)
                continue
            if (kind in _NAMES and not (storage_id and kind == "storage type")) or kind == "storage id":
                raise ConversionError(
                    f"{self.where}: {self.op} at byte {self.pos} uses a {kind} as a value; a state "
                    "dict's pickle only calls its names or puts a storage type in a storage id"
                )
        return items

    def push_tuple(self, items):
        item_kinds = [kind for kind, _ in self.values(items, storage_id=True)]
        depth = 1 + max((d for _, d in items), default=0)
        if depth > MAX_TUPLE_NESTING:
            raise ConversionError(f"{self.where}: tuples nested {depth} deep at byte {self.pos}; a state dict nests 2")
        self.items.append(("storage id" if "storage type" in item_kinds else "tuple", depth))


def _check_opcode(i: int, name: str, arg, pos: int, where: str, opaque: bool = False) -> None:
    """Opcode i of a pickle (at byte pos) is one a state dict uses, within the count, after protocol 2."""
    if name not in _OPCODES and not (opaque and name == "NEWOBJ"):
        raise ConversionError(
            f"{where}: the pickle uses opcode {name} at byte {pos}, which a state dict "
            "never does; refused before anything was unpickled"
        )
    if i >= MAX_PICKLE_OPCODES:
        raise ConversionError(f"{where}: the pickle has more than {MAX_PICKLE_OPCODES} opcodes")
    if name == "PROTO" and (i != 0 or arg != 2):
        raise ConversionError(f"{where}: pickle protocol {arg} at byte {pos}; torch.save writes 2")
    if name != "PROTO" and i == 0:
        raise ConversionError(f"{where}: the pickle does not start with protocol 2 as torch.save writes it")


def scan_pickle(data: bytes, where: str, opaque: bool = False) -> None:
    """Refuses a pickle unlike a state dict's, from its opcodes alone, before any of it is unpickled.

    opaque (a Lightning checkpoint): any other name is an inert `Opaque`
    that NEWOBJ / REDUCE build and BUILD, SETITEM(S), APPEND(S) fill, and a
    string may be as long as the pickle; every other rule stands.

    Python's C unpickler sizes its memo to the largest index it is given
    (LONG_BINPUT 2**27: 2 GB) and trusts declared lengths; BUILD sets the
    attributes of any object. The scan follows the kind of each object on the
    stack (`pickletools.genops`; nothing is built) and admits only `_OPCODES`;
    names of `ALLOWED`, each called or (a storage type) named in a storage
    id, never kept as a value; memo indices up to the number of puts so far;
    BUILD on an OrderedDict only (torch's `_metadata`); and bounded strings,
    opcodes, calls and tuple nesting.

    Raises:
      UnsafePickleError: a name outside the allow-list.
      ConversionError: anything else a state dict does not do.
    """
    s = _Stack(where)
    memo: dict[int, tuple[str, int]] = {}
    puts = calls = 0

    try:
        for i, (op, arg, pos) in enumerate(pickletools.genops(data)):
            name = s.op = op.name
            s.pos = pos
            _check_opcode(i, name, arg, pos, where, opaque)
            if name in _PUSHES:
                if name == "BINUNICODE" and len(arg) > MAX_STRING_CHARS and not opaque:
                    raise ConversionError(f"{where}: a string of {len(arg)} characters at byte {pos}")
                s.items.append((_PUSHES[name], 0))
            elif name == "MARK":
                s.marks.append(len(s.items))
            elif name == "GLOBAL":
                module, _, attr = arg.partition(" ")
                if (module, attr) not in ALLOWED and not opaque:
                    raise UnsafePickleError(
                        f"{where}: the pickle asks for {module}.{attr}, which a state dict never needs; refused "
                        "before anything ran. Only tensors, storages and plain containers are read. If the file "
                        "is trusted, re-save its state dict with safetensors."
                    )
                kind = {"collections": "OrderedDict class", "torch": "storage type"}.get(module, "function")
                s.items.append((kind if (module, attr) in ALLOWED else "opaque class", 0))
            elif name in ("BINPUT", "LONG_BINPUT"):
                if arg > puts:  # Python's pickler numbers its memo 0, 1, 2, ...
                    raise ConversionError(f"{where}: memo index {arg} at byte {pos} after {puts} puts")
                puts += 1
                memo[arg] = s.pop(1)[0]
                s.items.append(memo[arg])
            elif name in ("BINGET", "LONG_BINGET"):
                if arg not in memo:
                    raise ConversionError(f"{where}: memo index {arg} at byte {pos} was never put")
                s.items.append(memo[arg])
            elif name == "EMPTY_TUPLE":
                s.push_tuple([])
            elif name == "TUPLE":
                s.push_tuple(s.pop_mark())
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                s.push_tuple(s.pop(int(name[-1])))
            elif name == "BINPERSID":
                if s.pop(1)[0][0] != "storage id":
                    raise ConversionError(f"{where}: BINPERSID at byte {pos} of something other than a storage id")
                s.items.append(("storage", 0))
            elif name in _CALLS:  # NEWOBJ: admitted in opaque mode only (_check_opcode)
                calls += 1
                if calls > MAX_PICKLE_CALLS:
                    raise ConversionError(f"{where}: the pickle makes more than {MAX_PICKLE_CALLS} calls")
                (fn, _), (args, _) = s.pop(2)
                if fn not in _CALLS[name] or args != "tuple":
                    raise ConversionError(f"{where}: {name} at byte {pos} calls a {fn} with a {args}")
                s.items.append((_CALLS[name][fn], 0))
            elif name in ("BUILD", "SETITEM", "SETITEMS", "APPEND", "APPENDS"):
                s.values(s.pop_mark() if name in ("SETITEMS", "APPENDS") else s.pop({"SETITEM": 2}.get(name, 1)))
                target = s.pop(1)[0]
                if target[0] not in _TARGETS[name] and not (opaque and target[0] == "object"):
                    raise ConversionError(
                        f"{where}: {name} at byte {pos} on a {target[0]}; in a state dict's pickle "
                        f"it applies to {' or '.join(_TARGETS[name])} only"
                    )
                s.items.append(target)
            elif name == "STOP":
                s.values(s.pop(1))
                if s.items or s.marks or pos + 1 != len(data):
                    raise ConversionError(
                        f"{where}: malformed pickle: STOP at byte {pos} of {len(data)} leaves "
                        f"{len(s.items)} object(s) and {len(s.marks)} mark(s)"
                    )
    except ConversionError:
        raise
    except (ValueError, struct.error, OverflowError) as e:  # genops: unknown opcode, truncated argument, bad UTF-8
        raise ConversionError(f"{where}: malformed pickle: {e}") from None
