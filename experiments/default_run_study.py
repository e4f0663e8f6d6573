"""Which setting of the default run learns most per minute? A study against an AR baseline of the same size.

Each candidate (a list of config overrides of the default config,
``shakespeare_char``) is trained with `sedd train` for the same number of
steps on each corpus, beside the autoregressive baseline of the same size; the
step costs are close, so the same steps is about the same minutes, and the
measured minutes are reported. The corpora:

  plays    the default corpus (the bundled plays), no data overrides;
  markov   text of a known law: 2,000 lines of 200 letters a-l drawn from
           ``sedd.data.markov.MarkovChain(vocab_size=12, order=2, seed=s,
           alpha=0.25)``, one corpus per seed s of --markov-seeds, trained
           with data.documents=lines. The bound is set beside the chain's
           entropy rate, 64 samples of each model are scored exactly
           under the chain, and `reveal_profile` says where their excess
           NLL is paid.

Per run, OUT/<corpus>/<candidate>/ holds the run directory, train.log and
study.json (the bound as `sedd eval` computes it, the curve of the training
loop's validation estimates against minutes, and the samples' exact NLL on
markov). A run whose study.json exists is skipped, so a study can be resumed
or extended with more candidates or seeds (a run folder copied in from another
study counts if its config is the candidate's); an unfinished one is trained
again from scratch, so that its minutes are one process's. OUT/study.md holds a
table per corpus, OUT/study.png a panel per corpus.

The figures of the docs:

  python experiments/default_run_study.py --corpus both --markov-seeds 0,1,2 --candidates default,adamw,ar

At the default steps (the config's training.n_iters) a run takes about 10
minutes on 2 CPU cores: 3 candidates x 4 corpora is about 2 hours.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

if not __package__:  # run as a file: import experiments/ by its location (experiments/__init__.py says why)
    import importlib.util

    _spec = importlib.util.spec_from_file_location("experiments", Path(__file__).resolve().parent / "__init__.py")
    if "experiments" not in sys.modules:
        sys.modules["experiments"] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules["experiments"])

from experiments.quality import (
    LETTERS,
    markov_chain,
    texts_nll,
    unigram_entropy_nats,  # noqa: E402
    write_markov_corpus,
)
from sedd import config as config_lib  # noqa: E402
from sedd import figures, kinds, runs  # noqa: E402
from sedd.data.markov import MarkovChain  # noqa: E402
from sedd.kinds.capabilities import Diffuses, Exact  # noqa: E402

SCORE = ["--config.model.normalize=False", "--config.training.n_iters=2000"]  # the default before SUBS
PREVIOUS = [*SCORE, "--config.optim.optimizer=adamw", "--config.model.n_heads=4", "--config.training.ema=0.995"]
CANDIDATES = {
    "default": [],  # the shipped default (SUBS, Muon x 4, 8 heads, EMA 0.98, adaln_lr_scale 0.1, t_power 0.5, EB sampler)
    "score": SCORE,  # the default before SUBS: SEDD's unnormalized score output, 2,000 steps
    "adamw": PREVIOUS,  # the default before optim.optimizer: AdamW everywhere, 4 heads, EMA 0.995
    "uniform_t": [*PREVIOUS, "--config.training.t_power=0.0"],  # and SEDD's uniform t
    "sedd_adamw": [
        *PREVIOUS,
        "--config.optim.adaln_lr_scale=1.0",
        "--config.training.t_power=0.0",
    ],  # the original's AdamW and t
    "analytic": ["--config.sampling.sampler=analytic"],  # the default's training, SEDD's Tweedie sampler
    "radd": ["--config.model.time_conditioning=False"],  # RADD's time-independent network
    "ar": ["--config.model.kind=ar"],  # the causal baseline of the same size
    # block diffusion (docs/block_diffusion.md): SEDD inside blocks of b letters, AR across them
    "block16": ["--config.model.kind=block", "--config.model.block_size=16"],
    "block4": ["--config.model.kind=block", "--config.model.block_size=4"],
    "block1": ["--config.model.kind=block", "--config.model.block_size=1"],
}
CORPORA = ("plays", "markov")
NUM_SAMPLES = 64  # samples scored under the chain
LN2 = math.log(2)


# --------------------------------------------------------------------------- corpora


def corpora(which: str, seeds: list[int], lines: int, out: Path) -> dict[str, tuple[list[str], int | None]]:
    """Corpus name -> (its data overrides, the seed of its chain or None), writing the markov texts."""
    if which not in (*CORPORA, "both"):
        raise ValueError(f"unknown corpus {which!r}; choose one of {', '.join(CORPORA)} or both")
    found = {}
    if which in ("plays", "both"):
        found["plays"] = ([], None)
    if which in ("markov", "both"):
        for s in seeds:
            path = write_markov_corpus(s, lines, out.resolve() / f"markov_seed{s}.txt")
            found[f"markov_seed{s}"] = ([f"--config.data.path={path}", "--config.data.documents=lines"], s)
    return found


# --------------------------------------------------------------------------- one run


def train(workdir: Path, overrides: list[str]) -> float:
    """`sedd train --workdir WORKDIR OVERRIDES` in a subprocess, its output in train.log; wall minutes.

    Raises:
      RuntimeError: the training failed (the end of its log is in the message).
    """
    if workdir.exists():  # unfinished: start again, so that the minutes are one process's
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    args = ["train", "--workdir", str(workdir), *overrides]
    log = workdir / "train.log"
    start = time.perf_counter()
    with log.open("w") as f:
        f.write("sedd " + " ".join(args) + "\n")
        f.flush()
        code = subprocess.call(
            [sys.executable, "-c", "import sys, sedd.cli; sys.exit(sedd.cli.main())", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    minutes = (time.perf_counter() - start) / 60
    if code:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise RuntimeError(f"sedd train failed (exit {code}); the end of {log}:\n{tail}")
    return minutes


def curve(workdir: Path) -> list[tuple[float, float]]:
    """(minutes into the training loop, validation estimate in bits/char) at each evaluation of metrics.jsonl."""
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["elapsed_s"] / 60, r["val_estimate_bits_per_char"]) for r in rows if "val_estimate_bits_per_char" in r]


def sample_nll(run: runs.Run, chain: MarkovChain, sampler: str | None = None) -> tuple[float, float, float]:
    """Exact NLL of the run's samples under the chain, nats/char, its standard error, and the share scored.

    The NUM_SAMPLES samples are drawn by `sampler` (default: the run's
    config.sampling.sampler) with the run's steps and scored by ``texts_nll``.
    """
    sampler = sampler if isinstance(run.kind, Diffuses) else None  # a kind that writes left to right takes no sampler
    return texts_nll(run.generate(jax.random.key(0), NUM_SAMPLES, sampler=sampler), chain)


def any_order_denoiser(run: runs.Run) -> bool:
    """Whether the run's network denoises any masked position given all the others (``run.score_fn``).

    A kind that diffuses and takes infill prompts (SEDD's whole-sequence
    denoiser, not a block model, which sees only the blocks before), on the
    absorbing graph (masks to reveal).
    """
    return isinstance(run.kind, Diffuses) and "infill" in run.kind.conditions and run.graph.absorb


def kind_facts(workdir: Path) -> dict:
    """What the kind of the run in `workdir` is, for the report: its "label", whether its figure is "exact"
    (an NLL, not a bound) and whether it "diffuses" (samples by a sampler's steps)."""
    kind = kinds.get(runs.read_config(workdir))
    return {"label": kind.label, "exact": isinstance(kind, Exact), "diffuses": isinstance(kind, Diffuses)}


def reveal_profile(
    run: runs.Run,
    chain: MarkovChain,
    num_samples: int = NUM_SAMPLES,
    bins: int = 8,
    seed: int = 0,
    order: str = "random",
) -> dict:
    r"""Where a sample's excess NLL is paid: the model's draw one letter a step, each beside the chain's exact law.

    The absorbing reverse process unmasks one position at a time, in a uniformly
    random order (order="random"; with the exact score, every sampler of the
    registry draws from it); order="surest" unmasks the masked position whose
    denoiser has the least entropy (the EB-sampler's order, `entropy_bound`,
    one position a step, without its 0.01-nat rounding of near-ties). This draws num_samples windows of the run's length
    that way, letters only: at the k-th step (k letters revealed, masked
    fraction m = 1 - k/L, the network read at sigma_bar(t = m)) one masked
    position takes a letter from the network's denoiser q (softmax of its
    token scores over the letters a-l), set beside the chain's exact law p of
    that position given the revealed letters (``MarkovChain.posteriors``).
    Either order is a function of the letters revealed so far, so both the
    chain's law and the sampler's own law Q factor over the steps:

        E_Q[-log p(x)] = \sum_k E[CE(q_k, p_k)],   CE(q, p) = H(q) + KL(q || p),
        H(Q) = \sum_k E[H(q_k)],                  KL(Q || P) = \sum_k E[KL(q_k || p_k)].

    The mean of CE over the steps is the samples' NLL per letter with the draw
    of each letter averaged out (``nll``, nats/char); ``entropy`` and ``kl``
    split it into the samples' own entropy and their divergence from the
    chain's law, per letter, so an order that lowered the NLL by lowering the
    samples' diversity would show it in ``entropy`` (below the rate) and not
    in ``kl``. CE - H(p) in each bin of the revealed fraction k/L says at
    which stage of the denoising the excess over the chain's own uncertainty
    is paid. The absorbing graph only.

    Returns:
      {"nll", "entropy", "kl", "excess", "kl_qp", "kl_pq", "tail_mass"} (the
      last four lists of `bins` means, nats; tail_mass: q's mass on letters p
      gives < 1e-3), or {} for an AR, block or uniform run.
    """
    if order not in ("random", "surest"):
        raise ValueError(f"order must be 'random' or 'surest', got {order!r}")
    if not any_order_denoiser(run):
        return {}
    v, length, b = chain.vocab_size, run.seq_len, num_samples
    letters = np.asarray([run.tokenizer.encode(c)[0] for c in LETTERS[:v]])
    score = jax.jit(run.score_fn)
    rng = np.random.default_rng(seed)
    x = np.full((b, length), -1)
    sums = {name: np.zeros(bins) for name in ("excess", "kl_qp", "kl_pq", "tail_mass")}
    counts, total, own, kl = np.zeros(bins), np.zeros(b), np.zeros(b), np.zeros(b)
    rows = np.arange(b)
    for k in range(length):
        sigma = run.noise(jax.numpy.full((b,), 1 - k / length))[0]
        tokens = np.where(x < 0, run.graph.mask, letters[np.maximum(x, 0)])
        log_s = np.asarray(score(jax.numpy.asarray(tokens, jax.numpy.int32), sigma))[..., letters]  # (B, L, V)
        q_all = np.exp(log_s - log_s.max(-1, keepdims=True))
        q_all /= q_all.sum(-1, keepdims=True)
        if order == "random":
            pos = np.array([rng.choice(np.flatnonzero(row < 0)) for row in x])  # (B,) one masked position each
        else:
            h_all = -(q_all * np.log(np.maximum(q_all, 1e-300))).sum(-1)
            pos = np.where(x < 0, h_all, np.inf).argmin(-1)
        q = q_all[rows, pos]  # (B, V)
        p = chain.posteriors(x)[rows, pos]  # (B, V)
        log_p, log_q = np.log(np.maximum(p, 1e-300)), np.log(np.maximum(q, 1e-300))
        ce, h_p = -(q * log_p).sum(-1), -(p * log_p).sum(-1)
        i = min(k * bins // length, bins - 1)
        for name, value in (
            ("excess", ce - h_p),
            ("kl_qp", ce + (q * log_q).sum(-1)),
            ("kl_pq", (p * (log_p - log_q)).sum(-1)),
            ("tail_mass", (q * (p < 1e-3)).sum(-1)),
        ):
            sums[name][i] += value.sum()
        counts[i] += b
        total += ce
        own -= (q * log_q).sum(-1)
        kl += ce + (q * log_q).sum(-1)
        x[rows, pos] = (q.cumsum(-1) < rng.random((b, 1))).sum(-1).clip(0, v - 1)  # a letter from q
    return {
        "nll": float(total.mean() / length),
        "entropy": float(own.mean() / length),
        "kl": float(kl.mean() / length),
        **{n: (s / counts).tolist() for n, s in sums.items()},
    }


def conditional_kl(run: runs.Run, chain: MarkovChain, sequences: int = 64, sigma: float = 1e-3) -> dict:
    r"""The network's denoiser at one masked letter with every other letter given, against the chain's.

    Fresh chain text of the run's length; at every 9th position (one at a
    time) the letter is masked and the denoiser q(y) = softmax(log s[:V]) at
    noise `sigma` is read, renormalised over the letters a-l, beside the
    chain's exact conditional given both sides (order 2),

        p(y | rest) ∝ P(y | x_{l-2} x_{l-1}) P(x_{l+1} | x_{l-1} y) P(x_{l+2} | y x_{l+1}).

    KL(p || q) is what the bound pays for this position; KL(q || p) what a
    sample drawn from q pays in NLL under the chain; `tail_mass` is q's mass on
    the letters the chain gives less than 1e-3. The absorbing graph only.

    Returns:
      {"kl_pq", "kl_qp", "tail_mass", "off_letters"} in nats (means), or {} for an AR, block or uniform run.
    """
    if not any_order_denoiser(run):
        return {}
    v, length = chain.vocab_size, run.seq_len
    letters = np.asarray([run.tokenizer.encode(c)[0] for c in LETTERS[:v]])
    seqs = np.stack([chain.sample_stream(length, seed=1000 + i) for i in range(sequences)])  # (S, L) in [0, V)
    table = chain.transitions
    ys = np.arange(v)
    kl_pq, kl_qp, tail, off = [], [], [], []
    for pos in range(chain.order + 2, length - 2, 9):
        x = letters[seqs]
        x[:, pos] = run.graph.mask
        log_s = np.asarray(run.score_fn(jax.numpy.asarray(x), jax.numpy.full((sequences,), sigma)))[:, pos]
        tokens = np.exp(log_s[:, : run.graph.vocab_size] - log_s[:, : run.graph.vocab_size].max(-1, keepdims=True))
        q = tokens[:, letters]
        off.append(1 - q.sum(-1) / tokens.sum(-1))
        q = q / q.sum(-1, keepdims=True)  # (S, V)
        a, b, c, d = (seqs[:, pos + k][:, None] for k in (-2, -1, 1, 2))
        p = table[a * v + b, ys] * table[b * v + ys, c] * table[ys * v + c, d]
        p = p / p.sum(-1, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            kl_pq.append(np.where(p > 0, p * np.log(p / q), 0.0).sum(-1))
            kl_qp.append(np.where(q > 0, q * np.log(q / p), 0.0).sum(-1))
        tail.append((q * (p < 1e-3)).sum(-1))
    mean = lambda xs: float(np.mean(np.concatenate(xs)))  # noqa: E731
    return {"kl_pq": mean(kl_pq), "kl_qp": mean(kl_qp), "tail_mass": mean(tail), "off_letters": mean(off)}


def settings_changes(workdir: Path, overrides: list[str]) -> list[tuple[str, object, object]]:
    """(key, the run's value, the value `overrides` give now) for each config key that differs.

    The config is compared, not the override strings, so a run of the same settings spelled
    differently (or trained before they became the default) is the same run; its corpus file
    counts by its text and its prepared cache (data.data_dir) not at all, so runs can be copied
    between study folders. The sampling.* keys do not count either: training never reads them, and
    the study draws a run's samples with the sampler the settings give now (`fill_sample_figures`).
    """
    saved = json.loads((workdir / runs.CONFIG).read_text())
    now = json.loads(config_lib.load_config(config_lib.DEFAULT_CONFIG, overrides).to_json())  # as saved

    def same_text(a, b) -> bool:
        return Path(a).is_file() and Path(b).is_file() and Path(a).read_text() == Path(b).read_text()

    return [
        c
        for c in config_lib.config_changes(saved, now)
        if c[0] != "data.data_dir"
        and not c[0].startswith("sampling.")
        and not (c[0] == "data.path" and same_text(c[1], c[2]))
    ]


def fill_sample_figures(result: dict, workdir: Path, chain: MarkovChain, sampler: str) -> bool:
    """Fill in the samples' figures of a markov run that `result` lacks (or drew with another sampler).

    Returns whether anything was measured.
    """
    profile = result.get("profile")  # {} for an AR run: nothing to measure
    wanted = {
        "samples": result.get("samples_sampler") != sampler or "samples_nll_2se" not in result,
        "conditional": "conditional" not in result,
        "profile": profile is None or bool(profile) and "kl" not in profile,  # or one from before H(Q), KL
        "profile_surest": "profile_surest" not in result,
    }
    if not any(wanted.values()):
        return False
    run = runs.load(workdir)
    if wanted["samples"]:
        nll, se, scored = sample_nll(run, chain, sampler)
        result.update(
            samples_sampler=sampler,
            samples_nll_nats_per_char=nll,
            samples_nll_2se=2 * se,
            samples_scored_fraction=scored,
        )
    if wanted["conditional"]:
        result["conditional"] = conditional_kl(run, chain)
    if wanted["profile"]:
        result["profile"] = reveal_profile(run, chain)
    if wanted["profile_surest"]:
        result["profile_surest"] = reveal_profile(run, chain, order="surest")
    return True


def study_run(out: Path, corpus: str, candidate: str, overrides: list[str], steps: int, chain_seed: int | None) -> dict:
    """Train one candidate on one corpus (or read its study.json when it has one) and write its figures."""
    workdir = out / corpus / candidate
    result_file = workdir / "study.json"
    sampler = config_lib.load_config(config_lib.DEFAULT_CONFIG, overrides).sampling.sampler
    if result_file.exists():
        result = json.loads(result_file.read_text())
        if changes := settings_changes(workdir, overrides):
            lines = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, a, b in changes)
            raise ValueError(f"{workdir} was trained with other settings ({lines}); delete it or choose another --out")
        result["candidate"] = candidate  # a run copied in from another candidate's folder
        result.update(kind_facts(workdir))  # a result written before the report asked the kind
        print(f"{corpus}/{candidate}: done before, read from {result_file}")
        # a figure added after the run, or samples of another sampler than the settings give now: measured now
        if chain_seed is not None and fill_sample_figures(result, workdir, markov_chain(chain_seed), sampler):
            result_file.write_text(json.dumps(result, indent=2))
        return result
    print(f"{corpus}/{candidate}: training {steps} steps ({' '.join(overrides) or 'the default'})", flush=True)
    minutes = train(workdir, overrides)
    figs = figures.evaluate_run(workdir, progress=False)  # evaluate_run's defaults are `sedd eval`'s
    per = figs["bits_per_char"] / figs["nats_per_token"]  # bits/char per nat/token (EOS has no chars)
    points = curve(workdir)
    result = {
        "corpus": corpus,
        "candidate": candidate,
        "overrides": overrides,
        "steps": steps,
        "kind": figs["kind"],
        **kind_facts(workdir),
        "minutes": minutes,
        "loop_minutes": points[-1][0] if points else minutes,
        "bound_bits_per_char": figs["bits_per_char"],
        "bound_2se_bits_per_char": 2 * figs["stderr_nats_per_token"] * per,
        "curve": points,
    }
    if chain_seed is not None:
        chain = markov_chain(chain_seed)
        result.update(
            rate_nats_per_char=chain.entropy_rate(),
            rate_bits_per_char=chain.entropy_rate() / LN2,
            unigram_bits_per_char=unigram_entropy_nats(chain) / LN2,
        )
        fill_sample_figures(result, workdir, chain, sampler)
    result_file.write_text(json.dumps(result, indent=2))
    return result


# --------------------------------------------------------------------------- report


def table(corpus: str, results: list[dict]) -> str:
    """A Markdown table of one corpus's runs."""
    markov = "rate_bits_per_char" in results[0]
    head = ["candidate", "kind", "steps", "minutes", "bound bits/char ± 2 s.e."]
    if markov:
        head += [
            "gap to rate, bits/char",
            "sampler",
            "samples' NLL, nats/char ± 2 s.e.",
            "gap to rate, nats/char",
            "random order: NLL / H(Q) / KL(Q‖P)",
            "surest first: NLL / H(Q) / KL(Q‖P)",
            "sample chars scored",
            "one letter: KL(p‖q) / KL(q‖p), nats",
            "q on p < 1e-3",
        ]
    lines = [f"### {corpus}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        row = [
            r["candidate"],
            r["label"],
            str(r["steps"]),
            f"{r['minutes']:.1f}",
            f"{r['bound_bits_per_char']:.3f} ± {r['bound_2se_bits_per_char']:.3f}",
        ]
        if markov:
            se = f" ± {r['samples_nll_2se']:.3f}" if "samples_nll_2se" in r else ""
            orders = [r.get("profile") or {}, r.get("profile_surest") or {}]
            row += [
                f"{r['bound_bits_per_char'] - r['rate_bits_per_char']:+.3f}",
                f"`{r.get('samples_sampler', '')}`" if r["diffuses"] else "",
                f"{r['samples_nll_nats_per_char']:.3f}{se}",
                f"{r['samples_nll_nats_per_char'] - r['rate_nats_per_char']:+.3f}",
                *(f"{o['nll']:.3f} / {o['entropy']:.3f} / {o['kl']:.3f}" if "kl" in o else "" for o in orders),
                f"{r['samples_scored_fraction']:.0%}",
            ]
            cond = r.get("conditional") or {}
            row += [f"{cond['kl_pq']:.3f} / {cond['kl_qp']:.3f}", f"{cond['tail_mass']:.1%}"] if cond else ["", ""]
        lines.append("| " + " | ".join(row) + " |")
    if markov:
        lines += [
            "",
            f"Entropy rate {results[0]['rate_bits_per_char']:.3f} bits/char = "
            f"{results[0]['rate_nats_per_char']:.3f} nats/char, unigram entropy "
            f"{results[0]['unigram_bits_per_char']:.3f} bits/char. Samples' NLL: {NUM_SAMPLES} samples of the "
            "sampler named (config.sampling.sampler of the settings, the run's steps), scored exactly "
            "under the chain. Random order / surest first: the model's law drawn one letter a step, in "
            "the absorbing process's random order (the law of `analytic` and `euler`) or lowest denoiser "
            "entropy first (`entropy_bound`'s order), each letter beside the chain's exact law "
            "(`reveal_profile`, letters only): the samples' NLL per letter with each draw averaged out, "
            "their own entropy H(Q) and their divergence KL(Q‖P) from the chain, nats/char "
            "(NLL = H(Q) + KL(Q‖P)); a sampler that bought its NLL with diversity would show H(Q) under "
            "the rate. Samples are cut at the characters that "
            "are not letters a-l (document separators `<|endoftext|>`, newlines), which are dropped; "
            "pieces shorter than the order are not scored. The bound counts the separators. "
            "One letter: the network's denoiser q at one masked letter with all the others given, against "
            "the chain's p given both sides (`conditional_kl`); KL(q‖p) is what a sample pays, KL(p‖q) "
            "what the bound pays (AR: not measured).",
        ]
        profiled = [r for r in results if r.get("profile")]
        if profiled:
            bins = len(profiled[0]["profile"]["excess"])
            head = ["candidate", *(f"{i / bins:.3g}-{(i + 1) / bins:.3g}" for i in range(bins))]
            lines += [
                "",
                "Excess of each sampled letter over the chain's own uncertainty, CE(q, p) - H(p) in "
                "nats, by the fraction of the window already revealed when it was drawn (`reveal_profile`):",
                "",
                "| " + " | ".join(head) + " |",
                "|" + "---|" * len(head),
            ]
            lines += [
                "| " + " | ".join([r["candidate"], *(f"{e:.3f}" for e in r["profile"]["excess"])]) + " |"
                for r in profiled
            ]
    lines += [
        "",
        "Minutes: wall time of `sedd train` (start-up, compilation, evaluations and samples included). "
        "AR: the exact NLL (its 2 s.e. is 0 here), not a bound.",
    ]
    return "\n".join(lines)


def plot(results: dict[str, list[dict]], path: Path) -> None:
    """One panel per corpus: validation estimate against minutes per candidate, the final bound as a marker."""
    fig, axes = plt.subplots(1, len(results), figsize=(5.5 * len(results), 4.2), squeeze=False)
    for ax, (corpus, rows) in zip(axes[0], results.items()):
        for r in rows:
            style = "--" if r["exact"] else "-"  # an exact NLL (AR), not a bound
            xs, ys = zip(*r["curve"]) if r["curve"] else ((), ())
            (line,) = ax.plot(xs, ys, style, marker=".", label=r["candidate"])
            ax.errorbar(
                [r["loop_minutes"]],
                [r["bound_bits_per_char"]],
                yerr=[r["bound_2se_bits_per_char"]],
                fmt="o",
                color=line.get_color(),
                capsize=3,
            )
        if "rate_bits_per_char" in rows[0]:
            ax.axhline(rows[0]["rate_bits_per_char"], color="k", lw=0.8, label="entropy rate")
            ax.axhline(rows[0]["unigram_bits_per_char"], color="gray", lw=0.8, ls=":", label="unigram entropy")
        ax.set(title=corpus, xlabel="minutes in the training loop", ylabel="bits/char")
        ax.legend(fontsize=8)
    fig.suptitle("validation estimate (lines) and final bound ± 2 s.e. (markers); AR dashed", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- main


def candidate_steps(overrides: list[str], steps: int) -> int:
    """The candidate's own training.n_iters if its overrides set one (a smaller batch takes more steps in
    the same minutes), else `steps`."""
    own = [o.split("=", 1)[1] for o in overrides if o.startswith("--config.training.n_iters=")]
    return int(own[-1]) if own else steps


def schedule(steps: int) -> list[str]:
    """n_iters, and four evaluations with a metrics row at each."""
    eval_every = max(1, steps // 4)
    return [
        f"--config.training.n_iters={steps}",
        f"--config.training.eval_every={eval_every}",
        f"--config.training.log_every={math.gcd(eval_every, 50)}",
    ]


def int_list(text: str) -> list[int]:
    """'0,1' -> [0, 1]."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None


def pick_candidates(names: str | None) -> dict[str, list[str]]:
    """The candidates named in a comma-separated list (None: all)."""
    chosen = [n.strip() for n in names.split(",") if n.strip()] if names else list(CANDIDATES)
    unknown = [n for n in chosen if n not in CANDIDATES]
    if unknown or not chosen:
        raise ValueError(f"unknown candidate(s) {unknown}; choose among {', '.join(CANDIDATES)}")
    return {n: CANDIDATES[n] for n in chosen}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="experiments/results/default_run_study", help="output folder")
    p.add_argument("--corpus", default="both", help=f"{' | '.join(CORPORA)} | both (default both)")
    p.add_argument("--markov-seeds", default="0", help="comma-separated seeds of the markov chains (default 0)")
    p.add_argument("--markov-lines", type=int, default=2000, help="sequences of each markov corpus")
    p.add_argument("--candidates", default=None, help=f"comma-separated among {', '.join(CANDIDATES)} (default all)")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps of every run (default: the default config's training.n_iters)",
    )
    p.add_argument(
        "--override",
        action="append",
        default=[],
        help="a --config.X=Y override for every run (repeatable; write it as --override=--config.X=Y)",
    )
    p.add_argument("--no-plot", action="store_true", help="write no study.png")
    p.add_argument(
        "--report",
        action="store_true",
        help="train nothing: the table and plot of the runs already finished under --out among those named",
    )
    args = p.parse_args(argv)
    try:
        candidates = pick_candidates(args.candidates)
        steps = args.steps or config_lib.load_config().training.n_iters
        if steps < 1 or args.markov_lines < 1:
            raise ValueError("--steps and --markov-lines must be positive")
        out = Path(args.out)
        found = corpora(args.corpus, int_list(args.markov_seeds), args.markov_lines, out)
        results = {}
        for corpus, (data, seed) in found.items():
            results[corpus] = []
            for name, cand in candidates.items():
                n = candidate_steps(cand, steps)
                run_args = [*data, *cand, *schedule(n), *args.override]
                if args.report and not (out / corpus / name / "study.json").exists():
                    continue
                results[corpus].append(study_run(out, corpus, name, run_args, n, seed))
        results = {corpus: rows for corpus, rows in results.items() if rows}
        if not results:
            raise ValueError(f"no finished run under {out} among those named")
    except (ValueError, KeyError, FileNotFoundError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    report = "\n\n".join(table(corpus, rows) for corpus, rows in results.items())
    (out / "study.md").write_text(report + "\n")
    print(report)
    if not args.no_plot:
        plot(results, out / "study.png")
    print(f"wrote {out}/study.md" + ("" if args.no_plot else ", study.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
