"""A spec run's draft head (``sedd.kinds.spec_head``): drafts that read the verifier's token, the causal half's law.

A random spec network with a head over V = 3 tokens and L = 6 positions: its
rounds draw the causal half's exact law (all 3^6 sequences, with temperature,
top-p and a prompt) and its greedy text at temperature 0; the head's drafts at
sampling time are (1) of the module on the features the training forward
computes (an off-by-one there would keep the law and lose the speed, so it is
checked on its own); the loss is the AR NLL plus the head's cross-entropy,
which gives the causal half no gradient; and a tiny run trains and samples.
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
from sedd.kinds import causal, spec, spec_head
from sedd.sampling import shaped_law

V, L, N = 3, 6, 30_000
SEQS = reference.all_sequences(V, L)


@functools.lru_cache(maxsize=None)
def _tiny(k: int = 2, width: int = 16):
    """A tiny spec network with a draft head of `width` over V = 3, L = 6 (weights perturbed)."""
    import ml_collections

    from sedd import config as config_lib
    from sedd import kinds

    config = config_lib.load_config(
        "tiny",
        [
            "--config.model.kind=spec",
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
    """The causal half's exact law over all 3^6 sequences, temperature and top-p on its conditionals."""
    model = nnx.merge(graphdef, *state)
    out = causal.next_token_logits(model, jnp.asarray(SEQS))
    probs = np.asarray(shaped_law(out, temperature, top_p), np.float64)  # (V^L, L, V)
    law = np.prod(np.take_along_axis(probs, SEQS[..., None], -1)[..., 0], axis=1)
    return law / law.sum()


@pytest.mark.parametrize("k,temperature,top_p,verification", [(2, 1.0, 1.0, "joint"), (3, 0.7, 0.9, "token")])
def test_head_drafts_keep_the_causal_halfs_law(k, temperature, top_p, verification):
    """Over all 3^6 sequences the text's law is the causal half's within the sampling noise, and drafts are kept."""
    _, graphdef, state = _tiny(k)
    law = _law(graphdef, state, temperature, top_p)
    text, stats = spec.speculate(
        jax.random.key(3),
        graphdef,
        state,
        N,
        L,
        spec.Layout(k, 0),
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
    """With a prompt of 2 tokens, the other 4 have the causal half's law given it."""
    _, graphdef, state = _tiny()
    law = _law(graphdef, state).reshape(V, V, -1)[2, 1]  # given x_0 = 2, x_1 = 1
    law = law / law.sum()
    prompt = jnp.tile(jnp.asarray([[2, 1]], jnp.int32), (N, 1))
    text = np.asarray(spec.speculate(jax.random.key(4), graphdef, state, N, L, spec.Layout(2, 0), prompt=prompt)[0])
    assert (text[:, :2] == [2, 1]).all()
    assert reference.tv(reference.empirical_law(text[:, 2:], V), law) < reference.tv_noise_bound(law, N)


def test_at_temperature_0_the_head_run_writes_the_causal_halfs_greedy_text():
    _, graphdef, state = _tiny(3)
    net, greedy = nnx.merge(graphdef, *state), []
    for _ in range(L):
        greedy.append(int(jnp.argmax(causal.next_token_logits(net, jnp.asarray([greedy + [0]], jnp.int32))[0, -1])))
    for prompt in (None, jnp.asarray([greedy[:1]] * 4, jnp.int32)):
        text = spec.speculate(
            jax.random.key(7), graphdef, state, 4, L, spec.Layout(3, 0), temperature=0.0, prompt=prompt
        )[0]
        np.testing.assert_array_equal(np.asarray(text), np.tile(greedy, (4, 1)))


def test_the_drafts_at_sampling_time_are_the_head_on_the_training_forwards_features():
    """After the prompt and after a round that kept j drafts, the drafter's laws are (1) of the module on the
    features the training forward gives at the position before the new start, reading the text's tokens."""
    k = 3
    _, graphdef, state = _tiny(k)
    model = nnx.merge(graphdef, *state)
    head = spec_head.head_of(model)
    text = jnp.asarray([[2, 0, 1, 1, 2, 0]], jnp.int32)
    h, _ = model.features(causal.inputs(model, text), None, mask=np.tril(np.ones((L, L), bool)))  # (1, L, H)

    def expected(s, drafted):  # q_1 .. q_k of the drafts from start s: the head at l = s - 1, reading x_{s-1}, ...
        z, out, read = head.begin(h[:, s - 1]), [], [int(text[0, s - 1]), *map(int, drafted[: k - 1])]
        for y in read:
            z, logits = head.step(z, jnp.asarray([y]))
            out.append(jax.nn.softmax(logits, -1)[0])
        return np.stack(out)

    prefill, target, drafter = spec_head.speculative_parts(graphdef, k)
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


def test_the_loss_is_the_ar_nll_and_the_heads_cross_entropy_which_leaves_the_causal_half_alone():
    """(2): its first term is the causal half's exact NLL; the head's term, summed over starts and steps, is the
    cross-entropy of (1) unrolled position by position; its gradient reaches the head only."""
    k = 2
    kind, graphdef, state = _tiny(k)
    model = nnx.merge(graphdef, *state)
    x = jnp.asarray(SEQS[[5, 100, 600]], jnp.int32)
    total = spec_head.loss(model, x, k)
    nll = causal.token_nll(model, x).sum(-1)
    h, _ = model.features(causal.inputs(model, x), None, mask=np.tril(np.ones((L, L), bool)))
    head, brute = spec_head.head_of(model), np.zeros(x.shape[0])
    for b in range(x.shape[0]):
        for l in range(L):
            z = head.begin(h[b, l])
            for i in range(1, k + 1):
                if l + i >= L:
                    break
                z, logits = head.step(z, x[b, l + i - 1])
                brute[b] -= float(jax.nn.log_softmax(logits)[x[b, l + i]])
    np.testing.assert_allclose(np.asarray(total), np.asarray(nll) + brute, rtol=1e-4)
    grads = nnx.grad(lambda m: (spec_head.loss(m, x, k) - causal.token_nll(m, x).sum(-1)).sum())(model)
    flat = nnx.to_flat_state(grads)
    assert any(float(jnp.abs(v[...]).max()) > 0 for path, v in flat if path[0] == "draft_head")
    assert all(float(jnp.abs(v[...]).max()) == 0 for path, v in flat if path[0] != "draft_head")
    for target in ("causal", "own"):  # against the causal half's laws (on the data, on its own text): >= its NLL
        law = np.asarray(spec_head.loss(model, x, k, draft_target=target, key=jax.random.key(0)))
        assert np.isfinite(law).all() and (law > np.asarray(nll)).all(), target


def test_layouts_of_a_head_run_are_checked_naming_the_value():
    assert spec.layout_of(None, 4, head=True) == spec.Layout(4, 0) == spec.layout_of("4", 4, head=True)
    assert spec.layout_of("0", 4, head=True) == spec.NO_DRAFTS
    assert spec.candidates(4, head=True) == [spec.Layout(4, 0), spec.Layout(2, 0), spec.NO_DRAFTS]
    with pytest.raises(ValueError, match="k=4 groups=2: this run drafts with its draft head"):
        spec.layout_of("4,2", 4, head=True)
    with pytest.raises(ValueError, match="draft head, and this run has none"):
        spec.layout_of("4,0", 4)
    _, graphdef, state = _tiny(2, 0)  # no head
    with pytest.raises(ValueError, match="no draft head"):
        spec.speculate(jax.random.key(0), graphdef, state, 1, L, spec.Layout(2, 0))


def test_a_tiny_head_run_trains_and_samples(tmp_path):
    """sedd train and sample with model.draft_head: the exact NLL, text drawn in head rounds."""
    import subprocess
    import sys

    from sedd import runs

    work = tmp_path / "head"
    cmd = [
        sys.executable,
        "-m",
        "sedd.cli",
        "train",
        "--config",
        "tiny",
        "--workdir",
        str(work),
        "--config.model.kind=spec",
        "--config.model.draft_k=3",
        "--config.model.n_layers=1",
        "--config.model.draft_head=32",
        "--config.training.n_iters=4",
        "--config.training.eval_every=4",
        "--config.training.ckpt_every=4",
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600)
    run = runs.load(work)
    out = run.sample(jax.random.key(0), 2, return_stats=True, layout="3")
    assert out.tokens.shape == (2, run.seq_len) and int(out.stats["nfe"]) <= run.seq_len
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "sedd.cli",
            "sample",
            "--workdir",
            str(work),
            "--num_samples",
            "1",
            "--layout",
            "3",
            "--prefix",
            "ROMEO:",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert "layout k=3 from the draft head (4 positions a call), as asked" in res.stderr, res.stderr[-2000:]
    assert res.stdout.lstrip().startswith("ROMEO:") or "ROMEO:" in res.stdout
    # The calls line counts the 26 tokens written after the 6-token prompt, the target's calls and the head's steps
    # (issue 84: it said 6.40 tokens a call where at most 5.2 were written).
    line = next(x for x in res.stderr.splitlines() if x.startswith("network calls: "))
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
