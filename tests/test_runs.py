"""sedd.runs and the package as installed: inference without a trainer, the import graph, the wheel."""

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import jax
import ml_collections
import numpy as np
import optax
import pytest

from sedd import checkpoints, cli, figures, kinds, optim, runs, sharding, train
from sedd import config as config_lib

ROOT = Path(__file__).resolve().parent.parent


def test_inference_builds_no_optimizer(tiny_run, monkeypatch, capsys):
    workdir, data_dir = tiny_run

    def refuse(*args, **kwargs):
        raise AssertionError("inference built an optimizer or a train state")

    for name in ("adamw", "adam", "chain", "clip_by_global_norm", "MultiSteps"):
        monkeypatch.setattr(optax, name, refuse)
    monkeypatch.setattr(optim, "build_optimizer", refuse)
    monkeypatch.setattr(train.Trainer, "__init__", refuse)

    run = runs.load(workdir)
    assert run.step == 4 and run.seq_len == 32
    texts = run.generate(jax.random.key(0), 2, steps=4, prefix="ROMEO")
    assert len(texts) == 2 and all(t.startswith("ROMEO") for t in texts)
    assert run.generate(jax.random.key(0), 1, steps=4, infill="To be, or ____ to be")[0].startswith("To be, or ")
    filled = run.generate(jax.random.key(0), 1, steps=4, infill="a_c")[0]  # cut to the template's length
    assert filled[0] == "a" and filled[-1] == "c" and (len(filled) == 3 or "<|endoftext|>" in filled)
    # What the calls wrote: each text's tokens, less the prompt's (issue 84)
    _, stats = run.generate(jax.random.key(0), 2, steps=4, prefix="ROMEO", return_stats=True)
    assert stats["tokens_per_sample"].tolist() == [32, 32] and stats["written_per_sample"].tolist() == [27, 27]
    assert cli.main(["sample", "--workdir", str(workdir), "--steps", "4", "--num_samples", "1"]) == 0
    assert "network calls: 4.0 a text of 32 tokens, 8.00 tokens a call" in capsys.readouterr().err
    # An infill template: the text is the template's 3 tokens, and the calls wrote its one blank
    assert cli.main(["sample", "--workdir", str(workdir), "--steps", "4", "--num_samples", "1", "--infill", "a_c"]) == 0
    said = capsys.readouterr().err
    assert "network calls: 4.0 a text of 3 tokens, 1 of them written (2 given by the template): 0.25 tokens" in said
    assert cli.main(["eval", "--workdir", str(workdir), "--num_t", "2", "--batch_size", "4", "--max_batches", "1"]) == 0
    assert "nats_per_token" in capsys.readouterr().out


def test_sample_takes_the_sampler_by_its_name_and_a_saved_runs_old_key_reads_as_it(tiny_run, capsys):
    workdir, _ = tiny_run
    texts = []
    for sampler in ("first_hitting", "first_hitting", "analytic"):
        assert (
            cli.main(
                [
                    "sample",
                    "--workdir",
                    str(workdir),
                    "--steps",
                    "4",
                    "--num_samples",
                    "2",
                    "--seed",
                    "3",
                    "--sampler",
                    sampler,
                ]
            )
            == 0
        )
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] != texts[2]
    # Runs saved before 2026-12-06 keep their sampler in sampling.predictor: read as today's sampling.sampler.
    assert config_lib.migrate({"sampling": {"predictor": "euler"}}).sampling.sampler == "euler"
    with pytest.raises(KeyError, match="config key 'sampling.predictor' is now 'sampling.sampler'"):
        config_lib.load_config("tiny", ["--config.sampling.predictor=euler"])
    assert cli.main(["sample", "--workdir", str(workdir), "--sampler", "no_such_sampler"]) != 0


def test_animate_labels_frames_with_the_steps_of_the_run(tiny_run, monkeypatch, capsys):
    """`sedd sample --animate` labels each frame with the sampler step it shows, out of the run's steps
    (a 128-step run keeps a frame every 2 steps: [step 0/128] .. [step 128/128], not [0/64] .. [64/64])."""
    workdir, _ = tiny_run
    monkeypatch.setattr(cli.time, "sleep", lambda s: None)
    monkeypatch.setattr(cli.sys.stdout, "isatty", lambda: True)  # redrawn in place on a terminal only
    assert cli.main(["sample", "--workdir", str(workdir), "--steps", "128", "--num_samples", "1", "--animate"]) == 0
    labels = [line.rsplit("\x1b[H", 1)[1] for line in capsys.readouterr().out.splitlines() if "\x1b[H" in line]
    assert labels == [f"[step {k}/128]" for k in range(0, 129, 2)], labels
    assert cli.main(["sample", "--workdir", str(workdir), "--num_samples", "1", "--animate"]) == 0  # the config's 8
    frames = capsys.readouterr().out.split("\x1b[2J\x1b[H")[1:]
    labels = [frame.split("\n", 1)[0] for frame in frames]
    assert labels == [f"[step {k}/8]" for k in range(9)], labels
    texts = [frame.split("\n")[1] for frame in frames]  # a mask is the playground's glyph, never --infill's blank
    assert set(texts[0]) == {"\u2591"} and "\u2591" not in texts[-1] and "_" not in texts[0], texts
    # A block run's frames: each block's steps in turn, then the finished text.
    assert cli.animation_labels(2 * 3 + 1, 2, 4) == [
        "[block 1/2, step 0/4]",
        "[block 1/2, step 2/4]",
        "[block 1/2, step 4/4]",
        "[block 2/2, step 0/4]",
        "[block 2/2, step 2/4]",
        "[block 2/2, step 4/4]",
        "[2 blocks of 4 steps: done]",
    ]
    assert cli.animation_labels(65, 2, 129)[-1] == "[step 128/129]"  # the last kept state, not the 129th step


@pytest.mark.slow  # a fresh process; test_sharding's split_cpu test holds the split itself
def test_eval_splits_the_cpu_as_train_does_and_gives_the_same_bound(tiny_run, tmp_path, monkeypatch):
    """`sedd eval` makes the CPU the run's mesh.cpu_devices devices, as `sedd train` does (a fresh process:
    the split must come before any device is used), and gives the one-device bound up to float rounding."""
    workdir = tmp_path / "run"
    shutil.copytree(tiny_run[0], workdir)
    config = json.loads((workdir / runs.CONFIG).read_text())
    config["mesh"]["cpu_devices"] = 2  # 2 on any machine of 2 cores or more (more than the cores is auto)
    (workdir / runs.CONFIG).write_text(json.dumps(config))
    args = ["--num_t", "4", "--batch_size", "4", "--max_batches", "2"]
    one = figures.evaluate_run(workdir, num_t=4, batch_size=4, max_batches=2, progress=False)  # this process's devices
    # The child chooses its own device count: without a parent's --xla_force_host_platform_device_count (an
    # 8-device test session sets one, which sedd then leaves alone, as it would a user's).
    flags = " ".join(
        f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")
    )
    done = subprocess.run(
        [sys.executable, "-m", "sedd.cli", "eval", "--workdir", str(workdir), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "XLA_FLAGS": flags},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert ("this CPU as 2 devices" in done.stderr) == (sharding.available_cores() >= 2), done.stderr[-2000:]
    split = dict((k.strip(), v.strip()) for k, v in (line.split(":", 1) for line in done.stdout.splitlines()))
    for key in ("nats_per_token", "stderr_nats_per_token"):  # printed to 4 decimals
        assert float(split[key]) == pytest.approx(one[key], abs=1.5e-4), (key, split[key], one[key])
    assert split["num_sequences"] == str(one["num_sequences"]) == "8"

    # A received run's count is honoured only where it fits: dividing the batch, at most the cores; else auto.
    counts = []
    monkeypatch.setattr(figures.sharding, "available_cores", lambda: 4)
    monkeypatch.setattr(figures.sharding, "split_cpu", lambda c: counts.append(c.mesh.cpu_devices) or 0)
    given = (0, 1, 2, 4, 3, 8, 10**6, -1)
    for n in given:
        config["mesh"]["cpu_devices"] = n
        (workdir / runs.CONFIG).write_text(json.dumps(config))
        assert figures.split_cpu_for_eval(workdir, 4) == 0
    assert counts == [0, 1, 2, 4, 0, 0, 0, 0], dict(zip(given, counts))


def test_load_restores_the_saved_weights_of_any_step(tiny_run):
    workdir, _ = tiny_run
    newest, older, raw = runs.load(workdir), runs.load(workdir, step=2), runs.load(workdir, ema=False)
    assert (newest.step, older.step) == (4, 2)
    leaves = lambda r: [np.asarray(x) for x in jax.tree.leaves(r.params)]  # noqa: E731
    assert any(not np.array_equal(a, b) for a, b in zip(leaves(newest), leaves(older)))
    assert any(not np.array_equal(a, b) for a, b in zip(leaves(newest), leaves(raw)))
    # The full train state's EMA, restored through the trainer, is what load returns.
    trainer = train.Trainer(newest.config)
    state = checkpoints.restore(checkpoints.checkpoint_manager(workdir), trainer.abstract_state)
    for a, b in zip(leaves(newest), jax.tree.leaves(state["ema"])):
        np.testing.assert_array_equal(a, np.asarray(b))
    with pytest.raises(FileNotFoundError, match="no checkpoint of step 3"):
        runs.load(workdir, step=3)
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        runs.load(workdir / "nothing")


def test_generate_rejects_bad_counts_with_the_name_of_the_value(tiny_run):
    run = runs.load(tiny_run[0])
    with pytest.raises(ValueError, match="num_samples must be a positive integer, got 0"):
        run.generate(jax.random.key(0), 0)
    for steps in (0, -1):  # 0 is an error, not "the default"
        with pytest.raises(ValueError, match=f"steps must be a positive integer, got {steps}"):
            run.generate(jax.random.key(0), 1, steps=steps)
    # Another blank character leaves '_' a real character of the template.
    filled = run.generate(jax.random.key(0), 1, steps=4, infill="a_#", blank="#")[0]
    assert filled.startswith("a_") and len(filled) >= 3


# --------------------------------------------------------------------------- the import graph


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / "sedd").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(tree: ast.AST, package: str, modules) -> set[str]:
    """The sedd modules a module's imports name (`from sedd import x` names sedd.x where that is a module)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found |= {n for n in names if n in modules and n != package}
    return found


def test_no_import_cycle_and_function_level_imports_only_for_optional_dependencies():
    modules = _modules()
    graph, local = {}, []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        graph[name] = _imports(tree, name, modules)
        lines = path.read_text(encoding="utf-8").splitlines()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        where = f"{path.relative_to(ROOT)}:{node.lineno}"
                        local.append((where, lines[node.lineno - 1]))
    # A function-level import only keeps an optional dependency optional, and says so.
    for where, line in local:
        assert "optional dependency" in line, f"{where}: {line.strip()}"

    def visit(node, stack):
        for dep in graph[node]:
            assert dep not in stack, f"import cycle: {' -> '.join([*stack, dep])}"
            if dep not in done:
                visit(dep, [*stack, dep])
        done.add(node)

    done: set[str] = set()
    for name in graph:
        visit(name, [name])
    assert graph["sedd.runs"] >= {"sedd.model", "sedd.sampling"} and "sedd.train" not in graph["sedd.runs"]
    assert not any(m.startswith("experiments") for deps in graph.values() for m in deps)


# --------------------------------------------------------------------------- the wheel


@pytest.mark.slow  # builds, installs and trains from a wheel in a fresh environment: behind -m slow to keep the default suite within 900 CPU s
def test_wheel_ships_configs_and_corpus_and_trains_when_installed(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", "checkpoints", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"
        ),
    )
    # Offline: the build uses the setuptools and wheel of this environment (the [test] extra has both).
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    wheel = next((tmp_path / "dist").glob("sedd_jax-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"sedd/configs/{n}.py" for n in config_lib.shipped_configs()}
    expected |= {"sedd/data/corpus/shakespeare_plays.tar.xz", "sedd/data/corpus/README.md"}
    assert expected <= names, expected - names
    assert not any(n.startswith(("experiments/", "tests/")) for n in names)

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    env = dict(os.environ, PYTHONPATH=str(site), SEDD_DATA_DIR=str(tmp_path / "data"), JAX_PLATFORMS="cpu")
    code = (
        "import sys, sedd, sedd.cli; assert sedd.__file__.startswith(sys.argv[1]), sedd.__file__; "
        "sys.exit(sedd.cli.main(['train', '--config', 'tiny', '--workdir', 'run', "
        "'--config.training.n_iters=2', '--config.training.eval_every=2', '--config.model.n_layers=1']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(site)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "validation bound" in proc.stdout and (tmp_path / "run" / "checkpoints").is_dir()


def test_time_independent_model_scores_sigma_only_through_the_analytic_factor():
    """model.time_conditioning=False (RADD): s(x, sigma) (e^sigma - 1) is the same for every sigma."""
    config = ml_collections.ConfigDict(
        config_lib.load_config("tiny", ["--config.model.time_conditioning=False"]).to_dict()
    )
    config.vocab_size = 11
    model = kinds.build_model(config, seed=0)
    assert model.sigma_map is None
    graphdef, params, rest = kinds.abstract_network(kinds.get(config), 0)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))  # random weights: adaLN-zero would hide any sigma path
    params = jax.tree.unflatten(tree, [0.3 * jax.random.normal(k, p.shape) for k, p in zip(keys, leaves)])
    score = kinds.params_score_fn(graphdef)
    x = jax.random.randint(jax.random.key(2), (3, 16), 0, 12)  # id 11 = the mask
    scaled = [
        np.exp(np.asarray(score((params, rest), x, np.full(3, s, np.float32)), np.float64)) * np.expm1(s)
        for s in (0.05, 0.7, 4.0)
    ]
    masked = np.asarray(x) == 11
    assert masked.any()
    for other in scaled[1:]:  # the ratios out of a mask to the V tokens; the current-token entry is 1 by definition
        np.testing.assert_allclose(other[masked][:, :11], scaled[0][masked][:, :11], rtol=2e-5)

    config.graph.type = "uniform"
    with pytest.raises(ValueError, match="time_conditioning=False needs graph.type='absorbing'"):
        kinds.build_model(config)
    config.model.time_conditioning, config.model.normalize = True, True
    kinds.build_model(config)  # the uniform graph's x0 output (DUO)
    config.graph.type, config.model.scale_by_sigma = "absorbing", False
    with pytest.raises(
        ValueError,
        match="model.normalize=True needs graph.type='absorbing' with "
        "model.scale_by_sigma=True, or graph.type='uniform'",
    ) as refused:
        kinds.build_model(config)
    assert "--config.model.normalize=False gives SEDD's unnormalized score" in str(refused.value)
