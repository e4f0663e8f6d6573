r"""The original PyTorch SEDD checkpoints -> a run directory.

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
callable, so it is read by an unpickler that resolves only the names a state
dict needs (below) and refuses every other name before resolving it: a
malicious file fails with `UnsafePickleError` and runs nothing.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import pickle
import re
import shutil
import struct
import sys
import zipfile
from pathlib import Path
from typing import Any, Mapping

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
from sedd.model import ROTARY_BASE

GPT2_TOKENS = 50257  # the original trains only with GPT-2's tokenizer (its data.py)
TOKENIZER_DIR = "gpt2"  # where a converted run keeps its copy of the tokenizer files
PROVENANCE = "converted.json"
ROTARY_KEY = "rotary_emb.inv_freq"


class ConversionError(ValueError):
    """The source does not describe a SEDD model this package can rebuild exactly."""


class UnsafePickleError(ConversionError):
    """A pickle names a callable outside the state-dict allow-list; nothing was run."""


# =========================================================================== torch's zip format


# torch.<Name>Storage -> the element type of its bytes. UntypedStorage holds raw bytes.
_STORAGE_DTYPES = {
    "DoubleStorage": np.float64, "FloatStorage": np.float32, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8,
    "BoolStorage": np.bool_, "UntypedStorage": np.uint8,
}


@dataclasses.dataclass(frozen=True)
class _StorageType:
    """Stands for the class torch.<name> inside a persistent id: no torch object is built."""

    name: str
    dtype: np.dtype


def _rebuild_tensor(storage, storage_offset, size, stride, requires_grad=False, backward_hooks=None,
                    metadata=None) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2, for numpy: a read-only strided view of the storage.

    Element (i_0, ..., i_k) is storage[offset + sum_j i_j stride_j]; every index
    the view can reach is checked to lie inside the storage first.
    """
    del requires_grad, backward_hooks, metadata  # autograd state, meaningless here
    if not isinstance(storage, np.ndarray):
        raise ConversionError(f"a tensor's storage is {type(storage).__name__}, not a storage id")
    size, stride = tuple(size), tuple(stride)
    ints = (storage_offset, *size, *stride)
    if len(size) != len(stride) or not all(isinstance(v, int) and v >= 0 for v in ints):
        raise ConversionError(f"malformed tensor: offset {storage_offset}, size {size}, stride {stride}")
    if 0 in size:
        return np.zeros(size, storage.dtype)
    last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
    if last >= storage.size:
        raise ConversionError(f"a tensor of size {size}, stride {stride} at offset {storage_offset} "
                              f"reads past its storage of {storage.size} elements")
    base = storage[storage_offset:]
    return np.lib.stride_tricks.as_strided(base, size, [s * storage.itemsize for s in stride], writeable=False)


def _rebuild_parameter(data, requires_grad=True, backward_hooks=None) -> np.ndarray:
    """torch._utils._rebuild_parameter: an nn.Parameter is its data here."""
    del requires_grad, backward_hooks
    return data


# The only names a state dict (or the original's training checkpoint: model,
# EMA list, AdamW state, step) pickles. Everything else is refused.
_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): _StorageType(name, np.dtype(dtype)) for name, dtype in _STORAGE_DTYPES.items()},
}


class _StateDictUnpickler(pickle.Unpickler):
    """An unpickler that resolves only `_ALLOWED` names and reads storages from the archive."""

    def __init__(self, file, archive: "_TorchArchive"):
        super().__init__(file)
        self._archive = archive

    def find_class(self, module: str, name: str):
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"{self._archive.path}: the pickle asks for {module}.{name}, which a state dict never "
                "needs; refused before anything ran. Only tensors, storages and plain containers are "
                "read. If the file is trusted, re-save its state dict with safetensors."
            ) from None

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ConversionError(f"{self._archive.path}: unknown persistent id {pid!r:.200}")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _StorageType) or not isinstance(key, str) or not isinstance(numel, int):
            raise ConversionError(f"{self._archive.path}: malformed storage id {pid!r:.200}")
        return self._archive.storage(key, storage_type.dtype, numel)


class _TorchArchive:
    """The zip archive torch.save writes: <prefix>/data.pkl + <prefix>/data/<key> storages."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            head = f.read(4)
        if head != b"PK\x03\x04":
            legacy = head[:2] == b"\x80\x02"
            raise ConversionError(
                f"{path} is not a zip archive written by torch.save"
                + (" (it is the legacy format of torch < 1.6: re-save it with a recent torch)" if legacy else ""))
        self.zip = zipfile.ZipFile(path)
        pickles = [n for n in self.zip.namelist() if n.endswith("data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise ConversionError(f"{path}: expected one <name>/data.pkl in the archive, found {pickles}")
        self.prefix = pickles[0][: -len("data.pkl")]
        has_order = self.prefix + "byteorder" in self.zip.namelist()  # older torch writes none: little-endian
        order = self.zip.read(self.prefix + "byteorder").decode().strip() if has_order else "little"
        if order not in ("little", "big"):
            raise ConversionError(f"{path}: unknown byte order {order!r}")
        self.byteorder = "<" if order == "little" else ">"
        self._storages: dict[str, np.ndarray] = {}

    def storage(self, key: str, dtype: np.dtype, numel: int) -> np.ndarray:
        """Storage `key` as a read-only 1-D array, memory-mapped when the member is stored uncompressed."""
        if key in self._storages:
            return self._storages[key]
        dtype = np.dtype(dtype)
        if self.byteorder == ">" and dtype.itemsize > 1:
            dtype = dtype.newbyteorder(">")
        try:
            info = self.zip.getinfo(f"{self.prefix}data/{key}")
        except KeyError:
            raise ConversionError(f"{self.path}: the pickle names storage {key!r}, absent from the archive") from None
        if info.file_size != numel * dtype.itemsize:
            raise ConversionError(f"{self.path}: storage {key!r} holds {info.file_size} bytes, not "
                                  f"{numel} x {dtype.itemsize}")
        if info.compress_type == zipfile.ZIP_STORED:  # torch's own choice: map, do not read
            with open(self.path, "rb") as f:
                f.seek(info.header_offset)
                header = f.read(30)
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            offset = info.header_offset + 30 + name_len + extra_len
            array = (np.memmap(self.path, dtype, mode="r", offset=offset, shape=(numel,)) if numel
                     else np.zeros(0, dtype))
        else:
            array = np.frombuffer(self.zip.read(info), dtype)
        self._storages[key] = array
        return array

    def load(self) -> Any:
        with self.zip, self.zip.open(self.prefix + "data.pkl") as f:  # the storages outlive it as memory maps
            return _StateDictUnpickler(f, self).load()


def load_torch(path: str | Path) -> Any:
    """The object a `torch.save` zip archive holds, with tensors as (memory-mapped) numpy arrays.

    No torch is needed and no code in the file runs: the pickle may name only
    tensor rebuilders, storage types and OrderedDict.

    Raises:
      UnsafePickleError: the pickle names anything else (e.g. os.system).
      ConversionError: not such an archive, or a malformed one.
    """
    return _TorchArchive(Path(path)).load()


def load_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """The tensors of a .safetensors file, by name, as numpy arrays."""
    try:
        from safetensors import safe_open  # optional dependency: only this format needs it
    except ImportError as e:
        raise ImportError(f"reading {path} needs the safetensors package: pip install safetensors") from e
    out = {}
    with safe_open(str(path), framework="numpy") as f:
        for name in f.keys():
            out[name] = f.get_tensor(name)
    return out


# =========================================================================== the original's config

# The sections the original's code reads to build and run the model (SEDD
# reads tokens, graph.type and model.*; sampling reads noise.*). They are
# checked strictly; the rest (training, optim, data, eval, sampling, ngpus,
# ...) configures training only and is kept in converted.json.
_MODEL_KEYS = {"name", "type", "hidden_size", "cond_dim", "length", "n_blocks", "n_heads", "scale_by_sigma", "dropout"}
_GRAPH_KEYS = {"type", "file", "report_all"}
_NOISE_KEYS = {"type", "sigma_min", "sigma_max"}
_GRAPHS = {"absorb": "absorbing", "uniform": "uniform"}
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


def config_from_original(orig: Mapping, tokenizer_path: str = "", dtype: str = "float32") -> ml_collections.ConfigDict:
    """Our config (owt_small with the original's model, graph, noise and length) of an original config dict.

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
    hidden, heads = _field(model, "model", "hidden_size", int), _field(model, "model", "n_heads", int)
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
    c.model.n_blocks = _field(model, "model", "n_blocks", int)
    c.model.cond_dim = _field(model, "model", "cond_dim", int)
    c.model.mlp_ratio = 4  # fixed in the original's DDiTBlock
    c.model.dropout = _field(model, "model", "dropout", float)
    c.model.scale_by_sigma = scale_by_sigma
    c.model.dtype = dtype
    c.graph.type = _GRAPHS[graph_type]
    c.noise.type = noise_type
    c.noise.sigma_min = _field(noise, "noise", "sigma_min", float)
    c.noise.sigma_max = _field(noise, "noise", "sigma_max", float)
    c.noise.eps = _LOGLINEAR_EPS
    c.data.tokenizer = "gpt2"
    c.data.tokenizer_path = str(tokenizer_path)
    c.data.seq_len = _field(model, "model", "length", int)
    ema = orig.get("training", {}).get("ema") if isinstance(orig.get("training"), Mapping) else None
    if ema is not None:
        c.training.ema = float(ema)
    for key, value in (("n_blocks", c.model.n_blocks), ("cond_dim", c.model.cond_dim), ("length", c.data.seq_len)):
        if value < 1:
            raise ConversionError(f"model.{key} = {value} must be >= 1")
    if not 0.0 <= c.model.dropout < 1.0:
        raise ConversionError(f"model.dropout = {c.model.dropout} must be in [0, 1)")
    c = ml_collections.ConfigDict(c.to_dict())
    c.vocab_size = tokens
    return c


def read_original_config(path: str | Path) -> dict:
    """config.json (JSON) or .hydra/config.yaml (YAML) of the original, as a dict."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml  # optional dependency: only Hydra run directories need it
        except ImportError as e:
            raise ImportError(f"reading {path} needs PyYAML: pip install pyyaml") from e
        data = yaml.safe_load(text)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ConversionError(f"{path} does not hold a config mapping")
    return data


# =========================================================================== state dict -> parameters


def parameter_map(n_blocks: int) -> list[tuple[str, str, bool]]:
    """(original name, our name, transposed) of every parameter, in the original's `model.parameters()` order.

    The order is that of module registration in the original's SEDD:
    vocab_embed, sigma_map, (rotary_emb: a buffer only), blocks, output_layer;
    inside a block norm1, attn_qkv, attn_out, norm2, mlp, adaLN_modulation;
    inside the final layer norm_final, linear, adaLN_modulation. The EMA's
    shadow_params list follows it.
    """
    linear = lambda src, dst: [(f"{src}.weight", f"{dst}.kernel", True), (f"{src}.bias", f"{dst}.bias", False)]
    out = [("vocab_embed.embedding", "vocab_embed.embedding", False)]
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


def _check_rotary(inv_freq, head_dim: int) -> str | None:
    """A problem with the rotary buffer, or None: it must be base^{-2j/K}, j < K/2, base 10000."""
    if tuple(inv_freq.shape) != (head_dim // 2,):
        return (f"{ROTARY_KEY} has shape {tuple(inv_freq.shape)}, not ({head_dim // 2},): the checkpoint's "
                f"head size is not hidden_size / n_heads = {head_dim} of the config")
    if isinstance(inv_freq, jax.ShapeDtypeStruct):
        return None
    want = 1.0 / ROTARY_BASE ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    got = np.asarray(inv_freq, np.float64)
    rtol = 1e-6 if np.dtype(inv_freq.dtype).itemsize >= 4 else 1e-2
    if not np.allclose(got, want, rtol=rtol, atol=0):
        return f"{ROTARY_KEY} is not the rotary frequencies of base {ROTARY_BASE:g}, which sedd.model uses"
    return None


def convert_params(state_dict: Mapping[str, Any], config) -> nnx.State:
    """Our parameters of the config's network from the original's state dict.

    Every target parameter is written exactly once, from the one source tensor
    `parameter_map` names for it, with the right shape; every source tensor is
    used (the rotary buffer by a check). Values may be arrays (returned as
    float32 jax arrays) or ``jax.ShapeDtypeStruct``s (returned as such:
    converting shapes alone checks a configuration without any weights).

    Raises:
      ConversionError: naming every missing, unexpected, misshapen or
        non-float tensor.
    """
    abstract = abstract_params(config)
    targets = {_path_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(abstract)[0]}
    plan = parameter_map(config.model.n_blocks)
    if sorted(dst for _, dst, _ in plan) != sorted(targets):  # a change in sedd.model not mirrored here
        raise ConversionError(f"internal: the parameter map does not cover the network exactly: "
                              f"{sorted(set(targets) ^ {dst for _, dst, _ in plan})}")
    problems, out = [], {}
    for src, dst, transpose in plan:
        if src not in state_dict:
            problems.append(f"missing tensor {src!r} (for {dst})")
            continue
        x = state_dict[src]
        want = targets[dst].shape[::-1] if transpose else targets[dst].shape
        if tuple(x.shape) != tuple(want):
            problems.append(f"tensor {src!r} has shape {tuple(x.shape)}, the config needs {tuple(want)}")
        elif np.dtype(x.dtype) not in _FLOATS:
            problems.append(f"tensor {src!r} has dtype {x.dtype}, not a float type")
        elif isinstance(x, jax.ShapeDtypeStruct):
            out[dst] = jax.ShapeDtypeStruct(targets[dst].shape, jnp.float32)
        else:
            x = np.asarray(x, np.float32)  # native float32, read out of the memory map
            out[dst] = jnp.asarray(x.T if transpose else x)
    used = {src for src, _, _ in plan}
    if ROTARY_KEY in state_dict:
        used.add(ROTARY_KEY)
        problem = _check_rotary(state_dict[ROTARY_KEY], config.model.hidden_size // config.model.n_heads)
        if problem:
            problems.append(problem)
    unexpected = [k for k in state_dict if k not in used]
    if unexpected:
        problems.append(f"tensor(s) {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''} are not part of "
                        f"the original's SEDD with n_blocks = {config.model.n_blocks}")
    if problems:
        raise ConversionError("the checkpoint does not fit the config:\n  " + "\n  ".join(problems[:20]))
    return jax.tree_util.tree_map_with_path(lambda p, _: out[_path_name(p)], abstract)


def count_parameters(params) -> int:
    """Number of scalars in a tree of arrays or shape structs."""
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))


# =========================================================================== sources


@dataclasses.dataclass
class Source:
    """What a conversion reads.

    Attributes:
      config: the original's config dict.
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


def read_source(src: str | Path, ema: bool = True) -> Source:
    """The config and weights of a source (see `locate`), EMA weights by default for a training checkpoint."""
    config_file, weights_file = locate(src)
    config = read_original_config(config_file)
    if weights_file.suffix == ".safetensors":
        return Source(config, config_file, weights_file, load_safetensors(weights_file), None, 0, "published")
    obj = load_torch(weights_file)
    if not (isinstance(obj, Mapping) and "model" in obj and "ema" in obj):  # a bare state dict
        return Source(config, config_file, weights_file, _state_dict(obj, str(weights_file)), None, 0, "published")
    model = _state_dict(obj["model"], f"{weights_file}['model']")
    step = obj.get("step", 0)
    step = int(step) if isinstance(step, (int, np.integer)) else int(np.asarray(step).reshape(()))
    if not ema:
        return Source(config, config_file, weights_file, model, model, step, "model")
    shadow = obj["ema"].get("shadow_params") if isinstance(obj["ema"], Mapping) else None
    if not isinstance(shadow, (list, tuple)):
        raise ConversionError(f"{weights_file}['ema'] has no shadow_params list; use --no_ema for the raw weights")
    names = [src_name for src_name, _, _ in parameter_map(_n_blocks(config))]
    if len(shadow) != len(names):
        raise ConversionError(f"{weights_file}: the EMA holds {len(shadow)} tensors, the config's model has "
                              f"{len(names)} parameters")
    weights = dict(zip(names, shadow))
    if ROTARY_KEY in model:
        weights[ROTARY_KEY] = model[ROTARY_KEY]
    return Source(config, config_file, weights_file, weights, model, step, "ema")


def _n_blocks(orig: Mapping) -> int:
    if set(orig) == {"config"}:
        orig = orig["config"]
    return _field(_section(orig, "model", _MODEL_KEYS), "model", "n_blocks", int)


def _tokenizer_files(path: Path) -> list[Path]:
    """The GPT-2 tokenizer files at path (a tokenizer.json, or a folder with one or with vocab.json + merges.txt)."""
    if path.is_file():
        return [path]
    if (path / "tokenizer.json").is_file():
        return [path / "tokenizer.json"]
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        return [path / "vocab.json", path / "merges.txt"]
    return []


# =========================================================================== conversion


def convert(src: str | Path, dst: str | Path, ema: bool = True, tokenizer_path: str | Path | None = None,
            dtype: str = "float32") -> dict:
    """Writes the run directory `dst` from the original's checkpoint at `src`.

    Args:
      src: a published folder, an original training run directory, or a weights file (see `locate`).
      dst: the new run directory; it must not hold a run yet.
      ema: a training checkpoint's EMA weights (True, as the original samples) or its raw weights.
      tokenizer_path: GPT-2's tokenizer.json, or a folder with it or with
        vocab.json + merges.txt; default: those files inside src. Copied into dst/gpt2.
      dtype: the compute dtype written into the config.
    Returns:
      dict: parameters, step, weights (published / ema / model), source files.
    Raises:
      ConversionError, UnsafePickleError, FileNotFoundError, ImportError;
      dst is not created unless everything was read and checked.
    """
    dst = Path(dst).expanduser()
    if not Path(src).expanduser().exists():
        raise FileNotFoundError(f"no such source {src}: give the published folder (config.json + "
                                "pytorch_model.bin or model.safetensors) or an original training run directory")
    if (dst / runs.CONFIG).exists() or (dst / runs.CHECKPOINTS).exists():
        raise ConversionError(f"{dst} already holds a run; choose a new directory (it was left as it is)")
    tok_src = Path(tokenizer_path or src).expanduser()
    if not tokenizer_path and tok_src.is_file():  # a weights file: look beside it
        tok_src = tok_src.parent
    tok_files = _tokenizer_files(tok_src)
    if not tok_files:
        raise FileNotFoundError(
            f"no GPT-2 tokenizer files at {tok_src}: pass --tokenizer_path pointing to GPT-2's tokenizer.json, or "
            "to a folder holding vocab.json and merges.txt (the files of the Hugging Face `gpt2` repository); "
            "nothing is downloaded")
    GPT2Tokenizer(str(tok_files[0] if len(tok_files) == 1 else tok_src))  # readable, or a clear error

    source = read_source(src, ema)
    tok_dir = (dst / TOKENIZER_DIR).absolute()
    config = config_from_original(source.config, str(tok_dir), dtype)
    weights = convert_params(source.weights, config)
    raw = weights if source.raw is None or source.raw is source.weights else convert_params(source.raw, config)

    dst.mkdir(parents=True, exist_ok=True)
    tok_dir.mkdir(exist_ok=True)
    for f in tok_files:  # a lone JSON file is GPT-2's tokenizer.json, whatever its name
        shutil.copyfile(f, tok_dir / ("tokenizer.json" if len(tok_files) == 1 else f.name))
    save_tokenizer(GPT2Tokenizer(str(tok_dir)), dst / runs.TOKENIZER)
    (dst / runs.CONFIG).write_text(config_lib.to_json(config))
    summary = {"source": str(Path(src).absolute()), "config_file": str(source.config_file.absolute()),
               "weights_file": str(source.weights_file.absolute()), "weights": source.kind, "step": source.step,
               "parameters": count_parameters(weights), "original_config": source.config}
    (dst / PROVENANCE).write_text(json.dumps(summary, indent=2, sort_keys=True, default=str))
    state = {"step": jnp.asarray(source.step, jnp.int32), "params": raw, "ema": weights}
    manager = runs.checkpoint_manager(dst, config)
    manager.save(source.step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state)), force=True)
    manager.wait_until_finished()
    manager.close()
    return summary


def main(argv: list[str] | None = None) -> int:
    """`sedd convert SRC DST [--no_ema] [--tokenizer_path PATH] [--dtype D]`; returns the exit code."""
    p = argparse.ArgumentParser(
        prog="sedd convert",
        description="Convert the original PyTorch SEDD weights (the published folder with config.json + "
                    "pytorch_model.bin or model.safetensors, or an original training run directory) into a "
                    "run directory for sedd sample / sedd eval. torch is not needed; see docs/pretrained.md.")
    p.add_argument("src", help="published folder, original training run directory, or a weights file")
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
