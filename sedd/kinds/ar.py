r"""The autoregressive baseline: DDiT with causal attention and no time input.

The same backbone as the diffusion model (``sedd.model.DDiT`` built with
``causal=True, time_conditioning=False``), trained by the same ``sedd train``
with ``model.kind = "ar"`` on the next-token cross-entropy

    -log p_theta(x) = -sum_{l=0}^{L-1} log p_theta(x_l | x_{<l})   (nats per sequence),

the exact negative log-likelihood, directly comparable with the diffusion
model's bound on the same quantity (``sedd.evaluate.likelihood_bound``).
The network reads [BOS, x_0, ..., x_{L-2}] and its output at position l is the
logits of x_l: every one of the L tokens is predicted, the first from BOS alone.
BOS is the id V: the model embeds ``num_tokens = V + 1`` ids and outputs
``out_dim = V`` logits, so p_theta is a law over the V real tokens.

Uses: the likelihood and speed baseline of the benchmarks, and the default
judge of generative perplexity (``sedd.evaluate.generative_perplexity``).

Decoding with a KV cache: ``decode_step`` runs one position through
``DDiT.network_output(..., decode=True)``; each block keeps the rotary-embedded
keys and the values of earlier positions (``DDiT.init_cache``). Its next-token
distribution equals that of a full forward pass (tests/test_ar.py).

Speculative sampling (``speculative_sample``, and ``sedd serve`` through
``Autoregressive.speculation``): the network is the target of
``sedd.speculative``, its drafts from any ``sedd.drafts.Drafter``; a smaller
AR run drafts as an ``ARDraft`` (k tokens left to right).

Letters: B batch, L length, V vocabulary.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from sedd import drafts, evaluate, sampling, speculative
from sedd.categorical import sample_categorical
from sedd.kinds.base import WritesLeftToRight, network_of, register
from sedd.model import DDiT
from sedd.sampling import shaped_law


def _check(model: DDiT) -> None:
    if not model.causal or model.time_conditioning or model.num_tokens != model.out_dim + 1:
        raise ValueError(
            "an AR baseline is a DDiT with causal=True, time_conditioning=False, num_tokens=V + 1 "
            "(BOS = V) and out_dim=V; build it with model.kind='ar' (sedd.kinds.build_model)")


def bos_id(model: DDiT) -> int:
    """The beginning-of-sequence id, V: the last embedding row."""
    return model.num_tokens - 1


def _inputs(model: DDiT, x: jax.Array) -> jax.Array:
    """The network input of targets x int[B, L]: BOS, then x shifted right by one."""
    _check(model)
    return jnp.concatenate([jnp.full((x.shape[0], 1), bos_id(model), x.dtype), x[:, :-1]], axis=1)  # (B, L)


def next_token_logits(model: DDiT, x: jax.Array, *, deterministic: bool | None = True, rngs=None) -> jax.Array:
    """Logits of x_l given x_{<l} at every position, one full forward pass.

    Args:
      model: the AR DDiT.
      x: int[B, L] tokens in [0, V).
      deterministic, rngs: dropout control, as in ``DDiT.network_output``.
    Returns:
      float32[B, L, V]: row l scores x_l.
    """
    return model.network_output(_inputs(model, x), None, deterministic=deterministic, rngs=rngs)  # (B, L, V)


def _nll(logits: jax.Array, x: jax.Array) -> jax.Array:
    """-log softmax(logits)[x] at every position: float32[...]."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, x[..., None].astype(jnp.int32), axis=-1)[..., 0]


def token_nll(model: DDiT, x: jax.Array, *, deterministic: bool | None = True, rngs=None,
              chunk: int = 0) -> jax.Array:
    """-log p_theta(x_l | x_{<l}) at every position: float32[B, L] nats.

    chunk > 0 computes the logits `chunk` positions at a time, fused with the
    loss and recomputed for the gradient (``DDiT.output_rows``): the same
    numbers without a [B, L, V] array (training.loss_chunk).
    """
    if chunk:
        h, c = model.features(_inputs(model, x), None, deterministic=deterministic, rngs=rngs)
        return model.output_rows(h, c, _nll, x, chunk=chunk)  # (B, L)
    return _nll(next_token_logits(model, x, deterministic=deterministic, rngs=rngs), x)  # (B, L)


def sequence_nll(model: DDiT, x: jax.Array, *, deterministic: bool | None = True, rngs=None,
                 chunk: int = 0) -> jax.Array:
    """-log p_theta(x) in nats per sequence, float32[B]: the training loss of model.kind="ar" (chunk: ``token_nll``)."""
    return token_nll(model, x, deterministic=deterministic, rngs=rngs, chunk=chunk).sum(-1)


@nnx.jit
def nll(model: DDiT, x: jax.Array) -> jax.Array:
    """Jitted ``sequence_nll`` with dropout off: float32[B] nats per sequence."""
    return sequence_nll(model, x, deterministic=True)


# --------------------------------------------------------------------------- KV cache


def decode_step(model: DDiT, token: jax.Array) -> jax.Array:
    """One position through the model with its KV cache: the logits of x_pos.

    pos is the caches' index, which this call advances by one. The input at
    position p is BOS for p = 0 and x_{p-1} after, so feeding ``token`` (BOS or
    x_{p-1}) at position p returns the logits of x_p.

    Args:
      model: the AR DDiT (dropout off), after ``model.init_cache(B, S)``.
      token: int[B] the input at position pos.
    Returns:
      float32[B, V] logits of x_pos.
    """
    _check(model)
    return model.network_output(token[:, None], None, decode=True, deterministic=True)[:, 0]  # (B, V)


ROWS_IN_ONE_CALL = 64
"""``_decode_rows``: up to this many rows in one call (the model's writes at a place a row, unrolled)."""


def _decode_rows(model: DDiT, cache: tuple, inputs: jax.Array, start: jax.Array) -> tuple[jax.Array, tuple]:
    """``decode_in_cache`` with start int32[B], a start a row: the rows in one call up to
    ``ROWS_IN_ONE_CALL`` rows (one write a row); past it one program a row under ``jax.vmap`` (a batched
    call's writes and masks grow with B; a test samples 50,000 rows at once)."""
    b = inputs.shape[0]
    if b <= ROWS_IN_ONE_CALL:
        return decode_in_cache(model, cache, inputs, start)
    n = model.blocks[0].n_heads
    rows = jax.tree.map(lambda a: a.reshape(b, n, *a.shape[1:]), cache)  # (B, N, S, K) each
    logits, rows = jax.vmap(lambda c, x, s: decode_in_cache(model, c, x[None], s))(rows, inputs, start)
    return logits[:, 0], jax.tree.map(lambda a: a.reshape(b * n, *a.shape[2:]), rows)


def decode_in_cache(model: DDiT, cache: tuple, inputs: jax.Array, start: jax.Array) -> tuple[jax.Array, tuple]:
    """n positions start .. start + n - 1 through the AR model on a cache the caller holds (``DDiT.output_in_cache``).

    Each position sees the cache rows up to its own (causally); the chunk's rows are written in place.

    Args:
      cache: ``model.empty_cache(B, S)``'s, holding positions < start; start + n <= S.
      inputs: int[B, n] the inputs at those positions (BOS at 0, x_{p-1} at p).
      start: int32[] the first position, or int32[B]: each row's own (rows at different lengths).
    Returns:
      (float32[B, n, V] the logits of x_start .. x_{start+n-1}, the cache after the write).
    """
    n, rows = inputs.shape[1], cache[0][0].shape[1]
    positions = jnp.asarray(start)[..., None] + jnp.arange(n)  # (n,) or (B, n)
    mask = jnp.arange(rows) <= positions[..., None]  # ([B,] n, S)
    return model.output_in_cache(inputs, None, positions=positions, mask=mask, cache=cache, at=start)


@functools.partial(jax.jit, static_argnames=("graphdef", "num_samples", "length", "categorical"))
def _draw(graphdef, state, key, temperature, prompt, prompt_len, *, num_samples, length, categorical):
    """``sample``'s loop on a split network: one dispatch a text, no walk over the model's graph a call
    (nnx.jit's walk and a clone cost an AR text of the plays 15 ms of its 56 at batch 1).

    Up to max_len the cache is the caller-held one of ``DDiT.output_in_cache``: a step writes
    its row in place and reads the cache as it lies (on the module's ring cache XLA's CPU compiler
    copies and transposes every block's cache at each step: an AR text of the plays 1.8x slower in
    float32 at batch 1 on a 2-core CPU, docs/speculative.md). Past max_len, the ring: a sliding window."""
    model = nnx.merge(graphdef, *state)
    model.eval()

    def draw(pos, logits):  # (B, V) -> the token at pos (a given prefix is kept)
        probs = jax.nn.softmax(logits.astype(jnp.float32) / temperature, axis=-1)
        tok = sample_categorical(jax.random.fold_in(key, pos), probs, categorical).astype(jnp.int32)
        return jnp.where(pos < prompt_len, prompt[:, pos], tok)

    bos = jnp.full((num_samples,), bos_id(model), jnp.int32)
    toks = jnp.zeros((num_samples, length), jnp.int32)
    if length > model.max_len:
        model.init_cache(num_samples, model.max_len)  # a ring, a sliding window

        def ring_step(pos, carry):
            model, prev, toks = carry
            tok = draw(pos, decode_step(model, prev))  # (B,)
            return model, tok, toks.at[:, pos].set(tok)

        return nnx.fori_loop(0, length, ring_step, (model, bos, toks))[2]  # (B, L)
    _check(model)

    def step(pos, carry):
        cache, prev, toks = carry
        logits, cache = decode_in_cache(model, cache, prev[:, None], pos)  # (B, 1, V): x_pos's law, its row written
        tok = draw(pos, logits[:, 0])
        return cache, tok, toks.at[:, pos].set(tok)

    return jax.lax.fori_loop(0, length, step, (model.empty_cache(num_samples, length), bos, toks))[2]  # (B, L)


def sample(
    key: jax.Array,
    model: DDiT,
    num_samples: int,
    length: int,
    temperature: float = 1.0,
    prompt: jax.Array | None = None,
    categorical: str = "precise",
) -> jax.Array:
    """Ancestral sampling with the KV cache: L network calls of one position each.

    Past the model's max_len the cache is a ring of max_len rows
    (``DDiTBlock._attend_cache``): each token is drawn given the max_len - 1
    before it, a sliding window.

    Args:
      key: a ``jax.random`` key.
      model: the AR DDiT.
      num_samples: B.
      length: L >= 1 tokens (any length; the context is at most max_len).
      temperature: divides the logits (1 = the model's law).
      prompt: optional int[B, P] prefix (P <= L) kept as given.
      categorical: method of ``sedd.categorical.sample_categorical``.
    Returns:
      int32[B, L] tokens in [0, V).
    """
    _check(model)
    model.eval()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return sample_net(key, graphdef, (params, rest), num_samples, length, temperature, prompt, categorical)


def sample_net(key: jax.Array, graphdef, state, num_samples: int, length: int, temperature: float = 1.0,
               prompt: jax.Array | None = None, categorical: str = "precise") -> jax.Array:
    """``sample`` of a split network (graphdef, state = (params, rest), a run's ``Net``): the same tokens,
    without splitting the model at each call."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if prompt is None:
        prompt = jnp.zeros((num_samples, length), jnp.int32)
        prompt_len = 0
    else:
        prompt = jnp.asarray(prompt, jnp.int32)
        prompt_len = prompt.shape[1]
        if prompt.shape[0] != num_samples or prompt_len > length:
            raise ValueError(f"prompt must be int[{num_samples}, <= {length}], got {prompt.shape}")
        prompt = jnp.pad(prompt, ((0, 0), (0, length - prompt_len)))
    return _draw(graphdef, state, key, jnp.float32(temperature), prompt, jnp.int32(prompt_len),
                 num_samples=int(num_samples), length=int(length), categorical=categorical)


# --------------------------------------------------------------------------- the target of speculative sampling


def build_speculative_target(graphdef, temperature=1.0, top_p=1.0) -> tuple:
    r"""(prefill, target) of the AR network `graphdef` for ``sedd.speculative.decode``, each row its own KV cache.

    ``target(state, text, start, k)`` scores the k + 1 positions start ..
    start + k in one call: their inputs x_{start-1} (BOS at 0) and the k
    drafts, against the cache of the positions before start. The cache is
    the caller-held one of ``decode_in_cache`` (``DDiT.output_in_cache``):
    the call writes its rows from `start` on in place, and a query sees the
    rows up to its own position only, so the rows of rejected drafts (at or
    past the next round's start) are written over by the next call before
    any query sees them: the cache rolls back by the start alone, and after
    a round it holds exactly what a cache built from scratch on the
    accepted text holds (tests/test_speculative.py). The rows run in one
    call, each written and read at its own start (``decode_in_cache`` with
    a start a row), so rows accept different numbers of drafts; under
    ``jax.vmap`` over the rows XLA's CPU compiler copied the cache around
    every such write. The law returned is the network's
    next-token law with temperature T and nucleus top_p (the law of the
    text, ``sedd.sampling.shaped_law``; T = 0 the argmax).

    Not cached: temperature and top_p may be traced float32[] values, so that
    one program serves every value (``sedd serve``); ``speculative_target``
    is the cached builder of Python values.

    Returns:
      prefill(params_state, prompt int32[B, P]) -> state: the cache after the
        prompt's P positions (P the same for every row, >= 0). Since each call
        of target writes from its `start` on, a prompt buffer longer than the
        given tokens may be prefilled whole (what follows `start` is never
        seen); the cache holds max(max_len, P) + MAX_DRAFTS + 1 rows, every row
        a round past the text's end writes (k <= ``sedd.speculative.MAX_DRAFTS``).
      target: as ``sedd.speculative.decode`` takes it; state = ((params, rest), cache).
    """
    def prefill(params_state, prompt):
        model = nnx.merge(graphdef, *params_state)
        _check(model)
        b, p = prompt.shape
        cache = model.empty_cache(b, max(model.max_len, p) + speculative.MAX_DRAFTS + 1)
        if p:
            cache = decode_in_cache(model, cache, _inputs(model, prompt), jnp.int32(0))[1]
        return params_state, cache

    def target(state, text, start, k):
        params_state, cache = state
        model = nnx.merge(graphdef, *params_state)
        _fits(cache, text)
        rows = jnp.arange(text.shape[0])[:, None]
        prev = jnp.where(start > 0, text[rows[:, 0], jnp.maximum(start - 1, 0)], bos_id(model))  # (B,)
        inputs = jnp.concatenate([prev[:, None], text[rows, start[:, None] + jnp.arange(k)]], axis=1)  # (B, k + 1)
        logits, cache = _decode_rows(model, cache, inputs, start)  # (B, k + 1, V), each row at its start
        return shaped_law(logits, temperature, top_p), (params_state, cache)

    return prefill, target


def _fits(cache: tuple, text: jax.Array) -> None:
    """Raise a ValueError unless the cache (``build_speculative_target``'s) holds every position of `text`
    (int32[B, T]): a round writes up to position T - 1, and a write past the cache's end would land on other rows."""
    rows = cache[0][0].shape[-2]
    if text.shape[1] > rows:
        raise ValueError(f"a text buffer of {text.shape[1]} positions does not fit the prefilled cache's {rows} rows "
                         "(max(max_len, prompt length) + MAX_DRAFTS + 1): prefill a prompt buffer as long as the text")


@functools.lru_cache(maxsize=None)
def speculative_target(graphdef, *, temperature: float = 1.0, top_p: float = 1.0) -> tuple:
    """``build_speculative_target`` of Python values, cached: one (prefill, target) pair, one jit cache entry."""
    return build_speculative_target(graphdef, temperature, top_p)


def build_speculative_drafter(graphdef, temperature=1.0) -> tuple:
    r"""(prefill, drafter) of a (smaller) AR network for ``sedd.speculative.decode``: k tokens left to right.

    Each round writes the row's cache from `start` on (as ``speculative_target``: the rows of
    rejected drafts are written over before they are seen) and runs k + 1 one-position steps: step i feeds the input at position
    start + i and draws y_i from the network's law at temperature T (T = 0:
    its argmax; a traced value serves every T), so q_i = that law given the
    prefix and y_<i, (1) of ``sedd.speculative``; the last step only feeds
    y_{k-1}, so that the cache holds every position a round can accept (all
    k and the extra token).

    Its cache holds max(max_len, P) + MAX_DRAFTS + 1 rows, as the target's: a text longer than the draft
    network's max_len (a draft run trained on shorter texts) is refused by name at the first round.

    Returns:
      prefill(params_state, prompt int32[B, P]) -> state (``build_speculative_target``'s);
      drafter as ``decode`` takes it.
    """
    prefill, _ = build_speculative_target(graphdef)

    def drafter(key, state, text, start, k):
        params_state, cache = state
        model = nnx.merge(graphdef, *params_state)
        _fits(cache, text)
        b = text.shape[0]
        prev = jnp.where(start > 0, text[jnp.arange(b), jnp.maximum(start - 1, 0)], bos_id(model))  # (B,)
        keys = jax.random.split(key, b)
        ys, qs = [], []
        for i in range(k + 1):  # the rows together, each at its own position start + i
            logits, cache = _decode_rows(model, cache, prev[:, None], start + i)  # (B, 1, V)
            if i == k:
                break
            q = shaped_law(logits[:, 0], temperature, 1.0)  # (B, V)
            prev = jax.vmap(lambda key, q: jax.random.categorical(jax.random.fold_in(key, i), jnp.log(q)))(
                keys, q).astype(jnp.int32)
            ys.append(prev), qs.append(q)
        if not k:
            return jnp.zeros((b, 0), jnp.int32), jnp.zeros((b, 0, model.out_dim), jnp.float32), (params_state, cache)
        return jnp.stack(ys, 1), jnp.stack(qs, 1), (params_state, cache)

    return prefill, drafter


@functools.lru_cache(maxsize=None)
def speculative_drafter(graphdef, *, temperature: float = 1.0) -> tuple:
    """``build_speculative_drafter`` of a Python temperature, cached."""
    return build_speculative_drafter(graphdef, temperature)




class ARDraft(drafts.Drafter):
    """A smaller AR network as the drafter of an AR target: k tokens left to right, k + 1 calls a round.

    Attributes:
      graphdef, state: the draft network (state = (params, rest)); vocab: its V.
    """

    name = "ar"

    def __init__(self, graphdef, state):
        self.graphdef, self.state = graphdef, state
        self.vocab = nnx.merge(graphdef, *state).out_dim

    def calls(self, k):
        return k + 1

    def parts(self, temperature, top_p):
        """``build_speculative_drafter`` (top_p does not apply: the drafts are drawn at temperature alone)."""
        return build_speculative_drafter(self.graphdef, temperature)

    def cached_parts(self, temperature, top_p):
        return speculative_drafter(self.graphdef, temperature=temperature)


def speculative_sample(key: jax.Array, graphdef, state, num_samples: int, length: int, k: int = drafts.DEFAULT_K,
                       draft: Any = "ngram", temperature: float = 1.0, top_p: float = 1.0,
                       prompt: jax.Array | None = None, verification: str = "block") -> tuple[jax.Array, dict]:
    """Text of the AR network (graphdef, state) by speculative sampling (``sedd.speculative``): its law exactly.

    Args:
      key: a ``jax.random`` key.
      graphdef, state: the target network, state = (params, rest).
      num_samples, length: B, L (L at most the model's length).
      k: drafts a round.
      draft: "ngram" (prompt lookup, no network) or a ``sedd.drafts.Drafter`` over the same vocabulary:
        an ``ARDraft`` (k + 1 calls a round, left to right) or a block run's ``BlockDraft`` (one call
        a round, k <= its block size).
      temperature, top_p: on the target's law, so the text's (and on the drafter's, which only
        changes the acceptance).
      prompt: optional int32[B, P], the same P for every row.
      verification: "block" or "token" (``sedd.speculative.round_law``): the same law.
    Returns:
      (int32[B, L], stats): "nfe" the target's calls (the batch's), "nfe_per_sample",
      "draft_calls" the drafter's network calls a row, "accepted_at" int32[k]
      (rows whose draft at position i was kept, summed over rounds).

    Raises:
      ValueError: the drafter's refusals (``sedd.drafts.Drafter.checked``): another vocabulary, a k it cannot draft.
    """
    vocab = nnx.merge(graphdef, *state).out_dim
    draft = drafts.get(draft, vocab)
    k = draft.checked(vocab, k)
    prefill, target = speculative_target(graphdef, temperature=temperature, top_p=top_p)
    d_prefill, drafter = draft.cached_parts(temperature, top_p)
    p = 0 if prompt is None else int(prompt.shape[1])
    given = jnp.zeros((num_samples, p), jnp.int32) if prompt is None else jnp.asarray(prompt, jnp.int32)
    text = jnp.zeros((num_samples, length), jnp.int32).at[:, :p].set(given)
    out, stats = speculative.decode(key, prefill(state, given), d_prefill(draft.state, given), text,
                                    jnp.full((num_samples,), p, jnp.int32), target=target, drafter=drafter,
                                    length=length, k=k, verification=verification)
    rounds = stats["rounds_per_sample"]
    return out, {"nfe": stats["rounds"], "nfe_per_sample": rounds,
                 "draft_calls": rounds * draft.calls(k), "accepted_at": stats["accepted_at"]}


# =========================================================================== the kind


@register("ar")
class Autoregressive(WritesLeftToRight):
    """The AR baseline: a causal DDiT without a time input, trained on the next-token NLL (module docstring)."""

    takes = ("top_p", "draft", "draft_k", "verification")

    def speculation(self, graphdef, draft=None, k=None, draft_name=None):
        """Speculative rounds of this network as the target (``build_speculative_target``).

        draft: None (no drafts: k = 0, each round one call that writes one token, ancestral sampling with
        the KV cache), "ngram" or a ``sedd.drafts.Drafter`` of another run (``Kind.drafter``), checked by
        it (``Drafter.checked``). The drafter draws at the row's temperature.
        """
        vocab = self.config.vocab_size
        draft = drafts.get(draft, vocab)
        if draft is None and k is not None:
            raise ValueError(drafts.NEEDS_A_DRAFT)
        k = 0 if draft is None else draft.checked(vocab, drafts.DEFAULT_K if k is None else k)
        source = draft or drafts.Ngram(vocab)  # k = 0: never asked for a draft

        def parts(temperature, top_p):
            t_prefill, target = build_speculative_target(graphdef, temperature, top_p)
            d_prefill, drafter = source.parts(temperature, top_p)
            if source.state is None:
                return (lambda state, prompt: (t_prefill(state, prompt), None)), target, drafter
            return (lambda state, prompt: (t_prefill(state[0], prompt), d_prefill(state[1], prompt))), target, drafter

        name = None if draft is None else draft_name or draft.name
        return sampling.rounds.Speculation(parts, k, name, draft_calls=source.calls(k) if k else 0,
                                           draft_state=source.state, categorical=self.config.sampling.categorical)

    def network(self, seed=0):
        """Inputs V + 1 ids (BOS = V), outputs the V next-token logits, causal attention, no time input."""
        v = self.config.vocab_size
        return network_of(self.config, seed, num_tokens=v + 1, out_dim=v, scale_by_sigma=False, causal=True,
                          time_conditioning=False, normalize=False)

    def loss(self, key, model, x0, train, rngs=None):
        """-sum_l log p(x0^l | x0^{<l}), the exact NLL (``sequence_nll``; training.loss_chunk)."""
        return sequence_nll(model, x0, deterministic=not train, rngs=rngs, chunk=self.config.training.loss_chunk)

    def likelihood(self, key, net, batches, num_t, *, max_batches=None, chars_per_token=None, progress=False,
                   **kwargs):
        """The exact NLL of ``sedd.evaluate.dataset_nll`` (num_t and key unused: nothing is estimated)."""
        model = net.model
        return evaluate.dataset_nll(lambda x0: nll(model, x0), batches, max_batches=max_batches,
                                    chars_per_token=chars_per_token, progress=progress)

    def sample(self, key, net, num_samples, steps=None, predictor=None, rows=None, **options):
        """L ancestral steps with the KV cache (module ``sample``); rows is not used.

        With draft: speculative sampling (``speculative_sample``), the same law
        in fewer calls of this network: draft="ngram" (prompt lookup) or a
        ``sedd.drafts.Drafter`` of another run; draft_k drafts a round (default
        ``sedd.drafts.DEFAULT_K``); temperature and top_p on this network's law;
        verification "block" (default) or "token" (``sedd.speculative.round_law``).
        A prompt (fixed_mask / fixed_tokens) is a prefix of the same length in every row.

        Raises:
          ValueError: steps or a sampler (``check_given``); an option ``options`` refuses; draft_k without a
            draft; a drafter's refusal (``sedd.drafts.Drafter.checked``).
        """
        self.check_given(steps=steps, sampler=predictor)
        o = self.options(**options)
        length = self.config.data.seq_len
        if o.draft is not None:
            tokens, stats = speculative_sample(key, net.graphdef, net.state, num_samples, length,
                                               drafts.DEFAULT_K if o.draft_k is None else o.draft_k, o.draft,
                                               temperature=o.temperature, top_p=o.top_p, prompt=o.prompt,
                                               verification=o.verification)
            return sampling.Samples(tokens, None, stats if o.return_stats else None)
        if o.draft_k is not None:
            raise ValueError(drafts.NEEDS_A_DRAFT)
        if o.top_p != 1.0 or o.verification != "block":
            raise ValueError(f"top_p and verification are for speculative sampling (a draft); this model.kind="
                             f"{self.name!r} run draws each token at its temperature alone")
        tokens = sample_net(key, net.graphdef, net.state, num_samples, length, temperature=o.temperature,
                            prompt=o.prompt, categorical=o.categorical)
        stats = None
        if o.return_stats:  # one network call a position, each on one position of every row
            stats = {"nfe": jnp.int32(length), "nfe_per_sample": jnp.full((num_samples,), length, jnp.int32)}
        return sampling.Samples(tokens, None, stats)

    def drafter(self, net):
        """Drafts left to right, k + 1 calls a round (``ARDraft``)."""
        return ARDraft(net.graphdef, net.state)
