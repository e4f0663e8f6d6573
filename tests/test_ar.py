"""The causal LM (``sedd.kinds.causal``) of the AR baseline: decoding against the full pass, training by `sedd train`."""

import logging
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from sedd import config as config_lib, evaluate, figures, runs, train
from sedd.kinds import causal
from sedd.model import DDiT


def _ar_model(vocab=7, length=12, seed=0):
    model = DDiT(
        num_tokens=vocab + 1,
        out_dim=vocab,
        hidden_size=32,
        n_layers=2,
        n_heads=4,
        cond_dim=16,
        dropout=0.0,
        max_len=length,
        causal=True,
        time_conditioning=False,
        rngs=nnx.Rngs(seed),
    )
    # adaLN and the output layer start at zero; random weights make the test bite.
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    leaves = [x + 0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]
    nnx.update(model, jax.tree.unflatten(tree, leaves))
    return model


def test_sequence_nll_and_sampling():
    model = _ar_model()
    x = jax.random.randint(jax.random.key(0), (2, 12), 0, 7)
    nll = causal.nll(model, x)
    manual = -sum(
        jax.nn.log_softmax(causal.next_token_logits(model, x)[:, l])[jnp.arange(2), x[:, l]] for l in range(12)
    )
    np.testing.assert_allclose(nll, manual, rtol=1e-5)
    s = causal.ancestral_model(jax.random.key(1), model, 4, 12, prompt=jnp.array([[1, 2]] * 4))
    assert s.shape == (4, 12) and s.dtype == jnp.int32
    assert (np.asarray(s[:, :2]) == [1, 2]).all() and (np.asarray(s) < 7).all()
    with pytest.raises(ValueError, match="length"):
        causal.ancestral_model(jax.random.key(1), model, 4, 0)
    # past max_len = 12 the cache is a ring (a sliding window): the first 12 tokens are those of a 12-token draw
    long = np.asarray(causal.ancestral_model(jax.random.key(1), model, 4, 30, prompt=jnp.array([[1, 2]] * 4)))
    assert long.shape == (4, 30) and (long < 7).all()
    np.testing.assert_array_equal(long[:, :12], np.asarray(s))


def test_greedy_decoding_is_the_argmax_of_the_full_pass_and_top_p_keeps_the_nucleus():
    """Temperature 0: each token the argmax of the full pass given the ones before; top_p: every token drawn
    lies in its law's nucleus."""
    model = _ar_model()
    logits_of = nnx.jit(causal.next_token_logits)  # eagerly: an op a compile, for each batch
    greedy = np.asarray(causal.ancestral_model(jax.random.key(0), model, 3, 12, temperature=0.0))
    logits = np.asarray(logits_of(model, jnp.asarray(greedy)))  # (B, L, V)
    np.testing.assert_array_equal(greedy, logits.argmax(-1))
    drawn = causal.ancestral_model(jax.random.key(2), model, 64, 12, top_p=0.5)
    law = np.asarray(jax.nn.softmax(logits_of(model, drawn)), np.float64)  # (B, L, V)
    ranked = -np.sort(-law, -1).cumsum(-1)  # mass of the tokens at least as likely as each
    at = np.take_along_axis(law, np.asarray(drawn)[..., None], -1)  # (B, L, 1)
    mass_before = (law * (law > at)).sum(-1)  # the tokens strictly more likely than the one drawn
    assert (mass_before < 0.5 + 1e-6).all() and ranked.shape == law.shape


def test_a_judge_is_its_nll_function_in_batches_of_one_shape_and_refuses_what_it_cannot_score():
    c = ml_collections.ConfigDict(
        config_lib.load_config("tiny", ["--config.model.kind=ar", "--config.data.seq_len=12"]).to_dict()
    )
    c.vocab_size = 7
    model = _ar_model()
    run = runs.from_parts(c, None, model, nnx.state(model, nnx.Param))
    x = np.asarray(jax.random.randint(jax.random.key(0), (5, 12), 0, 7))
    nll = figures.judge_nll(run)
    want = np.asarray(causal.nll(model, jnp.asarray(x)), np.float64)
    np.testing.assert_allclose(evaluate.samples_nll(nll, x, batch_size=2), want, rtol=1e-5)
    g = evaluate.generative_perplexity(nll, x, batch_size=2)
    assert g["gen_ppl"] == pytest.approx(math.exp(want.sum() / x.size), rel=1e-5)
    with pytest.raises(ValueError, match="outside the judge's vocabulary"):
        evaluate.generative_perplexity(nll, np.full((2, 12), 7))  # a MASK id left in a sample
    with pytest.raises(ValueError, match="exceed the judge's length"):
        evaluate.generative_perplexity(nll, np.zeros((2, 13), np.int32))


@pytest.mark.dtypes  # end to end: .ci/run runs it again in the other compute dtype
def test_ar_trains_with_the_same_trainer(tmp_path, caplog):
    c = config_lib.load_config("markov")
    c.model.kind = "ar"
    c.model.hidden_size, c.model.n_layers, c.model.n_heads, c.model.cond_dim = 16, 1, 2, 8
    c.data.seq_len, c.data.markov.num_tokens = 16, 20_000
    c.training.batch_size, c.training.n_iters, c.training.log_every = 8, 6, 3
    c.training.eval_every = c.training.ckpt_every = 6
    c.training.eval_batches, c.training.eval_samples = 1, 1
    out = train.train(c, tmp_path / "ar", quiet=True)
    # An untrained AR model predicts ~uniformly: ~log 8 = 2.08 nats per token.
    assert 1.0 < out["val_estimate_nats_per_token"] < 2.5
    # The reported figure of an AR run is its exact NLL (no Monte Carlo error), here of the same 1 batch.
    assert out["bound"]["kind"] == "ar" and out["bound"]["stderr_nats_per_token"] == 0.0
    np.testing.assert_allclose(out["bound"]["nats_per_token"], out["val_estimate_nats_per_token"], rtol=1e-5)
    run = runs.load(tmp_path / "ar")
    ids = run.sample(jax.random.key(0), 2).tokens  # through causal.ancestral
    assert ids.shape == (2, 16) and (ids < 8).all()
    greedy = [run.sample(jax.random.key(k), 2, temperature=0.0).tokens for k in (0, 1)]  # was refused: the argmax
    np.testing.assert_array_equal(*greedy)
    assert (greedy[0] == greedy[0][0]).all()
    # The second call reuses the compiled program: causal.ancestral leaves the loaded model's state as it was (the
    # jitted call once wrote it back placed on the mesh, so the next call traced and compiled again).
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level(logging.WARNING):
            run.sample(jax.random.key(1), 2)
    finally:
        jax.config.update("jax_log_compiles", False)
    assert not [r for r in caplog.records if "Compiling jit(_sample)" in r.getMessage()]


def test_the_caller_held_cache_matches_full_forward_pass():
    """``causal.decode_in_cache`` (what ``causal.ancestral`` decodes with up to max_len): each step's logits."""
    model = _ar_model()
    x = jax.random.randint(jax.random.key(4), (3, 12), 0, 7)
    full = causal.next_token_logits(model, x)  # (B, L, V)
    step = jax.jit(lambda cache, prev, pos: causal.decode_in_cache(model, cache, prev[:, None], pos))
    cache = model.empty_cache(3, 12)
    prev = jnp.full((3,), causal.bos_id(model), jnp.int32)
    for pos in range(12):
        logits, cache, _ = step(cache, prev, jnp.int32(pos))
        np.testing.assert_allclose(
            jax.nn.log_softmax(logits[:, 0]), jax.nn.log_softmax(full[:, pos]), atol=2e-5, err_msg=f"position {pos}"
        )
        prev = x[:, pos]
