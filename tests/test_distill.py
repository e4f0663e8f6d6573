"""sedd distill (SDTT): exact on a tiny law, resumed after SIGKILL to the same student, a run every command uses.

The tiny law: an order-1 Markov chain over V = 3 tokens, windows of L = 3
(``sedd.data.markov``), so every state x of the absorbing chain (D^L = 64)
can be enumerated. The teacher's two-step law from x_t is the product of
two 64 x 64 transition matrices built from its network's one-step laws (the
analytic sampler's ``staggered_score * transp_transition``, normalised),
the student's one-step law one such matrix, and their divergence is
averaged over x_t drawn exactly from the chain's forward marginal.
"""

import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sedd import checkpoints, cli, distill, runs, sampling, sdtt, train
from sedd import config as config_lib
from sedd.data.markov import MarkovChain
from sedd.graphs import Absorbing

ROOT = Path(__file__).resolve().parent.parent
V, L = 3, 3
ROUND_STEPS, CKPT_EVERY = 80, 10
CHAIN = MarkovChain(vocab_size=V, order=1, seed=0, alpha=0.3)


def _tiny(data_dir, *extra):
    return [
        "--config.data.name=markov",
        f"--config.data.markov.vocab_size={V}",
        "--config.data.markov.order=1",
        "--config.data.markov.num_tokens=20000",
        f"--config.data.seq_len={L}",
        f"--config.data.data_dir={data_dir}",
        "--config.model.n_layers=1",
        "--config.training.eval_samples=0",
        "--config.training.eval_batches=1",
        "--config.training.batch_size=32",
        "--config.sampling.sampler=analytic",
        *extra,
    ]


def _distill_overrides(data_dir):
    return [
        f"--config.data.data_dir={data_dir}",
        f"--config.distill.round_steps={ROUND_STEPS}",
        f"--config.training.ckpt_every={CKPT_EVERY}",
        "--config.training.log_every=10",
        "--config.optim.lr=1e-4",
        "--config.optim.warmup=5",
        "--config.training.batch_size=64",
        "--config.distill.target=law",
    ]  # the teacher's two-step law itself, the target the exact checks compute


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def teacher(data_dir, tmp_path_factory):
    """A SUBS teacher of the tiny chain, 120 steps, sampling with 4 steps."""
    workdir = tmp_path_factory.mktemp("teacher") / "run"
    config = config_lib.load_config(
        "tiny",
        _tiny(
            data_dir,
            "--config.training.n_iters=120",
            "--config.training.ckpt_every=120",
            "--config.training.eval_every=120",
            "--config.optim.lr=3e-3",
            "--config.sampling.steps=4",
        ),
    )
    train.train(config, workdir, quiet=True, final=False)
    return workdir


@pytest.fixture(scope="module")
def student(teacher, data_dir, tmp_path_factory):
    """Two rounds (4 -> 2 -> 1 steps) of ROUND_STEPS steps, uninterrupted: (workdir, distill's result)."""
    workdir = tmp_path_factory.mktemp("student") / "run"
    config = distill.distill_config(teacher, _distill_overrides(data_dir), rounds=2)
    return workdir, distill.distill(config, workdir, quiet=True)


# --------------------------------------------------------------------------- the exact law


def _step_laws(run, states, t, s):
    """float64[S, L, D]: the analytic sampler's step t -> s of `run` at every position of every state."""
    graph, noise = run.graph, run.noise
    sig, sig_next = (float(noise(jnp.float32(x))[0]) for x in (t, s))
    log_score = run.score_fn(jnp.asarray(states, jnp.int32), jnp.full((len(states),), sig, jnp.float32))
    x = jnp.asarray(states)
    probs = graph.staggered_score(jnp.exp(log_score), sig - sig_next) * graph.transp_transition(x, sig - sig_next)
    probs = np.maximum(np.asarray(probs, np.float64), 0.0)
    return probs / probs.sum(-1, keepdims=True)


def _joint(laws):
    """float64[S, S]: positions step independently, so the law of the next state is the product over them."""
    joint = laws[:, 0]
    for pos in range(1, L):
        joint = (joint[:, :, None] * laws[:, pos][:, None, :]).reshape(len(laws), -1)
    return joint


def _data_marginal(states, sigma: float) -> np.ndarray:
    """float64[S]: P(x_t = state) with x_0 from the chain and each token masked with probability 1 - e^-sigma."""
    keep = np.exp(-sigma)
    out = np.zeros(len(states))
    for x0 in itertools.product(range(V), repeat=L):
        hit = np.where(states == np.asarray(x0), keep, 0.0) + np.where(states == V, 1.0 - keep, 0.0)
        out += np.exp(CHAIN.log_prob(np.asarray(x0))) * hit.prod(-1)
    return out


def _kl(p, q):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(p > 0, p * (np.log(p) - np.log(np.maximum(q, 1e-300))), 0.0).sum(-1)


def exact_divergences(student, teacher, teacher_steps: int) -> dict:
    """Nats a sequence, averaged over the student's grid and x_t drawn exactly from the chain's forward marginal.

    objective: what distill.divergence = "kl_backward" minimises, E sum_l E_{x_u}[KL(p_l || q^_l)] with x_u
      enumerated (sedd.sdtt, Eq. (3));
    reverse: KL(the student's one step || the teacher's two steps), over the whole sequence;
    marginals: sum_l KL(q_l || p_l), the part of the forward KL of the whole sequence a student can change.
    """
    states = np.array(list(itertools.product(range(V + 1), repeat=L)))  # (S, L), S = (V + 1)^L
    grid = np.linspace(1.0, student.config.sampling.eps, teacher_steps + 1)
    out = {"objective": [], "reverse": [], "marginals": []}
    for k in range(0, teacher_steps, 2):
        t, u, s = grid[k], grid[k + 1], grid[k + 2]
        p1, p2 = _step_laws(teacher, states, t, u), _step_laws(teacher, states, u, s)
        p = _step_laws(student, states, t, s)
        first = _joint(p1)  # (S, S): x_t -> x_u
        two = first @ _joint(p2)
        weight = _data_marginal(states, float(student.noise(jnp.float32(t))[0]))
        objective = np.zeros(len(states))
        marginals = np.zeros(len(states))
        for pos in range(L):
            target = np.broadcast_to(p1[:, None, pos], (len(states),) * 2 + (V + 1,)).copy()  # (x_t, x_u, D)
            target[..., :V] += p1[:, None, pos, V:] * p2[None, :, pos, :V]
            target[..., V] = p1[:, None, pos, V] * p2[None, :, pos, V]
            still = first * (states[:, pos] == V)[None, :]  # (x_t, x_u): x_u drawn, position still masked
            objective += (still * _kl(p[:, None, pos], target)).sum(-1)
            law = two.reshape(len(states), *(V + 1,) * L).sum(axis=tuple(1 + j for j in range(L) if j != pos))
            marginals += _kl(law, p[:, pos])
        out["objective"].append(weight @ objective)
        out["reverse"].append(weight @ _kl(_joint(p), two))
        out["marginals"].append(weight @ marginals)
    return {k: float(np.mean(v)) for k, v in out.items()}


def test_the_step_laws_are_the_samplers_and_the_two_step_target_is_their_composition():
    """sdtt's log-space laws against the analytic sampler's formula, and Eq. (3) summed over x_u against Eq. (2)."""
    graph = Absorbing(V)
    rng = np.random.default_rng(0)
    x = jnp.asarray([[V, 0, V], [V, V, V]], jnp.int32)
    scores = [
        jnp.where(
            jax.nn.one_hot(x, V + 1, dtype=bool),
            0.0,  # log 1 at the current token
            jnp.asarray(rng.normal(size=(2, L, V + 1)) + shift, jnp.float32),
        )
        for shift in (-2.0, 1.0)
    ]
    sig, nxt = jnp.full((2, L), 2.0), jnp.full((2, L), 1.2)
    for log_score in scores:  # c S < 1 (a masked position may stay) and c S > 1 (it unmasks surely)
        mine = np.exp(np.asarray(sdtt.step_log_law(graph, log_score, x, sig, nxt)))
        probs = graph.staggered_score(jnp.exp(log_score), sig - nxt) * graph.transp_transition(x, sig - nxt)
        probs = np.maximum(np.asarray(probs), 0)
        np.testing.assert_allclose(mine, probs / probs.sum(-1, keepdims=True), atol=1e-6)
    # A position's two-step law: first step P1, then (where still masked) P2, which here does not depend on x_u.
    p1 = sdtt.step_log_law(graph, scores[0], x, sig, nxt)
    p2 = sdtt.step_log_law(graph, scores[0][:, ::-1], x, nxt, jnp.full((2, L), 0.4))
    q = np.exp(np.asarray(sdtt.two_step_log_law(graph, p1, p2)))
    e1, e2 = np.exp(np.asarray(p1)), np.exp(np.asarray(p2))
    want = e1.copy()
    want[..., :V] += e1[..., V:] * e2[..., :V]
    want[..., V] = e1[..., V] * e2[..., V]
    np.testing.assert_allclose(q, want, atol=1e-6)
    np.testing.assert_allclose(q.sum(-1), 1.0, atol=1e-6)
    x0 = np.exp(np.asarray(sdtt.x0_target(graph, sdtt.two_step_log_law(graph, p1, p2), p2)))  # SDTT's target
    np.testing.assert_allclose(x0[..., V], q[..., V], atol=1e-6)  # the law's MASK mass, P2's tokens
    np.testing.assert_allclose(
        x0[..., :V] / x0[..., :V].sum(-1, keepdims=True), e2[..., :V] / e2[..., :V].sum(-1, keepdims=True), atol=1e-5
    )
    for name in sdtt.DIVERGENCES:  # zero at equality, positive elsewhere
        assert float(jnp.abs(sdtt.divergence(name, p1, p1)).max()) < 1e-6
        assert float(sdtt.divergence(name, p1, p2)[0, 0]) > 1e-3


def test_each_round_moves_the_students_one_step_toward_its_teachers_two_steps(teacher, student):
    workdir, result = student
    t = runs.load(teacher)
    r1, r2 = runs.load(workdir, step=ROUND_STEPS), runs.load(workdir)
    assert (t.config.sampling.steps, r1.config.sampling.steps, r2.config.sampling.steps) == (4, 2, 1)
    assert runs.lineage(r2.config, r2.step) == {
        "teacher": str(teacher.resolve()),
        "teacher_step": 120,
        "round": 2,
        "rounds": 2,
        "steps": 1,
        "divergence": "kl_backward",
        "target": "law",
        "order": "random",
    }
    before, after = exact_divergences(t, t, 4), exact_divergences(r1, t, 4)  # round 1: 4 -> 2 steps
    assert after["objective"] < 0.99 * before["objective"], (before, after)  # what the round minimises
    assert after["reverse"] < 0.98 * before["reverse"], (before, after)  # the whole sequence's laws
    assert after["marginals"] < 0.8 * before["marginals"], (before, after)  # the part forward KL can change
    assert [r["steps"] for r in result["rounds"]] == [2, 1] and all(r["minutes"] > 0 for r in result["rounds"])


L4 = 4  # the planned order's test: steps that divide the length


def planned_divergences(student, teacher, steps: int) -> dict:
    """Nats a sequence for the dilated order, averaged over the student's steps and x0 from the chain, exactly.

    Step m of the student writes positions a, b of the teacher's steps 2m, 2m + 1 (one position each at
    N = L4). objective: what kl_backward minimises, KL(p_a || p1_a) + E_{y ~ p1_a} KL(p_b || p2_b(. | y));
    reverse: KL(p_a p_b || p1_a(y_a) p2_b(y_b | y_a)), the two positions' laws together.
    """
    order = np.argsort(sampling.planned_rank("dilated", L4, steps))
    grid = np.linspace(1.0, student.config.sampling.eps, steps + 1)
    x0s = np.array(list(itertools.product(range(V), repeat=L4)))  # (S, L4)
    weight = np.exp([CHAIN.log_prob(x) for x in x0s])

    def denoiser(run, x, t):
        sigma = jnp.full((len(x),), float(run.noise(jnp.float32(t))[0]), jnp.float32)
        return np.asarray(jax.nn.softmax(run.score_fn(jnp.asarray(x, jnp.int32), sigma)[..., :V], -1), np.float64)

    out = {"objective": [], "reverse": []}
    for m in range(steps // 2):
        a, b = order[2 * m], order[2 * m + 1]
        x_t = np.where(np.isin(np.arange(L4), order[: 2 * m]), x0s, V)  # (S, L4)
        p1, p = denoiser(teacher, x_t, grid[2 * m])[:, a], denoiser(student, x_t, grid[2 * m])  # (S, V), (S, L4, V)
        p2 = np.stack(
            [denoiser(teacher, np.where(np.arange(L4) == a, y, x_t), grid[2 * m + 1])[:, b] for y in range(V)], 1
        )  # (S, y_a, V)
        objective = _kl(p[:, a], p1) + (p1 * _kl(p[:, None, b], p2)).sum(-1)
        pair = p[:, a, :, None] * p[:, b, None, :]  # (S, V, V)
        reverse = _kl(pair.reshape(len(x0s), -1), (p1[:, :, None] * p2).reshape(len(x0s), -1))
        out["objective"].append(weight @ objective)
        out["reverse"].append(weight @ reverse)
    return {k: float(np.mean(v)) for k, v in out.items()}


@pytest.mark.slow  # a second trained teacher and round (the first test's law with the dilated plan): 900 CPU s
def test_a_planned_round_moves_the_students_one_step_toward_its_teachers_two_steps(data_dir, tmp_path):
    """distill.order='dilated': one round (4 -> 2 steps of the dilated sampler) lowers the exact divergences."""
    teacher = tmp_path / "teacher"
    train.train(
        config_lib.load_config(
            "tiny",
            _tiny(
                data_dir,
                f"--config.data.seq_len={L4}",
                "--config.training.n_iters=120",
                "--config.optim.lr=3e-3",
                "--config.training.ckpt_every=120",
                "--config.training.eval_every=120",
                "--config.sampling.steps=4",
            ),
        ),
        teacher,
        quiet=True,
    )
    workdir = tmp_path / "student"
    config = distill.distill_config(
        teacher, [*_distill_overrides(data_dir), "--config.distill.order=dilated"], rounds=1
    )
    assert config.sampling.sampler == "dilated" and config.sampling.steps == 2
    distill.distill(config, workdir, quiet=True)
    t, s = runs.load(teacher), runs.load(workdir)
    before, after = planned_divergences(t, t, 4), planned_divergences(s, t, 4)
    print(f"dilated order, nats a sequence: teacher as its own student {before}, after one round {after}")
    assert after["objective"] < 0.95 * before["objective"], (before, after)
    assert after["reverse"] < 0.95 * before["reverse"], (before, after)
    assert runs.lineage(s.config, s.step)["order"] == "dilated"
    out = s.sample(jax.random.key(0), 4, return_stats=True)  # the dilated sampler, 2 steps: 2 calls
    assert int(out.stats["nfe"]) == 2 and out.tokens.shape == (4, L4)


@pytest.mark.slow  # a fault run: SIGKILL mid-round, then resume (train's own resume is tested by default in test_faults.py): behind -m slow to keep the default suite within 900 CPU s
def test_resume_after_sigkill_mid_round_gives_the_same_student(teacher, student, data_dir, tmp_path):
    straight, _ = student
    workdir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "sedd.cli",
        "distill",
        "--teacher",
        str(teacher),
        "--workdir",
        str(workdir),
        "--rounds",
        "2",
        *_distill_overrides(data_dir),
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trigger = workdir / runs.CHECKPOINTS / str(ROUND_STEPS + CKPT_EVERY)  # a checkpoint inside round 2
    deadline = time.monotonic() + 300
    while not trigger.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    newest = checkpoints.checkpoint_manager(workdir).latest_step()
    assert newest is not None and ROUND_STEPS < newest < 2 * ROUND_STEPS, newest  # killed inside round 2
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and f"resumed {workdir} at step {newest}" in out.stdout, out.stdout + out.stderr
    a = checkpoints.restore(checkpoints.checkpoint_manager(straight), _abstract(straight))
    b = checkpoints.restore(checkpoints.checkpoint_manager(workdir), _abstract(workdir))
    assert set(a) == set(b) >= {"params", "ema", "teacher", "opt_state"}
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _abstract(workdir):
    return distill.DistillTrainer(runs.read_config(workdir)).abstract_state


def test_a_distilled_run_samples_evaluates_and_serves(student, capsys):
    workdir, _ = student
    assert cli.main(["sample", "--workdir", str(workdir), "--num_samples", "2", "--seed", "1"]) == 0
    texts = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("---")]
    assert len(texts) == 2 and all(len(t) == L and set(t) <= set("abc") for t in texts)
    assert cli.main(["eval", "--workdir", str(workdir), "--num_t", "4", "--max_batches", "1", "--batch_size", "8"]) == 0
    assert "bits_per_token" in capsys.readouterr().out
    run = runs.load(workdir)
    stats = run.sample(jax.random.key(0), 4, return_stats=True).stats  # the last round's one step and the denoise
    assert int(stats["nfe"]) <= 2
    for sampler in ("euler", "first_hitting", "confidence"):  # any registered sampler
        assert len(run.generate(jax.random.key(0), 2, sampler=sampler)) == 2
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from sedd import serve

    with TestClient(serve.create_app(run, "student"), base_url="http://localhost") as client:
        r = client.post("/v1/completions", json={"prompt": "a", "max_tokens": 2, "seed": 0})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"][0]["text"]) <= 2


def test_distill_refuses_what_it_cannot_distill_in_one_line(teacher, tmp_path, capsys):
    def refused(argv, message):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err

    base = ["distill", "--teacher", str(teacher), "--workdir", str(tmp_path / "out")]
    refused([*base, "--rounds", "3"], "N0 must divide by 2^rounds")  # 4 steps halve twice
    refused([*base, "--rounds", "2", "--config.distill.divergence=js"], "distill.divergence='js'")
    refused([*base, "--rounds", "2", "--config.model.hidden_size=64"], "model.hidden_size cannot change")
    refused([*base, "--rounds", "2", "--config.training.ckpt_every=7"], "must divide distill.round_steps")
    refused([*base, "--rounds", "2", "--config.distill.order=left"], "distill.order='left'")
    refused([*base, "--rounds", "2", "--config.distill.order=dilated"], "must divide data.seq_len=3")  # L / N
    for key, value, message in (
        ("graph", {"type": "uniform"}, "needs graph.type='absorbing'"),
        ("model", {"kind": "ar"}, "has no denoising steps to distill"),
    ):
        other = tmp_path / key
        other.mkdir()
        saved = json.loads((teacher / runs.CONFIG).read_text())
        saved[key].update(value)
        (other / runs.CONFIG).write_text(json.dumps(saved))
        (other / runs.CHECKPOINTS / "1").mkdir(parents=True)
        refused(["distill", "--teacher", str(other), "--workdir", str(tmp_path / "out")], message)
    assert not (tmp_path / "out").exists()  # refused before any work


def test_block_diffusion_distils_within_its_blocks():
    """The block kind's noise groups are its blocks: each at its own t, given the clean blocks before it."""
    import ml_collections

    from sedd import kinds

    config = ml_collections.ConfigDict(
        {
            "vocab_size": 5,
            **config_lib.load_config(
                "tiny",
                [
                    "--config.model.kind=block",
                    "--config.model.block_size=4",
                    "--config.data.seq_len=8",
                    "--config.model.n_layers=1",
                ],
            ).to_dict(),
        }
    )
    kind = kinds.get(config)
    model = kind.network(0)
    groups, fn = kind.noise_groups(model)
    assert groups == 4
    x0 = jax.random.randint(jax.random.key(0), (3, 8), 0, 5)
    loss = sdtt.loss_per_position(
        jax.random.key(1),
        fn,
        fn,
        kind.graph,
        kind.noise,
        x0,
        jnp.float32(0.25),
        block_size=groups,
        t_min=1e-3,
        t_end=1e-5,
    )
    assert loss.shape == (3, 8) and bool(jnp.all(jnp.isfinite(loss))) and bool(jnp.all(loss >= -1e-6))
    config.distill.update(teacher="teacher", rounds=1, teacher_steps=2, order="dilated")
    with pytest.raises(ValueError, match="denoises in blocks"):  # a planned order is of the whole sequence
        distill.check_distillable(config)
    config.model.kind = "ar"
    with pytest.raises(ValueError, match="no denoising steps to distill"):
        distill.check_distillable(config)
