"""sedd convert against hostile files (issue 33): each finding reproduced with a small file written here, and
a fuzz test of the unpickler.

The archives are laid out as torch.save writes them, their pickles written by
Python's own pickler (pickle._Pickler, as torch.save uses it) with torch's
names stood in for: memo puts and gets, the storage types' memo reuse, and the
BUILD of a state dict's `_metadata` are all as in a real file. The memory
bombs and the fuzz run in a fresh Python (`isolated`): a crash stays there,
and the peak RSS it reports is its own.
"""

import bz2
import collections
import contextlib
import io
import json
import pickle
import pickletools
import re
import resource
import struct
import subprocess
import sys
import time
import zipfile
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from sedd import checkpoints, cli, convert, runs
from test_convert import original_config, original_shapes, random_state_dict

HERE = Path(__file__).resolve().parent
SMALL = dict(hidden_size=4, n_blocks=1, n_heads=2, cond_dim=4)  # the smallest SEDD: 0.4 M parameters, all embedding
RSS_GROWTH_MB = 100  # what loading any one hostile file may add to a process's peak RSS


# --------------------------------------------------------------------------- torch.save's layout


class Global:
    """A class or function torch pickles by name (torch.FloatStorage, torch._utils._rebuild_tensor_v2, ...)."""

    def __init__(self, module, name):
        self.module, self.name = module, name

    def __call__(self, *args):  # pickle's save_reduce asks for a callable
        raise NotImplementedError


REBUILD = Global("torch._utils", "_rebuild_tensor_v2")
STORAGE_TYPES = {
    np.dtype(np.float32): Global("torch", "FloatStorage"),
    np.dtype(np.float16): Global("torch", "HalfStorage"),
    np.dtype(ml_dtypes.bfloat16): Global("torch", "BFloat16Storage"),
    np.dtype(np.int64): Global("torch", "LongStorage"),
}


class Storage:
    """A storage: a 1-D array, pickled as the persistent id ("storage", torch.<T>Storage, key, "cpu", numel)."""

    def __init__(self, array):
        self.array = np.ascontiguousarray(array).reshape(-1)


class Tensor:
    """A tensor as torch pickles it: _rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())."""

    def __init__(self, storage, offset=0, size=None, stride=None):
        self.storage, self.offset = storage, offset
        self.size = tuple(storage.array.shape if size is None else size)
        self.stride = tuple(
            stride if stride is not None else [int(np.prod(self.size[i + 1 :])) for i in range(len(self.size))]
        )

    @classmethod
    def of(cls, array):
        return cls(Storage(array), 0, np.shape(array))

    def value(self) -> np.ndarray:
        a = self.storage.array
        return np.lib.stride_tricks.as_strided(a[self.offset :], self.size, [s * a.itemsize for s in self.stride])

    def __reduce_ex__(self, protocol):
        return REBUILD, (self.storage, self.offset, self.size, self.stride, False, collections.OrderedDict())


class TorchPickler(pickle._Pickler):
    """Python's pickler as torch.save drives it: storages as persistent ids, their bytes kept for the archive."""

    dispatch = dict(pickle._Pickler.dispatch)

    def __init__(self, file):
        super().__init__(file, protocol=2)
        self.keys, self.storages = {}, {}  # id(Storage) -> key; key -> its bytes

    def save_global_name(self, obj):
        self.write(pickle.GLOBAL + f"{obj.module}\n{obj.name}\n".encode())
        self.memoize(obj)

    dispatch[Global] = save_global_name

    def persistent_id(self, obj):
        if not isinstance(obj, Storage):
            return None
        key = self.keys.setdefault(id(obj), str(len(self.keys)))
        self.storages[key] = obj.array.tobytes()
        return "storage", STORAGE_TYPES[obj.array.dtype], key, "cpu", obj.array.size


def torch_pickle(obj) -> tuple[bytes, dict[str, bytes]]:
    buf = io.BytesIO()
    pickler = TorchPickler(buf)
    pickler.dump(obj)
    return buf.getvalue(), pickler.storages


def write_archive(path: Path, data_pkl: bytes, storages: dict[str, bytes]) -> Path:
    """A torch.save archive: archive/data.pkl, byteorder, data/<key> and version, all stored (uncompressed)."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", data_pkl)
        z.writestr("archive/byteorder", b"little")
        for key, data in storages.items():
            z.writestr(f"archive/data/{key}", data)
        z.writestr("archive/version", b"3\n")
    return path


def torch_save(path: Path, obj) -> Path:
    return write_archive(path, *torch_pickle(obj))


def state_dict(arrays: dict) -> collections.OrderedDict:
    """module.state_dict() as torch pickles it: an OrderedDict of tensors with a `_metadata` attribute."""
    sd = collections.OrderedDict((k, Tensor.of(v)) for k, v in arrays.items())
    sd._metadata = collections.OrderedDict([("", {"version": 1})])
    return sd


def small_weights(seed=0) -> dict:
    return random_state_dict(original_shapes(**SMALL), seed)


def training_run(folder: Path, step, weights: dict) -> Path:
    """An original training run directory: .hydra/config.yaml and checkpoints-meta/checkpoint.pth."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / "checkpoints-meta").mkdir()
    c = original_config(**SMALL)
    m, g, n = c["model"], c["graph"], c["noise"]
    (folder / ".hydra" / "config.yaml").write_text(
        f"tokens: {c['tokens']}\ntraining:\n  ema: 0.9999\n"
        f"graph:\n  type: {g['type']}\n  file: data\n  report_all: false\n"
        f"noise:\n  type: {n['type']}\n  sigma_min: 1e-4\n  sigma_max: 20\nmodel:\n"
        + "".join(f"  {k}: {str(v).lower() if isinstance(v, bool) else v}\n" for k, v in m.items())
    )
    params = [k for k in weights if k != "rotary_emb.inv_freq"]
    torch_save(
        folder / "checkpoints-meta" / "checkpoint.pth",
        {
            "model": state_dict(weights),
            "step": step,
            "ema": {"decay": 0.9999, "num_updates": 7, "shadow_params": [Tensor.of(weights[k]) for k in params]},
        },
    )
    return folder


def ops(*parts) -> bytes:
    """A pickle by hand: bytes as they are, str as BINUNICODE, int as BININT, ("module", "name") as GLOBAL."""
    out = bytearray(b"\x80\x02")
    for p in parts:
        if isinstance(p, bytes):
            out += p
        elif isinstance(p, str):
            out += b"X" + struct.pack("<I", len(p.encode())) + p.encode()
        elif isinstance(p, int):
            out += b"J" + struct.pack("<i", p)
        else:
            out += b"c" + f"{p[0]}\n{p[1]}\n".encode()
    return bytes(out + b".")


ODICT = (("collections", "OrderedDict"), b")R")  # collections.OrderedDict()


def one_tensor_pickle(storage_type_build: bytes = b"", target_build: bytes = b"", numel: int = 1) -> bytes:
    """{"rotary_emb.inv_freq": float32 tensor of storage "0"}, optionally with a BUILD after the storage type
    or after the tensor."""
    return ops(
        *ODICT,
        "rotary_emb.inv_freq",
        ("torch._utils", "_rebuild_tensor_v2"),
        b"((",
        "storage",
        ("torch", "FloatStorage"),
        storage_type_build,
        "0",
        "cpu",
        numel,
        b"tQ",
        0,
        b"(",
        numel,
        b"t(",
        1,
        b"t\x89",
        *ODICT,
        b"tR",
        target_build,
        b"s",
    )


def raw_zip(members: list[tuple[str, bytes, int, int, int]]) -> bytes:
    """A zip assembled by hand from (name, bytes as stored, method, declared size, CRC) per member: a
    compressed member is given as its stream, never inflated here."""
    body, central = b"", b""
    for name, data, method, size, crc in members:
        n = name.encode()
        central += (
            struct.pack(
                "<4sHHHHHHIIIHHHHHII",
                b"PK\x01\x02",
                20,
                20,
                0,
                method,
                0,
                0,
                crc,
                len(data),
                size,
                len(n),
                0,
                0,
                0,
                0,
                0,
                len(body),
            )
            + n
        )
        body += struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(data), size, len(n), 0)
        body += n + data
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), len(body), 0)
    return body + central + end


def stored(name: str, data: bytes) -> tuple[str, bytes, int, int, int]:
    return name, data, zipfile.ZIP_STORED, len(data), zlib.crc32(data)


def zeros_compressed(compressor, n_chunks: int, head: bytes = b"", tail: bytes = b"") -> tuple[bytes, int, int]:
    """(stream, size, CRC) of head + n_chunks x 16 MiB of zeros + tail, compressed chunk by chunk."""
    chunk, crc = bytes(1 << 24), zlib.crc32(head)
    out = compressor.compress(head)
    for _ in range(n_chunks):
        out += compressor.compress(chunk)
        crc = zlib.crc32(chunk, crc)
    out += compressor.compress(tail) + compressor.flush()
    return out, len(head) + n_chunks * len(chunk) + len(tail), zlib.crc32(tail, crc)


def cli_convert(src, dst, tokenizer, capsys) -> tuple[int, str]:
    rc = cli.main(["convert", str(src), str(dst), "--tokenizer_path", str(tokenizer)])
    return rc, capsys.readouterr().err


# --------------------------------------------------------------------------- a fresh Python for bombs and the fuzz


def isolated(name: str, *args) -> dict:
    """name(*args) of this module in a fresh Python: its result, and the peak RSS it added over the imports."""
    code = (
        f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import test_hostile_files as m; "
        f"print(json.dumps(m.measured({name!r}, *{args!r})))"
    )
    proc = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, timeout=300, cwd=HERE.parent
    )
    assert proc.returncode == 0, f"the child exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.splitlines()[-1])


def measured(name: str, *args) -> dict:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    result = globals()[name](*args)
    result["rss_growth_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    return result


def run_each(argvs: list[list[str]]) -> dict:
    """Each ["convert", SRC, DST, ...] through convert.main, each ["load", PATH] through load_torch."""
    outcomes = []
    for argv in argvs:
        if argv[0] == "convert":
            with contextlib.redirect_stderr(io.StringIO()) as err:
                rc = convert.main(argv[1:])
            outcomes.append(f"exit {rc}: {err.getvalue().strip()}")
        else:
            try:
                obj = convert.load_torch(argv[1])
                outcomes.append(f"loaded {type(obj).__name__} of {len(obj)}")
            except convert.ConversionError as e:
                outcomes.append(f"refused: {e}")
    return {"outcomes": outcomes}


# --------------------------------------------------------------------------- finding 1: BUILD


def test_build_cannot_give_a_storage_type_a_dtype_and_poisons_nothing(tmp_path, monkeypatch):
    half = {"0": np.float32(0.5).tobytes()}
    benign = write_archive(tmp_path / "benign.pth", one_tensor_pickle(), half)
    words = {"0": b"\x41" * 8}  # 0x4141414141414141: a PyObject pointer, were the bytes mapped as dtype=object
    state = b"}X\x05\x00\x00\x00dtypeX\x01\x00\x00\x00Osb"  # BUILD {"dtype": "O"}
    slot_state = b"N}X\x05\x00\x00\x00dtypeX\x01\x00\x00\x00Os\x86b"  # BUILD (None, {"dtype": "O"}): setattr
    exploits = {
        "storage type, state": (one_tensor_pickle(storage_type_build=state), words),
        "storage type, slot state": (one_tensor_pickle(storage_type_build=slot_state), words),
        "tensor": (one_tensor_pickle(target_build=state), half),
        "rebuild function": (
            ops(("torch._utils", "_rebuild_tensor_v2"), b"N}X\x0c\x00\x00\x00__defaults__)s\x86b"),
            {},
        ),
    }
    for scan in (True, False):  # the opcode scan, then the unpickler alone (the second lock)
        if not scan:
            monkeypatch.setattr(convert.pickle_scan, "scan_pickle", lambda data, where, opaque=False: None)
        for name, (payload, storages) in exploits.items():
            with pytest.raises(convert.ConversionError, match="BUILD at byte" if scan else "malformed pickle"):
                convert.load_torch(write_archive(tmp_path / f"{name}.pth", payload, storages))
            got = convert.load_torch(benign)["rotary_emb.inv_freq"]  # nothing outlived the refused file
            assert got.dtype == np.float32 and got.tolist() == [0.5], name
    storage_type = convert.allowlist.ALLOWED[("torch", "FloatStorage")]
    assert not hasattr(storage_type, "__dict__") and not hasattr(storage_type, "__setstate__")
    with pytest.raises(AttributeError):
        storage_type.name = "x"
    assert not any(d.hasobject for d in convert.allowlist.STORAGE_DTYPES.values())
    assert convert.allowlist._rebuild_tensor.__defaults__ == (False, None, None)


def test_a_converted_state_dict_with_a_build_exploit_exits_2_and_writes_nothing(tmp_path, gpt2_files, capsys):
    weights = small_weights()
    sd_pickle, storages = torch_pickle(state_dict(weights))
    # The file: the rotary buffer's storage type given dtype "O" by BUILD before its storage id.
    exploit = sd_pickle.replace(
        b"ctorch\nFloatStorage\nq", b"ctorch\nFloatStorage\n}X\x05\x00\x00\x00dtypeX\x01\x00\x00\x00Osbq", 1
    )
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(original_config(**SMALL)))
    write_archive(src / "pytorch_model.bin", exploit, storages)
    rc, err = cli_convert(src, tmp_path / "run", gpt2_files, capsys)
    assert rc == 2 and err.count("\n") == 1 and "BUILD" in err and not (tmp_path / "run").exists()


# --------------------------------------------------------------------------- finding 2: allocation bombs


def test_memory_bombs_are_refused_with_bounded_memory(tmp_path, gpt2_files):
    def published(name, archive: bytes) -> Path:
        f = tmp_path / name
        f.mkdir()
        (f / "config.json").write_text(json.dumps(original_config(**SMALL)))
        (f / "pytorch_model.bin").write_bytes(archive)
        return f

    # The were 1 GiB; 128 MiB is past the bound below and quicker to compress here.
    bz2_stream, bz2_size, bz2_crc = zeros_compressed(bz2.BZ2Compressor(9), 8)  # ~150 bytes
    pkl, pkl_size, pkl_crc = zeros_compressed(
        zlib.compressobj(6, zlib.DEFLATED, -15), 8, b"\x80\x04\x8e" + struct.pack("<Q", 2**27), b"."
    )  # ~130 kB
    laughs = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else 'lol'}]\n" for i in range(10))
    cases = {
        "memo 2**27 without PROTO, 9 bytes": published(
            "memo27", raw_zip([stored("archive/data.pkl", b"Nr" + struct.pack("<I", 2**27) + b".")])
        ),
        "memo 2**32 - 1 after PROTO 2": published(
            "memo32", raw_zip([stored("archive/data.pkl", b"\x80\x02Nr" + struct.pack("<I", 2**32 - 1) + b".")])
        ),
        "bzip2 storage inflating to 128 MiB": published(
            "bzip2",
            raw_zip(
                [
                    stored("archive/data.pkl", one_tensor_pickle(numel=2**25)),
                    ("archive/data/0", bz2_stream, zipfile.ZIP_BZIP2, bz2_size, bz2_crc),
                ]
            ),
        ),
        "deflated data.pkl of BINBYTES8 128 MiB": published(
            "binbytes8", raw_zip([("archive/data.pkl", pkl, zipfile.ZIP_DEFLATED, pkl_size, pkl_crc)])
        ),
        "stored BINBYTES8 claiming 1 GiB": published(
            "lying",
            raw_zip([stored("archive/data.pkl", b"\x80\x02\x8e" + struct.pack("<Q", 2**30) + bytes(64) + b".")]),
        ),
        "storage numel 2**31 - 1, 0 bytes": published(
            "numel",
            raw_zip([stored("archive/data.pkl", one_tensor_pickle(numel=2**31 - 1)), stored("archive/data/0", b"")]),
        ),
    }
    run_dir = training_run(tmp_path / "laughs", 0, small_weights())
    (run_dir / ".hydra" / "config.yaml").write_text((run_dir / ".hydra" / "config.yaml").read_text() + laughs)
    cases["YAML alias bomb in .hydra/config.yaml, 0.5 kB"] = run_dir
    argvs = [
        ["convert", str(src), str(tmp_path / f"out{i}"), "--tokenizer_path", str(gpt2_files)]
        for i, src in enumerate(cases.values())
    ]
    n = convert.MAX_PICKLE_OPCODES - 5  # the most objects the scan admits: PROTO ] ( } x n e STOP
    for name, count in (("largest.pth", n), ("one_more.pth", n + 1)):
        write_archive(tmp_path / name, b"\x80\x02](" + b"}" * count + b"e.", {})
        argvs.append(["load", str(tmp_path / name)])

    result = isolated("run_each", argvs)
    outcomes = dict(zip([*cases, "largest", "one more"], result["outcomes"]))
    for case in cases:
        assert outcomes[case].startswith("exit 2: sedd convert: error:") and "\n" not in outcomes[case], outcomes
    assert "protocol 2" in outcomes["memo 2**27 without PROTO, 9 bytes"]
    assert "memo index 4294967295" in outcomes["memo 2**32 - 1 after PROTO 2"]
    assert "compressed (method 12)" in outcomes["bzip2 storage inflating to 128 MiB"]
    assert "compressed (method 8)" in outcomes["deflated data.pkl of BINBYTES8 128 MiB"]
    assert "expected 1073741824 bytes in a bytes8" in outcomes["stored BINBYTES8 claiming 1 GiB"]
    assert "holds 0 bytes, not 2147483647 x 4" in outcomes["storage numel 2**31 - 1, 0 bytes"]
    assert "YAML alias" in outcomes["YAML alias bomb in .hydra/config.yaml, 0.5 kB"]
    assert outcomes["largest"] == f"loaded list of {n}" and "more than" in outcomes["one more"]
    assert not any((tmp_path / f"out{i}").exists() for i in range(len(cases)))
    assert result["rss_growth_mb"] < RSS_GROWTH_MB, result


# --------------------------------------------------------------------------- finding 6: the destination


def test_a_failed_conversion_leaves_no_destination_and_an_existing_one_is_refused(
    tmp_path, gpt2_files, capsys, monkeypatch
):
    weights = small_weights()
    for step in (2**31, -3, "7"):
        src = training_run(tmp_path / f"run{step}", step, weights)
        rc, err = cli_convert(src, tmp_path / "out", gpt2_files, capsys)
        assert rc == 2 and err.count("\n") == 1 and f"['step'] = {step!r} is not a training step" in err, err
        assert not (tmp_path / "out").exists()

    src = training_run(tmp_path / "good", 7, weights)
    yaml_path = src / ".hydra" / "config.yaml"  # sections the conversion does not read: not kept
    yaml_path.write_text(yaml_path.read_text() + "optim:\n  lr: 3e-4\ndata:\n  cache_dir: data\n")
    held = tmp_path / "held"
    held.mkdir()
    (held / "notes.txt").write_text("mine")
    rc, err = cli_convert(src, held, gpt2_files, capsys)
    assert rc == 2 and "already holds ['notes.txt']" in err
    assert [p.name for p in held.iterdir()] == ["notes.txt"] and (held / "notes.txt").read_text() == "mine"

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:  # a failure while writing: nothing at DST, nothing left beside it
        m.setattr(checkpoints, "checkpoint_manager", disk_full)
        rc, err = cli_convert(src, tmp_path / "out", gpt2_files, capsys)
    assert rc == 2 and "No space left" in err and [p for p in tmp_path.iterdir() if "out" in p.name] == []

    empty = tmp_path / "empty"  # an empty DST is filled
    empty.mkdir()
    rc, _ = cli_convert(src, empty, gpt2_files, capsys)
    assert rc == 0 and runs.load(empty).step == 7
    kept = json.loads((empty / convert.PROVENANCE).read_text())["original_config"]
    assert sorted(kept) == ["graph", "model", "noise", "tokens", "training"] and kept["training"] == {"ema": 0.9999}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# --------------------------------------------------------------------------- finding 7: one clean error each


def _patch_member(path: Path, member: str, compress_type=None, flag_bits=None) -> Path:
    """Rewrites the method or flags of a member in both its local header and the central directory."""
    data = bytearray(path.read_bytes())
    name = member.encode()
    for sig, flag_at, method_at, name_at in ((b"PK\x03\x04", 6, 8, 30), (b"PK\x01\x02", 8, 10, 46)):
        start = 0
        while (start := data.find(sig, start)) >= 0:
            if data[start + name_at : start + name_at + len(name)] == name:
                if compress_type is not None:
                    data[start + method_at : start + method_at + 2] = struct.pack("<H", compress_type)
                if flag_bits is not None:
                    data[start + flag_at : start + flag_at + 2] = struct.pack("<H", flag_bits)
            start += 4
    path.write_bytes(bytes(data))
    return path


def hostile_sources(root: Path) -> dict[str, tuple[Path, str]]:
    """name -> (a source, a regex its error must match): one for each exception a hostile file raised before."""
    weights = small_weights()
    sd_pickle, storages = torch_pickle(state_dict(weights))
    out = {}

    def published(name, pattern, weights_file=None, config=None, fname="pytorch_model.bin") -> Path:
        """weights_file: bytes of the file, or (data.pkl, storages) of an archive; default the good archive."""
        f = root / name
        f.mkdir()
        (f / "config.json").write_text(config if config is not None else json.dumps(original_config(**SMALL)))
        if isinstance(weights_file, bytes):
            (f / fname).write_bytes(weights_file)
        else:
            write_archive(f / fname, *(weights_file or (sd_pickle, storages)))
        out[name] = (f, pattern)
        return f

    rebuild = ("torch._utils", "_rebuild_tensor_v2")
    published(
        "TypeError: a rebuild call with one argument",
        "malformed pickle: TypeError",
        (ops(*ODICT, "w", rebuild, b"(", "x", b"tRs"), {}),
    )
    published("UnpicklingError: a stack underflow", "pops an empty stack", (ops(b"a"), {}))
    published("EOFError: a pickle cut short", "malformed pickle: expected 9 bytes", (sd_pickle[:-40], storages))
    published("MemoryError: memo index 2**32 - 1", "memo index 4294967295", (b"\x80\x02Nr\xff\xff\xff\xff.", {}))
    published(
        "OverflowError: a stride of 2**62",
        r"model.bin: malformed tensor: .*stride \(4611686018427387904,\)",
        (sd_pickle.replace(b"K\x01\x85", b"\x8a\x08" + struct.pack("<q", 2**62) + b"\x85", 1), storages),
    )
    published(
        "AttributeError: an EMA of numbers",
        r"'sigma_map.mlp.0.weight' is a int, not a tensor",
        torch_pickle(
            {"model": state_dict(weights), "step": 1, "ema": {"shadow_params": list(range(len(weights) - 1))}}
        ),
    )
    published("zipfile.BadZipFile: a zip header and garbage", "not a readable zip", b"PK\x03\x04" + b"\x07" * 200)
    f = published("RuntimeError: an encrypted member", "encrypted")
    _patch_member(f / "pytorch_model.bin", "archive/data.pkl", flag_bits=1)
    f = published("NotImplementedError: compression 99", r"compressed \(method 99\)")
    _patch_member(f / "pytorch_model.bin", "archive/data.pkl", compress_type=99)
    published(
        "a storage of fewer bytes than its numel",
        "storage '0' holds 16 bytes",
        (sd_pickle, {**storages, "0": storages["0"][:16]}),
    )
    good = write_archive(root / "good.pth", sd_pickle, storages).read_bytes()
    published(
        "64 bytes cut from the middle of the archive",
        "past the end|CRC|not a readable zip|local header",
        good[: len(good) // 2] + good[len(good) // 2 + 64 :],
    )

    header, offset = {}, 0
    for k, v in weights.items():
        header[k] = {"dtype": "F32", "shape": list(v.shape), "data_offsets": [offset, offset + v.nbytes]}
        offset += v.nbytes
    data = b"".join(np.ascontiguousarray(v).tobytes() for v in weights.values())
    first, second = list(weights)[:2]
    lies = {
        "offsets past the end": ({first: {**header[first], "data_offsets": [0, len(data) + 8]}}, "malformed entry"),
        "a shape that does not fit its bytes": ({first: {**header[first], "shape": [3, 3]}}, "needs 36 bytes"),
        "two tensors overlapping": (
            {
                second: {
                    **header[second],
                    "data_offsets": [4, 4 + header[second]["data_offsets"][1] - header[second]["data_offsets"][0]],
                }
            },
            "overlap",
        ),
        "an unknown dtype": ({first: {**header[first], "dtype": "F128"}}, "malformed entry"),
        "a negative shape": ({first: {**header[first], "shape": [-1, 4]}}, "malformed entry"),
    }
    for lie, (change, pattern) in lies.items():
        text = json.dumps({**header, **change}).encode()
        published(
            f"SafetensorError: {lie}", pattern, struct.pack("<Q", len(text)) + text + data, fname="model.safetensors"
        )
    published(
        "SafetensorError: a header that is a list",
        "not a mapping",
        struct.pack("<Q", 6) + b"[1, 2]",
        fname="model.safetensors",
    )
    published(
        "SafetensorError: a header longer than the file",
        "not a safetensors file",
        struct.pack("<Q", 2**40) + b"{}",
        fname="model.safetensors",
    )

    for key, value in (("n_heads", 0), ("n_blocks", 100_000), ("length", 10**9), ("hidden_size", 2**20)):
        published(
            f"model.{key} = {value}" + (" (ZeroDivisionError)" if key == "n_heads" else ""),
            rf"model\.{key} = {value} .* is outside",
            config=json.dumps(original_config(**{**SMALL, key: value})),
        )
    published("RecursionError: JSON nested 100,000 deep", "not JSON", config="[" * 100_000 + "]" * 100_000)
    published("a 300 kB config.json", "a config has at most", config=" " * 300_000 + "{}")
    for name, yaml_text, pattern in (
        (
            "yaml ConstructorError: a python/object tag",
            "tokens: !!python/object/apply:os.system ['true']\n",
            "not YAML",
        ),
        ("yaml: a mapping as a key", "? [a, b]\n: 1\n", "not YAML"),
        ("yaml: a merge key of an alias", "base: &b {x: 1}\nmodel:\n  <<: *b\n", "YAML alias"),
    ):
        run = training_run(root / name, 0, weights)
        (run / ".hydra" / "config.yaml").write_text(yaml_text)
        out[name] = (run, pattern)
    return out


def test_every_hostile_file_is_one_line_and_exit_2(tmp_path, gpt2_files, capsys):
    (tmp_path / "src").mkdir()
    for name, (src, pattern) in hostile_sources(tmp_path / "src").items():
        rc, err = cli_convert(src, tmp_path / "out", gpt2_files, capsys)
        one_line = err.count("\n") == 1 or "does not fit the config:\n  " in err  # or the list of misfits
        assert rc == 2 and err.startswith("sedd convert: error: ") and one_line, (name, err)
        assert re.search(pattern, err), (name, pattern, err)
        assert not (tmp_path / "out").exists(), name
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": [')  # the tokenizers package's
    rc, err = cli_convert(src, tmp_path / "out", tmp_path / "tokenizer.json", capsys)  # bare Exception, before
    assert rc == 2 and "not a readable GPT-2 tokenizer" in err and err.count("\n") == 1, err


# --------------------------------------------------------------------------- the fuzz


def fuzz_base():
    """A training checkpoint as the original saves it, small: every opcode and layout a real one has."""
    rng = np.random.default_rng(0)
    w = Storage(rng.standard_normal(12).astype(np.float32))
    norms = Storage(np.ones(8, np.float32))
    model = collections.OrderedDict(
        [
            ("vocab_embed.embedding", Tensor(w, 0, (3, 4), (4, 1))),
            ("blocks.0.attn_qkv.weight", Tensor(w, 0, (4, 3), (1, 4))),  # a transposed view of the same storage
            ("blocks.0.norm1.weight", Tensor(norms, 0, (4,), (1,))),
            ("blocks.0.norm2.weight", Tensor(norms, 4, (4,), (1,))),  # two tensors of one storage
            ("half", Tensor.of(rng.standard_normal(3).astype(np.float16))),
            ("bf16", Tensor.of(rng.standard_normal(3).astype(ml_dtypes.bfloat16))),
            ("long", Tensor.of(np.arange(4))),
            ("scalar", Tensor.of(np.array(2.5, np.float32))),
        ]
    )
    model._metadata = collections.OrderedDict([("", {"version": 1}), ("blocks.0", {"version": 1})])
    params = list(model)
    adam = {"step": Tensor.of(np.array(7.0, np.float32)), "exp_avg": Tensor.of(np.zeros(3, np.float32))}
    optimizer = {
        "state": {0: adam},
        "param_groups": [
            {
                "lr": 3e-4,
                "betas": (0.9, 0.999),
                "eps": 1e-8,
                "weight_decay": 0.0,
                "amsgrad": False,
                "foreach": None,
                "params": list(range(len(params))),
            }
        ],
    }
    return {
        "optimizer": optimizer,
        "model": model,
        "step": 7,
        "ema": {"decay": 0.9999, "num_updates": 2**33, "shadow_params": [model[k] for k in params[:3]]},
    }


def _plain(x):
    """The value fuzz_base's pickle should load as: Tensors as arrays, containers as they are."""
    if isinstance(x, Tensor):
        return x.value()
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    return x


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and np.array_equal(a, b)
        )
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


_LEAVES = (type(None), bool, int, float, str)
_DTYPES = set(convert.allowlist.STORAGE_DTYPES.values())


def _well_formed(obj, opaque: bool = False) -> str | None:
    """None if obj holds only plain containers, scalars and numeric arrays whose every byte reads (and, opaque,
    inert stand-ins holding the same); else why."""
    seen, todo = set(), [obj]
    while todo:
        x = todo.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if opaque and isinstance(x, convert.allowlist.Opaque):
            todo.extend([x.args, x.state, x.items])
        elif isinstance(x, np.ndarray):
            if x.dtype not in _DTYPES or x.dtype.hasobject:
                return f"an array of dtype {x.dtype}"
            x.tobytes()  # every element the view reaches is inside its storage
        elif isinstance(x, dict):
            todo.extend(x.keys())
            todo.extend(x.values())
        elif isinstance(x, (list, tuple)):
            todo.extend(x)
        elif not isinstance(x, _LEAVES):
            return f"a {type(x).__name__}"
    return None


_INTS = [
    -1,
    0,
    1,
    2,
    3,
    7,
    255,
    2**16,
    2**31 - 1,
    -(2**31),
    2**31,
    2**32,
    2**40,
    2**62,
    2**63 - 1,
    2**64,
    -(2**63),
    10**30,
]
# Opcodes chosen to hurt: big memo indices and declared lengths, BUILD, names in and out of the allow-list,
# protocol 0/4 opcodes, and every container opcode.
_HOSTILE_OPS = [
    b"r" + struct.pack("<I", 2**27),
    b"r" + struct.pack("<I", 2**32 - 1),
    b"j" + struct.pack("<I", 2**31),
    b"b",
    b"R",
    b"s",
    b"u",
    b"a",
    b"e",
    b"t",
    b"(",
    b")",
    b"}",
    b"]",
    b"N",
    b"Q",
    b"0",
    b"1",
    b"2",
    b"\x85",
    b"\x86",
    b"\x87",
    b"\x88",
    b"ctorch\nFloatStorage\n",
    b"ccollections\nOrderedDict\n",
    b"ctorch._utils\n_rebuild_tensor_v2\n",
    b"ctorch._utils\n_rebuild_parameter\n",
    b"cbuiltins\ngetattr\n",
    b"cnumpy\ndtype\n",
    b"ctorch\nBoolStorage\n",
    b"\x8e" + struct.pack("<Q", 2**30),
    b"B" + struct.pack("<I", 2**31),
    b"X" + struct.pack("<I", 2**30),
    b"\x8c\x05dtype",
    b"\x94",
    b"\x95" + struct.pack("<Q", 2**40),
    b"\x93",
    b"\x81",
    b"\x8f",
    b"\x90",
    b"\x91",
    b"I1\n",
    b"F1e308\n",
    b"L" + b"9" * 5000 + b"L\n",
    b"\x8b" + struct.pack("<i", 2**20),
    b"Vx\n",
    b"S'x'\n",
    b"p0\n",
    b"g0\n",
    b"d",
    b"l",
    b"}" * 40,
    b"\x85" * 40,
]


def _int_op(v: int) -> bytes:
    if -(2**31) <= v < 2**31:
        return b"J" + struct.pack("<i", v)
    n = (v.bit_length() + 8) // 8
    return b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True)


def _mutations(base: bytes, rng, n: int):
    """n (category, pickle) pairs made from the base pickle, the categories in turn."""
    segments = [base[pos:end] for _, _, pos, end in pickletools._genops(base, yield_end_pos=True)]
    int_at = [i for i, s in enumerate(segments) if s[:1] in (b"J", b"K", b"M", b"\x8a")]
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731 (rng.choice would strip trailing zero bytes)
    for k in range(n):
        category = ("bytes", "truncated", "opcodes", "integers", "random opcodes", "random bytes")[k % 6]
        if category == "bytes":
            data = bytearray(base)
            for _ in range(int(rng.integers(1, 5))):
                data[int(rng.integers(2, len(data)))] = int(rng.integers(256))
        elif category == "truncated":
            data = base[: int(rng.integers(len(base)))]
        elif category == "opcodes":  # delete, repeat, swap or insert whole opcodes
            ops_ = list(segments)
            for _ in range(int(rng.integers(1, 4))):
                i, j = int(rng.integers(1, len(ops_))), int(rng.integers(1, len(ops_)))
                how = int(rng.integers(4))
                if how == 0:
                    del ops_[i]
                elif how == 1:
                    ops_.insert(i, ops_[i])
                elif how == 2:
                    ops_[i], ops_[j] = ops_[j], ops_[i]
                else:
                    ops_.insert(i, pick(_HOSTILE_OPS) if rng.random() < 0.7 else pick(segments))
            data = b"".join(ops_)
        elif category == "integers":  # sizes, strides, offsets, numels, keys, the step
            ops_ = list(segments)
            for _ in range(int(rng.integers(1, 3))):
                ops_[pick(int_at)] = _int_op(int(pick(_INTS)))
            data = b"".join(ops_)
        elif category == "random opcodes":
            data = b"\x80\x02" + b"".join(pick(_HOSTILE_OPS + segments) for _ in range(int(rng.integers(1, 40)))) + b"."
        else:
            data = b"\x80\x02" + rng.bytes(int(rng.integers(1, 200))) + b"."
        yield category, bytes(data)


def fuzz(folder: str, n: int, seed: int, opaque: bool = False) -> dict:
    """n mutated pickles of fuzz_base (and n // 10 mutated archives) through load_torch: the outcome counts.

    opaque: read as a Lightning checkpoint is (every name an inert stand-in)."""
    folder = Path(folder)
    base, storages = torch_pickle(fuzz_base())
    want = _plain(fuzz_base())
    rng = np.random.default_rng(seed)
    counts, failures, t0 = collections.Counter(), [], time.perf_counter()

    def attempt(category, path, expected=None):
        try:
            obj = convert.load_torch(path, opaque=opaque)
        except convert.ConversionError:
            counts[category, "refused"] += 1
            return
        except Exception as e:  # noqa: BLE001 (any other type is the failure this test looks for)
            failures.append(f"{category}: {type(e).__name__}: {str(e)[:200]}")
            return
        problem = _well_formed(obj, opaque) if expected is None else (None if _same(obj, expected) else "differs")
        if problem:
            failures.append(f"{category}: loaded {problem}")
        counts[category, "loaded"] += 1

    attempt("the base", write_archive(folder / "base.pth", base, storages), want)
    for k, (category, data) in enumerate(_mutations(base, rng, n)):
        attempt(category, write_archive(folder / f"{k}.pth", data, storages))
        (folder / f"{k}.pth").unlink()  # a memory map of it may live on; unlinked is safe, overwritten is not
    archive = (folder / "base.pth").read_bytes()
    for k in range(n // 10):
        data = bytearray(archive)
        if k % 2:
            data = data[: int(rng.integers(len(data)))]
        else:
            for _ in range(int(rng.integers(1, 6))):
                data[int(rng.integers(len(data)))] = int(rng.integers(256))
        path = folder / f"archive{k}.pth"
        path.write_bytes(bytes(data))
        attempt("archive bytes", path)
        path.unlink()
    return {
        "counts": {f"{c}|{o}": v for (c, o), v in sorted(counts.items())},
        "failures": failures[:20],
        "n_failures": len(failures),
        "seconds": time.perf_counter() - t0,
    }


@pytest.mark.slow  # a fuzz of many random pickles: behind -m slow to keep the default suite within 900 CPU s
def test_fuzzed_pickles_end_in_a_clean_refusal_or_a_correct_load(tmp_path):
    result = isolated("fuzz", str(tmp_path), 6000, 0)
    assert result["n_failures"] == 0, result["failures"]
    assert result["counts"]["the base|loaded"] == 1
    total = sum(result["counts"].values())
    assert total == 1 + 6000 + 600, result["counts"]
    assert result["counts"]["integers|loaded"] > 100  # the mutations reach the unpickler, not only the scan
    assert result["rss_growth_mb"] < RSS_GROWTH_MB, result


@pytest.mark.slow  # a fuzz of many random pickles: behind -m slow to keep the default suite within 900 CPU s
def test_fuzzed_pickles_read_as_a_lightning_checkpoint_end_cleanly_and_call_nothing(tmp_path):
    """The same mutations through the stand-in reader (DUO's .ckpt): a refusal or a load of inert stand-ins,
    never another exception, a crash or a call (the forbidden names the mutations insert load as stand-ins)."""
    result = isolated("fuzz", str(tmp_path), 2000, 1, True)
    assert result["n_failures"] == 0, result["failures"]
    assert result["counts"]["the base|loaded"] == 1
    assert sum(v for k, v in result["counts"].items() if k.endswith("|loaded")) > 100
    assert result["rss_growth_mb"] < RSS_GROWTH_MB, result
