r"""Self-speculation: one network verifies the last draft and drafts the next in the same call (TiDAR-style).

NVIDIA's TiDAR (Liu et al. 2025, "Think in Diffusion, Talk in
Autoregression") trains one transformer on two halves of each sequence: a
causal half scored by the next-token loss, and a half of MASK tokens that
drafts whole blocks in one step. At sampling time each call verifies the
previous draft with the causal half (speculative sampling, ``sedd.speculative``)
and drafts the next block with the other, so a round costs one call and
writes up to k + 1 tokens, and the text has the causal half's law exactly.

The network (``model.kind = "spec"``, k = model.draft_k drafts a round)
embeds the V tokens, BOS = V and MASK = V + 1, and outputs V logits. In
training it reads 2L positions, the same rotary positions on both halves:

    causal half  [BOS, x_0, .., x_{L-2}]  position l sees positions <= l;
                 its output at l is p(x_l | x_<l)                                 (1)
    draft half   L MASKs in groups of k: group g (positions gk .. gk + k - 1)
                 sees the causal half's positions <= a_g = max(gk - 1, 0) and
                 its own group; its output at l is q(x_l | x_<a_g), one step,
                 the positions of a group independent given what they see       (2)

The causal half never sees the draft half, so (1) is an exact autoregressive
law. The loss, nats per sequence (``loss``):

    -sum_l log p(x_l | x_<l)  -  w sum_l log q(x_l | x_<a(l)),                  (3)

w = training.draft_weight (1 by default).

A group skips the token at a_g: at sampling time the token at the anchor is
the one the verifier is writing in the same call, unknown to the draft.

Sampling (``speculative_parts`` for ``sedd.speculative.decode``). A round at
start s (the text x_<s written, drafts y_s .. y_{s+k-1} in hand) is one call
against the KV cache of positions < s:

    causal  [x_{s-1}, y_s, .., y_{s+k-1}] at positions s .. s + k, causally:
            p_i = p(x_{s+i} | x_<s, y_<s+i), i = 0 .. k, the laws that
            ``sedd.speculative`` verifies the drafts with;
    drafts  for each outcome j (j drafts kept, the token at s + j written by
            the verifier), k MASKs at positions s + j + 1 .. s + j + k seeing
            the cache and the causal positions <= s + j.

The next round starts at s' = s + j + 1 and draws its drafts from group j's
laws. Each was drawn given x_<s+j only, independently of the verifier's token
and of each other, so its law given the prefix and the drafts before it is its
group's law: what speculative sampling needs of q, and the text has p's law
exactly (tests/test_spec.py enumerates it). The slots from the next round's
start on (rejected drafts, the groups) are written over by the next round
before any of its queries sees them, so the cache rolls back by the start
alone.

The drafts are drawn from each group's law sharpened, q^(1/tau) with tau =
``DRAFT_TEMPERATURE``, and that is the q the verifier is told, so the law of
the text is unchanged: a group's law is a marginal over the tokens it does not
see, broader than the conditionals that verify it; sharpened it is kept more
often.

Letters: B batch, L length, V vocabulary, k drafts a round, S cache slots.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sedd import sampling, speculative
import sedd.kinds.causal as causal
from sedd.kinds import layouts
from sedd.kinds.base import network_of, register
from sedd.kinds.capabilities import Speculates, Tunes, check_given
from sedd.model import DDiT
from sedd.sampling import shaped_law


def check(model: DDiT) -> None:
    """Raise a ValueError unless `model` is a spec network: V + 2 input ids, V outputs, no time input."""
    if model.causal or model.time_conditioning or model.num_tokens != model.out_dim + 2:
        raise ValueError(
            "a spec network is a DDiT with causal=False, time_conditioning=False, "
            "num_tokens=V + 2 (BOS = V, MASK = V + 1) and out_dim=V; build it with model.kind='spec'"
        )


def mask_id(model: DDiT) -> int:
    """MASK = V + 1."""
    return model.out_dim + 1


def training_mask(length: int, k: int) -> np.ndarray:
    """The attention of the training forward over [causal half ; draft half], (1) and (2): bool[2L, 2L]."""
    pos = np.arange(length)
    group = pos // k
    anchor = np.maximum(group * k - 1, 0)  # (L,) the last causal position a draft group sees
    lower = pos[:, None] >= pos[None, :]
    top = np.concatenate([lower, np.zeros((length, length), bool)], axis=1)  # causal queries
    bottom = np.concatenate([pos[None, :] <= anchor[:, None], group[:, None] == group[None, :]], axis=1)
    return np.concatenate([top, bottom], axis=0)


def halves(
    model: DDiT, x: jax.Array, k: int, deterministic: bool | None = True, rngs=None
) -> tuple[jax.Array, jax.Array]:
    """The training forward over [causal half ; draft half] of the texts x int[B, L]: the logits of (1) and
    of (2), each float[B, L, V] (position l: p(x_l | x_<l) and q(x_l | x_<a(l)))."""
    check(model)
    b, length = x.shape
    inputs = jnp.concatenate([causal.inputs(model, x), jnp.full((b, length), mask_id(model), x.dtype)], axis=1)
    positions = np.concatenate([np.arange(length), np.arange(length)])
    out = model.network_output(
        inputs, None, positions=positions, mask=training_mask(length, k), deterministic=deterministic, rngs=rngs
    )  # (B, 2L, V)
    return out[:, :length], out[:, length:]


def token_nlls(
    model: DDiT, x: jax.Array, k: int, *, deterministic: bool | None = True, rngs=None
) -> tuple[jax.Array, jax.Array]:
    """(-log p(x_l | x_<l), -log q(x_l | x_<a(l))) at every position, (1) and (2): float32[B, L] each, nats."""
    p_logits, q_logits = halves(model, x, k, deterministic, rngs)
    return causal.nll_of_logits(p_logits, x), causal.nll_of_logits(q_logits, x)


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
    """(3): the causal half's NLL and w times the drafts' cross-entropy, nats per sequence, float32[B].

    w = training.draft_weight (below 1: a lower NLL, fewer drafts kept). draft_target =
    training.draft_target: "data", (3) against the text's token x_l; "causal", against the causal
    half's own law there, held fixed (no gradient through it):

        -w sum_l sum_v p(v | x_<l) log q(v | x_<a(l)),                                      (4)

    since a draft is kept against p, not the text (with probability about sum_v min(p, q)), and each
    term gives the whole law where (3) gives one token; "own": (4) on texts the causal half writes now
    (from `key`, ``causal.ancestral``, no gradient through the draw), the tokens sampling meets
    (on-policy); the NLL stays on x. The text keeps p's law exactly either way.
    """
    if draft_target not in causal.DRAFT_TARGETS:
        raise ValueError(f"draft_target must be one of {causal.DRAFT_TARGETS}, got {draft_target!r}")
    b, length = x.shape
    texts = causal.with_own_texts(model, x, key) if draft_target == "own" else x  # (B or 2B, L)
    p_logits, q_logits = halves(model, texts, k, deterministic, rngs)
    nll_p = causal.nll_of_logits(p_logits[:b], x)
    if draft_target == "data":
        nll_q = causal.nll_of_logits(q_logits, x)
    else:
        p_logits, q_logits = p_logits[-b:], q_logits[-b:]  # "own": the texts it wrote
        p = jax.nn.softmax(jax.lax.stop_gradient(p_logits).astype(jnp.float32), axis=-1)
        nll_q = -jnp.sum(p * jax.nn.log_softmax(q_logits.astype(jnp.float32), axis=-1), axis=-1)
    return nll_p.sum(-1) + draft_weight * nll_q.sum(-1)


# --------------------------------------------------------------------------- sampling


class Layout(NamedTuple):
    """A round's shape: k drafts verified, and groups of k drafts for the outcomes j = 0 .. groups - 1.

    A call on ``positions`` = (k + 1) + groups k positions. TiDAR's layout is groups = k + 1; fewer
    groups cost fewer positions, and an outcome j >= groups takes the last group's drafts from the new
    start on (the round after has fewer drafts). k = 0 (``NO_DRAFTS``) is the causal half alone, one
    token a call: the fastest where a position costs as much as it adds. Every layout keeps the law.
    """

    k: int
    groups: int

    @property
    def positions(self) -> int:
        return self.k + 1 + self.groups * self.k

    @property
    def name(self) -> str:
        """Its spelling in layouts.json (``sedd.kinds.layouts``): "K,GROUPS"."""
        return f"{self.k},{self.groups}"

    def __str__(self) -> str:
        if not self.k:
            return "no drafts (the causal half alone, 1 position a call)"
        return f"k={self.k} groups={self.groups} ({self.positions} positions a call)"


NO_DRAFTS = Layout(0, 0)
"""The layout of no drafts: the causal half alone, one token a call ("0" on the command line)."""


def layout_of(value, trained_k: int | None, name: str = "layout") -> Layout:
    """A ``Layout`` from a Layout, an int k (a group for every outcome), or "K,GROUPS" / "K" (the command line's).

    None: the run's own k (trained_k) with every group; 0 or "0": ``NO_DRAFTS``. Raises a ValueError
    naming the value (as the option `name`) unless 1 <= k <= trained_k (model.draft_k: a group larger than
    training showed was never trained; trained_k None: ``speculative.MAX_DRAFTS``, the format alone) and
    1 <= groups <= k + 1, or k = groups = 0.
    """
    if value is None:
        return Layout(trained_k, trained_k + 1)
    given = value
    if isinstance(value, str):
        parts = value.split(",")
        if not (1 <= len(parts) <= 2 and all(p.isascii() and p.isdigit() and len(p) <= 3 for p in parts)):
            raise ValueError(
                f"{name}={value[:40]!r} must be 'K' or 'K,GROUPS' (drafts a round, draft groups; "
                "0: no drafts), e.g. '4,2'"
            )
        k = int(parts[0])
        value = Layout(k, int(parts[1]) if len(parts) == 2 else k + 1 if k else 0)
    elif isinstance(value, int) and not isinstance(value, bool):
        value = Layout(value, value + 1 if value else 0)
    if not isinstance(value, tuple) or len(value) != 2:
        raise ValueError(f"{name}={value!r} must be a spec.Layout, an int k or 'K,GROUPS'")
    k, groups = value
    most = speculative.MAX_DRAFTS if trained_k is None else trained_k
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if not (ints and (k == groups == 0 or (1 <= k <= most and 1 <= groups <= k + 1))):
        raise ValueError(
            f"{name}={given!r}: k={k!r} must be in [1, {most}]"
            + ("" if trained_k is None else f" (model.draft_k = {trained_k}, the drafts a round it was trained on)")
            + f" and groups={groups!r} in [1, k + 1], or both 0 (no drafts)"
        )
    return Layout(k, groups)


def candidates(k: int) -> list[Layout]:
    """The layouts a run trained at k times (``sedd.kinds.layouts.choose``), each a program of its own, so the
    few that win somewhere: no drafts; k = 1 and about k / 2 with two groups; k with one group."""
    return sorted(
        {NO_DRAFTS, Layout(1, 2), Layout(max(1, k // 2), 2), Layout(k, 1)}, key=lambda lay: (-lay.k, -lay.groups)
    )


def round_mask(k: int, groups: int | None = None) -> np.ndarray:
    """What each of a round's positions sees of the round's own: bool[n, n], n = (k + 1) + groups k.

    The k + 1 causal positions first, causally; then group j = 0 .. groups - 1 (default k, every
    outcome) of k drafts, seeing the causal positions <= j and its own group.
    """
    n_c = k + 1
    groups = n_c if groups is None else groups
    idx = np.arange(n_c + groups * k)
    group = np.where(idx < n_c, -1, (idx - n_c) // k)  # -1: causal
    causal_q = (group[:, None] < 0) & (group[None, :] < 0) & (idx[None, :] <= idx[:, None])
    draft_sees_causal = (group[:, None] >= 0) & (group[None, :] < 0) & (idx[None, :] <= group[:, None])
    own = (group[:, None] >= 0) & (group[:, None] == group[None, :])
    return causal_q | draft_sees_causal | own


def _call(
    model: DDiT, cache: tuple, start, tokens: jax.Array, positions: jax.Array, own: np.ndarray
) -> tuple[jax.Array, tuple]:
    """One call of every row: tokens int[B, n] at `positions` ([B,] n), written into cache slots start .. start + n - 1
    (start int32[] or int32[B], a row's own), each seeing the slots < start (the text) and the call's own slots as own
    bool[n, n] says; returns (logits float32[B, n, V], cache).

    Slots past the call's causal positions hold its draft groups' keys and values: they lie at or past the next
    round's start, which writes its own slots over them before any query of its sees them."""
    n, slots = tokens.shape[1], cache[0][0].shape[1]
    rel = jnp.arange(slots) - jnp.asarray(start)[..., None]  # ([B,] S) a slot's place in this call; < 0: the text
    inside = (rel >= 0) & (rel < n)
    own = jnp.moveaxis(jnp.take(jnp.asarray(own), jnp.clip(rel, 0, n - 1), axis=1), 0, -2)  # ([B,] n, S)
    sees = (rel < 0)[..., None, :] | (inside[..., None, :] & own)
    return model.output_in_cache(tokens, None, positions=positions, mask=sees, cache=cache, at=start)[:2]


DRAFT_TEMPERATURE = 0.8
"""tau of the drafts' law q^(1/tau) (module docstring): 1 draws from the groups' laws as they are."""


def speculative_parts(graphdef, layout, temperature=1.0, top_p=1.0, draft_temperature=DRAFT_TEMPERATURE) -> tuple:
    r"""(prefill, target, drafter) of the spec network `graphdef` for ``sedd.speculative.decode(shared=True)``.

    Each row has its own start. The state, shared by target and drafter: ((params, rest), caches, laws
    float32[B, groups, k, V] of each group's drafts, the last round's start int32[B]). temperature and
    top_p may be traced; draft_temperature is tau (module docstring).

    Returns:
      prefill(params_state, prompt int32[B, P]) -> state: the prompt in the cache and the first round's
        drafts (one call; decode's prompt_len must then be P).
      target(state, text, start, k) -> (p float32[B, k + 1, V], state): one call, the round.
      drafter(key, state, text, start, k) -> (drafted int32[B, k], q float32[B, k, V], state, count int32[B]):
        no call; the drafts of the outcome the last round had (count < k past the last group).
    """
    k, groups = layout_of(layout, None)

    def slots_of(model):  # every slot a call may write: a round's from start <= max_len - 1, or the prefill's
        return max(model.max_len + mask.shape[0], model.max_len + k)

    def prefill(params_state, prompt):
        model = nnx.merge(graphdef, *params_state)
        check(model)
        b, p = prompt.shape
        n_c = max(p, 1)
        seen = max(p - 1, 0)  # the one group sees the causal positions <= seen
        idx = np.arange(n_c + k)
        first_mask = np.where(
            idx[:, None] < n_c,
            (idx[None, :] <= idx[:, None]) & (idx[None, :] < n_c),
            (idx[None, :] <= seen) | (idx[None, :] >= n_c),
        )
        positions = jnp.asarray(np.concatenate([np.arange(n_c), p + np.arange(k)]), jnp.int32)
        prompt = jnp.pad(prompt.astype(jnp.int32), ((0, 0), (0, 1)))  # [prompt, 0]: its inputs, [BOS] without one
        tokens = jnp.concatenate(
            [causal.inputs(model, prompt)[:, :n_c], jnp.full((b, k), mask_id(model), jnp.int32)], 1
        )
        out, caches = _call(model, model.empty_cache(b, slots_of(model)), 0, tokens, positions, first_mask)
        first = shaped_law(out[:, n_c:], temperature, top_p)  # (B, k, V)
        laws = jnp.zeros((b, groups, k, model.out_dim), jnp.float32).at[:, 0].set(first)
        return params_state, caches, laws, jnp.full((b,), p - 1, jnp.int32)

    mask = round_mask(k, groups)
    offsets = np.concatenate([np.arange(k + 1), (np.arange(groups)[:, None] + 1 + np.arange(k)[None, :]).ravel()])

    def target(state, text, start, k_):
        params_state, caches, _, _ = state
        model = nnx.merge(graphdef, *params_state)

        b = text.shape[0]
        verified = causal.inputs(model, text, start, k + 1)  # (B, k + 1): x_{start-1} (BOS at 0), the drafts
        tokens = jnp.concatenate([verified, jnp.full((b, k * groups), mask_id(model), jnp.int32)], 1)
        out, caches = _call(model, caches, start, tokens, start[:, None] + jnp.asarray(offsets, jnp.int32), mask)
        shaped = shaped_law(out, temperature, top_p)  # (B, k + 1 + groups k, V)
        p, laws = shaped[:, : k + 1], shaped[:, k + 1 :].reshape(b, groups, k, -1)
        return p, (params_state, caches, laws, start)

    def drafter(key, state, text, start, k_):
        params_state, caches, laws, last = state
        j = jnp.clip(start - last - 1, 0, k)  # (B,) the drafts kept in the last round
        group = jnp.minimum(j, groups - 1)  # (B,) past the last group: its drafts from the new start on
        skip = j - group  # (B,) its first `skip` positions are written already
        law = jnp.take_along_axis(laws, group[:, None, None, None], axis=1)[:, 0]  # (B, k, V)
        at = jnp.minimum(skip[:, None] + jnp.arange(k)[None, :], k - 1)  # (B, k)
        q = speculative.sharpened(jnp.take_along_axis(law, at[..., None], axis=1), draft_temperature)  # (B, k, V)
        drafted = jax.random.categorical(key, jnp.log(q), axis=-1).astype(jnp.int32)  # (B, k)
        return drafted, q, state, k - skip

    return prefill, target, drafter


# ``speculative_parts`` of Python values, called with every argument positional: one jit cache entry each
_parts = functools.lru_cache(maxsize=None)(speculative_parts)


def speculate(
    key: jax.Array,
    graphdef,
    state,
    num_samples: int,
    length: int,
    layout,
    temperature: float = 1.0,
    top_p: float = 1.0,
    prompt: jax.Array | None = None,
    categorical: str = "precise",
    verification: str = "joint",
    draft_temperature: float | None = None,
) -> tuple[jax.Array, dict]:
    """Text of the spec network (graphdef, state) by self-speculation: the causal half's law exactly.

    Args:
      graphdef, state: the network, state = (params, rest).
      num_samples, length: B, L (L at most the model's length).
      layout: a ``Layout``, or an int k (a group for every outcome); ``NO_DRAFTS``: ``causal.ancestral``.
      temperature, top_p: on the causal half's law, so the text's (and on the drafts').
      prompt: optional int32[B, P], the same P for every row.
      verification: "joint" or "token" (``sedd.speculative.round_law``): the same law.
      draft_temperature: tau > 0 of the drafts' law q^(1/tau); None: ``DRAFT_TEMPERATURE``.
    Returns:
      (int32[B, L], stats): "nfe" the network calls (the batch's: the rounds and the prefill),
      "nfe_per_sample", "draft_calls" (0: the drafts come from the same calls), "accepted_at" int32[k].
    """
    layout = layout_of(layout, None)
    if not layout.k:  # one call a token, no round
        return causal.ancestral_counted(
            key, graphdef, state, num_samples, length, temperature, prompt, categorical, top_p
        )
    if draft_temperature is not None and not (isinstance(draft_temperature, (int, float)) and draft_temperature > 0):
        raise ValueError(f"draft_temperature must be a number > 0, got {draft_temperature!r}")
    tau = DRAFT_TEMPERATURE if draft_temperature is None else float(draft_temperature)
    parts = _parts(graphdef, layout, float(temperature), float(top_p), tau)
    return speculative.self_drafted(  # the prefill's call drafts the first round; the drafts ride in the calls
        key,
        state,
        parts,
        num_samples,
        length,
        layout.k,
        prompt,
        prefill_calls=1,
        draft_calls=0,
        categorical=categorical,
        verification=verification,
    )


# =========================================================================== the kind


@dataclasses.dataclass(frozen=True)
class SpecOptions(causal.RoundOptions):
    """``causal.RoundOptions`` of a spec run: a layout ``layout_of`` reads; draft_k its k (alone: a group for every
    outcome); no draft (it drafts for itself)."""

    def checked(self):
        if self.draft is not None:
            raise ValueError(
                "a draft (--draft) drafts for an AR run (model.kind='ar'); this run's model.kind is "
                "'spec', which drafts for itself"
            )
        if self.layout is not None:
            layout_of(self.layout, None)  # its format, before any work
        return super().checked()


@register("spec", reads=("model.draft_k", "training.draft_weight", "training.draft_target"))
class SelfSpeculative(causal.CausalKind, Speculates, Tunes):
    """One network that drafts and verifies in the same call (module docstring): its causal half's exact NLL
    and law.

    Attributes:
      draft_k: k = model.draft_k, the drafts a round it was trained to draft.
      layout: the round's ``Layout`` when none is given: every outcome's group at draft_k until ``tune`` sets
        the fastest here.
    """

    options_type = SpecOptions

    def __init__(self, config):
        super().__init__(config)
        if config.model.draft_head:
            raise ValueError(
                f"model.draft_head={config.model.draft_head!r}: a draft head drafts for an AR run "
                "(--config.model.kind=ar); a spec run drafts with its draft half"
            )
        self.draft_k, self.draft_weight, self.draft_target = causal.draft_training(config, "model.kind='spec'")
        self.layout = Layout(self.draft_k, self.draft_k + 1)

    @property
    def label(self):
        return f"spec k={self.draft_k}"

    def _layout(self, o: SpecOptions) -> Layout:
        """The layout a sample with options `o` runs: theirs or the kind's, checked against the run (at most
        its trained k), before any timing; a draft_k alone is the layout of that k (a group for every
        outcome), and a draft_k that is not the given layout's k is refused."""
        if o.layout is None and o.draft_k is not None:
            return layout_of(o.draft_k, self.draft_k, "draft_k")
        layout = self.layout if o.layout is None else layout_of(o.layout, self.draft_k)
        if o.draft_k is not None and o.draft_k != layout.k:
            raise ValueError(
                f"draft_k={o.draft_k!r}: this run drafts {layout.k} token{'s' * (layout.k != 1)} a round "
                f"in its layout ({layout}); a spec run's drafts a round are its layout's k (--layout "
                "K,GROUPS)"
            )
        return layout

    def tune(self, net, options=None, workdir=None, batch=1, progress=False):
        """``self.layout``: the layout or draft_k of `options` when given (not kept), else the fastest here of
        ``candidates`` (``layouts.settle``, kept in workdir); every option checked before any timing."""
        o = self.options(**dict(options or {}))
        layout = self._layout(o)
        asked = layout if o.layout is not None or o.draft_k is not None else None
        length = self.config.data.seq_len
        self.layout, line = layouts.settle(
            asked, candidates(self.draft_k), speculate, net, length, batch, workdir, progress
        )
        return line

    def speculation(self, graphdef, draft=None, k=None, draft_name=None):
        """Rounds of this run's layout (``speculative_parts``), one state shared by target and drafter; with no
        drafts, the causal half alone (``sedd.kinds.causal.without_drafts``)."""
        layout = self._layout(self.options(draft=draft, draft_k=k))
        categorical = self.config.sampling.categorical
        if not layout.k:
            return causal.without_drafts(graphdef, self.config.vocab_size, categorical)

        def parts(temperature, top_p):
            prefill, target, drafter = speculative_parts(graphdef, layout, temperature, top_p)
            return (lambda state, text: (prefill(state, text), None)), target, drafter

        return sampling.rounds.Speculation(parts, layout.k, "self", categorical=categorical, shared=True)

    def network(self, seed=0):
        """Inputs V + 2 ids (BOS = V, MASK = V + 1), V logits out, no time input; attention by mask."""
        v = self.config.vocab_size
        return network_of(self.config, seed, num_tokens=v + 2, out_dim=v, causal=False, **causal.LM_ARCH)

    def loss(self, key, model, x0, train, rngs=None):
        """(3) of the module docstring: the causal half's NLL plus the one-step drafts' cross-entropy."""
        return self._draft_loss(loss, key, model, x0, train, rngs)

    def sample(self, key, net, num_samples, steps=None, sampler=None, **options):
        """Self-speculation (``speculate``): the causal half's law, up to k + 1 tokens a call.

        Options (``SpecOptions``): those of ``speculate``, return_stats, layout (``layout_of``; default
        ``self.layout``) and draft_k, the layout's k. steps, a sampler, a draft, a layout past the run's k,
        another draft_k or any other option is a ValueError.
        """
        check_given(self, steps=steps, sampler=sampler)
        o = self.options(**options)
        tokens, stats = speculate(
            key,
            net.graphdef,
            net.state,
            num_samples,
            self.config.data.seq_len,
            self._layout(o),
            temperature=o.temperature,
            top_p=o.top_p,
            prompt=o.prompt,
            categorical=o.categorical,
            verification=o.verification,
            draft_temperature=o.draft_temperature,
        )
        return sampling.Samples(tokens, None, stats if o.return_stats else None)
