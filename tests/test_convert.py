"""sedd.convert: the original PyTorch SEDD checkpoints, read without torch, against the original's forward pass.

The checkpoints here are written by the test itself in the original's layout:
its state-dict names and shapes (from model/transformer.py of
louaaron/Score-Entropy-Discrete-Diffusion), random values, as the zip archive
torch.save writes (pickle opcodes and raw storages emitted below, no torch), as
safetensors, and as the original's training checkpoint. The converted model is
compared with a float64 NumPy forward pass of the original architecture
written here from its definition, not with sedd.model.
"""

import json
import os
import pickle
import struct
import zipfile
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from sedd import cli, convert, runs
from sedd.data import GPT2Tokenizer

GPT2 = 50257
ROTARY = "rotary_emb.inv_freq"
TINY = dict(hidden_size=32, n_blocks=2, n_heads=4, cond_dim=16, length=16)


# --------------------------------------------------------------------------- the original's layout


def original_shapes(hidden_size, n_blocks, n_heads, cond_dim, tokens=GPT2, absorb=True) -> dict:
    """name -> shape of the original SEDD's state dict, in its order (module registration order).

    SEDD: vocab_embed (EmbeddingLayer, [V, H]), sigma_map (TimestepEmbedder:
    mlp = Linear(256, C), SiLU, Linear(C, C)), rotary_emb (buffer inv_freq
    [K/2]), blocks (DDiTBlock: norm1, attn_qkv [3H, H] no bias, attn_out [H, H]
    no bias, norm2, mlp = Linear(H, 4H), GELU, Linear(4H, H), adaLN_modulation
    Linear(C, 6H)), output_layer (norm_final, linear [V, H], adaLN_modulation
    Linear(C, 2H)); V = tokens + 1 with the absorbing graph's mask.
    """
    v, h = tokens + int(absorb), hidden_size
    s = {
        "vocab_embed.embedding": (v, h),
        "sigma_map.mlp.0.weight": (cond_dim, 256),
        "sigma_map.mlp.0.bias": (cond_dim,),
        "sigma_map.mlp.2.weight": (cond_dim, cond_dim),
        "sigma_map.mlp.2.bias": (cond_dim,),
        ROTARY: (h // n_heads // 2,),
    }
    for i in range(n_blocks):
        b = f"blocks.{i}."
        s.update(
            {
                b + "norm1.weight": (h,),
                b + "attn_qkv.weight": (3 * h, h),
                b + "attn_out.weight": (h, h),
                b + "norm2.weight": (h,),
                b + "mlp.0.weight": (4 * h, h),
                b + "mlp.0.bias": (4 * h,),
                b + "mlp.2.weight": (h, 4 * h),
                b + "mlp.2.bias": (h,),
                b + "adaLN_modulation.weight": (6 * h, cond_dim),
                b + "adaLN_modulation.bias": (6 * h,),
            }
        )
    s.update(
        {
            "output_layer.norm_final.weight": (h,),
            "output_layer.linear.weight": (v, h),
            "output_layer.linear.bias": (v,),
            "output_layer.adaLN_modulation.weight": (2 * h, cond_dim),
            "output_layer.adaLN_modulation.bias": (2 * h,),
        }
    )
    return s


def random_state_dict(shapes: dict, seed: int) -> dict:
    """float32 values of a trained-looking scale: every layer does something."""
    rng = np.random.default_rng(seed)
    sd = {}
    for name, shape in shapes.items():
        if name == ROTARY:
            k = 2 * shape[0]
            sd[name] = (1.0 / 10000 ** (np.arange(0, k, 2) / k)).astype(np.float32)
        elif "norm" in name:
            sd[name] = 1.0 + 0.2 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            sd[name] = 0.2 * rng.standard_normal(shape)
        elif name == "vocab_embed.embedding":
            sd[name] = rng.standard_normal(shape)
        else:  # Linear weight [out, in]
            sd[name] = rng.standard_normal(shape) / np.sqrt(shape[1])
        sd[name] = np.asarray(sd[name], np.float32)
    return sd


def original_config(graph="absorb", noise="loglinear", tokens=GPT2, **model) -> dict:
    """The original's config dict (its configs/config.yaml + model/small.yaml, shrunk)."""
    m = dict(name="tiny", type="ddit", scale_by_sigma=graph == "absorb", dropout=0.1, **TINY)
    m.update(model)
    return {
        "ngpus": 8,
        "tokens": tokens,
        "training": {"batch_size": 512, "ema": 0.9999, "n_iters": 1300001},
        "data": {"train": "openwebtext", "valid": "wikitext103", "cache_dir": "data"},
        "graph": {"type": graph, "file": "data", "report_all": False},
        "noise": {"type": noise, "sigma_min": 1e-4, "sigma_max": 20},
        "sampling": {"predictor": "euler", "steps": 128, "noise_removal": True},
        "optim": {"lr": 3e-4, "warmup": 2500},
        "model": m,
    }


# --------------------------------------------------------------------------- the original's forward pass


def original_forward(
    sd: dict,
    x: np.ndarray,
    sigma: np.ndarray,
    n_heads: int,
    scale_by_sigma: bool,
    positions: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    raw: bool = False,
):
    """SEDD.forward of model/transformer.py in float64 NumPy: (log-score [B, L, D], the scale-by-sigma offset).

    positions (rotary, default 0..L-1) and mask (bool [L, L], query x key;
    default all True) give BD3-LM's forward over [x_t ; x_0]; raw: the
    network's logits as they are (no 0 written at the current token), as
    MDLM, BD3-LM and DUO read them.

    c = SiLU(mlp(cos/sin embedding of sigma)); each block
      x += gate_msa * attn_out(attention(rotary(qkv(modulate(LN(x) w1, shift_msa, scale_msa)))))
      x += gate_mlp * mlp(modulate(LN(x) w2, shift_mlp, scale_mlp))
    with (shift, scale, gate) x 2 = chunks of adaLN(c), LN without bias (eps
    1e-5), rotary x cos + rotate_half(x) sin on q and k, softmax(q k^T / sqrt(K));
    then linear(modulate(LN(x) w, shift, scale)), minus log(e^sigma - 1) +
    log(D - 1) when scaling by sigma, and 0 written at the current token.
    """
    f = {k: np.asarray(v, np.float64) for k, v in sd.items()}
    x, sigma = np.asarray(x), np.asarray(sigma, np.float64)

    def linear(h, name, bias=True):
        return h @ f[name + ".weight"].T + (f[name + ".bias"] if bias else 0.0)

    def layer_norm(h, w):
        mu = h.mean(-1, keepdims=True)
        return (h - mu) / np.sqrt(((h - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w

    silu = lambda z: z / (1.0 + np.exp(-z))  # noqa: E731
    gelu_tanh = lambda z: 0.5 * z * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (z + 0.044715 * z**3)))  # noqa: E731

    h = f["vocab_embed.embedding"][x]  # (B, L, H)
    b, length, hidden = h.shape
    half = 128
    args = sigma[:, None] * np.exp(-np.log(10000.0) * np.arange(half) / half)[None]
    c = silu(
        linear(silu(linear(np.concatenate([np.cos(args), np.sin(args)], -1), "sigma_map.mlp.0")), "sigma_map.mlp.2")
    )  # (B, C)
    k = hidden // n_heads
    positions = np.arange(length) if positions is None else positions
    angles = positions[:, None] * (1.0 / 10000.0 ** (np.arange(0, k, 2) / k))[None]
    angles = np.concatenate([angles, angles], -1)[None, :, None, :]  # (1, L, 1, K)

    def rotary(q):
        return q * np.cos(angles) + np.concatenate([-q[..., k // 2 :], q[..., : k // 2]], -1) * np.sin(angles)

    n_blocks = len({name.split(".")[1] for name in f if name.startswith("blocks.")})
    for i in range(n_blocks):
        p = f"blocks.{i}."
        mod = linear(c, p + "adaLN_modulation")[:, None, :]  # (B, 1, 6H)
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = np.split(mod, 6, -1)
        y = layer_norm(h, f[p + "norm1.weight"]) * (1 + scale_a) + shift_a
        qkv = linear(y, p + "attn_qkv", bias=False).reshape(b, length, 3, n_heads, k)
        q, kk, v = rotary(qkv[:, :, 0]), rotary(qkv[:, :, 1]), qkv[:, :, 2]
        logits = np.einsum("blnk,bmnk->bnlm", q, kk) / np.sqrt(k)
        if mask is not None:
            logits = np.where(mask, logits, -np.inf)
        att = np.exp(logits - logits.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("bnlm,bmnk->blnk", att, v).reshape(b, length, hidden)
        h = h + gate_a * linear(o, p + "attn_out", bias=False)
        y = layer_norm(h, f[p + "norm2.weight"]) * (1 + scale_m) + shift_m
        h = h + gate_m * linear(gelu_tanh(linear(y, p + "mlp.0")), p + "mlp.2")
    shift, scale = np.split(linear(c, "output_layer.adaLN_modulation")[:, None, :], 2, -1)
    out = linear(layer_norm(h, f["output_layer.norm_final.weight"]) * (1 + scale) + shift, "output_layer.linear")
    offset = np.zeros((b, 1, 1))
    if scale_by_sigma:
        offset = -(np.log(np.expm1(sigma)) + np.log(out.shape[-1] - 1))[:, None, None]
    out = out + offset
    if not raw:
        np.put_along_axis(out, x[..., None], 0.0, axis=-1)
    return out, offset


# --------------------------------------------------------------------------- torch.save's zip format, written by hand


class View:
    """A tensor as torch stores it: a storage (1-D) with an offset and strides in elements."""

    def __init__(self, storage, offset, shape, stride):
        self.storage, self.offset, self.shape, self.stride = storage, offset, tuple(shape), tuple(stride)


_STORAGE_NAMES = {
    np.dtype(np.float32): "FloatStorage",
    np.dtype(np.float64): "DoubleStorage",
    np.dtype(np.float16): "HalfStorage",
    np.dtype(ml_dtypes.bfloat16): "BFloat16Storage",
    np.dtype(np.int64): "LongStorage",
}


class Obj:
    """An object pickled as Python's protocol 2 pickles a class instance: GLOBAL module name, an empty
    argument tuple, NEWOBJ, then its state and BUILD (OmegaConf's DictConfig and nodes in a Lightning
    checkpoint); call=True pickles it as REDUCE of the name on `args` instead."""

    def __init__(self, module, name, state=None, args=(), call=False):
        self.module, self.name, self.state, self.args, self.call = module, name, state, tuple(args), call


class TorchPickle:
    """The pickle (protocol 2) torch.save writes: tensors as
    torch._utils._rebuild_tensor_v2(persistent storage id, offset, size, stride, False, OrderedDict())."""

    def __init__(self):
        self.out = bytearray(b"\x80\x02")  # PROTO 2
        self.storages = {}  # id(storage array) -> (key, array)

    def glob(self, module, name):
        self.out += b"c" + f"{module}\n{name}\n".encode()  # GLOBAL

    def ordered_dict(self, items):
        self.glob("collections", "OrderedDict")
        self.out += b")R"  # EMPTY_TUPLE, REDUCE
        if items:
            self.out += b"("  # MARK
            for key, value in items:
                self.emit(key)
                self.emit(value)
            self.out += b"u"  # SETITEMS

    def tensor(self, t):
        if isinstance(t, np.ndarray):
            t = View(
                np.ascontiguousarray(t).reshape(-1), 0, t.shape, [int(np.prod(t.shape[i + 1 :])) for i in range(t.ndim)]
            )
        key, _ = self.storages.setdefault(id(t.storage), (str(len(self.storages)), t.storage))
        self.glob("torch._utils", "_rebuild_tensor_v2")
        self.out += b"("  # MARK: the argument tuple
        self.out += b"("  # MARK: the persistent id
        self.emit("storage")
        self.glob("torch", _STORAGE_NAMES[t.storage.dtype])
        for v in (key, "cpu", int(t.storage.size)):
            self.emit(v)
        self.out += b"tQ"  # TUPLE, BINPERSID
        for v in (t.offset, t.shape, t.stride, False):
            self.emit(v)
        self.ordered_dict([])  # backward hooks
        self.out += b"tR"  # TUPLE, REDUCE

    def emit(self, x):
        if isinstance(x, Obj):
            self.glob(x.module, x.name)
            self.emit(x.args)
            self.out += b"R" if x.call else b"\x81"  # REDUCE / NEWOBJ
            if x.state is not None:
                self.emit(x.state)
                self.out += b"b"  # BUILD
        elif isinstance(x, (np.ndarray, View)):
            self.tensor(x)
        elif isinstance(x, dict) and getattr(x, "ordered", False):
            self.ordered_dict(list(x.items()))
        elif isinstance(x, dict):
            self.out += b"}("  # EMPTY_DICT, MARK
            for key, value in x.items():
                self.emit(key)
                self.emit(value)
            self.out += b"u"
        elif isinstance(x, list):
            self.out += b"]("  # EMPTY_LIST, MARK
            for v in x:
                self.emit(v)
            self.out += b"e"  # APPENDS
        elif isinstance(x, tuple):
            self.out += b"("
            for v in x:
                self.emit(v)
            self.out += b"t"
        elif isinstance(x, str):
            data = x.encode()
            self.out += b"X" + struct.pack("<I", len(data)) + data  # BINUNICODE
        elif x is None:
            self.out += b"N"
        elif isinstance(x, bool):
            self.out += b"\x88" if x else b"\x89"  # NEWTRUE / NEWFALSE
        elif isinstance(x, int) and -(2**31) <= x < 2**31:
            self.out += b"J" + struct.pack("<i", x)  # BININT
        elif isinstance(x, int):  # LONG1: little-endian two's complement, as pickle writes a long integer
            data = x.to_bytes((x + (x < 0)).bit_length() // 8 + 1, "little", signed=True)
            self.out += b"\x8a" + bytes([len(data)]) + data
        elif isinstance(x, float):
            self.out += b"G" + struct.pack(">d", x)  # BINFLOAT (big-endian, as pickle has it)
        else:
            raise TypeError(type(x))


class StateDict(dict):
    ordered = True  # pickled as collections.OrderedDict, as module.state_dict() is


def write_torch_file(path: Path, obj) -> None:
    """A torch.save zip archive: <stem>/data.pkl, byteorder, data/<key> raw little-endian storages,
    version; every record's data aligned to 64 bytes through the local header's extra field."""
    p = TorchPickle()
    p.emit(obj)
    records = [("data.pkl", bytes(p.out + b".")), ("byteorder", b"little")]
    records += [(f"data/{key}", arr.tobytes()) for key, arr in p.storages.values()]  # this machine is little-endian
    records += [("version", b"3\n"), (".data/serialization_id", b"1234567890")]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in records:
            info = zipfile.ZipInfo(f"{path.stem}/{name}")
            start = z.fp.tell() + 30 + len(info.filename.encode()) + 4
            pad = (-start) % 64
            info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
            z.writestr(info, data)


def torch_layout(sd: dict) -> StateDict:
    """The state dict as torch would hold it: each qkv weight a transposed view of its storage, the two
    LayerNorm weights of a block one shared storage, the rest contiguous."""
    out = StateDict()
    for name, value in sd.items():
        if name.endswith("attn_qkv.weight"):
            out[name] = View(np.ascontiguousarray(value.T).reshape(-1), 0, value.shape, (1, value.shape[0]))
        elif name.endswith("norm1.weight"):
            shared = np.concatenate([value, sd[name.replace("norm1", "norm2")]])
            out[name] = View(shared, 0, value.shape, (1,))
            out[name.replace("norm1", "norm2")] = View(shared, value.size, value.shape, (1,))
        elif not name.endswith("norm2.weight"):
            out[name] = value
    return StateDict((k, out[k]) for k in sd)  # the original's key order


def publish(folder: Path, sd: dict, config: dict, fmt: str) -> Path:
    """A folder as louaaron/sedd-* are published: config.json + pytorch_model.bin or model.safetensors."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if fmt == "bin":
        write_torch_file(folder / "pytorch_model.bin", torch_layout(sd))
    else:
        save_file = pytest.importorskip("safetensors.numpy").save_file
        save_file({k: np.ascontiguousarray(v) for k, v in sd.items()}, str(folder / "model.safetensors"))
    return folder


def log_scores(workdir, x, sigma, ema=True) -> np.ndarray:
    run = runs.load(workdir, ema=ema)
    return np.asarray(run.score_fn(jnp.asarray(x, jnp.int32), jnp.asarray(sigma, jnp.float32)))


def relative_error(ours, theirs, offset) -> float:
    """max |ours - theirs| over the largest entry of the network's own output (theirs without the
    analytic scale-by-sigma offset, which would otherwise dwarf it)."""
    return float(np.abs(ours - theirs).max() / np.abs(theirs - offset).max())


def inputs(absorb: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, GPT2, (2, TINY["length"]))
    if absorb:
        x[:, ::3] = GPT2  # masked positions
    return x, np.array([0.3, 2.5])  # sigma on both sides of the expm1 switch at 0.5


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize(
    "graph,fmt", [("absorb", "bin"), ("absorb", "safetensors"), ("uniform", "bin"), ("uniform", "safetensors")]
)
def test_converted_model_matches_the_original_forward(tmp_path, gpt2_files, graph, fmt):
    absorb = graph == "absorb"
    sd = random_state_dict(
        original_shapes(**{k: TINY[k] for k in ("hidden_size", "n_blocks", "n_heads", "cond_dim")}, absorb=absorb),
        seed=1,
    )
    src = publish(tmp_path / "src", sd, original_config(graph), fmt)
    assert convert.main([str(src), str(tmp_path / "run"), "--tokenizer_path", str(gpt2_files)]) == 0
    x, sigma = inputs(absorb)
    theirs, offset = original_forward(sd, x, sigma, TINY["n_heads"], scale_by_sigma=absorb)
    ours = log_scores(tmp_path / "run", x, sigma)
    assert ours.shape == (2, TINY["length"], GPT2 + absorb) and ours.dtype == np.float32
    assert relative_error(ours, theirs, offset) <= 1e-5
    config = runs.read_config(tmp_path / "run")
    assert (config.graph.type, config.vocab_size, config.data.seq_len) == (
        "absorbing" if absorb else "uniform",
        GPT2,
        TINY["length"],
    )


def test_training_checkpoint_converts_its_ema_by_default_and_raw_weights_on_request(tmp_path, gpt2_files):
    pytest.importorskip("yaml")
    shapes = original_shapes(**{k: TINY[k] for k in ("hidden_size", "n_blocks", "n_heads", "cond_dim")}, absorb=False)
    raw, ema = random_state_dict(shapes, seed=2), random_state_dict(shapes, seed=3)
    params = [k for k in shapes if k != ROTARY]  # model.parameters() order: the state dict's, buffers left out
    optimizer = {
        "state": {
            i: {"step": np.array(7.0, np.float32), "exp_avg": np.zeros_like(raw[k])} for i, k in enumerate(params[:3])
        },
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
    run_dir = tmp_path / "exp_local" / "openwebtext" / "2024.01.01" / "000000"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "checkpoints-meta").mkdir()
    # Hydra's YAML as the original writes it: `1e-4` is a string to YAML 1.1 readers.
    (run_dir / ".hydra" / "config.yaml").write_text(
        "ngpus: 8\ntokens: 50257\ntraining:\n  batch_size: 512\n  ema: 0.9999\n"
        "graph:\n  type: uniform\n  file: data\n  report_all: false\n"
        "noise:\n  type: geometric\n  sigma_min: 1e-4\n  sigma_max: 20\n"
        "model:\n  name: tiny\n  type: ddit\n  hidden_size: 32\n  cond_dim: 16\n  length: 16\n  n_blocks: 2\n"
        "  n_heads: 4\n  scale_by_sigma: false\n  dropout: 0.1\n"
    )
    write_torch_file(
        run_dir / "checkpoints-meta" / "checkpoint.pth",
        {
            "optimizer": optimizer,
            "model": torch_layout(raw),
            "ema": {"decay": 0.9999, "num_updates": 7, "shadow_params": [ema[k] for k in params]},
            "step": 7,
        },
    )

    assert convert.main([str(run_dir), str(tmp_path / "ema"), "--tokenizer_path", str(gpt2_files)]) == 0
    assert convert.main([str(run_dir), str(tmp_path / "raw"), "--no_ema", "--tokenizer_path", str(gpt2_files)]) == 0
    x, sigma = inputs(absorb=False)
    for workdir, weights, use_ema in (
        (tmp_path / "ema", ema, True),
        (tmp_path / "ema", raw, False),
        (tmp_path / "raw", raw, True),
    ):
        theirs, offset = original_forward(weights, x, sigma, TINY["n_heads"], scale_by_sigma=False)
        assert relative_error(log_scores(workdir, x, sigma, use_ema), theirs, offset) <= 1e-5
    config = runs.read_config(tmp_path / "ema")
    assert (config.noise.type, config.noise.sigma_min, config.noise.sigma_max) == ("geometric", 1e-4, 20.0)
    assert runs.load(tmp_path / "ema").step == 7
    assert json.loads((tmp_path / "ema" / convert.PROVENANCE).read_text())["weights"] == "ema"


@pytest.mark.parametrize(
    "size,want",
    [
        (dict(hidden_size=768, n_blocks=12, n_heads=12), 169_627_218),
        (dict(hidden_size=1024, n_blocks=24, n_heads=16), 424_477_010),
    ],
)
def test_sedd_small_and_medium_convert_as_shapes(size, want):
    shapes = original_shapes(cond_dim=128, **size)
    abstract = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in shapes.items()}
    config = convert.config_from_original(original_config("absorb", cond_dim=128, length=1024, **size))
    params = convert.convert_params(abstract, config)
    assert sum(int(np.prod(s)) for k, s in shapes.items() if k != ROTARY) == want
    assert convert.count_parameters(params) == want
    assert all(isinstance(p, jax.ShapeDtypeStruct) for p in jax.tree.leaves(params))
    assert params["layers"][0]["attn_qkv"]["kernel"].shape == (size["hidden_size"], 3 * size["hidden_size"])


def test_load_torch_reads_dtypes_views_shared_storages_and_containers(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    shared = np.arange(10, dtype=np.float64)
    obj = {
        "half": a.astype(np.float16),
        "bf16": a.astype(ml_dtypes.bfloat16),
        "long": np.arange(6).reshape(2, 3),
        "transposed": View(np.ascontiguousarray(a.T).reshape(-1), 0, (3, 4), (1, 3)),
        "tail": View(shared, 4, (2, 3), (3, 1)),
        "head": View(shared, 0, (4,), (1,)),
        "scalar": np.array(2.5, np.float32),
        "nested": StateDict(items=[a, 3, -1.5, None, True, ("x", 2**20)]),
    }
    write_torch_file(tmp_path / "archive.pth", obj)
    got = convert.load_torch(tmp_path / "archive.pth")
    assert got["half"].dtype == np.float16 and np.array_equal(got["half"], a.astype(np.float16))
    assert got["bf16"].dtype == ml_dtypes.bfloat16 and np.array_equal(got["bf16"], a.astype(ml_dtypes.bfloat16))
    assert got["long"].dtype == np.int64 and np.array_equal(got["long"], np.arange(6).reshape(2, 3))
    assert np.array_equal(got["transposed"], a)
    assert np.array_equal(got["tail"], [[4, 5, 6], [7, 8, 9]]) and np.array_equal(got["head"], [0, 1, 2, 3])
    assert got["scalar"].shape == () and got["scalar"] == 2.5
    items = got["nested"]["items"]
    assert np.array_equal(items[0], a) and items[1:5] == [3, -1.5, None, True] and items[5] == ("x", 2**20)


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _zip_pickle(path: Path, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{path.stem}/data.pkl", payload)
        z.writestr(f"{path.stem}/version", "3\n")
    return path


def test_a_malicious_pickle_is_refused_and_runs_nothing(tmp_path, gpt2_files):
    marker = tmp_path / "pwned"
    exploit = pickle.dumps({"vocab_embed.embedding": _Exploit(marker)}, protocol=2)
    pickle.loads(exploit)  # the payload is live: a plain unpickler runs it

    assert marker.exists()
    marker.unlink()

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(original_config()))
    _zip_pickle(src / "pytorch_model.bin", exploit)
    with pytest.raises(convert.UnsafePickleError, match=r"(posix|os)\.system"):
        convert.load_torch(src / "pytorch_model.bin")
    assert convert.main([str(src), str(tmp_path / "run"), "--tokenizer_path", str(gpt2_files)]) == 2
    assert not marker.exists() and not (tmp_path / "run").exists()
    for module, name in (
        ("builtins", "eval"),
        ("subprocess", "Popen"),
        ("torch", "load"),
        ("collections", "namedtuple"),
    ):
        payload = b"\x80\x02c" + f"{module}\n{name}\n".encode() + b"X\x01\x00\x00\x001\x85R."
        with pytest.raises(convert.UnsafePickleError, match=f"{module}.{name}"):
            convert.load_torch(_zip_pickle(tmp_path / f"{name}.bin", payload))


def test_mismatched_checkpoints_and_configs_fail_naming_the_field(tmp_path):
    shapes = original_shapes(**{k: TINY[k] for k in ("hidden_size", "n_blocks", "n_heads", "cond_dim")})
    sd = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, s in shapes.items()}
    config = convert.config_from_original(original_config())
    cases = {
        "missing tensor 'blocks.1.mlp.2.bias'": {k: v for k, v in sd.items() if k != "blocks.1.mlp.2.bias"},
        r"'blocks.2.norm1.weight'\] are not part": {**sd, "blocks.2.norm1.weight": sd["blocks.0.norm1.weight"]},
        r"'blocks.0.attn_out.weight' has shape \(32, 16\)": {
            **sd,
            "blocks.0.attn_out.weight": jax.ShapeDtypeStruct((32, 16), jnp.float32),
        },
        "'sigma_map.mlp.0.bias' has dtype int64": {**sd, "sigma_map.mlp.0.bias": np.zeros(16, np.int64)},
        "rotary frequencies of base 10000": {**sd, ROTARY: (1.0 / 500 ** (np.arange(0, 8, 2) / 8)).astype(np.float32)},
    }
    for message, state_dict in cases.items():
        with pytest.raises(convert.ConversionError, match=message):
            convert.convert_params(state_dict, config)

    def bad(**changes):
        c = original_config()
        for path, value in changes.items():
            section, key = path.split("__") if "__" in path else (None, path)
            (c[section] if section else c)[key] = value
        return c

    for config_dict, message in (
        (bad(model__n_layers=3), r"model\.n_layers"),
        (bad(graph__type="roulette"), "graph.type = 'roulette'"),
        (bad(noise__type="cosine"), "noise.type = 'cosine'"),
        (bad(graph__type="uniform", model__scale_by_sigma=True), "scale_by_sigma"),
        (bad(tokens=50000), "tokens = 50000"),
        (bad(model__n_heads=5), "n_heads = 5"),
        (bad(model__length="long"), "model.length = 'long'"),
        (bad(noise__sigma_max=None), "noise.sigma_max = None"),
        # issue 53, finding 5: each was an OverflowError traceback from `sedd convert`
        (bad(noise__sigma_min=10**400), "noise.sigma_min = an integer of 401 digits"),
        (bad(training__ema=10**400), "training.ema = an integer of 401 digits"),
        (bad(model__dropout=10**5000), "model.dropout = an integer of more than 3900 digits"),
    ):
        with pytest.raises(convert.ConversionError, match=message):
            convert.config_from_original(config_dict)
    del_model = original_config()
    del del_model["model"]["cond_dim"]
    with pytest.raises(convert.ConversionError, match="no model.cond_dim"):
        convert.config_from_original(del_model)


def test_the_readme_command_before_the_download_says_how_to_fetch_the_files(tmp_path, monkeypatch, capsys):
    """`sedd convert sedd-small checkpoints/sedd-small --tokenizer_path gpt2`, as the README lists it, run before
    the files are fetched: one line naming what is missing, docs/pretrained.md and the commands that fetch
    (issue 71: it said only "SRC sedd-small does not exist")."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["convert", "sedd-small", "checkpoints/sedd-small", "--tokenizer_path", "gpt2"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("sedd convert: error: SRC sedd-small does not exist"), err
    for says in (
        "docs/pretrained.md",
        "huggingface-cli download louaaron/sedd-small --local-dir sedd-small",
        "huggingface-cli download gpt2 vocab.json merges.txt --local-dir gpt2",
    ):
        assert says in err, err
    with pytest.raises(FileNotFoundError, match="docs/pretrained.md"):  # the library says it too
        convert.convert(tmp_path / "sedd-small", tmp_path / "run")
    assert not (tmp_path / "checkpoints").exists()


def test_missing_sources_and_tokenizer_say_what_to_put_where(tmp_path, gpt2_files):
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin"):
        convert.locate(tmp_path)
    sd = random_state_dict(
        original_shapes(**{k: TINY[k] for k in ("hidden_size", "n_blocks", "n_heads", "cond_dim")}), seed=0
    )
    src = publish(tmp_path / "src", sd, original_config(), "safetensors")
    with pytest.raises(FileNotFoundError, match="vocab.json and merges.txt"):
        convert.convert(src, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    convert.convert(src, tmp_path / "run", tokenizer_path=gpt2_files)
    with pytest.raises(convert.ConversionError, match="already holds"):
        convert.convert(src, tmp_path / "run", tokenizer_path=gpt2_files)
    # One tokenizer.json file under any name is kept as the run's gpt2/tokenizer.json.
    bpe = pytest.importorskip("tokenizers").ByteLevelBPETokenizer(
        str(gpt2_files / "vocab.json"), str(gpt2_files / "merges.txt")
    )
    bpe.save(str(tmp_path / "my-gpt2.json"))
    convert.convert(src, tmp_path / "run2", tokenizer_path=tmp_path / "my-gpt2.json")
    assert runs.load(tmp_path / "run2").tokenizer.encode("the cat").tolist() == bpe.encode("the cat").ids


def test_gpt2_layout_tokenizer_round_trips_and_a_converted_run_samples_and_evaluates(tmp_path, gpt2_files, capsys):
    tok = GPT2Tokenizer(str(gpt2_files))
    for text in ("the cat sat on the mat.", "Zoë's café — “naïve” 1,234 times!\nthe dog"):
        ids = tok.encode(text)
        assert ids.dtype == np.int32 and len(ids) < len(text.encode()) and tok.decode(ids) == text

    sd = random_state_dict(
        original_shapes(**{k: TINY[k] for k in ("hidden_size", "n_blocks", "n_heads", "cond_dim")}), seed=4
    )
    src = publish(tmp_path / "src", sd, original_config(), "bin")
    for f in gpt2_files.iterdir():  # the tokenizer found inside SRC when no --tokenizer_path is given
        (src / f.name).write_bytes(f.read_bytes())
    run = tmp_path / "run"
    assert convert.main([str(src), str(run)]) == 0
    assert GPT2Tokenizer(str(run / convert.TOKENIZER_DIR)).encode("the cat").tolist() == tok.encode("the cat").tolist()

    assert (
        cli.main(["sample", "--workdir", str(run), "--prefix", "the cat sat", "--steps", "2", "--num_samples", "2"])
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("--- sample ") == 2 and out.count("\nthe cat sat") == 2
    assert (
        cli.main(
            [
                "sample",
                "--workdir",
                str(run),
                "--prefix",
                "the cat",
                "--suffix",
                " the bone.",
                "--steps",
                "2",
                "--num_samples",
                "1",
            ]
        )
        == 0
    )
    sample = capsys.readouterr().out.split("--- sample 0\n")[1].rstrip("\n")
    assert sample.startswith("the cat") and sample.endswith(" the bone.")

    # sedd.evaluate.prior_kl averages a [V, D] matrix of transitions: 10 GB and two minutes at V = 50257.
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat, and the dog ate the bone.\n" * 200)
    assert (
        cli.main(
            [
                "eval",
                "--workdir",
                str(run),
                "--num_t",
                "2",
                "--batch_size",
                "2",
                "--max_batches",
                "1",
                "--config.data.name=text",
                f"--config.data.path={corpus}",
                f"--config.data.data_dir={tmp_path / 'tfds'}",
            ]
        )
        == 0
    )
    lines = [line.split(":", 1) for line in capsys.readouterr().out.splitlines() if ":" in line]
    figures = {k.strip(): v.strip() for k, v in lines}
    assert np.isfinite(float(figures["nats_per_token"])) and int(figures["num_tokens"]) == 32
