"""The self-speculative kind (``sedd.kinds.spec``): one network drafts and verifies, its causal half's law exactly.

A random spec network over V = 3 tokens and L = 6 positions has an exact
autoregressive law (its causal half), computed over all 3^6 sequences with
``sedd.kinds.causal.nll``; self-speculation's draws are held within the sampling
noise of it (``reference.tv_noise_bound``), with temperature and top-p too.
The round's calls are checked against the training forward they must equal,
and a tiny run trains, evaluates and samples through the CLI.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from flax import nnx

from sedd import speculative
from sedd.kinds import causal, spec
from sedd.sampling import shaped_law

V, L, N, K = 3, 6, 15_000, 2
SEQS = reference.all_sequences(V, L)


@functools.lru_cache(maxsize=None)
def _tiny(k: int = K, dtype: str = "auto"):
    """A tiny spec network over V = 3, L = 6 (weights perturbed, so its laws depend on the context)."""
    import ml_collections
    from flax import nnx

    from sedd import config as config_lib
    from sedd import kinds

    config = config_lib.load_config(
        "tiny",
        [
            "--config.model.kind=spec",
            "--config.model.n_layers=1",
            f"--config.model.draft_k={k}",
            f"--config.data.seq_len={L}",
            f"--config.model.dtype={dtype}",
        ],
    )
    config = ml_collections.ConfigDict(config.to_dict())
    config.vocab_size = V
    graphdef, params, rest = nnx.split(kinds.get(config).network(0), nnx.Param, ...)
    return graphdef, (reference.perturbed(params, 0.1, 7), rest)


def _law(graphdef, state, temperature=1.0, top_p=1.0) -> np.ndarray:
    """The exact law over all 3^6 sequences of the causal half with temperature and top-p on its conditionals."""
    from flax import nnx

    model = nnx.merge(graphdef, *state)
    length = L
    out = model.network_output(
        causal.inputs(model, jnp.asarray(SEQS)), None, mask=np.tril(np.ones((length, length), bool)), deterministic=True
    )
    probs = np.asarray(shaped_law(out, temperature, top_p), np.float64)  # (V^L, L, V)
    law = np.prod(np.take_along_axis(probs, SEQS[..., None], -1)[..., 0], axis=1)
    return law / law.sum()


def test_the_exact_nll_is_the_causal_half_of_the_training_forward():
    """causal.nll (the causal half alone) equals the causal half of the 2L forward: the drafts never leak into it."""
    from flax import nnx

    graphdef, state = _tiny()
    model = nnx.merge(graphdef, *state)
    x = jnp.asarray(SEQS[::37])
    nll_p, nll_q = spec.token_nlls(model, x, K)
    np.testing.assert_allclose(np.asarray(causal.nll(model, x)), np.asarray(nll_p.sum(-1)), rtol=1e-5)
    # The draft half's law at a group depends on the causal tokens before its anchor only.
    changed = x.at[:, 3:].set((x[:, 3:] + 1) % V)  # group 1 (positions 2, 3) sees BOS and x_0 only
    np.testing.assert_allclose(
        np.asarray(spec.token_nlls(model, changed, K)[1][:, :3]), np.asarray(nll_q[:, :3]), rtol=1e-5
    )


def test_a_rounds_call_equals_the_training_forward():
    """One round's causal laws and each outcome's drafts equal what the full forward gives for that text.

    In float32 (unless SEDD_COMPUTE_DTYPE says otherwise), where the two agree to float rounding: a round's
    attention reads a decoding cache, float32 on a CPU, where the training forward's products run in the
    compute dtype (``DDiT.empty_cache``)."""
    from flax import nnx

    graphdef, state = _tiny(K, "float32")
    model = nnx.merge(graphdef, *state)
    tol = dict(rtol=1e-5, atol=1e-6) if model.dtype == jnp.float32 else dict(rtol=2e-2, atol=2e-3)
    prefill, target, _ = spec.speculative_parts(graphdef, K)
    text = jnp.asarray([[2, 0, 1, 1, 2, 0, 0, 0, 0]], jnp.int32)  # x_0, x_1, drafts 1, 1 at 2, 3
    p, after = target(prefill(state, text[:, :2]), text, jnp.asarray([2]), K)
    # the causal laws at 2..4 given the text: the full causal forward of [2, 0, 1, 1, 2, 0]
    forward = nnx.jit(  # eagerly: an op a compile, for each length
        lambda net, x, positions, mask: net.network_output(x, None, positions=positions, mask=mask, deterministic=True)
    )
    full = forward(model, causal.inputs(model, text[:, :L]), None, np.tril(np.ones((L, L), bool)))
    np.testing.assert_allclose(np.asarray(p[0]), np.asarray(jax.nn.softmax(full[0, 2:5])), **tol)
    # outcome j: the drafts of positions 3 + j, 4 + j given x_<2+j, each alone (a one-token MASK group)
    for j in range(K + 1):
        a = 2 + j
        seq = jnp.asarray(text[:, :a])
        inputs = jnp.concatenate(
            [causal.inputs(model, jnp.pad(seq, ((0, 0), (0, 1)))), jnp.full((1, K), spec.mask_id(model), jnp.int32)], 1
        )  # a + 1 causal, K MASK
        n = a + 1
        mask = np.zeros((n + K, n + K), bool)
        mask[:n, :n] = np.tril(np.ones((n, n), bool))
        mask[n:, : a + 1] = True
        mask[n:, n:] = True
        positions = np.concatenate([np.arange(n), a + 1 + np.arange(K)])
        out = forward(model, inputs, positions, mask)
        np.testing.assert_allclose(np.asarray(after[2][0, j]), np.asarray(jax.nn.softmax(out[0, n:])), **tol)


def test_drafts_trained_on_the_causal_law_average_the_data_loss_over_it():
    """training.draft_target='causal', (4): at each position the drafts' term is the data term (3) with the
    token there replaced by every v in turn, averaged by the causal law p(v | x_<l); the NLL term is unchanged.

    Replacing x_l changes neither p(. | x_<l) nor the draft at l (it sees the causal half before its
    anchor only), so the sum over v is exact; checked position by position by enumeration over V.
    """
    from flax import nnx

    graphdef, state = _tiny()
    model = nnx.merge(graphdef, *state)
    x = jnp.asarray(SEQS[::97])
    w = 0.5
    nll_p, _ = nnx.jit(spec.token_nlls, static_argnums=2)(model, x, K)
    causal = nnx.jit(spec.loss, static_argnums=2, static_argnames="draft_target")(
        model, x, K, draft_weight=w, draft_target="causal"
    )
    n = x.shape[0]
    # every text with its token at l set to v, (N, L, V) texts in one call
    variants = jnp.broadcast_to(x[:, None, None, :], (n, L, V, L))
    at = np.arange(L)[None, :, None, None] == np.arange(L)[None, None, None, :]
    variants = jnp.where(at, np.arange(V)[None, None, :, None], variants).reshape(-1, L)
    nlls = [
        np.asarray(a).reshape(n, L, V, L)[:, np.arange(L), :, np.arange(L)].transpose(1, 0, 2)
        for a in nnx.jit(spec.token_nlls, static_argnums=2)(model, variants, K)
    ]  # (N, L, V): at l, v there
    p, q_nll = np.exp(-nlls[0]), nlls[1]  # p(v | x_<l), -log q(v | x_<a(l))
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)
    expected = np.asarray(nll_p.sum(-1)) + w * (p * q_nll).sum((1, 2))
    np.testing.assert_allclose(np.asarray(causal), expected, rtol=1e-5)
    # the causal law is held fixed: its gradient is that of (4) with p a constant
    fixed = jax.nn.softmax(spec.halves(model, x, K)[0], axis=-1)

    def by_hand(m):
        causal_logits, drafts = spec.halves(m, x, K)
        log_p = jax.nn.log_softmax(causal_logits.astype(jnp.float32), axis=-1)
        return (
            -jnp.take_along_axis(log_p, x[..., None], axis=-1).sum()
            - w * (fixed * jax.nn.log_softmax(drafts.astype(jnp.float32), axis=-1)).sum()
        )

    got = nnx.jit(nnx.grad(lambda m: spec.loss(m, x, K, draft_weight=w, draft_target="causal").sum()))(model)
    want = nnx.jit(nnx.grad(by_hand))(model)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_drafts_trained_on_the_causal_halfs_own_text():
    """training.draft_target='own': the NLL term on the data x; the drafts' term (4) on the B texts the causal
    half writes from the loss's key (``causal.ancestral`` at temperature 1), the causal law held fixed there.
    In float32: the two gradients sum the same terms in another order, which bfloat16 moves by ~1%."""
    from flax import nnx

    graphdef, state = _tiny(K, "float32")
    model = nnx.merge(graphdef, *state)
    x, w, key = jnp.asarray(SEQS[::97]), 0.5, jax.random.key(3)
    own = causal.ancestral(key, graphdef, state, x.shape[0], L)
    assert own.shape == x.shape and not np.array_equal(np.asarray(own), np.asarray(x))
    got = spec.loss(model, x, K, draft_weight=w, draft_target="own", key=key)
    # (4) on the own texts is the "causal" loss there less their NLL (its enumeration is the test above)
    on_own = spec.loss(model, own, K, draft_weight=w, draft_target="causal") - spec.token_nlls(model, own, K)[0].sum(-1)
    np.testing.assert_allclose(np.asarray(got), np.asarray(spec.token_nlls(model, x, K)[0].sum(-1) + on_own), rtol=1e-4)
    fixed = jax.nn.softmax(spec.halves(model, own, K)[0].astype(jnp.float32), axis=-1)

    def by_hand(m):
        log_p = jax.nn.log_softmax(spec.halves(m, x, K)[0].astype(jnp.float32), axis=-1)
        drafts = spec.halves(m, own, K)[1]
        return (
            -jnp.take_along_axis(log_p, x[..., None], axis=-1).sum()
            - w * (fixed * jax.nn.log_softmax(drafts.astype(jnp.float32), axis=-1)).sum()
        )

    grads = nnx.jit(nnx.grad(lambda m: spec.loss(m, x, K, draft_weight=w, draft_target="own", key=key).sum()))(model)
    want = nnx.jit(nnx.grad(by_hand))(model)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="give a key"):
        spec.loss(model, x, K, draft_target="own")


SLOW = pytest.mark.slow  # the same law checked again at another layout or rule (-m slow; the default keeps one of each)


@pytest.mark.parametrize(
    "temperature,top_p,layout,verification,tau",
    [
        (1.0, 1.0, spec.Layout(2, 3), "joint", spec.DRAFT_TEMPERATURE),
        pytest.param(0.7, 0.9, spec.Layout(3, 4), "joint", spec.DRAFT_TEMPERATURE, marks=SLOW),
        pytest.param(1.0, 1.0, spec.Layout(3, 4), "token", 1.0, marks=SLOW),
        pytest.param(1.0, 1.0, spec.Layout(2, 3), "joint", 0.3, marks=SLOW),
        # leaner layouts: an outcome past the last group drafts from it (fewer drafts; none after k=2 g=1 keeps 2)
        (1.0, 1.0, spec.Layout(2, 1), "token", 1.0),
        (0.7, 0.9, spec.Layout(3, 2), "joint", spec.DRAFT_TEMPERATURE),
        pytest.param(1.0, 1.0, spec.Layout(2, 1), "joint", spec.DRAFT_TEMPERATURE, marks=SLOW),
        pytest.param(0.7, 0.9, spec.Layout(3, 1), "joint", spec.DRAFT_TEMPERATURE, marks=SLOW),
        pytest.param(0.7, 0.9, spec.Layout(3, 2), "token", 1.0, marks=SLOW),
        pytest.param(1.0, 1.0, spec.Layout(1, 1), "joint", spec.DRAFT_TEMPERATURE, marks=SLOW),
    ],
)
def test_self_speculation_draws_the_causal_halfs_law(temperature, top_p, layout, verification, tau):
    """Over all 3^6 sequences, the drawn text's law is the causal half's exact law within the sampling noise.

    Whichever layout (a group for every outcome, or fewer: the rounds after an outcome past the last
    group have fewer drafts, or none), whichever verification, and however sharpened the drafts (tau):
    the q the verifier is told is the law the drafts were drawn from.
    """
    graphdef, state = _tiny(layout.k)
    law = _law(graphdef, state, temperature, top_p)
    text, stats = spec.speculate(
        jax.random.key(3),
        graphdef,
        state,
        N,
        L,
        layout,
        temperature=temperature,
        top_p=top_p,
        verification=verification,
        draft_temperature=tau,
    )
    assert reference.tv(reference.empirical_law(np.asarray(text), V), law) < reference.tv_noise_bound(law, N)
    calls = np.asarray(stats["nfe_per_sample"])
    assert calls.max() <= L + 1 and calls.min() >= 2  # the prefill and at least one round; a round writes >= 1
    assert int(stats["accepted_at"][0]) > 0  # drafts were kept (an untrained draft half keeps few)


def test_past_the_last_group_a_round_drafts_from_it_from_the_new_start():
    """A lean layout's drafter, on laws that differ by group and position: the outcome's group, or past the
    last group that group's laws from the new start (fewer drafts), and the drafts drawn from the q it reports."""
    graphdef, _ = _tiny(3)
    k, groups, tau = 3, 2, 0.8
    _, _, drafter = spec.speculative_parts(graphdef, spec.Layout(k, groups), draft_temperature=tau)
    laws = jnp.asarray(np.random.default_rng(0).dirichlet(np.ones(V), (1, groups, k)), jnp.float32)
    last = 5
    for j in range(k + 1):  # the drafts the last round kept
        state = (None, None, laws, jnp.asarray([last]))
        start = jnp.asarray([last + 1 + j])
        group, skip = min(j, groups - 1), j - min(j, groups - 1)
        _, q, _, count = drafter(jax.random.key(0), state, None, start, k)
        assert int(count[0]) == k - skip
        np.testing.assert_allclose(
            np.asarray(q[0, : k - skip]), np.asarray(speculative.sharpened(laws[0, group, skip:], tau)), rtol=1e-6
        )
        drawn = jax.vmap(lambda key: drafter(key, state, None, start, k)[0][0])(
            jax.random.split(jax.random.key(j), 20_000)
        )  # (n, k)
        for i in range(k - skip):
            freq = np.bincount(np.asarray(drawn[:, i]), minlength=V) / drawn.shape[0]
            assert np.abs(freq - np.asarray(q[0, i])).max() < 0.015, (j, i, freq, q[0, i])


def test_a_layout_is_checked_naming_the_value():
    assert spec.layout_of(None, 4) == spec.Layout(4, 5) and spec.layout_of("4,2", 4) == spec.Layout(4, 2)
    assert spec.layout_of(3, 4) == spec.Layout(3, 4) and spec.layout_of("2", 4) == spec.Layout(2, 3)
    assert spec.Layout(4, 2).positions == 13 and spec.Layout(4, 5).positions == 25 and spec.Layout(4, 2).name == "4,2"
    assert spec.layout_of("0", 4) == spec.layout_of(0, 4) == spec.NO_DRAFTS and spec.NO_DRAFTS.positions == 1
    assert spec.layout_of("8,1", None) == spec.Layout(8, 1)  # the format alone
    assert spec.candidates(4) == [spec.Layout(4, 1), spec.Layout(2, 2), spec.Layout(1, 2), spec.NO_DRAFTS]
    for bad in (
        "4,6",
        "0,1",
        "1,0",
        "5,1",  # more drafts than the run was trained to draft
        "a,b",
        "4,2,1",
        "1_0",
        " 4",
        "4,",
        "-1",
        "\u0664",
        spec.Layout(2, 0),
        spec.Layout(0, 1),
        (True, 1),
    ):
        with pytest.raises(ValueError, match="layout"):
            spec.layout_of(bad, 4)
    from sedd import config as config_lib
    from sedd import kinds

    config = config_lib.load_config("tiny")  # a SEDD run: no layout to choose
    config.vocab_size = V
    with pytest.raises(
        ValueError,
        match="--layout 2,1: a model.kind='ddit' run cannot choose a round's layout; model.kind 'ar' or 'spec' can",
    ):
        kinds.capabilities.able(kinds.get(config), kinds.capabilities.Tunes, "--layout 2,1")


def test_sharpened_drafts_and_a_bad_draft_temperature():
    """q^(1/tau) renormalised, zeros kept; tau = 1 is q; a tau that is not > 0 is refused naming it."""
    q = jnp.asarray([[0.5, 0.3, 0.2, 0.0]])
    np.testing.assert_allclose(np.asarray(speculative.sharpened(q, 1.0)), np.asarray(q), rtol=1e-6)
    sharp = np.asarray(speculative.sharpened(q, 0.5))[0]
    np.testing.assert_allclose(sharp, np.asarray([25, 9, 4, 0]) / 38, rtol=1e-5)
    graphdef, state = _tiny()
    with pytest.raises(ValueError, match="draft_temperature must be a number > 0, got 0"):
        spec.speculate(jax.random.key(0), graphdef, state, 2, L, K, draft_temperature=0)


def test_the_no_draft_layout_draws_the_causal_halfs_law_and_its_argmax_at_temperature_0():
    """spec.NO_DRAFTS (the causal half alone on its KV cache, one token a call) draws the exact law; at
    temperature 0 it and every layout with drafts write the causal half's greedy text."""
    graphdef, state = _tiny()
    law = _law(graphdef, state, 0.7)
    text, stats = spec.speculate(jax.random.key(5), graphdef, state, N, L, spec.NO_DRAFTS, temperature=0.7)
    assert reference.tv(reference.empirical_law(np.asarray(text), V), law) < reference.tv_noise_bound(law, N)
    assert int(stats["nfe"]) == L and stats["accepted_at"].shape == (0,)
    greedy = np.asarray(spec.speculate(jax.random.key(6), graphdef, state, 8, L, spec.NO_DRAFTS, temperature=0.0)[0])
    assert (greedy == greedy[0]).all()  # the one argmax path, whatever the key
    prefix = reference.greedy_by_full_passes(nnx.merge(graphdef, *state), [], L)  # token by token by full passes
    np.testing.assert_array_equal(greedy[0], prefix)
    drafted = np.asarray(
        spec.speculate(jax.random.key(7), graphdef, state, 8, L, spec.Layout(K, 1), temperature=0.0)[0]
    )
    np.testing.assert_array_equal(drafted, np.tile(prefix, (8, 1)))


def test_a_prompt_is_kept_and_the_rest_drawn_from_the_conditional_law():
    """With a prompt of 2 tokens, the other 4 have the causal half's law given it."""
    graphdef, state = _tiny()
    law = _law(graphdef, state).reshape(V, V, -1)[2, 1]  # given x_0 = 2, x_1 = 1
    law = law / law.sum()
    n = N
    prompt = jnp.tile(jnp.asarray([[2, 1]], jnp.int32), (n, 1))
    text, _ = spec.speculate(jax.random.key(4), graphdef, state, n, L, K, prompt=prompt)
    text = np.asarray(text)
    assert (text[:, :2] == [2, 1]).all()
    ids = reference.empirical_law(text[:, 2:], V)
    assert reference.tv(ids, law) < reference.tv_noise_bound(law, n)


@pytest.mark.dtypes  # end to end: .ci/run runs it again in the other compute dtype
def test_a_tiny_spec_run_trains_evaluates_and_samples(tmp_path, capsys):
    """sedd train / eval / sample with model.kind=spec: the exact NLL printed, text drawn, drafts counted."""
    from sedd import cli, runs

    work = tmp_path / "spec"
    cmd = [
        "train",
        "--config",
        "tiny",
        "--workdir",
        str(work),
        "--config.model.kind=spec",
        "--config.model.draft_k=4",
        "--config.model.n_layers=1",
        "--config.training.n_iters=4",
        "--config.training.eval_every=4",
        "--config.training.ckpt_every=4",
    ]
    assert cli.main(cmd) == 0
    run = runs.load(work)
    texts = run.generate(jax.random.key(0), 2, prefix="ROMEO:")
    assert len(texts) == 2 and all(t.startswith("ROMEO:") for t in texts)
    out = run.sample(jax.random.key(0), 2, return_stats=True)
    assert out.tokens.shape == (2, run.seq_len) and 2 <= int(out.stats["nfe"]) <= run.seq_len + 1
    with pytest.raises(ValueError, match="drafts for itself"):
        run.sample(jax.random.key(0), 1, draft="ngram")

    def sample(*extra):
        capsys.readouterr()
        code = cli.main(["sample", "--workdir", str(work), "--num_samples", "1", *extra])
        err = capsys.readouterr().err
        assert code == 0, err[-2000:]
        return err  # the layout and the calls are said beside the texts

    out = sample("--layout", "4,1")  # (auto, the default, times every candidate: test_a_layout_is_chosen_...)
    assert "layout k=4 groups=1 (9 positions a call), as asked" in out and "network calls: " in out, out


@pytest.mark.parametrize("kind,head", [("spec", 0), ("ar", 16)])
def test_sedd_serve_decodes_a_run_by_its_own_rounds(kind, head):
    """sedd serve with a spec run, or an AR run with a draft head, and no --draft: temperature 0 writes the causal
    LM's argmax text, in rounds (the draft half's, or the head's k steps a round)."""
    pytest.importorskip("starlette")
    import ml_collections
    from flax import nnx
    from starlette.testclient import TestClient

    from sedd import config as config_lib
    from sedd import kinds, runs, serve
    from sedd.data.tokenizers import CharTokenizer

    tokenizer, length = CharTokenizer("abcdefgh ,.\n"), 16
    config = config_lib.load_config(
        "tiny",
        [
            f"--config.model.kind={kind}",
            "--config.model.n_layers=1",
            "--config.model.draft_k=3",
            f"--config.data.seq_len={length}",
            f"--config.model.draft_head={head}",
        ],
    )
    config = ml_collections.ConfigDict(config.to_dict())
    config.vocab_size = tokenizer.vocab_size
    graphdef, params, rest = nnx.split(kinds.get(config).network(0), nnx.Param, ...)
    run = runs.from_parts(config, tokenizer, graphdef, reference.perturbed(params, 0.5, 7), rest)
    limits = serve.Limits(max_steps=16, max_n=2, max_batch=2, max_queue=8, timeout_s=300, window_s=0.0)
    with TestClient(serve.create_app(run, "sedd-spec", limits), base_url="http://localhost") as client:
        model = client.get("/v1/models").json()["data"][0]
        assert model["kind"] == kind and model["draft"] == ("head" if head else "self") and model["draft_k"] == 3
        out = client.post(
            "/v1/completions", json={"prompt": "ab c", "max_tokens": 9, "temperature": 0.0, "seed": 1}
        ).json()
    ids = reference.greedy_by_full_passes(run.model, tokenizer.encode("ab c"), 9)  # the causal half's argmax
    assert out["choices"][0]["text"] == tokenizer.decode(ids[4:])
    s = out["speculative"]
    assert s["draft_calls"] == (3 * s["target_calls"] if head else 0), s
    assert s["tokens"] == 9 and 9 / 4 <= s["target_calls"] <= 9


@pytest.mark.parametrize(
    "key,value,named",
    [
        ("training.draft_weight", "-1.0", "draft_weight"),
        ("training.draft_weight", "nan", "draft_weight"),
        ("training.draft_target", "text", "draft_target"),
        ("model.draft_k", "0", "draft_k"),
        ("model.draft_head", "-1", "draft_head"),
        ("training.loss_chunk", "8", "loss_chunk"),
    ],
)
def test_a_spec_config_with_a_bad_value_is_refused_naming_it(key, value, named):
    """model.kind='spec' refuses, before any training, a draft weight, a k or an option it cannot honour."""
    import ml_collections

    from sedd import config as config_lib
    from sedd import kinds

    config = config_lib.load_config("tiny", ["--config.model.kind=spec", f"--config.{key}={value}"])
    config = ml_collections.ConfigDict(config.to_dict())
    config.vocab_size = V
    with pytest.raises(ValueError, match=named):
        kinds.get(config)
