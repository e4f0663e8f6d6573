"""sedd convert on the field's other checkpoints: MDLM's, BD3-LM's and DUO's layouts and parameterizations.

kuleshov-group/mdlm-owt and bd3lm-owt-block_size* are Hugging Face folders:
config.json (flat: model_type, hidden_dim, n_blocks, ..., time_conditioning)
and model.safetensors (SEDD's DDiT under "backbone.", BD3-LM with two 0-d
buffers); DUO's trainer saves PyTorch Lightning checkpoints (torch.save of the
state dict, the EMA and the Hydra config as an OmegaConf DictConfig). The files
are written here as the projects write them (without torch), and the
converted runs are checked against a float64 NumPy forward of the same network
with the projects' own output maps (SUBS: log-softmax over the tokens, the MASK
logit excluded; sigma = 0 fed to the sigma embedding). The same comparison
against the projects' own PyTorch code is experiments/peer_parity.py (torch
needed; not part of this suite).
"""

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from flax import nnx
from starlette.testclient import TestClient

from sedd import cli, convert, runs, serve

from sedd.kinds import block
from sedd.kinds.block import block_diffusion_mask
from sedd.model import DDiT
from test_convert import GPT2, Obj, original_forward, original_shapes, random_state_dict, write_torch_file

TINY = dict(hidden_dim=32, n_blocks=2, n_heads=4, cond_dim=16, model_length=16)
EPS = (0.25, 0.75)  # BD3-LM's clipped interval, as its 0-d buffers hold it


def peer_config(model_type: str, **fields) -> dict:
    """config.json as kuleshov-group publishes it (MDLMConfig / BD3LMConfig.to_json_string), shrunk."""
    arch = {"mdlm": "MDLM", "bd3lm": "BD3LM"}[model_type]
    c = {
        "architectures": [arch],
        "auto_map": {
            "AutoConfig": f"configuration_{model_type}.{arch}Config",
            "AutoModelForMaskedLM": f"modeling_{model_type}.{arch}",
        },
        "model_type": model_type,
        "vocab_size": GPT2 + 1,
        "dropout": 0.1,
        "time_conditioning": False,
        "return_dict": False,
        "torch_dtype": "float32",
        "transformers_version": "4.49.0",
        **TINY,
    }
    if model_type == "bd3lm":
        c.update(
            block_size=4,
            cross_attn=True,
            attn_backend="sdpa",
            var_min=True,
            sampling_eps_min=1e-3,
            sampling_eps_max=0.999,
        )
    c.update(fields)
    return c


def backbone(seed: int) -> dict:
    """The backbone's state dict (SEDD's DDiT names) with random values: GPT-2's tokens + MASK (or DUO's [PAD])."""
    return random_state_dict(
        original_shapes(TINY["hidden_dim"], TINY["n_blocks"], TINY["n_heads"], TINY["cond_dim"]), seed
    )


def publish(folder, sd: dict, config: dict, fmt: str = "safetensors"):
    """config.json + model.safetensors (save_pretrained) or pytorch_model.bin, the backbone under "backbone."."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {"backbone." + k: v for k, v in sd.items()}
    if config["model_type"] == "bd3lm":
        tensors.update(sampling_eps_min=np.array(EPS[0], np.float32), sampling_eps_max=np.array(EPS[1], np.float32))
    if fmt == "bin":
        write_torch_file(folder / "pytorch_model.bin", {k: np.asarray(v) for k, v in tensors.items()})
    else:
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def subs_log_score(logits: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """MDLM's SUBS at a masked position as a log-score: log_softmax over the V tokens - log(e^sigma - 1)."""
    tokens = logits[..., :GPT2]
    tokens = tokens - tokens.max(-1, keepdims=True)
    logp = tokens - np.log(np.exp(tokens).sum(-1, keepdims=True))
    return logp - np.log(np.expm1(sigma))[:, None, None]


def masked_inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    x0 = rng.integers(0, GPT2, (2, TINY["model_length"]))
    x = x0.copy()
    x[:, 1::3] = GPT2  # MASK
    return x0, x, np.array([0.3, 2.5])


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_mdlm_converts_and_matches_its_subs_forward(tmp_path, gpt2_files, fmt):
    """sigma = 0 fed to the sigma embedding (mdlm-owt's time_conditioning = false), SUBS on the logits."""
    sd = backbone(seed=1)
    src = publish(tmp_path / "src", sd, peer_config("mdlm"), fmt)
    summary = convert.convert(src, tmp_path / "run", tokenizer_path=gpt2_files)
    assert summary["family"] == "mdlm" and "folded" in summary
    run = runs.load(tmp_path / "run")
    assert run.config.model.kind == "ddit" and run.config.model.normalize and not run.config.model.time_conditioning
    _, x, sigma = masked_inputs()
    ours = np.asarray(run.score_fn(jnp.asarray(x, jnp.int32), jnp.asarray(sigma, jnp.float32)))
    logits, _ = original_forward(sd, x, np.zeros(2), TINY["n_heads"], scale_by_sigma=False, raw=True)
    theirs = subs_log_score(logits, sigma)
    masked = x == GPT2
    rel = np.abs(ours[masked][:, :GPT2] - theirs[masked]).max() / np.abs(theirs[masked]).max()
    assert rel < 1e-5, rel


def test_mdlm_with_time_conditioning_keeps_its_sigma_embedding(tmp_path, gpt2_files):
    sd = backbone(seed=2)
    src = publish(tmp_path / "src", sd, peer_config("mdlm", time_conditioning=True))
    convert.convert(src, tmp_path / "run", tokenizer_path=gpt2_files)
    run = runs.load(tmp_path / "run")
    _, x, sigma = masked_inputs(1)
    ours = np.asarray(run.score_fn(jnp.asarray(x, jnp.int32), jnp.asarray(sigma, jnp.float32)))
    logits, _ = original_forward(sd, x, sigma, TINY["n_heads"], scale_by_sigma=False, raw=True)
    theirs = subs_log_score(logits, sigma)
    masked = x == GPT2
    assert np.abs(ours[masked][:, :GPT2] - theirs[masked]).max() / np.abs(theirs[masked]).max() < 1e-5


# config.json as BD3LM.save_pretrained writes it under each transformers (both measured 2026-12-05, the same
# fields otherwise): 4.56 and later name torch_dtype `dtype`
WRITTEN_BY = {"4.49.0": {}, "4.57.6": {"torch_dtype": None, "dtype": "float32", "transformers_version": "4.57.6"}}


@pytest.mark.parametrize("transformers", sorted(WRITTEN_BY))
def test_bd3lm_converts_to_a_block_run_matching_its_training_forward(tmp_path, gpt2_files, capsys, transformers):
    """BD3-LM's forward over [x_t ; x_0] with its block-diffusion mask, the same rotary positions on both halves;
    its folder as transformers 4.49 and 4.57 write it."""
    sd = backbone(seed=3)
    config = {k: v for k, v in {**peer_config("bd3lm"), **WRITTEN_BY[transformers]}.items() if v is not None}
    src = publish(tmp_path / "src", sd, config)
    summary = convert.convert(src, tmp_path / "run", tokenizer_path=gpt2_files)
    assert (summary["sampling_eps_min"], summary["sampling_eps_max"]) == EPS
    run = runs.load(tmp_path / "run")
    assert run.config.model.kind == "block" and run.config.model.block_size == 4
    x0, x, sigma = masked_inputs(2)
    length = TINY["model_length"]
    ours = np.asarray(
        block.log_score(
            run.model, jnp.asarray(x, jnp.int32), jnp.asarray(x0, jnp.int32), jnp.asarray(sigma, jnp.float32), 4
        )
    )
    both = np.concatenate([x, x0], 1)
    logits, _ = original_forward(
        sd,
        both,
        np.zeros(2),
        TINY["n_heads"],
        scale_by_sigma=False,
        positions=np.concatenate([np.arange(length)] * 2),
        mask=block_diffusion_mask(length, 4),
        raw=True,
    )
    theirs = subs_log_score(logits[:, :length], sigma)
    masked = x == GPT2
    assert np.abs(ours[masked][:, :GPT2] - theirs[masked]).max() / np.abs(theirs[masked]).max() < 1e-5
    assert ("['dtype']" in capsys.readouterr().err) == ("dtype" in config)


# Behind -m slow, every family (each converts through the same writer): the default suite holds each family's
# parity with its own code (above) and a converted run sampled and evaluated (test_convert.py), not this end to end.
@pytest.mark.slow
@pytest.mark.parametrize("family", ["mdlm", "bd3lm", "duo"])
def test_converted_peers_sample_evaluate_and_serve(tmp_path, gpt2_files, capsys, family):
    if family == "duo":
        sd = backbone(seed=4)
        src = lightning_checkpoint(tmp_path / "src" / "duo.ckpt", sd, {k: v * 0.5 for k, v in sd.items()})
    else:
        src = publish(tmp_path / "src", backbone(seed=4), peer_config(family))
    run_dir = tmp_path / "run"
    assert convert.main([str(src), str(run_dir), "--tokenizer_path", str(gpt2_files)]) == 0
    assert "sedd sample" in capsys.readouterr().out
    assert (
        cli.main(
            [
                "sample",
                "--workdir",
                str(run_dir),
                "--prefix",
                "the cat",
                "--steps",
                "2",
                "--num_samples",
                "2",
                "--max_length",
                "16",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert out.count("--- sample ") == 2 and out.count("\nthe cat") == 2
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat, and the dog ate the bone.\n" * 200)
    assert (
        cli.main(
            [
                "eval",
                "--workdir",
                str(run_dir),
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
    figures = {
        k.strip(): v.strip()
        for k, v in (line.split(":", 1) for line in capsys.readouterr().out.splitlines() if ":" in line)
    }
    assert np.isfinite(float(figures["nats_per_token"])) and int(figures["num_tokens"]) == 32
    run = runs.load(run_dir)
    limits = serve.Limits(max_steps=4, max_n=2, max_batch=4, timeout_s=120, window_s=0.05)
    with TestClient(serve.create_app(run, family, limits), base_url="http://localhost") as c:
        r = c.post(
            "/v1/completions", json={"model": family, "prompt": "the cat", "max_tokens": 4, "seed": 1, "steps": 2}
        )
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] is not None


def _written(tmp_path) -> list:
    return [p.name for p in tmp_path.iterdir() if p.name != "src"]


@pytest.mark.parametrize(
    "tamper,message",
    [
        (lambda sd, c: c.update(hidden_size=32), "unknown field(s) ['hidden_size']"),
        (lambda sd, c: c.update(model_type="llada"), "model_type = 'llada'"),
        (lambda sd, c: c.update(model_type={"mdlm": 1}), "model_type = {'mdlm': 1}"),  # issue 53: was a TypeError
        (lambda sd, c: c.update(dropout=10**400), "dropout = an integer of 401 digits"),  # was an OverflowError
        (lambda sd, c: c.update(vocab_size=GPT2), f"vocab_size = {GPT2}"),
        (lambda sd, c: c.update(n_heads=5), "no even head size"),
        (lambda sd, c: sd.pop("blocks.1.attn_out.weight"), "missing tensor 'backbone.blocks.1.attn_out.weight'"),
        (
            lambda sd, c: sd.update({"blocks.0.norm1.weight": np.ones(31, np.float32)}),
            "'backbone.blocks.0.norm1.weight' has shape (31,)",
        ),
        (lambda sd, c: sd.pop("sigma_map.mlp.2.bias"), "missing tensor 'backbone.sigma_map.mlp.2.bias' (the sigma "),
        (lambda sd, c: sd.update({"lm_head.weight": np.ones(3, np.float32)}), "'backbone.lm_head.weight'"),
    ],
)
def test_a_tampered_mdlm_folder_is_refused_naming_what_is_wrong(tmp_path, gpt2_files, tamper, message):
    sd, config = backbone(seed=5), peer_config("mdlm")
    tamper(sd, config)
    src = publish(tmp_path / "src", sd, config)
    with pytest.raises(convert.ConversionError) as e:
        convert.convert(src, tmp_path / "run", tokenizer_path=gpt2_files)
    assert message in str(e.value)
    assert _written(tmp_path) == []  # nothing written, not even a temporary folder


@pytest.mark.parametrize(
    "tamper,message",
    [
        (lambda t, c: c.update(block_size=5), "block_size = 5"),
        (lambda t, c: c.update(cross_attn=False), "cross_attn = False"),
        (lambda t, c: c.update(time_conditioning=True), "time_conditioning = true in the bd3lm"),
        (lambda t, c: t.pop("sampling_eps_max"), "missing tensor 'sampling_eps_max'"),
        (lambda t, c: t.update(sampling_eps_min=np.array(3.0, np.float32)), "sampling_eps_min = 3.0"),
        (lambda t, c: t.update(noise_schedule=np.ones(2, np.float32)), "'noise_schedule'"),
        (
            lambda t, c: t.pop("backbone.blocks.0.adaLN_modulation.bias"),
            "missing tensor 'backbone.blocks.0.adaLN_modulation.bias'",
        ),
        (
            lambda t, c: t.update({"backbone.output_layer.linear.weight": np.zeros((GPT2, 32), np.float32)}),
            f"'backbone.output_layer.linear.weight' has shape ({GPT2}, 32)",
        ),
    ],
)
def test_a_tampered_bd3lm_folder_is_refused_naming_what_is_wrong(tmp_path, gpt2_files, tamper, message):
    config = peer_config("bd3lm")
    src = publish(tmp_path / "src", backbone(seed=6), config)
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(src / "model.safetensors"))
    tamper(tensors, config)
    save_file(tensors, str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(convert.ConversionError) as e:
        convert.convert(src, tmp_path / "run", tokenizer_path=gpt2_files)
    assert message in str(e.value)
    assert _written(tmp_path) == []


@pytest.mark.parametrize("family", ["mdlm", "bd3lm"])
def test_a_peer_pickle_naming_a_global_is_refused_and_runs_nothing(tmp_path, gpt2_files, family):
    import zipfile

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(peer_config(family)))
    payload = b"\x80\x02cos\nsystem\nX\x05\x00\x00\x00touch\x85R."  # os.system("touch"): never called
    with zipfile.ZipFile(src / "pytorch_model.bin", "w") as z:
        z.writestr("pytorch_model/data.pkl", payload)
    with pytest.raises(convert.UnsafePickleError, match="os.system"):
        convert.convert(src, tmp_path / "run", tokenizer_path=gpt2_files)
    assert _written(tmp_path) == []


# --------------------------------------------------------------------------- DUO: the uniform graph's x0 output


def test_uniform_mean_score_is_the_ratio_of_marginals():
    """normalize on the uniform graph (DUO): log s_y = log p_sigma(y) - log p_sigma(x) for x0 ~ w at each position.

    Brute force: the forward kernel exp(sigma Q) with Q = 11^T / D - I (scipy's
    expm), the marginal p_sigma = w exp(sigma Q) of each position's x0 law
    w = softmax(network output); and DUO's ancestral posterior from the same w
    equals the exact reverse step p_s(y) K_{s->t}(y, x) / p_t(x) of that law.
    """
    d, length = 7, 5
    net = DDiT(
        num_tokens=d,
        out_dim=d,
        hidden_size=16,
        n_layers=1,
        n_heads=2,
        cond_dim=8,
        dropout=0.0,
        max_len=length,
        normalize=True,
        rngs=nnx.Rngs(0),
    )
    rng = np.random.default_rng(0)
    out = rng.standard_normal((2, length, d)).astype(np.float32) * 2
    x = rng.integers(0, d, (2, length))
    sigma = np.array([0.05, 1.7])
    ours = np.asarray(net.log_score(jnp.asarray(out), jnp.asarray(x), jnp.asarray(sigma, jnp.float32)))
    w = np.exp(out - out.max(-1, keepdims=True)).astype(np.float64)
    w /= w.sum(-1, keepdims=True)
    q = np.ones((d, d)) / d - np.eye(d)
    for b in range(2):
        kernel = scipy.linalg.expm(sigma[b] * q)  # kernel[z, y] = q_sigma(y | z)
        marginal = w[b] @ kernel  # (L, D)
        want = np.log(marginal) - np.log(marginal[np.arange(length), x[b]])[:, None]
        np.testing.assert_allclose(ours[b], want, atol=2e-5)

    # DUO's _posterior_from_x0 (alpha_t = e^-sigma_t) against the exact reverse step of x0 ~ w.
    sig_s, sig_t = 0.4, 1.1
    a_s, a_t = math.exp(-sig_s), math.exp(-sig_t)
    k_s, k_st = scipy.linalg.expm(sig_s * q), scipy.linalg.expm((sig_t - sig_s) * q)
    p_s, p_t = w[0] @ k_s, w[0] @ k_s @ k_st
    e = np.eye(d)[x[0]]
    a_ts = a_t / a_s
    duo = (a_t * d * w[0] * e + (a_ts - a_t) * e + (a_s - a_t) * w[0] + (1 - a_ts) * (1 - a_s) / d) / (
        a_t * d * (w[0] * e).sum(-1, keepdims=True) + 1 - a_t
    )
    exact = p_s * k_st[:, x[0]].T / p_t[np.arange(length), x[0]][:, None]
    np.testing.assert_allclose(duo, exact, atol=1e-12)


def _omegaconf(value):
    """value as OmegaConf pickles it: DictConfig(_metadata, _parent, _content = {key: node}), AnyNode(_val)."""
    meta = Obj(
        "omegaconf.base",
        "ContainerMetadata",
        {"ref_type": Obj("typing", "Any"), "object_type": None, "optional": True, "key": None, "flags": {}},
    )
    if isinstance(value, dict):
        return Obj(
            "omegaconf.dictconfig",
            "DictConfig",
            {"_metadata": meta, "_parent": None, "_content": {k: _omegaconf(v) for k, v in value.items()}},
        )
    return Obj(
        "omegaconf.nodes",
        "AnyNode",
        {"_metadata": Obj("omegaconf.base", "Metadata", {"key": None}), "_parent": None, "_val": value},
    )


def duo_hydra(**algo) -> dict:
    model = dict(
        name="tiny",
        type="ddit",
        hidden_size=TINY["hidden_dim"],
        cond_dim=TINY["cond_dim"],
        length=TINY["model_length"],
        n_blocks=TINY["n_blocks"],
        n_heads=TINY["n_heads"],
        scale_by_sigma=True,
        dropout=0.1,
        tie_word_embeddings=False,
    )
    return {
        "algo": {
            "name": "duo",
            "backbone": "dit",
            "parameterization": "mean",
            "time_conditioning": True,
            "T": 0,
            "causal_attention": False,
            "gumbel_tau_log10_start": -3.0,
            **algo,
        },
        "model": model,
        "noise": {"type": "log-linear", "eps": 1e-3},
        "training": {"ema": 0.9999},
    }


def lightning_checkpoint(path, sd: dict, ema: dict, hydra: dict | None = None, **extra):
    """s-sahoo/duo's Lightning checkpoint: state_dict (backbone.*), ema.shadow_params in parameter order,
    hyper_parameters.config (an OmegaConf DictConfig), global_step and the trainer's state."""
    path.parent.mkdir(parents=True, exist_ok=True)
    order = [name for name, _, _ in convert.parameter_map(TINY["n_blocks"])]
    ckpt = {
        "epoch": 3,
        "global_step": 1234,
        "pytorch-lightning_version": "2.2.1",
        "state_dict": {"backbone." + k: v for k, v in sd.items()},
        "ema": {"decay": 0.9999, "num_updates": 1234, "shadow_params": [ema[k] for k in order]},
        "hyper_parameters": {"config": _omegaconf(hydra or duo_hydra())},
        "loops": {
            "fit_loop": {
                "state_dict": {},
                "epoch_progress": Obj("lightning.loops.progress", "Progress", {"total": {"ready": 3}}),
            }
        },
        "callbacks": {},
        "optimizer_states": [],
        "lr_schedulers": [],
        **extra,
    }
    write_torch_file(path, ckpt)
    return path


def duo_log_score(sd: dict, x: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """DUO's x0 = softmax(logits) as the uniform graph's log-score, log xbar_y - log xbar_{x_l}."""
    logits, _ = original_forward(sd, x, sigma, TINY["n_heads"], scale_by_sigma=False, raw=True)
    logits = logits - logits.max(-1, keepdims=True)
    w = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    d, alpha = w.shape[-1], np.exp(-sigma)[:, None, None]
    xbar = d * alpha * w + 1 - alpha
    return np.log(xbar) - np.log(np.take_along_axis(xbar, x[..., None], -1))


def test_duo_lightning_checkpoint_converts_its_ema_and_matches_its_x0_law(tmp_path, gpt2_files):
    """The EMA by default, the raw weights with ema=False; both against DUO's output map on the same network."""
    sd = backbone(seed=7)
    ema = {k: v * 0.5 if k != "rotary_emb.inv_freq" else v for k, v in sd.items()}
    src = lightning_checkpoint(tmp_path / "duo.ckpt", sd, ema)
    summary = convert.convert(src, tmp_path / "run", tokenizer_path=gpt2_files)
    assert (summary["family"], summary["weights"], summary["step"]) == ("duo", "ema", 1234)
    rng = np.random.default_rng(0)
    x, sigma = rng.integers(0, GPT2 + 1, (2, TINY["model_length"])), np.array([0.05, 1.5])
    for run_dir, weights in ((tmp_path / "run", ema), (tmp_path / "raw", sd)):
        if weights is sd:
            convert.convert(src, run_dir, ema=False, tokenizer_path=gpt2_files)
        run = runs.load(run_dir)
        assert run.config.graph.type == "uniform" and run.config.vocab_size == GPT2 + 1 and run.tokenizer.pad
        ours = np.asarray(run.score_fn(jnp.asarray(x, jnp.int32), jnp.asarray(sigma, jnp.float32)))
        theirs = duo_log_score(weights, x, sigma)
        assert np.abs(ours - theirs).max() / np.abs(theirs).max() < 1e-5
    assert run.tokenizer.decode([GPT2, 0, GPT2]) == run.tokenizer.decode([0])  # [PAD] is dropped


@pytest.mark.parametrize(
    "hydra,message",
    [
        (dict(duo_hydra(), algo={"name": "mdlm"}), "algo.name = 'mdlm'"),
        (duo_hydra(parameterization="subs"), "algo.parameterization = 'subs'"),
        (duo_hydra(time_conditioning=False), "algo.time_conditioning = false"),
        (dict(duo_hydra(), noise={"type": "cosine"}), "noise = {'type': 'cosine'}"),
        (dict(duo_hydra(), model={"hidden_size": 32}), "config has no n_blocks"),
        # issue 53, finding 5: a TypeError, an OverflowError and an unlabelled one-liner
        (
            dict(duo_hydra(), noise={"type": "log-linear", "eps": [1]}),
            "noise.eps = [1] in the original's config is not",
        ),
        (
            dict(duo_hydra(), noise={"type": "log-linear", "eps": None}),
            "noise.eps = None in the original's config is not",
        ),
        (dict(duo_hydra(), noise={"type": "log-linear", "eps": "abc"}), "noise.eps = 'abc' in the original's config"),
        (dict(duo_hydra(), model={**duo_hydra()["model"], "dropout": 10**400}), "dropout = an integer of 401 digits"),
    ],
)
def test_a_tampered_duo_checkpoint_is_refused_naming_what_is_wrong(tmp_path, gpt2_files, hydra, message):
    sd = backbone(seed=8)
    src = lightning_checkpoint(tmp_path / "src" / "duo.ckpt", sd, sd, hydra)
    with pytest.raises(convert.ConversionError) as e:
        convert.convert(src, tmp_path / "run", tokenizer_path=gpt2_files)
    assert message in str(e.value)
    assert _written(tmp_path) == []


def test_a_duo_checkpoint_with_a_wrong_tensor_or_a_called_global_runs_nothing_and_is_refused(tmp_path, gpt2_files):
    sd = backbone(seed=9)
    bad = dict(sd, **{"blocks.0.mlp.0.bias": np.zeros(7, np.float32)})
    src = lightning_checkpoint(tmp_path / "a" / "duo.ckpt", bad, sd)
    with pytest.raises(convert.ConversionError, match="'backbone.blocks.0.mlp.0.bias' has shape \\(7,\\)"):
        convert.convert(src, tmp_path / "run", tokenizer_path=gpt2_files, ema=False)
    marker = tmp_path / "ran"
    hydra = Obj("os", "system", args=(f"touch {marker}",), call=True)  # stands in for the config: never called
    path = tmp_path / "b" / "duo.ckpt"
    path.parent.mkdir()
    order = [name for name, _, _ in convert.parameter_map(TINY["n_blocks"])]
    write_torch_file(
        path,
        {
            "state_dict": {"backbone." + k: v for k, v in sd.items()},
            "ema": {"shadow_params": [sd[k] for k in order]},
            "hyper_parameters": {"config": hydra},
            "global_step": 1,
        },
    )
    with pytest.raises(convert.ConversionError, match="holds a 'os.system', not an OmegaConf config"):
        convert.convert(path, tmp_path / "run", tokenizer_path=gpt2_files)
    assert not marker.exists() and not (tmp_path / "run").exists()
    with pytest.raises(convert.UnsafePickleError, match="os.system"):  # a state dict's reader admits no stand-ins
        convert.load_torch(path)


def test_a_duo_config_sharing_one_container_many_times_is_refused_at_once(tmp_path, gpt2_files):
    """15 levels of 64 references to the level below (memo BINGETs): 64^15 paths, a few kB of pickle."""
    import struct
    import time
    import zipfile

    def text(t):
        return b"X" + struct.pack("<I", len(t)) + t.encode()

    pkl = bytearray(b"\x80\x02}(" + text("scratch") + b"}(" + text("l0") + b"}q\x00")  # level 0: {}, memo 0
    for level in range(1, 16):  # each level a value of the scratch dict, then memo `level`
        pkl += text(f"l{level}") + b"}("
        for i in range(64):
            pkl += text(f"k{i}") + b"h" + bytes([level - 1])  # BINGET level - 1
        pkl += b"uq" + bytes([level])  # SETITEMS, BINPUT level
    pkl += b"u" + text("state_dict") + b"}" + text("hyper_parameters") + b"}(" + text("config") + b"h\x0fu" + b"u."
    path = tmp_path / "duo.ckpt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("duo/data.pkl", pkl)
    start = time.perf_counter()
    with pytest.raises(convert.ConversionError, match="more than 65536 values"):
        convert.convert(path, tmp_path / "run", tokenizer_path=gpt2_files)
    assert time.perf_counter() - start < 30 and not (tmp_path / "run").exists()


def test_transformers_own_config_fields_are_ignored_with_a_note(tmp_path, capsys):
    """Issue 53: a folder saved by transformers >= 4.56 writes `dtype` (torch_dtype's new name): a note, not a refusal;
    a field of the model that is unknown is still refused."""
    for family in ("mdlm", "bd3lm"):
        config = {**peer_config(family), "dtype": "float32", "use_cache": True}
        (tmp_path / "config.json").write_text(json.dumps(config))
        read = convert.read_original_config(tmp_path / "config.json")
        assert "dtype" not in read and "use_cache" not in read and read["model_type"] == family
        assert "transformers' own config field(s) ['dtype', 'use_cache']" in capsys.readouterr().err
        convert.scheme_of(read)  # and the model's fields are read as before
    (tmp_path / "config.json").write_text(json.dumps({**peer_config("mdlm"), "hidden_size": 32}))
    with pytest.raises(convert.ConversionError, match=r"unknown field\(s\) \['hidden_size'\]"):
        convert.config_from_original(convert.read_original_config(tmp_path / "config.json"))
