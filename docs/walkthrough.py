# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The annotated SEDD: from the equations to `sedd`
#
# Score Entropy Discrete Diffusion (Lou, Meng & Ermon, ICML 2024,
# [arXiv 2310.16834](https://arxiv.org/abs/2310.16834)) learns a discrete
# distribution by estimating *ratios* $p_t(y) / p_t(x)$ of a noised version
# of the data, and samples by running the noise backwards. This walkthrough
# puts each equation of the paper above the `sedd` code that computes it, and
# runs it on Shakespeare, one character per token, on a CPU.
#
# It is a plain Python script in jupytext "percent" format: run it with
# `python docs/walkthrough.py`, or open it as a notebook
# (`jupytext --to notebook docs/walkthrough.py`). It imports `sedd` and never
# re-implements it, so it cannot drift from the library: CI runs it in a fast
# mode (`SEDD_WALKTHROUGH_FAST=1`, tiny sizes, figures to a temporary folder)
# on every change. Notation, derivations and our deviations from the original
# code are in [`docs/math.md`](math.md); [`docs/index.md`](index.md) maps every
# concept to its module and function.
#
# **Conventions.** The paper writes rate matrices by columns ($Q(y, x)$ is the
# rate from $x$ to $y$, $\frac{d p_t}{dt} = Q_t p_t$). The code writes them by
# rows: `Q[i, j]` is the rate from `i` to `j`, so the paper's $Q(y, x)$ is our
# `Q[x, y]`. `sigma` in the code is the paper's *total* noise $\bar\sigma(t)$;
# `dsigma` is the rate $\sigma(t) = d\bar\sigma / dt$. Losses are in nats.
#
# Environment variables:
#
# | variable | effect |
# |---|---|
# | `SEDD_WALKTHROUGH_FAST=1` | tiny model and few steps: the whole script runs in a few minutes on 2 CPU cores |
# | `SEDD_WALKTHROUGH_FIGURES` | folder for the PNG figures (default `docs/figures`; a temporary folder in fast mode) |
# | `SEDD_WALKTHROUGH_WORKDIR` | run directory of the training section (default: a new temporary folder); an existing run there is resumed |
# | `SEDD_DATA_DIR` | where the corpus and token caches are built (default `~/tensorflow_datasets`) |

# %%
import json
import math
import os
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: runs the same headless, in CI and in a notebook
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_collections
import numpy as np

from sedd import config as config_lib
from sedd import data as data_lib
from sedd import evaluate, graphs, kinds, losses, runs, sampling
from sedd import model as model_lib
from sedd import noise as noise_lib
from sedd import train as train_lib

START = time.perf_counter()
FAST = os.environ.get("SEDD_WALKTHROUGH_FAST", "") not in ("", "0")


def _default_figure_dir() -> Path:
    if FAST:  # CI must not dirty the tree
        return Path(tempfile.mkdtemp(prefix="sedd_walkthrough_figures_"))
    if "__file__" in globals():
        return Path(__file__).resolve().parent / "figures"
    cwd = Path.cwd()  # a notebook runs in docs/ or in the repository root
    return cwd / "figures" if cwd.name == "docs" else cwd / "docs" / "figures"


FIG_DIR = Path(os.environ.get("SEDD_WALKTHROUGH_FIGURES") or _default_figure_dir())
FIG_DIR.mkdir(parents=True, exist_ok=True)
WORKDIR = Path(os.environ.get("SEDD_WALKTHROUGH_WORKDIR") or tempfile.mkdtemp(prefix="sedd_walkthrough_run_"))


_LAP = [START]


def lap(section: str) -> None:
    """Print the wall time since the previous lap (where the minutes go)."""
    now = time.perf_counter()
    print(f"[time] {section}: {now - _LAP[0]:.1f} s")
    _LAP[0] = now


def save(fig, name: str) -> None:
    path = FIG_DIR / name
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"[figure] {path}")


print(f"fast mode: {FAST}; figures -> {FIG_DIR}; run directory -> {WORKDIR}")
print(f"jax {jax.__version__} on {jax.devices()[0].platform}")

# %% [markdown]
# ## 0. The data and the config
#
# The default corpus is the complete plays of Shakespeare, shipped inside the
# package (`sedd/data/corpus`, see `docs/data.md`) and tokenised one character per
# token (`sedd.data.CharTokenizer`). We start from the `tiny` config
# (`sedd/configs/tiny.py`) and override a few fields, exactly as
# `sedd train --config tiny --config.model.hidden_size=...` would.

# %%
if FAST:
    OVERRIDES = {
        "training.n_iters": 20,
        "training.log_every": 10,
        "training.eval_every": 20,
        "training.ckpt_every": 20,
        "training.eval_batches": 1,
        "training.eval_samples": 1,
        "sampling.steps": 8,
    }
else:
    OVERRIDES = {
        "model.hidden_size": 128,
        "model.n_layers": 3,
        "model.n_heads": 4,
        "model.cond_dim": 64,
        "data.seq_len": 64,
        "training.batch_size": 32,
        "training.n_iters": 1500,
        "training.log_every": 50,
        "training.eval_every": 1500,
        "training.ckpt_every": 1500,
        "training.eval_batches": 4,
        "training.eval_samples": 1,
        "optim.lr": 2e-3,
        "optim.warmup": 100,
        "sampling.steps": 64,
    }
config = config_lib.load_config("tiny", [f"--config.{k}={v}" for k, v in OVERRIDES.items()])

dataset = data_lib.load_dataset(config.data)
tok = dataset.tokenizer
V = tok.vocab_size  # characters + one EOS id
L = config.data.seq_len
val_tokens = np.asarray(dataset.tokens("validation"))
train_counts = np.bincount(np.asarray(dataset.tokens("train")), minlength=V)
print(
    f"vocabulary: {V} tokens ({V - 1} characters + EOS); "
    f"{dataset.num_tokens('train'):,} training tokens; sequence length L = {L}"
)
print(f"unigram entropy of the training text: {dataset.unigram_entropy_bits():.3f} bits/char")

# A fixed stretch of validation text to watch throughout.
head = tok.decode(val_tokens[:40_000])
start = max(head.find("JULIA.\nThen let"), 0)
x0 = jnp.asarray(val_tokens[start : start + L], jnp.int32)[None]  # (1, L)
GLYPHS = {V: "▒", tok.eos_id: "¶"}  # the absorbing graph's MASK (id V), end of document


def show(ids) -> str:
    """Token ids as one line of text: MASK as ▒, EOS as ¶, a newline as ⏎."""
    ids = np.asarray(ids).reshape(-1)
    text = "".join(GLYPHS.get(i) or tok.decode([i]) for i in ids.tolist())
    return text.replace("\n", "⏎")


print("x_0 =", show(x0))
lap("data")

# %% [markdown]
# ## 1. The forward process: noising text
#
# A continuous-time Markov chain on the $D$ states of one token, run
# independently at every position (Sec. 2 and 3.3 of Lou et al. 2024):
#
# $$\frac{d p_t}{dt} = Q_t\, p_t, \qquad Q_t = \sigma(t)\, Q, \qquad
#   p_{t|0}(\cdot \mid x_0) = \exp\big(\bar\sigma(t)\, Q\big)_{\cdot,\, x_0},
#   \qquad \bar\sigma(t) = \int_0^t \sigma(s)\, ds .$$
#
# Two choices of $Q$ (written here in the code's row convention, `Q[from, to]`):
#
# * **absorbing** (`sedd.graphs.Absorbing`): $D = V + 1$, every token jumps to
#   MASK at rate 1: $Q = \mathbf 1\, e_M^\top - I$ off the MASK row, which is 0. Closed form
#   $\exp(\bar\sigma Q)_{i,\cdot} = e^{-\bar\sigma} e_i + (1 - e^{-\bar\sigma}) e_M$.
# * **uniform** (`sedd.graphs.Uniform`): $D = V$, $Q = \mathbf 1 \mathbf 1^\top / N - I$,
#   and $\exp(\bar\sigma Q)_{i,\cdot} = e^{-\bar\sigma} e_i + (1 - e^{-\bar\sigma})\, \mathbf 1 / N$.
#
# Both closed forms are derived in `docs/math.md`; no $D \times D$ matrix is
# ever built. Here we check them once against a dense matrix exponential.

# %%
absorbing, uniform = graphs.Absorbing(V), graphs.Uniform(V)

for g in (graphs.Absorbing(4), graphs.Uniform(5)):
    states = jnp.arange(g.dim)
    q_dense = g.rate(states)  # (D, D): row i is Q[i, :]
    sigma = 0.7
    err = jnp.abs(jax.scipy.linalg.expm(sigma * q_dense) - g.transition(states, sigma)).max()
    print(
        f"{type(g).__name__}: rows of Q sum to {float(jnp.abs(q_dense.sum(1)).max()):.1e}; "
        f"max |expm(sigma Q) - transition| = {float(err):.1e}"
    )

# %% [markdown]
# Sampling $x_t \sim p_{t|0}(\cdot \mid x_0)$ is one uniform draw per position
# (`graph.sample_transition`): a token survives with probability
# $e^{-\bar\sigma}$ and otherwise becomes MASK (absorbing) or a uniformly drawn
# character (uniform). The same key gives nested masks as $\bar\sigma$ grows.

# %%
key = jax.random.key(0)
print(f"{'sigma':>6} {'keep':>5}  absorbing | uniform")
for sigma in (0.05, 0.2, 0.5, 1.0, 2.0, 5.0):
    s = jnp.full((1, 1), sigma)  # broadcasts against x0 (1, L)
    xa = absorbing.sample_transition(key, x0, s)
    xu = uniform.sample_transition(key, x0, s)
    print(f"{sigma:6.2f} {math.exp(-sigma):5.2f}  {show(xa)}")
    print(f"{'':12}  {show(xu)}")

# %% [markdown]
# The schedule $\bar\sigma(t)$ decides how fast this happens in $t \in [0, 1]$
# (`sedd.noise`). **LogLinear**, $\bar\sigma(t) = -\log(1 - (1 - \epsilon) t)$,
# makes the masked fraction $1 - e^{-\bar\sigma(t)} = (1 - \epsilon)t$ linear
# in $t$; **Geometric**, $\bar\sigma(t) = \sigma_{\min}^{1-t} \sigma_{\max}^t$,
# is SEDD's choice for the uniform graph. A schedule is called as
# `noise(t) -> (sigma_bar(t), dsigma_bar/dt)`.

# %%
loglinear, geometric = noise_lib.LogLinear(1e-3), noise_lib.Geometric(1e-4, 20.0)
ts = jnp.linspace(0.0, 1.0, 201)
fig, axes = plt.subplots(1, 3, figsize=(13, 3.4))
for sched, name in ((loglinear, "LogLinear(1e-3)"), (geometric, "Geometric(1e-4, 20)")):
    sig, dsig = sched(ts)
    axes[0].semilogy(ts, sig, label=name)
    axes[1].plot(ts, jnp.exp(-sig), label=name)
axes[0].set(xlabel="t", ylabel=r"$\bar\sigma(t)$", title="total noise")
axes[1].set(xlabel="t", ylabel=r"$e^{-\bar\sigma(t)}$", title="probability a token is untouched")
axes[0].legend(), axes[1].legend()
# One row per t: which positions of x_0 are masked (absorbing, LogLinear), with a shared key.
grid_t = jnp.linspace(0.0, 1.0, 40)
sig_grid, _ = loglinear(grid_t)
masked = jax.vmap(lambda s: absorbing.sample_transition(key, x0[0], s) == absorbing.mask)(sig_grid)
axes[2].imshow(np.asarray(masked), aspect="auto", cmap="Greys", extent=(0, L, 1, 0))
axes[2].set(xlabel="position", ylabel="t", title="absorbing: masked positions (black)")
save(fig, "forward_process.png")
lap("forward process")

# %% [markdown]
# ## 2. Concrete scores: the ratios the model learns
#
# Continuous diffusion learns $\nabla_x \log p_t$. Its discrete analogue is the
# **concrete score**, the vector of ratios to every neighbour $y$ of $x$
# (one changed position):
#
# $$ s(x)_y = \frac{p_t(y)}{p_t(x)} . $$
#
# It is all the reverse process needs: the time reversal of the forward chain
# has rates (Eq. (3) of the paper, in its column convention)
#
# $$ \bar Q_t(y, x) = \frac{p_t(y)}{p_t(x)}\, Q_t(x, y), $$
#
# which in code is `graph.reverse_rate(x, score)`: `Qbar[x, y] = Q[y, x] * s_y`
# off the diagonal.
#
# For one position whose clean law is the unigram distribution $\pi$ of the
# corpus, the ratios are exact and cheap: $p_t = \pi^\top \exp(\bar\sigma Q)$.
# At a MASK the absorbing graph gives
# $s(M)_y = \frac{e^{-\bar\sigma}\pi(y)}{1 - e^{-\bar\sigma}} = \frac{\pi(y)}{e^{\bar\sigma} - 1}$:
# the clean distribution, scaled by how likely a mask is. Their sum
# $1 / (e^{\bar\sigma} - 1)$ does not depend on the data, which the DDiT
# builds in (Section 4).

# %%
pi = (train_counts + 1.0) / (train_counts + 1.0).sum()  # smoothed unigram law, (V,)


def exact_unigram_log_score(graph):
    """The exact log-ratios of the i.i.d. unigram law: score_fn(x (B, L), sigma (B,)) -> (B, L, D)."""
    p0 = jnp.zeros(graph.dim).at[:V].set(pi)

    def score_fn(x, sigma):
        trans = graph.transition(jnp.arange(graph.dim)[None, :], sigma[:, None])  # (B, D, D)
        log_pt = jnp.log(jnp.einsum("d,bde->be", p0, trans))  # (B, D)
        return log_pt[:, None, :] - jnp.take_along_axis(log_pt, x, axis=1)[..., None]  # (B, L, D)

    return score_fn


exact_absorbing = exact_unigram_log_score(absorbing)
sigma = 0.5
s_mask = jnp.exp(exact_absorbing(jnp.full((1, 1), absorbing.mask), jnp.array([sigma])))[0, 0]  # (D,)
top = np.argsort(-np.asarray(s_mask[:V]))[:6]
print(
    f"at a MASK, sigma_bar = {sigma}: largest ratios "
    + ", ".join(f"{tok.decode([i])!r}: {float(s_mask[i]):.4f}" for i in top)
)
print(f"  closed form pi(y)/(e^sigma - 1) for {tok.decode([top[0]])!r}: {pi[top[0]] / math.expm1(sigma):.4f}")
print(f"  sum over tokens {float(s_mask[:V].sum()):.4f} = 1/(e^sigma - 1) = {1 / math.expm1(sigma):.4f}")
rate_out = absorbing.reverse_rate(jnp.array(absorbing.mask), s_mask)
print(
    f"  reverse_rate out of MASK: diagonal {float(rate_out[absorbing.mask]):.4f} "
    f"(minus the total rate of unmasking, per unit of dsigma)"
)
lap("concrete scores")

# %% [markdown]
# ## 3. Score entropy: the loss, and why it is a likelihood bound
#
# Squared error is a poor loss for positive ratios. SEDD's **score entropy**
# (Definition 3.1) compares a model $s_\theta$ with the true ratios
# $r_y = p(y)/p(x)$ through a Bregman divergence of $-\log$:
#
# $$ \mathcal L_{SE} = \mathbb E_{x \sim p} \sum_{y \ne x} w_{xy}
#   \Big( s_\theta(x)_y - r_y \log s_\theta(x)_y + K(r_y) \Big),
#   \qquad K(a) = a(\log a - 1). $$
#
# Each term is $\ge 0$, convex in $\log s$, and $0$ exactly at $s = r$.
# `sedd` writes it as $r\,(e^u - 1 - u)$ with $u = \log s - \log r$, which has
# no cancellation in float32 (`graphs._entropy_term`; see `docs/math.md`).
#
# The true $p_t$ ratios are unknown, but the **denoising** form (Thm. 3.4)
# replaces them by ratios of the known conditional $p_{t|0}$ and differs from
# $\mathcal L_{SE}$ by a constant, so it has the same minimiser:
#
# $$ \mathcal L_{DSE} = \mathbb E_{x_0}\mathbb E_{x_t \sim p_{t|0}(\cdot|x_0)}
#    \sum_{y \ne x_t} Q_t(x_t, y)\Big( s_\theta(x_t)_y
#    - \tfrac{p_{t|0}(y|x_0)}{p_{t|0}(x_t|x_0)} \log s_\theta(x_t)_y
#    + K\big(\tfrac{p_{t|0}(y|x_0)}{p_{t|0}(x_t|x_0)}\big)\Big). $$
#
# `graph.score_entropy(log_score, sigma, x_t, x0)` is the bracket summed over
# $y$ at one position, with $r$ in closed form. For the absorbing graph only a
# masked position contributes, and there $r_{x_0} = 1/(e^{\bar\sigma}-1)$ and
# $r_y = 0$ otherwise. We use exactly that to draw the scalar function
# $s \mapsto s - r\log s + K(r)$ from the library call.

# %%
fig, ax = plt.subplots(figsize=(5.5, 3.6))
log_s = jnp.linspace(-4.0, 3.0, 300)
x_tok = int(top[0])  # the clean token x_0
for r in (0.25, 1.0, 4.0):
    sig_r = math.log1p(1.0 / r)  # the sigma_bar at which r_{x0} = r
    # Log-scores: log_s at x_0, -60 (ratio ~0) at every other token, 0 at MASK.
    ls = jnp.full((log_s.shape[0], absorbing.dim), -60.0).at[:, x_tok].set(log_s).at[:, absorbing.mask].set(0.0)
    se = absorbing.score_entropy(
        ls,
        jnp.full((log_s.shape[0],), sig_r),
        jnp.full((log_s.shape[0],), absorbing.mask),
        jnp.full((log_s.shape[0],), x_tok),
    )
    ax.plot(jnp.exp(log_s), se, label=f"r = {r}")
    print(f"r = {r}: min over the grid {float(se.min()):.2e} at s = {float(jnp.exp(log_s[se.argmin()])):.3f}")
ax.set(
    xscale="log",
    xlabel="model ratio s",
    ylabel="score entropy (nats)",
    title=r"$s - r\log s + K(r)$: 0 exactly at $s = r$",
)
ax.legend()
save(fig, "score_entropy.png")

# %% [markdown]
# **Why it is a bound (Thm. 3.6).** Integrated over time, the denoising score
# entropy bounds the negative log-likelihood of the model's reverse process:
#
# $$ -\log p^\theta_0(x_0) \le \int_0^1 \mathbb E_{x_t \sim p_{t|0}(\cdot|x_0)}
#    \sum_{\ell=1}^{L} \sigma(t)\, \mathrm{SE}_\ell\big(s_\theta(x_t, \bar\sigma(t))\big)\, dt
#    + D_{KL}\big(p_{1|0}(\cdot|x_0) \,\|\, p_{\text{base}}\big). $$
#
# (The proof compares the path measures of the true and model reverse chains:
# the integrand is their KL rate, so the bound is tight when $s_\theta$ is the
# true score.) Training draws $t \sim U[\epsilon, 1]$ and $x_t$ once per
# sequence: `sedd.losses.loss_fn` is an unbiased one-sample estimate of the
# integral, in **nats per sequence**.
#
# We can see the tightness on the one-position unigram law with its exact
# score: averaged over $x_0 \sim \pi$, the bound should equal the entropy
# $H(\pi)$ (plus the tiny prior term), up to Monte Carlo error.

# %%
n_t = 64 if FAST else 256
t_mid = (jnp.arange(n_t) + 0.5) / n_t  # midpoint rule on [0, 1]
x0_all = jnp.arange(V, dtype=jnp.int32)[:, None]  # every clean token, (V, 1)


@jax.jit
def unigram_bound(key):
    def at_t(k, t):  # sigma(t) * SE at time t for every x0: (V,)
        return losses.loss_fn(k, exact_absorbing, absorbing, loglinear, x0_all, t=jnp.full((V,), t))

    keys = jax.random.split(key, n_t)
    return jax.vmap(at_t)(keys, t_mid).mean(0)  # (V,) integral over t


n_rep = 4 if FAST else 16
reps = np.stack([np.asarray(unigram_bound(k)) @ pi for k in jax.random.split(jax.random.key(1), n_rep)])
prior = -math.log1p(-math.exp(-float(loglinear(1.0)[0])))  # KL(p_{1|0} || all-MASK) = -log P(masked at t=1)
entropy = float(-(pi * np.log(pi)).sum())
print(
    f"E_pi[DSE bound] = {reps.mean() + prior:.4f} +- {reps.std(ddof=1) / math.sqrt(n_rep):.4f} nats "
    f"vs H(pi) = {entropy:.4f} nats (prior term {prior:.1e}; {n_t} times x {n_rep} repetitions)"
)
lap("score entropy")

# %% [markdown]
# ## 4. The network: DDiT
#
# The score network is a diffusion transformer (`sedd.model.DDiT`, App. C):
# a bidirectional transformer with rotary positions whose LayerNorms are
# modulated by the noise level (adaLN-Zero of DiT, Peebles & Xie 2023):
#
# $$ h \leftarrow h + g_a(c) \odot \mathrm{Attn}\big(\mathrm{LN}(h)(1 + a(c)) + b(c)\big),
#    \qquad c = \mathrm{MLP}(\text{sinusoid}(\bar\sigma)), $$
#
# and the same for the MLP branch. It outputs a log-score $\log s_\theta(x_t, \bar\sigma)$ of
# shape `(B, L, D)`, set to 0 at the current token (the ratio of a state to
# itself). For the absorbing graph SEDD adds the exact total mass at a mask
# ("scale by sigma"):
#
# $$ \log s_\theta(x)_{\ell, y} = \mathrm{out}_{\ell, y} - \log(e^{\bar\sigma} - 1) - \log(D - 1), $$
#
# so with its zero-initialised output layer a fresh network already has
# $\sum_{y} s_y = 1/(e^{\bar\sigma}-1)$ at every mask and only learns how to
# share that mass among tokens.

# %%
cfg = ml_collections.ConfigDict(config.to_dict())
cfg.vocab_size = V  # train() sets this from the tokenizer; build_model reads it
model = kinds.build_model(cfg)
print(
    f"DDiT: {cfg.model.n_layers} blocks, width {cfg.model.hidden_size}, {cfg.model.n_heads} heads; "
    f"{model_lib.param_count(model):,} parameters"
)
x_t = absorbing.sample_transition(jax.random.key(2), x0, jnp.full((1, 1), 1.0))  # (1, L)
log_score = model(x_t, jnp.array([1.0]))  # (B, L, D)
pos = int(jnp.argmax(x_t[0] == absorbing.mask))
print(
    f"log_score shape {log_score.shape}; at a masked position sum_y s_y = "
    f"{float(jnp.exp(log_score[0, pos, :V]).sum()):.4f}, 1/(e^1 - 1) = {1 / math.expm1(1.0):.4f}; "
    f"entry at the current token {float(log_score[0, pos, absorbing.mask])}"
)
lap("DDiT")

# %% [markdown]
# ## 5. Training a tiny model on the CPU
#
# `sedd.train.train(config, workdir)` is the whole loop: $t \sim U[\epsilon, 1]$,
# $x_t \sim p_{t|0}$, the DSE loss weighted by $\sigma(t)$ and summed over
# positions, AdamW with warmup and clipping, an EMA of the weights (used for
# evaluation and sampling, as in SEDD), and orbax checkpoints. It logs to
# `metrics.jsonl`, in nats and bits per token and bits per character. The
# same run from the command line is
# `sedd train --config tiny --config.model.hidden_size=128 ...`.

# %%
t0 = time.perf_counter()
result = train_lib.train(config, WORKDIR, quiet=FAST)
train_seconds = time.perf_counter() - t0
rows = [json.loads(line) for line in (WORKDIR / "metrics.jsonl").read_text().splitlines()]
print(
    f"trained {result['step']} steps in {train_seconds:.0f} s; validation bound "
    f"{result['bound']['bits_per_char']:.3f} bits/char (the unigram entropy is "
    f"{result['unigram_entropy_bits']:.3f} bits/token)"
)
print("sample at the end of training:", repr(result["samples"][0]))

fig, ax = plt.subplots(figsize=(5.5, 3.6))
ax.plot([r["step"] for r in rows], [r["loss_bits_per_char"] for r in rows], label="train (one draw of t)")
ax.axhline(result["unigram_entropy_bits"], color="grey", ls="--", label="unigram entropy")
ax.set(xlabel="step", ylabel="DSE loss (bits / char)", title="training")
ax.legend()
save(fig, "training.png")

run = runs.load(WORKDIR)  # the EMA weights of the last checkpoint; no optimizer is built
# One score function object and the weights as traced arguments: every call below reuses one compilation.
score_fn, params, graph, sched = kinds.params_score_fn(run.graphdef), (run.params, run.rest), run.graph, run.noise
lap("training")

# %% [markdown]
# ## 6. Sampling: running the noise backwards
#
# Start from the limit law (all MASK) and step $t \to t - \Delta t$ on a grid
# from 1 to $\epsilon$ (Sec. 4). Two samplers, registered by name in
# `sedd.sampling.SAMPLERS`:
#
# **Euler / tau-leaping** with the learned reverse rate (our row convention):
#
# $$ p(x_\ell \to y) = \delta_{x_\ell y} + \Delta t\, \sigma(t)\, Q(y, x_\ell)\, s_\theta(x_t, \bar\sigma(t))_{\ell, y} \quad (y \ne x_\ell). $$
#
# **Analytic / Tweedie tau-leaping** (Thm. 4.2): with
# $\Delta\sigma = \bar\sigma(t) - \bar\sigma(t - \Delta t)$,
#
# $$ p(x_\ell \to y) \propto \big[\exp(-\Delta\sigma Q)^\top s_\theta\big]_y \, \exp(\Delta\sigma Q)_{y,\, x_\ell}, $$
#
# the exact one-position reverse transition when $s_\theta$ is exact
# (`graph.staggered_score(s, dsigma) * graph.transp_transition(x, dsigma)`).
# A final "denoise" step removes the noise left at $\epsilon$ and fills every
# remaining mask. `sedd.sampling.sample` compiles the whole loop once
# (`jax.lax.fori_loop`).

# %%
steps = config.sampling.steps
n_show = 2 if FAST else 3
for name in ("analytic", "euler"):  # the two of the paper; docs/sampling.md has the others
    ids = sampling.sample(
        jax.random.key(3), score_fn, graph, sched, (n_show, L), steps, sampler=name, score_params=params
    ).tokens
    print(f"--- sampler {name!r}, {steps} steps")
    for row in np.asarray(ids):
        print("   ", show(row))
lap("sampling with the trained model")

# %% [markdown]
# With the absorbing graph and the log-linear schedule the two samplers
# coincide: at a mask both give token $y$ the weight
# $(e^{\Delta\sigma} - 1)\, s_y = \Delta t\, \sigma(t)\, s_y$, and a token never
# moves, so with one key they draw the same text (`docs/sampling.md`). They
# differ for the uniform graph. Here they are with the **exact** score of the
# unigram law, on the uniform graph with the geometric schedule: the
# total-variation distance between the sampled and the true character
# frequencies, as the number of steps grows.

# %%
exact_uniform = exact_unigram_log_score(uniform)
step_grid = (2, 16) if FAST else (1, 2, 4, 8, 16, 32, 64)
n_seq = 64 if FAST else 256
tv = {name: [] for name in ("analytic", "euler")}  # the others are for the absorbing graph
for name in tv:
    for n in step_grid:
        ids = sampling.sample(jax.random.key(4), exact_uniform, uniform, geometric, (n_seq, 32), n, sampler=name).tokens
        freq = np.bincount(np.asarray(ids).reshape(-1), minlength=V) / ids.size
        tv[name].append(0.5 * np.abs(freq - pi).sum())
    print(f"{name:>9}: TV to the unigram law " + "  ".join(f"{n} steps {d:.3f}" for n, d in zip(step_grid, tv[name])))
floor = np.mean(
    [
        0.5
        * np.abs(
            np.bincount(np.random.default_rng(i).choice(V, n_seq * 32, p=pi), minlength=V) / (n_seq * 32) - pi
        ).sum()
        for i in range(8)
    ]
)
fig, ax = plt.subplots(figsize=(5.5, 3.6))
for name, d in tv.items():
    ax.plot(step_grid, d, "o-", label=name)
ax.axhline(floor, color="grey", ls="--", label="exact samples (noise floor)")
ax.set(xscale="log", xlabel="steps", ylabel="TV distance", title="uniform graph, exact score")
ax.legend()
save(fig, "samplers.png")
lap("samplers with the exact score")

# %% [markdown]
# **Watching the denoising.** `sample(..., return_trajectory=True)` also
# keeps the state after every `trajectory_every` steps (`.trajectory`): masks are filled a
# few at a time, in no particular order, and the text is decided everywhere at
# once rather than left to right.

# %%
every = max(steps // 8, 1)
drawn = sampling.sample(
    jax.random.key(5),
    score_fn,
    graph,
    sched,
    (1, L),
    steps,
    score_params=params,
    return_trajectory=True,
    trajectory_every=every,
)
traj = np.asarray(drawn.trajectory)[:, 0]  # (S, L)
for i, row in enumerate(traj):
    print(f"step {i * every:4d}: {show(row)}")
print(f"denoised : {show(drawn.tokens[0])}")
fig, axes = plt.subplots(1, 2, figsize=(11, 3.4))
axes[0].imshow(traj == absorbing.mask, aspect="auto", cmap="Greys", extent=(0, L, steps, 0))
axes[0].set(xlabel="position", ylabel="step", title="still masked (black)")
axes[1].plot(np.arange(len(traj)) * every, (traj == absorbing.mask).mean(1), "o-")
axes[1].set(xlabel="step", ylabel="masked fraction", title="denoising")
save(fig, "denoising.png")
lap("trajectory")

# %% [markdown]
# ## 7. Conditioning and infilling
#
# Any set of positions can be given: `fixed_mask` marks them and `fixed_tokens`
# holds their tokens, overwritten after every step and after the denoise. For
# the absorbing graph this is exact conditioning, because a clamped token is a
# clean token and the score reads it as one: the free positions are drawn from
# $p_\theta(x_{\text{free}} \mid x_{\text{fixed}})$ (Sec. 4.2, "arbitrary prompting").
# For the uniform graph it is only an approximation (see `sedd/sampling/loop.py`).
# Here the first and last quarters come from the validation text and the
# model fills the middle.

# %%
quarter = L // 4
fixed_mask = np.zeros((n_show, L), bool)
fixed_mask[:, :quarter] = True
fixed_mask[:, -quarter:] = True
fixed_tokens = np.repeat(np.asarray(x0), n_show, axis=0)
infilled = sampling.sample(
    jax.random.key(6),
    score_fn,
    graph,
    sched,
    (n_show, L),
    steps,
    fixed_mask=fixed_mask,
    fixed_tokens=fixed_tokens,
    score_params=params,
).tokens
infilled = np.asarray(infilled)
assert (infilled[fixed_mask] == fixed_tokens[fixed_mask]).all()
print("original:", show(x0[0, :quarter]) + "[" + show(x0[0, quarter:-quarter]) + "]" + show(x0[0, -quarter:]))
for row in infilled:
    print("infilled:", show(row[:quarter]) + "[" + show(row[quarter:-quarter]) + "]" + show(row[-quarter:]))
lap("infilling")

# %% [markdown]
# ## 8. The likelihood bound on held-out text
#
# Section 3 gave the bound; with the trained network it bounds the model's
# negative log-likelihood of validation text. The integral over $t$ is
# estimated on a grid of times, each with a fresh $x_t$, and the prior term
# $D_{KL}(p_{1|0}(\cdot|x_0) \| p_{\text{base}})$ is `sedd.evaluate.prior_kl`.
# Dividing by $L$ gives nats per character, and $e^{\text{nats/char}}$ bounds
# the perplexity. First spelled out with `sedd.losses.loss_fn` at fixed
# times, then with `sedd.evaluate.likelihood_bound`, which stratifies the grid
# and reports a standard error. The integrand also shows *where* in $t$ the
# bits are paid.

# %%
n_t = 8 if FAST else 64
n_batch = 4 if FAST else 32
batch = jnp.asarray(next(iter(dataset.eval_batches(n_batch))))  # (B, L)
t_grid = (jnp.arange(n_t) + 0.5) / n_t  # midpoints of n_t strata of [0, 1]


@jax.jit
def integrand(params, key, t):  # sigma(t) * sum_l SE_l at time t: (B,) nats per sequence
    fn = lambda x, s: score_fn(params, x, s)  # noqa: E731
    return losses.loss_fn(key, fn, graph, sched, batch, t=jnp.full((batch.shape[0],), t))


values = jnp.stack(
    [integrand(params, jax.random.fold_in(jax.random.key(7), i), t) for i, t in enumerate(t_grid)]
)  # (n_t, B)
nats_per_seq = float(values.mean() + evaluate.prior_kl(graph, sched, batch).mean())
u = losses.units(nats_per_seq / L, chars_per_token=dataset.chars_per_token)
print(
    f"by hand: {nats_per_seq:.1f} nats/sequence = {u['nats_per_token']:.3f} nats/char = "
    f"{u['bits_per_char']:.3f} bits/char; perplexity <= {u['ppl_bound']:.2f} ({n_t} times x {n_batch} sequences)"
)

n_rep = 2 if FAST else 4
bound, stderr = evaluate.likelihood_bound_with_stderr(
    jax.random.key(8), score_fn, graph, sched, batch, num_t=n_t, num_samples=n_rep, score_params=params
)  # (B,), (B,)
ul = losses.units(float(bound.mean()) / L, chars_per_token=dataset.chars_per_token)
se = float(jnp.sqrt((stderr**2).sum())) / bound.shape[0]  # of the batch mean
print(
    f"sedd.evaluate.likelihood_bound: {float(bound.mean()):.1f} +- {se:.1f} nats/sequence = "
    f"{ul['bits_per_char']:.3f} bits/char; perplexity <= {ul['ppl_bound']:.2f} "
    f"(unigram entropy {dataset.unigram_entropy_bits():.3f} bits/char)"
)

fig, ax = plt.subplots(figsize=(5.5, 3.6))
ax.plot(t_grid, values.mean(1) / L, "o-")
ax.set(xlabel="t", ylabel="nats / char", title=r"integrand $\sigma(t)\,\mathbb{E}\sum_\ell \mathrm{SE}_\ell\,/\,L$")
save(fig, "likelihood_integrand.png")
lap("likelihood bound")

# %% [markdown]
# ## Where next
#
# * `docs/math.md`: notation, the closed forms and the analytic sampler
#   derived, the bound, and where `sedd` deviates from the original code.
# * `docs/index.md`: each concept of the paper and the function that computes it.
# * `sedd/configs/`: the shipped configs; `sedd train --config shakespeare_char`
#   trains the default model in about ten minutes on two cores.

# %%
print(f"walkthrough finished in {time.perf_counter() - START:.0f} s (fast mode: {FAST})")
