"""sedd.data.markov: exact law against brute force, and the dataset interface."""

import itertools
import math

import numpy as np
import pytest

from sedd import data as data_lib
from sedd.data.markov import MarkovChain, MarkovData
from sedd.data.tokenizers import MarkovTokenizer


def test_log_prob_is_a_law_and_entropy_matches_enumeration():
    chain = MarkovChain(vocab_size=3, order=2, seed=1, alpha=0.5)
    length = 5
    seqs = np.array(list(itertools.product(range(3), repeat=length)))
    logp = chain.log_prob(seqs)
    p = np.exp(logp)
    assert p.sum() == pytest.approx(1.0, abs=1e-10)
    assert -(p * logp).sum() == pytest.approx(chain.sequence_entropy(length), rel=1e-9)
    # Stationarity: the law of a window does not depend on where it starts, so
    # the marginal of the last two tokens is the context law pi.
    last = seqs[:, -2] * 3 + seqs[:, -1]
    np.testing.assert_allclose(np.bincount(last, weights=p, minlength=9), chain.stationary, atol=1e-10)
    assert chain.log_prob([0, 9, 1]) == -math.inf  # an id outside the vocabulary (e.g. a mask)


def test_stream_follows_the_law():
    chain = MarkovChain(vocab_size=4, order=1, seed=0, alpha=0.5)
    stream = chain.sample_stream(100_000, seed=3)
    # The empirical NLL of a long stream approaches the entropy rate.
    assert -chain.log_prob(stream) / len(stream) == pytest.approx(chain.entropy_rate(), abs=0.02)
    same = chain.sample_stream(50, seed=3)
    np.testing.assert_array_equal(same, stream[:50])


def test_markov_dataset_has_the_text_data_interface():
    cfg = {"name": "markov", "seq_len": 16}
    import ml_collections

    cfg = ml_collections.ConfigDict(cfg)
    cfg.markov = ml_collections.ConfigDict(dict(vocab_size=5, order=1, seed=0, alpha=0.3, num_tokens=4000))
    ds = data_lib.load_dataset(cfg)
    assert isinstance(ds, MarkovData) and ds.tokenizer.vocab_size == 5
    batch = next(ds.train_batches(4))
    assert batch.shape == (4, 16) and batch.dtype == np.int32 and batch.max() < 5
    assert next(ds.eval_batches(4)).shape == (4, 16)
    assert ds.num_tokens("train") == 4000 and ds.chars_per_token == 1.0
    assert 0 < ds.unigram_entropy_bits() <= math.log2(5)
    tok = data_lib.tokenizer_from_dict(ds.tokenizer.to_dict())
    assert isinstance(tok, MarkovTokenizer) and tok.decode([0, 1, 4]) == "abe"
    assert 0 < ds.true_nats_per_token() < math.log(5)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_posteriors_match_enumeration_given_any_revealed_tokens(order):
    chain = MarkovChain(vocab_size=3, order=order, seed=1, alpha=0.5)
    length = 6
    seqs = np.array(list(itertools.product(range(3), repeat=length)))
    p = np.exp(chain.log_prob(seqs))
    x = chain.sample(20, length, seed=2).astype(np.int64)
    x[np.random.default_rng(0).random(x.shape) < 0.5] = -1  # hide about half the tokens
    x[0] = -1  # nothing revealed: the stationary marginals
    post = chain.posteriors(x)
    for row, got in zip(x, post):
        agrees = ((row < 0) | (seqs == row)).all(-1)  # the sequences the revealed tokens allow
        want = np.stack([np.bincount(seqs[:, t], weights=p * agrees, minlength=3) for t in range(length)])
        np.testing.assert_allclose(got, want / want.sum(-1, keepdims=True), atol=1e-12)
    with pytest.raises(ValueError, match="hidden"):
        chain.posteriors([[0, 5, 1]])
