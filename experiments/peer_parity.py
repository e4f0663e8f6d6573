r"""Parity of `sedd convert` with the field's own code: MDLM, BD3-LM and DUO at a small size, float32.

For each project its own PyTorch code (a snapshot of its repository) builds
its model with random weights, writes the files as that project publishes
them, and computes its output on fixed inputs; then `sedd convert` reads the
files and our run computes the same quantity. Printed: the largest relative
difference, max |ours - theirs| / max |theirs|, which must be <= 1e-5, and
the largest absolute one; for BD3-LM, the transformers version that wrote
its config.json (4.56 and later name the dtype field `dtype`, earlier ones
`torch_dtype`: run the harness with a Python of each to check both).

  mdlm   kuleshov-group/mdlm `models/dit.py` DIT (time_conditioning false:
         sigma = 0 fed to the network), written as kuleshov-group/mdlm-owt is
         published (config.json + model.safetensors, "backbone." keys);
         compared: SUBS log p_theta(x0 | x_t) at the masked positions.
  bd3lm  kuleshov-group/bd3lms `models/hf` BD3LM, block size 4, written by its
         own `save_pretrained` (as bd3lm-owt-block_size4 is published);
         compared: SUBS log p_theta on its training forward over [x_t ; x_0].
  duo    s-sahoo/duo `models/dit.py` DIT (uniform state, time-conditioned),
         written as its Lightning trainer saves checkpoints (torch.save of
         state_dict, ema, hyper_parameters.config as an OmegaConf DictConfig);
         compared: log_softmax of its logits (its x0 = w) against the w our
         converted run's log-score implies (log s_y - log s_{y'} = log xbar_y -
         log xbar_{y'}, inverted at sigma -> 0: our sigma = its -log alpha_t).

Usage (torch, einops, omegaconf, huggingface_hub and transformers in a second
Python; the repositories' snapshots from `git archive`):

  python experiments/peer_parity.py --torch_python /tmp/peervenv/bin/python \
      --mdlm /tmp/peers/mdlm --bd3lms /tmp/peers/bd3lms --duo /tmp/peers/duo

The projects' `flash_attn` imports are met by a plain-torch stand-in written
to a temporary folder on the torch Python's PYTHONPATH (rotary on q and k,
half-split; softmax attention with scale 1/sqrt(K)): flash-attn needs CUDA.
BD3-LM's HF model uses no flash code.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

GPT2 = 50257
SIZE = dict(hidden=64, cond=32, heads=4, blocks=2, length=16)

_SHIM = {
    "flash_attn/__init__.py": "from . import layers, flash_attn_interface\n",
    "flash_attn/layers/__init__.py": "from . import rotary\n",
    "flash_attn/layers/rotary.py": '''
import torch
def apply_rotary_emb_torch(x, cos, sin, interleaved=False):
    """x (B, S, N, K); cos, sin (S, r/2): channels j and j + r/2 of the first r rotate together."""
    assert not interleaved
    r = 2 * cos.shape[-1]
    cos = torch.cat([cos, cos], -1)[: x.shape[1], None, :].to(x.dtype)
    sin = torch.cat([sin, sin], -1)[: x.shape[1], None, :].to(x.dtype)
    x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
    return torch.cat([x[..., :r] * cos + torch.cat([-x2, x1], -1) * sin, x[..., r:]], -1)
def apply_rotary_emb_qkv_(qkv, cos, sin, cos_k=None, sin_k=None, interleaved=False, seqlen_offsets=0,
                          num_heads_q=None):
    qkv[:, :, 0] = apply_rotary_emb_torch(qkv[:, :, 0], cos, sin)
    qkv[:, :, 1] = apply_rotary_emb_torch(qkv[:, :, 1], cos_k if cos_k is not None else cos,
                                          sin_k if sin_k is not None else sin)
    return qkv
''',
    "flash_attn/flash_attn_interface.py": '''
import torch.nn.functional as F
def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                                     causal=False, **kw):
    """qkv (B * S, 3, N, K) of B sequences of equal length S -> (B * S, N, K)."""
    b = cu_seqlens.numel() - 1
    x = qkv.view(b, -1, *qkv.shape[1:])
    q, k, v = (x[:, :, i].transpose(1, 2) for i in range(3))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=softmax_scale)
    return o.transpose(1, 2).reshape(qkv.shape[0], qkv.shape[2], qkv.shape[3])
''',
}


# --------------------------------------------------------------------------- the torch side (their code)


def _load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _randomize(model, torch) -> None:
    """Every parameter random (their adaLN and output layers start at zero, which would hide them)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 1.0 / max(p.shape[-1], 1) ** 0.5 if p.ndim == 2 and "embedding" not in name else 0.2
            p.copy_(torch.randn(p.shape, generator=gen) * scale + (1.0 if "norm" in name else 0.0))


def _subs(logits, torch):
    """MDLM's / BD3-LM's `_subs_parameterization` at the masked positions: log p_theta(x0 | x_t) over V."""
    logits = logits.clone()
    logits[..., GPT2] += -1e6  # neg_infinity at the mask index
    return logits - torch.logsumexp(logits, dim=-1, keepdim=True)


def export_mdlm(root, out: Path, s: dict, v: int, inputs: dict, model_cfg: dict, arrays: dict, torch) -> None:
    """MDLM's DIT with random weights, its published files (model.safetensors, config.json), its output."""
    import safetensors.torch

    xt = inputs["xt"]
    dit = _load_module("mdlm_dit", Path(root) / "models" / "dit.py")
    m = dit.DIT({"model": model_cfg}, vocab_size=v).eval()
    _randomize(m, torch)
    folder = out / "mdlm"
    folder.mkdir()
    safetensors.torch.save_file(
        {"backbone." + k: t.contiguous() for k, t in m.state_dict().items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (folder / "config.json").write_text(
        json.dumps(
            {  # kuleshov-group/mdlm-owt's config.json, resized
                "architectures": ["MDLM"],
                "auto_map": {
                    "AutoConfig": "configuration_mdlm.MDLMConfig",
                    "AutoModelForMaskedLM": "modeling_mdlm.MDLM",
                },
                "cond_dim": s["cond"],
                "dropout": 0.0,
                "hidden_dim": s["hidden"],
                "model_length": s["length"],
                "model_type": "mdlm",
                "n_blocks": s["blocks"],
                "n_heads": s["heads"],
                "return_dict": False,
                "time_conditioning": False,
                "torch_dtype": "float32",
                "transformers_version": "4.38.2",
                "vocab_size": v,
            }
        )
    )
    with torch.no_grad():  # Diffusion._process_sigma: time_conditioning false feeds zeros
        arrays["mdlm"] = _subs(m(xt, torch.zeros(2)), torch).numpy()


def export_bd3lm(root, out: Path, s: dict, v: int, inputs: dict, model_cfg: dict, arrays: dict, torch) -> None:
    """BD3-LM's model with random weights, written by its own save_pretrained, and its output."""
    from models.hf import BD3LM, BD3LMConfig

    x0, xt, sigma = inputs["x0"], inputs["xt"], inputs["sigma"]

    config = BD3LMConfig(
        block_size=4,
        vocab_size=v,
        model_length=s["length"],
        hidden_dim=s["hidden"],
        cond_dim=s["cond"],
        n_blocks=s["blocks"],
        n_heads=s["heads"],
        dropout=0.0,
        time_conditioning=False,
        attn_backend="sdpa",
        return_dict=False,
    )
    b = BD3LM(config).eval()
    _randomize(b, torch)
    with torch.no_grad():
        b.sampling_eps_min.fill_(0.2)
        b.sampling_eps_max.fill_(0.8)
    b.save_pretrained(str(out / "bd3lm"))  # its own writer: config.json + model.safetensors
    with torch.no_grad():
        arrays["bd3lm"] = _subs(b(input_ids=torch.cat([xt, x0], 1), timesteps=sigma), torch).numpy()


def export_duo(root, out: Path, s: dict, v: int, inputs: dict, model_cfg: dict, arrays: dict, torch) -> None:
    """DUO's DIT with random weights and an EMA unlike them, a Lightning checkpoint, and the EMA's output."""
    import omegaconf

    sigma, gen = inputs["sigma"], inputs["gen"]

    dit = _load_module("duo_dit", Path(root) / "models" / "dit.py")
    config = omegaconf.OmegaConf.create(
        {
            "algo": {
                "name": "duo",
                "backbone": "dit",
                "parameterization": "mean",
                "time_conditioning": True,
                "causal_attention": False,
                "T": 0,
            },
            "model": {**model_cfg, "name": "tiny", "type": "ddit"},
            "noise": {"type": "log-linear", "eps": 1e-3},
            "training": {"ema": 0.9999},
        }
    )
    m = dit.DIT(config, vocab_size=v).eval()
    _randomize(m, torch)
    x = torch.randint(0, v, (2, s["length"]), generator=gen)
    shadow = [p.detach().clone() * 0.5 for p in m.parameters()]  # an EMA unlike the raw weights
    ckpt = {
        "epoch": 0,
        "global_step": 7,
        "pytorch-lightning_version": "2.2.1",
        "state_dict": {"backbone." + k: t for k, t in m.state_dict().items()},
        "ema": {"decay": 0.9999, "num_updates": 7, "shadow_params": shadow},
        "hyper_parameters": {"config": config},
        "loops": {},
        "callbacks": {},
        "optimizer_states": [],
        "lr_schedulers": [],
    }
    (out / "duo").mkdir()
    torch.save(ckpt, out / "duo" / "duo.ckpt")  # DUO_BASE.on_save_checkpoint + Lightning's dict
    with torch.no_grad():
        for p, e in zip(m.parameters(), shadow):
            p.copy_(e)  # the EMA weights, which DUO samples with
        arrays["duo_x"] = x.numpy()
        arrays["duo"] = torch.log_softmax(m(x, sigma), -1).numpy()  # DUO_BASE._process_model_output


def export(args) -> None:
    """Runs in the torch Python: writes each project's files and its outputs into args.out."""
    import torch

    torch.manual_seed(0)
    out, s, v = Path(args.out), SIZE, GPT2 + 1  # flash_attn's stand-in and bd3lms' `models` come by PYTHONPATH
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randint(0, GPT2, (2, s["length"]), generator=gen)
    xt = x0.clone()
    xt[:, 1::3] = GPT2  # MASK
    sigma = torch.tensor([0.3, 2.5])
    arrays = {"x0": x0.numpy(), "xt": xt.numpy(), "sigma": sigma.numpy()}
    model_cfg = {
        "hidden_size": s["hidden"],
        "cond_dim": s["cond"],
        "n_heads": s["heads"],
        "n_blocks": s["blocks"],
        "dropout": 0.0,
        "scale_by_sigma": True,
        "length": s["length"],
    }

    inputs = {"x0": x0, "xt": xt, "sigma": sigma, "gen": gen}
    for root, write in ((args.mdlm, export_mdlm), (args.bd3lms, export_bd3lm), (args.duo, export_duo)):
        if root:
            write(root, out, s, v, inputs, model_cfg, arrays, torch)
    np.savez(out / "theirs.npz", **arrays)


# --------------------------------------------------------------------------- our side


def compare(out: Path, tokenizer: Path, families: list[str]) -> dict:
    import jax
    import jax.numpy as jnp

    from sedd import convert, runs

    from sedd.kinds import block

    theirs = np.load(out / "theirs.npz")
    xt, x0, sigma = theirs["xt"], theirs["x0"], theirs["sigma"]
    masked = xt == GPT2
    results = {}
    for family in families:
        run_dir = out / f"run_{family}"
        src = out / family / ("duo.ckpt" if family == "duo" else "")
        convert.convert(src, run_dir, tokenizer_path=tokenizer)
        run = runs.load(run_dir)
        if family == "mdlm":
            ours = (
                np.asarray(run.score_fn(jnp.asarray(xt), jnp.asarray(sigma))) + np.log(np.expm1(sigma))[:, None, None]
            )
            got, want = ours[masked][:, :GPT2], theirs["mdlm"][masked][:, :GPT2]
        elif family == "bd3lm":
            ours = np.asarray(block.log_score(run.model, jnp.asarray(xt), jnp.asarray(x0), jnp.asarray(sigma), 4))
            ours = ours + np.log(np.expm1(sigma))[:, None, None]
            got, want = ours[masked][:, :GPT2], theirs["bd3lm"][masked][:, :GPT2]
        else:  # DUO: recover w from our log-score, log xbar_y = log(D alpha w_y + 1 - alpha) up to a constant
            x = theirs["duo_x"]
            logits = run.model.network_output(jnp.asarray(x), jnp.asarray(sigma), deterministic=True)
            got = np.asarray(jax.nn.log_softmax(logits, -1))
            want = theirs["duo"]
            ls = np.asarray(run.score_fn(jnp.asarray(x), jnp.asarray(sigma)), np.float64)
            d, alpha = ls.shape[-1], np.exp(-sigma)[:, None, None]
            xbar = d * alpha * np.exp(want) + 1 - alpha
            implied = np.log(xbar) - np.log(np.take_along_axis(xbar, x[..., None], -1))
            results["duo log-score vs its posterior's xbar ratio"] = _differences(ls, implied)
        results[family] = _differences(got, want)
    return results


def _differences(got, want) -> tuple[float, float]:
    """(max |got - want| / max |want|, max |got - want|)."""
    worst = float(np.abs(got - want).max())
    return worst / float(np.abs(want).max()), worst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--torch_python", required=False, help="a Python with torch (runs the projects' code)")
    p.add_argument("--mdlm", help="a snapshot of kuleshov-group/mdlm")
    p.add_argument("--bd3lms", help="a snapshot of kuleshov-group/bd3lms")
    p.add_argument("--duo", help="a snapshot of s-sahoo/duo")
    p.add_argument("--tokenizer_path", help="GPT-2's tokenizer files (default: a BPE trained here, GPT-2's layout)")
    p.add_argument("--export", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.export:
        export(args)
        return 0
    families = [f for f, path in (("mdlm", args.mdlm), ("bd3lm", args.bd3lms), ("duo", args.duo)) if path]
    if not (args.torch_python and families):
        p.error("give --torch_python and at least one of --mdlm, --bd3lms, --duo")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, text in _SHIM.items():
            (tmp / "shim" / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / "shim" / name).write_text(text)
        cmd = [args.torch_python, __file__, "--export", "--out", str(tmp)]
        for flag in ("mdlm", "bd3lms", "duo"):
            if getattr(args, flag):
                cmd += [f"--{flag}", str(Path(getattr(args, flag)).absolute())]
        # The torch Python imports the flash_attn stand-in, and BD3-LM's package `models`, from these folders.
        paths = (
            [str(tmp / "shim")]
            + ([str(Path(args.bd3lms).absolute())] if args.bd3lms else [])
            + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        )
        subprocess.run(cmd, check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)})
        tokenizer = Path(args.tokenizer_path) if args.tokenizer_path else _toy_gpt2(tmp)
        results = compare(tmp, tokenizer, families)
        written = _written_by(tmp, families)
    worst = max(rel for rel, _ in results.values())
    for name, (rel, absolute) in results.items():
        print(f"{name:>48}: max relative difference {rel:.2e}, max absolute {absolute:.2e}{written.get(name, '')}")
    print(f"peer_parity: {'PASS' if worst <= 1e-5 else 'FAIL'} (float32, rel <= 1e-5)")
    return 0 if worst <= 1e-5 else 1


def _written_by(tmp: Path, families: list[str]) -> dict[str, str]:
    """BD3-LM's folder (the one written by transformers' own save_pretrained): which version, its dtype field."""
    out = {}
    for family in families:
        config = tmp / family / "config.json"
        if family == "bd3lm" and config.is_file():
            fields = json.loads(config.read_text())
            dtype = [k for k in ("dtype", "torch_dtype") if k in fields]
            out[family] = f" (config.json of transformers {fields.get('transformers_version')}, {'/'.join(dtype)})"
    return out


def _toy_gpt2(tmp: Path) -> Path:
    """A byte-level BPE in GPT-2's file layout (the weights do not depend on the tokenizer's merges)."""
    import tokenizers

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        ["the cat sat on the mat."] * 20,
        vocab_size=300,
        min_frequency=1,
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    (tmp / "gpt2").mkdir()
    bpe.save_model(str(tmp / "gpt2"))
    return tmp / "gpt2"


if __name__ == "__main__":
    sys.exit(main())
