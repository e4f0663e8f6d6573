"""End-to-end runs of the tiny config: training, checkpoints, resume, CLI, bad input."""

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sedd import checkpoints, cli, kernels, kinds, optim, runs
from sedd import config as config_lib
from sedd import progress
from sedd import train as train_lib

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


def tiny(data_dir, **overrides):
    overrides = {"data.data_dir": data_dir, **overrides}
    return config_lib.load_config("tiny", [f"--config.{k}={v}" for k, v in overrides.items()])


def read_metrics(workdir):
    return [json.loads(line) for line in (Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def test_a_sampler_the_graph_cannot_run_fails_before_training(data_dir, tmp_path):
    c = tiny(data_dir, **{"graph.type": "uniform", "noise.type": "geometric"})  # sampling.sampler: entropy_bound
    with pytest.raises(
        ValueError,
        match="sampling.sampler='entropy_bound' runs on the absorbing graph.*--config.sampling.sampler=analytic",
    ):
        train_lib.train(c, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run" / "checkpoints").exists()
    with pytest.raises(ValueError, match="unknown sampling.sampler 'tweedie'"):
        train_lib.train(tiny(data_dir, **{"sampling.sampler": "tweedie"}), tmp_path / "run2", quiet=True)


@pytest.mark.dtypes  # end to end: .ci/run runs it again in the other compute dtype
@pytest.mark.parametrize(
    "graph", ["absorbing", pytest.param("uniform", marks=pytest.mark.slow)]
)  # uniform: slow, 900 CPU s
def test_tiny_run_end_to_end(graph, data_dir, tmp_path):
    c = tiny(
        data_dir,
        **{
            "graph.type": graph,
            "training.n_iters": 6,
            "training.log_every": 3,
            "training.eval_every": 6,
            "noise.type": "geometric" if graph == "uniform" else "loglinear",
            # the default's surest-first sampler unmasks: the uniform graph takes SEDD's Tweedie
            "sampling.sampler": "analytic" if graph == "uniform" else "entropy_bound",
        },
    )
    result = train_lib.train(c, tmp_path / "run", quiet=True)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [3, 6]
    for r in rows:
        assert np.isfinite(r["loss_nats_per_token"]) and r["loss_nats_per_token"] > 0
        assert {"grad_norm", "lr", "tokens_per_s", "loss_bits_per_token", "loss_bits_per_char"} <= set(r)
    assert "val_estimate_bits_per_char" in rows[-1] and np.isfinite(result["val_estimate_bits_per_char"])
    bound = result["bound"]
    assert bound["kind"] == "ddit" and bound["num_sequences"] == 2 * 8 and bound["stderr_nats_per_token"] > 0
    assert result["step"] == 6 and len(result["samples"][0]) > 0
    assert (tmp_path / "run" / "tokenizer.json").exists() and (tmp_path / "run" / "config.json").exists()
    assert checkpoints.checkpoint_manager(tmp_path / "run").latest_step() == 6


@pytest.mark.dtypes  # end to end: .ci/run runs it again in the other compute dtype
def test_checkpoint_round_trip(data_dir, tmp_path):
    c = tiny(data_dir, **{"training.n_iters": 3, "training.ckpt_every": 3})
    result = train_lib.train(c, tmp_path / "run", quiet=True, final=False)  # the checkpoint is what it reads
    assert result["step"] == 3 and not {"bound", "samples"} & set(result), result  # final=False: neither made
    run = runs.load(tmp_path / "run")
    trainer = train_lib.Trainer(run.config)
    state = checkpoints.restore(checkpoints.checkpoint_manager(tmp_path / "run"), trainer.abstract_state)
    assert int(state["step"]) == 3 and run.step == 3
    ema = run.params
    # The restored EMA is the saved one, and differs from the initial weights.
    for a, b in zip(jax.tree.leaves(ema), jax.tree.leaves(state["ema"])):
        np.testing.assert_array_equal(a, b)
    init = trainer.init_state()["params"]
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(init), jax.tree.leaves(state["params"])))


def _cli_train(workdir, data_dir, *extra):
    cmd = [
        sys.executable,
        "-m",
        "sedd.cli",
        "train",
        "--config",
        "tiny",
        "--workdir",
        str(workdir),
        f"--config.data.data_dir={data_dir}",
        "--config.training.n_iters=16",
        "--config.training.log_every=1",
        "--config.training.eval_every=100",
        "--config.training.ckpt_every=100",
        *extra,
    ]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.dtypes  # end to end: .ci/run runs it again in the other compute dtype
@pytest.mark.slow
def test_sigterm_then_resume_matches_an_uninterrupted_run(data_dir, tmp_path):
    """Stop a run with SIGTERM; the same command resumes, and the losses equal a straight run's.

    Slow (three `sedd train` processes); the default suite has Ctrl-C sent to a real process and an
    exact resume (tests/test_faults.py), and experiments/faults.py repeats SIGTERM and SIGKILL trials."""
    straight = _cli_train(tmp_path / "a", data_dir)
    assert straight.wait(timeout=300) == 0, straight.stdout.read()

    run = _cli_train(tmp_path / "b", data_dir, "--config.training.n_iters=16")
    metrics = tmp_path / "b" / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 2):
        time.sleep(0.05)
    run.send_signal(signal.SIGTERM)
    out = run.communicate(timeout=120)[0]
    assert run.returncode == 0, out
    stopped_at = checkpoints.checkpoint_manager(tmp_path / "b").latest_step()
    assert stopped_at is not None and stopped_at < 16, out
    resumed = _cli_train(tmp_path / "b", data_dir)
    out = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0 and f"resumed {tmp_path / 'b'} at step {stopped_at}" in out, out

    a = {r["step"]: r["loss_nats_per_token"] for r in read_metrics(tmp_path / "a")}
    b = {r["step"]: r["loss_nats_per_token"] for r in read_metrics(tmp_path / "b")}
    assert sorted(b) == sorted(a) == list(range(1, 17))
    np.testing.assert_allclose([b[s] for s in a], [a[s] for s in a], rtol=1e-6)


def test_unknown_config_key_and_bad_value():
    with pytest.raises(KeyError, match="'training.n_iter'; did you mean 'training.n_iters'"):
        config_lib.load_config("tiny", ["--config.training.n_iter=5"])
    with pytest.raises(ValueError, match="n_iters=many"):
        config_lib.load_config("tiny", ["--config.training.n_iters=many"])
    with pytest.raises(ValueError, match="overrides look like"):
        config_lib.load_config("tiny", ["--steps=3"])
    for stray in (["optim.lr=1"], ["--config.optim.lr", "1", "2"], ["--config."]):  # were dropped without a word
        with pytest.raises(ValueError, match=f"unexpected argument '{stray[-1]}'"):
            config_lib.load_config("tiny", stray)
    assert config_lib.load_config("tiny", ["--config.optim.lr", "1"]).optim.lr == 1.0  # the two-argument form
    c = config_lib.load_config("tiny", ["--config.optim.lr=1", "--config.data.path=1e-3"])
    assert c.optim.lr == 1.0 and isinstance(c.optim.lr, float) and c.data.path == "1e-3"
    with pytest.raises(FileNotFoundError, match="shipped configs"):
        config_lib.load_config("no_such_config")
    with pytest.raises(ValueError, match=r"training.eval_every=0 must be an integer >= 1"):  # was a ZeroDivisionError
        train_lib.train(config_lib.load_config("tiny", ["--config.training.eval_every=0"]), "/nonexistent/never/made")
    with pytest.raises(ValueError, match="model.dtype='float16': expected one of auto, float32, bfloat16"):
        kernels.compute_dtype("float16")


def test_cli_errors_are_clear(data_dir, tmp_path, capsys):
    assert cli.main(["train", "--config", "tiny", "--workdir", str(tmp_path / "r"), "--config.model.hiden_size=3"]) == 2
    assert "unknown config key 'model.hiden_size'; did you mean 'model.hidden_size'?" in capsys.readouterr().err
    missing = tmp_path / "nope.txt"
    assert (
        cli.main(
            [
                "train",
                "--config",
                "tiny",
                "--workdir",
                str(tmp_path / "r"),
                "--config.data.name=text",
                f"--config.data.path={missing}",
                f"--config.data.data_dir={data_dir}",
            ]
        )
        == 2
    )
    assert str(missing) in capsys.readouterr().err
    assert cli.main(["sample", "--workdir", str(tmp_path / "untrained")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert cli.main(["eval", "--workdir", str(tmp_path / "untrained")]) == 2
    assert "untrained" in capsys.readouterr().err


def test_own_text_file_prompts_and_bad_checkpoints(data_dir, tmp_path, capsys):
    """Train on a user's file with one override; prompts; corrupt and incompatible checkpoints."""
    corpus = tmp_path / "mine.txt"
    corpus.write_text("the cat sat on the mat. " * 400)
    workdir = tmp_path / "run"
    args = [
        "train",
        "--config",
        "tiny",
        "--workdir",
        str(workdir),
        f"--config.data.path={corpus}",
        f"--config.data.data_dir={data_dir}",
        "--config.training.n_iters=4",
        "--config.training.ckpt_every=2",
        "--config.model.n_layers=1",
    ]  # one block: a user's file and its prompts do not depend on depth
    assert cli.main(args) == 0
    assert "for the unigram law of the training data" in capsys.readouterr().out

    # Prompts: prefix works; a character outside the vocabulary and a too-long prompt are clear errors.
    assert (
        cli.main(["sample", "--workdir", str(workdir), "--prefix", "the cat", "--num_samples", "2", "--steps", "4"])
        == 0
    )
    printed = capsys.readouterr()
    samples = [s.split("\n", 1)[1] for s in printed.out.split("--- sample ")[1:]]
    assert len(samples) == 2 and all(s.startswith("the cat") for s in samples), samples
    # 4 steps, each one call, wrote the 25 tokens after the prompt's 7 (issue 84: not 32 tokens a call of 4)
    assert (
        "network calls: 4.0 a text of 32 tokens, 25 of them written (7 given by the prompt): 6.25 tokens" in printed.err
    )
    assert cli.main(["sample", "--workdir", str(workdir), "--prefix", "the dog!"]) == 2
    assert "'d'" in capsys.readouterr().err
    assert cli.main(["sample", "--workdir", str(workdir), "--prefix", "the " * 40]) == 2
    assert "sequence length of 32 tokens" in capsys.readouterr().err

    # The likelihood bound of the run, through `sedd eval`.
    assert cli.main(["eval", "--workdir", str(workdir), "--num_t", "4", "--batch_size", "4", "--max_batches", "1"]) == 0
    assert "bits_per_char" in capsys.readouterr().out

    # An incompatible config against an existing run: clear error naming the keys, nothing touched.
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    assert cli.main(args + ["--config.model.hidden_size=64"]) == 2
    assert "model.hidden_size: saved 32, now 64" in capsys.readouterr().err
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before

    # A corrupt newest checkpoint is skipped with a warning naming it; with none readable, a clear
    # error naming each. Sampling never touches the run directory.
    for step in (4, 2):
        for f in (workdir / "checkpoints" / str(step)).rglob("*"):
            if f.is_file():
                f.write_bytes(b"garbage")
        before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
        code = cli.main(["sample", "--workdir", str(workdir), "--num_samples", "1", "--steps", "2"])
        err = capsys.readouterr().err
        assert "sedd: warning: skipped the checkpoint of step 4" in err and "Using step 2" in err if step == 4 else True
        assert code == (0 if step == 4 else 2), err
        assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before
    assert "no checkpoint in" in err and "step 4:" in err and "step 2:" in err and "left as it is" in err


@pytest.mark.dtypes  # end to end: .ci/run runs it again in the other compute dtype
def test_train_names_its_dtype_times_its_steps_and_marks_its_samples(data_dir, tmp_path, capsys):
    """`sedd train` says which dtype "auto" chose and why, then its steps/s and ETA once compiled; its
    samples are marked as `sedd sample` marks them."""
    args = [
        "train",
        "--config",
        "tiny",
        "--workdir",
        str(tmp_path / "run"),
        f"--config.data.data_dir={data_dir}",
        "--config.model.dtype=auto",
        "--config.training.n_iters=17",
        "--config.training.eval_every=100",
        "--config.training.ckpt_every=100",
        "--config.model.n_layers=1",
    ]
    assert cli.main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert train_lib.dtype_line("auto") in lines, lines
    speed = [line for line in lines if line.startswith("speed: ")]
    assert len(speed) == 1, lines
    rate = re.fullmatch(
        r"speed: (\S+) steps/s \(steps 6-15, compilation excluded\); the 2 steps left take about "
        r"\d+ s, evaluations and the final bound not counted \(re-estimated at each evaluation\)",
        speed[0],
    )
    assert rate and float(rate[1]) > 0, speed
    assert lines.index(speed[0]) < lines.index("--- sample 0")


def test_dtype_line_says_what_auto_chose_and_why(monkeypatch):
    if jax.default_backend() != "cpu":
        pytest.skip("the CPU's reasons")
    monkeypatch.setattr(kernels, "cpu_has_bfloat16_dots", lambda: True)
    assert train_lib.dtype_line("auto").startswith(
        "compute dtype bfloat16 (model.dtype='auto': this CPU has AVX512-BF16 or AMX-BF16;"
    )
    monkeypatch.setattr(kernels, "cpu_has_bfloat16_dots", lambda: False)
    assert train_lib.dtype_line("auto").startswith(
        "compute dtype float32 (model.dtype='auto': no AVX512-BF16 or AMX-BF16 on this CPU"
    )
    assert train_lib.dtype_line("bfloat16") == "compute dtype bfloat16 (model.dtype='bfloat16')"


def test_pace_times_plain_steps_only():
    state = {"step": jnp.zeros((), jnp.int32)}
    pace = progress.Pace(n_iters=30, window=3, settle=0)
    said = {s: pace.update(s, state, busy=s in (1, 4)) for s in range(1, 31)}  # 1 compiles, 4 evaluates
    assert [s for s, line in said.items() if line] == [7], said
    assert said[7].startswith("speed: ") and "(steps 5-7, compilation excluded); the 23 steps left" in said[7]
    pace = progress.Pace(n_iters=30, window=3, settle=2)  # the window opens 2 plain steps after a busy one
    said = {s: pace.update(s, state, busy=s in (1, 4)) for s in range(1, 31)}
    assert [s for s, line in said.items() if line] == [9], said
    assert "(steps 7-9, compilation excluded); the 21 steps left" in said[9]
    for n_iters, lines in ((8, []), (9, [8])):  # the window is steps 6-8: a line only where steps are left after it
        pace = progress.Pace(n_iters=n_iters, window=3, settle=4)
        assert [s for s in range(1, n_iters + 1) if pace.update(s, state, busy=s == 1)] == lines
    pace = progress.Pace(n_iters=5, window=10)
    assert not any([pace.update(s, state, busy=s == 1) for s in range(1, 6)])
    assert progress.Pace(30, active=False).update(1, state, busy=True) is None
    assert [progress.format_duration(s) for s in (42.4, 785, 7620)] == ["42 s", "13 min 5 s", "2 h 7 min"]


def test_pace_re_estimates_the_time_left_as_the_pace_changes():
    """On a fake clock: 1 s a step for the first 300 steps, then 0.25 s; the time left the pace gives follows
    the new pace within about a hundred steps, and evaluations (busy steps, 30 s each) are not counted."""
    now = [0.0]
    state = {"step": jnp.zeros((), jnp.int32)}
    pace = progress.Pace(n_iters=1000, window=10, settle=4, clock=lambda: now[0])
    said, left = {}, {}
    for step in range(1, 1001):
        now[0] += (1.0 if step <= 300 else 0.25) + (30.0 if step % 250 == 0 else 0.0)
        said[step] = pace.update(step, state, busy=step == 1 or step % 250 == 0)
        left[step] = pace.left(step)
    first = [(s, line) for s, line in said.items() if line]
    assert [s for s, _ in first] == [15] and "the 985 steps left take about 16 min 25 s" in first[0][1], first
    assert left[14] is None and left[1000] is None

    def seconds(line):  # "12 min 30 s" -> 750
        m = re.search(r"steps left take about (?:(\d+) min )?(\d+) s,", line)
        return 60 * int(m[1] or 0) + int(m[2])

    assert left[250].startswith("speed: 1 steps/s lately; the 750 steps left take about 12 min 30 s,"), left[250]
    # The estimate over the truth (0.25 s a step) 100, 200 and 450 steps after the change: a moving average
    # whose newest 10-step window weighs 0.1 keeps 0.9^k of the old pace after k windows.
    ratios = [seconds(left[s]) / (0.25 * (1000 - s)) for s in (400, 500, 750)]
    assert 1.8 < ratios[0] < 2.4 and 1.2 < ratios[1] < 1.5 and 0.98 < ratios[2] < 1.05, ratios


def test_adaln_lr_scale_scales_only_the_adaln_kernels_updates():
    """optim.adaln_lr_scale multiplies the AdamW update of the adaLN modulation kernels, nothing else."""
    import ml_collections

    config = ml_collections.ConfigDict(tiny("/nonexistent", **{"optim.weight_decay": 0.01}).to_dict())
    config.vocab_size = 11
    from flax import nnx

    params = nnx.state(kinds.build_model(config), nnx.Param)
    grads = jax.tree.map(lambda p: np.full(p.shape, 0.5, np.float32), params)
    mask = optim.is_adaln_kernel(params)
    assert sum(jax.tree.leaves(mask)) == config.model.n_layers + 1  # every block's and the final layer's
    updates = {}
    for scale in (1.0, 0.1):
        config.optim.adaln_lr_scale = scale
        tx, schedule = optim.build_optimizer(config)
        state, update = tx.init(params), jax.jit(tx.update)
        for _ in range(3):  # past warmup's first step (lr 0): the clipped gradient then moves every weight
            u, state = update(grads, state, params)
        updates[scale] = u
    for m, a, b in zip(jax.tree.leaves(mask), jax.tree.leaves(updates[1.0]), jax.tree.leaves(updates[0.1])):
        assert np.abs(np.asarray(a)).max() > 0
        np.testing.assert_allclose(np.asarray(b), np.asarray(a) * (0.1 if m else 1.0), rtol=1e-6)
    config.optim.adaln_lr_scale = 0.0
    with pytest.raises(ValueError, match="adaln_lr_scale must be > 0"):
        optim.build_optimizer(config)


def test_muon_orthogonalises_the_layers_matrices_and_adamw_takes_the_rest():
    """optim.optimizer = "muon": each layer matrix moves by lr_muon 0.2 sqrt(max dim) NS(g), NS(g) ~ U V^T of
    g = U S V^T; every other parameter by AdamW's, a step of about lr sign(g) for a constant g."""
    import ml_collections
    import optax
    from flax import nnx

    config = ml_collections.ConfigDict(
        tiny(
            "/nonexistent",
            **{
                "optim.optimizer": "muon",
                "optim.muon_lr_scale": 3.0,
                "optim.warmup": 1,
                "optim.schedule": "constant",
                "optim.adaln_lr_scale": 1.0,
            },
        ).to_dict()
    )
    config.vocab_size = 11
    params = nnx.state(kinds.build_model(config), nnx.Param)
    rng = np.random.default_rng(0)

    def gradient(p):  # singular values spread over 1e-1..1e1 (a matrix), or normal entries
        if p.ndim != 2:
            return rng.normal(size=p.shape).astype(np.float32)
        u, _ = np.linalg.qr(rng.normal(size=(p.shape[0], min(p.shape))))
        v, _ = np.linalg.qr(rng.normal(size=(p.shape[1], min(p.shape))))
        return (u * np.logspace(-1, 1, min(p.shape)) @ v.T).astype(np.float32)

    grads = jax.tree.map(gradient, params)
    specs = optim.muon_dimensions(params)
    flat = jax.tree_util.tree_flatten_with_path(
        specs, is_leaf=lambda s: s is None or isinstance(s, optax.contrib.MuonDimensionNumbers)
    )[0]
    is_muon = jax.tree.unflatten(jax.tree.structure(params), [s is not None for _, s in flat])
    paths = [jax.tree_util.keystr(p) for p, s in flat if s is not None]
    assert len(paths) == 4 * config.model.n_layers and all("layers" in p and "kernel" in p for p in paths)
    tx, _ = optim.build_optimizer(config)
    state, update = tx.init(params), jax.jit(tx.update)
    for _ in range(2):  # the second step has the full lr (warmup 1)
        u, state = update(grads, state, params)
    lr = config.optim.lr
    for m, g, d in zip(jax.tree.leaves(is_muon), jax.tree.leaves(grads), jax.tree.leaves(u)):
        g, d = np.asarray(g), np.asarray(d)
        if not m:
            # (N)Adam's m / sqrt(v) with the same g twice: one step size for every element, about lr
            # (optax's muon gives its AdamW Muon's Nesterov momentum: 1.157 lr at the second step).
            big = np.abs(g) > 1e-2 * np.sqrt(np.mean(g**2))  # where Adam's eps is negligible beside the clipped g
            np.testing.assert_allclose(d[big], -1.157 * lr * np.sign(g[big]), rtol=1e-3)
            continue
        step = -d / (3.0 * lr * 0.2 * np.sqrt(max(g.shape)))  # NS(mu) for the momentum mu, which is along g
        singular = np.linalg.svd(step, compute_uv=False)
        assert 0.5 < singular.min() and singular.max() < 1.3, singular  # orthogonalised: all directions alike
        uu, _, vt = np.linalg.svd(g, full_matrices=False)
        cos = (step * (uu @ vt)).sum() / np.linalg.norm(step) / np.linalg.norm(uu @ vt)
        assert cos > 0.95, cos
    config.optim.optimizer = "sgd"
    with pytest.raises(ValueError, match="optim.optimizer='sgd': expected one of adamw, muon"):
        optim.build_optimizer(config)
    config.optim.optimizer, config.optim.muon_lr_scale = "muon", 0.0
    with pytest.raises(ValueError, match="optim.muon_lr_scale must be > 0, got 0.0"):
        optim.build_optimizer(config)


@pytest.mark.slow  # the end-to-end tests marked dtypes run in bfloat16 in .ci/run's dtype check: behind -m slow to keep the default suite within 900 CPU s
def test_bfloat16_run_trains_evaluates_samples_and_serves(data_dir, tmp_path):
    """model.dtype "auto" where it is bfloat16 (the default on bfloat16 CPUs and accelerators), end to end."""
    if kernels.compute_dtype("auto") != jnp.bfloat16:
        pytest.skip("model.dtype 'auto' is float32 on this machine (no bfloat16 dot instructions)")

    c = tiny(
        data_dir, **{"model.dtype": "auto", "training.n_iters": 2, "training.eval_every": 2, "training.ckpt_every": 2}
    )
    result = train_lib.train(c, tmp_path / "run", quiet=True)
    assert np.isfinite(result["bound"]["bits_per_char"]) and result["bound"]["bits_per_char"] > 0
    run = runs.load(tmp_path / "run")
    assert run.model.dtype == jnp.bfloat16 and runs.read_config(tmp_path / "run").model.dtype == "auto"
    x = run.sample(jax.random.key(0), 2, steps=4).tokens
    assert x.shape == (2, c.data.seq_len) and int(x.max()) < run.config.vocab_size
    # The server's rows, vmapped over the batch with a reduced skip predicate.
    length = c.data.seq_len
    program = run.kind.lane_program(run.graphdef, steps=4, sampler="analytic", trajectory=False, live=False)
    ids, _, nfe = program.fn(
        (run.params, run.rest),
        jnp.zeros(3, jnp.uint32),
        jnp.arange(3, dtype=jnp.uint32),
        jnp.zeros((3, length), bool),
        jnp.zeros((3, length), jnp.int32),
        jnp.ones(3),
        jnp.ones(3),
        jnp.zeros((), jnp.int32),
        **program.static,
    )
    assert ids.shape == (3, length) and int(ids.max()) < run.config.vocab_size and int(nfe[0]) > 0
