"""Reading .bin / .pth without torch: the zip archive `torch.save` writes, through a restricted unpickler.

`torch.save` writes a zip archive: <name>/data.pkl, a pickle of the object in
which every tensor is `torch._utils._rebuild_tensor_v2(storage, offset, size,
stride, ...)` and every storage a persistent id ("storage",
torch.<Type>Storage, key, location, numel) whose bytes are the zip member
<name>/data/<key> (raw, in the byte order of <name>/byteorder, little-endian
when absent). A pickle can name any Python callable, so it is first scanned
opcode by opcode (`sedd.convert.pickle_scan`: only what a state dict's pickle
does, within bounds), then read by an unpickler that resolves only the names
a state dict needs (`sedd.convert.allowlist`) to immutable values: a
malicious file fails with `UnsafePickleError` or `ConversionError` and runs
nothing. Every file is read as hostile; docs/reliability.md lists what is
refused and how.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

import sedd.convert.pickle_scan as pickle_scan
from sedd.convert.allowlist import ALLOWED, STORAGE_DTYPES, StorageType, opaque_class
from sedd.convert.limits import MAX_PICKLE_BYTES, ConversionError, UnsafePickleError, brief, is_index

# Exceptions of unpickling a malformed (but scanned) pickle: wrong argument types or counts, a memo miss.
_MALFORMED = (
    pickle.UnpicklingError,
    EOFError,
    TypeError,
    ValueError,
    AttributeError,
    KeyError,
    IndexError,
    OverflowError,
    MemoryError,
    RecursionError,
    struct.error,
)


class _StateDictUnpickler(pickle.Unpickler):
    """An unpickler that resolves only `ALLOWED` names (others to inert `Opaque` classes in opaque mode)
    and reads storages from the archive."""

    def __init__(self, file, archive: "_TorchArchive", opaque: bool = False):
        super().__init__(file)
        self._archive = archive
        self._opaque = opaque
        self._classes: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str):
        if (module, name) not in ALLOWED and self._opaque:
            return self._classes.setdefault((module, name), opaque_class(module, name))
        try:
            return ALLOWED[(module, name)]
        except KeyError:  # the scan refuses these first; this is the second lock
            raise UnsafePickleError(
                f"{self._archive.path}: the pickle asks for {module}.{name}, which a state "
                "dict never needs; refused before anything ran"
            ) from None

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ConversionError(f"{self._archive.path}: unknown persistent id {brief(pid)}")
        _, storage_type, key, location, numel = pid
        if not (
            isinstance(storage_type, StorageType)
            and isinstance(key, str)
            and isinstance(location, str)
            and is_index(numel)
        ):
            raise ConversionError(f"{self._archive.path}: malformed storage id {brief(pid)}")
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
                + (" (it is the legacy format of torch < 1.6: re-save it with a recent torch)" if legacy else "")
            )
        try:
            self.zip = zipfile.ZipFile(path)
        except (
            zipfile.BadZipFile,
            zipfile.LargeZipFile,
            EOFError,
            ValueError,
            struct.error,
            NotImplementedError,
            OSError,
        ) as e:  # OSError: a seek to a negative offset
            raise ConversionError(f"{path} is not a readable zip archive: {e}") from None
        self.prefix, self.byteorder = "", "<"  # of <prefix>data.pkl and <prefix>byteorder, set by `load`
        self._storages: dict[str, tuple[str, np.ndarray]] = {}  # key -> (storage type's name, its array)
        self._map: np.ndarray | None = None  # the whole file, mapped once when the first storage is read

    def _member(self, name: str) -> tuple[zipfile.ZipInfo, int]:
        """A member's entry and the offset of its bytes in the file, checked to be stored as torch stores it."""
        try:
            info = self.zip.getinfo(name)
        except KeyError:
            raise ConversionError(f"{self.path}: no member {name!r} in the archive") from None
        if info.flag_bits & 0x1:
            raise ConversionError(f"{self.path}: member {name!r} is encrypted; torch.save encrypts nothing")
        if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
            raise ConversionError(
                f"{self.path}: member {name!r} is compressed (method {info.compress_type}); "
                "torch.save stores every member uncompressed"
            )
        if not 0 <= info.header_offset < self.size:
            raise ConversionError(
                f"{self.path}: member {name!r} has its header at byte {info.header_offset}, outside "
                f"the {self.size}-byte file"
            )
        with open(self.path, "rb") as f:
            f.seek(info.header_offset)
            header = f.read(30)
            if len(header) < 30 or header[:4] != b"PK\x03\x04":
                raise ConversionError(f"{self.path}: member {name!r} has no local header at byte {info.header_offset}")
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            stored_name = f.read(name_len)
        if stored_name != info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437"):
            raise ConversionError(f"{self.path}: member {name!r} is named {brief(stored_name)} in its local header")
        offset = info.header_offset + 30 + name_len + extra_len
        if offset + info.file_size > self.size:
            raise ConversionError(
                f"{self.path}: member {name!r} claims {info.file_size} bytes at byte {offset}, "
                f"past the end of the {self.size}-byte file"
            )
        return info, offset

    def _read(self, name: str, limit: int) -> bytes:
        info, offset = self._member(name)
        if info.file_size > limit:
            raise ConversionError(
                f"{self.path}: member {name!r} holds {info.file_size} bytes, more than the {limit} a state dict's needs"
            )
        with open(self.path, "rb") as f:
            f.seek(offset)
            data = f.read(info.file_size)
        if zlib.crc32(data) != info.CRC:
            raise ConversionError(f"{self.path}: member {name!r} fails its CRC check (a damaged file)")
        return data

    def storage(self, key: str, type_name: str, numel: int) -> np.ndarray:
        """Storage `key` as a read-only 1-D view of the archive's one memory map, numel elements of the named type."""
        if key in self._storages:
            seen, array = self._storages[key]
            if (seen, array.size) != (type_name, numel):
                raise ConversionError(
                    f"{self.path}: storage {key!r} is named as {seen} of {array.size} and as {type_name} of {numel}"
                )
            return array
        dtype = STORAGE_DTYPES[type_name]  # by name, from the allow-list: never from an object of the file
        if self.byteorder == ">" and dtype.itemsize > 1:
            dtype = dtype.newbyteorder(">")
        info, offset = self._member(f"{self.prefix}data/{key}")
        if info.file_size != numel * dtype.itemsize:
            raise ConversionError(
                f"{self.path}: storage {key!r} holds {info.file_size} bytes, not {numel} x {dtype.itemsize}"
            )
        if numel and self._map is None:
            # One map of the archive, every storage a view of it: a map holds a file descriptor of its own, and
            # a training checkpoint of ~1,250 storages mapped one by one failed under `ulimit -n 1024`.
            self._map = np.memmap(self.path, np.uint8, mode="r")
        array = self._map[offset : offset + info.file_size].view(dtype) if numel else np.zeros(0, dtype)
        self._storages[key] = (type_name, array)
        return array

    def load(self, opaque: bool = False) -> Any:
        with self.zip:  # the storages outlive it as memory maps
            pickles = [n for n in self.zip.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
            if len(pickles) != 1:
                raise ConversionError(
                    f"{self.path}: expected one <name>/data.pkl in the archive, found {brief(pickles)}"
                )
            self.prefix = pickles[0][: -len("data.pkl")]
            order = "little"  # older torch writes no byteorder member
            if self.prefix + "byteorder" in self.zip.namelist():
                order = self._read(self.prefix + "byteorder", 16).decode("ascii", "replace").strip()
            if order not in ("little", "big"):
                raise ConversionError(f"{self.path}: unknown byte order {brief(order)}")
            self.byteorder = "<" if order == "little" else ">"
            data = self._read(pickles[0], MAX_PICKLE_BYTES)
            pickle_scan.scan_pickle(data, str(self.path), opaque)
            try:
                return _StateDictUnpickler(io.BytesIO(data), self, opaque).load()
            except ConversionError as e:  # the rebuild functions' messages do not know the file
                if str(e).startswith(str(self.path)):
                    raise
                raise type(e)(f"{self.path}: {e}") from None
            except _MALFORMED as e:
                raise ConversionError(f"{self.path}: malformed pickle: {type(e).__name__}: {brief(str(e))}") from None


def load_torch(path: str | Path, opaque: bool = False) -> Any:
    """The object a `torch.save` zip archive holds, with tensors as (memory-mapped) numpy arrays, read as the
    module says (no torch, no code of the file run). opaque=True (a Lightning checkpoint) admits any other name
    as an inert `Opaque` stand-in.

    Raises:
      UnsafePickleError: the pickle names anything else (e.g. os.system).
      ConversionError: not such an archive, or a malformed one, or one past a bound.
    """
    return _TorchArchive(Path(path)).load(opaque)
