"""sedd.evaluate: the bound is tight at the exact score; gen-PPL, entropy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sedd import config as config_lib
from sedd import evaluate, figures, graphs, noise as noise_lib, runs, train
from sedd.data import load_dataset
from sedd.data.tokenizers import MarkovTokenizer

from reference import all_sequences, exact_score_fn


def enumerate_law(vocab, length, seed=0):
    """All V^L sequences and a random law over them with full support."""
    seqs = all_sequences(vocab, length).astype(np.int32)  # (N, L)
    probs = np.random.default_rng(seed).dirichlet(np.full(len(seqs), 0.5))
    probs = (probs + 1e-3) / (1 + len(seqs) * 1e-3)
    return jnp.asarray(seqs), jnp.asarray(probs, jnp.float32)


@pytest.mark.parametrize("graph", [graphs.Absorbing(3), graphs.Uniform(3)], ids=["absorbing", "uniform"])
def test_bound_is_tight_at_the_exact_score(graph):
    """At the exact score the bound equals -log p0(x) for every x, within its Monte Carlo error.

    The reverse chain of the exact score started from the true p_1 is the time
    reversal of the forward chain, so the ELBO is an equality; what remains is
    the prior mismatch (~e^{-20}) and the omitted low-noise end (~1e-4 nats).
    """
    seqs, probs = enumerate_law(3, 3)
    noise = noise_lib.Geometric(1e-4, 20.0)
    score_fn = exact_score_fn(graph, seqs, probs)
    bound, err = evaluate.likelihood_bound_with_stderr(
        jax.random.key(0), score_fn, graph, noise, seqs, num_t=256, num_samples=32, t_batch=16
    )
    bound, err = np.asarray(bound), np.asarray(err)
    nll = -np.log(np.asarray(probs))
    assert np.all(err < 0.2) and err.mean() < 0.08, err  # rare sequences have the widest errors
    z = (bound - nll) / err
    assert np.all(np.abs(z) < 4.5), (z, bound, nll)
    # The 27 sequences share each repetition's time grid, so their errors are
    # correlated; the mean error (not the pooled one) bounds the mean deviation.
    assert abs(float(np.mean(bound - nll))) < 3 * float(err.mean())


def test_bound_is_an_upper_bound_for_a_wrong_score_and_prior_kl():
    graph = graphs.Absorbing(3)
    seqs, probs = enumerate_law(3, 2)
    noise = noise_lib.LogLinear(1e-3)

    def flat(x, sigma):
        return jnp.where(
            jax.nn.one_hot(x, graph.dim, dtype=bool), 0.0, -graphs.log_expm1(sigma)[:, None, None] - math.log(3.0)
        )

    bound, err = evaluate.likelihood_bound_with_stderr(
        jax.random.key(1), flat, graph, noise, seqs, num_t=64, num_samples=2
    )
    # A model that ignores context: each token at 1/3; its exact NLL is 2 log 3 per sequence.
    np.testing.assert_allclose(bound, 2 * math.log(3.0), atol=5 * float(err.max()) + 0.02)
    kl = evaluate.prior_kl(graph, noise, seqs)
    np.testing.assert_allclose(kl, 2 * 1e-3 * math.log(3.0), rtol=1e-3)
    kl_u = evaluate.prior_kl(graphs.Uniform(3), noise_lib.Geometric(1e-4, 20.0), seqs)
    assert np.all(np.asarray(kl_u) < 1e-6)
    with pytest.raises(ValueError, match="num_t"):
        evaluate.likelihood_bound(jax.random.key(0), flat, graph, noise, seqs, num_t=0)


def test_prior_kl_equals_the_kl_to_the_mean_of_the_rows():
    """prior_kl's closed-form base law against b = (1/V) sum_v exp(sigma(1) Q)[v, :], by brute force."""
    x0 = jnp.array([[0, 2, 1], [3, 3, 0]])
    for graph in (graphs.Absorbing(4), graphs.Uniform(4)):
        for noise in (noise_lib.LogLinear(1e-3), noise_lib.Geometric(1e-4, 2.0)):
            sigma1 = noise(jnp.float32(1.0))[0]
            base = np.asarray(graph.transition(jnp.arange(4), sigma1), np.float64).mean(0)  # (D,)
            q = np.asarray(graph.transition(x0, sigma1), np.float64)  # (B, L, D)
            want = np.where(q > 0, q * (np.log(np.where(q > 0, q, 1.0)) - np.log(base)), 0.0).sum((-1, -2))
            # atol: float32 cancels in q (log q - log b) where q ~ b (uniform, sigma(1) = 6.9: KL ~ 4e-6).
            np.testing.assert_allclose(evaluate.prior_kl(graph, noise, x0), want, rtol=1e-5, atol=5e-7)


def test_dataset_bound_units():
    graph, noise = graphs.Uniform(3), noise_lib.Geometric(1e-4, 20.0)
    seqs, probs = enumerate_law(3, 2)
    score_fn = exact_score_fn(graph, seqs, probs)
    out = evaluate.dataset_bound(
        jax.random.key(0), score_fn, graph, noise, [seqs[:4], seqs[4:8]], num_t=16, chars_per_token=1.0
    )
    assert out["num_tokens"] == 16 and out["num_sequences"] == 8
    assert out["bits_per_char"] == pytest.approx(out["nats_per_token"] / math.log(2))
    assert out["ppl_bound"] == pytest.approx(math.exp(out["nats_per_token"]))


def test_sample_entropy_and_vocabulary_check():
    h = evaluate.sample_entropy_bits([[0, 0, 0, 0], [0, 1, 2, 3], [0, 0, 1, 1]])
    np.testing.assert_allclose(h, [0.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="another vocabulary"):
        figures.check_same_vocabulary(MarkovTokenizer(8), MarkovTokenizer(9))


@pytest.mark.slow
def test_trained_bound_approaches_the_true_entropy(tmp_path):
    """On Markov data the bound of a trained model lies above the data's entropy and falls with training.

    About 3 minutes on 2 CPU cores; figures of longer runs are in docs/evaluation.md.
    """
    c = config_lib.load_config("markov")
    c.data.markov.num_tokens = 200_000
    c.training.n_iters, c.training.eval_every, c.training.ckpt_every = 600, 600, 300  # both steps it loads
    c.training.keep_period = 300
    train.train(c, tmp_path / "run", quiet=True, final=False)
    ds = load_dataset(c.data)
    x0 = jnp.asarray(next(ds.eval_batches(64)))
    true = ds.true_nats_per_token()
    figures = {}
    for step in (300, 600):
        run = runs.load(tmp_path / "run", step=step)
        b, e = evaluate.likelihood_bound_with_stderr(
            jax.random.key(0), run.score_fn, run.graph, run.noise, x0, num_t=64
        )
        figures[step] = (float(b.mean()) / x0.shape[1], float(jnp.sqrt((e**2).sum())) / x0.size)
    print(figures, "true", true)
    assert figures[600][0] < figures[300][0]
    assert figures[600][0] > true - 3 * figures[600][1]
    assert figures[600][0] < math.log(8)  # well below a model that knows nothing
