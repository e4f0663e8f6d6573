"""The experiment scripts: the benchmarks run end to end; the sampler comparison checks its input.

Benchmarks are scripts, not timed tests: nothing here checks a speed, only
that each benchmark runs on a tiny config and reports the fields the docs
quote. The scripts are loaded from experiments/ by their files (they are not part
of the installed library), as `python experiments/x.py` runs them: each
registers the package experiments/ by its location, so its shared modules
(experiments.timing, experiments.quality, experiments.benchmarks.*) are
imported by name after the first load. They run in this process, so jax is
imported once.
"""

import csv
import importlib.util
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(relative: str):
    spec = importlib.util.spec_from_file_location(Path(relative).stem, ROOT / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _load("experiments/benchmarks/bench.py")
compare = _load("experiments/compare_samplers.py")
study = _load("experiments/default_run_study.py")

from experiments import quality, timing  # noqa: E402  (the package, registered by the loads above)
from experiments.benchmarks import call_cost, nets, speculative  # noqa: E402

FIELDS = {
    "train": ["mfu", "tokens_per_s", "flops_per_token", "peak_matmul_flops_per_s"],
    "sampler": ["ratio_to_forward", "forward_s"],
    "ar": ["crossover_steps", "ar_seconds", "rows"],
    "bound": ["rows", "num_t"],
    "memory": None,
    "rng": ["method", "ms", "speedup_over_jax"],
    "optimizer": ["optimizer", "step_ms", "ratio_to_adamw"],
    "profile": ["ms_per_step_per_thread", "threads", "step_ms_traced"],
}


# Each benchmark's --quick run: the memory plan (DESIGN.md's public command) in the default suite, the others
# behind -m slow (scripts that time; nothing here checks a speed), to keep the default suite within 900 CPU s.
@pytest.mark.parametrize(
    "which", [w if w == "memory" else pytest.param(w, marks=pytest.mark.slow) for w in sorted(FIELDS)]
)
def test_benchmark_quick(which, tmp_path, capsys):
    out = tmp_path / f"{which}.json"
    assert bench.main([which, "--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["quick"] and result["machine"]["cpu_count"] >= 1 and result["machine"]["devices"]
    header, rule = capsys.readouterr().out.split("\n")[1:3]
    assert set(rule.replace(" ", "")) == {"-"} and len(rule) == len(header)  # the table was printed
    if which == "profile":  # the trace was read and its ops matched to the compiled step's
        assert result["results"][0]["ms_per_step_per_thread"]["products"] > 0
    if which == "memory":
        tiny = result["results"]["tiny"]["rows"][0]  # the config as shipped; no plan without --device_gib
        assert tiny["peak_bytes_estimate"] > 0 and tiny["state_bytes"] > 0 and tiny["remat"] == "none"
        assert result["results"]["tiny"]["fit"] is None
    else:
        for key in FIELDS[which]:
            assert key in result["results"][0]


def test_flops_formula():
    c = nets.bench_config("tiny", vocab_size=65, n_layers=2)  # H 32, L 32, mlp_ratio 4, D 66
    n = 2 * (4 * 32 * 32 + 8 * 32 * 32) + 32 * 66
    assert nets.matmul_params(c) == n
    assert nets.flops_per_token(c) == 6 * n + 12 * 2 * 32 * 32
    assert nets.flops_per_token(c, training=False) == 2 * n + 4 * 2 * 32 * 32
    c.model.kind = "ar"  # the AR baseline predicts the V real tokens: D = 65
    assert nets.matmul_params(c) == n - 32


def test_paired_ratio_is_robust_to_drift():
    # A machine that slows down 3x half way: per-round ratios stay 2.
    assert timing.paired_ratio([2, 2, 6, 6, 6], [1, 1, 3, 3, 3]) == 2


def test_compare_samplers_checks_its_input(tmp_path):
    assert compare.check_steps([8, 16]) == [8, 16]
    for bad in ([8, 0], [-1], [], [2.5]):
        with pytest.raises(ValueError, match="positive"):
            compare.check_steps(bad)
    with pytest.raises(ValueError, match="comma-separated"):
        compare.int_list("8,x")
    with pytest.raises(FileNotFoundError, match="run directory"):
        compare.compare_samplers(tmp_path / "nothing", steps=[4])
    with pytest.raises(ValueError, match="positive"):
        compare.compare_samplers(tmp_path / "nothing", steps=[4, 0])
    assert compare.main(["--workdir", str(tmp_path / "nothing"), "--steps", "4"]) == 2


TINY_STUDY = [
    "--config.model.hidden_size=32",
    "--config.model.n_layers=1",
    "--config.model.n_heads=2",
    "--config.model.cond_dim=16",
    "--config.data.seq_len=32",
    "--config.training.batch_size=8",
    "--config.training.eval_batches=1",
    "--config.training.eval_samples=1",
    "--config.sampling.steps=4",
    "--config.model.dtype=float32",
]  # as tiny (bfloat16 only adds compile time); a batch of 8 divides 1, 2 or 8 devices


def _study(tmp_path, candidates):
    overrides = [f"--override={o}" for o in [*TINY_STUDY, f"--config.data.data_dir={tmp_path / 'data'}"]]
    return [
        "--out",
        str(tmp_path),
        "--corpus",
        "markov",
        "--candidates",
        candidates,
        "--steps",
        "4",
        "--markov-lines",
        "50",
        "--no-plot",
        *overrides,
    ]


def _check_study_run(tmp_path, name, kind):
    result = json.loads((tmp_path / "markov_seed0" / name / "study.json").read_text())
    assert result["kind"] == kind and result["steps"] == 4 and result["curve"]
    for key in (
        "minutes",
        "bound_bits_per_char",
        "bound_2se_bits_per_char",
        "rate_bits_per_char",
        "rate_nats_per_char",
        "samples_nll_nats_per_char",
    ):
        assert math.isfinite(result[key]), key
    assert result["bound_bits_per_char"] > 0 and result["samples_scored_fraction"] > 0
    if kind == "ddit":
        cond = result["conditional"]
        assert cond["kl_pq"] >= 0 and cond["kl_qp"] >= 0 and 0 <= cond["tail_mass"] <= 1


def _untrained_markov_run(workdir: Path, graph: str) -> Path:
    """A run directory of the tiny markov config with its initial weights (as `sedd train` or `sedd convert`
    writes one: config.json, tokenizer.json, a checkpoint of step, params, ema): no training to wait for."""
    import ml_collections
    import orbax.checkpoint as ocp
    from flax import nnx

    from sedd import config as config_lib
    from sedd import checkpoints, kinds, runs
    from sedd.data import save_tokenizer
    from sedd.data.tokenizers import MarkovTokenizer

    config = config_lib.load_config(
        "markov",
        [
            "--config.model.hidden_size=16",
            "--config.model.n_layers=1",
            "--config.model.n_heads=2",
            "--config.model.cond_dim=8",
            "--config.data.seq_len=8",
            f"--config.graph.type={graph}",
            "--config.sampling.sampler=analytic",
        ],
    )
    config = ml_collections.ConfigDict(config.to_dict())  # unlocked, as train() fills vocab_size in
    config.vocab_size = config.data.markov.vocab_size
    workdir.mkdir(parents=True)
    (workdir / runs.CONFIG).write_text(config_lib.to_json(config))
    save_tokenizer(MarkovTokenizer(config.vocab_size), workdir / runs.TOKENIZER)
    _, params, _ = nnx.split(kinds.build_model(config), nnx.Param, ...)
    manager = checkpoints.checkpoint_manager(workdir, config)
    manager.save(
        0,
        args=ocp.args.Composite(state=ocp.args.PyTreeSave({"step": np.int32(0), "params": params, "ema": params})),
        force=True,
    )
    manager.wait_until_finished()
    return workdir


def test_compare_runs_puts_each_run_with_the_samplers_its_graph_supports_in_one_report(tmp_path, capsys):
    """--workdirs: an absorbing and a uniform run of one chain, one table; first_hitting skipped on the uniform."""
    dirs = [str(_untrained_markov_run(tmp_path / graph, graph)) for graph in ("absorbing", "uniform")]
    argv = [
        "--workdirs",
        *dirs,
        "--samplers",
        "analytic,first_hitting",
        "--steps",
        "4",
        "--num_samples",
        "4",
        "--out",
        str(tmp_path / "out"),
    ]
    assert compare.main(argv) == 0
    out = capsys.readouterr().out
    assert "uniform: skipping first_hitting" in out
    with open(tmp_path / "out" / "compare_samplers.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["run"], r["sampler"]) for r in rows] == [
        ("absorbing", "absorbing: analytic"),
        ("absorbing", "absorbing: first_hitting"),
        ("absorbing", "data"),
        ("uniform", "uniform: analytic"),
    ]
    assert all(float(r["exact_nats_per_token"]) > 0 for r in rows)
    assert (tmp_path / "out" / "compare_samplers.png").stat().st_size > 0
    with pytest.raises(SystemExit):  # several runs need --out: a usage error
        compare.main(argv[:-2])
    assert "give --out DIR" in capsys.readouterr().err


def _diffusing_kind():
    """A stand-in kind that diffuses (``capabilities.Diffuses``) and honours every prompt pattern."""
    from sedd.kinds import capabilities

    return type("Diffusing", (capabilities.Diffuses,), {"conditions": ("prefix", "suffix", "infill")})()


def test_conditional_kl_is_zero_for_the_chains_own_conditional():
    """conditional_kl against a network that returns the chain's exact conditional given both sides, and a flat one."""
    import types

    import jax.numpy as jnp

    chain = quality.markov_chain(0)
    v, table, length, mask = chain.vocab_size, chain.transitions, 40, 99
    encode = {c: [3 + i] for i, c in enumerate(quality.LETTERS)}  # letter i is token 3 + i; tokens 0-2 are others

    def exact(x, sigma):  # log-score over D = 20 tokens + MASK; the masked position's letters get log p(y | rest)
        x = np.asarray(x)
        out = np.zeros((*x.shape, 21))
        out[..., :3] = -np.inf  # no mass off the letters
        for i, pos in zip(*np.nonzero(x == mask)):
            a, b, c, d = (x[i, pos + k] - 3 for k in (-2, -1, 1, 2))
            ys = np.arange(v)
            out[i, pos, 3 : 3 + v] = np.log(table[a * v + b, ys] * table[b * v + ys, c] * table[ys * v + c, d])
            out[i, pos, 3 + v : 20] = -np.inf
        return jnp.asarray(out)

    run = types.SimpleNamespace(
        kind=_diffusing_kind(),
        graph=types.SimpleNamespace(absorb=True, mask=mask, vocab_size=20),
        tokenizer=types.SimpleNamespace(encode=lambda c: encode[c]),
        seq_len=length,
        score_fn=exact,
    )
    cond = study.conditional_kl(run, chain, sequences=8)
    assert abs(cond["kl_pq"]) < 1e-6 and abs(cond["kl_qp"]) < 1e-6 and cond["off_letters"] < 1e-12  # float32
    run.score_fn = lambda x, sigma: jnp.zeros((*x.shape, 21))  # flat over all 20 tokens
    flat = study.conditional_kl(run, chain, sequences=8)
    assert abs(flat["off_letters"] - 8 / 20) < 1e-6  # 3 other tokens and the 5 beyond the letters
    assert flat["kl_pq"] > 0.3 and flat["kl_qp"] > flat["kl_pq"]  # a flat q pays most where p is near 0


def test_texts_nll_is_the_chains_exact_nll_of_the_letters():
    """texts_nll: the chain's -log p over the letters, cut at anything else (a separator, an end-of-text)."""
    from sedd.data.tokenizers import EOS_TEXT

    chain = quality.markov_chain(0)
    ids = chain.sample(6, 40, seed=3)  # (6, 40)
    words = ["".join(quality.LETTERS[i] for i in row) for row in ids]
    nll, se, scored = quality.texts_nll(words, chain)
    assert nll == pytest.approx(-chain.log_prob(ids).sum() / ids.size, rel=1e-12) and scored == 1 and se > 0
    # A text of two documents is its two pieces, each paying its first k letters' stationary law.
    joined = [words[0] + EOS_TEXT + words[1], words[2]]
    nll2, _, scored2 = quality.texts_nll(joined, chain)
    assert nll2 == pytest.approx(-chain.log_prob(ids[:3]).sum() / 120, rel=1e-12)
    assert scored2 == pytest.approx(120 / (len(joined[0].replace(EOS_TEXT, "\n")) + 40))


def test_reveal_profile_of_the_chains_own_law_pays_no_excess():
    """reveal_profile against a network that returns the chain's exact law given the revealed letters."""
    import types

    import jax
    import jax.numpy as jnp

    chain = quality.markov_chain(0)
    v, length, mask = chain.vocab_size, 24, 99
    encode = {c: [3 + i] for i, c in enumerate(quality.LETTERS)}  # letter i is token 3 + i

    def exact_numpy(x):
        x = np.asarray(x)
        hidden = np.where(x == mask, -1, x - 3)
        out = np.full((*x.shape, 21), -np.inf, np.float32)
        out[..., 3 : 3 + v] = np.log(np.maximum(chain.posteriors(hidden), 1e-30))
        return out

    def exact(x, sigma):
        return jax.pure_callback(exact_numpy, jax.ShapeDtypeStruct((*x.shape, 21), jnp.float32), x)

    run = types.SimpleNamespace(
        kind=_diffusing_kind(),
        graph=types.SimpleNamespace(absorb=True, mask=mask, vocab_size=20),
        tokenizer=types.SimpleNamespace(encode=lambda c: encode[c]),
        seq_len=length,
        score_fn=exact,
        noise=lambda t: (t, t),
    )
    for order in ("random", "surest"):  # the chain rule holds in any order chosen from the letters revealed
        profile = study.reveal_profile(run, chain, num_samples=64, bins=4, order=order)
        assert max(abs(e) for e in profile["excess"]) < 1e-4  # q = p at every step (float32 logs)
        assert max(profile["kl_qp"]) < 1e-4 and max(profile["tail_mass"]) <= v * 1e-3  # p's own mass below 1e-3
        assert abs(profile["kl"]) < 1e-4 and profile["nll"] == pytest.approx(profile["entropy"] + profile["kl"])
        # Then the mean cross-entropy is the window's entropy per letter, up to Monte Carlo error.
        assert profile["nll"] == pytest.approx(chain.sequence_entropy(length) / length, abs=0.05), order
    with pytest.raises(ValueError, match="order must be"):
        study.reveal_profile(run, chain, order="left_to_right")


@pytest.mark.slow  # a study's whole run (two trained candidates, every figure): behind -m slow to keep the default suite within 900 CPU s
def test_default_run_study_markov(tmp_path, capsys):
    """One tiny candidate end to end (a `sedd train` subprocess, the bound, the samples scored under the chain)."""
    argv = _study(tmp_path, "default")
    assert study.main(argv) == 0
    _check_study_run(tmp_path, "default", "ddit")
    assert "| default |" in (tmp_path / "study.md").read_text()
    assert study.main(argv) == 0 and "done before" in capsys.readouterr().out  # a finished run is not retrained
    assert study.main([*_study(tmp_path, "default,ar"), "--report"]) == 0  # reports what is finished, trains nothing
    assert not (tmp_path / "markov_seed0" / "ar").exists()
    moved = tmp_path / "moved"  # a finished run copied to another study folder is the same run there
    shutil.copytree(tmp_path / "markov_seed0", moved / "markov_seed0")
    argv_moved = [moved if a == str(tmp_path) else a for a in argv]
    assert study.main([str(a) for a in argv_moved]) == 0 and "done before" in capsys.readouterr().out
    shutil.copytree(tmp_path / "markov_seed0" / "default", tmp_path / "markov_seed0" / "adamw")
    capsys.readouterr()
    assert study.main(_study(tmp_path, "adamw")) != 0  # other settings: refused, named
    assert "optim.optimizer: 'muon' there, 'adamw' now" in "".join(capsys.readouterr())
    with pytest.raises(ValueError, match="unknown candidate"):
        study.pick_candidates("default,mdlm")


@pytest.mark.slow
def test_default_run_study_ar_baseline(tmp_path):
    assert study.main(_study(tmp_path, "ar")) == 0
    _check_study_run(tmp_path, "ar", "ar")


@pytest.mark.slow
def test_block_study_on_a_markov_corpus(tmp_path):
    """block_study.py on tiny AR and block runs of a markov corpus: the exact NLL of every sampler's samples."""
    block_study = _load("experiments/block_study.py")
    assert study.main(_study(tmp_path, "ar,block4")) == 0
    runs_dir = tmp_path / "markov_seed0"
    result = block_study.study(
        str(runs_dir / "ar"),
        [str(runs_dir / "block4")],
        num_samples=4,
        length=64,
        repeats=1,
        eval_batches=1,
        markov_seed=0,
    )
    assert [r["sampler"] for r in result["rows"]] == ["ancestral", "EB", "threshold 0.9"]
    for row in result["rows"]:
        assert row["exact_nats_per_char"] > 0 and row["exact_2se"] >= 0 and 0 < row["scored_share"] <= 1
        assert row["vs_ar_b1"] > 0 and row["nfe_b16"] >= 1
    assert result["rate_nats_per_char"] == pytest.approx(quality.markov_chain(0).entropy_rate())
    block_study.write(result, tmp_path / "out")
    assert "exact NLL nats/char" in (tmp_path / "out" / "block_study.md").read_text()
    assert (tmp_path / "out" / "block_study.png").stat().st_size > 0


@pytest.mark.slow
def test_distill_study_on_a_markov_corpus(tmp_path):
    """distill_study.py on a tiny teacher of a markov corpus and its two-round distillation: every figure, the plot."""
    from sedd import config as config_lib
    from sedd import distill
    from sedd import train as train_lib

    distill_study = _load("experiments/distill_study.py")
    corpus = quality.write_markov_corpus(0, 50, tmp_path / "markov_seed0.txt")
    data = [f"--config.data.data_dir={tmp_path / 'data'}"]
    teacher_config = config_lib.load_config(
        "shakespeare_char",
        [
            *TINY_STUDY,
            *data,
            f"--config.data.path={corpus}",
            "--config.data.documents=lines",
            "--config.training.n_iters=4",
            "--config.training.ckpt_every=4",
            "--config.training.eval_every=4",
        ],
    )
    train_lib.train(teacher_config, tmp_path / "teacher", quiet=True, final=False)
    distill.distill(
        distill.distill_config(tmp_path / "teacher", [*data, "--config.distill.round_steps=2"], rounds=2),
        tmp_path / "student",
        quiet=True,
    )
    distill.distill(
        distill.distill_config(
            tmp_path / "teacher", [*data, "--config.distill.round_steps=2", "--config.distill.order=dilated"], rounds=1
        ),
        tmp_path / "planned",
        quiet=True,
    )
    result = distill_study.study(
        str(tmp_path / "teacher"),
        [str(tmp_path / "student"), str(tmp_path / "planned")],
        0,
        [4, 2],
        num_samples=4,
        repeats=1,
        eval_batches=1,
        references=("confidence", "strided"),
        exact=True,
    )
    names = (
        "teacher",
        "student round 1",
        "student round 2",
        "planned round 1",
        "teacher, confidence",
        "teacher, strided",
        "exact denoiser",
        "exact denoiser, strided",
        "exact denoiser, dilated",
    )
    assert sorted((r["label"], r["steps"]) for r in result["rows"]) == sorted((a, n) for a in names for n in (4, 2))
    samplers = {r["label"]: r["sampler"] for r in result["rows"]}
    assert (samplers["planned round 1"], samplers["student round 1"], samplers["teacher, strided"]) == (
        "dilated",
        "analytic",
        "strided",
    )
    exact = [r for r in result["rows"] if r["label"].startswith("exact")]
    for row in exact:  # the chain's own denoiser: no network, no calls
        assert row["nfe"] == 0 and row["nll_nats_per_char"] > 0
    for row in result["rows"][: -len(exact)]:
        assert row["nll_nats_per_char"] > 0 and 0 < row["unigram_bits"] <= math.log2(12) + 1e-9
        assert row["vs_ar"] > 0 and row["nfe"] <= row["steps"] + 1 and math.isfinite(row["bound_bits_per_char"])
    distill_study.write(result, tmp_path / "out")
    assert "student round 2" in (tmp_path / "out" / "distill_study.md").read_text()
    assert (tmp_path / "out" / "distill_study.png").stat().st_size > 0


def test_layout_ceiling_is_k_plus_one_over_the_call_cost():
    """A round of (k, groups) on P positions writes at most k + 1 tokens where an AR step writes one."""
    from sedd.kinds.spec import Layout

    curve = {"rows": [{"n": 1, "ratio_to_n1": 1.0}, {"n": 3, "ratio_to_n1": 2.0}, {"n": 4, "ratio_to_n1": 1.6}]}
    rows = call_cost.layout_ceiling(curve, [Layout(1, 1), Layout(1, 2), Layout(4, 5)])
    # 4,5's 25 positions and k = 4's 5 are not in the curve; k = 1 verified alone is a call on 2 positions, not here
    assert [(r["layout"], r["positions"]) for r in rows] == [("1,1", 3), ("1,2", 4)]
    assert [r["at_most_vs_ar"] for r in rows] == [pytest.approx(2 / 2.0), pytest.approx(2 / 1.6)]
    curve["rows"].append({"n": 2, "ratio_to_n1": 1.25})
    free = call_cost.layout_ceiling(curve, [Layout(1, 1)])[-1]
    assert (free["layout"], free["positions"], free["at_most_vs_ar"]) == ("k=1, drafts free", 2, pytest.approx(1.6))


@pytest.mark.slow  # a benchmark's parts end to end (trained runs, timing): behind -m slow to keep the default suite within 900 CPU s
def test_speculative_bench_parts(tmp_path):
    """bench.py speculative's parts, tiny: the call-cost curve, a block drafter's cell by each rule, the picture.

    (`bench.py speculative --quick` runs every drafter at two k, about three minutes on two shared cores.)
    """
    import argparse

    curve = call_cost.call_cost(nets.bench_config("tiny"), [1, 3], repeats=1, calls=2, batch=2)
    assert [r["n"] for r in curve["rows"]] == [1, 3] and all(np.isfinite(r["ms_per_call"]) for r in curve["rows"])
    assert curve["rows"][0]["ratio_to_n1"] == 1 and curve["batch"] == 2
    target, drafts, _ = speculative.speculative_runs(True, argparse.Namespace(target=""))
    drafts = {name: d for name, d in drafts.items() if "block" in name}
    study = speculative.bench_speculative(
        target,
        drafts,
        {},
        ks=[2],
        batches=[1],
        repeats=1,
        quality_samples=4,
        verifications=("joint", "token"),
        temperatures=(1.0, 0.0),
    )
    block_row, row, *greedy = study["rows"]
    assert [r["temperature"] for r in study["rows"]] == [1.0, 1.0, 0.0, 0.0]
    # T 0: every row writes the target's greedy text, so its quality is AR's own at T 0, whatever was kept
    greedy_nll = study["ar_by_temperature"]["0"]["nll"]
    assert all(0.5 <= r["tokens_per_call"] <= 1.5 and r["nll"] == greedy_nll for r in greedy)
    assert (block_row["verification"], row["verification"]) == ("joint", "token") and "token" in row["drafter"]
    assert row["k"] == 2 and row["drafter_calls"] == row["target_calls"] and len(row["acceptance_by_position"]) == 2
    assert 1 <= row["tokens_per_call"] <= 3 and row["quality"] == "exact_nats_per_token" and row["nll"] > 0
    assert row["vs_ar_b1"] > 0 and study["ar"]["nll_se"] > 0
    speculative.speculative_picture({"study": study}, tmp_path / "speculative.png")
    assert (tmp_path / "speculative.png").stat().st_size > 1000


@pytest.mark.slow  # the benchmark script's bookkeeping, not the library's
def test_an_auto_rows_quality_samples_use_the_first_batchs_layout(monkeypatch):
    """bench_speculative's "auto" row: its quality samples (and so its tokens a call) come from the layout chosen
    at the first batch, even when their count equals another batch timed (here 2, chosen no drafts there)."""
    import argparse

    from sedd import runs as runs_lib
    from sedd.kinds import spec as spec_kind

    target, _, _ = speculative.speculative_runs(True, argparse.Namespace(target=""))
    config = target.config.copy_and_resolve_references()  # the tiny Markov AR's config, as a spec run
    config.model.update(kind="spec", draft_k=2)
    _, net = nets.random_net(config, "spec")
    name, run = "spec", runs_lib.from_parts(config, None, net.graphdef, net.params, net.rest)

    def tune(kind, net, options, path, batch):  # as capabilities.tune, but chosen by rule: drafts at batch 1 only
        kind.layout = spec_kind.layout_of("1,2" if batch == 1 else "0", kind.draft_k)
        return f"batch {batch}: {kind.layout}"

    monkeypatch.setattr(speculative.capabilities, "tune", tune)
    study = speculative.bench_speculative(
        target, {}, {name: run}, ks=[], batches=[1, 2], repeats=1, quality_samples=2, layouts=("auto",)
    )
    (row,) = study["rows"]
    assert row["chosen"] == {"1": str(spec_kind.layout_of("1,2", None)), "2": str(spec_kind.NO_DRAFTS)}
    assert len(row["acceptance_by_position"]) == 1  # one draft a round: the samples were drawn with 1,2
    assert row["target_calls"] < run.seq_len  # fewer calls than tokens: drafts kept (no drafts: one call a token)


def test_the_best_draft_overlap_is_the_maximum_over_the_simplex():
    """speculative.best_overlap, the ceiling of how often a draft that skips a token is kept, equals the
    brute-force maximum over a fine grid of laws (V = 3), and no law on the grid beats it."""
    import itertools

    grid = np.asarray(
        [(a, b, 1.0 - a - b) for a, b in itertools.product(np.linspace(0, 1, 201), repeat=2) if a + b <= 1.0 + 1e-12]
    ).clip(0, 1)  # (G, 3)
    rng = np.random.default_rng(0)
    for _ in range(20):
        w, cond = rng.dirichlet(np.ones(3)), rng.dirichlet(np.full(3, 0.5), size=3)
        on_grid = (w[None, :] * np.minimum(cond[None], grid[:, None, :]).sum(-1)).sum(-1)  # (G,)
        best = speculative.best_overlap(w, cond)
        assert on_grid.max() - 1e-12 <= best <= on_grid.max() + 3 / 200


def test_a_spec_runs_first_drafts_are_kept_no_more_than_the_best_law_allows():
    """speculative.draft_overlap on a random spec network over the Markov data: each figure a probability,
    and the best law's at least every other law's (its own, sharpened, the mixture), position by position
    on average."""
    from sedd import runs as runs_lib
    from sedd.data import load_dataset

    config = nets.bench_config("markov", vocab_size=8, n_layers=1, hidden_size=32, n_heads=2, draft_k=2, kind="spec")
    config.data.markov.num_tokens = 20_000
    _, net = nets.random_net(config, "spec")
    run = runs_lib.from_parts(config, load_dataset(config.data).tokenizer, net.graphdef, net.params, net.rest)
    out = speculative.draft_overlap(run, sequences=2)
    figures = {name: o["mean"] for name, o in out.items()}
    assert all(0 < f <= 1 for f in figures.values()) and out["the best q"]["positions"] == 2 * 15
    assert all(figures["the best q"] >= f - 1e-9 for f in figures.values())


def _frontier_result(on_code=False):
    """A frontier result of three settings, two batches: what bench_frontier returns, by hand."""
    from experiments.benchmarks import frontier

    def row(family, setting, nll, entropy, vs1, vs4, sampler="s", steps=4):
        r = dict(run="r", family=family, setting=setting, sampler=sampler, steps=steps, options={}, nll=nll)
        r.update(nll_se=0.01, unigram_entropy_bits=entropy, calls_per_text=40.0, tokens_per_call=3.2)
        r.update(vs_ar_b1=vs1, vs_ar_b4=vs4, nll_vs_ar=nll / 2.0 - 1, entropy_vs_ar=entropy / 4.0 - 1)
        r["at_ar_quality"] = bool(
            r["nll_vs_ar"] <= frontier.NLL_BAR and abs(r["entropy_vs_ar"]) <= frontier.ENTROPY_BAR
        )
        return dict(r, parse_rate=0.5) if on_code else r

    ar = dict(nll=2.0, nll_se=0.01, unigram_entropy_bits=4.0, calls_per_text=128, tokens_per_call=1.0, parse_rate=0.4)
    rows = [
        row("block b=4", "entropy_bound max_entropy=0.5", 2.05, 3.99, 0.7, 0.5),  # +2.5%: at AR's quality
        row("ddit", "analytic", 2.5, 4.1, 2.0, 1.5),  # fast, far worse
        row("block b=4", "confidence threshold=0.7", 2.04, 3.5, 0.9, 0.6),  # entropy -12.5%: not at AR's quality
    ]
    machine = timing.machine()
    return dict(
        length=128, baseline="ar", on_code=on_code, batches=[1, 4], ar=ar, rows=rows, machine=machine, quality_samples=8
    )


def test_frontier_table_names_the_machine_and_the_fastest_setting_at_ar_quality(tmp_path):
    """The Markdown names the CPU and the bar; its rows are fastest first; the verdict is the fastest row within
    3% of AR's judged NLL and 2% of its entropy (a fast setting far worse, or with less entropy, is not)."""
    from experiments.benchmarks import frontier

    result = _frontier_result()
    best = frontier.best_at_ar_quality(result)
    assert best["setting"] == "entropy_bound max_entropy=0.5"
    md = frontier.frontier_markdown(result, "plays")
    assert result["machine"]["cpu_model"] in md and "within 3%" in md and "0.70x AR" in md
    lines = [line for line in md.splitlines() if line.startswith("| ")]
    assert lines[1].startswith("| AR's own texts") and "analytic" in lines[2] and "threshold=0.7" in lines[3]
    assert len({line.count("|") for line in lines}) == 1  # every row has the header's columns
    code = frontier.frontier_markdown(_frontier_result(on_code=True), "code")
    assert "parses" in code and "0.50" in code
    frontier.frontier_picture(result, tmp_path / "f.png")
    assert (tmp_path / "f.png").stat().st_size > 1000


def test_frontier_passes_a_tuned_runs_chosen_layout_as_the_command_line_spells_it(monkeypatch):
    """ "auto" times the layouts and passes the winner on: in the spelling its kind's layout_of reads back ("4",
    "4,5"), not its description (a head run's frontier stopped on "no drafts (the AR network alone, ...)")."""
    from types import SimpleNamespace

    from experiments.benchmarks import frontier
    from sedd.kinds import draft_head, spec

    monkeypatch.setattr(frontier.capabilities, "tune", lambda *a: None)
    for module, layouts in (
        (draft_head, [draft_head.HeadLayout(0), draft_head.HeadLayout(4)]),
        (spec, [spec.NO_DRAFTS, spec.Layout(4, 5), spec.Layout(2, 1)]),
    ):
        for lay in layouts:
            chosen = frontier._layout_chosen(SimpleNamespace(kind=SimpleNamespace(layout=lay), net=None), "auto", 1)
            assert module.layout_of(chosen, 4) == lay, (chosen, lay)
    assert frontier._layout_chosen(None, "2", 4) == "2"  # a layout given is passed as given


@pytest.mark.slow  # compiles every tiny decoder: behind -m slow to keep the default suite within its CPU budget
def test_frontier_bench_runs_every_decoder_of_tiny_runs(tmp_path):
    """bench.py frontier --quick: random AR, block and SEDD runs against an AR judge; every setting of each is a row
    with its speed against AR at both batches and its judged quality; the JSON, the Markdown and the chart."""
    out = tmp_path / "frontier.json"
    assert bench.main(["frontier", "--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    families = {r["family"] for r in result["rows"]}
    assert families == {"block b=8", "ddit"} and result["baseline"] == "ar"  # the baseline is the reference row
    for r in result["rows"]:
        assert r["vs_ar_b1"] > 0 and r["vs_ar_b4"] > 0 and math.isfinite(r["nll"]) and r["nll_se"] > 0
        assert 0 < r["unigram_entropy_bits"] <= math.log2(12) + 1e-9 and r["tokens_per_call"] > 0
    assert all(r["calls_per_text"] <= 4 + 1 for r in result["rows"] if r["family"] == "ddit")  # 4 steps + denoise
    assert "AR's own texts" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 1000
