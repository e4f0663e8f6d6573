"""Speculative sampling keeps the target's law exactly, whatever the drafter: checked over all V^L sequences.

The target is a random law P over V^L = 3^6 sequences, its conditionals
p(x_l | x_<l) computed exactly from P. Draws of ``sedd.speculative.decode``
are held within a TV bound from the sample size (``reference.tv_noise_bound``)
of the exact law, for drafters that propose well, badly and in the wrong
order; and a drafter whose q is not the law (1) of ``sedd.speculative``
shows the test can fail.
"""

from __future__ import annotations

import functools
import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
from sedd import sampling, speculative

V, L, N = 3, 6, 100_000
SEQS = reference.all_sequences(V, L)  # (V^L, L)


def _joint(seed: int, concentration: float) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.full(V**L, concentration))


def _conditionals(joint: np.ndarray) -> np.ndarray:
    """float64[L, V^(L-1), V]: p(x_l = v | prefix id of x_<l) (base-V id; rows past V^l unused)."""
    out = np.full((L, V ** (L - 1), V), 1.0 / V)
    for l in range(L):
        marg = joint.reshape((V**l, V, -1)).sum(-1)  # (V^l, V): P(x_<l, x_l)
        total = marg.sum(-1, keepdims=True)
        out[l, : V**l] = np.where(total > 0, marg / np.where(total > 0, total, 1.0), 1.0 / V)
    return out


def _ahead(joint: np.ndarray, k: int) -> np.ndarray:
    """float64[L, k, V^(L-1), V]: P(x_{s+i} = v | x_<s), the position i ahead of a prefix of length s."""
    out = np.full((L, k, V ** (L - 1), V), 1.0 / V)
    for s in range(L):
        for i in range(k):
            if s + i >= L:
                continue
            marg = joint.reshape((V**s, V**i, V, -1)).sum((1, 3))  # (V^s, V)
            total = marg.sum(-1, keepdims=True)
            out[s, i, : V**s] = np.where(total > 0, marg / np.where(total > 0, total, 1.0), 1.0 / V)
    return out


def _prefix_ids(text: jax.Array) -> jax.Array:
    """int32[B, T + 1]: the base-V id of text[:, :l] at column l."""
    ids = [jnp.zeros(text.shape[:1], jnp.int32)]
    for l in range(text.shape[1]):
        ids.append(ids[-1] * V + text[:, l])
    return jnp.stack(ids, 1)


def _lookup(table: jax.Array, positions: jax.Array, ids: jax.Array) -> jax.Array:
    """table[l, id] for each row's positions (B, n) and prefix ids; uniform past L (the tail is discarded)."""
    inside = positions < L
    got = table[jnp.minimum(positions, L - 1), jnp.where(inside, ids, 0) % V ** (L - 1)]  # (B, n, V)
    return jnp.where(inside[..., None], got, 1.0 / V)


def _target(cond: jax.Array):
    """The target of ``decode``: its exact conditionals at start .. start + k."""

    def target(state, text, start, k):
        positions = start[:, None] + jnp.arange(k + 1)[None, :]  # (B, k + 1)
        ids = jnp.take_along_axis(_prefix_ids(text), positions, axis=1)
        return _lookup(cond, positions, ids), state

    return target


def _left_to_right(cond: jax.Array):
    """A drafter drawing y_0, y_1, ... in turn from the conditionals `cond` (of any law): q is (1) as drawn."""

    def drafter(key, state, text, start, k):
        qs, ys = [], []
        for i in range(k):
            pos = start + i
            ids = jnp.take_along_axis(_prefix_ids(text), pos[:, None], axis=1)
            q = _lookup(cond, pos[:, None], ids)[:, 0]  # (B, V)
            y = jax.random.categorical(jax.random.fold_in(key, i), jnp.log(q)).astype(jnp.int32)
            text = text.at[jnp.arange(text.shape[0]), pos].set(y)
            qs.append(q), ys.append(y)
        return jnp.stack(ys, 1), jnp.stack(qs, 1), state

    return drafter


def _one_step(ahead: jax.Array):
    """A block drafted in one step: each y_i ~ its law given the prefix alone, independently (q_i is that law)."""

    def drafter(key, state, text, start, k):
        ids = jnp.take_along_axis(_prefix_ids(text), start[:, None], axis=1)[:, 0]  # (B,)
        inside = (start[:, None] + jnp.arange(k)[None, :]) < L  # (B, k)
        q = ahead[jnp.minimum(start, L - 1)[:, None], jnp.arange(k)[None, :], (ids % V ** (L - 1))[:, None]]
        q = jnp.where(inside[..., None], q, 1.0 / V)  # (B, k, V)
        y = jax.random.categorical(key, jnp.log(q)).astype(jnp.int32)
        return y, q, state

    return drafter


def _fewer(drafter):
    """`drafter` with a row's drafts cut to its first count = start mod 4 (0: a round that writes one token)."""

    def fewer(key, state, text, start, k):
        drafted, q, state = drafter(key, state, text, start, k)
        return drafted, q, state, jnp.minimum(start % 4, k).astype(jnp.int32)

    return fewer


def _last_first(cond: jax.Array, ahead: jax.Array, right_q: bool):
    """k = 2 drafted in the wrong order: y_1 ~ D(x_{s+1} | x_<s) first, then y_0 ~ D(x_s | x_<s, x_{s+1} = y_1).

    Its joint is D's; (1) asks for D's left-to-right conditionals, D(y_0 | x_<s) and D(y_1 | x_<s, y_0)
    (right_q); the laws the sampler drew from, D(y_0 | x_<s, y_1) and D(y_1 | x_<s), are not (1).
    """

    def drafter(key, state, text, start, k):
        assert k == 2
        rows = jnp.arange(text.shape[0])
        s = jnp.minimum(start, L - 1)
        ids = jnp.take_along_axis(_prefix_ids(text), start[:, None], axis=1)[:, 0] % V ** (L - 1)
        inside0, inside1 = start < L, start + 1 < L
        m0 = jnp.where(inside0[:, None], ahead[s, 0, ids], 1.0 / V)  # D(x_s | prefix)
        m1 = jnp.where(inside1[:, None], ahead[s, 1, ids], 1.0 / V)  # D(x_{s+1} | prefix)
        k1, k0 = jax.random.split(key)
        y1 = jax.random.categorical(k1, jnp.log(m1)).astype(jnp.int32)
        # D(x_s = v | prefix, x_{s+1} = y1) ∝ D(x_s = v | prefix) D(x_{s+1} = y1 | prefix, x_s = v)
        after = (ids[:, None] * V + jnp.arange(V)[None, :]) % V ** (L - 1)  # (B, V): the prefix then v
        nxt = jnp.where(inside1[:, None, None], cond[jnp.minimum(s + 1, L - 1)[:, None], after], 1.0 / V)  # (B, V, V)
        joint0 = m0 * nxt[rows, :, y1]  # (B, V) over v
        post0 = joint0 / joint0.sum(-1, keepdims=True)
        y0 = jax.random.categorical(k0, jnp.log(post0)).astype(jnp.int32)
        if right_q:
            q0, q1 = m0, nxt[rows, y0]  # D(y_0 | prefix), D(y_1 | prefix, y_0)
        else:
            q0, q1 = post0, m1
        return jnp.stack([y0, y1], 1), jnp.stack([q0, q1], 1), state

    return drafter


def _adversary(cond: np.ndarray) -> np.ndarray:
    """Conditionals that put 0.98 on the token the target finds least likely: acceptance near 0."""
    worst = np.eye(V)[np.argmin(cond, -1)]
    return 0.98 * worst + 0.02 * (1 - worst) / (V - 1)


def _draws(target, drafter, k: int, seed: int = 0, verification: str = "joint") -> tuple[np.ndarray, dict]:
    prompt = jnp.zeros((N, L), jnp.int32)
    text, stats = speculative.decode(
        jax.random.key(seed),
        None,
        None,
        prompt,
        jnp.zeros((N,), jnp.int32),
        target=target,
        drafter=drafter,
        length=L,
        k=k,
        verification=verification,
    )
    return np.asarray(text), jax.tree.map(np.asarray, stats)


@functools.lru_cache(maxsize=None)
def _laws():
    p = _joint(0, 0.3)  # the target
    d = _joint(1, 0.1)  # another law, for drafters that propose something else
    return p, d


def _shaped(joint: np.ndarray, temperature: float, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The conditionals of the joint with temperature and nucleus applied, and the joint they define."""
    cond = _conditionals(joint)
    logits = np.log(np.maximum(cond, 1e-300)) / temperature
    shaped = np.asarray(sampling.nucleus(jax.nn.softmax(jnp.asarray(logits, jnp.float32), -1), top_p), np.float64)
    law = np.ones(len(SEQS))
    for l in range(L):
        ids = reference.seq_index(SEQS[:, :l], V) if l else np.zeros(len(SEQS), int)
        law *= shaped[l, ids, SEQS[:, l]]
    return shaped, law / law.sum()


TOKEN_CORE = ("other_left_to_right", "last_first_exact_q")
CASES = {
    "perfect": lambda p, d: (_left_to_right(jnp.asarray(_conditionals(p), jnp.float32)), 3),
    "useless": lambda p, d: (_left_to_right(jnp.asarray(_adversary(_conditionals(p)), jnp.float32)), 3),
    "other_left_to_right": lambda p, d: (_left_to_right(jnp.asarray(_conditionals(d), jnp.float32)), 3),
    "one_step_block": lambda p, d: (_one_step(jnp.asarray(_ahead(d, 3), jnp.float32)), 3),
    "fewer_drafts_some_rounds": lambda p, d: (_fewer(_left_to_right(jnp.asarray(_conditionals(d), jnp.float32))), 3),
    "last_first_exact_q": lambda p, d: (
        _last_first(jnp.asarray(_conditionals(d), jnp.float32), jnp.asarray(_ahead(d, 2), jnp.float32), True),
        2,
    ),
}


# Token verification on every drafter behind -m slow (the default suite's 900 CPU s): by default on the two
# drafters whose q is not the target's (another left-to-right law, and one that drafts last first).
@pytest.mark.parametrize(
    "case,verification",
    [
        (case, verification)
        if verification == "joint" or case in TOKEN_CORE
        else pytest.param(case, verification, marks=pytest.mark.slow)
        for case in CASES
        for verification in speculative.VERIFICATIONS
    ],
)
def test_speculative_sampling_draws_the_targets_law(case, verification):
    """Whatever the drafter, the text has the target's law: TV to the exact law within the sample's noise."""
    p, d = _laws()
    drafter, k = CASES[case](p, d)
    text, stats = _draws(_target(jnp.asarray(_conditionals(p), jnp.float32)), drafter, k, verification=verification)
    distance = reference.tv(reference.empirical_law(text, V), p)
    assert distance < reference.tv_noise_bound(p, N), (case, distance)
    per_round = L / stats["rounds_per_sample"].mean()  # tokens a target call
    acceptance = stats["accepted_at"] / stats["rounds_per_sample"].sum()
    if case == "perfect":  # q = p: every draft accepted, k + 1 tokens a call until the end
        assert acceptance.min() > 0.6 and per_round > 2.5, (acceptance, per_round)
    if case == "useless":
        assert acceptance[0] < 0.3 and acceptance[1:].max() < 0.1 and per_round < 1.3, (acceptance, per_round)


@pytest.mark.parametrize(
    "temperature,top_p",
    [pytest.param(0.7, 1.0, marks=pytest.mark.slow), pytest.param(1.0, 0.9, marks=pytest.mark.slow), (0.7, 0.9)],
)  # each alone behind -m slow (the default suite's 900 CPU s): both together by default
def test_temperature_and_top_p_shape_the_target_law(temperature, top_p):
    """With the target's conditionals tempered and cut to their nucleus, the text has the shaped AR law."""
    p, d = _laws()
    shaped, law = _shaped(p, temperature, top_p)
    text, _ = _draws(_target(jnp.asarray(shaped, jnp.float32)), _one_step(jnp.asarray(_ahead(d, 3), jnp.float32)), 3)
    assert reference.tv(reference.empirical_law(text, V), law) < reference.tv_noise_bound(law, N)


def test_a_q_that_is_not_the_left_to_right_law_breaks_exactness():
    """The same wrong-order drafter with the laws it drew from as q (not (1)): far from the target's law."""
    p, d = _laws()
    target = _target(jnp.asarray(_conditionals(p), jnp.float32))
    drafter = _last_first(jnp.asarray(_conditionals(d), jnp.float32), jnp.asarray(_ahead(d, 2), jnp.float32), False)
    text, _ = _draws(target, drafter, 2)
    assert reference.tv(reference.empirical_law(text, V), p) > 2 * reference.tv_noise_bound(p, N)  # 0.088 vs 0.030


@pytest.mark.parametrize("verification", speculative.VERIFICATIONS)
def test_verify_counts_and_writes_by_hand(verification):
    """verify on laws with a known outcome: all accepted plus the extra token; a sure rejection redrawn."""
    k, v = 3, 4
    p = jnp.tile(jax.nn.one_hot(jnp.asarray([2, 1, 3, 0]), v)[None], (2, 1, 1))  # (B, k + 1, V) certain
    q = jnp.tile(jax.nn.one_hot(jnp.asarray([2, 1, 0]), v)[None], (2, 1, 1))
    drafted = jnp.asarray([[2, 1, 0], [2, 1, 0]])
    verify = jax.jit(speculative.verify, static_argnames="method")  # eagerly: an op a compile
    round_law = jax.jit(speculative.round_law, static_argnums=3)
    accepted, tokens = verify(jax.random.key(0), p, q, drafted, method=verification)
    assert accepted.tolist() == [2, 2] and tokens[:, :3].tolist() == [[2, 1, 3], [2, 1, 3]]
    accepted, tokens = verify(jax.random.key(0), p, p[:, :k], jnp.asarray([[2, 1, 3]] * 2), method=verification)
    assert accepted.tolist() == [3, 3] and tokens.tolist() == [[2, 1, 3, 0]] * 2
    stop, after = round_law(p[:, :1], q[:, :0], drafted[:, :0], verification)  # k = 0: no drafts
    assert stop.tolist() == [[1.0]] * 2 and np.array_equal(after, p[:, :1])
    # the first draft ruled out by p, the second drawn at a q so small that p / q overflows to inf: none kept
    stop, after = round_law(
        jnp.asarray([[[0.0, 1.0], [0.5, 0.5], [0.5, 0.5]]]),
        jnp.asarray([[[1.0, 0.0], [1.0 - 1e-45, 1e-45]]]),
        jnp.asarray([[0, 1]]),
        verification,
    )
    assert stop.tolist() == [[1.0, 0.0, 0.0]] and np.isfinite(after).all() and after[0, 0].tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="verification must be one of"):
        speculative.round_law(p, q, drafted, "tree")


def _round_outputs(p_of, q_of, k: int, verification: str, count: int | None = None) -> tuple[dict, float]:
    """The exact law of what one round writes (a string of 1 .. k + 1 tokens), summed over every draft.

    p_of(prefix) and q_of(prefix) are the target's and the drafter's laws after a tuple of tokens.
    count: the round's drafts are its first count (``round_law``'s), the rest uniform junk.
    Returns ({written string: probability}, the expected drafts kept).
    """
    drafts = list(itertools.product(range(V), repeat=k))
    c = k if count is None else count
    p = np.stack([[p_of(d[:i]) for i in range(k + 1)] for d in drafts])  # (V^k, k + 1, V)
    q = np.stack([[q_of(d[:i]) for i in range(k)] for d in drafts])  # (V^k, k, V)
    stop, after = speculative.round_law(
        jnp.asarray(p, jnp.float32),
        jnp.asarray(q, jnp.float32),
        jnp.asarray(drafts, jnp.int32),
        verification,
        None if count is None else jnp.full((len(drafts),), count, jnp.int32),
    )
    stop, after = np.asarray(stop, np.float64), np.asarray(after, np.float64)
    assert np.all(stop[:, c + 1 :] == 0), "a round kept more drafts than it had"
    law, kept = {}, 0.0
    for n, d in enumerate(drafts):
        weight = np.prod([q[n, i, d[i]] for i in range(c)]) / V ** (k - c)  # P(these drafts), the junk uniform
        for j in range(k + 1):
            kept += weight * stop[n, j] * j
            for v in range(V):
                law[d[:j] + (v,)] = law.get(d[:j] + (v,), 0.0) + weight * stop[n, j] * after[n, j, v]
    return law, kept


@pytest.mark.parametrize("count", [0, 1, 2])
def test_a_round_of_fewer_drafts_writes_the_targets_law_exactly(count):
    """By enumeration: a round told to use only its first `count` of k = 3 drafts (``round_law``'s count) keeps
    at most those, writes the token after them from p, and its string continued by the target has p's law."""
    k, rng = 3, np.random.default_rng(11)
    prefixes = [t for n in range(k + 1) for t in itertools.product(range(V), repeat=n)]
    p_law = {t: rng.dirichlet(np.ones(V)) for t in prefixes}
    q_law = {t: rng.dirichlet(np.full(V, 0.5)) for t in prefixes}

    def p_joint(w):
        return np.prod([p_law[w[:i]][w[i]] for i in range(len(w))])

    for verification in speculative.VERIFICATIONS:
        law, kept = _round_outputs(p_law.__getitem__, q_law.__getitem__, k, verification, count)
        assert kept <= count + 1e-6
        for w in itertools.product(range(V), repeat=k + 1):
            continued = sum(law.get(w[: j + 1], 0.0) * p_joint(w) / p_joint(w[: j + 1]) for j in range(k + 1))
            assert abs(continued - p_joint(w)) < 1e-5, (verification, count, w, continued, p_joint(w))


@pytest.mark.parametrize("drafter", ["another_law", "the_target"])
def test_a_round_writes_the_targets_law_exactly(drafter):
    """By enumeration, no sampling: a round's string, continued by the target, has the target's law.

    Over every draft of k = 3 tokens (V = 3), with laws that depend on the whole prefix: for every
    string w of k + 1 tokens, sum_j P(the round writes w_<=j) p(w_>j | w_<=j) = p(w), for both
    verifications; joint verification keeps at least as many drafts on average (Sun et al.),
    and with q = p both keep all k.
    """
    k, rng = 3, np.random.default_rng(7)
    prefixes = [t for n in range(k + 1) for t in itertools.product(range(V), repeat=n)]
    p_law = {t: rng.dirichlet(np.ones(V)) for t in prefixes}
    q_law = p_law if drafter == "the_target" else {t: rng.dirichlet(np.full(V, 0.5)) for t in prefixes}

    def p_joint(w):
        return np.prod([p_law[w[:i]][w[i]] for i in range(len(w))])

    kept = {}
    for verification in speculative.VERIFICATIONS:
        law, kept[verification] = _round_outputs(p_law.__getitem__, q_law.__getitem__, k, verification)
        for w in itertools.product(range(V), repeat=k + 1):
            continued = sum(law.get(w[: j + 1], 0.0) * p_joint(w) / p_joint(w[: j + 1]) for j in range(k + 1))
            assert abs(continued - p_joint(w)) < 1e-5, (verification, w, continued, p_joint(w))
    if drafter == "the_target":
        assert kept["joint"] == pytest.approx(k, abs=1e-4) and kept["token"] == pytest.approx(k, abs=1e-4)
    else:  # 1.27 against 1.18 drafts a round with this seed
        assert kept["joint"] > kept["token"] + 0.05, kept


# --------------------------------------------------------------------------- an AR network as the target


@functools.lru_cache(maxsize=None)
def _tiny_ar(scale: float = 0.5):
    """A tiny AR network over V = 3 tokens, L = 6 (weights perturbed by `scale`), and its exact law over all 3^6."""
    import ml_collections
    from flax import nnx

    from sedd import kinds

    from sedd.kinds import causal
    from sedd import config as config_lib

    config = config_lib.load_config(
        "tiny", ["--config.model.kind=ar", "--config.model.n_layers=1", f"--config.data.seq_len={L}"]
    )
    config = ml_collections.ConfigDict(config.to_dict())
    config.vocab_size = V
    graphdef, params, rest = nnx.split(kinds.get(config).network(0), nnx.Param, ...)
    params = reference.perturbed(params, scale, 5)
    nll = np.asarray(causal.nll(nnx.merge(graphdef, params, rest), jnp.asarray(SEQS)), np.float64)
    law = np.exp(-nll)
    return graphdef, (params, rest), law / law.sum()


@pytest.mark.parametrize("drafter", ["ngram", pytest.param("other_law", marks=pytest.mark.slow)])  # slow: 900 CPU s
def test_an_ar_network_as_target_keeps_its_law(drafter):
    """The AR network with its KV cache as the target, rolled back after each round: the text has its exact law."""
    from sedd.kinds import causal

    # Weights of a spread law: a round whose writes wrapped around a cache of max_len rows (start + k >= L)
    # overwrote position 0, which this law shows (TV 0.16 against a bound of 0.05 at N // 2 draws, 0.07 at the
    # N // 8 drawn here) and a peaked one hid.
    graphdef, state, law = _tiny_ar(0.2)
    prefill, target = causal.speculative_target(graphdef)
    k = 3
    draft = (
        speculative.ngram_drafter(V, 2)
        if drafter == "ngram"
        else _left_to_right(jnp.asarray(_conditionals(_laws()[1]), jnp.float32))
    )
    n = N // 8
    prompt = jnp.zeros((n, L), jnp.int32)
    text, stats = speculative.decode(
        jax.random.key(1),
        prefill(state, prompt[:, :0]),
        None,
        prompt,
        jnp.zeros((n,), jnp.int32),
        target=target,
        drafter=draft,
        length=L,
        k=k,
    )
    assert reference.tv(reference.empirical_law(np.asarray(text), V), law) < reference.tv_noise_bound(law, n)
    assert stats["rounds_per_sample"].mean() < L - 0.5  # drafts were kept: fewer target calls than tokens


def test_rollback_leaves_the_cache_of_the_accepted_text():
    """After a round that kept 1 of 3 drafts, the cache equals one built from scratch on the accepted text."""
    from sedd.kinds import causal

    graphdef, state, _ = _tiny_ar()
    prefill, target = causal.speculative_target(graphdef)
    prefill, target = jax.jit(prefill), jax.jit(target, static_argnums=3)  # eagerly: an op a compile
    text = jnp.asarray([[0, 2, 1, 1, 0, 2, 0, 0, 0, 0]], jnp.int32)  # x_0, x_1, then drafts 1, 1, 0 at 2..4
    _, after = target(prefill(state, text[:, :2]), text, jnp.asarray([2]), 3)  # scores positions 2..5
    accepted = text.at[0, 3].set(2)  # d_0 = 1 kept at position 2, position 3 redrawn as 2: start' = 4
    fresh = prefill(state, accepted[:, :4])
    for a, b in zip(jax.tree.leaves(after[1]), jax.tree.leaves(fresh[1])):  # every block's keys, values [B N, S, K]
        np.testing.assert_array_equal(np.asarray(a)[:, :4], np.asarray(b)[:, :4])  # the rows before 4
    p_rolled, _ = target(after, accepted, jnp.asarray([4]), 3)
    p_fresh, _ = target(fresh, accepted, jnp.asarray([4]), 3)
    np.testing.assert_allclose(np.asarray(p_rolled), np.asarray(p_fresh), rtol=1e-6, atol=1e-7)


def test_a_text_longer_than_the_prefilled_cache_is_refused_by_name():
    """The cache holds max(max_len, P) + MAX_DRAFTS + 1 rows; a longer text buffer would write over other rows."""
    from sedd.kinds import causal

    graphdef, state, _ = _tiny_ar()
    prefill, target = causal.speculative_target(graphdef)
    cached = prefill(state, jnp.zeros((1, 2), jnp.int32))
    rows = jax.tree.leaves(cached[1])[0].shape[-2]
    with pytest.raises(ValueError, match=rf"text buffer of {rows + 1} positions does not fit .* {rows} slots"):
        target(cached, jnp.zeros((1, rows + 1), jnp.int32), jnp.asarray([2]), 3)


def test_an_ar_run_samples_with_drafts_from_itself_and_from_ngrams():
    """Run.sample(draft=...): a drafter equal to the target keeps nearly every draft, k + 1 tokens a call."""
    from test_golden import _cached_run

    run = _cached_run("ar")
    for draft in ("ngram", run):
        out = run.sample(jax.random.key(0), 3, draft=draft, draft_k=3, return_stats=True)
        assert out.tokens.shape == (3, run.seq_len) and out.tokens.max() < run.config.vocab_size
        calls = out.stats["nfe_per_sample"].mean()
        if draft is run:  # p = q up to rounding: every round writes k + 1 = 4 tokens
            assert calls <= run.seq_len / 4 + 1, calls
        else:
            assert calls <= run.seq_len, calls
    prompt = run.generate(jax.random.key(1), 2, prefix="ab", draft="ngram")
    assert all(t.startswith("ab") for t in prompt)


def test_an_ar_network_drafting_after_a_prompt_keeps_the_targets_law():
    """ar.speculative_sample with a prompt, another AR network drafting (both prefilled in the one program): the
    text continues the prompt with the target's law given it, by enumeration; at temperature 0 its greedy text."""
    from sedd.kinds import ar, causal

    graphdef, state, law = _tiny_ar(0.2)
    draft = ar.ARDraft(*_tiny_ar(0.5)[:2])
    given = np.array([1, 2])
    cond = law * (SEQS[:, :2] == given).all(1)
    cond /= cond.sum()  # the target's law of the texts that start with the prompt
    n = N // 8
    prompt = jnp.asarray(np.tile(given, (n, 1)), jnp.int32)
    text, stats = ar.speculative_sample(jax.random.key(3), graphdef, state, n, L, 3, draft, prompt=prompt)
    assert reference.tv(reference.empirical_law(np.asarray(text), V), cond) < reference.tv_noise_bound(cond, n)
    assert np.asarray(stats["nfe_per_sample"]).mean() < L - 2 - 0.5  # drafts were kept
    greedy, _ = ar.speculative_sample(
        jax.random.key(4), graphdef, state, 2, L, 3, draft, temperature=0.0, prompt=prompt[:2]
    )
    np.testing.assert_array_equal(
        np.asarray(greedy), np.asarray(causal.ancestral(jax.random.key(5), graphdef, state, 2, L, 0.0, prompt[:2]))
    )


# --------------------------------------------------------------------------- a block-diffusion network as the drafter


@functools.lru_cache(maxsize=None)
def _tiny_block():
    """A tiny block-diffusion network over V = 3 tokens, L = 6, blocks of 3 (weights perturbed): a BlockDraft."""
    import ml_collections
    from flax import nnx

    from sedd import kinds

    from sedd.kinds import block
    from sedd import config as config_lib

    config = config_lib.load_config(
        "tiny",
        [
            "--config.model.kind=block",
            "--config.model.block_size=3",
            "--config.model.n_layers=1",
            f"--config.data.seq_len={L}",
        ],
    )
    config = ml_collections.ConfigDict(config.to_dict())
    config.vocab_size = V
    kind = kinds.get(config)
    graphdef, params, rest = nnx.split(kind.network(0), nnx.Param, ...)
    return block.BlockDraft(
        graphdef, (reference.perturbed(params, 0.2, 6), rest), kind.graph, kind.noise, kind.block_size
    )


def _shaped_ar_law(graphdef, state, temperature: float, top_p: float) -> np.ndarray:
    """The exact law over all V^L sequences of the AR network's conditionals with temperature and nucleus."""
    from flax import nnx

    from sedd.kinds import causal

    logits = np.asarray(causal.next_token_logits(nnx.merge(graphdef, *state), jnp.asarray(SEQS)), np.float64)
    cond = np.asarray(
        sampling.nucleus(jax.nn.softmax(jnp.asarray(logits / temperature, jnp.float32), -1), top_p), np.float64
    )  # (V^L, L, V)
    law = np.take_along_axis(cond, SEQS[..., None], -1)[..., 0].prod(-1)
    return law / law.sum()


@pytest.mark.parametrize(  # the plain law and temperature alone behind -m slow (the default suite's 900 CPU s)
    "temperature,top_p",
    [pytest.param(1.0, 1.0, marks=pytest.mark.slow), pytest.param(0.7, 1.0, marks=pytest.mark.slow), (0.7, 0.9)],
)
def test_a_block_network_drafting_one_block_keeps_the_ar_law(temperature, top_p):
    """A random block network drafts k = 3 positions in one call for a random AR network: the text has its law."""
    from sedd.kinds import ar

    graphdef, state, _ = _tiny_ar(0.2)  # weights that leave several tokens in the nucleus of top_p = 0.9
    law = _shaped_ar_law(graphdef, state, temperature, top_p)
    assert (
        np.exp(-(law * np.log(np.maximum(law, 1e-300))).sum()) > 10
    )  # a law spread over many sequences (20 at 0.7, 0.9)
    n = N // 8
    text, stats = ar.speculative_sample(
        jax.random.key(2), graphdef, state, n, L, 3, _tiny_block(), temperature=temperature, top_p=top_p
    )
    assert reference.tv(reference.empirical_law(np.asarray(text), V), law) < reference.tv_noise_bound(law, n)
    rounds = np.asarray(stats["nfe_per_sample"])
    np.testing.assert_array_equal(np.asarray(stats["draft_calls"]), rounds)  # one drafter call a round
    assert rounds.mean() < L - 0.5 and np.asarray(stats["accepted_at"])[0] > 0  # drafts were kept


def test_a_block_run_drafts_for_an_ar_run():
    """Run.generate(draft=block_run): one drafter call a round; a SEDD run, too large a k, another vocabulary refused."""
    from test_golden import _cached_run

    run, block_run = _cached_run("ar"), _cached_run("block")  # blocks of 4
    out = run.sample(jax.random.key(0), 3, draft=block_run, draft_k=4, return_stats=True)
    assert out.tokens.shape == (3, run.seq_len) and out.tokens.max() < run.config.vocab_size
    np.testing.assert_array_equal(out.stats["draft_calls"], out.stats["nfe_per_sample"])
    assert out.stats["accepted_at"].shape == (4,)
    texts = run.generate(jax.random.key(1), 2, prefix="ab", draft=block_run, draft_k=3, temperature=0.7, top_p=0.9)
    assert all(t.startswith("ab") for t in texts)
    with pytest.raises(ValueError, match="block size"):
        run.sample(jax.random.key(0), 1, draft=block_run, draft_k=5)
    with pytest.raises(ValueError, match="cannot draft"):
        run.sample(jax.random.key(0), 1, draft=_cached_run("ddit"))
    import ml_collections

    from sedd import runs

    config = ml_collections.ConfigDict(block_run.config.to_dict())
    config.vocab_size = block_run.config.vocab_size - 1
    smaller = runs.from_parts(config, block_run.tokenizer, block_run.graphdef, block_run.params, block_run.rest)
    with pytest.raises(ValueError, match="vocabulary"):
        run.sample(jax.random.key(0), 1, draft=smaller)


@pytest.mark.slow  # trains two runs and drives the CLI; the law it keeps is tested by exact enumeration above: behind -m slow to keep the default suite within 900 CPU s
def test_sedd_sample_drafts_with_a_block_run(tmp_path, capsys):
    """`sedd sample --draft BLOCK_RUN` on tiny trained runs: the AR run's text, drafted a block a call."""
    import json

    from sedd import cli

    data = tmp_path / "data"
    for name, kind in (
        ("ar", ["--config.model.kind=ar"]),
        ("block", ["--config.model.kind=block", "--config.model.block_size=8"]),
    ):
        assert (
            cli.main(
                [
                    "train",
                    "--config",
                    "tiny",
                    *kind,
                    "--config.model.n_layers=1",
                    "--config.training.n_iters=2",
                    "--config.training.eval_every=2",
                    "--config.training.ckpt_every=2",
                    f"--config.data.data_dir={data}",
                    "--workdir",
                    str(tmp_path / name),
                ]
            )
            == 0
        )
    out = tmp_path / "samples.jsonl"
    capsys.readouterr()
    assert (
        cli.main(
            [
                "sample",
                "--workdir",
                str(tmp_path / "ar"),
                "--draft",
                str(tmp_path / "block"),
                "--draft_k",
                "8",
                "--prefix",
                "RO",
                "--num_samples",
                "2",
                "--output",
                str(out),
            ]
        )
        == 0
    ), capsys.readouterr().err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    texts = [line["text"] for line in lines]
    assert len(texts) == 2 and all(t.startswith("RO") for t in texts), texts
    # each line carries its text's network calls (the target's and the drafter's: 2 a round) and the tokens they
    # wrote a call: the tiny config's 32 less the prompt's 2
    for line in lines:
        assert line["network_calls"] % 2 == 0 and (line["tokens"], line["tokens_written"]) == (32, 30), line
        assert line["tokens_per_call"] == pytest.approx(30 / line["network_calls"], rel=1e-3), line
    printed = capsys.readouterr().err  # beside the texts, not among them
    assert "network calls: " in printed and " tokens a call" in printed, printed
    target, drafter = (float(x) for x in re.search(r"the target's ([\d.]+) .*the drafter's ([\d.]+)", printed).groups())
    calls = np.mean([line["network_calls"] for line in lines])
    assert target == drafter == pytest.approx(calls / 2, abs=0.06), printed  # a block drafter: one call a round
    for draft in ("ngram", None):  # the calls of any way of writing, printed alike; no drafter network's
        assert (
            cli.main(
                ["sample", "--workdir", str(tmp_path / "ar"), "--num_samples", "1"]
                + (["--draft", draft] if draft else [])
            )
            == 0
        )
        printed = capsys.readouterr().err
        assert "network calls: " in printed and "the drafter's" not in printed, printed
    assert (
        cli.main(["sample", "--workdir", str(tmp_path / "ar"), "--draft", str(tmp_path / "block"), "--draft_k", "9"])
        == 2
    )
    assert "block size" in capsys.readouterr().err
    assert cli.main(["sample", "--workdir", str(tmp_path / "ar"), "--layout", "2,1"]) == 2  # a drafting run's option
    err = capsys.readouterr().err
    assert "layout='2,1'" in err and "no draft head" in err and "--draft" in err, err
