r"""The causal language model: a network's next-token law, its exact likelihood, and its decoding.

Two kinds hold one: the AR baseline (``sedd.kinds.ar``), whose whole network
it is (with ``model.draft_head``, a draft head beside it: ``sedd.kinds.draft_head``),
and the spec kind's causal half (``sedd.kinds.spec``). Either network
reads [BOS, x_0, ..., x_{L-2}] and its output at position l is the logits of
x_l, so every one of the L tokens is predicted, the first from BOS alone:

    -log p_theta(x) = -sum_{l=0}^{L-1} log p_theta(x_l | x_{<l})   (nats per sequence),

the exact negative log-likelihood, directly comparable with a diffusion
model's bound on the same quantity (``sedd.evaluate.likelihood_bound``).

One helper gives a step's inputs (``inputs``), one forward the features and
the logits (``features``), and decoding runs on the network's decoding cache
(``decode_in_cache``), past the model's length on a ring. ``CausalKind`` is
what the kinds that hold one share: the exact NLL as their likelihood (so
either judges samples), a prefix prompt, their options as one checked value.

Letters: B batch, L length, V vocabulary, S cache slots.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sedd import evaluate, sampling, speculative
from sedd.categorical import sample_categorical
from sedd.kinds.base import Kind, Net, kinds_that
from sedd.kinds.capabilities import Exact
from sedd.model import DDiT, ring_mask
from sedd.sampling import shaped_law


def check(model: DDiT) -> None:
    """Raise a ValueError unless `model` is a causal LM (module docstring)."""
    if model.time_conditioning or model.num_tokens <= model.out_dim or model.scale_by_sigma or model.normalize:
        raise ValueError(
            "a causal language model is a DDiT without time conditioning that outputs V = out_dim "
            "logits and embeds BOS = V (num_tokens > V): a model.kind='ar' or 'spec' network "
            "(sedd.kinds.build_model)"
        )


LM_ARCH = dict(scale_by_sigma=False, time_conditioning=False, normalize=False)
"""What every causal LM's ``network_of`` shares (``check``): no time input, its output the logits as they are."""


def bos_id(model: DDiT) -> int:
    """The beginning-of-sequence id, V."""
    return model.out_dim


def inputs(model: DDiT, text: jax.Array, start: jax.Array | None = None, n: int | None = None) -> jax.Array:
    """The network's inputs for the targets `text` int[B, T]: at position p the token x_{p-1}, BOS at p = 0.

    start, n: None: every position, int[B, T] (a training forward); else int32[B, n], the n positions
    start .. start + n - 1 of a decoding step, start int32[] or int32[B] (a row's own).
    """
    check(model)
    if start is None:
        return jnp.concatenate([jnp.full((text.shape[0], 1), bos_id(model), text.dtype), text[:, :-1]], axis=1)
    read = jnp.broadcast_to(jnp.asarray(start)[..., None] + jnp.arange(n) - 1, (text.shape[0], n))  # (B, n)
    tokens = jnp.take_along_axis(text, jnp.maximum(read, 0), axis=1)
    return jnp.where(read >= 0, tokens, bos_id(model)).astype(jnp.int32)


def features(model: DDiT, x: jax.Array, *, deterministic: bool | None = True, rngs=None) -> tuple:
    """The causal LM's one forward over the texts x int[B, L]: what every loss reads.

    Returns (h float32[B, L, H], c): ``model.output(h, c)`` is float32[B, L, V], row l the logits of x_l
    given x_{<l}, and h at l what a draft head reads.
    """
    mask = None if model.causal else np.tril(np.ones((x.shape[1],) * 2, bool))  # a causal mask, unless built in
    return model.features(inputs(model, x), None, mask=mask, deterministic=deterministic, rngs=rngs)


def next_token_logits(model: DDiT, x: jax.Array, *, deterministic: bool | None = True, rngs=None) -> jax.Array:
    """Logits of x_l given x_{<l} at every position, float32[B, L, V]: ``features``' output."""
    return model.output(*features(model, x, deterministic=deterministic, rngs=rngs))  # (B, L, V)


def nll_of_logits(logits: jax.Array, x: jax.Array) -> jax.Array:
    """-log softmax(logits)[x] at every position: float32[...]."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, x[..., None].astype(jnp.int32), axis=-1)[..., 0]


def token_nll(model: DDiT, x: jax.Array, *, deterministic: bool | None = True, rngs=None, chunk: int = 0) -> jax.Array:
    """-log p_theta(x_l | x_{<l}) at every position: float32[B, L] nats.

    chunk > 0: the logits `chunk` positions at a time (``DDiT.output_chunked``, training.loss_chunk).
    """
    h, c = features(model, x, deterministic=deterministic, rngs=rngs)  # (B, L, H)
    if chunk:
        return model.output_chunked(h, c, nll_of_logits, x, chunk=chunk)  # (B, L)
    return nll_of_logits(model.output(h, c), x)  # (B, L)


def sequence_nll(
    model: DDiT, x: jax.Array, *, deterministic: bool | None = True, rngs=None, chunk: int = 0
) -> jax.Array:
    """-log p_theta(x) in nats per sequence, float32[B]: the AR kind's training loss (chunk: ``token_nll``)."""
    return token_nll(model, x, deterministic=deterministic, rngs=rngs, chunk=chunk).sum(-1)


@nnx.jit
def nll(model: DDiT, x: jax.Array) -> jax.Array:
    """Jitted ``sequence_nll`` with dropout off: float32[B] nats per sequence."""
    return sequence_nll(model, x, deterministic=True)


DRAFT_TARGETS = ("data", "causal", "own")
"""What drafts learn, training.draft_target: the text's next tokens, the causal LM's laws on the text, or its laws
on text it writes itself (``with_own_texts``; the spec kind's ``loss``, ``sedd.kinds.draft_head.loss``)."""


def draft_training(config, what: str) -> tuple[int, float, str]:
    """(k, w, target) of a kind that learns to draft: model.draft_k, training.draft_weight and
    training.draft_target, each checked before any training (a ValueError naming the key, or
    training.loss_chunk, which such a loss does not take); `what` names the drafts."""
    k, length = config.model.draft_k, config.data.seq_len
    if isinstance(k, bool) or not (isinstance(k, int) and 1 <= k <= min(length, speculative.MAX_DRAFTS)):
        raise ValueError(
            f"model.draft_k={k!r} (the drafts a round of {what}) must be an integer in "
            f"[1, {min(length, speculative.MAX_DRAFTS)}] (data.seq_len and sedd.speculative.MAX_DRAFTS); "
            "4 is a good start"
        )
    if config.training.loss_chunk:
        raise ValueError(f"training.loss_chunk={config.training.loss_chunk} is not implemented for {what}: set it to 0")
    w = config.training.draft_weight
    if not (isinstance(w, (int, float)) and 0 <= w < float("inf")):
        raise ValueError(f"training.draft_weight={w!r} must be a finite number >= 0 (the drafts' share of the loss)")
    target = config.training.draft_target
    if target not in DRAFT_TARGETS:
        raise ValueError(
            f"training.draft_target={target!r} (what {what} trains its drafts on) must be one of "
            f"{DRAFT_TARGETS}: the text's tokens, the causal LM's laws on it, or its laws on text it writes"
        )
    return k, float(w), target


def with_own_texts(model: DDiT, x: jax.Array, key: jax.Array | None) -> jax.Array:
    """x int[B, L] and below it B texts the network writes now from `key` (``ancestral`` at temperature 1, no
    gradient through the draw): int[2B, L], one forward for both (draft_target "own": on-policy drafts' targets)."""
    if key is None:
        raise ValueError('draft_target="own" draws the causal LM\'s texts: give a key')
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    own = ancestral(key, graphdef, jax.lax.stop_gradient((params, rest)), *x.shape)  # (B, L)
    return jnp.concatenate([x, own.astype(x.dtype)])


# --------------------------------------------------------------------------- decoding


def decode_in_cache(model: DDiT, cache: tuple, inputs: jax.Array, start: jax.Array) -> tuple:
    """n positions start .. start + n - 1 through the network on the cache the caller holds, causally.

    Each position sees the cache's slots up to its own. cache: ``model.empty_cache(B, S)``'s, holding
    positions < start; inputs: int[B, n]; start: int32[] or int32[B] (a row's own). Returns
    ``DDiT.output_in_cache``'s (logits float32[B, n, V], the cache, features float32[B, n, H]).
    """
    n, slots = inputs.shape[1], cache[0][0].shape[1]
    positions = jnp.asarray(start)[..., None] + jnp.arange(n)  # (n,) or (B, n)
    mask = jnp.arange(slots) <= positions[..., None]  # ([B,] n, S)
    return model.output_in_cache(inputs, None, positions=positions, mask=mask, cache=cache, at=start)


ROWS_IN_ONE_CALL = 64
"""``decode_rows``: up to this many rows in one call (the network's writes at a place a row, unrolled)."""


def decode_rows(model: DDiT, cache: tuple, inputs: jax.Array, start: jax.Array) -> tuple:
    """``decode_in_cache`` with start int32[B], a start a row: the rows in one call up to
    ``ROWS_IN_ONE_CALL`` rows (one write a row); past it one program a row under ``jax.vmap`` (a batched
    call's writes and masks grow with B; a test samples 50,000 rows at once)."""
    b = inputs.shape[0]
    if b <= ROWS_IN_ONE_CALL:
        return decode_in_cache(model, cache, inputs, start)
    n = model.layers[0].n_heads
    per_row = jax.tree.map(lambda a: a.reshape(b, n, *a.shape[1:]), cache)  # (B, N, S, K) each
    logits, per_row, h = jax.vmap(lambda c, x, s: decode_in_cache(model, c, x[None], s))(per_row, inputs, start)
    return logits[:, 0], jax.tree.map(lambda a: a.reshape(b * n, *a.shape[2:]), per_row), h[:, 0]


@functools.partial(jax.jit, static_argnames=("graphdef", "num_samples", "length", "categorical", "top_p"))
def _draw(graphdef, state, key, temperature, prompt, prompt_len, *, num_samples, length, categorical, top_p):
    """``ancestral``'s loop on a split network: one dispatch a text, no walk over the model's graph a call.

    Up to max_len each step writes its slot of the cache in place; past it the cache is a ring of
    max_len + 1 slots (a sliding window of max_len positions, ``sedd.model.ring_mask``)."""
    model = nnx.merge(graphdef, *state)
    check(model)
    ring = length > model.max_len
    slots = model.max_len + 1 if ring else length

    def step(pos, carry):
        cache, toks = carry
        x = inputs(model, toks, pos, 1)  # (B, 1): x_{pos-1}, BOS at 0
        if ring:
            mask = ring_mask(pos[None], slots, model.max_len)  # (1, S)
            logits, cache, _ = model.output_in_cache(x, None, positions=pos[None], mask=mask, cache=cache)
        else:
            logits, cache, _ = decode_in_cache(model, cache, x, pos)  # (B, 1, V): x_pos's law, its slot
        law = shaped_law(logits[:, 0], temperature, top_p)  # (B, V); T = 0: the argmax's one-hot
        tok = sample_categorical(jax.random.fold_in(key, pos), law, categorical).astype(jnp.int32)
        tok = jnp.where(pos < prompt_len, prompt[:, pos], tok)  # a given prefix is kept
        return cache, toks.at[:, pos].set(tok)

    carry = (model.empty_cache(num_samples, slots), jnp.zeros((num_samples, length), jnp.int32))
    return jax.lax.fori_loop(0, length, step, carry)[1]  # (B, L)


def ancestral(
    key: jax.Array,
    graphdef,
    state,
    num_samples: int,
    length: int,
    temperature: float = 1.0,
    prompt: jax.Array | None = None,
    categorical: str = "precise",
    top_p: float = 1.0,
) -> jax.Array:
    """Ancestral sampling with the decoding cache: L network calls of one position each, int32[B, L].

    Args:
      graphdef, state: the causal LM split (state = (params, rest)); ``ancestral_model`` takes the module.
      length: L >= 1 tokens (any length; the context is at most max_len, a sliding window past it).
      temperature: divides the logits (0 = the argmax, greedy); top_p: its nucleus (``shaped_law``).
      prompt: optional int[B, P] prefix (P <= L) kept as given.
    """
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if not temperature >= 0 or not 0 < top_p <= 1:
        raise ValueError(f"temperature must be >= 0 and top_p in (0, 1], got {temperature} and {top_p}")
    prompt = jnp.zeros((num_samples, 0), jnp.int32) if prompt is None else jnp.asarray(prompt, jnp.int32)
    prompt_len = prompt.shape[1]
    if prompt.shape[0] != num_samples or prompt_len > length:
        raise ValueError(f"prompt must be int[{num_samples}, <= {length}], got {prompt.shape}")
    prompt = jnp.pad(prompt, ((0, 0), (0, length - prompt_len)))
    return _draw(
        graphdef,
        state,
        key,
        jnp.float32(temperature),
        prompt,
        jnp.int32(prompt_len),
        num_samples=int(num_samples),
        length=int(length),
        categorical=categorical,
        top_p=float(top_p),
    )


def ancestral_counted(key: jax.Array, graphdef, state, num_samples: int, length: int, *args) -> tuple:
    """(``ancestral``'s tokens, the stats of a kind that speculates for them): one call of the network a token,
    "nfe" and "nfe_per_sample" L, no draft call, no round ("accepted_at" int32[0]). args: ``ancestral``'s."""
    tokens = ancestral(key, graphdef, state, num_samples, length, *args)
    calls = jnp.full((num_samples,), length, jnp.int32)
    stats = {"nfe": jnp.int32(length), "nfe_per_sample": calls, "draft_calls": jnp.zeros_like(calls)}
    return tokens, stats | {"accepted_at": jnp.zeros((0,), jnp.int32)}


def ancestral_model(
    key: jax.Array,
    model: DDiT,
    num_samples: int,
    length: int,
    temperature: float = 1.0,
    prompt: jax.Array | None = None,
    categorical: str = "precise",
    top_p: float = 1.0,
) -> jax.Array:
    """``ancestral`` of the module `model` (split here, dropout off)."""
    check(model)
    model.eval()
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    return ancestral(key, graphdef, (params, rest), num_samples, length, temperature, prompt, categorical, top_p)


# --------------------------------------------------------------------------- the target of speculative sampling


def build_speculative_target(graphdef, temperature=1.0, top_p=1.0, for_head: bool = False) -> tuple:
    r"""(prefill, target) of the causal LM `graphdef` for ``sedd.speculative.decode``, each row its own KV cache.

    ``target(state, text, start, k)`` scores the k + 1 positions start .. start + k in one call
    (``decode_rows``). A query sees the slots up to its own position only, so the slots of rejected
    drafts are written over by the next call before any query sees them: the cache rolls back by the
    start alone. The law is the network's shaped by T and top_p (floats or traced).

    Returns:
      prefill(params_state, prompt int32[B, P]) -> state = ((params, rest), cache): the cache after the
        prompt, max(max_len, P) + MAX_DRAFTS + 1 slots, every slot a round past the text's end writes.
      target: as ``sedd.speculative.decode`` takes it.
      With `for_head`, the state also holds the features of the last call, float32[B, MAX_DRAFTS + 1, H]
      (its first n rows), and the first of their positions int32[B]: what a draft head reads.
    """

    def prefill(params_state, prompt):
        model = nnx.merge(graphdef, *params_state)
        check(model)
        b, p = prompt.shape
        cache = model.empty_cache(b, max(model.max_len, p) + speculative.MAX_DRAFTS + 1)
        if p:
            _, cache, last = decode_in_cache(model, cache, inputs(model, prompt), jnp.int32(0))
        if not for_head:
            return params_state, cache
        h = jnp.zeros((b, speculative.MAX_DRAFTS + 1, model.hidden_size), jnp.float32)
        h = h.at[:, 0].set(last[:, -1]) if p else h  # the prompt's last position
        return params_state, cache, h, jnp.full((b,), p - 1, jnp.int32)

    def target(state, text, start, k):
        params_state, cache = state[:2]
        model = nnx.merge(graphdef, *params_state)
        fits(cache, text)
        chunk = inputs(model, text, start, k + 1)  # (B, k + 1): x_{start-1} (BOS at 0) and the k drafts
        logits, cache, h = decode_rows(model, cache, chunk, start)  # (B, k + 1, V), each row at its start
        p = shaped_law(logits, temperature, top_p)
        if not for_head:
            return p, (params_state, cache)
        h = state[2].at[:, : k + 1].set(h.astype(jnp.float32))  # (B, MAX_DRAFTS + 1, H), in place
        return p, (params_state, cache, h, start)

    return prefill, target


def fits(cache: tuple, text: jax.Array) -> None:
    """Raise a ValueError unless the cache (``build_speculative_target``'s) holds every position of `text`
    (int32[B, T]): a round writes up to position T - 1, and a write past the cache's end would land on other slots."""
    slots = cache[0][0].shape[-2]
    if text.shape[1] > slots:
        raise ValueError(
            f"a text buffer of {text.shape[1]} positions does not fit the prefilled cache's {slots} slots "
            "(max(max_len, prompt length) + MAX_DRAFTS + 1): prefill a prompt buffer as long as the text"
        )


@functools.lru_cache(maxsize=None)
def speculative_target(graphdef, *, temperature: float = 1.0, top_p: float = 1.0) -> tuple:
    """``build_speculative_target`` of Python values, cached: one (prefill, target) pair, one jit cache entry."""
    return build_speculative_target(graphdef, temperature, top_p)


def without_drafts(graphdef, vocab: int, categorical: str) -> sampling.rounds.Speculation:
    """The rounds of the causal LM `graphdef` alone, k = 0 (``sedd serve``'s rows of a run without drafts): each
    a call that writes the one token it draws, ancestral sampling on the KV cache. The drafter a round asks for
    its k = 0 drafts is prompt lookup's (empty: no draft, no call)."""

    def parts(temperature, top_p):
        prefill, target = build_speculative_target(graphdef, temperature, top_p)
        return (lambda state, text: (prefill(state, text), None)), target, speculative.ngram_drafter(vocab)

    return sampling.rounds.Speculation(parts, 0, None, categorical=categorical)


# =========================================================================== the kinds that hold one


def prefix_prompt(kind: Kind, fixed_mask, fixed_tokens) -> jax.Array | None:
    """int32[B, P]: a prompt of a kind that writes left to right, a prefix of the same P in every row (None);
    any other pattern is a ValueError naming the kinds that honour one."""
    if fixed_mask is None:
        return None
    mask = jnp.asarray(fixed_mask, bool)
    p = int(mask[0].sum())
    if not bool(jnp.all(mask == (jnp.arange(mask.shape[1]) < p)[None, :])):
        raise ValueError(
            f"a model.kind={kind.name!r} run takes a prompt that is a prefix of the same length in "
            f"every row; a suffix or infill is for {kinds_that(lambda k: 'infill' in k.conditions)}"
        )
    return jnp.asarray(fixed_tokens, jnp.int32)[:, :p]


def _number(name: str, value, ok: Callable[[float], bool], expected: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class CausalOptions:
    """The sampling options of a kind that writes left to right, as one checked value (``make``).

    A kind's module adds its own options as the fields of a subclass, and checks them in its ``checked``;
    a field no class of the kind has is refused by ``make``.

    Attributes:
      categorical: the method of ``sedd.categorical.sample_categorical``.
      temperature: >= 0 on the network's law (0: the argmax).
      top_p: in (0, 1], its nucleus.
      return_stats: count the network calls.
      prompt: int32[B, P] the given prefix, the same P in every row; None.
    """

    categorical: str = "precise"
    temperature: float = 1.0
    top_p: float = 1.0
    return_stats: bool = False
    prompt: Any = dataclasses.field(default=None, compare=False)

    @classmethod
    def make(cls, kind: Kind, **options) -> CausalOptions:
        """The options of ``kind.sample`` checked (a prompt as fixed_mask / fixed_tokens): an option this kind
        does not take, or a value out of its range, is a ValueError of one line."""
        prompt = prefix_prompt(kind, options.pop("fixed_mask", None), options.pop("fixed_tokens", None))
        given = {name for name, value in options.items() if value is not None}
        takes = {f.name for f in dataclasses.fields(cls)} - {"prompt"}
        if unknown := sorted(given - takes):
            raise ValueError(
                f"a model.kind={kind.name!r} run takes no option {', '.join(unknown)}; it takes "
                f"{', '.join(sorted(takes - {'return_stats'}))}"
            )
        return cls(**{name: options[name] for name in given}, prompt=prompt).checked()

    def checked(self) -> CausalOptions:
        """These options, their values in range (a subclass checks its own fields too)."""
        if self.categorical not in sampling.CATEGORICAL_METHODS:
            raise ValueError(
                f"unknown categorical method {self.categorical!r}; expected one of {sampling.CATEGORICAL_METHODS}"
            )
        return dataclasses.replace(
            self,
            temperature=_number("temperature", self.temperature, lambda t: 0 <= t < float("inf"), "a number >= 0"),
            top_p=_number("top_p", self.top_p, lambda p: 0 < p <= 1, "in (0, 1]"),
        )


@dataclasses.dataclass(frozen=True)
class RoundOptions(CausalOptions):
    """``CausalOptions`` and a speculative round's, for a kind that speculates (``sedd.speculative``).

    Attributes:
      draft: None (the run's own drafts, if it has any), "ngram" or a ``sedd.drafts.Drafter``.
      draft_k: drafts a round.
      verification: "joint" or "token" (``sedd.speculative.round_law``): the same law.
      layout: a round's layout, in the kind's spelling (None: the kind's own).
      draft_temperature: tau > 0 of the run's own drafts' law q^(1/tau) (None: the kind's default).
    """

    draft: Any = None
    draft_k: Any = None
    verification: str = "joint"
    layout: Any = None
    draft_temperature: Any = None

    def checked(self) -> RoundOptions:
        if self.verification not in speculative.VERIFICATIONS:
            raise ValueError(f"verification must be one of {speculative.VERIFICATIONS}, got {self.verification!r}")
        if self.draft_temperature is not None:
            _number("draft_temperature", self.draft_temperature, lambda t: t > 0, "a number > 0")
        return super().checked()


class CausalKind(Kind, Exact):
    """A kind that holds a causal LM and writes its text left to right (the AR baseline, self-speculation):
    exact, a prefix prompt, every token kept once written, its options one ``CausalOptions`` value.

    Attributes:
      options_type: its ``CausalOptions`` (sub)class.
    """

    conditions = ("prefix",)  # it writes after a prompt only
    options_type: ClassVar[type[CausalOptions]] = CausalOptions

    def unwritten_id(self):
        """V, the BOS id: never a token of the text (a position not written yet)."""
        return self.config.vocab_size

    def settles(self, sampler):
        """Always: each token written stays."""
        return True

    def options(self, **options) -> CausalOptions:
        """The options of ``sample`` as one checked value (``CausalOptions.make``; categorical: the config's)."""
        options.setdefault("categorical", self.config.sampling.categorical)
        return self.options_type.make(self, **options)

    def check_options(self, sampler, **options):
        """``options``: the options ``sample`` takes, checked (a sampler does not apply)."""
        self.options(**options)

    def _draft_loss(self, loss: Callable, key, model, x0, train, rngs) -> jax.Array:
        """`loss` of a kind that learns to draft (``sedd.kinds.spec.loss``, ``sedd.kinds.draft_head.loss``) with its
        draft_k, draft_weight and draft_target (``draft_training``'s)."""
        kw = dict(draft_weight=self.draft_weight, draft_target=self.draft_target, key=key)
        return loss(model, x0, self.draft_k, deterministic=not train, rngs=rngs, **kw)

    def sequence_nll(self, net: Net) -> Callable:
        """x int[B, L] -> -log p(x), float32[B] nats per sequence: the causal LM's exact NLL (a judge of samples)."""
        model = net.model
        return lambda x: nll(model, x)

    def likelihood(self, key, net, batches, num_t, *, max_batches=None, chars_per_token=None, progress=False, **kwargs):
        """The exact NLL of ``sedd.evaluate.dataset_nll`` (num_t and key unused: nothing is estimated)."""
        return evaluate.dataset_nll(
            self.sequence_nll(net), batches, max_batches=max_batches, chars_per_token=chars_per_token, progress=progress
        )
