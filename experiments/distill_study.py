r"""The distillation study: a teacher and each round's student at N sampling steps, against a chain's exact law.

    python experiments/distill_study.py --teacher RUN --students RUN [RUN ...] --markov-seed S \
        [--steps 128,64,32,16,8] [--num_samples 64] [--out DIR]

The runs are of a markov corpus of ``experiments/default_run_study.py``
(text of a known law: letters a-l of an order-2 chain) and the students
`sedd distill` runs of the teacher. For the teacher and for the student of
every round of every distillation (``runs.load(workdir, step=round x
distill.round_steps)``), at each N of --steps:

  - num_samples texts of the model's length drawn with N steps (one network
    call a step, plus the final denoise where a position is left) by the
    sampler the model was distilled for: the analytic sampler for the
    teacher and the students of distill.order = "random", the dilated
    sampler for those of "dilated"; their exact NLL under the chain
    (nats/char with 2 standard errors, ``experiments.quality.texts_nll``) and
    the unigram entropy of their letters pooled, beside the chain's own
    unigram entropy (a distillation that makes text less varied is no win);
  - once per model: its bound on the validation split (`sedd eval`'s figure)
    and its training minutes (the teacher's loop; each round's, from
    ``sedd.distill.round_figures``);
  - once per sampler and N: the seconds to write the model's length at
    batch 1, timed interleaved (``experiments.timing.interleaved``) with the AR network
    of the same size writing as many characters with its KV cache (random
    weights: neither speed depends on them), as characters a second and x AR.

--references adds the teacher with other samplers at the same N
(confidence, dilated, strided: the dilated sampler's strided order), and
--exact the chain's exact denoiser with the analytic sampler and with each
planned order used: the best any network can do with that sampler.

Writes distill_study.{json,md,png} into --out: the table, and the plot of
the samples' NLL and unigram entropy against N for the teacher and each
round's student.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import jax
import numpy as np

if not __package__:  # run as a file: import experiments/ by its location (experiments/__init__.py says why)
    import importlib.util

    _spec = importlib.util.spec_from_file_location("experiments", Path(__file__).resolve().parent / "__init__.py")
    if "experiments" not in sys.modules:
        sys.modules["experiments"] = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(sys.modules["experiments"])

from experiments.quality import (
    LETTERS,
    letters_entropy_bits,
    markov_chain,
    texts_nll,  # noqa: E402
    unigram_entropy_nats,
)
from experiments.timing import format_table, interleaved, machine, median, paired_ratio  # noqa: E402
from sedd import distill, figures, kinds, runs, sampling  # noqa: E402
from sedd.kinds import causal

LN2 = math.log(2)
SAMPLER = "analytic"  # the step distilled (euler is the same kernel on the absorbing graph with log-linear noise)


def exact_figures(
    chain,
    steps: int,
    num_samples: int,
    length: int,
    noise_eps: float,
    end: float,
    seed: int = 0,
    order: str | None = None,
) -> dict:
    """The figures of ``sample_figures`` for a sampler with the chain's exact denoiser (no network).

    order None, the analytic sampler: at a masked position the step t -> s
    unmasks with the log-linear schedule's probability (m_t - m_s) / m_t,
    m_t = (1 - noise.eps) t, and draws its letter from the chain's exact law
    given the letters revealed (``MarkovChain.posteriors``); positions step
    independently, as the sampler's do; the final denoise fills every
    position left. order "dilated" or "strided": step n writes the positions
    of places [n L/N, (n+1) L/N) of ``sedd.sampling.planned_rank``, each
    from the same exact law. So it is the best any teacher of the sampler
    can write at N steps, and what a distilled student matching its
    marginals writes too.
    """
    rng = np.random.default_rng(seed)
    x = -np.ones((num_samples, length), np.int64)
    masked = lambda t: (1.0 - noise_eps) * t  # noqa: E731

    def draw(x, where):
        post = chain.posteriors(x)  # (B, L, V)
        token = (post.cumsum(-1) < rng.random(x.shape + (1,))).sum(-1).clip(0, chain.vocab_size - 1)
        return np.where(where, token, x)

    if order is None:
        grid = np.linspace(1.0, end, steps + 1)
        for t, s in zip(grid[:-1], grid[1:]):
            x = draw(x, (x < 0) & (rng.random(x.shape) < (masked(t) - masked(s)) / masked(t)))
    else:
        place = sampling.planned_rank(order, length, steps) * steps // length  # the step that writes each position
        for n in range(steps):
            x = draw(x, (x < 0) & (place == n))
    x = draw(x, x < 0)
    texts = ["".join(LETTERS[i] for i in row) for row in x]
    nll, se, scored = texts_nll(texts, chain)
    return {
        "nll_nats_per_char": nll,
        "nll_2se": 2 * se,
        "scored_share": scored,
        "unigram_bits": letters_entropy_bits(texts),
        "nfe": 0,
    }


def sampler_of(name: str) -> tuple[str, dict]:
    """A sampler as the study names it -> (registered sampler, its options): "strided" is the dilated sampler's
    other planned order."""
    return ("dilated", {"order": "strided"}) if name == "strided" else (name, {})


def models(teacher: str, students: list[str]) -> list[dict]:
    """The teacher, then each round of each distillation: {label, workdir, step, minutes, round, divergence, sampler}.

    A student samples with the sampler of its distillation's order (``sedd.distill.ORDERS``), the teacher with
    ``SAMPLER``.
    """
    rows = [json.loads(line) for line in (Path(teacher) / runs.METRICS).read_text().splitlines() if line.strip()]
    out = [
        {
            "label": "teacher",
            "workdir": teacher,
            "step": None,
            "round": 0,
            "divergence": None,
            "sampler": SAMPLER,
            "minutes": rows[-1]["elapsed_s"] / 60 if rows else None,
        }
    ]
    for workdir in students:
        config = runs.read_config(workdir)
        d = config.distill
        if d.rounds < 1:
            raise ValueError(f"{workdir} is not a distillation (distill.rounds = 0)")
        for r in distill.round_figures(workdir, config):
            out.append(
                {
                    "label": f"{Path(workdir).name} round {r['round']}",
                    "workdir": workdir,
                    "step": r["round"] * d.round_steps,
                    "round": r["round"],
                    "divergence": d.divergence,
                    "minutes": r["minutes"],
                    "distilled_steps": r["steps"],
                    "sampler": distill.ORDERS[d.order] or SAMPLER,
                }
            )
    return out


def sample_figures(run: runs.Run, steps: int, num_samples: int, chain, key, sampler: str = SAMPLER) -> dict:
    """The samples' exact NLL (nats/char, 2 s.e., share of characters scored), letters' entropy, calls made."""
    name, options = sampler_of(sampler)
    out = run.sample(key, num_samples, steps, name, return_stats=True, **options)
    texts = [run.decode(row) for row in out.tokens]
    nll, se, scored = texts_nll(texts, chain)
    return {
        "nll_nats_per_char": nll,
        "nll_2se": 2 * se,
        "scored_share": scored,
        "unigram_bits": letters_entropy_bits(texts),
        "nfe": int(out.stats["nfe"]),
    }


def speed(run: runs.Run, steps: list[int], repeats: int, key, samplers=(SAMPLER,)) -> dict[tuple, dict]:
    """Per (sampler, N): characters a second writing the run's length at batch 1, and x the same-sized AR's with
    its cache."""
    config = run.config.copy_and_resolve_references()
    config.model.kind = "ar"
    ar_model = kinds.get(config).network(0)
    length = run.seq_len
    fns = {"ar": lambda: causal.ancestral_model(key, ar_model, 1, length)}
    for sampler in samplers:
        name, options = sampler_of(sampler)
        for n in steps:
            fns[sampler, n] = lambda n=n, name=name, options=options: (
                run.kind.sample(key, run.net, 1, n, name, **options).tokens
            )
    times = interleaved(fns, repeats)
    return {
        k: {
            "chars_per_s": length / median(times[k]),
            "vs_ar": paired_ratio(times["ar"], times[k]),
            "ar_chars_per_s": length / median(times["ar"]),
        }
        for k in fns
        if k != "ar"
    }


def study(
    teacher: str,
    students: list[str],
    markov_seed: int,
    steps: list[int],
    num_samples: int,
    repeats: int,
    eval_batches: int,
    references: tuple[str, ...] = (),
    exact: bool = False,
) -> dict:
    """Every model's figures at every N (``sample_figures``), its bound and minutes, and the speed of each N.

    references: other samplers of the teacher drawn at the same N (rows "teacher, <sampler>"; "strided" is the
    dilated sampler's strided order); exact: rows of the chain's own denoiser with the analytic sampler and with
    each planned order among the samplers (``exact_figures``).
    """
    chain = markov_chain(markov_seed)
    key = jax.random.key(0)
    rows = []
    for m in models(teacher, students):
        run = runs.load(m["workdir"], step=m["step"])
        bound = figures.evaluate_run(
            m["workdir"], num_t=64, batch_size=32, max_batches=eval_batches, step=m["step"], progress=False
        )
        for n in steps:
            row = {
                **m,
                "steps": n,
                "bound_bits_per_char": bound["bits_per_char"],
                **sample_figures(run, n, num_samples, chain, key, m["sampler"]),
            }
            rows.append(row)
            print(json.dumps(row, default=float), flush=True)
    base = runs.load(teacher)
    for label, sampler in [("teacher, " + r, r) for r in references]:  # other samplers of the teacher, for reference
        for n in steps:
            rows.append(
                {
                    **rows[0],
                    "label": label,
                    "minutes": None,
                    "steps": n,
                    "sampler": sampler,
                    **sample_figures(base, n, num_samples, chain, key, sampler),
                }
            )
            print(json.dumps(rows[-1], default=float), flush=True)
    used = tuple(dict.fromkeys(r["sampler"] for r in rows))
    rates = speed(base, steps, repeats, key, used)
    for row in rows:
        row.update(rates.get((row["sampler"], row["steps"]), {"chars_per_s": math.nan, "vs_ar": math.nan}))
    if exact:
        c = base.config
        for order in [None] + [
            o for o in sampling.PLANNED_ORDERS if o in {sampler_of(u)[1].get("order", u) for u in used}
        ]:
            for n in steps:
                label = "exact denoiser" + (f", {order}" if order else "")
                rows.append(
                    {
                        "label": label,
                        "steps": n,
                        "minutes": None,
                        "bound_bits_per_char": math.nan,
                        "chars_per_s": math.nan,
                        "vs_ar": math.nan,
                        "sampler": order or SAMPLER,
                        **exact_figures(chain, n, num_samples, base.seq_len, c.noise.eps, c.sampling.eps, order=order),
                    }
                )
    return {
        "rows": rows,
        "machine": machine(),
        "length": base.seq_len,
        "markov_seed": markov_seed,
        "num_samples": num_samples,
        "sampler": SAMPLER,
        "rate_nats_per_char": chain.entropy_rate(),
        "unigram_bits": unigram_entropy_nats(chain) / LN2,
    }


def write(result: dict, out: Path, plot: bool = True) -> None:
    """distill_study.json, .md (the table) and .png (NLL and entropy against N, a line per model)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "distill_study.json").write_text(json.dumps(result, indent=1, default=float))
    header = [
        "model",
        "sampler",
        "N",
        "calls",
        "exact NLL nats/char",
        "unigram bits",
        "bound bits/char",
        "minutes",
        "chars/s B=1",
        "x AR B=1",
    ]
    num = lambda x, f: "" if x is None or not math.isfinite(x) else format(x, f)  # noqa: E731
    table = [
        [
            r["label"],
            r["sampler"],
            r["steps"],
            r["nfe"],
            f"{r['nll_nats_per_char']:.3f} +- {r['nll_2se']:.3f}",
            f"{r['unigram_bits']:.3f}",
            num(r["bound_bits_per_char"], ".3f"),
            num(r["minutes"], ".1f"),
            num(r["chars_per_s"], ".0f"),
            num(r["vs_ar"], ".2f"),
        ]
        for r in result["rows"]
    ]
    text = format_table(header, table)
    (out / "distill_study.md").write_text(
        f"chain {result['markov_seed']}: entropy rate {result['rate_nats_per_char']:.3f} nats/char, unigram "
        f"entropy {result['unigram_bits']:.3f} bits\n\n{text}\n"
    )
    print(text)
    if not plot:
        return
    import matplotlib  # noqa: PLC0415  (optional dependency: plots only)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  (optional dependency: plots only)

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    labels = list(dict.fromkeys(r["label"] for r in result["rows"]))
    families = list(dict.fromkeys(r["workdir"] for r in result["rows"] if r.get("round")))  # the distillations
    exact = [label for label in labels if label.startswith("exact denoiser")]
    others = [label for label in labels if label.startswith("teacher, ")]
    maps = [plt.cm.Blues, plt.cm.Reds, plt.cm.Greens, plt.cm.Purples]
    for label in labels:
        rs = [r for r in result["rows"] if r["label"] == label]
        style = {"teacher": dict(color="k", lw=2)}.get(label, {})
        if label.startswith("exact denoiser"):  # the best of each sampler: gray, a dash per sampler
            style = dict(color="gray", ls=["--", ":", "-."][exact.index(label) % 3], lw=1)
        if rs[0].get("round"):  # a student: its distillation's colour, darker each round
            rounds = max(r["round"] for r in result["rows"] if r.get("workdir") == rs[0]["workdir"])
            cmap = maps[families.index(rs[0]["workdir"]) % len(maps)]
            style = dict(color=cmap(0.35 + 0.6 * rs[0]["round"] / rounds))
        elif label.startswith("teacher, "):  # another sampler of the teacher
            style = dict(color=["goldenrod", "tab:green", "tab:purple", "tab:brown"][others.index(label) % 4], ls="-.")
        left.errorbar(
            [r["steps"] for r in rs],
            [r["nll_nats_per_char"] for r in rs],
            yerr=[r["nll_2se"] for r in rs],
            marker="o",
            ms=3,
            capsize=2,
            label=label,
            **style,
        )
        right.plot([r["steps"] for r in rs], [r["unigram_bits"] for r in rs], marker="o", ms=3, label=label, **style)
    left.axhline(result["rate_nats_per_char"], color="gray", ls=":", lw=0.8, label="the chain's entropy rate")
    right.axhline(result["unigram_bits"], color="gray", ls=":", lw=0.8, label="the chain's unigram entropy")
    for ax, what in (
        (left, "samples' exact NLL under the chain (nats/char, 2 s.e.)"),
        (right, "unigram entropy of the samples' letters (bits)"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(f"network calls per {result['length']} characters (N steps)")
        ax.set_ylabel(what)
        ax.legend(fontsize=6)
    fig.suptitle(f"distillation through time on Markov chain {result['markov_seed']}")
    fig.tight_layout()
    fig.savefig(out / "distill_study.png", dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--teacher", required=True, help="the teacher run (a markov corpus of default_run_study.py)")
    p.add_argument("--students", nargs="*", default=[], help="`sedd distill` runs of the teacher")
    p.add_argument("--markov-seed", type=int, required=True, help="the seed of the corpus's chain")
    p.add_argument("--steps", default="128,64,32,16,8", help="sampling steps N, comma-separated")
    p.add_argument("--num_samples", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3, help="timed rounds of the speed columns")
    p.add_argument("--eval_batches", type=int, default=8)
    p.add_argument("--out", default="distill_study")
    p.add_argument("--references", default="", help="other samplers of the teacher at the same N, e.g. confidence")
    p.add_argument("--exact", action="store_true", help="rows of the chain's exact denoiser (the best teacher)")
    p.add_argument("--no-plot", action="store_true")
    args = p.parse_args(argv)
    steps = [int(s) for s in re.split(r"[,\s]+", args.steps.strip()) if s]
    references = tuple(s for s in args.references.split(",") if s)
    write(
        study(
            args.teacher,
            args.students,
            args.markov_seed,
            steps,
            args.num_samples,
            args.repeats,
            args.eval_batches,
            references,
            args.exact,
        ),
        Path(args.out),
        plot=not args.no_plot,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
