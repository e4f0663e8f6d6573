r"""An AR run's draft head: a small recurrent network that drafts from the AR network's last features and the token
the verifier just wrote (``model.kind = "ar"`` with ``model.draft_head`` = N > 0; EAGLE-, Medusa- and MTP-style heads
of an AR model).

Speculative sampling (``sedd.speculative``) keeps the AR network's law whatever drafts it checks; the head drafts
after each call, from what the call computed, and costs a fraction of one:

    h_l            the AR network's residual stream after its last layer at position l (input x_{l-1}):
                   what its output layer reads to give p(x_l | x_<l), a summary of x_<l;
    s_0 = P LN(h_l),   s_i = s_{i-1} + W_2 gelu(W_1 [LN(s_{i-1}); E x_{l+i-1}]),
    q_i(.) = softmax(U LN(s_i)),   i = 1 .. k:                                                      (1)

q_i is the head's law of x_{l+i} given h_l and the tokens x_l .. x_{l+i-1} (the first the verifier's, the
rest drafts): each step is a call of a network of 6 N^2 + 2 N V weights (N H more for s_0), against the AR
network's ~12 H^2 a layer, so the k steps of a round cost a fraction of a call.

A round at start s (text x_<s, drafts y_s .. y_{s+k-1}) is one call of the AR network on the k + 1 positions
s .. s + k (``sedd.kinds.causal.build_speculative_target`` for a head): it gives the laws p_i the drafts
are verified against and the features h there. If j drafts are kept and the verifier writes x_{s+j}, the
next round's drafts come from (1) at l = s + j: h_{s+j} saw only x_<s+j (kept drafts and the text), and
the first step reads x_{s+j}. Each draft y was drawn from q_i given the prefix and the drafts before it,
which is what speculative sampling asks of q ((1) of ``sedd.speculative``), so the text has the AR
network's law exactly (tests/test_draft_head.py, by enumeration). The drafts are drawn from q_i shaped like
p (temperature, top_p) and sharpened by tau (``sedd.speculative.sharpened``); the law told the verifier
is the one drawn from. A round's layout (``HeadLayout``) is its k, from 0 (no drafts: the AR network
alone on its KV cache) to model.draft_k, the steps the head was trained to draft.

Training (``loss``): the AR network's NLL, and the head on the same forward's features, held fixed (no
gradient reaches the AR network, so its likelihood is the one it has without a head):

    -sum_l log p(x_l | x_<l)  +  w sum_{i=1..k} sum_{l + i < L} CE(target_{l+i}, q_i at l),        (2)

w = training.draft_weight, target = training.draft_target: "data" the token x_{l+i}; "causal" the AR
network's law p(. | x_<l+i) (the law a draft is kept against); "own" that law on text the AR network
writes (``sedd.kinds.causal.with_own_texts``).

Letters: B batch, L length, H width, N the head's width, V vocabulary, k drafts a round.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from sedd import layers, speculative
import sedd.kinds.causal as causal
from sedd.model import DDiT
from sedd.sampling import shaped_law


class DraftHead(nnx.Module):
    """(1) of the module docstring, of width N from the AR network's H: ``begin`` maps its features to s_0,
    ``step`` reads a token."""

    def __init__(self, hidden_size: int, vocab: int, width: int, *, dtype: Any = jnp.float32, rngs: nnx.Rngs):
        self.norm_in = layers.layer_norm(hidden_size, rngs)
        self.project = layers.linear(hidden_size, width, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.embed = nnx.Embed(
            vocab,
            width,
            dtype=jnp.float32,
            param_dtype=jnp.float32,
            rngs=rngs,
            embedding_init=layers.partitioned(nnx.initializers.normal(1.0), ("vocab", "embed")),
        )
        self.norm_step = layers.layer_norm(width, rngs)
        self.fc1 = layers.linear(2 * width, 2 * width, ("embed", "mlp"), dtype=dtype, rngs=rngs)
        self.fc2 = layers.linear(2 * width, width, ("mlp", "embed"), dtype=dtype, rngs=rngs)
        self.norm_out = layers.layer_norm(width, rngs)
        self.out = layers.linear(width, vocab, ("embed", "vocab"), dtype=dtype, rngs=rngs)
        self.dtype = dtype

    def begin(self, h: jax.Array) -> jax.Array:
        """s_0 = P LN(h): float32[..., N] from the features float[..., H]."""
        return self.project(self.norm_in(h.astype(jnp.float32)).astype(self.dtype)).astype(jnp.float32)

    def step(self, s: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        """s_i and the logits of q_i from s_{i-1} float32[..., N] and the token y int[...] before the drafted one."""
        u = jnp.concatenate([self.norm_step(s), self.embed(y)], axis=-1).astype(self.dtype)  # (..., 2N)
        s = s + self.fc2(jax.nn.gelu(self.fc1(u))).astype(jnp.float32)
        return s, self.out(self.norm_out(s).astype(self.dtype)).astype(jnp.float32)  # (..., N), (..., V)


def attach(model: DDiT, width: int, seed: int) -> DDiT:
    """The AR network `model` with a ``DraftHead`` of width N = `width` as its ``draft_head``."""
    model.draft_head = DraftHead(
        model.hidden_size, model.out_dim, width, dtype=model.dtype, rngs=nnx.Rngs(params=seed + 2)
    )
    return model


def head_of(model: DDiT) -> DraftHead:
    """The network's draft head; a ValueError for a network without one."""
    head = getattr(model, "draft_head", None)
    if not isinstance(head, DraftHead):
        raise ValueError(
            "this AR network has no draft head (model.draft_head = 0); a head is trained with model.draft_head = N > 0"
        )
    return head


def head_nll(head: DraftHead, h: jax.Array, text: jax.Array, k: int, law: jax.Array | None = None) -> jax.Array:
    """The head's cross-entropy of (2) at every start l, summed over its k steps: float32[B, L] nats.

    Args:
      h: float32[B, L, H] features of the text's positions (held fixed by the caller).
      text: int[B, L] the text.
      law: None (the target is the text's token), or float32[B, L, V] the AR network's law at each position.
    """
    length = text.shape[1]
    s, total = head.begin(h), jnp.zeros(text.shape, jnp.float32)  # (B, L, N), (B, L)
    for i in range(1, min(k, length - 1) + 1):
        y = jnp.pad(text[:, i - 1 :], ((0, 0), (0, i - 1)))  # (B, L) x_{l+i-1}: what step i reads
        s, logits = head.step(s, y)  # (B, L, N), (B, L, V): q_i at l, the law of x_{l+i}
        logq = jax.nn.log_softmax(logits, axis=-1)
        if law is None:
            nll = causal.nll_of_logits(logits, jnp.pad(text[:, i:], ((0, 0), (0, i))))
        else:
            nll = -jnp.sum(jnp.pad(law[:, i:], ((0, 0), (0, i), (0, 0))) * logq, axis=-1)
        total += jnp.where(jnp.arange(length) < length - i, nll, 0.0)  # l + i < L
    return total


def loss(
    model: DDiT,
    x: jax.Array,
    k: int,
    *,
    deterministic: bool | None = True,
    rngs=None,
    draft_weight: float = 1.0,
    draft_target: str = "data",
    key: jax.Array | None = None,
) -> jax.Array:
    """(2): the AR network's NLL and w times the head's cross-entropy, nats per sequence, float32[B].

    draft_target: ``sedd.kinds.causal.DRAFT_TARGETS`` ("own" draws B texts of the AR network each call, from `key`).
    """
    b = x.shape[0]
    texts = causal.with_own_texts(model, x, key) if draft_target == "own" else x  # (B or 2B, L)
    h, c = causal.features(model, texts, deterministic=deterministic, rngs=rngs)  # (B', L, H)
    logits = model.output(h, c)  # (B', L, V)
    nll_p = causal.nll_of_logits(logits[:b], x).sum(-1)  # (B,)
    law = None if draft_target == "data" else jax.nn.softmax(jax.lax.stop_gradient(logits[-b:]), axis=-1)
    drafts = head_nll(head_of(model), jax.lax.stop_gradient(h[-b:]), texts[-b:], k, law)  # (B, L)
    return nll_p + draft_weight * drafts.sum(-1)


# --------------------------------------------------------------------------- sampling


DRAFT_TEMPERATURE = 1.0
"""tau of the head's drafts, q_i^(1/tau): its laws are conditionals like p's, not marginals to sharpen."""


class HeadLayout(NamedTuple):
    """A head run's round: k drafts from the head, one call of the AR network on k + 1 positions; k = 0 is the AR
    network alone on its KV cache, one token a call (``sedd.kinds.causal.ancestral``)."""

    k: int

    @property
    def positions(self) -> int:
        return self.k + 1

    @property
    def name(self) -> str:
        """Its spelling on the command line and in layouts.json: "K"."""
        return str(self.k)

    def __str__(self) -> str:
        if not self.k:
            return "no drafts (the AR network alone, 1 position a call)"
        return f"k={self.k} from the draft head ({self.positions} positions a call)"


def layout_of(value, trained_k: int, name: str = "layout") -> HeadLayout:
    """A ``HeadLayout`` from a HeadLayout, an int k or "K" (the command line's); None: trained_k. A ValueError
    names the value (as the option `name`) unless 0 <= k <= trained_k (model.draft_k)."""
    if value is None:
        return HeadLayout(trained_k)
    k = value.k if isinstance(value, HeadLayout) else value
    if isinstance(k, str):
        if not (k.isascii() and k.isdigit() and len(k) <= 3):
            raise ValueError(f"{name}={k[:40]!r} must be 'K', the head's drafts a round (0: none), e.g. '4'")
        k = int(k)
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= trained_k:
        raise ValueError(
            f"{name}={value!r}: this run's draft head drafts k in [0, {trained_k}] a round (model.draft_k = "
            f"{trained_k}, the steps it was trained to draft; 0: no drafts)"
        )
    return HeadLayout(k)


def candidates(k: int) -> list[HeadLayout]:
    """The layouts a head run times (``sedd.kinds.layouts.choose``): no drafts, about k / 2 and k head drafts."""
    return sorted({HeadLayout(0), HeadLayout(max(1, k // 2)), HeadLayout(k)}, key=lambda lay: -lay.k)


def speculative_parts(graphdef, layout, temperature=1.0, top_p=1.0, draft_temperature=DRAFT_TEMPERATURE) -> tuple:
    """(prefill, target, drafter) of the AR network with a head `graphdef` for ``sedd.speculative.decode``
    (shared=True): the network on its KV cache (features kept) verifies, the head drafts k tokens a round
    (layout: a ``HeadLayout`` of k >= 1, ``layout_of``'s).

    state: ((params, rest), cache, features float32[B, MAX_DRAFTS + 1, H] of the last call, its start int32[B]).
    The drafter gives no draft at start 0 (no token to read yet), nor after a prefill of a buffer longer than
    the prompt (``sedd serve``'s: no feature of the prompt's last position): that round writes one token.
    """
    k = layout_of(layout, speculative.MAX_DRAFTS).k
    prefill, target = causal.build_speculative_target(graphdef, temperature, top_p, for_head=True)

    def drafter(key, state, text, start, k_):
        params_state, _, features, last = state
        head = head_of(nnx.merge(graphdef, *params_state))
        rows = jnp.arange(text.shape[0])
        kept = jnp.clip(start - last - 1, 0, k)  # (B,) the drafts the last round kept: h at its start + kept
        s = head.begin(features[rows, kept])  # (B, N)
        y = text[rows, jnp.maximum(start - 1, 0)]  # (B,) the verifier's last token
        drafted, laws = [], []
        for i in range(k):
            s, logits = head.step(s, y)
            q = speculative.sharpened(shaped_law(logits, temperature, top_p), draft_temperature)  # (B, V)
            y = jax.random.categorical(jax.random.fold_in(key, i), jnp.log(q), axis=-1).astype(jnp.int32)
            drafted.append(y)
            laws.append(q)
        fresh = (start > 0) & (start > last)  # else no token read yet, or a buffer prefilled past the start
        return jnp.stack(drafted, 1), jnp.stack(laws, 1), state, jnp.where(fresh, k, 0).astype(jnp.int32)

    return prefill, target, drafter


# ``speculative_parts`` of Python values, called with every argument positional: one jit cache entry each
_parts = functools.lru_cache(maxsize=None)(speculative_parts)


def speculate(
    key: jax.Array,
    graphdef,
    state,
    num_samples: int,
    length: int,
    layout: HeadLayout,
    temperature: float = 1.0,
    top_p: float = 1.0,
    prompt: jax.Array | None = None,
    categorical: str = "precise",
    verification: str = "joint",
    draft_temperature: float | None = None,
) -> tuple[jax.Array, dict]:
    """Text of the AR network with a head (graphdef, state) in rounds of the head's drafts: its law exactly.

    Arguments as ``sedd.kinds.spec.speculate``'s; layout: a ``HeadLayout`` (or an int k), k head drafts
    a round (0: ``causal.ancestral``).

    Returns:
      (int32[B, L], stats): "nfe" the AR network's calls (the batch's: the rounds and the prompt's prefill),
      "nfe_per_sample", "draft_calls" (the head's steps, k a round), "accepted_at" int32[k].
    """
    layout = layout_of(layout, speculative.MAX_DRAFTS)
    k = layout.k
    if not k:  # one call a token, no round
        return causal.ancestral_counted(
            key, graphdef, state, num_samples, length, temperature, prompt, categorical, top_p
        )
    head_of(nnx.merge(graphdef, *state))  # a clear error for a network without a head
    tau = DRAFT_TEMPERATURE if draft_temperature is None else float(draft_temperature)
    parts = _parts(graphdef, layout, float(temperature), float(top_p), tau)
    prefilled = int(prompt is not None and jnp.shape(prompt)[1] > 0)  # without a prompt, no call before round 1
    return speculative.self_drafted(
        key,
        state,
        parts,
        num_samples,
        length,
        k,
        prompt,
        prefill_calls=prefilled,
        draft_calls=k,
        categorical=categorical,
        verification=verification,
    )
