"""An AR run's draft head (``sedd.kinds.draft_head``): drafts that read the verifier's token, the AR network's law.

A random AR network with a head over V = 3 tokens and L = 6 positions: its
rounds draw the network's exact law (all 3^6 sequences, with temperature,
top-p and a prompt) and its greedy text at temperature 0; the head's drafts at
sampling time are (1) of the module on the features the training forward
computes (an off-by-one there would keep the law and lose the speed, so it is
checked on its own); the loss is the AR NLL plus the head's cross-entropy,
which gives the AR network no gradient; a tiny run trains and samples; and a
spec run with a head written before the head moved loads as the AR run it was.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import reference
from sedd.kinds import causal, draft_head
from sedd.sampling import shaped_law

V, L, N = 3, 6, 15_000
SEQS = reference.all_sequences(V, L)


@functools.lru_cache(maxsize=None)
def _tiny(k: int = 2, width: int = 16):
    """A tiny AR network with a draft head of `width` over V = 3, L = 6 (weights perturbed)."""
    import ml_collections

    from sedd import config as config_lib
    from sedd import kinds

    config = config_lib.load_config(
        "tiny",
        [
            "--config.model.kind=ar",
            "--config.model.n_layers=1",
            f"--config.model.draft_k={k}",
            f"--config.data.seq_len={L}",
            f"--config.model.draft_head={width}",
        ],
    )
    config = ml_collections.ConfigDict(config.to_dict())
    config.vocab_size = V
    kind = kinds.get(config)
    graphdef, params, rest = nnx.split(kind.network(0), nnx.Param, ...)
    return kind, graphdef, (reference.perturbed(params, 0.1, 7), rest)


def _law(graphdef, state, temperature=1.0, top_p=1.0) -> np.ndarray:
    """The AR network's exact law over all 3^6 sequences, temperature and top-p on its conditionals."""
    model = nnx.merge(graphdef, *state)
    out = causal.next_token_logits(model, jnp.asarray(SEQS))
    probs = np.asarray(shaped_law(out, temperature, top_p), np.float64)  # (V^L, L, V)
    law = np.prod(np.take_along_axis(probs, SEQS[..., None], -1)[..., 0], axis=1)
    return law / law.sum()


@pytest.mark.parametrize(  # token verification with a shaped law behind -m slow: the default suite's 900 CPU s
    "k,temperature,top_p,verification",
    [(2, 1.0, 1.0, "joint"), pytest.param(3, 0.7, 0.9, "token", marks=pytest.mark.slow)],
)
def test_head_drafts_keep_the_ar_networks_law(k, temperature, top_p, verification):
    """Over all 3^6 sequences the text's law is the AR network's within the sampling noise, and drafts are kept."""
    _, graphdef, state = _tiny(k)
    law = _law(graphdef, state, temperature, top_p)
    text, stats = draft_head.speculate(
        jax.random.key(3),
        graphdef,
        state,
        N,
        L,
        draft_head.HeadLayout(k),
        temperature=temperature,
        top_p=top_p,
        verification=verification,
    )
    assert reference.tv(reference.empirical_law(np.asarray(text), V), law) < reference.tv_noise_bound(law, N)
    calls = np.asarray(stats["nfe_per_sample"])
    assert calls.max() <= L and calls.min() >= 2  # no prefill call without a prompt; round 1 writes one token
    assert int(stats["accepted_at"][0]) > N // 4  # the head's drafts are kept
    assert (np.asarray(stats["draft_calls"]) == k * calls).all()


def test_head_drafts_after_a_prompt_keep_the_conditional_law():
    """With a prompt of 2 tokens, the other 4 have the AR network's law given it."""
    _, graphdef, state = _tiny()
    law = _law(graphdef, state).reshape(V, V, -1)[2, 1]  # given x_0 = 2, x_1 = 1
    law = law / law.sum()
    prompt = jnp.tile(jnp.asarray([[2, 1]], jnp.int32), (N, 1))
    text = np.asarray(
        draft_head.speculate(jax.random.key(4), graphdef, state, N, L, draft_head.HeadLayout(2), prompt=prompt)[0]
    )
    assert (text[:, :2] == [2, 1]).all()
    assert reference.tv(reference.empirical_law(text[:, 2:], V), law) < reference.tv_noise_bound(law, N)


def test_at_temperature_0_the_head_run_writes_the_ar_networks_greedy_text():
    _, graphdef, state = _tiny(3)
    net, greedy = nnx.merge(graphdef, *state), []
    for l in range(L):  # position l's logits read only the tokens before it: one shape, one compiled forward
        logits = causal.next_token_logits(net, jnp.asarray([greedy + [0] * (L - l)], jnp.int32))
        greedy.append(int(jnp.argmax(logits[0, l])))
    for prompt in (None, jnp.asarray([greedy[:1]] * 4, jnp.int32)):
        text = draft_head.speculate(
            jax.random.key(7), graphdef, state, 4, L, draft_head.HeadLayout(3), temperature=0.0, prompt=prompt
        )[0]
        np.testing.assert_array_equal(np.asarray(text), np.tile(greedy, (4, 1)))


def test_the_drafts_at_sampling_time_are_the_head_on_the_training_forwards_features():
    """After the prompt and after a round that kept j drafts, the drafter's laws are (1) of the module on the
    features the training forward gives at the position before the new start, reading the text's tokens."""
    k = 3
    _, graphdef, state = _tiny(k)
    model = nnx.merge(graphdef, *state)
    head = draft_head.head_of(model)
    text = jnp.asarray([[2, 0, 1, 1, 2, 0]], jnp.int32)
    h, _ = causal.features(model, text)  # (1, L, H)

    def expected(s, drafted):  # q_1 .. q_k of the drafts from start s: the head at l = s - 1, reading x_{s-1}, ...
        z, out, read = head.begin(h[:, s - 1]), [], [int(text[0, s - 1]), *map(int, drafted[: k - 1])]
        for y in read:
            z, logits = head.step(z, jnp.asarray([y]))
            out.append(jax.nn.softmax(logits, -1)[0])
        return np.stack(out)

    prefill, target, drafter = draft_head.speculative_parts(graphdef, draft_head.HeadLayout(k))
    buffer = jnp.zeros((1, L + k + 1), jnp.int32).at[:, :L].set(text)
    st = prefill(state, text[:, :2])
    drafted, q, _, count = drafter(jax.random.key(0), st, buffer, jnp.asarray([2]), k)
    assert int(count[0]) == k
    np.testing.assert_allclose(np.asarray(q[0]), expected(2, np.asarray(drafted[0])), rtol=2e-4, atol=1e-6)
    _, st = target(st, buffer, jnp.asarray([2]), k)  # a round at 2 verifying the text's own tokens 2 .. 4
    for kept in range(k + 1):  # the round kept `kept` of them and wrote the next: the new start 2 + kept + 1
        start = 2 + kept + 1
        if start >= L:
            break
        drafted, q, _, _ = drafter(jax.random.key(kept), st, buffer, jnp.asarray([start]), k)
        np.testing.assert_allclose(np.asarray(q[0]), expected(start, np.asarray(drafted[0])), rtol=2e-4, atol=1e-6)
    assert int(drafter(jax.random.key(0), prefill(state, text[:, :0]), buffer, jnp.asarray([0]), k)[3][0]) == 0


def test_the_loss_is_the_ar_nll_and_the_heads_cross_entropy_which_leaves_the_ar_network_alone():
    """(2): its first term is the causal half's exact NLL; the head's term, summed over starts and steps, is the
    cross-entropy of (1) unrolled position by position; its gradient reaches the head only: what reaches the
    rest is the NLL's alone, to float32's rounding (the two NLLs are summed in other orders on several threads)."""
    k = 2
    kind, graphdef, state = _tiny(k)
    model = nnx.merge(graphdef, *state)
    x = jnp.asarray(SEQS[[5, 100, 600]], jnp.int32)
    loss = nnx.jit(draft_head.loss, static_argnums=2, static_argnames="draft_target")  # eagerly: an op a compile
    total = loss(model, x, k)
    nll = nnx.jit(causal.token_nll)(model, x).sum(-1)
    h, _ = nnx.jit(causal.features)(model, x)
    head, brute = draft_head.head_of(model), np.zeros(x.shape[0])
    for b in range(x.shape[0]):
        for l in range(L):
            z = head.begin(h[b, l])
            for i in range(1, k + 1):
                if l + i >= L:
                    break
                z, logits = head.step(z, x[b, l + i - 1])
                brute[b] -= float(jax.nn.log_softmax(logits)[x[b, l + i]])
    np.testing.assert_allclose(np.asarray(total), np.asarray(nll) + brute, rtol=1e-4)
    grads = nnx.jit(nnx.grad(lambda m: (draft_head.loss(m, x, k) - causal.token_nll(m, x).sum(-1)).sum()))(model)
    of_nll = nnx.to_flat_state(nnx.jit(nnx.grad(lambda m: causal.token_nll(m, x).sum()))(model))
    scale = max(float(jnp.abs(v[...]).max()) for _, v in of_nll)
    flat = nnx.to_flat_state(grads)
    assert any(float(jnp.abs(v[...]).max()) > 1e-3 * scale for path, v in flat if path[0] == "draft_head")
    assert all(float(jnp.abs(v[...]).max()) <= 1e-5 * scale for path, v in flat if path[0] != "draft_head")
    for target in ("causal", "own"):  # against the network's laws (on the data, on its own text): >= its NLL
        law = np.asarray(loss(model, x, k, draft_target=target, key=jax.random.key(0)))
        assert np.isfinite(law).all() and (law > np.asarray(nll)).all(), target


def test_layouts_of_a_head_run_are_checked_naming_the_value():
    assert draft_head.layout_of(None, 4) == draft_head.HeadLayout(4) == draft_head.layout_of("4", 4)
    assert draft_head.layout_of("0", 4) == draft_head.HeadLayout(0) and draft_head.HeadLayout(4).positions == 5
    assert draft_head.candidates(4) == [draft_head.HeadLayout(4), draft_head.HeadLayout(2), draft_head.HeadLayout(0)]
    for bad in ("4,2", "5", 5, -1, "a", True):  # past the trained k, or not a k
        with pytest.raises(ValueError, match="layout"):
            draft_head.layout_of(bad, 4)
    _, graphdef, state = _tiny(2, 0)  # no head
    with pytest.raises(ValueError, match="no draft head"):
        draft_head.speculate(jax.random.key(0), graphdef, state, 1, L, draft_head.HeadLayout(2))


def test_a_tiny_head_run_trains_and_samples(tmp_path, capsys):
    """sedd train and sample an AR run with model.draft_head: the exact NLL, text drawn in head rounds."""
    from sedd import cli, runs

    work = tmp_path / "head"
    cmd = [
        "train",
        "--config",
        "tiny",
        "--workdir",
        str(work),
        "--config.model.kind=ar",
        "--config.model.draft_k=3",
        "--config.model.n_layers=1",
        "--config.model.draft_head=32",
        "--config.training.n_iters=4",
        "--config.training.eval_every=4",
        "--config.training.ckpt_every=4",
    ]
    assert cli.main(cmd) == 0
    run = runs.load(work)
    out = run.sample(jax.random.key(0), 2, return_stats=True, layout="3")
    assert out.tokens.shape == (2, run.seq_len) and int(out.stats["nfe"]) <= run.seq_len
    capsys.readouterr()
    code = cli.main(["sample", "--workdir", str(work), "--num_samples", "1", "--layout", "3", "--prefix", "ROMEO:"])
    res = capsys.readouterr()
    assert code == 0, res.err[-2000:]
    assert "layout k=3 from the draft head (4 positions a call), as asked" in res.err, res.err[-2000:]
    assert res.out.lstrip().startswith("ROMEO:") or "ROMEO:" in res.out
    # The calls line counts the 26 tokens written after the 6-token prompt, the target's calls and the head's steps
    # (issue 84: it said 6.40 tokens a call where at most 5.2 were written).
    line = next(x for x in res.err.splitlines() if x.startswith("network calls: "))
    got = re.search(
        r"a text of 32 tokens, 26 of them written \(6 given by the prompt\): ([\d.]+) tokens written a call; "
        r"the target's ([\d.]+) \(([\d.]+) tokens a call\), the drafter's ([\d.]+)$",
        line,
    )
    assert got, line
    per_call, target, per_target, drafter = (float(x) for x in got.groups())
    assert drafter == 3 * (target - 1), line  # k = 3 head steps a round; the target's calls: the rounds and the prefill
    assert per_call == pytest.approx(26 / (target + drafter), abs=0.006), line
    assert per_target == pytest.approx(26 / target, abs=0.006) and per_target <= 4, line  # at most k + 1 a round


def test_a_spec_run_with_a_head_written_before_the_move_loads_as_the_ar_run_with_a_head_it_was():
    """tests/fixtures/spec_head_run (a spec run with a draft head, commit bda954f): its config migrates to an AR run
    with the head, its checkpoint's unused MASK row is dropped, and its head rounds write the network's greedy text."""
    from pathlib import Path

    from sedd import runs

    run = runs.load(Path(__file__).parent / "fixtures" / "spec_head_run")
    assert run.kind.name == "ar" and run.kind.head_width == 4 and run.kind.layout == draft_head.HeadLayout(3)
    assert run.params["vocab_embed"]["embedding"].shape[0] == run.config.vocab_size + 1  # BOS; the MASK row dropped
    greedy = run.sample(jax.random.key(0), 2, temperature=0.0, layout=0).tokens
    out = run.sample(jax.random.key(1), 2, temperature=0.0, return_stats=True)
    np.testing.assert_array_equal(out.tokens, greedy)
    assert int(out.stats["draft_calls"][0]) > 0  # drawn in the head's rounds


@pytest.mark.parametrize("width", [65536, 8192])
def test_a_draft_head_too_wide_is_refused_in_one_line_before_anything_is_built(width, tmp_path, capsys):
    """Issue 83, finding 2: `sedd train ... --config.model.draft_head=65536` hung for minutes and 8192 failed after
    68 s with RESOURCE_EXHAUSTED: model.draft_head is bounded, one line, nothing written."""
    from sedd import cli

    argv = ["train", "--config", "tiny", "--workdir", str(tmp_path / "run"), "--config.model.kind=ar"]
    assert cli.main([*argv, f"--config.model.draft_head={width}", "--config.training.n_iters=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"model.draft_head = {width} is outside [0, 4096]" in err, err
    assert not (tmp_path / "run").exists()


def test_the_heads_weights_are_counted_in_the_parameter_bound_and_the_memory_estimate():
    """6 N^2 + 2 N V + N H: the head's share of ``validate.weight_count`` is what its network holds (biases and
    norms aside), and the estimate grows by it."""
    from sedd import config as config_lib
    from sedd import validate
    from sedd.model import param_count

    kind, graphdef, state = _tiny(2, 64)
    config = kind.config
    model = nnx.merge(graphdef, *state)
    head = param_count(draft_head.head_of(model))
    counted = validate.weight_count(config) - validate.weight_count(
        config_lib.override(config, ["--config.model.draft_head=0"])
    )
    assert counted <= head <= 1.05 * counted, (counted, head)
    assert validate.memory_estimate(config) > validate.memory_estimate(
        config_lib.override(config, ["--config.model.draft_head=0"])
    )
