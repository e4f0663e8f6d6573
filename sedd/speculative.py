r"""Speculative sampling: a drafter proposes k tokens, the target checks them in one call, its law exactly.

Leviathan, Kalman & Matias 2023 (arXiv 2211.17192, Alg. 1) and Chen et al.
2023 (arXiv 2302.01318, Alg. 2). The target is an autoregressive law
p(x_l | x_<l) (an AR network with its KV cache, or any exact conditional).
From a prefix x_<s a drafter proposes y_0 .. y_{k-1}, where y_i was drawn from

    q_i(.) = q(y_i = . | x_<s, y_<i),                                          (1)

the law of the i-th drafted token given the prefix and the drafted tokens
before it only. One call of the target scores the k + 1 positions s .. s + k
given x_<s and the drafts, p_i(.) = p(x_{s+i} = . | x_<s, y_<i), and

    y_i is accepted with probability min(1, p_i(y_i) / q_i(y_i)), i = 0, 1, ..;
    at the first rejection j, x_{s+j} ~ max(0, p_j - q_j) / Z_j and the round ends;
    when all k are accepted, x_{s+k} ~ p_k (one token more, from the same call).  (2)

Each token written has the law p given the tokens before it, whatever q is
(Leviathan et al., Thm. 3.5: P(x = y) = min(p, q) + (1 - sum min(p, q))
(p - q)^+ / Z = p), so the text has the target's law exactly; a round writes
between 1 and k + 1 tokens for one call of the target.

Block verification (Sun et al. 2025, arXiv 2403.10444) judges the k drafts
together and keeps at least as many in expectation, with the same law:

    w_0 = 1, w_{j+1} = min(1, w_j p_j(y_j) / q_j(y_j));  R_j = max(0, w_j p_j - q_j),
    h_j = |R_j| / (|R_j| + 1 - w_j) (j < k), h_k = w_k; the round keeps the longest
    prefix j whose coin of P(heads) = h_j comes up and writes x_{s+j} ~ R_j / |R_j|
    (p_k after all k).                                                          (3)

It is the default (``round_law``); "token" is (2).

What q must be, (1): the law each drafted token was drawn from given the
prefix and the drafted tokens *before* it. A drafter that draws the k tokens
independently given the prefix, or left to right, gives (1) directly. A
sampler that commits a later position first does not: its law for y_i
depends on y_>i, and the left-to-right conditionals of its joint law are what
(1) needs (tests/test_speculative.py checks both).

Temperature and top-p apply to the target's conditionals (and so to the
text): the caller passes p already shaped.

Shapes: B batch, k drafted tokens a round, V vocabulary, T the text's buffer.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from sedd import validate
from sedd.categorical import sample_categorical


MAX_DRAFTS = validate.MAX_DRAFTS
"""The most drafts a round (k): a KV cache of a target keeps room for a round's k + 1 positions past the text."""


VERIFICATIONS = ("joint", "token")
"""How a round decides what it keeps, (2) or (3): ``round_law``'s method."""


def round_law(
    p: jax.Array, q: jax.Array, drafted: jax.Array, method: str = "joint", count: jax.Array | None = None
) -> tuple[jax.Array, jax.Array]:
    """What a round writes given its drafts, as laws: how many drafts it keeps, and the token after them.

    "token", (2): with a_j = min(1, p_j(y_j) / q_j(y_j)), P(keep exactly j) = a_0 .. a_{j-1} (1 - a_j),
    and the token at j is drawn from max(0, p_j - q_j) / Z_j (from p_k after all k).

    "joint", (3) (Sun et al. 2025, ICLR 2025): with rho_j = sum_v R_j(v), P(keep exactly j) =
    h_j prod_{i > j} (1 - h_i), the token at j drawn from R_j / rho_j (from p_k after all k). A later
    draft that p likes more than q can redeem an earlier one that (2) would have rejected: the law of
    the text is p's as with (2), and the expected drafts kept are never fewer (Sun et al. prove it optimal).

    Args:
      p: float[B, k + 1, V] the target's law at the k drafted positions and the one after.
      q: float[B, k, V] the drafter's law (1) of each drafted token.
      drafted: int[B, k] the drafted tokens.
      method: "joint" or "token".
      count: None, or int32[B] in [0, k]: a row's drafts are its first count (a round of fewer drafts in the
        same shape; the rest of the row is ignored): the rule of `count` drafts, the token after all of
        them from p at count. 0: no draft, the round writes one token from p_0.
    Returns:
      (stop float32[B, k + 1]: P(the round keeps exactly j drafts), then float32[B, k + 1, V]: the
      law of the token it writes at j, normalised).
    """
    if method not in VERIFICATIONS:
        raise ValueError(f"verification must be one of {VERIFICATIONS}, got {method!r}")
    p, q = p.astype(jnp.float32), q.astype(jnp.float32)
    k = drafted.shape[1]
    p_y = jnp.take_along_axis(p[:, :k], drafted[..., None], axis=-1)[..., 0]  # (B, k)
    q_y = jnp.take_along_axis(q, drafted[..., None], axis=-1)[..., 0]  # (B, k), > 0: y was drawn from q
    ratio = p_y / q_y
    if count is not None:  # past a row's drafts: a ratio of 1 keeps the arithmetic finite; the coins below ignore it
        usable = jnp.arange(k)[None, :] < count[:, None]  # (B, k)
        ratio = jnp.where(usable, ratio, 1.0)
    if method == "token":
        a, one = jnp.minimum(1.0, ratio), jnp.ones((ratio.shape[0], 1), jnp.float32)
        if count is not None:
            a = jnp.where(usable, a, 0.0)  # the round stops at count at the latest
        kept = jnp.cumprod(jnp.concatenate([one, a], axis=1), axis=1)  # (B, k + 1) a_0 .. a_{j-1}
        stop = kept * jnp.concatenate([1.0 - a, one], axis=1)
        weight = jnp.ones_like(kept[:, :k])  # (B, k) R_j = max(0, p_j - q_j)
    else:
        w = [jnp.ones(ratio.shape[:1], jnp.float32)]
        for j in range(k):  # once 0 (a draft p rules out), 0 for good, even past a ratio that overflowed to inf
            w.append(jnp.where(w[-1] > 0, jnp.minimum(1.0, w[-1] * ratio[:, j]), 0.0))
        w = jnp.stack(w, axis=1)  # (B, k + 1)
        weight = w[:, :k]
    residual = jnp.maximum(weight[..., None] * p[:, :k] - q, 0.0)  # (B, k, V) R_j
    rho = residual.sum(-1)  # (B, k)
    if method == "joint":
        denominator = rho + 1.0 - weight
        h = jnp.concatenate(
            [jnp.where(denominator > 0, rho / jnp.where(denominator > 0, denominator, 1.0), 0.0), w[:, k:]], axis=1
        )  # (B, k + 1)
        if count is not None:  # the rule of `count` drafts: h_count = w_count, no coin past it
            at = jnp.arange(k + 1)[None, :]
            h = jnp.where(at < count[:, None], h, jnp.where(at == count[:, None], w, 0.0))
        later = jnp.cumprod((1.0 - h)[:, ::-1], axis=1)[:, ::-1]  # prod_{i >= j} (1 - h_i)
        stop = h * jnp.concatenate([later[:, 1:], jnp.ones_like(h[:, :1])], axis=1)
    # rho_j = 0 only where stopping at j has probability 0 (p_j = q_j where w_j = 1): p_j stands in.
    after = jnp.where(rho[..., None] > 0, residual / jnp.where(rho > 0, rho, 1.0)[..., None], p[:, :k])
    after = jnp.concatenate([after, p[:, k:]], axis=1)  # (B, k + 1, V)
    if count is not None:  # after all of a row's drafts, the token comes from p there
        after = jnp.where((jnp.arange(k + 1)[None, :] == count[:, None])[..., None], p, after)
    return stop, after


def verify(
    key: jax.Array,
    p: jax.Array,
    q: jax.Array,
    drafted: jax.Array,
    categorical: str = "precise",
    method: str = "joint",
    count: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """One round's check, (2) or (3): how many drafts are kept, and the tokens the round writes.

    p, q, drafted, method, count: as ``round_law``; categorical: the method of the redraw. Returns
    (accepted int32[B] in [0, k], tokens int32[B, k + 1]): the round writes tokens[:, :accepted + 1]
    (the drafts kept, then the redrawn or extra token).
    """
    b, k = drafted.shape
    k_stop, k_draw = jax.random.split(key)
    stop, after = round_law(p, q, drafted, method, count)
    accepted = sample_categorical(k_stop, stop, categorical).astype(jnp.int32)  # (B,)
    at = jnp.take_along_axis(after, accepted[:, None, None], axis=1)[:, 0]  # (B, V)
    new = sample_categorical(k_draw, at, categorical).astype(jnp.int32)  # (B,)
    pos = jnp.arange(k + 1)[None, :]
    padded = jnp.concatenate([drafted.astype(jnp.int32), jnp.zeros((b, 1), jnp.int32)], axis=1)
    tokens = jnp.where(pos < accepted[:, None], padded, jnp.where(pos == accepted[:, None], new[:, None], 0))
    return accepted, tokens


def run_rounds(
    key: jax.Array,
    target_state: Any,
    drafter_state: Any,
    text: jax.Array,
    start: jax.Array,
    end: jax.Array,
    *,
    target: Callable,
    drafter: Callable,
    k: int,
    categorical: str = "precise",
    on_round: Callable | None = None,
    shared: bool = False,
    verification: str = "joint",
) -> tuple:
    """Rounds of (2) until every row has written its positions up to `end`: the traceable core of ``decode``.

    Not jitted, so that a caller can run it inside its own program (``sedd
    serve`` runs it under ``jax.vmap``, each row alone with its own traced
    temperature and top_p in `target`).

    Args:
      key, target_state, drafter_state, target, drafter, k, categorical, shared, verification: as ``decode``.
      text: int32[B, T] the given tokens before `start`; T >= max(end) + k + 1 (a round writes up to k + 1).
      start: int32[B] the first position to write; end: int32[B] the position to write up to (excluded).
      on_round: None, or a traced function called at each round with (r int32[], start int32[B], drafted
        int32[B, k], accepted int32[B], tokens int32[B, k + 1], live bool[B]): the round's drafts, how
        many were kept and the tokens written from start (the first accepted + 1 of them); rows not
        `live` had already finished and wrote nothing.
    Returns:
      (text int32[B, T], r int32[] rounds the batch ran, rounds_row int32[B] rounds each row needed,
      accepted_at int32[B, k]: the rounds of each row whose draft at position i was kept).
    """
    b = text.shape[0]
    start = jnp.asarray(start, jnp.int32)  # (B,)
    end = jnp.asarray(end, jnp.int32)  # (B,)

    def round_(carry):
        r, text, start, t_state, d_state, rounds_row, accepted_at = carry
        key_r = jax.random.fold_in(key, r)
        k_draft, k_verify = jax.random.split(key_r)
        if shared:
            drafted, q, t_state, *count = drafter(k_draft, t_state, text, start, k)
        else:
            drafted, q, d_state, *count = drafter(k_draft, d_state, text, start, k)
        count = count[0] if count else None  # a drafter may give fewer than k drafts a row
        window = jnp.arange(k)[None, :] + start[:, None]  # (B, k)
        proposed = text.at[jnp.arange(b)[:, None], window].set(drafted.astype(jnp.int32))
        p, t_state = target(t_state, proposed, start, k)
        accepted, tokens = verify(k_verify, p, q, drafted, categorical, verification, count)
        live = start < end  # (B,) rows still writing
        if on_round is not None:
            on_round(r, start, drafted.astype(jnp.int32), accepted, tokens, live)
        written = jnp.arange(k + 1)[None, :] + start[:, None]  # (B, k + 1)
        keep = live[:, None] & (jnp.arange(k + 1)[None, :] <= accepted[:, None])
        text = text.at[jnp.arange(b)[:, None], written].set(
            jnp.where(keep, tokens, jnp.take_along_axis(text, written, axis=1))
        )
        counted = live[:, None] & (jnp.arange(k)[None, :] < accepted[:, None])  # (B, k)
        return (
            r + 1,
            text,
            jnp.where(live, start + accepted + 1, start),
            t_state,
            d_state,
            rounds_row + live.astype(jnp.int32),
            accepted_at + counted.astype(jnp.int32),
        )

    carry = (
        jnp.int32(0),
        text,
        start,
        target_state,
        drafter_state,
        jnp.zeros((b,), jnp.int32),
        jnp.zeros((b, k), jnp.int32),
    )
    r, text, _, _, _, rounds_row, accepted_at = jax.lax.while_loop(lambda c: jnp.any(c[2] < end), round_, carry)
    return text, r, rounds_row, accepted_at


_STATIC = ("target", "drafter", "length", "k", "categorical", "shared", "verification")
"""``decode``'s static arguments (``decode_prompted``'s, with its prefills)."""


@functools.partial(jax.jit, static_argnames=_STATIC)
def decode(
    key: jax.Array,
    target_state: Any,
    drafter_state: Any,
    prompt: jax.Array,
    prompt_len: jax.Array,
    *,
    target: Callable,
    drafter: Callable,
    length: int,
    k: int,
    categorical: str = "precise",
    shared: bool = False,
    verification: str = "joint",
) -> tuple:
    """Text of `length` tokens by rounds of (2), every row at its own position, in one compiled program.

    Args:
      key: round r uses fold_in(key, r).
      target_state, drafter_state: pytrees the two functions read and return (a KV cache; None).
      prompt: int32[B, length] the given tokens at positions < prompt_len int32[B].
      target: (state, text int32[B, T], start int32[B], k) -> (p float[B, k + 1, V], state): the
        target's law at positions start .. start + k of `text` given text[:, :start + i]
        (T = length + k + 1; the positions at and after start hold the drafts). Its state is
        told where the text now ends by the next call's `start` (a KV cache rolls back to it).
      drafter: (key, state, text, start, k) -> (drafted int32[B, k], q float[B, k, V], state), q the
        law (1) of each draft; or (drafted, q, state, count int32[B]): a row's first count drafts only
        (``round_law``'s count; 0: the round writes one token).
      length: L; k: drafts a round; categorical: the method of the redraws.
      shared: the drafter reads and returns the target's state (drafter_state unused): one network
        that drafts the next round in the call that verifies this one (``sedd.kinds.spec``).
      verification: "joint" (3) or "token" (2), ``round_law``: the same law, (3) keeps more drafts.
    Returns:
      (text int32[B, L], stats): "rounds" int32[] target calls made (the batch's);
      "rounds_per_sample" int32[B]; "accepted_at" int32[k]: rows in which the draft at position i of a
      round was accepted, summed over rounds.
    """
    b = prompt.shape[0]
    text = jnp.zeros((b, length + k + 1), jnp.int32).at[:, :length].set(prompt)
    text, r, rounds_row, accepted_at = run_rounds(
        key,
        target_state,
        drafter_state,
        text,
        prompt_len,
        jnp.full((b,), length, jnp.int32),
        target=target,
        drafter=drafter,
        k=k,
        categorical=categorical,
        shared=shared,
        verification=verification,
    )
    return text[:, :length], {"rounds": r, "rounds_per_sample": rounds_row, "accepted_at": accepted_at.sum(0)}


@functools.partial(jax.jit, static_argnames=_STATIC + ("prefill", "d_prefill"))
def decode_prompted(
    key: jax.Array,
    target_params: Any,
    drafter_params: Any,
    given: jax.Array,
    *,
    prefill: Callable,
    target: Callable,
    d_prefill: Callable | None,
    drafter: Callable,
    length: int,
    k: int,
    categorical: str = "precise",
    shared: bool = False,
    verification: str = "joint",
) -> tuple:
    """``decode`` after a prompt, the prefills inside the one program (eager, a network's prefill would dispatch its
    ops one by one, a host round trip each).

    Args:
      given: int32[B, P] the prompt, the same P in every row (P = 0: none).
      prefill(target_params, given) -> the target's state; d_prefill(drafter_params, given) -> the drafter's
        (None: no drafter state, as with ``shared``).
      the rest: as ``decode``.
    """
    b, p = given.shape
    text = jnp.zeros((b, length), jnp.int32).at[:, :p].set(given)
    d_state = None if d_prefill is None else d_prefill(drafter_params, given)
    return decode(
        key,
        prefill(target_params, given),
        d_state,
        text,
        jnp.full((b,), p, jnp.int32),
        target=target,
        drafter=drafter,
        length=length,
        k=k,
        categorical=categorical,
        shared=shared,
        verification=verification,
    )


def self_drafted(
    key,
    state,
    parts: tuple,
    num_samples: int,
    length: int,
    k: int,
    prompt,
    *,
    prefill_calls: int,
    draft_calls: int,
    **decode,
) -> tuple:
    """Text of a target that drafts for itself, k drafts a round in rounds that share the target's state (the spec
    kind's draft half, an AR run's draft head): ``decode_prompted`` with shared=True, and its calls counted.

    Args:
      parts: (prefill, target, drafter); prompt: int32[B, P] or None; decode: categorical, verification.
      prefill_calls, draft_calls: as ``counted``'s.
    Returns:
      (int32[B, L], ``counted`` stats).
    """
    prefill, target, drafter = parts
    given = jnp.zeros((num_samples, 0), jnp.int32) if prompt is None else jnp.asarray(prompt, jnp.int32)
    out, stats = decode_prompted(
        key,
        state,
        None,
        given,
        prefill=prefill,
        target=target,
        d_prefill=None,
        drafter=drafter,
        length=length,
        k=k,
        shared=True,
        **decode,
    )
    return out, counted(stats, prefill_calls, draft_calls)


def counted(stats: dict, prefill_calls: int, draft_calls: int) -> dict:
    """``decode``'s stats as a kind reports them: "nfe" the target's calls (the batch's: the rounds and the
    prefill's `prefill_calls`, 0 or 1), "nfe_per_sample", "draft_calls" (`draft_calls` a round), "accepted_at" int32[k]."""
    rounds = stats["rounds_per_sample"]
    nfe = {"nfe": stats["rounds"] + prefill_calls, "nfe_per_sample": rounds + prefill_calls}
    return nfe | {"draft_calls": rounds * draft_calls, "accepted_at": stats["accepted_at"]}


def sharpened(q: jax.Array, tau) -> jax.Array:
    """q^(1/tau) renormalised along the last axis (tau = 1: q; the zeros of q stay zeros): a drafter's law
    sharpened; drafts drawn from it keep the target's law when the verifier is told it."""
    q = jnp.where(q > 0, jnp.exp(jnp.log(jnp.where(q > 0, q, 1.0)) / tau), 0.0)
    return q / jnp.sum(q, axis=-1, keepdims=True)


@functools.lru_cache(maxsize=None)
def ngram_drafter(vocab_size: int, n: int = 2) -> Callable:
    """The prompt-lookup drafter (Saxena 2023): after the latest earlier occurrence of the last n tokens.

    For a row at position s it finds the largest j with text[j:j + n] =
    text[s - n:s] and j + n < s, and proposes y_i = text[j + n + i] while that
    lies before s (else the token before it again); with no match, the last
    token repeated. Deterministic given the text, so q_i = one_hot(y_i), (1):
    a draft is kept with probability p_i(y_i). Costs no network call.
    """

    def drafter(key, state, text, start, k):
        b, t = text.shape
        j = jnp.arange(t)  # candidate match starts
        last = jnp.stack(
            [jnp.take_along_axis(text, jnp.maximum(start - n + i, 0)[:, None], 1)[:, 0] for i in range(n)], 1
        )  # (B, n)
        match = jnp.ones((b, t), bool)
        for i in range(n):
            match &= jnp.take_along_axis(text, jnp.minimum(j + i, t - 1)[None, :].repeat(b, 0), 1) == last[:, i : i + 1]
        match &= (j[None, :] + n < start[:, None]) & (start[:, None] >= n)
        found = jnp.any(match, 1)
        at = jnp.max(jnp.where(match, j[None, :], -1), 1) + n  # (B,) where the continuation starts
        ahead = at[:, None] + jnp.arange(k)[None, :]  # (B, k)
        source = jnp.where(found[:, None] & (ahead < start[:, None]), ahead, jnp.maximum(start - 1, 0)[:, None])
        drafted = jnp.take_along_axis(text, source, 1).astype(jnp.int32)  # (B, k)
        return drafted, jax.nn.one_hot(drafted, vocab_size, dtype=jnp.float32), state

    return drafter
